//! What both modes serve with, and how they start serving: one set of flags ([`ServeArgs`],
//! flattened into `floodgate run` and `floodgate controller`), validated into a
//! [`ServeConfig`] by a pure function; one [`bind`] of the three listeners (the facade with
//! [`kubeapi::serve::bind`]'s backlog); one [`Bootstrap`] that loads the TLS material and the
//! admin token, writes the effective configuration for `GET /config` and the start-up log
//! lines, and starts the [`crate::server`]. A mode adds only where its links come from.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use floodgate_link_crd::KubeDuration;
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;

use crate::auth::Token;
use crate::credentials::{self, TlsSource};
use crate::kubeapi::{self, serve::ServeLimits};
use crate::link;
use crate::registry::Registry;
use crate::server::{self, Listeners, ServerConfig, Signals};
use crate::tls::TlsMaterial;

/// The default state directory.
const STATE_DIR: &str = "/var/lib/floodgate";

/// The serving flags both modes take.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ServeArgs {
    /// Where the Kubernetes facade listens (links under /links/<name>/).
    #[arg(long, env = "FLOODGATE_LISTEN", default_value = "0.0.0.0:6443")]
    pub listen: SocketAddr,
    /// Where the admin API (links, release, quarantine, metrics, the status page, /livez,
    /// /readyz) listens.
    #[arg(long, env = "FLOODGATE_ADMIN_LISTEN", default_value = "0.0.0.0:9990")]
    pub admin_listen: SocketAddr,
    /// Where the gRPC API (`floodgate.v1.Mirror`, `grpc.health.v1`) listens; TLS like the facade.
    #[arg(long, env = "FLOODGATE_GRPC_LISTEN", default_value = "0.0.0.0:8090")]
    pub grpc_listen: SocketAddr,
    /// Directory for link tokens and the generated CA (in cluster mode shared by every
    /// replica); keep it across restarts.
    #[arg(long, env = "FLOODGATE_STATE_DIR", default_value = STATE_DIR)]
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
    /// A file holding the admin API's bearer token (a mounted Secret, say); without it the
    /// mutating admin routes (release, quarantine) answer 403.
    #[arg(long, env = "FLOODGATE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Connections the facade keeps open at most; more wait in the listen backlog.
    #[arg(long, env = "FLOODGATE_MAX_CONNECTIONS", default_value_t = kubeapi::serve::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// How long a facade client has to send a request head (slowloris defence), e.g. 10s.
    #[arg(long, env = "FLOODGATE_HEADER_READ_TIMEOUT", default_value = "10s")]
    pub header_read_timeout: KubeDuration,
    /// How long a facade write may stay pending before the connection is closed (a client
    /// that stopped reading), e.g. 30s.
    #[arg(long, env = "FLOODGATE_WRITE_TIMEOUT", default_value = "30s")]
    pub write_timeout: KubeDuration,
    /// Seconds to drain watchers after SIGTERM (each gets a last bookmark) before exiting
    /// anyway; keep it below the pod's `terminationGracePeriodSeconds`. A second SIGTERM or
    /// SIGINT exits at once.
    #[arg(long, env = "FLOODGATE_SHUTDOWN_TIMEOUT", default_value_t = server::DEFAULT_SHUTDOWN_TIMEOUT.as_secs())]
    pub shutdown_timeout: u64,
    /// Attempts to reach a remote (first dials and retries, all links together) allowed a
    /// second, half as many at once: links that start together list their remotes in turn,
    /// not in one instant. 0 does not pace.
    #[arg(long, env = "FLOODGATE_LINK_STARTS_PER_SECOND", default_value_t = link::DEFAULT_LINK_STARTS_PER_SECOND)]
    pub link_starts_per_second: u32,
}

impl Default for ServeArgs {
    /// The flags' defaults (a test checks they are what the command line gives).
    fn default() -> Self {
        let limits = ServeLimits::default();
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 6443)),
            admin_listen: SocketAddr::from(([0, 0, 0, 0], 9990)),
            grpc_listen: SocketAddr::from(([0, 0, 0, 0], 8090)),
            state_dir: STATE_DIR.into(),
            tls_cert: None,
            tls_key: None,
            tls_hosts: vec![],
            insecure_http: false,
            admin_token_file: None,
            max_connections: limits.max_connections,
            header_read_timeout: KubeDuration(limits.header_read_timeout),
            write_timeout: KubeDuration(limits.write_timeout),
            shutdown_timeout: server::DEFAULT_SHUTDOWN_TIMEOUT.as_secs(),
            link_starts_per_second: link::DEFAULT_LINK_STARTS_PER_SECOND,
        }
    }
}

/// Why the serving flags cannot serve: they contradict each other.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ServeError(String);

/// What both modes serve with, validated.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The facade's address.
    pub listen: SocketAddr,
    /// The admin API's address (and health).
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
    pub limits: ServeLimits,
    /// How long a shutdown drains before it gives up.
    pub shutdown_timeout: Duration,
    /// Attempts to reach a remote a second, all links together (0: unpaced).
    pub link_starts_per_second: u32,
}

impl ServeArgs {
    /// The serving configuration, or why these flags cannot serve.
    pub fn to_config(&self) -> Result<ServeConfig, ServeError> {
        let tls = match (&self.tls_cert, &self.tls_key, self.insecure_http) {
            (_, _, true) if !self.listen.ip().is_loopback() => {
                return Err(ServeError(format!(
                    "--insecure-http needs a loopback --listen address, not {}",
                    self.listen
                )));
            }
            (_, _, true) if !self.grpc_listen.ip().is_loopback() => {
                return Err(ServeError(format!(
                    "--insecure-http needs a loopback --grpc-listen address too, not {}",
                    self.grpc_listen
                )));
            }
            (_, _, true) => TlsSource::InsecureHttp,
            (Some(cert), Some(key), false) => TlsSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            _ => TlsSource::SelfSigned,
        };
        Ok(ServeConfig {
            listen: self.listen,
            admin_listen: self.admin_listen,
            grpc_listen: self.grpc_listen,
            state_dir: self.state_dir.clone(),
            tls,
            hosts: self.tls_hosts.clone(),
            admin_token_file: self.admin_token_file.clone(),
            limits: ServeLimits {
                max_connections: self.max_connections.max(1),
                header_read_timeout: self.header_read_timeout.get(),
                write_timeout: self.write_timeout.get(),
                // No flag sets it.
                ..ServeLimits::default()
            },
            shutdown_timeout: Duration::from_secs(self.shutdown_timeout),
            link_starts_per_second: self.link_starts_per_second,
        })
    }
}

impl ServeConfig {
    /// The serving part of `GET /config`, built field by field so no secret slips in: the
    /// admin token file's *path* shows, never its content.
    pub fn to_json(&self) -> Map<String, Value> {
        let tls = match &self.tls {
            TlsSource::Files { cert, key } => json!({
                "mode": "files",
                "cert": cert.display().to_string(),
                "key": key.display().to_string(),
            }),
            TlsSource::SelfSigned => json!({ "mode": "selfSigned" }),
            TlsSource::InsecureHttp => json!({ "mode": "insecureHttp" }),
        };
        let mutating = if self.admin_token_file.is_some() {
            "enabled"
        } else {
            "disabled"
        };
        let v = json!({
            "listen": self.listen.to_string(),
            "adminListen": self.admin_listen.to_string(),
            "grpcListen": self.grpc_listen.to_string(),
            "stateDir": self.state_dir.display().to_string(),
            "tls": tls,
            "tlsHosts": self.hosts,
            "adminTokenFile": self.admin_token_file.as_ref().map(|p| p.display().to_string()),
            "mutatingRoutes": mutating,
            "facadeLimits": self.limits,
            "shutdownTimeout": self.shutdown_timeout.as_secs_f64(),
            "linkStartsPerSecond": self.link_starts_per_second,
        });
        match v {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }
}

/// Binds the three listeners of `cfg`: the facade with [`kubeapi::serve::bind`] (its listen
/// backlog holds a restart herd's handshakes), the admin API and gRPC with tokio's.
pub async fn bind(cfg: &ServeConfig) -> anyhow::Result<Listeners> {
    Ok(Listeners {
        facade: kubeapi::serve::bind(cfg.listen)
            .with_context(|| format!("binding the facade to {}", cfg.listen))?,
        admin: TcpListener::bind(cfg.admin_listen)
            .await
            .with_context(|| format!("binding the admin API to {}", cfg.admin_listen))?,
        grpc: TcpListener::bind(cfg.grpc_listen)
            .await
            .with_context(|| format!("binding gRPC to {}", cfg.grpc_listen))?,
    })
}

/// The material both modes load before they serve: TLS and the admin token.
#[derive(Debug)]
pub struct Bootstrap {
    /// What the modes serve with.
    pub cfg: ServeConfig,
    /// The facade's and gRPC's certificate; `None` serves plain HTTP.
    pub tls: Option<TlsMaterial>,
    /// The pace every link's attempts to reach its remote share (`--link-starts-per-second`);
    /// its waits are a metric.
    pub pacer: link::Pacer,
    admin_token: Option<Token>,
}

impl Bootstrap {
    /// Reads the admin token file and the TLS material (generating it once into the state
    /// directory when no files are given).
    pub fn load(cfg: ServeConfig) -> anyhow::Result<Self> {
        let admin_token = cfg
            .admin_token_file
            .as_deref()
            .map(credentials::read_token)
            .transpose()?
            .map(Token::new);
        let tls = credentials::tls_material(&cfg.tls, &cfg.state_dir, &cfg.hosts)?;
        Ok(Self {
            pacer: link::Pacer::new(cfg.link_starts_per_second),
            cfg,
            tls,
            admin_token,
        })
    }

    /// Starts the server on `listeners` over `registry`; `mode` holds the mode's own fields
    /// of `GET /config` (where its links come from), logged with the rest at start-up.
    pub fn start(
        self,
        registry: Arc<Registry>,
        listeners: Listeners,
        mode: Map<String, Value>,
        signals: Signals,
    ) -> anyhow::Result<server::Server> {
        let mut config = mode;
        config.extend(self.cfg.to_json());
        let config = Value::Object(config);
        tracing::info!(config = %config, "effective configuration");
        let tls = self.tls.is_some();
        let server = server::start(
            registry.clone(),
            listeners,
            ServerConfig {
                tls: self.tls,
                limits: self.cfg.limits,
                admin_token: self.admin_token,
                config,
                pacer: self.pacer,
            },
            signals,
        )?;
        tracing::info!(
            facade_addr = %server.facade_addr,
            admin_addr = %server.admin_addr,
            grpc_addr = %server.grpc_addr,
            links = registry.all().len(),
            tls,
            "floodgate is serving"
        );
        Ok(server)
    }
}

#[cfg(test)]
mod tests;
