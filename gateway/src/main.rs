//! The `floodgate` binary: parse the command line, set up logging, run the command.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use floodgate::cli::{self, Cli, Command, LogFormat};

/// jemalloc, with background threads that give freed pages back while the gateway idles: with
/// glibc's malloc a link serving 100,000 pods held 1.3-1.4x its live heap (see docs/figures.md's
/// memory figures). The `system-alloc` feature leaves malloc to the system, for heaptrack.
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Runs a serving mode until SIGINT or SIGTERM, then tells it to drain (readiness off,
/// watchers get a last bookmark, within `--shutdown-timeout`); a second SIGINT or SIGTERM
/// exits at once. `mode` gets the signal as a watch that turns true.
fn serve<F>(mode: impl FnOnce(tokio::sync::watch::Receiver<bool>) -> F) -> anyhow::Result<()>
where
    F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    tokio::runtime::Runtime::new()?.block_on(async {
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let mut task = tokio::spawn(mode(shutdown));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = &mut task => return r?,
            r = tokio::signal::ctrl_c() => r?,
            _ = term.recv() => {}
        }
        let _ = stop.send(true);
        tokio::select! {
            r = task => r??,
            _ = term.recv() => anyhow::bail!("a second signal during the drain: exiting at once"),
            r = tokio::signal::ctrl_c() => {
                r?;
                anyhow::bail!("a second signal during the drain: exiting at once");
            }
        }
        tracing::info!("drained; exiting");
        anyhow::Ok(())
    })
}

/// `floodgate run`: the links of a links file.
fn run(args: &cli::RunArgs) -> anyhow::Result<()> {
    let cfg = args.to_config()?;
    let deadline = cfg.serving.shutdown_timeout;
    serve(|mut shutdown| async move {
        let running = floodgate::run::start(cfg).await?;
        // A dropped sender is a signal too: nothing is left to wait for.
        let _ = shutdown.wait_for(|stop| *stop).await;
        tracing::info!(?deadline, "shutting down: readiness off, draining watchers");
        Ok(running.shutdown(deadline).await?)
    })
}

/// `floodgate controller`: the links of the Link resources, with in-cluster config or
/// KUBECONFIG.
fn controller(args: &floodgate::controller::ControllerArgs) -> anyhow::Result<()> {
    let args = args.clone();
    serve(|shutdown| async move {
        let client = kube::Client::try_default().await?;
        floodgate::controller::run(client, args, shutdown).await
    })
}

/// `floodgate release` and `floodgate quarantine`: in-cluster config or KUBECONFIG.
fn send_command(
    link: &str,
    order: &floodgate::command::Order,
    args: &floodgate::command::SendArgs,
) -> anyhow::Result<String> {
    tokio::runtime::Runtime::new()?.block_on(async {
        let client = kube::Client::try_default().await?;
        floodgate::command::send_from_cli(client, link, order, args).await
    })
}

/// `floodgate status`: the table on stdout; exit 1 when `--wait` timed out (the table says
/// which links are not well), 2 when the links cannot be read.
fn status(args: &floodgate::cli::status::StatusArgs) -> ExitCode {
    use floodgate::cli::status;
    let report = tokio::runtime::Runtime::new()
        .map_err(anyhow::Error::from)
        .and_then(|rt| {
            rt.block_on(async { status::status(&status::Source::of(args).await?, args).await })
        });
    match report {
        Ok(r) => {
            print!("{}", r.text);
            if r.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// What is logged unless `FLOODGATE_LOG` says otherwise: INFO and above, but not kube-client's
/// lines per broken watch (WARNs each time a watcher retries a remote that is down): the link
/// logs an outage itself, once when it begins, once if it lasts and once when it ends
/// (`FLOODGATE_LOG=info,kube_client=debug` shows them again; the remote's client logs each
/// request at DEBUG, `tower_http=debug`).
const DEFAULT_LOG: &str = "info,kube_client=error";

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLOODGATE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG)),
        )
        // Colours for a terminal only: a log written to a file or a collector stays plain.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let out = match &cli.command {
        Command::Check(args) => cli::check(args).map_err(anyhow::Error::from),
        Command::Crd => Ok(floodgate_link_crd::crd_yaml()),
        Command::Kubeconfig(args) => cli::kubeconfig(args).map_err(anyhow::Error::from),
        Command::Run(args) => run(args).map(|()| String::new()),
        Command::Controller(args) => controller(args).map(|()| String::new()),
        Command::Wrap(args) => floodgate::wrap::run_wrap(args),
        Command::Release(args) => args
            .order()
            .map_err(anyhow::Error::from)
            .and_then(|o| send_command(&args.link, &o, &args.send)),
        Command::Quarantine(args) => args
            .order()
            .map_err(anyhow::Error::from)
            .and_then(|o| send_command(&args.link, &o, &args.send)),
        Command::Status(args) => return status(args),
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
