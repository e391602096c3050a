//! The churn engine of one link: upstream changes in, budgeted publications out. Pure logic: it
//! is fed changes and `tokio::time::Instant`s and never touches the network or the wall clock.
//!
//! ```text
//! ingest(change, now) -> Store (upstream cache) --groups touched--> Scheduler (schedule.rs)
//!                          |                                         leading edge, or coalesce
//!            FloodDetector + Containment (contain.rs)                (quiet/max), round robin
//!            a service floods: contained, its changes wait           over ready groups, link
//!            the link floods: quarantine::Machine                    and service GCRA buckets
//!                                                                            |
//! poll(now) -------------------------------------------------------> Publisher (publish.rs)
//!                                              cap (sticky subset) + diff ---> View
//! ```
//!
//! The unit of coalescing, limiting and capping is a [`Group`]: a service with its slices,
//! Endpoints, pods and ReplicaSets, or the Servers of a namespace. A group's publication is
//! computed from the latest upstream state when its turn comes, so while it waits for tokens it
//! keeps coalescing and nothing final is lost. The first complete sync is published at once,
//! outside the budget: limits apply to changes, never to a consumer's first sync.
//!
//! A service that floods on its own is *contained* (`contain.rs`): served at its last
//! published state while every other service keeps flowing. Only what a whole link can exceed
//! (objects held, the link-wide rate of the services that are not contained, too many services
//! contained at once) quarantines the link, and a quarantine before the first sync publishes
//! what was listed, capped, so a flood never keeps a link from syncing.
//!
//! The caller (the link task) calls [`Engine::ingest`] for every upstream change, then
//! [`Engine::poll`] and sleeps until the instant it returns; it carries out
//! [`Engine::take_effects`] (stop or restart upstream, fetch pods) and reports transitions.
//! The engine's two entries live in their own files: what a change does in `ingest.rs`, what
//! time does in `poll.rs`; this file holds the engine's state and its quarantine decisions.

pub mod cap;
pub mod contain;
pub mod flood;
mod ingest;
mod io;
pub mod limit;
mod poll;
pub mod publish;
pub mod quarantine;
pub mod removal;
pub mod restore;
pub mod role;
mod schedule;

pub use io::{Answer, Change, Counters, Effect, Fetch, Fetched};
pub use schedule::{DELAY_BUCKETS, Delays};
pub mod store;

use std::collections::{HashMap, HashSet};

use floodgate_link_crd::{LinkSpec, Phase};
use tokio::time::Instant;

use self::contain::{Contained, Containment};
use self::flood::{FloodDetector, Trigger};
use self::publish::Publisher;
use self::quarantine::{Machine, RequestError, State, StateName, Transition};
use self::removal::RemovalGuard;
use self::role::Role;
use self::schedule::Scheduler;
use self::store::Store;
use crate::model::{Group, Kind, NsName, ObjKey};
use crate::view::View;

/// What the engine counts itself (the rest comes from its parts).
#[derive(Clone, Copy, Debug, Default)]
struct Ingested {
    /// Skipped pod events counted against a service's rate ([`Change::Skipped`]).
    skipped: u64,
    upstream: u64,
    relevant: u64,
    irrelevant: u64,
    contained: u64,
    coalesced: u64,
}

/// Which kinds have listed, and what a relist in progress has seen.
#[derive(Debug, Default)]
struct Sync {
    kinds: Vec<Kind>,
    synced: HashSet<Kind>,
    relisting: HashMap<Kind, HashSet<NsName>>,
    /// True once every kind has listed and the view was published (or the link was
    /// quarantined before that and published what it had).
    once: bool,
}

impl Sync {
    fn all(&self) -> bool {
        self.kinds.iter().all(|k| self.synced.contains(k))
    }

    fn clear(&mut self) {
        self.synced.clear();
        self.relisting.clear();
    }
}

/// Work over everything held that the engine owes: set when something happens, carried out
/// by a later [`Engine::poll`] once the upstream has listed.
#[derive(Debug)]
struct Owed {
    /// After a quarantine: converge every group to upstream through the budget.
    republish: bool,
    /// Every service is to be judged against the thresholds from the state held, not only
    /// from the changes that come: set when this engine starts deciding (at start, on taking
    /// the Lease, after a restore), carried out once the upstream has listed.
    assess: bool,
}

/// The engine of one link: an upstream cache, a publication schedule, a publisher, the
/// containment of services that flood and the quarantine of the link.
#[derive(Debug)]
pub struct Engine {
    store: Store,
    schedule: Scheduler,
    publisher: Publisher,
    flood: FloodDetector,
    removals: RemovalGuard,
    containment: Containment,
    machine: Machine,
    sync: Sync,
    /// What it does with the link: decide, measure only (another replica holds the Lease),
    /// follow the holder's view, or take it over.
    role: Role,
    owed: Owed,
    effects: Vec<Effect>,
    ingested: Ingested,
}

impl Engine {
    /// An engine for a validated spec, following `kinds` upstream, publishing into `view`.
    pub fn new(spec: &LinkSpec, kinds: &[Kind], view: View, now: Instant) -> Self {
        let mut engine = Self {
            store: Store::new(
                &spec.select.services,
                spec.caps.max_endpoints_per_service as usize,
            ),
            schedule: Scheduler::new(spec, now),
            publisher: Publisher::new(
                view,
                spec.caps.max_endpoints_per_service as usize,
                spec.caps.max_services.into(),
            ),
            flood: FloodDetector::new(spec),
            removals: RemovalGuard::new(spec),
            containment: Containment::new(spec),
            machine: Machine::new(
                spec.quarantine.auto_release,
                spec.quarantine.when.sustained_for.get(),
            ),
            sync: Sync {
                kinds: kinds.to_vec(),
                ..Sync::default()
            },
            role: Role::Deciding,
            owed: Owed {
                republish: false,
                assess: true,
            },
            effects: Vec::new(),
            ingested: Ingested::default(),
        };
        engine.set_kinds(kinds);
        engine
    }

    /// Sets the kinds followed upstream (known once the remote's discovery answered; a link
    /// restored from disk starts before that).
    pub fn set_kinds(&mut self, kinds: &[Kind]) {
        self.sync.kinds = kinds.to_vec();
        (self.publisher).follow_endpoints(kinds.contains(&Kind::Endpoints));
    }

    /// Whether this engine acts on the floods it measures (true unless another replica holds
    /// the link's Lease).
    pub fn set_deciding(&mut self, deciding: bool) {
        // A replica that takes the decisions over judges what it holds at once: a service
        // already over its thresholds may change no more, and would never be contained.
        self.owed.assess |= deciding && !self.role.decides();
        self.role = self.role.deciding(deciding);
    }

    /// Stops publishing: the view follows the Lease holder's as it is ([`Engine::adopt_view`]
    /// takes it over).
    pub fn set_following(&mut self) {
        self.publisher.flush();
        self.role = self.role.following();
    }

    /// Shares the pods the engine wants with the upstream pod watcher, which then skips
    /// decoding the others.
    pub fn mirror_wanted(&mut self, wanted: crate::model::wanted::WantedPods) {
        self.publisher.mirror_wanted(wanted);
    }

    /// A new run of upstream watchers starts: the pod fetches of the last one are dropped
    /// with its messages, and nothing it knew of the wanted pods holds.
    pub fn upstream_starts(&mut self) {
        self.publisher.new_upstream();
    }

    /// The pod watcher's first list of this run begins (its gate opened just now), with the
    /// pods wanted now in the set it decodes: the list, not a fetch, brings each of them.
    pub fn pods_listing(&mut self) {
        self.publisher.pods_listing();
    }

    /// The published view.
    pub fn view(&self) -> &View {
        self.publisher.view()
    }

    /// Running totals.
    pub fn counters(&self) -> Counters {
        let p = self.publisher.counters();
        let i = self.ingested;
        Counters {
            upstream_events: i.upstream,
            relevant_events: i.relevant,
            irrelevant_events: i.irrelevant,
            contained_events: i.contained,
            coalesced: i.coalesced,
            downstream_updates: p.downstream_updates,
            throttled: self.schedule.throttled,
            services: p.services,
            services_withheld: p.services_withheld,
            endpoints_published: p.endpoints_published,
            endpoints_truncated: p.endpoints_truncated,
            pods_fetched: p.pods_fetched,
            skipped_events: i.skipped,
        }
    }

    /// How long the changes published so far waited for their publication.
    pub fn publication_delays(&self) -> &Delays {
        &self.schedule.delays
    }

    /// Groups waiting to be published: coalescing, in line, or waiting for a token.
    pub fn pending(&self) -> usize {
        self.schedule.pending()
    }

    /// Upstream objects held.
    pub fn objects_held(&self) -> usize {
        self.store.len()
    }

    /// Upstream objects held, by kind.
    pub fn objects_by_kind(&self) -> [(Kind, usize); Kind::ALL.len()] {
        self.store.counts()
    }

    /// EndpointSlices held deflated: those of services with more endpoints upstream than the
    /// cap.
    pub fn slices_deflated(&self) -> usize {
        self.store.slices_deflated()
    }

    /// Groups with state held, in the schedule and in the publisher.
    pub fn groups_held(&self) -> (usize, usize) {
        (self.schedule.groups(), self.publisher.groups())
    }

    /// Relevant upstream events of the link (services that do not flood on their own) in the
    /// last complete second.
    pub fn events_last_second(&self) -> u64 {
        self.flood.link.last_second()
    }

    /// The link's quarantine state.
    pub fn state(&self) -> &State {
        self.machine.state()
    }

    /// The link's quarantine state, by name.
    pub fn state_name(&self) -> StateName {
        self.machine.state_name()
    }

    /// The contained services, by name.
    pub fn contained(&self) -> Vec<Contained> {
        self.containment.list()
    }

    /// The keys of what a service published (a contained one's frozen state, to save it).
    pub fn published_keys(&self, svc: &NsName) -> Vec<ObjKey> {
        self.publisher
            .published(&Group::Service(svc.clone()))
            .map(|p| p.objects.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Services contained now.
    pub fn contained_count(&self) -> usize {
        self.containment.count()
    }

    /// True once every kind has completed its first list and the view was published, or the
    /// link was quarantined and published what it had: consumers may sync.
    pub fn synced_once(&self) -> bool {
        self.sync.once
    }

    /// Healthy, Throttled (publications wait for tokens) or Quarantined.
    pub fn phase(&self) -> Phase {
        if self.machine.is_frozen() {
            Phase::Quarantined
        } else if self.schedule.throttled_now() {
            Phase::Throttled
        } else {
            Phase::Healthy
        }
    }

    /// What the caller must do, oldest first.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// Judges every selected service against the endpoint threshold from the state held, and
    /// contains those over it.
    fn assess_services(&mut self, now: Instant) {
        for g in self.store.groups() {
            if let Group::Service(svc) = &g
                && !self.containment.holds(svc)
            {
                self.check_endpoints(svc, now);
            }
        }
    }

    /// Contains a service that floods on its own; too many contained at once quarantine the
    /// link.
    fn contain(&mut self, svc: &NsName, now: Instant, trigger: Trigger) {
        if !self.role.decides() || self.machine.is_frozen() {
            return;
        }
        if let Some(t) = self.containment.contain(svc, now, trigger) {
            self.effects.push(Effect::Transition(t));
            if let Some(trigger) = self.containment.over_limit() {
                self.trip(now, trigger);
            }
        }
    }

    fn trip(&mut self, now: Instant, trigger: Trigger) {
        if !self.role.decides() {
            // Another replica holds the link's Lease: it decides, this one follows its record.
            return;
        }
        if let Some(t) = self.machine.trip(now, trigger, self.sync.once) {
            self.transitioned(t);
        }
    }

    fn transitioned(&mut self, t: Transition) {
        match self.machine.state() {
            State::Quarantined(q) => {
                // Entered just now (`trip`, `quarantine`): its start is the time it is.
                let now = q.since;
                // The view freezes as published: every stage of it.
                self.publisher.flush();
                if matches!(t.from, StateName::Active | StateName::Rechecking) {
                    self.effects.push(Effect::StopUpstream);
                }
                if !self.sync.once {
                    // A quarantine never means "unavailable": without a last good view, serve
                    // what was listed, every service capped, and count as synced.
                    self.publish_all(now);
                }
                self.store.clear();
                self.sync.clear();
                self.publisher.new_upstream();
                self.flood.link.reset();
                self.removals.reset();
                self.containment.reset_rates();
                self.schedule.clear();
            }
            State::Rechecking { .. } => self.effects.push(Effect::StartUpstream),
            State::Active => {
                if t.from == StateName::Quarantined {
                    self.effects.push(Effect::StartUpstream);
                }
                self.owed.republish = true;
            }
        }
        self.effects.push(Effect::Transition(t));
    }

    /// An operator quarantines the link.
    pub fn quarantine(&mut self, now: Instant, message: &str) -> Result<Transition, RequestError> {
        let t = self
            .machine
            .quarantine_manually(now, Trigger::manual(message), self.sync.once)?;
        self.transitioned(t.clone());
        Ok(t)
    }

    /// Someone releases the link; `by` says who.
    pub fn release(&mut self, by: &str) -> Result<Transition, RequestError> {
        let t = self.machine.release(by)?;
        self.transitioned(t.clone());
        Ok(t)
    }

    /// Contains a service because the link's Lease holder recorded it contained (this replica
    /// follows the holder's decisions; a restarted holder follows its own record once). The
    /// link's quarantine is the holder's to decide: the count is not checked here. Returns
    /// `None` when the service is contained already or the link is quarantined.
    pub fn follow_containment(
        &mut self,
        svc: &NsName,
        now: Instant,
        trigger: Trigger,
    ) -> Option<Transition> {
        if self.machine.is_frozen() || self.containment.holds(svc) {
            return None;
        }
        let t = self.containment.contain(svc, now, trigger)?;
        self.effects.push(Effect::Transition(t.clone()));
        Some(t)
    }

    /// Someone releases a contained service; `by` says who. It converges to upstream through
    /// its budget, and is contained again if it still floods.
    pub fn release_service(
        &mut self,
        svc: &NsName,
        now: Instant,
        by: &str,
    ) -> Result<Transition, RequestError> {
        let g = Group::Service(svc.clone());
        if !self.containment.holds(svc)
            && self.store.service(svc).is_none()
            && !self.publisher.has_published(&g)
        {
            return Err(RequestError::UnknownService);
        }
        let t = self.containment.release(svc, by)?;
        self.schedule.mark(&g, None, now);
        self.effects.push(Effect::Transition(t.clone()));
        Ok(t)
    }
}

#[cfg(test)]
pub(crate) mod tests;
