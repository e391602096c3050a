//! `floodgate run`: every link of a links file in the [`crate::server`] both modes share,
//! started through [`crate::serving`]: this mode adds only its links, each with its token
//! ([`crate::credentials`]) and its quarantine and containments on disk ([`crate::persist`]).
//!
//! Tasks: one per link ([`crate::link`]), the facade's accept loop with one task per connection
//! ([`crate::kubeapi::serve`]), the admin listener, and the gRPC server ([`crate::grpc`]). The
//! state directory keeps what must survive a restart so consumers keep working: each link's
//! bearer token and, when Floodgate generated its own certificate, the CA consumers trust.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use floodgate_link_crd::LinksFile;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::credentials::{self, RemoteKubeconfig};
use crate::kubeapi::Api;
use crate::link::{self, LinkHandle, LinkStore};
use crate::registry::Registry;
use crate::server;
use crate::serving::{self, Bootstrap, ServeConfig};

/// Everything `floodgate run` needs: its links, and what both modes serve with.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The links.
    pub links: LinksFile,
    /// The listeners, TLS, admin token, limits and state directory.
    pub serving: ServeConfig,
}

impl RunConfig {
    /// This mode's fields of `GET /config`: the links file holds no secret (a remote is a
    /// kubeconfig path or a Secret's name).
    pub fn mode_json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("mode".into(), json!("run"));
        m.insert(
            "links".into(),
            serde_json::to_value(&self.links.links).unwrap_or(Value::Null),
        );
        m
    }
}

/// A running Floodgate (in-process tests keep this to reach it).
#[derive(Debug)]
pub struct Running {
    /// The facade's address.
    pub facade_addr: SocketAddr,
    /// The admin address.
    pub admin_addr: SocketAddr,
    /// The gRPC address.
    pub grpc_addr: SocketAddr,
    /// The CA consumers trust (PEM), when serving TLS.
    pub ca_pem: Option<String>,
    /// The links of the file, in the registry's order (for in-process tests).
    pub links: Arc<Vec<Arc<LinkHandle>>>,
    /// Each link's API (its request counters), from the registry.
    pub apis: HashMap<String, Arc<Api<LinkStore>>>,
    /// What every listener serves.
    pub registry: Arc<Registry>,
    tokens: HashMap<String, String>,
    server: server::Server,
    switches: server::Switches,
}

impl Running {
    /// The kubeconfig a consumer of `link` uses.
    pub fn kubeconfig(&self, link: &str) -> Option<String> {
        let token = self.tokens.get(link)?;
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        let server = format!("{scheme}://{}/links/{link}", self.facade_addr);
        Some(credentials::consumer_kubeconfig(
            &server,
            token,
            self.ca_pem.as_deref(),
            link,
        ))
    }

    /// The bearer token of `link` (for in-process consumers, gRPC ones included).
    pub fn token(&self, link: &str) -> Option<&str> {
        self.tokens.get(link).map(String::as_str)
    }

    /// True when every link serves (synced, or a last good view).
    pub fn ready(&self) -> bool {
        self.registry.not_serving().is_empty()
    }

    /// Stops everything (in-process tests): [`Running::shutdown`] with a 5 s deadline.
    pub async fn stop(self) {
        let _ = self.shutdown(Duration::from_secs(5)).await;
    }

    /// Shuts down in order ([`server::Server::shutdown`]): readiness first, then the links,
    /// gRPC and the facade, whose watches each get a last BOOKMARK, then the admin listener.
    pub async fn shutdown(self, deadline: Duration) -> Result<(), server::ShutdownError> {
        self.server
            .shutdown(&self.registry, self.switches, deadline)
            .await
    }
}

/// Starts every link, the facade and the admin listener.
pub async fn start(cfg: RunConfig) -> anyhow::Result<Running> {
    // Standalone mode has nothing to wait for besides its links.
    let (switches, signals) = server::Switches::new(watch::channel(true).1);
    let shutdown = signals.shutdown.clone();
    let mode = cfg.mode_json();
    let boot = Bootstrap::load(cfg.serving)?;
    let state_dir = &boot.cfg.state_dir;
    let registry = Arc::new(Registry::new());
    let mut tokens = HashMap::new();
    let pacer = boot.pacer.clone();
    for l in &cfg.links.links {
        let token = credentials::link_token(state_dir, &l.name)?;
        let remote =
            RemoteKubeconfig::File(l.spec.remote.kubeconfig_path.clone().unwrap_or_default());
        let handle = Arc::new(link::spawn(
            &l.name,
            l.spec.clone(),
            pacer.pace(credentials::connect(remote, l.spec.remote.context.clone())),
            credentials::incarnation(),
            Some(crate::persist::LinkDir::new(state_dir, &l.name)),
            shutdown.clone(),
        ));
        registry.insert(handle, &token);
        tokens.insert(l.name.clone(), token);
    }
    let entries = registry.all();
    let links = Arc::new(entries.iter().map(|e| e.handle.clone()).collect::<Vec<_>>());
    let apis = entries
        .iter()
        .map(|e| (e.name().to_owned(), e.api.clone()))
        .collect();
    let listeners = serving::bind(&boot.cfg).await?;
    let ca_pem = boot.tls.as_ref().map(|m| m.ca_pem.clone());
    let server = boot.start(registry.clone(), listeners, mode, signals)?;
    Ok(Running {
        facade_addr: server.facade_addr,
        admin_addr: server.admin_addr,
        grpc_addr: server.grpc_addr,
        ca_pem,
        links,
        apis,
        registry,
        tokens,
        server,
        switches,
    })
}
