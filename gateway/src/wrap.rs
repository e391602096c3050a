//! `floodgate wrap`: adopts a Linkerd link. It reads the credentials Secrets that `linkerd
//! multicluster link-gen` (or `link`) prints and prints, for each linked cluster:
//!
//! - a Floodgate `Link` named after the cluster, in Floodgate's namespace, whose remote is
//!   the Secret below;
//! - in the credentials namespace (the only Secrets the gateway can read),
//!   `<credentials>-upstream`: a copy of Linkerd's original kubeconfig (the remote's own API
//!   server), an `Opaque` Secret Linkerd never looks at, and `floodgate-token-<cluster>`: the bearer token the link's consumers present, which
//!   the controller reads;
//! - each credentials Secret rewritten to point its consumer at Floodgate (server
//!   `https://<floodgate>/links/<cluster>`, Floodgate's CA, the link's token), with Linkerd's
//!   name, namespace, type, labels and annotations kept, so Linkerd finds it where it looked.
//!
//! Every other document (link-gen's `multicluster.linkerd.io` Link, the service mirror) passes
//! through unchanged, so `linkerd multicluster link-gen ... | floodgate wrap | kubectl apply -f -`
//! is the whole adoption. Linkerd's destination controller only picks up a credentials Secret
//! that is created, not one that is updated: delete the old Secret before applying (README).
//!
//! Linkerd's format (`multicluster/cmd/link-gen.go`): Secrets named `cluster-credentials-<cluster>`
//! of type `mirror.linkerd.io/remote-kubeconfig` with the kubeconfig under data key
//! `kubeconfig`; one in `linkerd-multicluster` for the service mirror, and one in `linkerd` for
//! the destination controller, labelled `multicluster.linkerd.io/cluster-name` and annotated
//! with the remote's trust and cluster domains.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::{Value, json};

/// The Secret type of Linkerd's link credentials.
pub const LINKERD_SECRET_TYPE: &str = "mirror.linkerd.io/remote-kubeconfig";
/// The data key holding the kubeconfig in Linkerd's credentials.
pub const LINKERD_KUBECONFIG_KEY: &str = "kubeconfig";
/// The label naming the linked cluster on Linkerd's destination credentials.
pub const LINKERD_CLUSTER_LABEL: &str = "multicluster.linkerd.io/cluster-name";
/// The API group of Linkerd's `Link` (`multicluster.linkerd.io/v1alpha3`, ...), with its `/`.
pub const LINKERD_LINK_GROUP: &str = "multicluster.linkerd.io/";
/// The prefix of Linkerd's credentials Secrets.
pub const LINKERD_SECRET_PREFIX: &str = "cluster-credentials-";
/// The annotation Floodgate puts on a Secret it rewrote: `<namespace>/<link>`.
pub const WRAPPED_ANNOTATION: &str = "floodgate.dev/link";
/// The annotation on an upstream copy naming the Secret it was copied from.
pub const COPIED_FROM_ANNOTATION: &str = "floodgate.dev/copied-from";
pub use crate::credentials::{TOKEN_KEY, token_secret_name};

/// The name of the copy of Linkerd's original credentials.
pub fn upstream_secret_name(credentials: &str) -> String {
    format!("{credentials}-upstream")
}

/// What `wrap` needs besides its input.
#[derive(Clone, Debug)]
pub struct WrapOptions {
    /// Floodgate's namespace: where the Links go.
    pub namespace: String,
    /// The credentials namespace: where the upstream copies and the tokens go.
    pub credentials_namespace: String,
    /// The facade as consumers reach it, without the link prefix.
    pub server: String,
    /// The CA consumers trust (PEM), if the facade's certificate needs one.
    pub ca_pem: Option<String>,
}

/// Why `wrap` refused its input.
#[derive(Debug, thiserror::Error)]
pub enum WrapError {
    /// A document is not YAML, or not an object Kubernetes would take.
    #[error("document {doc}: {message}")]
    Parse {
        /// Its position in the input, from 1.
        doc: usize,
        /// What is wrong.
        message: String,
    },
    /// A credentials Secret has no kubeconfig.
    #[error("Secret {secret}: no data key {LINKERD_KUBECONFIG_KEY:?}")]
    NoKubeconfig {
        /// `<namespace>/<name>`.
        secret: String,
    },
    /// A credentials Secret's kubeconfig does not parse.
    #[error("Secret {secret}: its kubeconfig does not parse: {message}")]
    BadKubeconfig {
        /// `<namespace>/<name>`.
        secret: String,
        /// Why.
        message: String,
    },
    /// The cluster cannot be told from the Secret's name or labels.
    #[error(
        "Secret {secret}: cannot tell the cluster (no {LINKERD_CLUSTER_LABEL} label, and the name does not start with {LINKERD_SECRET_PREFIX:?})"
    )]
    NoCluster {
        /// `<namespace>/<name>`.
        secret: String,
    },
    /// The Secret already points at Floodgate: wrapping it again would make a link its own
    /// upstream.
    #[error("Secret {secret} was already wrapped by Floodgate (annotation {WRAPPED_ANNOTATION})")]
    AlreadyWrapped {
        /// `<namespace>/<name>`.
        secret: String,
    },
    /// No credentials Secret in the input.
    #[error("no Secret of type {LINKERD_SECRET_TYPE} in the input")]
    NothingToWrap,
    /// A link's token could not be had.
    #[error("link {link}: {message}")]
    Token {
        /// The link.
        link: String,
        /// Why.
        message: String,
    },
}

/// Rewrites `input` (YAML documents, or a `List`) as described in the module docs. `token`
/// gives each link's consumer token (read from, or created in, the state directory).
pub fn wrap(
    input: &str,
    opts: &WrapOptions,
    token: &mut dyn FnMut(&str) -> Result<String, WrapError>,
) -> Result<String, WrapError> {
    let mut out: Vec<Value> = Vec::new();
    let mut adopted: BTreeMap<String, String> = BTreeMap::new();
    let mut docs: Vec<(usize, Value)> = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(input).enumerate() {
        let doc_no = i + 1;
        let value = Value::deserialize(doc).map_err(|e| WrapError::Parse {
            doc: doc_no,
            message: e.to_string(),
        })?;
        let items = match value {
            Value::Null => continue,
            Value::Object(ref o) if o.get("kind").and_then(Value::as_str) == Some("List") => o
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            other => vec![other],
        };
        docs.extend(items.into_iter().map(|item| (doc_no, item)));
    }
    // Linkerd's Links may come before or after their credentials.
    let namespaces = linkerd_namespaces(docs.iter().map(|(_, item)| item));
    for (doc_no, item) in docs {
        if !is_credentials(&item) {
            out.push(item);
            continue;
        }
        let secret: Secret = serde_json::from_value(item).map_err(|e| WrapError::Parse {
            doc: doc_no,
            message: format!("not a Secret: {e}"),
        })?;
        let c = Credentials::read(&secret)?;
        if !adopted.contains_key(&c.cluster) {
            let tok = token(&c.cluster)?;
            out.push(link_object(&c, namespaces.get(&c.cluster), opts));
            out.push(upstream_copy(&c, opts));
            out.push(token_secret(&c.cluster, &tok, opts));
            adopted.insert(c.cluster.clone(), tok);
        }
        let tok = &adopted[&c.cluster];
        out.push(rewritten(&secret, &c, tok, opts));
    }
    if adopted.is_empty() {
        return Err(WrapError::NothingToWrap);
    }
    let mut text = format!(
        "# floodgate wrap: {} link(s) adopted: {}.\n# Delete Linkerd's credentials Secrets before applying: its destination controller only\n# picks up a re-created Secret, not an updated one.\n",
        adopted.len(),
        adopted.keys().cloned().collect::<Vec<_>>().join(", ")
    );
    for v in out {
        text.push_str("---\n");
        text.push_str(&serde_yaml::to_string(&v).expect("JSON values always serialize to YAML"));
    }
    Ok(text)
}

/// The `targetClusterLinkerdNamespace` of each of Linkerd's Links among `items`, by the
/// cluster it links (`targetClusterName`, else its name).
fn linkerd_namespaces<'a>(items: impl Iterator<Item = &'a Value>) -> BTreeMap<String, String> {
    let is_link = |v: &Value| {
        v["kind"] == "Link"
            && (v["apiVersion"].as_str()).is_some_and(|a| a.starts_with(LINKERD_LINK_GROUP))
    };
    items
        .filter(|v| is_link(v))
        .filter_map(|v| {
            let ns = v["spec"]["targetClusterLinkerdNamespace"].as_str()?;
            let cluster = (v["spec"]["targetClusterName"].as_str())
                .or_else(|| v["metadata"]["name"].as_str())?;
            Some((cluster.to_owned(), ns.to_owned()))
        })
        .collect()
}

fn is_credentials(v: &Value) -> bool {
    v.get("kind").and_then(Value::as_str) == Some("Secret")
        && v.get("type").and_then(Value::as_str) == Some(LINKERD_SECRET_TYPE)
}

/// One of Linkerd's credentials Secrets, read.
#[derive(Debug)]
struct Credentials {
    /// `<namespace>/<name>`, for messages.
    id: String,
    name: String,
    cluster: String,
    kubeconfig: Vec<u8>,
}

impl Credentials {
    fn read(secret: &Secret) -> Result<Self, WrapError> {
        let meta = &secret.metadata;
        let name = meta.name.clone().unwrap_or_default();
        let id = format!("{}/{name}", meta.namespace.as_deref().unwrap_or("default"));
        if meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(WRAPPED_ANNOTATION))
        {
            return Err(WrapError::AlreadyWrapped { secret: id });
        }
        let cluster = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(LINKERD_CLUSTER_LABEL))
            .cloned()
            .or_else(|| name.strip_prefix(LINKERD_SECRET_PREFIX).map(str::to_owned))
            .filter(|c| !c.is_empty())
            .ok_or_else(|| WrapError::NoCluster { secret: id.clone() })?;
        let kubeconfig = secret
            .data
            .as_ref()
            .and_then(|d| d.get(LINKERD_KUBECONFIG_KEY))
            .map(|b| b.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(LINKERD_KUBECONFIG_KEY))
                    .map(|s| s.clone().into_bytes())
            })
            .ok_or_else(|| WrapError::NoKubeconfig { secret: id.clone() })?;
        let text = std::str::from_utf8(&kubeconfig).map_err(|e| WrapError::BadKubeconfig {
            secret: id.clone(),
            message: e.to_string(),
        })?;
        kube::config::Kubeconfig::from_yaml(text).map_err(|e| WrapError::BadKubeconfig {
            secret: id.clone(),
            message: e.to_string(),
        })?;
        Ok(Self {
            id,
            name,
            cluster,
            kubeconfig,
        })
    }
}

fn link_object(c: &Credentials, linkerd_namespace: Option<&String>, opts: &WrapOptions) -> Value {
    let mut link = json!({
        "apiVersion": "floodgate.dev/v1alpha1",
        "kind": "Link",
        "metadata": {
            "name": c.cluster,
            "namespace": opts.namespace,
            "labels": {LINKERD_CLUSTER_LABEL: c.cluster},
        },
        "spec": {
            "remote": {
                "kubeconfigSecret": {
                    "name": upstream_secret_name(&c.name),
                    "key": LINKERD_KUBECONFIG_KEY,
                },
            },
        },
    });
    if let Some(ns) = linkerd_namespace {
        link["spec"]["targetClusterLinkerdNamespace"] = ns.as_str().into();
    }
    link
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn upstream_copy(c: &Credentials, opts: &WrapOptions) -> Value {
    let mut annotations = BTreeMap::new();
    annotations.insert(COPIED_FROM_ANNOTATION.to_owned(), c.id.clone());
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": upstream_secret_name(&c.name),
            "namespace": opts.credentials_namespace,
            "labels": {"app.kubernetes.io/managed-by": "floodgate", LINKERD_CLUSTER_LABEL: c.cluster},
            "annotations": annotations,
        },
        // Opaque: Linkerd looks only at its own type, so the copy is never taken for a link.
        "type": "Opaque",
        "data": {LINKERD_KUBECONFIG_KEY: b64(&c.kubeconfig)},
    })
}

fn token_secret(link: &str, token: &str, opts: &WrapOptions) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": token_secret_name(link),
            "namespace": opts.credentials_namespace,
            "labels": {"app.kubernetes.io/managed-by": "floodgate", LINKERD_CLUSTER_LABEL: link},
        },
        "type": "Opaque",
        "data": {TOKEN_KEY: b64(token.as_bytes())},
    })
}

/// Linkerd's Secret with the consumer's kubeconfig in place of the remote's; metadata kept
/// except what the API server owns.
fn rewritten(original: &Secret, c: &Credentials, token: &str, opts: &WrapOptions) -> Value {
    let server = format!("{}/links/{}", opts.server.trim_end_matches('/'), c.cluster);
    let kubeconfig =
        crate::credentials::consumer_kubeconfig(&server, token, opts.ca_pem.as_deref(), &c.cluster);
    let m = &original.metadata;
    let mut annotations = m.annotations.clone().unwrap_or_default();
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    annotations.insert(
        WRAPPED_ANNOTATION.to_owned(),
        format!("{}/{}", opts.namespace, c.cluster),
    );
    let secret = Secret {
        metadata: ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            labels: m.labels.clone(),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        type_: original.type_.clone(),
        data: Some(BTreeMap::from([(
            LINKERD_KUBECONFIG_KEY.to_owned(),
            ByteString(kubeconfig.into_bytes()),
        )])),
        ..Secret::default()
    };
    // k8s-openapi writes apiVersion and kind itself.
    serde_json::to_value(&secret).expect("a Secret always serializes")
}

/// `floodgate wrap`.
#[derive(Debug, clap::Args)]
pub struct WrapArgs {
    /// The YAML to read (link-gen's output, or the credentials Secret); stdin when absent or `-`.
    pub file: Option<std::path::PathBuf>,
    /// Floodgate's namespace: where the Link goes.
    #[arg(long, env = "FLOODGATE_NAMESPACE", default_value = "floodgate")]
    pub namespace: String,
    /// The credentials namespace: where the upstream copy and the token go (the only Secrets
    /// the gateway can read; `floodgate controller --credentials-namespace`).
    #[arg(
        long,
        env = "FLOODGATE_CREDENTIALS_NAMESPACE",
        default_value = "floodgate-credentials"
    )]
    pub credentials_namespace: String,
    /// The facade as Linkerd reaches it (the Service `floodgate` of the manifests).
    #[arg(long, default_value = "https://floodgate.floodgate.svc:6443")]
    pub server: String,
    /// Where link tokens and the generated CA are kept (created when missing); the same
    /// directory `floodgate-tls` is made from.
    #[arg(
        long,
        env = "FLOODGATE_STATE_DIR",
        default_value = "/var/lib/floodgate"
    )]
    pub state_dir: std::path::PathBuf,
    /// The CA consumers trust (PEM), when the facade's certificate is not Floodgate's own.
    #[arg(long)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Extra names for a generated certificate, besides the --server host; repeatable.
    #[arg(long = "tls-host", value_delimiter = ',')]
    pub tls_hosts: Vec<String>,
}

/// `floodgate wrap`: reads the input, the CA and the tokens, prints the adoption.
pub fn run_wrap(args: &WrapArgs) -> anyhow::Result<String> {
    use anyhow::Context as _;
    use std::io::Read as _;
    let input = match args.file.as_deref() {
        None => read_stdin()?,
        Some(p) if p.as_os_str() == "-" => read_stdin()?,
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
    };
    let ca_pem = match &args.ca_file {
        Some(f) => {
            Some(std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?)
        }
        None => {
            let host = args
                .server
                .parse::<axum::http::Uri>()
                .with_context(|| format!("--server {:?} is not a URL", args.server))?
                .host()
                .map(str::to_owned);
            let mut hosts: Vec<String> = host.into_iter().collect();
            hosts.extend(args.tls_hosts.iter().cloned());
            crate::credentials::tls_material(
                &crate::credentials::TlsSource::SelfSigned,
                &args.state_dir,
                &hosts,
            )?
            .map(|m| m.ca_pem)
        }
    };
    let opts = WrapOptions {
        namespace: args.namespace.clone(),
        credentials_namespace: args.credentials_namespace.clone(),
        server: args.server.clone(),
        ca_pem,
    };
    let state_dir = args.state_dir.clone();
    let out = wrap(&input, &opts, &mut |link| {
        crate::credentials::link_token(&state_dir, link).map_err(|e| WrapError::Token {
            link: link.to_owned(),
            message: format!("{e:#}"),
        })
    })?;
    return Ok(out);

    fn read_stdin() -> anyhow::Result<String> {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading stdin")?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests;
