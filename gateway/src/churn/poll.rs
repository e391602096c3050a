//! Time moves on ([`Engine::poll`]): the quarantine and the containments tick, the history
//! of the view ages, and the groups due are published as far as the budget affords; a first
//! sync is published whole and at once.

use std::collections::BTreeSet;

use tokio::time::Instant;

use super::{Effect, Engine, State, StateName};
use crate::model::{Group, NsName};
use crate::view::DEFAULT_HISTORY_AGE;

impl Engine {
    /// Moves time on: publishes what is due and affordable. Returns when to poll again.
    pub fn poll(&mut self, now: Instant) -> Option<Instant> {
        if let Some(cutoff) = now.checked_sub(DEFAULT_HISTORY_AGE) {
            self.view().expire_history(cutoff);
        }
        let all_synced = self.sync.all();
        if let Some(t) = self.machine.tick(now, all_synced) {
            self.transitioned(t);
        }
        if !matches!(self.machine.state(), State::Quarantined(_))
            && let Some(over) = self.flood.link.tick(now)
        {
            self.trip(now, self.flood.link_trigger(over));
        }
        if self.owed.assess && self.role.decides() && all_synced && !self.machine.is_frozen() {
            self.owed.assess = false;
            self.assess_services(now);
        }
        if !self.machine.is_frozen() && self.role.decides() {
            let (store, flood) = (&self.store, &self.flood);
            let over = |svc: &NsName| flood.check_endpoints(svc, store.endpoint_count(svc));
            for t in self.containment.tick(now, all_synced, over) {
                if t.to == StateName::Active
                    && let Some(svc) = &t.service
                {
                    self.schedule.mark(&Group::Service(svc.clone()), None, now);
                }
                self.effects.push(Effect::Transition(t));
            }
        }
        self.removals.tick(now);
        let all_synced = self.sync.all();
        // The later stages of publications made (pods lead their endpoints), and the groups
        // that waited for pods long enough.
        self.publisher.apply_due(now);
        for g in self.publisher.awaited_too_long(now) {
            self.schedule.resume(&g);
        }
        let expiry = (self.view().oldest_change()).map(|t| t + DEFAULT_HISTORY_AGE);
        let deadlines = [
            self.machine.next_deadline(),
            self.containment.next_deadline(),
            self.flood.link.next_boundary(),
            expiry,
            self.publisher.next_deadline(),
            self.removals.next_deadline(),
        ];
        if self.machine.is_frozen() || !all_synced || self.role.follows() {
            return earliest(deadlines);
        }
        if !self.sync.once {
            // The first sync goes out at once and whole: consumers must sync fast.
            self.publish_all(now);
            self.owed.republish = false;
        }
        if self.owed.republish {
            // After a quarantine: converge to upstream through the budget.
            self.owed.republish = false;
            let mut all: BTreeSet<Group> = self.store.groups().into_iter().collect();
            all.extend(self.publisher.published_groups().cloned());
            for g in all {
                self.schedule.mark(&g, None, now);
            }
        }
        self.schedule.promote(now);
        let mut link_token = false;
        loop {
            let (publisher, removals) = (&self.publisher, &self.removals);
            // A group's stages are out, and a removal waits for the removals that may follow.
            let busy = |g: &Group| publisher.busy_until(g).max(removals.held_until(g));
            let Some(g) = self.schedule.next(now, &mut link_token, busy) else {
                break;
            };
            self.publish(&g, now, true);
            if self.publisher.is_awaiting(&g) {
                // Nothing went out: the tokens taken pay for the publication once it is ready.
                self.schedule.prepay(&g);
            } else {
                let within = self.publisher.out_within(&g, now);
                self.schedule.published(&g, now, within);
            }
        }
        earliest([
            self.schedule.next_wake(),
            self.containment.next_deadline(),
            self.flood.link.next_boundary(),
            expiry,
            self.publisher.next_deadline(),
            self.removals.next_deadline(),
        ])
    }

    /// Publishes every group the store could publish, outside the budget (the first sync, or a
    /// quarantine that comes before it), and counts the link as synced.
    pub(super) fn publish_all(&mut self, now: Instant) {
        self.sync.once = true;
        // With the groups of a view taken over ([`Engine::adopt_view`]): those gone upstream
        // are deleted.
        let mut all: BTreeSet<Group> = self.store.groups().into_iter().collect();
        all.extend(self.publisher.published_groups().cloned());
        for g in all {
            self.publish(&g, now, false);
        }
    }

    /// Publishes one group; a contained service that has published already publishes only the
    /// pods behind its frozen endpoints. Forgets a group whose service is gone. `wait`: the
    /// publication may wait for the pods its new ready endpoints name ([`Publisher::publish`];
    /// not at a first sync, which goes out whole).
    ///
    /// [`Publisher::publish`]: super::publish::Publisher::publish
    fn publish(&mut self, g: &Group, now: Instant, wait: bool) {
        let frozen = matches!(g, Group::Service(svc) if self.containment.holds(svc));
        let fetch = if frozen {
            self.publisher.publish_frozen(g, &mut self.store, now, wait)
        } else {
            self.publisher.publish(g, &mut self.store, now, wait)
        };
        if let Some(fetch) = fetch {
            self.effects.push(Effect::FetchPods(fetch));
        }

        let gone = match g {
            Group::Service(svc) => self.store.service(svc).is_none(),
            Group::Servers(ns) => self.store.servers_in(ns).is_empty(),
            Group::LinkerdConfig => self.store.config_maps().is_empty(),
        };
        if let Group::Service(svc) = g {
            if self.publisher.has_published(g) {
                self.removals.served(svc, self.store.endpoint_count(svc));
            } else {
                self.removals.unserved(svc);
            }
        }
        if gone && !self.publisher.has_published(g) {
            self.schedule.forget(g);
        }
    }
}

fn earliest<const N: usize>(times: [Option<Instant>; N]) -> Option<Instant> {
    times.into_iter().flatten().min()
}
