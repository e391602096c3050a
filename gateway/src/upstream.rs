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
//! Each watcher takes its first list as a streaming list where the remote serves them, and in
//! pages where it refuses ([`strategy`]). It reconnects with [`WATCH_BACKOFF`] (exponential,
//! with jitter, a short ceiling: consumers wait while a link reconnects), reports failures to
//! reach the remote to [`health`] (the link says `Degraded` from them), and relists
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
mod body;
pub mod config;
mod fault;
mod fetch;
pub mod health;
mod skipped;
pub mod strategy;
pub mod trim;
mod watch;
pub mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Client;
use kube::client::ConfigExt as _;
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tower::ServiceBuilder;
use tower_http::trace::{DefaultOnFailure, TraceLayer};
use tracing::Level;

pub use self::admit::{Refused, encoded_len};
pub use self::fault::{is_expired, needs_relist};
pub use self::fetch::fetch_pods;
use self::health::Health;
use self::strategy::ListStrategy;
use self::watch::{Gate, Watch};
use crate::churn::Change;
use crate::model::Kind;
use crate::model::wanted::WantedPods;

/// One message from upstream.
#[derive(Debug)]
pub struct Message {
    /// The upstream run that produced it.
    pub generation: u64,
    /// What happened.
    pub change: Change,
    /// When the watcher read it off the remote's stream: the engine measures the remote's
    /// event rates by it, not by when it got to the message (a busy engine takes a second's
    /// events late, and a detector on its own clock saw a steady flood as gaps and bursts).
    pub at: tokio::time::Instant,
}

impl Message {
    /// Sends `change` of upstream run `generation`, read `at`, into `tx`; false when the link
    /// is gone.
    async fn send(
        tx: &mpsc::Sender<Message>,
        generation: u64,
        change: Change,
        at: tokio::time::Instant,
    ) -> bool {
        let msg = Message {
            generation,
            change,
            at,
        };
        tx.send(msg).await.is_ok()
    }
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
    /// Requests and watches the remote refused our credentials for (401, 403:
    /// [`fault::refusal`]).
    pub refusals: AtomicU64,
    /// How each watcher lists, per kind in [`Kind::ALL`]'s order ([`UpstreamCounters::strategy_of`]).
    pub list_strategy: [AtomicU8; Kind::ALL.len()],
    /// Whether the remote answers, as the watchers see it.
    pub health: Health,
    /// Pod events not decoded because no one wants the pod ([`wanted`]).
    pub pods_skipped: AtomicU64,
    /// Resource watchers running against the remote now (one per resource while this process
    /// reads the remote; none while it follows a Lease holder, is quarantined or stopped).
    pub watchers: AtomicU64,
    /// On a replica that follows the Lease holder: snapshots of the holder's view taken (the
    /// first, and one after each change that did not follow), and changes followed one by
    /// one since.
    pub followed_snapshots: AtomicU64,
    /// See [`UpstreamCounters::followed_snapshots`].
    pub followed_changes: AtomicU64,
    /// Notified when the watchers or the follower count something ([`Self::touch`]), so that
    /// the link's task, which sleeps while the link is idle, publishes its state again.
    pub touched: tokio::sync::Notify,
}

impl UpstreamCounters {
    /// Says that something was counted (or is about to be): the link publishes its state
    /// again within [`crate::link`]'s state refresh (a second).
    pub fn touch(&self) {
        self.touched.notify_one();
    }

    /// Objects applied or deleted of `kind` so far.
    pub fn events_of(&self, kind: Kind) -> u64 {
        self.events[kind.index()].load(Ordering::Relaxed)
    }

    /// How the watcher of `kind` lists.
    pub fn strategy_of(&self, kind: Kind) -> ListStrategy {
        ListStrategy::load(&self.list_strategy[kind.index()])
    }
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

/// The most a connection to the remote holds to read into ([`client`]). hyper lets a
/// connection's read buffer grow to about 400 KB while it reads a large body, and keeps it for
/// as long as the connection lives: a watch that began with a streaming list of 1,000 slices
/// held it from then on, 0.73 MB a link over its watches (heaptrack of 20 links). Bodies go
/// through it in reads of at most this much. A response head must fit in it whole (hyper
/// refuses a larger one as an error of the request): an API server's heads are a few hundred
/// bytes.
pub const READ_BUFFER_MAX: usize = 32 * 1024;

/// The client of a link's remote, from its kubeconfig's `cfg`, with what every link needs,
/// whichever mode built `cfg`:
/// - list and GET bodies read into one buffer as they arrive ([`body::Contiguous`]);
/// - [`READ_TIMEOUT`], so a list or GET that stalls mid-body is given up;
/// - no retries inside the client. kube-rs retries 429, 503 and 504 up to 15 times by default,
///   with waits that grow to minutes; the watchers have their own backoff, and a 504 on a
///   resume is a remote whose versions went backwards, which must reach [`needs_relist`] at
///   once instead of being retried with the same version;
/// - each connection's read buffer bounded by [`READ_BUFFER_MAX`].
///
/// kube-rs's `ClientBuilder` cannot set the last, so the stack is built here from the same
/// parts `ClientBuilder::try_from` uses (kube's `ConfigExt`: TLS from the kubeconfig, the base
/// URI, the credentials with their refresh, extra headers; hyper-timeout's connector for the
/// timeouts), without its retry layer (off, as above); its per-request spans are tower-http's.
pub fn client(mut cfg: kube::Config) -> kube::Result<Client> {
    cfg.read_timeout = Some(READ_TIMEOUT);
    cfg.reset_reader_on_write = true;
    let mut http = HttpConnector::new();
    // The kubeconfig's scheme decides: the TLS connector below takes `https` URIs.
    http.enforce_http(false);
    let mut connector =
        hyper_timeout::TimeoutConnector::new(cfg.rustls_https_connector_with_connector(http)?);
    connector.set_connect_timeout(cfg.connect_timeout);
    connector.set_read_timeout(cfg.read_timeout);
    connector.set_write_timeout(cfg.write_timeout);
    connector.set_reset_reader_on_write(cfg.reset_reader_on_write);
    let http = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .http1_max_buf_size(READ_BUFFER_MAX)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(body::ContiguousLayer)
        .layer(cfg.base_uri_layer())
        .option_layer(cfg.auth_layer()?)
        .layer(cfg.extra_headers_layer()?)
        // A span per request, all at DEBUG (`FLOODGATE_LOG=info,tower_http=debug`): a remote
        // that is down fails every request, and the link logs an outage itself.
        .layer(TraceLayer::new_for_http().on_failure(DefaultOnFailure::new().level(Level::DEBUG)))
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(Client::new(service, cfg.default_namespace))
}

/// The watchers' reconnect backoff: the first wait, the longest, and how long without an error
/// resets it. Jitter adds up to as much again to each wait, so the link's watchers do not
/// reconnect in step. The ceiling is short because consumers wait on a link that reconnects:
/// with kube-rs's default (30 s, as client-go's), the first change after a 70 s outage reached
/// consumers 29.5 s after the remote was back; with 3 s it is there within about 6 s.
pub const WATCH_BACKOFF: (
    std::time::Duration,
    std::time::Duration,
    std::time::Duration,
) = (
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(3),
    std::time::Duration::from_secs(60),
);

/// How to reach the remote and what to watch.
#[derive(Clone)]
pub struct Remote {
    /// The client for the remote API server.
    pub client: Client,
    /// The link's service selector, in query-string form.
    pub selector: String,
    /// Whether the remote serves Linkerd's policy API (and so `Server`s).
    pub has_servers: bool,
    /// The remote's Linkerd namespace (the Link's `targetClusterLinkerdNamespace`), where
    /// `linkerd-config` is read.
    pub linkerd_namespace: String,
    /// Whether the credentials may list `linkerd-config` there ([`config::readable`]).
    pub has_config: bool,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("selector", &self.selector)
            .field("has_servers", &self.has_servers)
            .field("linkerd_namespace", &self.linkerd_namespace)
            .field("has_config", &self.has_config)
            .finish_non_exhaustive()
    }
}

impl Remote {
    /// Connects: asks the remote whether it serves Linkerd's policy API, and whether its
    /// `linkerd-config` in `linkerd_namespace` may be read.
    pub async fn discover(
        client: Client,
        selector: &LabelSelector,
        linkerd_namespace: &str,
    ) -> Result<Self, kube::Error> {
        let has_servers = match client
            .list_api_group_resources("policy.linkerd.io/v1beta3")
            .await
        {
            Ok(list) => list.resources.iter().any(|r| r.name == "servers"),
            Err(kube::Error::Api(s)) if s.code == 404 => false,
            Err(e) => return Err(e),
        };
        let has_config = config::readable(&client, linkerd_namespace).await?;
        Ok(Self {
            client,
            selector: selector_string(selector),
            has_servers,
            linkerd_namespace: linkerd_namespace.to_owned(),
            has_config,
        })
    }

    /// The kinds this remote's link follows.
    pub fn kinds(&self) -> Vec<Kind> {
        // Every kind named: a new kind says here whether this remote serves it.
        let served = |k: &Kind| match k {
            Kind::Service | Kind::EndpointSlice | Kind::Endpoints | Kind::Pod => true,
            Kind::ReplicaSet => true,
            Kind::Server => self.has_servers,
            Kind::ConfigMap => self.has_config,
        };
        Kind::ALL.into_iter().filter(served).collect()
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
    /// Opens the pod watcher ([`Upstream::listed`]).
    pods_gate: Arc<tokio::sync::Semaphore>,
    /// The kinds whose first list the engine has taken in.
    listed: std::sync::Mutex<Vec<Kind>>,
}

impl Upstream {
    /// The engine has taken in `kind`'s first list (and so knows which pods the selections
    /// want, `WantedPods` being filled before this returns): once Services, EndpointSlices
    /// and Endpoints are in, the pod watcher starts. The engine, not the watchers, opens it:
    /// a watcher's list end may wait in the queue while the pod list streams past. True when
    /// this call opened it: every pod wanted now is in the set its first list decodes.
    pub fn listed(&self, kind: Kind) -> bool {
        if !OPENING_KINDS.contains(&kind) {
            return false;
        }
        let mut listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        if listed.contains(&kind) {
            return false;
        }
        listed.push(kind);
        self.pods_gate.add_permits(1);
        listed.len() == OPENING_KINDS.len()
    }
}

/// The kinds whose first list opens the pod watcher: Services (a slice's service must be
/// known to be selected), EndpointSlices and Endpoints.
const OPENING_KINDS: [Kind; 3] = [Kind::Service, Kind::EndpointSlice, Kind::Endpoints];

/// Starts one watcher per kind, sending into `tx` with `generation`; the pod watcher decodes
/// only the pods in `wanted`.
pub fn start(
    remote: &Remote,
    generation: u64,
    tx: mpsc::Sender<Message>,
    counters: Arc<UpstreamCounters>,
    wanted: WantedPods,
) -> Upstream {
    let mut tasks = JoinSet::new();
    let all = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
    let labelled = all.clone().labels(&remote.selector);
    let pods_gate = Arc::new(tokio::sync::Semaphore::new(0));
    let w = Watch {
        client: &remote.client,
        generation,
        tx: &tx,
        counters: &counters,
    };
    w.selected(&mut tasks, &labelled);
    w.pods(
        &mut tasks,
        all.clone(),
        Gate::After(pods_gate.clone()),
        wanted,
    );
    w.replica_sets(&mut tasks, all.clone());
    if remote.has_config {
        w.linkerd_config(&mut tasks, all.clone(), &remote.linkerd_namespace);
    }
    if remote.has_servers {
        w.servers(&mut tasks, all);
    }
    tasks.spawn(tracing::Instrument::in_current_span(health::probe(
        remote.client.clone(),
        remote.selector.clone(),
        counters.clone(),
    )));
    Upstream {
        _tasks: tasks,
        pods_gate,
        listed: std::sync::Mutex::new(Vec::new()),
    }
}

#[cfg(test)]
mod tests;
