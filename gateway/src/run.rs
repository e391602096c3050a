//! `floodgate run`: every link of a links file in the [`crate::server`] both modes share.
//!
//! Tasks: one per link ([`crate::link`]), the facade's accept loop with one task per connection
//! ([`crate::tls`]), the admin listener, and the gRPC server ([`crate::grpc`]). The state
//! directory keeps what must survive a restart so consumers keep working: each link's bearer
//! token and, when Floodgate generated its own certificate, the CA consumers trust.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use floodgate_link_crd::{LinksFile, NamedLink};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::kubeapi::{self, Api};
use crate::link::{self, Connect, LinkHandle, LinkStore};
use crate::registry::Registry;
use crate::server::{self, Listeners, ServerConfig};
use crate::tls::{self, TlsMaterial};

/// Where the facade's certificate comes from.
#[derive(Clone, Debug)]
pub enum TlsSource {
    /// PEM files.
    Files {
        /// The certificate chain.
        cert: PathBuf,
        /// Its key.
        key: PathBuf,
    },
    /// Generate (once, then reuse from the state directory) a CA and a certificate.
    SelfSigned,
    /// Plain HTTP: loopback tests only.
    InsecureHttp,
}

/// Everything `floodgate run` needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The links.
    pub links: LinksFile,
    /// The facade's address.
    pub listen: SocketAddr,
    /// The admin address (health, and later the admin API).
    pub admin_listen: SocketAddr,
    /// The gRPC address (`floodgate.v1.Mirror` and `grpc.health.v1`).
    pub grpc_listen: SocketAddr,
    /// Tokens and generated certificates live here.
    pub state_dir: PathBuf,
    /// The facade's certificate.
    pub tls: TlsSource,
    /// Names the generated certificate is valid for, besides localhost and 127.0.0.1.
    pub hosts: Vec<String>,
    /// The file holding the admin API's bearer token; without it, mutating admin routes are
    /// refused (403).
    pub admin_token_file: Option<PathBuf>,
    /// The facade listener's bounds (connections, header read and write timeouts).
    pub serve: kubeapi::serve::ServeLimits,
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
        Some(consumer_kubeconfig(
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

/// A kubeconfig for a consumer: server (with the link's prefix), CA, token.
pub fn consumer_kubeconfig(server: &str, token: &str, ca_pem: Option<&str>, name: &str) -> String {
    use base64::Engine as _;
    let ca = ca_pem
        .map(|pem| {
            format!(
                "\n    certificate-authority-data: {}",
                base64::engine::general_purpose::STANDARD.encode(pem)
            )
        })
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: floodgate-{name}\n  cluster:\n    server: {server}{ca}\ncontexts:\n- name: floodgate-{name}\n  context:\n    cluster: floodgate-{name}\n    user: floodgate-{name}\ncurrent-context: floodgate-{name}\nusers:\n- name: floodgate-{name}\n  user:\n    token: {token}\n"
    )
}

/// A link's token: read from the state directory, or created there (readable by its owner only).
pub fn link_token(state_dir: &Path, link: &str) -> anyhow::Result<String> {
    let dir = state_dir.join("tokens");
    let path = dir.join(link);
    if let Ok(t) = std::fs::read_to_string(&path) {
        let t = t.trim().to_owned();
        if !t.is_empty() {
            return Ok(t);
        }
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness for a token: {e}"))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write_private(&path, &token)?;
    Ok(token)
}

fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    Ok(crate::persist::write_atomic(
        path,
        contents.as_bytes(),
        0o600,
    )?)
}

/// The facade's TLS material: from files, or generated once into the state directory.
pub fn tls_material(
    src: &TlsSource,
    state_dir: &Path,
    hosts: &[String],
) -> anyhow::Result<Option<TlsMaterial>> {
    match src {
        TlsSource::InsecureHttp => Ok(None),
        TlsSource::Files { cert, key } => {
            let cert_pem = std::fs::read_to_string(cert)
                .with_context(|| format!("reading {}", cert.display()))?;
            let key_pem = std::fs::read_to_string(key)
                .with_context(|| format!("reading {}", key.display()))?;
            Ok(Some(TlsMaterial {
                ca_pem: cert_pem.clone(),
                cert_pem,
                key_pem,
            }))
        }
        TlsSource::SelfSigned => {
            let dir = state_dir.join("tls");
            let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
            if let (Some(cert_pem), Some(key_pem), Some(ca_pem)) =
                (read("tls.crt"), read("tls.key"), read("ca.crt"))
            {
                return Ok(Some(TlsMaterial {
                    cert_pem,
                    key_pem,
                    ca_pem,
                }));
            }
            let mut all = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
            all.extend(hosts.iter().cloned());
            let m = tls::self_signed(&all)?;
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            write_private(&dir.join("tls.key"), &m.key_pem)?;
            write_private(&dir.join("tls.crt"), &m.cert_pem)?;
            write_private(&dir.join("ca.crt"), &m.ca_pem)?;
            Ok(Some(m))
        }
    }
}

/// How a standalone link reaches its remote: the kubeconfig file named in its spec.
fn connect_from_file(link: &NamedLink) -> Connect {
    let path = link.spec.remote.kubeconfig_path.clone().unwrap_or_default();
    let context = link.spec.remote.context.clone();
    Arc::new(move || {
        let path = path.clone();
        let context = context.clone();
        Box::pin(async move {
            let kc = kube::config::Kubeconfig::read_from(&path)
                .with_context(|| format!("reading kubeconfig {path}"))?;
            let opts = kube::config::KubeConfigOptions {
                context,
                ..Default::default()
            };
            let cfg = kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .with_context(|| format!("kubeconfig {path}"))?;
            Ok(crate::upstream::client(cfg)?)
        })
    })
}

/// A random number telling this run's resource versions from another's.
pub fn incarnation() -> u32 {
    let mut b = [0u8; 4];
    // Without randomness, the clock still tells runs apart.
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.subsec_nanos() ^ (t.as_secs() as u32);
    }
    u32::from_le_bytes(b)
}

/// Starts every link, the facade and the admin listener.
pub async fn start(cfg: RunConfig) -> anyhow::Result<Running> {
    // Standalone mode has nothing to wait for besides its links.
    let (switches, signals) = server::Switches::new(watch::channel(true).1);
    let shutdown = signals.shutdown.clone();
    let admin_token = cfg
        .admin_token_file
        .as_deref()
        .map(crate::admin::read_token)
        .transpose()?
        .map(crate::auth::Token::new);
    let tls = tls_material(&cfg.tls, &cfg.state_dir, &cfg.hosts)?;
    let registry = Arc::new(Registry::new());
    let mut tokens = HashMap::new();
    for l in &cfg.links.links {
        let token = link_token(&cfg.state_dir, &l.name)?;
        let handle = Arc::new(link::spawn(
            &l.name,
            l.spec.clone(),
            connect_from_file(l),
            incarnation(),
            Some(crate::persist::LinkDir::new(&cfg.state_dir, &l.name)),
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

    let listeners = Listeners {
        facade: kubeapi::serve::bind(cfg.listen)
            .with_context(|| format!("binding the facade to {}", cfg.listen))?,
        admin: TcpListener::bind(cfg.admin_listen)
            .await
            .with_context(|| format!("binding the admin API to {}", cfg.admin_listen))?,
        grpc: TcpListener::bind(cfg.grpc_listen)
            .await
            .with_context(|| format!("binding gRPC to {}", cfg.grpc_listen))?,
    };
    let config = crate::admin::config_json(&cfg);
    tracing::info!(config = %config, "effective configuration");
    let server = server::start(
        registry.clone(),
        listeners,
        ServerConfig {
            tls: tls.clone(),
            limits: cfg.serve,
            admin_token,
            config,
        },
        signals,
    )?;
    let (facade_addr, admin_addr, grpc_addr) =
        (server.facade_addr, server.admin_addr, server.grpc_addr);
    tracing::info!(%facade_addr, %admin_addr, %grpc_addr, links = links.len(), tls = tls.is_some(), "floodgate is serving");
    Ok(Running {
        facade_addr,
        admin_addr,
        grpc_addr,
        ca_pem: tls.map(|m| m.ca_pem),
        links,
        apis,
        registry,
        tokens,
        server,
        switches,
    })
}
