//! `kube-sim`: a simulated remote cluster on loopback, for the demo, kubectl and manual runs.
//!
//! `kube-sim --listen 127.0.0.1:PORT --token TOKEN --kubeconfig FILE [--scenario NAME]` serves
//! the Kubernetes API subset Floodgate follows, writes a kubeconfig for itself to FILE once it
//! listens, and runs a scenario: `calm` (three exported services, a pod rolled every few
//! seconds), `flood` (calm, plus an exported Deployment of `--pods` crash-looping pods, shaped
//! by `--flood-shape`: by default created Ready, then two in three Ready at any moment) or
//! `flood-hidden` (the same flood behind a service that is not exported).
//!
//! `--refuse-streaming-lists` makes it refuse `sendInitialEvents` watches with 422, as an API
//! server with the `WatchList` feature off does; `--ignore-limit` makes it serve every list
//! whole, as a real API server serves lists from its watch cache.
//!
//! With `--local-cluster FILE` it also plays the local cluster of `floodgate controller`
//! (Links, Secrets, Leases, Events: [`floodgate_e2e::local`]) on a second loopback port, plain
//! HTTP, and writes a kubeconfig for it (namespace `floodgate`) to FILE.

use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use floodgate_e2e::drivers::{Cluster, FloodShape};
use floodgate_e2e::sim::{SimStore, kubeconfig};
use tokio::net::TcpListener;

/// A simulated remote Kubernetes cluster.
#[derive(Debug, Parser)]
#[command(name = "kube-sim", version)]
struct Args {
    /// Address to listen on (loopback).
    #[arg(long, env = "KUBE_SIM_LISTEN", default_value = "127.0.0.1:0")]
    listen: String,
    /// Bearer token clients must present.
    #[arg(long, env = "KUBE_SIM_TOKEN")]
    token: String,
    /// Where to write a kubeconfig for this server once it listens.
    #[arg(long, env = "KUBE_SIM_KUBECONFIG")]
    kubeconfig: std::path::PathBuf,
    /// What the cluster does.
    #[arg(long, value_enum, default_value_t = Scenario::Calm)]
    scenario: Scenario,
    /// Pods of the flooding Deployment.
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// How the flood's pods behave (`crash-loop`, `crash-loop:SHARE` or `never-ready`).
    #[arg(long, default_value = "crash-loop")]
    flood_shape: FloodShape,
    /// EndpointSlices of the `slices` scenario.
    #[arg(long, default_value_t = 10_000)]
    slices: usize,
    /// Also serve a local cluster (Links, Secrets, Leases, Events) for `floodgate controller`
    /// on another loopback port, and write its kubeconfig here.
    #[arg(long, env = "KUBE_SIM_LOCAL_CLUSTER")]
    local_cluster: Option<std::path::PathBuf>,
    /// Serve plain HTTP instead of TLS (client-go then sends no token: only for curl and kube-rs).
    #[arg(long)]
    insecure_http: bool,
    /// Refuse streaming lists (`sendInitialEvents`) with 422, as an API server with the
    /// `WatchList` feature off does: clients fall back to lists.
    #[arg(long)]
    refuse_streaming_lists: bool,
    /// Ignore `limit`: every list is one body, as a real API server serves lists from its
    /// watch cache.
    #[arg(long)]
    ignore_limit: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Scenario {
    Calm,
    Flood,
    FloodHidden,
    /// `--slices` EndpointSlices of 10 endpoints behind one service, and no churn (benchmarks).
    Slices,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(&args.listen).await?;
    let store = Arc::new(SimStore::new(std::process::id(), 50_000));
    store.set_refuse_streaming_lists(args.refuse_streaming_lists);
    store.set_ignore_limit(args.ignore_limit);
    let addr = listener.local_addr()?;
    // The server shares the store with the scenario driver.
    let api = Arc::new(floodgate::kubeapi::Api::new(
        store.clone(),
        args.token.clone(),
    ));
    let router = floodgate::kubeapi::router(api);
    let (url, ca) = if args.insecure_http {
        let server = tokio::spawn(floodgate::kubeapi::serve_plain(
            listener,
            router,
            std::future::pending(),
        ));
        (format!("http://{addr}"), (None, server))
    } else {
        let tls = floodgate::tls::self_signed(&[
            "127.0.0.1".into(),
            "localhost".into(),
            addr.ip().to_string(),
        ])?;
        let config = floodgate::tls::server_config(&tls)?;
        let server = tokio::spawn(floodgate_e2e::serve_tls(
            listener,
            config,
            router,
            std::future::pending(),
        ));
        (format!("https://{addr}"), (Some(tls.ca_pem), server))
    };
    let (ca_pem, server) = ca;
    std::fs::write(
        &args.kubeconfig,
        kubeconfig(&url, &args.token, ca_pem.as_deref(), "kube-sim"),
    )?;
    eprintln!(
        "kube-sim listening on {url}; kubeconfig written to {}",
        args.kubeconfig.display()
    );

    // Kept alive until the process ends.
    let _local = match &args.local_cluster {
        Some(path) => {
            let listener = TcpListener::bind((addr.ip(), 0)).await?;
            let local = floodgate_e2e::local::RunningLocal::serve(listener, Default::default());
            std::fs::write(path, local.kubeconfig("floodgate"))?;
            eprintln!(
                "local cluster listening on {}; kubeconfig written to {}",
                local.url(),
                path.display()
            );
            Some(local)
        }
        None => None,
    };

    let mut cluster = Cluster::new(store, "prod");
    if let Scenario::Slices = args.scenario {
        cluster.static_slices("bench", args.slices, 10);
        tokio::signal::ctrl_c().await?;
        return Ok(());
    }
    for svc in ["web", "api", "billing"] {
        cluster.add_service(svc, true);
        cluster.scale(svc, 3, true);
    }
    let flood = match args.scenario {
        Scenario::Calm | Scenario::Slices => None,
        Scenario::Flood => Some(true),
        Scenario::FloodHidden => Some(false),
    };
    if let Some(exported) = flood {
        cluster.add_service("injector", exported);
        cluster.scale("injector", args.pods, args.flood_shape.starts_ready());
    }
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut n: usize = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = tokio::signal::ctrl_c() => { r?; break; }
        }
        n += 1;
        if flood.is_some() {
            cluster.flood_step("injector", args.flood_shape, args.pods / 20);
        }
        if n.is_multiple_of(50) {
            let svc = ["web", "api", "billing"][(n / 50) % 3];
            cluster.roll_pod(svc, n % 3);
        }
        if server.is_finished() {
            anyhow::bail!("the server stopped");
        }
    }
    Ok(())
}
