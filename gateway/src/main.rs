//! The `floodgate` binary: parse the command line, set up logging, run the command.

use std::process::ExitCode;

use clap::Parser;
use floodgate::cli::{self, Cli, Command, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("FLOODGATE_LOG"))
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let out = match &cli.command {
        Command::Check(args) => cli::check(args).map_err(anyhow::Error::from),
        Command::Crd => Ok(floodgate_link_crd::crd_yaml()),
    };
    match out {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
