//! Credentials and the state directory, for every mode: each link's bearer token
//! (`tokens/<link>`), the facade's TLS material (files, or a CA and certificate generated once
//! into `tls/`), the admin API's token file, the kubeconfig a consumer of a link uses, the
//! kubeconfig a link reaches its remote with, the name of a link's token Secret, and the random
//! incarnation that tells one run's resource versions from another's.
//!
//! Nothing here knows which mode runs: `floodgate run`, `floodgate controller` and
//! `floodgate wrap` all take these from here, none from another.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;

use crate::link::Connect;
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

/// The kubeconfig a replica follows another replica's facade with: [`consumer_kubeconfig`]
/// whose certificate is checked against `server_name` (the replicas share one certificate and
/// reach each other by address).
pub fn peer_kubeconfig(
    server: &str,
    token: &str,
    ca_pem: &str,
    server_name: &str,
    name: &str,
) -> String {
    consumer_kubeconfig(server, token, Some(ca_pem), name).replacen(
        &format!("    server: {server}\n"),
        &format!("    server: {server}\n    tls-server-name: {server_name}\n"),
        1,
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

/// Where a link's remote kubeconfig is: a file named in a links file, or a Secret's content.
#[derive(Clone, Debug)]
pub enum RemoteKubeconfig {
    /// A path on disk (`floodgate run`).
    File(String),
    /// The YAML itself (`floodgate controller`, from the Link's Secret).
    Yaml(String),
}

/// How a link reaches its remote: its kubeconfig, read again at each connect (a file rewritten
/// on disk takes effect at the next reconnect), with `context` or the kubeconfig's current one.
pub fn connect(kubeconfig: RemoteKubeconfig, context: Option<String>) -> Connect {
    Arc::new(move || {
        let kubeconfig = kubeconfig.clone();
        let context = context.clone();
        Box::pin(async move {
            let opts = kube::config::KubeConfigOptions {
                context,
                ..Default::default()
            };
            let cfg = match &kubeconfig {
                RemoteKubeconfig::File(path) => {
                    let kc = kube::config::Kubeconfig::read_from(path)
                        .with_context(|| format!("reading kubeconfig {path}"))?;
                    kube::Config::from_custom_kubeconfig(kc, &opts)
                        .await
                        .with_context(|| format!("kubeconfig {path}"))?
                }
                RemoteKubeconfig::Yaml(yaml) => {
                    let kc = kube::config::Kubeconfig::from_yaml(yaml)?;
                    kube::Config::from_custom_kubeconfig(kc, &opts).await?
                }
            };
            Ok(crate::upstream::client(cfg)?)
        })
    })
}

/// The key of a link's token in its token Secret.
pub const TOKEN_KEY: &str = "token";

/// The Secret holding a link's consumer token, in Floodgate's namespace.
pub fn token_secret_name(link: &str) -> String {
    format!("floodgate-token-{link}")
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

/// Why the admin token could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("reading the admin token file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file holds no token.
    #[error("the admin token file {0} is empty")]
    Empty(String),
}

/// Reads the admin bearer token: the file's content, surrounding whitespace trimmed.
pub fn read_token(path: &Path) -> Result<String, TokenError> {
    let shown = path.display().to_string();
    let raw = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
        path: shown.clone(),
        source,
    })?;
    let token = raw.trim();
    if token.is_empty() {
        return Err(TokenError::Empty(shown));
    }
    Ok(token.to_owned())
}
