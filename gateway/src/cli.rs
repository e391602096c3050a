//! The command line: `floodgate <command>`. Every flag also reads a `FLOODGATE_*` environment
//! variable. Each command is a function from its arguments to text or a typed error, so tests
//! call them without spawning the binary.

pub mod status;

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use floodgate_link_crd::{ConfigError, LinksFile};

/// Floodgate: a per-link gateway between a remote cluster's API and local consumers.
#[derive(Debug, Parser)]
#[command(name = "floodgate", version, about, long_about = None)]
pub struct Cli {
    /// Log format: `text` for people, `json` for log pipelines.
    #[arg(long, env = "FLOODGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every link of a links file: upstream watchers, churn engines and the facade.
    Run(RunArgs),
    /// Run the links of the Link resources in a namespace of the local cluster.
    Controller(crate::controller::ControllerArgs),
    /// Print the kubeconfig a consumer of a link uses (server with the link's prefix, CA, token).
    Kubeconfig(KubeconfigArgs),
    /// Validate a links file and print the effective configuration, defaults included.
    Check(CheckArgs),
    /// Print the Link CustomResourceDefinition (YAML).
    Crd,
    /// Adopt a Linkerd link: read its credentials Secrets (link-gen's output), print a Link,
    /// the upstream copy, the token and the Secrets rewritten to point at Floodgate.
    Wrap(crate::wrap::WrapArgs),
    /// Release a quarantined link, or one of its contained services, in a cluster: the command
    /// reaches the link's Lease holder through the Link (needs only `get` and `patch` on Links).
    Release(crate::command::ReleaseArgs),
    /// Quarantine a link in a cluster until an operator releases it, as `release` does.
    Quarantine(crate::command::QuarantineArgs),
    /// Every link in one table: phase, services, contained services, Lease holder, quarantine
    /// (a cluster's Links, or a standalone Floodgate's admin API with --admin); --wait gates
    /// a rollout on every link being well.
    Status(status::StatusArgs),
}

/// `floodgate run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The links file: `links: [{name: east, spec: {...}}]`.
    #[arg(long, env = "FLOODGATE_CONFIG")]
    pub config: PathBuf,
    /// What both modes serve with: listeners, TLS, admin token, limits, state directory.
    #[command(flatten)]
    pub serve: crate::serving::ServeArgs,
}

impl RunArgs {
    /// The run configuration, or why these arguments cannot run.
    pub fn to_config(&self) -> Result<crate::run::RunConfig, CheckError> {
        let links = load_links(&self.config)?;
        let serving = self
            .serve
            .to_config()
            .map_err(|e| CheckError::Usage(e.to_string()))?;
        Ok(crate::run::RunConfig { links, serving })
    }
}

/// `floodgate kubeconfig`.
#[derive(Debug, clap::Args)]
pub struct KubeconfigArgs {
    /// The link.
    #[arg(long)]
    pub link: String,
    /// The state directory of the Floodgate that serves it.
    #[arg(
        long,
        env = "FLOODGATE_STATE_DIR",
        default_value = "/var/lib/floodgate"
    )]
    pub state_dir: PathBuf,
    /// The facade's address as consumers reach it.
    #[arg(long, default_value = "https://localhost:6443")]
    pub server: String,
}

/// `floodgate kubeconfig`: reads the link's token and the CA from the state directory.
pub fn kubeconfig(args: &KubeconfigArgs) -> Result<String, CheckError> {
    let read = |p: PathBuf| {
        std::fs::read_to_string(&p).map_err(|source| CheckError::Read { path: p, source })
    };
    let token = read(args.state_dir.join("tokens").join(&args.link))?;
    let ca = std::fs::read_to_string(args.state_dir.join("tls/ca.crt")).ok();
    let server = format!("{}/links/{}", args.server.trim_end_matches('/'), args.link);
    Ok(crate::credentials::consumer_kubeconfig(
        &server,
        token.trim(),
        ca.as_deref(),
        &args.link,
    ))
}

/// `floodgate check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The links file: `links: [{name: east, spec: {...}}]`, each spec as in a Link resource.
    #[arg(long, env = "FLOODGATE_CONFIG")]
    pub config: PathBuf,
}

/// Why `floodgate check` failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The arguments do not make sense together.
    #[error("{0}")]
    Usage(String),
    /// The file was read but refused.
    #[error("{path}: {source}")]
    Config {
        /// The file.
        path: PathBuf,
        /// Every problem, with field paths and lines.
        source: ConfigError,
    },
}

/// Loads and validates a links file.
pub fn load_links(path: &Path) -> Result<LinksFile, CheckError> {
    let src = std::fs::read_to_string(path).map_err(|source| CheckError::Read {
        path: path.to_owned(),
        source,
    })?;
    LinksFile::from_yaml(&src).map_err(|source| CheckError::Config {
        path: path.to_owned(),
        source,
    })
}

/// `floodgate check`: the effective configuration, or every problem.
pub fn check(args: &CheckArgs) -> Result<String, CheckError> {
    let file = load_links(&args.config)?;
    let yaml = file.to_yaml().map_err(|source| CheckError::Config {
        path: args.config.clone(),
        source: source.into(),
    })?;
    Ok(format!(
        "# {}: {} link(s), valid. Effective configuration, defaults included:\n{yaml}",
        args.config.display(),
        file.links.len()
    ))
}
