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
    /// Validate a links file and print the effective configuration, defaults included.
    Check(CheckArgs),
    /// Print the Link CustomResourceDefinition (YAML).
    Crd,
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
