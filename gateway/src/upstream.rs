//! The link's one connection to its remote API server: one kube-rs watcher per resource, their
//! events turned into [`Change`]s for the churn engine.
//!
//! The watch layout keeps a flood away from consumers and out of memory:
//! - Services, EndpointSlices and Endpoints are watched with the link's label selector. The
//!   EndpointSlice and Endpoints controllers copy a service's labels onto its slices and its
//!   Endpoints, so objects of services the link does not select never arrive at all.
//! - Pods cannot be selected that way (a service's pods carry the service's *selector*, not its
//!   labels, and selector-less services exist), so pods are watched cluster-wide and the engine
//!   keeps only those a stored endpoint points at: a pod behind no selected service costs its
//!   decoding and one hash lookup.
//! - ReplicaSets are watched as metadata only (what Linkerd's destination reads of them).
//! - Linkerd `Server`s are watched only when the remote serves `policy.linkerd.io/v1beta3`.
//!
//! Each watcher reconnects with kube-rs's default backoff (exponential, with jitter) and relists
//! on 410 with the `Init`/`InitDone` markers the engine uses to publish only real differences.
//! Every message carries the generation of the upstream run that produced it, so events still
//! in flight from a stopped run are dropped.
//!
//! Faults kube-rs alone does not recover from are turned into relists here (see
//! [`needs_relist`]): a watch frame that cannot be decoded (kube-rs skips it, and the change it
//! carried would be lost), and a resume the remote refuses at the HTTP level (504
//! `ResourceVersionTooLarge` after an etcd restore took the remote's versions backwards, or an
//! HTTP 410; kube-rs retries those with the same version forever). Watches ask the remote to end
//! them after [`WATCH_TIMEOUT_SECS`], so one that hangs is given up within that and a margin.
//! Pods, the one kind watched cluster-wide, arrive as their JSON ([`wire`]) and are decoded one
//! by one as they are sent on, so a list page of them costs about its own size however many
//! pods it holds (the other kinds are selected, or metadata only, and decode straight into
//! typed objects, which costs less CPU). An object whose JSON exceeds [`MAX_OBJECT_BYTES`], or
//! (a pod) does not decode as its kind, is refused with a log line and counted; the rest of
//! its list or stream goes on.

mod admit;
pub mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

pub use self::admit::{Refused, encoded_len};
use self::admit::{refuse, typed, wired};
use self::wire::Wire;
use crate::churn::Change;
use crate::model::{Kind, NsName, ObjKey, Object, Server};

/// One message from upstream.
#[derive(Debug)]
pub struct Message {
    /// The upstream run that produced it.
    pub generation: u64,
    /// What happened.
    pub change: Change,
}

/// Counters of one link's upstream, shared with metrics and status.
#[derive(Debug, Default)]
pub struct UpstreamCounters {
    /// Watcher errors (each followed by a backoff and a retry).
    pub errors: AtomicU64,
    /// Relists (initial lists included).
    pub relists: AtomicU64,
    /// JSON that could not be decoded: watcher errors (a frame or a list body), and objects
    /// refused because their JSON, valid in itself, is not of their kind's shape.
    pub decode_errors: AtomicU64,
    /// Objects applied or deleted, per kind in [`Kind::ALL`]'s order (initial lists included).
    pub events: [AtomicU64; Kind::ALL.len()],
    /// Objects refused for being over [`MAX_OBJECT_BYTES`].
    pub oversized: AtomicU64,
    /// Relists Floodgate forced because kube-rs could not recover by itself ([`needs_relist`]).
    pub forced_relists: AtomicU64,
}

impl UpstreamCounters {
    /// Objects applied or deleted of `kind` so far.
    pub fn events_of(&self, kind: Kind) -> u64 {
        kind_index(kind).map_or(0, |i| self.events[i].load(Ordering::Relaxed))
    }
}

fn kind_index(kind: Kind) -> Option<usize> {
    Kind::ALL.iter().position(|k| *k == kind)
}

/// True when a watcher failed on a body it could not decode.
fn is_decode_error(e: &watcher::Error) -> bool {
    matches!(
        e,
        watcher::Error::InitialListFailed(kube::Error::SerdeError(_))
            | watcher::Error::WatchStartFailed(kube::Error::SerdeError(_))
            | watcher::Error::WatchFailed(kube::Error::SerdeError(_))
    ) || is_undecodable_frame(e)
}

/// True for a watch frame that was JSON but no watch event: kube-rs then tries to read the line
/// as a `Status`, which any JSON object is (every field has a default), and reports an API
/// error without a code.
fn is_undecodable_frame(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchFailed(kube::Error::Api(s)) if s.code == 0)
}

/// The largest upstream object, as JSON, that Floodgate accepts. etcd refuses requests over
/// 1.5 MiB by default, so a real API server never serves a larger object; one that does is
/// broken or hostile. A refused object is logged and counted; a version of it served before
/// stays served until the next relist of its kind, which drops it.
pub const MAX_OBJECT_BYTES: usize = 2 * 1024 * 1024;

/// Upstream watches ask the remote to end them after this long (the watcher then resumes from
/// its version, which costs the remote no relist). kube-rs gives up on a watch that stays
/// silent for this long plus 5 s, so a remote that hangs mid-stream is noticed within about a
/// minute. (The API server itself picks 5 to 10 minutes for client-go.)
pub const WATCH_TIMEOUT_SECS: u32 = 60;

/// How long a response from the remote may send nothing before it is given up: longer than a
/// watch stays silent on a healthy remote (it ends at [`WATCH_TIMEOUT_SECS`]), so it only cuts
/// a list or a GET that stalled mid-body. Set by [`client`].
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(75);

/// The client of a link's remote, from its kubeconfig's `cfg`, with the two settings every
/// link needs, whichever mode built `cfg`:
/// - [`READ_TIMEOUT`], so a list or GET that stalls mid-body is given up;
/// - no retries inside the client. kube-rs retries 429, 503 and 504 up to 15 times by default,
///   with waits that grow to minutes; the watchers have their own backoff, and a 504 on a
///   resume is a remote whose versions went backwards, which must reach [`needs_relist`] at
///   once instead of being retried with the same version.
pub fn client(mut cfg: kube::Config) -> kube::Result<Client> {
    cfg.read_timeout = Some(READ_TIMEOUT);
    cfg.reset_reader_on_write = true;
    cfg.default_retry = false;
    Client::try_from(cfg)
}

/// The first and the longest wait before a relist Floodgate forces ([`needs_relist`]), so a
/// remote that keeps sending broken frames costs it a list every 30 s at most.
const FORCED_RELIST_BACKOFF: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(30),
);

/// True when a watcher error leaves kube-rs unable to recover by itself, so the watcher must
/// start over from a fresh list:
/// - a watch frame that could not be decoded (not JSON, or JSON but no watch event): kube-rs
///   skips it and reads on, so the change it carried would be lost until the object changes
///   again;
/// - a resume the remote refused at the HTTP level with 504 (`ResourceVersionTooLarge`: its
///   versions went backwards, as after an etcd restore) or 410: kube-rs retries the same
///   version forever, and only relists on an in-stream 410.
pub fn needs_relist(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchFailed(kube::Error::SerdeError(_)) => true,
        e if is_undecodable_frame(e) => true,
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 504 || s.code == 410,
        _ => false,
    }
}

/// How to reach the remote and what to watch.
#[derive(Clone)]
pub struct Remote {
    /// The client for the remote API server.
    pub client: Client,
    /// The link's service selector, in query-string form.
    pub selector: String,
    /// Whether the remote serves Linkerd's policy API (and so `Server`s).
    pub has_servers: bool,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("selector", &self.selector)
            .field("has_servers", &self.has_servers)
            .finish_non_exhaustive()
    }
}

impl Remote {
    /// Connects: asks the remote whether it serves Linkerd's policy API.
    pub async fn discover(client: Client, selector: &LabelSelector) -> Result<Self, kube::Error> {
        let has_servers = match client
            .list_api_group_resources("policy.linkerd.io/v1beta3")
            .await
        {
            Ok(list) => list.resources.iter().any(|r| r.name == "servers"),
            Err(kube::Error::Api(s)) if s.code == 404 => false,
            Err(e) => return Err(e),
        };
        Ok(Self {
            client,
            selector: selector_string(selector),
            has_servers,
        })
    }

    /// The kinds this remote's link follows.
    pub fn kinds(&self) -> Vec<Kind> {
        let mut k = vec![
            Kind::Service,
            Kind::EndpointSlice,
            Kind::Endpoints,
            Kind::Pod,
            Kind::ReplicaSet,
        ];
        if self.has_servers {
            k.push(Kind::Server);
        }
        k
    }
}

/// A structured selector in query-string form (`k in (a,b),x=y`).
pub fn selector_string(sel: &LabelSelector) -> String {
    match kube::core::Selector::try_from(sel.clone()) {
        Ok(s) => s.to_string(),
        // Validation refused bad operators before a link starts; select nothing rather than all.
        Err(_) => "floodgate.dev/invalid-selector".to_owned(),
    }
}

/// A running upstream: its watcher tasks. Dropping it stops them.
#[derive(Debug)]
pub struct Upstream {
    /// Held for their lifetime: dropping the set aborts every watcher.
    _tasks: JoinSet<()>,
}

/// The watchers whose first list opens the pod watcher.
const ENDPOINT_KINDS: u32 = 2;

/// Start-up order between watchers. Pods are listed after the EndpointSlices and Endpoints
/// that point at them, so the engine, which keeps only pods something points at, keeps them
/// from the first sync on (and does not have to fetch them one by one).
#[derive(Clone)]
enum Gate {
    /// Starts at once.
    Open,
    /// Starts at once; its first complete list adds one permit.
    Opens(Arc<tokio::sync::Semaphore>),
    /// Waits for both endpoint watchers' first lists (one watcher only: it takes the permits).
    After(Arc<tokio::sync::Semaphore>),
}

/// Starts one watcher per kind, sending into `tx` with `generation`.
pub fn start(
    remote: &Remote,
    generation: u64,
    tx: mpsc::Sender<Message>,
    counters: Arc<UpstreamCounters>,
) -> Upstream {
    let mut tasks = JoinSet::new();
    let c = &remote.client;
    let all = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
    let labelled = all.clone().labels(&remote.selector);
    let lists = Arc::new(tokio::sync::Semaphore::new(0));
    spawn(
        &mut tasks,
        Kind::Service,
        {
            let (c, w) = (c.clone(), labelled.clone());
            move || watcher::watcher(Api::<Service>::all(c.clone()), w.clone())
        },
        |s| typed(s, |s| Object::Service(Arc::new(s))),
        generation,
        &tx,
        &counters,
        Gate::Open,
    );
    spawn(
        &mut tasks,
        Kind::EndpointSlice,
        {
            let (c, w) = (c.clone(), labelled.clone());
            move || watcher::watcher(Api::<EndpointSlice>::all(c.clone()), w.clone())
        },
        |s| typed(s, |s| Object::EndpointSlice(Arc::new(s))),
        generation,
        &tx,
        &counters,
        Gate::Opens(lists.clone()),
    );
    spawn(
        &mut tasks,
        Kind::Endpoints,
        {
            let c = c.clone();
            move || watcher::watcher(Api::<Endpoints>::all(c.clone()), labelled.clone())
        },
        |s| typed(s, |s| Object::Endpoints(Arc::new(s))),
        generation,
        &tx,
        &counters,
        Gate::Opens(lists.clone()),
    );
    spawn(
        &mut tasks,
        Kind::Pod,
        {
            let (c, w) = (c.clone(), all.clone());
            move || watcher::watcher(Api::<Wire<Pod>>::all(c.clone()), w.clone())
        },
        |p| wired(p, |p| Object::Pod(Arc::new(p))),
        generation,
        &tx,
        &counters,
        Gate::After(lists.clone()),
    );
    spawn(
        &mut tasks,
        Kind::ReplicaSet,
        {
            let (c, w) = (c.clone(), all.clone());
            move || {
                watcher::watcher(
                    Api::<PartialObjectMeta<ReplicaSet>>::all(c.clone()),
                    w.clone(),
                )
            }
        },
        |m| typed(m, |m| Object::ReplicaSet(Arc::new(m.metadata))),
        generation,
        &tx,
        &counters,
        Gate::Open,
    );
    if remote.has_servers {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("policy.linkerd.io", "v1beta3", "Server"),
            "servers",
        );
        spawn(
            &mut tasks,
            Kind::Server,
            {
                let c = c.clone();
                move || {
                    watcher::watcher(Api::<DynamicObject>::all_with(c.clone(), &ar), all.clone())
                }
            },
            |d| {
                typed(d, |d| {
                    let spec = d.data.get("spec").cloned().unwrap_or_default();
                    Object::Server(Arc::new(Server {
                        metadata: d.metadata,
                        spec,
                    }))
                })
            },
            generation,
            &tx,
            &counters,
            Gate::Open,
        );
    }
    Upstream { _tasks: tasks }
}

#[allow(clippy::too_many_arguments)]
fn spawn<W, S, F>(
    tasks: &mut JoinSet<()>,
    kind: Kind,
    make: F,
    admit: fn(W) -> Result<Object, Refused>,
    generation: u64,
    tx: &mpsc::Sender<Message>,
    counters: &Arc<UpstreamCounters>,
    gate: Gate,
) where
    W: kube::Resource + Send + 'static,
    S: Stream<Item = watcher::Result<Event<W>>> + Send + 'static,
    F: Fn() -> S + Send + 'static,
{
    let tx = tx.clone();
    let counters = counters.clone();
    let index = kind_index(kind);
    // In the link's span (the caller's), so every line a watcher logs names its link.
    let span = tracing::Span::current();
    tasks.spawn(tracing::Instrument::instrument(async move {
        if let Gate::After(g) = &gate {
            // Closed only when the upstream is dropped, and then this task is aborted too.
            if let Ok(p) = g.acquire_many(ENDPOINT_KINDS).await {
                p.forget();
            }
        }
        let mut opened = false;
        let mut relist_in = FORCED_RELIST_BACKOFF.0;
        let mut stream = Box::pin(make().default_backoff());
        while let Some(item) = stream.next().await {
            let change = match item {
                Ok(Event::Init) => {
                    counters.relists.fetch_add(1, Ordering::Relaxed);
                    Change::InitStart(kind)
                }
                // managedFields and the upstream resourceVersion are dropped by the engine on arrival.
                Ok(Event::InitApply(w) | Event::Apply(w)) => match admit(w) {
                    Ok(o) => Change::Apply(o),
                    Err(why) => {
                        refuse(kind, why, &counters);
                        continue;
                    }
                },
                Ok(Event::InitDone) => {
                    relist_in = FORCED_RELIST_BACKOFF.0;
                    if let (Gate::Opens(g), false) = (&gate, opened) {
                        opened = true;
                        g.add_permits(1);
                    }
                    Change::InitDone(kind)
                }
                Ok(Event::Delete(o)) => {
                    let meta = o.meta();
                    Change::Delete(ObjKey { kind, id: NsName::of(meta) })
                }
                Err(e) => {
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                    if is_decode_error(&e) {
                        counters.decode_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    if needs_relist(&e) {
                        counters.forced_relists.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(kind = kind.name(), error = %e, relist_in = ?relist_in, "upstream watch cannot resume; relisting");
                        tokio::time::sleep(relist_in).await;
                        relist_in = (relist_in * 2).min(FORCED_RELIST_BACKOFF.1);
                        stream = Box::pin(make().default_backoff());
                    } else {
                        tracing::warn!(kind = kind.name(), error = %e, "upstream watch failed; retrying with backoff");
                    }
                    continue;
                }
            };
            if let (Change::Apply(_) | Change::Delete(_), Some(i)) = (&change, index) {
                counters.events[i].fetch_add(1, Ordering::Relaxed);
            }
            if tx.send(Message { generation, change }).await.is_err() {
                return; // The link is gone.
            }
        }
    }, span));
}

/// Pod GETs in flight at once for one link: enough to fill a start-up's gaps in a few round
/// trips, few enough that the remote never sees a burst from us.
const FETCH_CONCURRENCY: usize = 8;

/// Fetches pods the engine asked for ([`crate::churn::Effect::FetchPods`]) and sends each one
/// found as [`Change::Fetched`]. A pod that is gone is skipped: its absence is the answer.
pub async fn fetch_pods(
    client: Client,
    pods: Vec<NsName>,
    generation: u64,
    tx: mpsc::Sender<Message>,
    counters: Arc<UpstreamCounters>,
) {
    let mut results = futures_util::stream::iter(pods)
        .map(|id| {
            let api = Api::<Wire<Pod>>::namespaced(client.clone(), &id.namespace);
            async move { (api.get_opt(&id.name).await, id) }
        })
        .buffer_unordered(FETCH_CONCURRENCY);
    while let Some((result, id)) = results.next().await {
        let change = match result {
            // Admitted as the pod watcher admits pods.
            Ok(Some(w)) => match wired(w, |p| Object::Pod(Arc::new(p))) {
                Ok(pod) => Change::Fetched(pod),
                Err(why) => {
                    refuse(Kind::Pod, why, &counters);
                    continue;
                }
            },
            Ok(None) => continue,
            Err(e) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(pod = %id, error = %e, "fetching a pod failed; it is served from its next event");
                continue;
            }
        };
        if tx.send(Message { generation, change }).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
