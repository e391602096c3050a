//! The local cluster for `floodgate controller`: a small, generic in-memory API server for the
//! kinds the controller reads and writes in its own cluster. kube-sim's remote ([`crate::sim`])
//! is Floodgate's facade over the kinds a link follows; this one serves everything else:
//!
//! | resource | scope | notes |
//! | --- | --- | --- |
//! | `floodgate.dev/v1alpha1` links | namespaced | `/status` subresource, `metadata.generation` |
//! | `v1` secrets | namespaced | |
//! | `coordination.k8s.io/v1` leases | namespaced | compare-and-swap updates |
//! | `events.k8s.io/v1` events, `v1` events | namespaced | |
//!
//! with the API server's rules ([`store`]): LIST with the version in its metadata; WATCH
//! ([`watch`]); GET; POST (409 AlreadyExists; uid, creationTimestamp, resourceVersion set);
//! PUT (409 Conflict on a stale `metadata.resourceVersion`); merge, JSON and (built-in kinds)
//! strategic patches; DELETE (404 when absent). Spec changes bump `metadata.generation`;
//! status is written only through `/status`, which ignores everything else. Errors are
//! `metav1.Status`. Plain HTTP, no authentication: it only listens on loopback.

mod requests;
pub mod store;
pub mod watch;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use floodgate::kubeapi::status::{Reason, StatusError};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use requests::Access;
pub use store::{LocalStore, PatchKind};

/// A served resource.
#[derive(Debug)]
pub struct Resource {
    /// API group ("" for the core group).
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Plural name in paths.
    pub plural: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Namespaced (every resource served here is).
    pub namespaced: bool,
    /// Has a `/status` subresource.
    pub status: bool,
    /// Keeps `metadata.generation` (custom resources do).
    pub generation: bool,
}

impl Resource {
    /// `group/version`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

const fn res(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    status: bool,
) -> Resource {
    Resource {
        group,
        version,
        plural,
        kind,
        namespaced: true,
        status,
        generation: status,
    }
}

/// Everything the local cluster serves.
pub const RESOURCES: &[Resource] = &[
    res("floodgate.dev", "v1alpha1", "links", "Link", true),
    res("", "v1", "secrets", "Secret", false),
    res("coordination.k8s.io", "v1", "leases", "Lease", false),
    res("events.k8s.io", "v1", "events", "Event", false),
    res("", "v1", "events", "Event", false),
];

/// Label and field selectors, in the subset the controller and kube-rs use: `k=v`, `k==v`,
/// `k!=v`, `k`, `!k` for labels; `metadata.name` and `metadata.namespace` (`=`, `!=`) for
/// fields.
#[derive(Debug, Default, Clone)]
pub struct Selector {
    terms: Vec<(String, Option<String>, bool, bool)>, // (path, value, equal, is_field)
}

impl Selector {
    /// Parses the two selectors; 400 for anything outside the subset.
    pub fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Self, StatusError> {
        let mut terms = Vec::new();
        for (sel, field) in [(labels, false), (fields, true)] {
            for t in sel.unwrap_or_default().split(',').map(str::trim) {
                if t.is_empty() {
                    continue;
                }
                let term = if let Some((k, v)) = t.split_once("!=") {
                    (k.to_owned(), Some(v.to_owned()), false, field)
                } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                    (k.to_owned(), Some(v.to_owned()), true, field)
                } else if let Some(k) = t.strip_prefix('!').filter(|_| !field) {
                    (k.to_owned(), None, false, field)
                } else if !field && !t.contains([' ', '(', '<', '>']) {
                    (t.to_owned(), None, true, field)
                } else {
                    return Err(StatusError::bad_request(format!(
                        "unsupported selector term {t:?}"
                    )));
                };
                if field && !matches!(term.0.as_str(), "metadata.name" | "metadata.namespace") {
                    return Err(StatusError::bad_request(format!(
                        "field label not supported: {}",
                        term.0
                    )));
                }
                terms.push(term);
            }
        }
        Ok(Self { terms })
    }

    /// True when `obj` matches every term.
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|(k, v, eq, field)| {
            let got = if *field {
                let key = k.trim_start_matches("metadata.");
                obj["metadata"][key].as_str()
            } else {
                obj["metadata"]["labels"][k.as_str()].as_str()
            };
            match v {
                Some(v) => (got == Some(v.as_str())) == *eq,
                None => got.is_some() == *eq,
            }
        })
    }
}

/// The local cluster's router.
pub fn router(store: Arc<LocalStore>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(store)
}

fn ok(code: StatusCode, v: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

/// A parsed path: the resource, its namespace, and the object and subresource, if any.
struct Target {
    resource: usize,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn parse_path(path: &str) -> Result<Target, StatusError> {
    let not_found = || {
        StatusError::new(
            Reason::NotFound,
            format!("the server could not find the requested resource ({path})"),
        )
    };
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(not_found()),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        rest => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some((*n).to_owned()), None),
        [p, n, s] => (*p, Some((*n).to_owned()), Some(*s)),
        _ => return Err(not_found()),
    };
    let resource = RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
        .ok_or_else(not_found)?;
    let status = match sub {
        None => false,
        Some("status") if RESOURCES[resource].status => true,
        Some(_) => return Err(not_found()),
    };
    if name.is_some() && namespace.is_none() {
        return Err(not_found());
    }
    Ok(Target {
        resource,
        namespace,
        name,
        status,
    })
}

/// The request's authorization attributes.
fn access(t: &Target, method: &Method, headers: &HeaderMap, watch: Option<&str>) -> Access {
    let verb = match (method, &t.name) {
        (&Method::GET, None) if matches!(watch, Some("true" | "1")) => "watch",
        (&Method::GET, None) => "list",
        (&Method::GET, Some(_)) => "get",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, _) => "delete",
        _ => "unknown",
    };
    let r = &RESOURCES[t.resource];
    let user = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("system:anonymous");
    Access {
        user: user.to_owned(),
        verb,
        group: r.group,
        resource: if t.status {
            format!("{}/status", r.plural)
        } else {
            r.plural.to_owned()
        },
        namespace: t.namespace.clone().unwrap_or_default(),
    }
}

async fn handle(
    State(store): State<Arc<LocalStore>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    store.count_request(method.as_str(), uri.path());
    match serve(&store, &method, &uri, &headers, &body) {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

fn serve(
    store: &Arc<LocalStore>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, StatusError> {
    if uri.path() == "/version" {
        return Ok(ok(
            StatusCode::OK,
            &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-kube-sim-local"}),
        ));
    }
    let t = parse_path(uri.path())?;
    let query: std::collections::HashMap<String, String> =
        form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let q = |k: &str| query.get(k).map(String::as_str);
    store.record_access(access(&t, method, headers, q("watch")));
    let ns = t.namespace.clone().unwrap_or_default();
    let json_body = || -> Result<Value, StatusError> {
        serde_json::from_slice(body)
            .map_err(|e| StatusError::bad_request(format!("the body is not JSON: {e}")))
    };
    let selector = || Selector::parse(q("labelSelector"), q("fieldSelector"));
    let v = match (method, &t.name) {
        (&Method::GET, None) if q("watch").is_some_and(|w| w == "true" || w == "1") => {
            let from = match q("resourceVersion").filter(|rv| !rv.is_empty() && *rv != "0") {
                None => None,
                Some(rv) => Some(rv.parse::<u64>().map_err(|_| {
                    StatusError::bad_request(format!("invalid resource version {rv:?}"))
                })?),
            };
            return Ok(watch::serve(
                store,
                watch::WatchRequest {
                    resource: t.resource,
                    namespace: t.namespace,
                    selector: selector()?,
                    from,
                    bookmarks: q("allowWatchBookmarks") == Some("true"),
                    initial_events: q("sendInitialEvents") == Some("true"),
                    timeout: q("timeoutSeconds")
                        .and_then(|s| s.parse().ok())
                        .map(Duration::from_secs),
                },
            ));
        }
        (&Method::GET, None) => {
            let sel = selector()?;
            store.list(t.resource, t.namespace.as_deref(), |v| sel.matches(v))
        }
        (&Method::GET, Some(name)) => store.get(t.resource, &ns, name)?,
        (&Method::POST, None) if t.namespace.is_some() => {
            return Ok(ok(
                StatusCode::CREATED,
                &store.create(t.resource, &ns, json_body()?)?,
            ));
        }
        (&Method::PUT, Some(name)) => {
            store.update(t.resource, &ns, name, t.status, json_body()?)?
        }
        (&Method::PATCH, Some(name)) => {
            let ctype = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let kind = match ctype.split(';').next().unwrap_or_default().trim() {
                "application/merge-patch+json" => PatchKind::Merge,
                "application/json-patch+json" => PatchKind::Json,
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                other => {
                    return Err(StatusError::new(
                        Reason::UnsupportedMediaType,
                        format!("the local cluster does not support patches of type {other:?}"),
                    ));
                }
            };
            store.patch(t.resource, &ns, name, t.status, kind, body)?
        }
        (&Method::DELETE, Some(name)) if !t.status => store.delete(t.resource, &ns, name)?,
        (m, _) => {
            return Err(StatusError::new(
                Reason::MethodNotAllowed,
                format!("{m} is not supported on {}", uri.path()),
            ));
        }
    };
    Ok(ok(StatusCode::OK, &v))
}

/// A local cluster serving on loopback.
#[derive(Debug)]
pub struct RunningLocal {
    /// Where it listens (plain HTTP).
    pub addr: SocketAddr,
    /// Its objects.
    pub store: Arc<LocalStore>,
    task: JoinHandle<()>,
}

impl RunningLocal {
    /// Starts an empty local cluster on `127.0.0.1:0`.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        Ok(Self::serve(listener, Arc::new(LocalStore::default())))
    }

    /// Serves `store` on `listener`.
    pub fn serve(listener: TcpListener, store: Arc<LocalStore>) -> Self {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        let router = router(store.clone());
        let task = tokio::spawn(async move {
            if let Err(e) =
                floodgate::kubeapi::serve_plain(listener, router, std::future::pending()).await
            {
                eprintln!("local cluster: server stopped: {e}");
            }
        });
        Self { addr, store, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig that reaches it, with `namespace` as the default namespace.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        crate::sim::kubeconfig(&self.url(), "local", None, "local")
            .replace("namespace: default", &format!("namespace: {namespace}"))
    }

    /// A kube client of it whose default namespace is `namespace`.
    pub fn client(&self, namespace: &str) -> anyhow::Result<kube::Client> {
        let mut cfg = kube::Config::new(self.url().parse()?);
        cfg.default_namespace = namespace.to_owned();
        Ok(kube::Client::try_from(cfg)?)
    }

    /// [`Self::client`] authenticated as `user`: its requests are recorded under that name
    /// ([`LocalStore::accesses_of`]).
    pub fn client_as(&self, namespace: &str, user: &str) -> anyhow::Result<kube::Client> {
        let mut cfg = kube::Config::new(self.url().parse()?);
        cfg.default_namespace = namespace.to_owned();
        cfg.headers.push((
            header::AUTHORIZATION,
            header::HeaderValue::try_from(format!("Bearer {user}"))?,
        ));
        Ok(kube::Client::try_from(cfg)?)
    }
}

impl Drop for RunningLocal {
    fn drop(&mut self) {
        self.task.abort();
    }
}
