//! The watchers of one upstream run: one per kind, each with the API it reads and how its
//! objects are admitted ([`Watch`]), started in order ([`Gate`]), and the loop of one watcher
//! ([`Watcher`]): its events become [`Message`]s; its errors switch it to paged lists where the
//! remote refuses streaming ones, force a relist where kube-rs cannot recover
//! ([`needs_relist`]), or are left to kube-rs's backoff.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::utils::{ResetTimerBackoff, StreamBackoff};
use kube::runtime::watcher::{self, Event, ExponentialBackoff, ListSemantic};
use kube::{Api, Client};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::admit::{Refused, refuse, typed, wired};
use super::fault::{
    FORCED_RELIST_BACKOFF, is_decode_error, is_expired, is_transport, needs_relist, refused,
    watch_refusal,
};
use super::skipped::SkippedEvents;
use super::strategy::{ListStrategy, refuses_streaming};
use super::wire::{self, Wire};
use super::{Message, OPENING_KINDS, UpstreamCounters, WATCH_BACKOFF, trim};
use crate::churn::Change;
use crate::model::wanted::WantedPods;
use crate::model::{Kind, NsName, ObjKey, Object, Server};

/// Start-up order between watchers. Pods are listed after the Services, EndpointSlices and
/// Endpoints that point at them, so the engine, which keeps only pods something points at, keeps them
/// from the first sync on (and does not have to fetch them one by one).
#[derive(Clone)]
pub(super) enum Gate {
    /// Starts at once.
    Open,
    /// Waits for the first lists of the watchers that open it (one watcher only: it takes the
    /// permits).
    After(Arc<Semaphore>),
}

impl Gate {
    /// Returns once the watcher behind this gate may start.
    async fn wait(&self) {
        if let Gate::After(g) = self {
            // Closed only when the upstream is dropped, and then this task is aborted too.
            if let Ok(p) = g.acquire_many(OPENING_KINDS.len() as u32).await {
                p.forget();
            }
        }
    }
}

/// A fresh [`WATCH_BACKOFF`].
fn watch_backoff() -> ResetTimerBackoff<ExponentialBackoff> {
    let (first, ceiling, reset) = WATCH_BACKOFF;
    let exp = backon::ExponentialBuilder::default()
        .with_min_delay(first)
        .with_max_delay(ceiling)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(exp.into(), reset)
}

/// Counts one watcher in [`UpstreamCounters::watchers`] from its spawn to its end (or its
/// abort: the task's future is dropped with it).
struct Running(Arc<UpstreamCounters>);

impl Running {
    fn start(counters: Arc<UpstreamCounters>) -> Self {
        counters.watchers.fetch_add(1, Ordering::Relaxed);
        counters.touch();
        Self(counters)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.watchers.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// What every watcher of one upstream run shares.
pub(super) struct Watch<'a> {
    /// The client of the remote.
    pub(super) client: &'a Client,
    /// The upstream run every message is sent with.
    pub(super) generation: u64,
    pub(super) tx: &'a mpsc::Sender<Message>,
    pub(super) counters: &'a Arc<UpstreamCounters>,
}

impl Watch<'_> {
    /// Spawns the watchers of what the link's selector selects (`labelled`): Services, and the
    /// EndpointSlices and Endpoints their controllers label as their service.
    pub(super) fn selected(&self, tasks: &mut JoinSet<()>, labelled: &watcher::Config) {
        self.spawn_open::<Service>(tasks, Kind::Service, labelled.clone(), |s| {
            typed(s, |s| Object::Service(Arc::new(s)))
        });
        self.spawn_open::<EndpointSlice>(tasks, Kind::EndpointSlice, labelled.clone(), |s| {
            typed(s, |s| Object::EndpointSlice(trim::slice(s).into()))
        });
        self.spawn_open::<Endpoints>(tasks, Kind::Endpoints, labelled.clone(), |s| {
            typed(s, |s| Object::Endpoints(Arc::new(trim::endpoints(s))))
        });
    }

    /// Spawns the pod watcher: cluster-wide (`all`), pods read as their JSON and only the
    /// `wanted` ones decoded, started once `gate` opens.
    pub(super) fn pods(
        &self,
        tasks: &mut JoinSet<()>,
        all: watcher::Config,
        gate: Gate,
        wanted: WantedPods,
    ) {
        let c = self.client.clone();
        self.spawn(
            tasks,
            Kind::Pod,
            all,
            move |w| watcher::watcher(Api::<Wire<Pod>>::all(c.clone()), w),
            |p| wired(p, |p| Object::Pod(Arc::new(trim::pod(p).into()))),
            gate,
            Some((wanted, Wire::owner)),
        );
    }

    /// Spawns the ReplicaSet watcher: cluster-wide (`all`), metadata only.
    pub(super) fn replica_sets(&self, tasks: &mut JoinSet<()>, all: watcher::Config) {
        self.spawn_open::<PartialObjectMeta<ReplicaSet>>(tasks, Kind::ReplicaSet, all, |m| {
            typed(m, |m| {
                Object::ReplicaSet(Arc::new(trim::replica_set(m.metadata)))
            })
        });
    }

    /// Spawns the watcher of Linkerd `Server`s (`policy.linkerd.io/v1beta3`), cluster-wide
    /// (`all`).
    pub(super) fn servers(&self, tasks: &mut JoinSet<()>, all: watcher::Config) {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("policy.linkerd.io", "v1beta3", "Server"),
            "servers",
        );
        let c = self.client.clone();
        self.spawn(
            tasks,
            Kind::Server,
            all,
            move |w| watcher::watcher(Api::<DynamicObject>::all_with(c.clone(), &ar), w),
            |d| {
                typed(d, |d| {
                    let spec = d.data.get("spec").cloned().unwrap_or_default();
                    Object::Server(Arc::new(Server {
                        metadata: d.metadata,
                        spec,
                    }))
                })
            },
            Gate::Open,
            None,
        );
    }

    /// Spawns the watcher of `kind`, a typed resource `K` read with `cfg` across every
    /// namespace, that starts at once and decodes every object ([`Watch::spawn`]).
    fn spawn_open<K>(
        &self,
        tasks: &mut JoinSet<()>,
        kind: Kind,
        cfg: watcher::Config,
        admit: fn(K) -> Result<Object, Refused>,
    ) where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let c = self.client.clone();
        self.spawn(
            tasks,
            kind,
            cfg,
            move |w| watcher::watcher(Api::<K>::all(c.clone()), w),
            admit,
            Gate::Open,
            None,
        );
    }

    /// Spawns the watcher of `kind`: `make` builds its stream from a configuration (`base` with
    /// the list strategy in force), `admit` turns its objects into the engine's, `gate` orders
    /// its start, and `wanted` (pods) says which objects are worth decoding, and how to read a
    /// skipped one's ReplicaSet.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn spawn<W, S, F>(
        &self,
        tasks: &mut JoinSet<()>,
        kind: Kind,
        base: watcher::Config,
        make: F,
        admit: fn(W) -> Result<Object, Refused>,
        gate: Gate,
        wanted: Option<Skipping<W>>,
    ) where
        W: kube::Resource + Send + 'static,
        S: Stream<Item = watcher::Result<Event<W>>> + Send + 'static,
        F: Fn(watcher::Config) -> S + Send + Sync + 'static,
    {
        let watcher = Watcher {
            kind,
            base,
            make,
            admit,
            wanted: wanted.clone(),
            counters: self.counters.clone(),
            strategy: ListStrategy::Streaming,
            listed_once: false,
            relist_in: FORCED_RELIST_BACKOFF.0,
            skipped: SkippedEvents::default(),
        };
        let running = Running::start(self.counters.clone());
        let run = watcher.run(gate, self.generation, self.tx.clone());
        let run = async move {
            let _running = running;
            run.await;
        };
        // In the link's span (the caller's), so every line a watcher logs names its link.
        let span = tracing::Span::current();
        tasks.spawn(tracing::Instrument::instrument(
            wire::WANTED.scope(wanted.map(|(w, _)| w), run),
            span,
        ));
    }
}

/// What a pod watcher skips: the pods nobody wants, and how to read a pod's ReplicaSet
/// ([`Wire::owner`]).
type Skipping<W> = (WantedPods, fn(&W) -> Option<&str>);

/// A watcher's stream, as [`Watcher::open`] builds it: kube-rs's, with [`WATCH_BACKOFF`].
type Watching<S> = Pin<Box<StreamBackoff<S, ResetTimerBackoff<ExponentialBackoff>>>>;

/// The watcher of one kind: how it builds its stream and admits objects, and what it keeps
/// between events.
struct Watcher<W, F> {
    kind: Kind,
    /// The configuration its list strategy is applied to.
    base: watcher::Config,
    make: F,
    admit: fn(W) -> Result<Object, Refused>,
    /// Pods only: the ones worth decoding, and how to read a skipped one's ReplicaSet.
    wanted: Option<Skipping<W>>,
    counters: Arc<UpstreamCounters>,
    strategy: ListStrategy,
    /// A first list completed: an error from then on is no refusal of streaming lists.
    listed_once: bool,
    /// The wait before the next relist Floodgate forces ([`FORCED_RELIST_BACKOFF`]).
    relist_in: Duration,
    /// Pods only: watch events of skipped pods not sent on yet.
    skipped: SkippedEvents,
}

impl<W, F> Watcher<W, F>
where
    W: kube::Resource + Send + 'static,
{
    /// Watches until the link is gone (its receiver dropped), once `gate` opens, sending each
    /// change into `tx` with `generation`.
    async fn run<S>(mut self, gate: Gate, generation: u64, tx: mpsc::Sender<Message>)
    where
        S: Stream<Item = watcher::Result<Event<W>>> + Send + 'static,
        F: Fn(watcher::Config) -> S,
    {
        gate.wait().await;
        self.set_strategy(self.strategy);
        let mut stream = self.open();
        // One timer for the skipped events' sends, armed when a batch begins: a flood's
        // thousands of events a second do not each make one.
        let send_skipped = sleep_until(Instant::now());
        tokio::pin!(send_skipped);
        let mut armed = None;
        loop {
            let due = self.skipped.due();
            if let Some(at) = due
                && armed != due
            {
                send_skipped.as_mut().reset(at);
                armed = due;
            }
            let item = tokio::select! {
                item = stream.next() => item,
                () = &mut send_skipped, if due.is_some() => {
                    if !self.send_skipped(generation, &tx).await {
                        return;
                    }
                    continue;
                }
            };
            let Some(item) = item else { return };
            let at = Instant::now();
            // Whatever the item, it is counted: the link publishes its state again.
            self.counters.touch();
            let change = match item {
                Ok(event) => self.change(event, at),
                Err(e) => {
                    if let Some(restarted) = self.recover(e).await {
                        stream = restarted;
                    }
                    continue;
                }
            };
            let Some(change) = change else { continue };
            if let Change::Apply(_) | Change::Delete(_) = &change {
                self.counters.events[self.kind.index()].fetch_add(1, Ordering::Relaxed);
            }
            // The skipped events read before this change go first, as they came.
            if !self.send_skipped(generation, &tx).await
                || !Message::send(&tx, generation, change, at).await
            {
                return; // The link is gone.
            }
        }
    }

    /// Sends the skipped pod events counted so far, as of the first of them; false when the
    /// link is gone.
    async fn send_skipped(&mut self, generation: u64, tx: &mpsc::Sender<Message>) -> bool {
        let Some((at, counts)) = self.skipped.take() else {
            return true;
        };
        for (replicaset, events) in counts {
            let change = Change::Skipped { replicaset, events };
            if !Message::send(tx, generation, change, at).await {
                return false;
            }
        }
        true
    }

    /// Lists with `s` from now on: counted, and logged.
    fn set_strategy(&mut self, s: ListStrategy) {
        self.strategy = s;
        s.store(&self.counters.list_strategy[self.kind.index()]);
        tracing::info!(
            kind = self.kind.name(),
            strategy = s.name(),
            "upstream list strategy"
        );
    }

    /// A new stream, listing with the strategy in force.
    fn open<S>(&self) -> Watching<S>
    where
        S: Stream<Item = watcher::Result<Event<W>>> + Send + 'static,
        F: Fn(watcher::Config) -> S,
    {
        let cfg = match self.strategy {
            // Pages from the current state: a remote reads those from etcd in
            // pages, where a `resourceVersion=0` list comes whole from its cache.
            ListStrategy::Paged => self.base.clone().list_semantic(ListSemantic::MostRecent),
            _ => self.base.clone(),
        };
        Box::pin((self.make)(self.strategy.config(cfg)).backoff(watch_backoff()))
    }

    /// The change an event makes for the engine: none for a pod no one wants or an object
    /// refused (logged and counted).
    fn change(&mut self, event: Event<W>, at: Instant) -> Option<Change> {
        let kind = self.kind;
        let live = matches!(event, Event::Apply(_));
        match event {
            Event::Init => {
                self.counters.relists.fetch_add(1, Ordering::Relaxed);
                Some(Change::InitStart(kind))
            }
            // managedFields and the upstream resourceVersion are dropped by the engine.
            Event::InitApply(w) | Event::Apply(w) => {
                if let Some((wanted, owner_of)) = &self.wanted {
                    let m = w.meta();
                    let ns = m.namespace.as_deref().unwrap_or_default();
                    let name = m.name.as_deref().unwrap_or_default();
                    if !wanted.admits(ns, name, owner_of(&w)) {
                        self.counters.pods_skipped.fetch_add(1, Ordering::Relaxed);
                        // A list is state, a watch event churn: counted for its service.
                        if live && let Some(owner) = owner_of(&w) {
                            self.skipped.count(NsName::new(ns, owner), at);
                        }
                        return None;
                    }
                }
                match (self.admit)(w) {
                    Ok(o) => Some(Change::Apply(o)),
                    Err(why) => {
                        refuse(kind, why, &self.counters);
                        None
                    }
                }
            }
            Event::InitDone => {
                self.relist_in = FORCED_RELIST_BACKOFF.0;
                self.listed_once = true;
                Some(Change::InitDone(kind))
            }
            Event::Delete(o) => Some(Change::Delete(ObjKey {
                kind,
                id: NsName::of(o.meta()),
            })),
        }
    }

    /// Counts and logs an error, and recovers from it: a remote that refuses streaming lists
    /// is listed in pages, and a fault kube-rs cannot recover from ([`needs_relist`]) is
    /// relisted after [`FORCED_RELIST_BACKOFF`]; anything else is left to kube-rs, which
    /// retries with its backoff. Returns the stream to go on with when it starts over.
    async fn recover<S>(&mut self, e: watcher::Error) -> Option<Watching<S>>
    where
        S: Stream<Item = watcher::Result<Event<W>>> + Send + 'static,
        F: Fn(watcher::Config) -> S,
    {
        let (kind, counters) = (self.kind.name(), &self.counters);
        counters.errors.fetch_add(1, Ordering::Relaxed);
        if self.strategy == ListStrategy::Streaming && !self.listed_once && refuses_streaming(&e) {
            tracing::info!(kind, error = %e, "the remote refuses streaming lists; listing in pages");
            self.set_strategy(ListStrategy::Paged);
            return Some(self.open());
        }
        let decode = is_decode_error(&e);
        if decode {
            counters.decode_errors.fetch_add(1, Ordering::Relaxed);
        }
        if needs_relist(&e) {
            counters.forced_relists.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(kind, error = %e, relist_in = ?self.relist_in, "upstream watch cannot resume; relisting");
            tokio::time::sleep(self.relist_in).await;
            self.relist_in = (self.relist_in * 2).min(FORCED_RELIST_BACKOFF.1);
            return Some(self.open());
        }
        if is_expired(&e) {
            // The remote answered: kube-rs relists by itself.
            counters.forced_relists.fetch_add(1, Ordering::Relaxed);
            tracing::info!(kind, error = %e, "upstream watch expired; relisting");
        } else if decode {
            tracing::warn!(kind, error = %e, "upstream watch frame cannot be decoded; retrying with backoff");
        } else if let Some(s) = watch_refusal(&e) {
            // Named, so the operator knows to look at the credentials, not the network.
            counters.refusals.fetch_add(1, Ordering::Relaxed);
            counters
                .health
                .failed(refused(s, &format!("watching {kind}")));
            tracing::debug!(kind, error = %e, "upstream watch refused; retrying with backoff");
        } else if is_transport(&e) {
            // Maybe the remote, maybe this connection only: the probe asks at once.
            counters
                .health
                .suspect(kind, format_args!("watching {kind}: {e}"));
            tracing::debug!(kind, error = %e, "upstream watch broke; retrying with backoff");
        } else {
            // An outage is logged once by `health`, not once per retry.
            counters.health.failed(format_args!("watching {kind}: {e}"));
            tracing::debug!(kind, error = %e, "upstream watch failed; retrying with backoff");
        }
        None
    }
}
