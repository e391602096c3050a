//! The churn engine of one link: upstream changes in, budgeted publications out. Pure logic: it
//! is fed changes and `tokio::time::Instant`s and never touches the network or the wall clock.
//!
//! ```text
//! ingest(change, now) -> Store (upstream cache) --groups touched--> coalesce (quiet/max)
//!                           |                                            |
//!                     FloodDetector --trigger--> quarantine::Machine     v
//!                                                                 ready queue (round robin)
//! poll(now) --------------------------------------------------> link bucket, service bucket
//!                                                                        |
//!                                      cap (sticky subset) + diff ---> View (published)
//! ```
//!
//! The unit of coalescing, limiting and capping is a [`Group`]: a service with its slices,
//! Endpoints, pods and ReplicaSets, or the Servers of a namespace. A group's publication is
//! computed from the latest upstream state when its turn comes, so while it waits for tokens it
//! keeps coalescing and nothing final is lost. The first complete sync is published at once,
//! outside the budget: limits apply to changes, never to a consumer's first sync.
//!
//! The caller (the link task) calls [`Engine::ingest`] for every upstream change, then
//! [`Engine::poll`] and sleeps until the instant it returns; it carries out
//! [`Engine::take_effects`] (stop or restart upstream) and reports transitions.

pub mod cap;
pub mod flood;
pub mod limit;
mod publish;
pub mod quarantine;
pub mod restore;
mod schedule;
pub mod store;

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use floodgate_link_crd::{LinkSpec, Phase};
use serde::Serialize;
use tokio::time::Instant;

use self::cap::EndpointKey;
use self::flood::{FloodDetector, Trigger};
use self::limit::{Budget, FedClock, Limiter};
use self::quarantine::{Machine, RequestError, State, Transition};
use self::store::Store;
use crate::model::{Group, Kind, NsName, ObjKey, Object};
use crate::view::{DEFAULT_HISTORY_AGE, View};

/// One upstream change, as the watchers report it.
#[derive(Clone, Debug)]
pub enum Change {
    /// An object was created or updated (or listed during a relist).
    Apply(Object),
    /// An object was deleted.
    Delete(ObjKey),
    /// A relist of a kind begins: objects not listed before [`Change::InitDone`] are gone.
    InitStart(Kind),
    /// The relist of a kind is complete.
    InitDone(Kind),
    /// A pod fetched because the engine asked for it ([`Effect::FetchPods`]): state, not churn.
    /// Ignored when a watch event for the pod came first (that one is newer).
    Fetched(Object),
}

/// Something the caller must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Stop the upstream watches (quarantine); the engine has dropped its cache.
    StopUpstream,
    /// Start the upstream watches again, from a fresh list.
    StartUpstream,
    /// Fetch these pods and hand them back as [`Change::Fetched`]: kept endpoints point at
    /// them but their last event came before the endpoints did.
    FetchPods(Vec<NsName>),
    /// The quarantine state changed: log it, record an event, update status.
    Transition(Transition),
}

/// Running totals of one link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    /// Upstream changes received.
    pub upstream_events: u64,
    /// Changes that concerned a selected service.
    pub relevant_events: u64,
    /// Changes that concerned nothing the link serves.
    pub irrelevant_events: u64,
    /// Changes absorbed into a publication already pending.
    pub coalesced: u64,
    /// Publications made.
    pub downstream_updates: u64,
    /// Times a publication had to wait for a token.
    pub throttled: u64,
    /// Selected services published.
    pub services: u64,
    /// Services withheld by `caps.maxServices`.
    pub services_withheld: u64,
    /// Endpoints published, across services.
    pub endpoints_published: u64,
    /// Endpoints withheld by `caps.maxEndpointsPerService`.
    pub endpoints_truncated: u64,
    /// Pods asked for with [`Effect::FetchPods`].
    pub pods_fetched: u64,
}

/// Pod fetches outstanding at most. A fetch is asked only for a pod a *kept* endpoint points
/// at, so this is bounded by the cap anyway; 4096 keeps a start-up against thousands of
/// services from queueing more GETs than the remote should see at once.
const MAX_FETCHING: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Idle,
    Pending { first: Instant, last: Instant },
    Ready,
    Parked,
}

#[derive(Debug)]
struct GroupState {
    slot: Slot,
    bucket: Limiter<FedClock>,
    objects: BTreeSet<ObjKey>,
    endpoints: HashSet<EndpointKey>,
    truncated: usize,
}

impl GroupState {
    /// A group seen for the first time: idle, with a full bucket, nothing published.
    fn new(budget: &Budget<FedClock>) -> Self {
        Self {
            slot: Slot::Idle,
            bucket: budget.service_bucket(),
            objects: BTreeSet::new(),
            endpoints: HashSet::new(),
            truncated: 0,
        }
    }
}

/// The engine of one link.
#[derive(Debug)]
pub struct Engine {
    quiet: Duration,
    max_delay: Duration,
    max_endpoints: usize,
    max_services: u64,
    origin: Instant,
    clock: FedClock,
    budget: Budget<FedClock>,
    store: Store,
    view: View,
    flood: FloodDetector,
    machine: Machine,
    groups: HashMap<Group, GroupState>,
    due: BinaryHeap<Reverse<(Instant, Group)>>,
    ready: VecDeque<Group>,
    parked: BinaryHeap<Reverse<(Instant, Group)>>,
    link_wait: Option<Instant>,
    obj_refs: HashMap<ObjKey, u32>,
    kinds: Vec<Kind>,
    synced: HashSet<Kind>,
    relisting: HashMap<Kind, HashSet<NsName>>,
    /// Pods asked for and not seen since.
    fetching: HashSet<NsName>,
    /// The publication count at which a full `fetching` may be scanned again.
    fetch_prune_at: u64,
    synced_once: bool,
    /// False on a replica that does not hold the link's Lease: floods are measured, never
    /// acted on (the holder decides; this replica follows its record).
    deciding: bool,
    republish: bool,
    effects: Vec<Effect>,
    counters: Counters,
}

impl Engine {
    /// An engine for a validated spec, following `kinds` upstream, publishing into `view`.
    pub fn new(spec: &LinkSpec, kinds: &[Kind], view: View, now: Instant) -> Self {
        let clock = FedClock::default();
        Self {
            quiet: spec.coalesce.quiet.get(),
            max_delay: spec.coalesce.max.get(),
            max_endpoints: spec.caps.max_endpoints_per_service as usize,
            max_services: spec.caps.max_services.into(),
            origin: now,
            budget: Budget::new(
                &spec.rate_limit.per_link,
                &spec.rate_limit.per_service,
                clock.clone(),
            ),
            clock,
            store: Store::new(&spec.select.services),
            view,
            flood: FloodDetector::new(spec),
            machine: Machine::new(
                spec.quarantine.auto_release,
                spec.quarantine.when.sustained_for.get(),
            ),
            groups: HashMap::new(),
            due: BinaryHeap::new(),
            ready: VecDeque::new(),
            parked: BinaryHeap::new(),
            link_wait: None,
            obj_refs: HashMap::new(),
            kinds: kinds.to_vec(),
            synced: HashSet::new(),
            relisting: HashMap::new(),
            fetching: HashSet::new(),
            fetch_prune_at: 0,
            synced_once: false,
            deciding: true,
            republish: false,
            effects: Vec::new(),
            counters: Counters::default(),
        }
    }

    /// Sets the kinds followed upstream (known once the remote's discovery answered; a link
    /// restored from disk starts before that).
    pub fn set_kinds(&mut self, kinds: &[Kind]) {
        self.kinds = kinds.to_vec();
    }

    /// Whether this engine acts on the floods it measures (true unless another replica holds
    /// the link's Lease).
    pub fn set_deciding(&mut self, deciding: bool) {
        self.deciding = deciding;
    }

    /// The published view.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// Running totals.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Groups waiting to be published: coalescing, in line, or waiting for a token.
    pub fn pending(&self) -> usize {
        self.due.len() + self.ready.len() + self.parked.len()
    }

    /// Upstream objects held.
    pub fn objects_held(&self) -> usize {
        self.store.len()
    }

    /// Relevant upstream events in the last complete second.
    pub fn events_last_second(&self) -> u64 {
        self.flood.events_last_second()
    }

    /// The quarantine state.
    pub fn state(&self) -> &State {
        self.machine.state()
    }

    /// True once every kind has completed its first list and the view was published.
    pub fn synced_once(&self) -> bool {
        self.synced_once
    }

    /// Healthy, Throttled (publications wait for tokens) or Quarantined.
    pub fn phase(&self) -> Phase {
        if self.machine.is_frozen() {
            Phase::Quarantined
        } else if !self.ready.is_empty() || !self.parked.is_empty() {
            Phase::Throttled
        } else {
            Phase::Healthy
        }
    }

    /// What the caller must do, oldest first.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// Takes one upstream change.
    pub fn ingest(&mut self, change: Change, now: Instant) {
        self.counters.upstream_events += 1;
        if matches!(self.machine.state(), State::Quarantined(_)) {
            // Upstream is being stopped: what is still in flight is dropped with the cache.
            return;
        }
        match change {
            Change::InitStart(kind) => {
                self.relisting.insert(kind, HashSet::new());
            }
            Change::InitDone(kind) => {
                let seen = self.relisting.remove(&kind).unwrap_or_default();
                for id in self.store.keys(kind) {
                    if !seen.contains(&id) {
                        self.change(ObjKey { kind, id }, None, now, false);
                    }
                }
                self.synced.insert(kind);
            }
            Change::Fetched(obj) => {
                let obj = obj.into_sanitized();
                let key = obj.key();
                if self.fetching.remove(&key.id)
                    && self.store.wants_pod(&key.id)
                    && self.store.pod(&key.id).is_none()
                {
                    self.change(key, Some(obj), now, false);
                }
            }
            Change::Apply(obj) => {
                let obj = obj.into_sanitized();
                let key = obj.key();
                if key.kind == Kind::Pod {
                    self.fetching.remove(&key.id);
                }
                // A relist is state, not churn: it does not count towards the event rate.
                let listing = match self.relisting.get_mut(&key.kind) {
                    Some(seen) => {
                        seen.insert(key.id.clone());
                        true
                    }
                    None => false,
                };
                self.change(key, Some(obj), now, !listing);
            }
            Change::Delete(key) => {
                if key.kind == Kind::Pod {
                    self.fetching.remove(&key.id);
                }
                self.change(key, None, now, true);
            }
        }
    }

    fn change(&mut self, key: ObjKey, obj: Option<Object>, now: Instant, churn: bool) {
        let touched = self.store.change(&key, obj);
        if !touched.relevant {
            self.counters.irrelevant_events += 1;
            return;
        }
        self.counters.relevant_events += 1;
        let mut trigger = if churn { self.flood.record(now) } else { None };
        for g in touched.groups {
            if let Group::Service(svc) = &g
                && matches!(key.kind, Kind::EndpointSlice)
            {
                let n = self.store.endpoint_count(svc);
                trigger = trigger.or_else(|| self.flood.check_endpoints(svc, n));
            }
            self.mark(g, now);
        }
        if let Some(t) = trigger.or_else(|| self.flood.check_objects(self.store.len())) {
            self.trip(now, t);
        }
    }

    fn mark(&mut self, g: Group, now: Instant) {
        let budget = &self.budget;
        let st = self
            .groups
            .entry(g.clone())
            .or_insert_with(|| GroupState::new(budget));
        match &mut st.slot {
            Slot::Idle => {
                st.slot = Slot::Pending {
                    first: now,
                    last: now,
                };
                self.due.push(Reverse((now + self.quiet, g)));
            }
            Slot::Pending { last, .. } => {
                *last = now;
                self.counters.coalesced += 1;
            }
            Slot::Ready | Slot::Parked => self.counters.coalesced += 1,
        }
    }

    fn trip(&mut self, now: Instant, trigger: Trigger) {
        if !self.deciding {
            // Another replica holds the link's Lease: it decides, this one follows its record.
            return;
        }
        if let Some(t) = self.machine.trip(now, trigger, self.synced_once) {
            self.transitioned(t);
        }
    }

    fn transitioned(&mut self, t: Transition) {
        match self.machine.state() {
            State::Quarantined(_) => {
                if t.from == "Active" || t.from == "Rechecking" {
                    self.effects.push(Effect::StopUpstream);
                }
                self.store.clear();
                self.synced.clear();
                self.relisting.clear();
                self.fetching.clear();
                self.flood.reset();
                self.due.clear();
                self.ready.clear();
                self.parked.clear();
                for st in self.groups.values_mut() {
                    st.slot = Slot::Idle;
                }
            }
            State::Rechecking { .. } => self.effects.push(Effect::StartUpstream),
            State::Active => {
                if t.from == "Quarantined" {
                    self.effects.push(Effect::StartUpstream);
                }
                self.republish = true;
            }
        }
        self.effects.push(Effect::Transition(t));
    }

    /// An operator quarantines the link.
    pub fn quarantine(&mut self, now: Instant, message: &str) -> Result<Transition, RequestError> {
        let t =
            self.machine
                .quarantine_manually(now, Trigger::manual(message), self.synced_once)?;
        self.transitioned(t.clone());
        Ok(t)
    }

    /// Someone releases the link; `by` says who.
    pub fn release(&mut self, by: &str) -> Result<Transition, RequestError> {
        let t = self.machine.release(by)?;
        self.transitioned(t.clone());
        Ok(t)
    }

    /// Moves time on: publishes what is due and affordable. Returns when to poll again.
    pub fn poll(&mut self, now: Instant) -> Option<Instant> {
        self.clock.set(now.saturating_duration_since(self.origin));
        if let Some(cutoff) = now.checked_sub(DEFAULT_HISTORY_AGE) {
            self.view.expire_history(cutoff);
        }
        let all_synced = self.kinds.iter().all(|k| self.synced.contains(k));
        if let Some(t) = self.machine.tick(now, all_synced) {
            self.transitioned(t);
        }
        if matches!(
            self.machine.state(),
            State::Active | State::Rechecking { .. }
        ) && let Some(trigger) = self.flood.tick(now)
        {
            self.trip(now, trigger);
        }
        let all_synced = self.kinds.iter().all(|k| self.synced.contains(k));
        if self.machine.is_frozen() || !all_synced {
            return earliest([self.machine.next_deadline(), self.flood.next_boundary()]);
        }
        if !self.synced_once {
            // The first sync goes out at once and whole: consumers must sync fast.
            self.synced_once = true;
            self.republish = false;
            for g in self.store.groups() {
                self.publish(&g);
            }
        }
        if self.republish {
            // After a quarantine: converge to upstream through the budget.
            self.republish = false;
            let mut all: BTreeSet<Group> = self.store.groups().into_iter().collect();
            all.extend(
                self.groups
                    .iter()
                    .filter(|(_, s)| !s.objects.is_empty())
                    .map(|(g, _)| g.clone()),
            );
            for g in all {
                self.mark(g, now);
            }
        }
        self.promote(now);
        self.publish_ready(now);
        // A group is in at most one of the due, ready and parked queues (`mark` queues only on
        // Idle -> Pending; `promote` re-queues what it pops), so `pending()` counts groups.
        debug_assert!(self.pending() <= self.groups.len());
        earliest([
            self.due.peek().map(|Reverse((t, _))| *t),
            self.parked.peek().map(|Reverse((t, _))| *t),
            self.link_wait,
            self.flood.next_boundary(),
        ])
    }
}

fn earliest<const N: usize>(times: [Option<Instant>; N]) -> Option<Instant> {
    times.into_iter().flatten().min()
}

#[cfg(test)]
mod tests;
