//! kube-sim's API server: Floodgate's own facade over a writable store.
//!
//! Writes follow the API server's rules for what our tests need: create (409 AlreadyExists,
//! `generateName`, uid and creationTimestamp set), update (409 Conflict on a stale
//! `metadata.resourceVersion`), JSON merge patch, delete (404 when absent). Drivers write
//! directly through [`SimStore::apply`] and [`SimStore::delete`], which is what a controller's
//! writes look like to watchers.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::{Method, StatusCode};
use floodgate::kubeapi::status::{Reason, StatusError};
use floodgate::kubeapi::{Api, ApiStore, Simulation, Write};
use floodgate::model::{Kind, NsName, ObjKey, Object, Server};
use floodgate::view::{Change, View};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};
use tokio::time::Instant;

/// A writable store of the resources a link follows (every ConfigMap, as an API server holds
/// them: a link reads only `linkerd-config`).
#[derive(Debug)]
pub struct SimStore {
    view: View,
    /// Serializes writes so check-then-write is atomic.
    writes: Mutex<()>,
    uids: AtomicU64,
    version: Value,
    failing: Mutex<Option<StatusError>>,
    refuse_streaming_lists: std::sync::atomic::AtomicBool,
    ignore_limit: std::sync::atomic::AtomicBool,
}

impl SimStore {
    /// An empty cluster whose versions are numbered with `incarnation` and whose view keeps
    /// `history` changes for resumption.
    pub fn new(incarnation: u32, history: usize) -> Self {
        Self {
            view: View::new(incarnation, history),
            writes: Mutex::new(()),
            uids: AtomicU64::new(1),
            failing: Mutex::new(None),
            refuse_streaming_lists: Default::default(),
            ignore_limit: Default::default(),
            version: json!({
                "major": "1", "minor": "33", "gitVersion": "v1.33.0-kube-sim", "gitCommit": "",
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "",
                "compiler": "", "platform": "linux/amd64",
            }),
        }
    }

    /// Creates or replaces objects, as controllers do.
    pub fn apply(&self, objects: impl IntoIterator<Item = Object>) {
        let _w = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        self.view
            .apply(objects.into_iter().map(Change::Upsert), Instant::now());
    }

    /// Deletes objects.
    pub fn delete(&self, keys: impl IntoIterator<Item = ObjKey>) {
        let _w = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        self.view
            .apply(keys.into_iter().map(Change::Delete), Instant::now());
    }

    /// Makes every request fail with `error` (a 500 or 429 storm), or recover with `None`.
    /// Open watches are ended either way, as a restarting server ends them.
    pub fn set_failing(&self, error: Option<StatusError>) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = error;
        self.view.disconnect();
    }

    /// Refuses streaming lists (`sendInitialEvents`) with 422 Invalid from now on, as an API
    /// server with its `WatchList` feature off does, or serves them again.
    pub fn set_refuse_streaming_lists(&self, refuse: bool) {
        self.refuse_streaming_lists.store(refuse, Ordering::Relaxed);
    }

    /// Ignores `limit` from now on: every list is one body, as a real API server serves a
    /// `resourceVersion=0` list from its watch cache (kube-sim, like Floodgate's facade,
    /// already serves those whole; this extends it to lists of the current state).
    pub fn set_ignore_limit(&self, ignore: bool) {
        self.ignore_limit.store(ignore, Ordering::Relaxed);
    }

    /// Ends every watch and forgets the history: each client's resume gets a 410 and relists
    /// (a 410 storm, as after a watch-cache reset).
    pub fn expire_all_watches(&self) {
        self.view.compact_history();
        self.view.disconnect();
    }

    fn next_uid(&self) -> String {
        let n = self.uids.fetch_add(1, Ordering::Relaxed);
        format!("00000000-0000-4000-8000-{n:012x}")
    }
}

/// Decodes an object of a kind from JSON.
pub fn decode(kind: Kind, v: Value) -> Result<Object, serde_json::Error> {
    Ok(match kind {
        Kind::Service => Object::Service(Arc::new(serde_json::from_value(v)?)),
        Kind::EndpointSlice => Object::EndpointSlice(serde_json::from_value(v)?),
        Kind::Endpoints => Object::Endpoints(Arc::new(serde_json::from_value(v)?)),
        Kind::Pod => Object::Pod(Arc::new(serde_json::from_value(v)?)),
        Kind::ReplicaSet => {
            Object::ReplicaSet(Arc::new(serde_json::from_value(v["metadata"].clone())?))
        }
        Kind::Server => Object::Server(Arc::new(serde_json::from_value::<Server>(v)?)),
        Kind::ConfigMap => Object::ConfigMap(Arc::new(serde_json::from_value(v)?)),
    })
}

fn bad(e: impl std::fmt::Display) -> StatusError {
    StatusError::bad_request(format!("the object could not be decoded: {e}"))
}

impl ApiStore for SimStore {
    fn view(&self) -> &View {
        &self.view
    }

    fn version(&self) -> Value {
        self.version.clone()
    }

    fn simulation(&self) -> Option<&dyn Simulation> {
        Some(self)
    }
}

impl Simulation for SimStore {
    fn fault(&self) -> Option<StatusError> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn serves_streaming_lists(&self) -> bool {
        !self.refuse_streaming_lists.load(Ordering::Relaxed)
    }

    fn honours_limit(&self) -> bool {
        !self.ignore_limit.load(Ordering::Relaxed)
    }

    fn write(&self, w: Write<'_>) -> Result<(StatusCode, Value), StatusError> {
        let _guard = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        let kind = w.def.kind;
        let ns = w.namespace.unwrap_or_default();
        let key = |name: &str| ObjKey {
            kind,
            id: NsName::new(ns, name),
        };
        let stored_json = |k: &ObjKey| -> Result<Value, StatusError> {
            let s = self
                .view
                .get(k)
                .ok_or_else(|| StatusError::not_found(w.def.plural, &k.id.name))?;
            serde_json::from_slice(&s.json()).map_err(bad)
        };
        let publish = |obj: Object| -> Result<Value, StatusError> {
            let events = self
                .view
                .apply([Change::Upsert(obj.clone())], Instant::now());
            let stored = match events.first() {
                Some(e) => e.object.clone(),
                None => self
                    .view
                    .get(&obj.key())
                    .ok_or_else(|| StatusError::new(Reason::InternalError, "lost a write"))?,
            };
            serde_json::from_slice(&stored.json()).map_err(bad)
        };
        let body = || -> Result<Value, StatusError> { serde_json::from_slice(w.body).map_err(bad) };

        match (w.method, w.name) {
            (&Method::POST, None) => {
                let mut v = body()?;
                if w.namespace.is_none() {
                    return Err(StatusError::bad_request(
                        "create needs a namespace in the path",
                    ));
                }
                let meta = &mut v["metadata"];
                if meta["namespace"].as_str().is_some_and(|n| n != ns) {
                    return Err(StatusError::bad_request(
                        "the namespace of the object does not match the namespace of the path",
                    ));
                }
                meta["namespace"] = ns.into();
                if meta["name"].as_str().is_none_or(str::is_empty) {
                    let prefix = meta["generateName"].as_str().ok_or_else(|| {
                        StatusError::invalid(
                            "metadata.name: Required value: name or generateName is required",
                        )
                    })?;
                    meta["name"] =
                        format!("{prefix}{:05x}", self.uids.load(Ordering::Relaxed)).into();
                }
                let name = meta["name"].as_str().unwrap_or_default().to_owned();
                if self.view.get(&key(&name)).is_some() {
                    return Err(StatusError {
                        details: Some(json!({ "name": name, "kind": w.def.plural })),
                        ..StatusError::new(
                            Reason::AlreadyExists,
                            format!("{} {name:?} already exists", w.def.plural),
                        )
                    });
                }
                meta["uid"] = self.next_uid().into();
                meta["creationTimestamp"] =
                    serde_json::to_value(Time(jiff::Timestamp::now())).map_err(bad)?;
                if let Some(m) = meta.as_object_mut() {
                    m.remove("resourceVersion");
                }
                Ok((StatusCode::CREATED, publish(decode(kind, v).map_err(bad)?)?))
            }
            (&Method::PUT, Some(name)) => {
                let current = stored_json(&key(name))?;
                let mut v = body()?;
                if let Some(rv) = v["metadata"]["resourceVersion"]
                    .as_str()
                    .filter(|rv| !rv.is_empty())
                    && Some(rv) != current["metadata"]["resourceVersion"].as_str()
                {
                    return Err(StatusError::new(
                        Reason::Conflict,
                        format!(
                            "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                            w.def.plural
                        ),
                    ));
                }
                for keep in ["uid", "creationTimestamp", "namespace", "name"] {
                    v["metadata"][keep] = current["metadata"][keep].clone();
                }
                Ok((StatusCode::OK, publish(decode(kind, v).map_err(bad)?)?))
            }
            (&Method::PATCH, Some(name)) => {
                if w.content_type.starts_with("application/json-patch+json") {
                    return Err(StatusError::new(
                        Reason::UnsupportedMediaType,
                        "kube-sim supports merge patches only",
                    ));
                }
                let mut v = stored_json(&key(name))?;
                json_patch::merge(&mut v, &body()?);
                Ok((StatusCode::OK, publish(decode(kind, v).map_err(bad)?)?))
            }
            (&Method::DELETE, Some(name)) => {
                let current = stored_json(&key(name))?;
                self.view.apply([Change::Delete(key(name))], Instant::now());
                Ok((StatusCode::OK, current))
            }
            (m, _) => Err(StatusError::new(
                Reason::MethodNotAllowed,
                format!("{m} is not supported here"),
            )),
        }
    }
}

/// A kube-sim API: the shared store and its token.
pub type SimApi = Api<Arc<SimStore>>;

/// A kubeconfig for a server at `url` opened by `token`, trusting `ca_pem` when given.
pub fn kubeconfig(url: &str, token: &str, ca_pem: Option<&str>, name: &str) -> String {
    use base64::Engine as _;
    let ca = ca_pem
        .map(|pem| {
            let data = base64::engine::general_purpose::STANDARD.encode(pem);
            format!("\n    certificate-authority-data: {data}")
        })
        .unwrap_or_default();
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: {url}{ca}
contexts:
- name: {name}
  context:
    cluster: {name}
    user: {name}
    namespace: default
current-context: {name}
users:
- name: {name}
  user:
    token: {token}
"
    )
}
