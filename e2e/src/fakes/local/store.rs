//! The local cluster's objects: one map of JSON objects per served resource, one resource
//! version counter for all of them (as etcd's revision), and a bounded history of watch frames
//! for resumption.
//!
//! Every write takes the one lock, checks, bumps the counter, stores and publishes its frame on
//! a broadcast channel while still holding the lock, so a watch that subscribes under the lock
//! sees every frame after its starting version exactly once.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use floodgate::kubeapi::status::{Reason, StatusError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::requests::Requests;
use super::{RESOURCES, Resource};

/// Watch frames a slow watcher may fall behind before it is closed (it resumes from its last
/// version, or relists after a 410). The controller's watches see a few frames a second.
const FANOUT: usize = 1024;

/// One change, as watchers see it.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The resource version of the change.
    pub rv: u64,
    /// Index into [`RESOURCES`].
    pub resource: usize,
    /// The object's namespace ("" for cluster-scoped objects).
    pub namespace: String,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub type_: &'static str,
    /// The object after the change (before it, for `DELETED`, with the new version).
    pub object: Value,
}

type Key = (usize, String, String);

/// Where a watch starts: the frames to send first, every later one, and the version the first
/// ones bring the watcher to.
#[derive(Debug)]
pub struct WatchStart {
    /// Sent first.
    pub frames: Vec<Arc<Frame>>,
    /// Every later frame.
    pub rx: broadcast::Receiver<Arc<Frame>>,
    /// The store's version when the watch started.
    pub rv: u64,
}

#[derive(Debug, Default)]
struct Inner {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    uids: u64,
    history: VecDeque<Arc<Frame>>,
    /// Versions at or below this are gone from the history: resuming from them is a 410.
    compacted: u64,
}

impl Inner {
    /// The key and the current state of an object that must exist (404 otherwise).
    fn existing(&self, resource: usize, ns: &str, name: &str) -> Result<(Key, Value), StatusError> {
        let key = (resource, ns.to_owned(), name.to_owned());
        let current = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| StatusError::not_found(RESOURCES[resource].plural, name))?;
        Ok((key, current))
    }
}

/// How a patch body is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/strategic-merge-patch+json`: for the built-in kinds served here (which
    /// have no list merge keys the controller relies on) applied as a merge patch; refused for
    /// custom resources, as the API server refuses it.
    Strategic,
}

/// The local cluster's store.
#[derive(Debug)]
pub struct LocalStore {
    inner: Mutex<Inner>,
    /// What was asked of it, and by whom.
    pub(super) requests: Requests,
    frames: broadcast::Sender<Arc<Frame>>,
    history: usize,
}

impl Default for LocalStore {
    fn default() -> Self {
        Self::new(1000)
    }
}

fn conflict(r: &Resource, name: &str) -> StatusError {
    StatusError {
        details: Some(json!({ "name": name, "kind": r.plural })),
        ..StatusError::new(
            Reason::Conflict,
            format!(
                "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                r.plural
            ),
        )
    }
}

/// The object without `metadata` and `status`: what `metadata.generation` follows.
fn spec_of(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

impl LocalStore {
    /// An empty cluster keeping the last `history` changes for resumption.
    pub fn new(history: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            requests: Requests::default(),
            frames: broadcast::channel(FANOUT).0,
            history: history.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current resource version.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Forgets the history: every watch resuming from an earlier version gets 410 Expired.
    pub fn compact(&self) {
        let mut g = self.lock();
        g.compacted = g.rv;
        g.history.clear();
    }

    /// Every object of `plural` (all namespaces), for tests to inspect.
    pub fn objects(&self, plural: &str) -> Vec<Value> {
        let g = self.lock();
        g.objects
            .iter()
            .filter(|((r, _, _), _)| RESOURCES[*r].plural == plural)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Stores `object` under the lock, publishing its frame.
    fn commit(
        g: &mut Inner,
        this: &Self,
        key: Key,
        type_: &'static str,
        mut object: Value,
    ) -> Value {
        g.rv += 1;
        object["metadata"]["resourceVersion"] = g.rv.to_string().into();
        let frame = Arc::new(Frame {
            rv: g.rv,
            resource: key.0,
            namespace: key.1.clone(),
            type_,
            object: object.clone(),
        });
        if type_ == "DELETED" {
            g.objects.remove(&key);
        } else {
            g.objects.insert(key, object.clone());
        }
        if g.history.len() >= this.history
            && let Some(old) = g.history.pop_front()
        {
            g.compacted = old.rv;
        }
        g.history.push_back(frame.clone());
        // No receivers is fine: nobody watches.
        let _ = this.frames.send(frame);
        object
    }

    /// The list of `resource` in `ns` (every namespace when `None`) with the current version.
    pub fn list(&self, resource: usize, ns: Option<&str>, keep: impl Fn(&Value) -> bool) -> Value {
        let r = &RESOURCES[resource];
        let g = self.lock();
        let items: Vec<Value> = g
            .objects
            .iter()
            .filter(|((res, n, _), v)| *res == resource && ns.is_none_or(|ns| ns == n) && keep(v))
            .map(|(_, v)| v.clone())
            .collect();
        json!({
            "apiVersion": r.api_version(),
            "kind": format!("{}List", r.kind),
            "metadata": { "resourceVersion": g.rv.to_string() },
            "items": items,
        })
    }

    /// One object.
    pub fn get(&self, resource: usize, ns: &str, name: &str) -> Result<Value, StatusError> {
        let r = &RESOURCES[resource];
        self.lock()
            .objects
            .get(&(resource, ns.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| StatusError::not_found(r.plural, name))
    }

    /// POST: creates `body` in `ns`.
    pub fn create(&self, resource: usize, ns: &str, mut body: Value) -> Result<Value, StatusError> {
        let r = &RESOURCES[resource];
        if !body.is_object() {
            return Err(StatusError::bad_request("the body is not a JSON object"));
        }
        let meta = &mut body["metadata"];
        if !meta.is_object() {
            *meta = json!({});
        }
        if let Some(n) = meta["namespace"].as_str()
            && r.namespaced
            && n != ns
        {
            return Err(StatusError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let mut g = self.lock();
        g.uids += 1;
        let uid = g.uids;
        if meta["name"].as_str().is_none_or(str::is_empty) {
            let prefix = meta["generateName"].as_str().ok_or_else(|| {
                StatusError::invalid(
                    "metadata.name: Required value: name or generateName is required",
                )
            })?;
            meta["name"] = format!("{prefix}{uid:05x}").into();
        }
        let name = meta["name"].as_str().unwrap_or_default().to_owned();
        let key = (resource, ns.to_owned(), name.clone());
        if g.objects.contains_key(&key) {
            return Err(StatusError {
                details: Some(json!({ "name": name, "kind": r.plural })),
                ..StatusError::new(
                    Reason::AlreadyExists,
                    format!("{} {name:?} already exists", r.plural),
                )
            });
        }
        if r.namespaced {
            meta["namespace"] = ns.into();
        }
        meta["uid"] = format!("00000000-0000-4000-9000-{uid:012x}").into();
        meta["creationTimestamp"] = serde_json::to_value(Time(jiff::Timestamp::now()))
            .map_err(|e| StatusError::new(Reason::InternalError, e.to_string()))?;
        if r.generation {
            meta["generation"] = 1.into();
        }
        body["apiVersion"] = r.api_version().into();
        body["kind"] = r.kind.into();
        if r.status
            && let Some(m) = body.as_object_mut()
        {
            // With a status subresource the API server ignores status on create.
            m.remove("status");
        }
        Ok(Self::commit(&mut g, self, key, "ADDED", body))
    }

    /// The checks and bookkeeping of every change to an existing object: `change` computes the
    /// new object from the current one; a stale `metadata.resourceVersion` in the result is a
    /// 409. Through `/status` only the status changes; otherwise the status is kept (when the
    /// resource has the subresource) and a spec change bumps `metadata.generation`.
    fn modify(
        &self,
        resource: usize,
        ns: &str,
        name: &str,
        status_only: bool,
        change: impl FnOnce(&Value) -> Result<Value, StatusError>,
    ) -> Result<Value, StatusError> {
        let r = &RESOURCES[resource];
        let mut g = self.lock();
        let (key, current) = Inner::existing(&g, resource, ns, name)?;
        let wanted = change(&current)?;
        if !wanted.is_object() {
            return Err(StatusError::bad_request("the object is not a JSON object"));
        }
        if let Some(rv) = wanted["metadata"]["resourceVersion"]
            .as_str()
            .filter(|rv| !rv.is_empty())
            && Some(rv) != current["metadata"]["resourceVersion"].as_str()
        {
            return Err(conflict(r, name));
        }
        let mut next = if status_only {
            let mut next = current.clone();
            next["status"] = wanted["status"].clone();
            next
        } else {
            let mut next = wanted;
            for keep in [
                "uid",
                "creationTimestamp",
                "namespace",
                "name",
                "generation",
            ] {
                next["metadata"][keep] = current["metadata"][keep].clone();
            }
            if r.status {
                next["status"] = current["status"].clone();
            }
            if r.generation && spec_of(&next) != spec_of(&current) {
                let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
                next["metadata"]["generation"] = (generation + 1).into();
            }
            next
        };
        if let Some(m) = next.as_object_mut() {
            m.retain(|_, v| !v.is_null());
        }
        next["apiVersion"] = r.api_version().into();
        next["kind"] = r.kind.into();
        next["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        if next == current {
            // A no-op write changes nothing, not even the version (as the API server does).
            return Ok(current);
        }
        Ok(Self::commit(&mut g, self, key, "MODIFIED", next))
    }

    /// PUT: replaces the object (or, `status_only`, its status).
    pub fn update(
        &self,
        resource: usize,
        ns: &str,
        name: &str,
        status_only: bool,
        body: Value,
    ) -> Result<Value, StatusError> {
        if body["metadata"]["name"].as_str().is_some_and(|n| n != name) {
            return Err(StatusError::bad_request(
                "the name of the object does not match the name on the URL",
            ));
        }
        self.modify(resource, ns, name, status_only, |_| Ok(body))
    }

    /// PATCH: patches the object (or, `status_only`, its status).
    pub fn patch(
        &self,
        resource: usize,
        ns: &str,
        name: &str,
        status_only: bool,
        kind: PatchKind,
        body: &[u8],
    ) -> Result<Value, StatusError> {
        let r = &RESOURCES[resource];
        let bad = |e: &dyn std::fmt::Display| {
            StatusError::bad_request(format!("the patch could not be decoded: {e}"))
        };
        if kind == PatchKind::Strategic && !r.group.is_empty() {
            return Err(StatusError::new(
                Reason::UnsupportedMediaType,
                "strategic merge patch is not supported for custom resources",
            ));
        }
        self.modify(resource, ns, name, status_only, |current| {
            let mut v = current.clone();
            match kind {
                PatchKind::Merge | PatchKind::Strategic => {
                    let p: Value = serde_json::from_slice(body).map_err(|e| bad(&e))?;
                    json_patch::merge(&mut v, &p);
                }
                PatchKind::Json => {
                    let p: json_patch::Patch = serde_json::from_slice(body).map_err(|e| bad(&e))?;
                    json_patch::patch(&mut v, &p)
                        .map_err(|e| StatusError::invalid(format!("the JSON patch failed: {e}")))?;
                }
            }
            Ok(v)
        })
    }

    /// DELETE.
    pub fn delete(&self, resource: usize, ns: &str, name: &str) -> Result<Value, StatusError> {
        let mut g = self.lock();
        let (key, current) = Inner::existing(&g, resource, ns, name)?;
        Ok(Self::commit(&mut g, self, key, "DELETED", current))
    }

    /// What a watch from `from` starts with: the frames after it still in the history and a
    /// receiver of every later one; `from == None` starts with every object as `ADDED`. 410
    /// Expired when `from` is older than the history.
    pub fn watch_from(
        &self,
        resource: usize,
        from: Option<u64>,
    ) -> Result<WatchStart, StatusError> {
        let g = self.lock();
        let rx = self.frames.subscribe();
        let frames = match from {
            None => g
                .objects
                .iter()
                .filter(|((r, _, _), _)| *r == resource)
                .map(|((r, ns, _), v)| {
                    Arc::new(Frame {
                        rv: g.rv,
                        resource: *r,
                        namespace: ns.clone(),
                        type_: "ADDED",
                        object: v.clone(),
                    })
                })
                .collect(),
            Some(rv) if rv < g.compacted => {
                return Err(StatusError::expired(&rv.to_string()));
            }
            Some(rv) => g
                .history
                .iter()
                .filter(|f| f.rv > rv && f.resource == resource)
                .cloned()
                .collect(),
        };
        Ok(WatchStart {
            frames,
            rx,
            rv: g.rv,
        })
    }
}
