//! One server for both modes: the facade, gRPC, the admin API (links, release, quarantine,
//! config, metrics, status page) and `/livez`, `/readyz`, all built from one
//! [`Registry`]. `floodgate run` fills the registry from its links file, `floodgate
//! controller` from Link resources; what each listener serves is whatever the registry holds
//! when a request arrives.
//!
//! Readiness means serving: ready when the mode's own gate is open (the controller: Links
//! listed) and every link in the registry has synced or serves a last good view; not ready
//! from shutdown on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::auth::Token;
use crate::kubeapi::{self, serve::ServeLimits};
use crate::registry::Registry;
use crate::tls::TlsMaterial;
use crate::{admin, grpc};

/// What the listeners share besides the links.
#[derive(Debug)]
pub struct ServerConfig {
    /// The facade's and gRPC's certificate; `None` serves plain HTTP (loopback tests).
    pub tls: Option<TlsMaterial>,
    /// The facade listener's bounds.
    pub limits: ServeLimits,
    /// The admin API's bearer token; `None` disables its mutating routes.
    pub admin_token: Option<Token>,
    /// The effective configuration, already redacted, for `GET /config`.
    pub config: Value,
    /// The links' shared pace of dials, whose waits `GET /metrics` counts.
    pub pacer: crate::link::Pacer,
}

/// The three listeners, bound by the caller (tests bind `127.0.0.1:0`).
#[derive(Debug)]
pub struct Listeners {
    /// The Kubernetes facade.
    pub facade: TcpListener,
    /// The admin API and health.
    pub admin: TcpListener,
    /// gRPC.
    pub grpc: TcpListener,
}

/// The signals that stop the server, in the order a shutdown sends them.
#[derive(Clone, Debug)]
pub struct Signals {
    /// False until the mode is ready apart from its links (the controller: Links listed).
    pub gate: watch::Receiver<bool>,
    /// True from the first step of a shutdown: `/readyz` 503, gRPC health NOT_SERVING.
    pub unready: watch::Receiver<bool>,
    /// True when the facade and gRPC stop.
    pub shutdown: watch::Receiver<bool>,
    /// True when the admin listener stops (after the facade drained).
    pub admin_stop: watch::Receiver<bool>,
}

/// How long Floodgate (either mode) waits for its watchers to drain after SIGTERM before it exits
/// anyway (`--shutdown-timeout`): less than Kubernetes' default grace period of 30 s.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

/// How long the facade keeps serving after readiness dropped, before it lets its watchers go:
/// time for the Service in front of Floodgate to take it out of its endpoints, so consumers
/// that resume go to another replica. Part of the shutdown deadline.
pub const UNREADY_BEFORE_DRAIN: Duration = Duration::from_secs(1);

/// How often a drain lets go of watches opened since it began (a client resuming on a
/// connection that has not closed yet).
const DRAIN_TICK: Duration = Duration::from_millis(100);

/// Why a shutdown was not clean.
#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    /// Connections were still open at the deadline (a consumer that does not read).
    #[error("{watches} facade watch(es) still open after {deadline:?}: exiting anyway")]
    Deadline {
        /// Watches open at the deadline.
        watches: usize,
        /// The deadline.
        deadline: Duration,
    },
}

/// What sends the [`Signals`], in the order a shutdown sends them ([`Server::shutdown`]).
#[derive(Debug)]
pub struct Switches {
    unready: watch::Sender<bool>,
    shutdown: watch::Sender<bool>,
    admin_stop: watch::Sender<bool>,
}

impl Switches {
    /// The switches, all off, and the signals they send (with the mode's `gate`).
    pub fn new(gate: watch::Receiver<bool>) -> (Self, Signals) {
        let (unready, unready_rx) = watch::channel(false);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (admin_stop, admin_stop_rx) = watch::channel(false);
        let signals = Signals {
            gate,
            unready: unready_rx,
            shutdown: shutdown_rx,
            admin_stop: admin_stop_rx,
        };
        let switches = Self {
            unready,
            shutdown,
            admin_stop,
        };
        (switches, signals)
    }
}

/// The running listeners.
#[derive(Debug)]
pub struct Server {
    /// The facade's address.
    pub facade_addr: SocketAddr,
    /// The admin address.
    pub admin_addr: SocketAddr,
    /// The gRPC address.
    pub grpc_addr: SocketAddr,
    /// The facade's accept loop (it ends once every connection closed).
    pub facade_task: JoinHandle<()>,
    /// The admin and gRPC listeners.
    pub tasks: Vec<JoinHandle<()>>,
}

/// Starts the facade, admin and gRPC listeners over `links`.
pub fn start(
    links: Arc<Registry>,
    listeners: Listeners,
    cfg: ServerConfig,
    signals: Signals,
) -> anyhow::Result<Server> {
    let facade_addr = listeners.facade.local_addr()?;
    let admin_addr = listeners.admin.local_addr()?;
    let grpc_addr = listeners.grpc.local_addr()?;

    let router = kubeapi::links_router(links.clone());
    let facade_tls = cfg
        .tls
        .as_ref()
        .map(crate::tls::server_config)
        .transpose()?;
    let (facade, limits) = (listeners.facade, cfg.limits);
    let stop = wait_for(signals.shutdown.clone());
    let facade_task = tokio::spawn(async move {
        if let Err(e) = kubeapi::serve::serve(facade, facade_tls, router, limits, stop).await {
            tracing::error!(error = %e, "the facade stopped");
        }
    });

    let history = Arc::new(admin::history::History::default());
    // `run` or `controller`, as `GET /config` says it.
    let mode = cfg.config["mode"].as_str().unwrap_or_default().to_owned();
    let state = Arc::new(admin::AdminState {
        links: links.clone(),
        config: cfg.config,
        token: cfg.admin_token,
        metrics: crate::metrics::Metrics::of_mode(links.clone(), &mode, cfg.pacer),
        history: history.clone(),
    });
    let admin_router = admin::finish(admin::router(state).merge(health_router(
        links.clone(),
        signals.gate.clone(),
        signals.unready.clone(),
    )));
    let sampler = tokio::spawn(admin::history::run(
        history,
        links.clone(),
        wait_for(signals.admin_stop.clone()),
    ));
    let (admin, stop) = (listeners.admin, wait_for(signals.admin_stop));
    let admin_task = tokio::spawn(async move {
        if let Err(e) = kubeapi::serve_plain(admin, admin_router, stop).await {
            tracing::error!(error = %e, "the admin listener stopped");
        }
    });

    // gRPC health turns NOT_SERVING with readiness.
    let mirror = grpc::MirrorService::over(links, signals.unready);
    let grpc_tls = cfg
        .tls
        .as_ref()
        .map(|m| grpc::tls_config(&m.cert_pem, &m.key_pem));
    let (grpc_listener, stop) = (listeners.grpc, signals.shutdown);
    let grpc_task = tokio::spawn(async move {
        if let Err(e) = grpc::serve(grpc_listener, mirror, grpc_tls, stop).await {
            tracing::error!(error = %e, "the gRPC listener stopped");
        }
    });
    Ok(Server {
        facade_addr,
        admin_addr,
        grpc_addr,
        facade_task,
        tasks: vec![admin_task, grpc_task, sampler],
    })
}

impl Server {
    /// Shuts down in order, the same in both modes. Readiness drops first (`/readyz` 503,
    /// gRPC health NOT_SERVING) and stays down while the facade serves on for
    /// [`UNREADY_BEFORE_DRAIN`]; then whatever follows `shutdown` stops (gRPC, the links of
    /// `floodgate run`), the facade stops accepting and asks its connections to close, and
    /// every open watch of `links` gets a final BOOKMARK with its latest version and ends;
    /// once every facade connection has closed, or at `deadline`, the admin listener stops.
    pub async fn shutdown(
        self,
        links: &Registry,
        switches: Switches,
        deadline: Duration,
    ) -> Result<(), ShutdownError> {
        let until = tokio::time::Instant::now() + deadline;
        let _ = switches.unready.send(true);
        tokio::time::sleep(UNREADY_BEFORE_DRAIN.min(deadline / 2)).await;
        let _ = switches.shutdown.send(true);
        let entries = links.all();
        for e in &entries {
            e.api.drain_watches();
        }
        let mut facade = self.facade_task;
        // Who holds the drain up, said once a second and then every 10 s: a consumer that
        // does not read its watch keeps the process until `deadline`.
        let mut report = tokio::time::Instant::now() + Duration::from_secs(1);
        let drained = loop {
            for e in &entries {
                e.handle.view.disconnect();
            }
            if tokio::time::Instant::now() >= report {
                let watches: usize = entries.iter().map(|e| e.api.open_watches()).sum();
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                tracing::info!(watches, ?left, "draining: facade connections still open");
                report += Duration::from_secs(10);
            }
            tokio::select! {
                _ = &mut facade => break true,
                () = tokio::time::sleep_until(until) => break false,
                () = tokio::time::sleep(DRAIN_TICK) => {}
            }
        };
        let watches = entries.iter().map(|e| e.api.open_watches()).sum();
        tracing::info!(
            drained,
            watches,
            "facade drained; stopping the admin and gRPC listeners"
        );
        let _ = switches.admin_stop.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
        if drained {
            Ok(())
        } else {
            facade.abort();
            Err(ShutdownError::Deadline { watches, deadline })
        }
    }
}

/// Resolves once `signal` turns true (or its sender is gone).
pub async fn wait_for(mut signal: watch::Receiver<bool>) {
    let _ = signal.wait_for(|s| *s).await;
}

/// `/livez`, and `/readyz`: ready once `gate` is open and every link serves (synced, or a last
/// good view); not ready from `unready` on. A 503 here is routine (every cold start answers
/// some), so the admin layers log it below WARN.
pub fn health_router(
    links: Arc<Registry>,
    gate: watch::Receiver<bool>,
    unready: watch::Receiver<bool>,
) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let answer = if *unready.borrow() {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "shutting down\n".to_owned(),
                    )
                } else if !*gate.borrow() {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting\n".to_owned())
                } else {
                    let waiting = links.not_serving();
                    if waiting.is_empty() {
                        (StatusCode::OK, "ok\n".to_owned())
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not synced yet: {}\n", waiting.join(", ")),
                        )
                    }
                };
                async move { answer }
            }),
        )
}
