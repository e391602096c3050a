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
    let state = Arc::new(admin::AdminState {
        links: links.clone(),
        config: cfg.config,
        token: cfg.admin_token,
        metrics: crate::metrics::Metrics::new(links.clone()),
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
