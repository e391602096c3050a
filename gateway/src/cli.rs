//! The command line: `floodgate <command>`. Every flag also reads a `FLOODGATE_*` environment
//! variable. Each command is a function from its arguments to text or a typed error, so tests
//! call them without spawning the binary.

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
}

/// `floodgate run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The links file: `links: [{name: east, spec: {...}}]`.
    #[arg(long, env = "FLOODGATE_CONFIG")]
    pub config: PathBuf,
    /// Where the Kubernetes facade listens (links under /links/<name>/).
    #[arg(long, env = "FLOODGATE_LISTEN", default_value = "0.0.0.0:6443")]
    pub listen: std::net::SocketAddr,
    /// Where /livez and /readyz (and the admin API) listen.
    #[arg(long, env = "FLOODGATE_ADMIN_LISTEN", default_value = "0.0.0.0:9990")]
    pub admin_listen: std::net::SocketAddr,
    /// Where the gRPC API (`floodgate.v1.Mirror`, `grpc.health.v1`) listens; TLS like the facade.
    #[arg(long, env = "FLOODGATE_GRPC_LISTEN", default_value = "0.0.0.0:8090")]
    pub grpc_listen: std::net::SocketAddr,
    /// Directory for link tokens and the generated CA; keep it across restarts.
    #[arg(
        long,
        env = "FLOODGATE_STATE_DIR",
        default_value = "/var/lib/floodgate"
    )]
    pub state_dir: PathBuf,
    /// The facade's certificate chain (PEM); without it a CA and certificate are generated
    /// into the state directory.
    #[arg(long, env = "FLOODGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long, env = "FLOODGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Extra names for the generated certificate (the Service's DNS name, say); repeatable.
    #[arg(long = "tls-host", env = "FLOODGATE_TLS_HOSTS", value_delimiter = ',')]
    pub tls_hosts: Vec<String>,
    /// Serve the facade (and gRPC) over plain HTTP. Only on loopback addresses, for tests:
    /// client-go sends no bearer token over HTTP.
    #[arg(long, env = "FLOODGATE_INSECURE_HTTP")]
    pub insecure_http: bool,
    /// A file holding the admin API's bearer token (POST /links/NAME/release and /quarantine);
    /// without it those routes answer 403.
    #[arg(long, env = "FLOODGATE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Connections the facade keeps open at most; more wait in the listen backlog.
    #[arg(long, env = "FLOODGATE_MAX_CONNECTIONS", default_value_t = crate::kubeapi::serve::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// How long a facade client has to send a request head (slowloris defence), e.g. 10s.
    #[arg(long, env = "FLOODGATE_HEADER_READ_TIMEOUT", default_value = "10s")]
    pub header_read_timeout: floodgate_link_crd::KubeDuration,
    /// How long a facade write may stay pending before the connection is closed (a client
    /// that stopped reading), e.g. 30s.
    #[arg(long, env = "FLOODGATE_WRITE_TIMEOUT", default_value = "30s")]
    pub write_timeout: floodgate_link_crd::KubeDuration,
    /// Seconds to drain watchers after SIGTERM (each gets a last bookmark) before exiting
    /// anyway; a second SIGTERM or SIGINT exits at once.
    #[arg(long, env = "FLOODGATE_SHUTDOWN_TIMEOUT", default_value_t = crate::server::DEFAULT_SHUTDOWN_TIMEOUT.as_secs())]
    pub shutdown_timeout: u64,
}

impl RunArgs {
    /// The run configuration, or why these arguments cannot run.
    pub fn to_config(&self) -> Result<crate::run::RunConfig, CheckError> {
        let links = load_links(&self.config)?;
        let tls = match (&self.tls_cert, &self.tls_key, self.insecure_http) {
            (_, _, true) if !self.listen.ip().is_loopback() => {
                return Err(CheckError::Usage(format!(
                    "--insecure-http needs a loopback --listen address, not {}",
                    self.listen
                )));
            }
            (_, _, true) if !self.grpc_listen.ip().is_loopback() => {
                return Err(CheckError::Usage(format!(
                    "--insecure-http needs a loopback --grpc-listen address too, not {}",
                    self.grpc_listen
                )));
            }
            (_, _, true) => crate::run::TlsSource::InsecureHttp,
            (Some(cert), Some(key), false) => crate::run::TlsSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            _ => crate::run::TlsSource::SelfSigned,
        };
        Ok(crate::run::RunConfig {
            links,
            listen: self.listen,
            admin_listen: self.admin_listen,
            grpc_listen: self.grpc_listen,
            state_dir: self.state_dir.clone(),
            tls,
            hosts: self.tls_hosts.clone(),
            admin_token_file: self.admin_token_file.clone(),
            serve: crate::kubeapi::serve::ServeLimits {
                max_connections: self.max_connections.max(1),
                header_read_timeout: self.header_read_timeout.get(),
                write_timeout: self.write_timeout.get(),
            },
        })
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
    Ok(crate::run::consumer_kubeconfig(
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
