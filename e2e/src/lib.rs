//! Floodgate's end-to-end home, in three groups:
//!
//! - [`fakes`]: what stands in for the clusters and the network: kube-sim ([`sim`]) and its
//!   [`drivers`], the local cluster of the controller ([`local`]), a real etcd and
//!   kube-apiserver with the Go programs of the real-server lane ([`real`]), a fault-injecting
//!   proxy ([`chaos`]) and a TCP relay ([`relay`]);
//! - [`harness`]: what runs Floodgate and talks to it: in-process in either mode ([`gateway`],
//!   [`cluster`], [`modes`]), as processes ([`process`], [`replicas`]), its admin API
//!   ([`admin`]), its logs ([`logs`]) and the shipped RBAC judged ([`rbac`]);
//! - [`workloads`]: the scenarios and their judges: the side-by-side flood replay ([`flood`]),
//!   the restart herd ([`herd`]), cold starts ([`cold`]), a hub of many links ([`hub`]), the
//!   consumers that resolve endpoints as Linkerd's destination does ([`resolve`], and
//!   `src/bin/consumer.rs`), the shapes a real cluster makes judged at the event ([`shapes`]),
//!   and the rows they report ([`report`]).
//!
//! Each module is also at the crate's root (`floodgate_e2e::sim`, ...), as tests name them.
//! The demo is `src/bin/demo.rs`, the scenario benchmarks `src/bin/scenarios/`; the tests in
//! `tests/` (each file or directory one binary: `tests/real/` the real-server lane,
//! `tests/outage/` the upstream's outages, `tests/abuse/` hostile clients).

#![forbid(unsafe_code)]

pub mod fakes;
pub mod harness;
pub mod workloads;

pub use fakes::{chaos, drivers, local, real, relay, sim};
pub use harness::{admin, cluster, gateway, logs, modes, process, rbac, replicas};
pub use workloads::{cold, flood, herd, hub, report, resolve, shapes};

use std::net::SocketAddr;
use std::sync::Arc;

use floodgate::kubeapi::serve::ServeLimits;
use kube::runtime::watcher;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::sim::{SimApi, SimStore};

/// A kube-sim serving on loopback.
#[derive(Debug)]
pub struct RunningSim {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The API (its store and request counters).
    pub api: Arc<SimApi>,
    /// The token that opens it.
    pub token: String,
    /// The CA its certificate chains to (PEM).
    pub ca_pem: String,
    task: JoinHandle<()>,
}

impl RunningSim {
    /// Starts kube-sim over `store` on `127.0.0.1:0`, over TLS with a fresh self-signed CA.
    pub async fn start(store: Arc<SimStore>, token: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        Self::serve(listener, store, token)
    }

    /// Serves kube-sim over `store` on `listener`, over TLS.
    pub fn serve(listener: TcpListener, store: Arc<SimStore>, token: &str) -> anyhow::Result<Self> {
        let addr = listener.local_addr()?;
        let tls = floodgate::tls::self_signed(&["127.0.0.1".into(), "localhost".into()])?;
        let config = floodgate::tls::server_config(&tls)?;
        let api = Arc::new(SimApi::new(store, token));
        let router = floodgate::kubeapi::router(api.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = serve_tls(listener, config, router, std::future::pending()).await {
                eprintln!("kube-sim: server stopped: {e}");
            }
        });
        Ok(Self {
            addr,
            api,
            token: token.to_owned(),
            ca_pem: tls.ca_pem,
            task,
        })
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// A kubeconfig that reaches it (server, CA, token).
    pub fn kubeconfig(&self) -> String {
        sim::kubeconfig(&self.url(), &self.token, Some(&self.ca_pem), "kube-sim")
    }

    /// The store.
    pub fn store(&self) -> &Arc<SimStore> {
        self.api.store()
    }

    /// Stops serving (the remote goes away).
    pub fn stop(&self) {
        self.task.abort();
    }
}

/// Floodgate's facade serving links from views, over TLS on `127.0.0.1:0` (for tests that point
/// real clients at a link before the whole gateway runs them).
#[derive(Debug)]
pub struct RunningFacade {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The CA its certificate chains to (PEM).
    pub ca_pem: String,
    /// The links' APIs by name (for their counters).
    pub apis:
        std::collections::HashMap<String, Arc<floodgate::kubeapi::Api<floodgate::view::View>>>,
    tokens: std::collections::HashMap<String, String>,
    task: JoinHandle<()>,
}

impl RunningFacade {
    /// Serves each `(name, token, view)` under `/links/<name>/`.
    pub async fn start(links: Vec<(&str, &str, floodgate::view::View)>) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let tls = floodgate::tls::self_signed(&["127.0.0.1".into(), "localhost".into()])?;
        let config = floodgate::tls::server_config(&tls)?;
        let apis: std::collections::HashMap<_, _> = links
            .iter()
            .map(|(name, token, view)| {
                (
                    (*name).to_owned(),
                    Arc::new(floodgate::kubeapi::Api::new(view.clone(), *token)),
                )
            })
            .collect();
        let tokens = links
            .iter()
            .map(|(n, t, _)| ((*n).to_owned(), (*t).to_owned()))
            .collect();
        let router = floodgate::kubeapi::links_router(Arc::new(floodgate::kubeapi::Links::new(
            apis.clone(),
        )));
        let task = tokio::spawn(async move {
            if let Err(e) = serve_tls(listener, config, router, std::future::pending()).await {
                eprintln!("facade: server stopped: {e}");
            }
        });
        Ok(Self {
            addr,
            ca_pem: tls.ca_pem,
            apis,
            tokens,
            task,
        })
    }

    /// The kubeconfig a consumer of link `name` uses.
    pub fn kubeconfig(&self, name: &str) -> String {
        let token = self
            .tokens
            .get(name)
            .map(String::as_str)
            .unwrap_or_default();
        sim::kubeconfig(
            &format!("https://{}/links/{name}", self.addr),
            token,
            Some(&self.ca_pem),
            name,
        )
    }
}

impl Drop for RunningFacade {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Drop for RunningSim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls `cond` every 50 ms until it holds; panics naming `what` once `secs` have passed.
pub async fn until(secs: u64, what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {secs} s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// What `view` published after `resource_version`, every kind, as `(kind, name)` in version
/// order: a test that asserts a step published nothing makes a change after it, waits for
/// that (the positive signal), and finds it alone here.
pub fn published_since(
    view: &floodgate::view::View,
    resource_version: u64,
) -> Vec<(floodgate::model::Kind, String)> {
    let mut events: Vec<(u64, floodgate::model::Kind, String)> = (floodgate::model::Kind::ALL
        .iter())
    .flat_map(|k| {
        let (missed, _) = view
            .watch_from(*k, resource_version)
            .unwrap_or_else(|e| panic!("{} from {resource_version}: {e:?}", k.name()));
        missed.into_iter().map(move |e| {
            let key = e.object.object.key();
            (e.resource_version, *k, key.id.name.to_string())
        })
    })
    .collect();
    events.sort();
    events.into_iter().map(|(_, k, n)| (k, n)).collect()
}

/// The next event of a kube-rs watcher, within 10 s; panics on an error or an end.
pub async fn next_event<K, S>(s: &mut S) -> watcher::Event<K>
where
    S: futures_util::Stream<Item = watcher::Result<watcher::Event<K>>> + Unpin,
{
    use futures_util::StreamExt as _;
    tokio::time::timeout(std::time::Duration::from_secs(10), s.next())
        .await
        .expect("an event within 10 s")
        .expect("the stream goes on")
        .expect("no watcher error")
}

/// Serves `router` over TLS on `listener` until `shutdown` completes, with Floodgate's own
/// serving loop and its default [`ServeLimits`] (HTTP/1.1 and HTTP/2 by ALPN), as kube-sim
/// serves its facade; then stops accepting and lets every open connection finish.
pub async fn serve_tls(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    router: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    floodgate::kubeapi::serve::serve(
        listener,
        Some(config),
        router,
        ServeLimits::default(),
        shutdown,
    )
    .await
}
