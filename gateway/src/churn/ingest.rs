//! Upstream changes in ([`Engine::ingest`]): the cache takes each change, the groups it touched
//! are marked in the schedule, and its churn is measured against the thresholds, service by
//! service and for the link. A contained service's changes wait; what a whole link exceeds
//! quarantines it.

use std::collections::HashSet;

use tokio::time::Instant;

use super::{Change, Effect, Engine, Fetched, State};
use crate::model::{Group, Kind, NsName, ObjKey, Object};

impl Engine {
    /// Takes one upstream change.
    pub fn ingest(&mut self, change: Change, now: Instant) {
        if !matches!(change, Change::Skipped { .. }) {
            // Skipped pod events have a counter of their own (`skipped_events`).
            self.ingested.upstream += 1;
        }
        if matches!(self.machine.state(), State::Quarantined(_)) {
            // Upstream is being stopped: what is still in flight is dropped with the cache.
            return;
        }
        match change {
            Change::InitStart(kind) => {
                self.sync.relisting.insert(kind, HashSet::new());
            }
            Change::InitDone(kind) => self.listed(kind, now),
            Change::Fetched(obj) => self.fetched(obj, now),
            Change::Apply(obj) => self.applied(obj, now),
            Change::Skipped { replicaset, events } => self.skipped(&replicaset, events, now),
            Change::Delete(key) => {
                if key.kind == Kind::Pod {
                    self.publisher.seen(&key.id);
                    self.held_pod_gone(&key.id, now);
                }
                self.change(key, None, now, true);
            }
        }
    }

    /// The relist of `kind` is complete: what it did not list is gone.
    fn listed(&mut self, kind: Kind, now: Instant) {
        let seen = self.sync.relisting.remove(&kind).unwrap_or_default();
        for id in self.store.keys(kind) {
            if !seen.contains(&id) {
                self.change(ObjKey { kind, id }, None, now, false);
            }
        }
        self.sync.synced.insert(kind);
        if kind == Kind::Pod {
            self.publisher.pods_listed();
            // What the list was to bring came, or is absent: the groups waiting for it go.
            for g in self.publisher.awaiting(None) {
                self.schedule.resume(&g);
            }
        }
        if matches!(kind, Kind::Service | Kind::EndpointSlice | Kind::Endpoints) {
            // The upstream lists pods after Services, slices and Endpoints: know which
            // pods the selections will want before they come. A contained service that
            // has published wants those its frozen endpoints name already; one that
            // has not will publish its first capped subset, as any service.
            for g in self.store.groups() {
                let frozen = matches!(&g, Group::Service(svc) if self.containment.holds(svc))
                    && self.publisher.has_published(&g);
                if !frozen {
                    self.publisher.preselect(&g, &mut self.store);
                }
            }
        }
    }

    /// A pod the engine asked for ([`Effect::FetchPods`]): state, not churn, and taken only
    /// while no watch event brought the pod first.
    fn fetched(&mut self, f: Fetched, now: Instant) {
        if let Some(obj) = self.publisher.fetched(&f.pod, f.ticket, f.answer) {
            let obj = obj.into_sanitized();
            let key = obj.key();
            if key.kind == Kind::Pod && key.id == f.pod && self.store.pod(&key.id).is_none() {
                self.change(key, Some(obj), now, false);
            }
        }
        // Found or known absent: the groups waiting for it go on (one whose fetch failed
        // waits on; its wait has an end).
        for g in self.publisher.awaiting(Some(&f.pod)) {
            self.schedule.resume(&g);
        }
    }

    /// An object created, updated or listed upstream. A pod behind no published endpoint is
    /// dropped here.
    fn applied(&mut self, obj: Object, now: Instant) {
        let obj = obj.into_sanitized();
        let key = obj.key();
        // A relist is state, not churn: it does not count towards the event rates.
        let listing = match self.sync.relisting.get_mut(&key.kind) {
            Some(seen) => {
                seen.insert(key.id.clone());
                true
            }
            None => false,
        };
        if let Object::Pod(pod) = &obj {
            self.publisher.seen(&key.id);
            if !self.publisher.wants(&key.id) {
                // Named by no published endpoint. A new pod of a service under its cap (of
                // a ReplicaSet it serves) is held once it is ready, so its slice finds it;
                // the pod watcher sent it for that. Each of its events, held or not, counts
                // for that service as a skipped one would: a crash loop of held pods is
                // churn all the same. Any other pod costs its decoding, nothing more.
                let owners = self.publisher.followed_owners(pod);
                if !listing {
                    for rs in &owners {
                        self.skipped(rs, 1, now);
                    }
                }
                let held = self.store.pod(&key.id).is_some();
                if !held && (owners.is_empty() || !pod.is_ready()) {
                    self.ingested.irrelevant += 1;
                    return;
                }
                self.ingested.relevant += 1;
                self.store.change(&key, Some(obj));
                return;
            }
        }
        self.change(key, Some(obj), now, !listing);
    }

    /// A pod held ahead of its slice ([`Self::applied`]), named by no endpoint, is deleted: its
    /// event counts for the services of its ReplicaSets as its other events do.
    fn held_pod_gone(&mut self, id: &NsName, now: Instant) {
        if self.publisher.wants(id) {
            return;
        }
        let Some(pod) = self.store.pod(id) else {
            return;
        };
        for rs in &self.publisher.followed_owners(pod) {
            self.skipped(rs, 1, now);
        }
    }

    /// Puts a change in the cache and marks the groups it touched; `churn` when it counts
    /// towards the event rates (a relist or a fetch does not).
    fn change(&mut self, key: ObjKey, obj: Option<Object>, now: Instant, churn: bool) {
        let touched = self.store.change(&key, obj);
        let mut groups = touched.groups;
        for pod in &touched.pods {
            for svc in self.publisher.wanting(pod) {
                let g = Group::Service(svc.clone());
                if !groups.contains(&g) {
                    groups.push(g);
                }
            }
        }
        if !touched.relevant && groups.is_empty() {
            self.ingested.irrelevant += 1;
            return;
        }
        self.ingested.relevant += 1;
        let mut link_counts = false;
        for g in groups {
            if let Group::Service(svc) = &g {
                if key.kind == Kind::Service && self.store.service(svc).is_none() {
                    // The service left upstream: its containment ends with it.
                    if let Some(t) = self.containment.forget(svc) {
                        self.effects.push(Effect::Transition(t));
                    }
                }
                if churn {
                    link_counts |= self.record_churn(svc, touched.endpoints_changed, now);
                }
                if matches!(key.kind, Kind::Service | Kind::EndpointSlice) && self.sync.all() {
                    // Measured once upstream has listed everything: a relist after a
                    // quarantine fills an empty cache, service before slices.
                    let upstream =
                        (self.store.is_selected(svc)).then(|| self.store.endpoint_count(svc));
                    if let Some(t) = self.removals.observe(svc, upstream, now) {
                        self.trip(now, t);
                    }
                }
                // At a slice change, and when the service itself arrives: its slices may have
                // come first (each kind has its own watch), when it was not selected yet.
                if matches!(key.kind, Kind::EndpointSlice | Kind::Service) {
                    self.check_endpoints(svc, now);
                }
                if self.containment.holds(svc)
                    && self.publisher.has_published(&g)
                    && !matches!(key.kind, Kind::Pod | Kind::ReplicaSet)
                {
                    // Contained: its endpoints are served as they were published until it is
                    // released. The pods they name are not held back: they are published as
                    // any service's (`publish`), so consumers resolve what they are served.
                    self.ingested.contained += 1;
                    continue;
                }
            } else if g != Group::LinkerdConfig {
                // The Linkerd configuration changes when trust anchors rotate: it is measured
                // against no rate, so it can never quarantine the link.
                link_counts = true;
            }
            if self.schedule.mark(&g, Some(key.kind), now) {
                self.ingested.coalesced += 1;
            }
        }
        if churn
            && link_counts
            && let Some(over) = self.flood.link.record(now)
        {
            self.trip(now, self.flood.link_trigger(over));
        }
        if let Some(t) = self.flood.check_objects(self.store.len()) {
            self.trip(now, t);
        }
    }

    /// `n` watch events of pods the pod watcher skipped (no kept endpoint names them), whose
    /// controller is ReplicaSet `rs`: still churn, of each service that serves pods of that
    /// ReplicaSet (a crash loop's pods beyond the cap are the flood itself). Counted against
    /// those services' own rates (not the link's): a flood under `endpointsPerService` is
    /// contained by its event rate even when most of its events reach no consumer.
    fn skipped(&mut self, rs: &NsName, n: u64, now: Instant) {
        if self.machine.is_frozen() || n == 0 {
            return;
        }
        let mut services: Vec<NsName> = (self.store.pods_of_replicaset(rs))
            .flat_map(|pod| self.publisher.wanting(pod).iter().cloned())
            .collect();
        services.sort();
        services.dedup();
        for svc in services {
            self.ingested.skipped += n;
            self.record_churn(&svc, n as usize, now);
        }
    }

    /// Records a change of `svc` that changed `endpoints` endpoints against its rate, and
    /// contains the service if it floods on its own. Returns whether the change counts towards
    /// the link's rate (not when the service is held or over its own threshold).
    fn record_churn(&mut self, svc: &NsName, endpoints: usize, now: Instant) -> bool {
        let flood = &self.flood;
        let (counts, over) = self
            .containment
            .record(svc, now, endpoints as u64, || flood.service_rate());
        if let Some(over) = over {
            let trigger = self.flood.service_trigger(svc, over);
            self.contain(svc, now, trigger);
        }
        counts
    }

    /// Contains `svc` if it holds more endpoints than the threshold allows.
    pub(super) fn check_endpoints(&mut self, svc: &NsName, now: Instant) {
        if let Some(t) = self
            .flood
            .check_endpoints(svc, self.store.endpoint_count(svc))
        {
            self.contain(svc, now, t);
        }
    }
}
