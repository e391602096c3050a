//! Containment of the services that flood on their own: a service over
//! `quarantine.when.endpointsPerService` or `serviceEventsPerSecond` is contained. It stays
//! served at its last published state (or, never published, at its first capped subset), its
//! later changes wait until it is released, and its events no longer count towards the link's
//! rate, so the link's other services keep flowing within their budgets.
//!
//! Each contained service has its own [`Machine`] (Contained -> Rechecking -> Active, with the
//! link's auto-release policy and backoff); a service that is not contained has only a
//! [`Rate`], and only once it has had events. Both go when the service goes.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use floodgate_link_crd::{AutoRelease, LinkSpec};
use tokio::time::Instant;

use super::flood::{Over, Rate, Trigger};
use super::quarantine::{Machine, Quarantine, RequestError, State, StateName, Transition};
use crate::model::NsName;

/// One contained service, as the admin API, status and the disk show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contained {
    /// The service.
    pub service: NsName,
    /// `Contained` or `Rechecking`.
    pub state: StateName,
    /// When, why, and the next re-check.
    pub quarantine: Quarantine,
}

/// The containment of one link's services.
#[derive(Debug)]
pub struct Containment {
    auto: Option<AutoRelease>,
    sustained_for: Duration,
    max_contained: u32,
    /// Services contained or being re-checked.
    machines: BTreeMap<NsName, Machine>,
    /// The event rates of services that had events.
    rates: HashMap<NsName, Rate>,
}

impl Containment {
    /// No service contained yet, under the spec's policy.
    pub fn new(spec: &LinkSpec) -> Self {
        Self {
            auto: spec.quarantine.auto_release,
            sustained_for: spec.quarantine.when.sustained_for.get(),
            max_contained: spec.quarantine.when.contained_services,
            machines: BTreeMap::new(),
            rates: HashMap::new(),
        }
    }

    /// True while the service is contained or being re-checked: its changes wait.
    pub fn holds(&self, svc: &NsName) -> bool {
        self.machines.contains_key(svc)
    }

    /// Services contained or being re-checked.
    pub fn count(&self) -> usize {
        self.machines.len()
    }

    /// The contained services, by name.
    pub fn list(&self) -> Vec<Contained> {
        self.machines
            .iter()
            .filter_map(|(svc, m)| {
                Some(Contained {
                    service: svc.clone(),
                    state: m.state_name(),
                    quarantine: m.quarantine()?.clone(),
                })
            })
            .collect()
    }

    /// The link-level trigger when more services are contained than the link allows.
    pub fn over_limit(&self) -> Option<Trigger> {
        (self.machines.len() > self.max_contained as usize)
            .then(|| Trigger::contained_services(self.machines.len(), self.max_contained))
    }

    /// Counts one relevant event of `svc`, weighing `weight` (a slice change weighs the
    /// endpoints it changed, so a crash loop counts its flips however the remote batches them
    /// into slices). Says whether the event counts towards the link's rate (not when the
    /// service is held or is over its own threshold right now) and whether the service's own
    /// rate floods.
    pub fn record(
        &mut self,
        svc: &NsName,
        now: Instant,
        weight: u64,
        fresh: impl FnOnce() -> Rate,
    ) -> (bool, Option<Over>) {
        if let Some(m) = self.machines.get(svc)
            && matches!(m.state(), State::Quarantined(_))
        {
            // Contained: its churn goes nowhere, and is not measured until the re-check.
            return (false, None);
        }
        let rate = self.rates.entry(svc.clone()).or_insert_with(fresh);
        let over = rate.record_n(now, weight.max(1));
        (!self.machines.contains_key(svc) && !rate.over_now(), over)
    }

    /// Contains a service (or, being re-checked, contains it again with a longer cool-down).
    /// `None` when it already is.
    pub fn contain(&mut self, svc: &NsName, now: Instant, trigger: Trigger) -> Option<Transition> {
        let (auto, sustained_for) = (self.auto, self.sustained_for);
        let m = self
            .machines
            .entry(svc.clone())
            .or_insert_with(|| Machine::for_service(auto, sustained_for, svc.clone()));
        let t = m.trip(now, trigger, true);
        if let Some(r) = self.rates.get_mut(svc) {
            r.reset();
        }
        t
    }

    /// Someone releases a contained service; `by` says who.
    pub fn release(&mut self, svc: &NsName, by: &str) -> Result<Transition, RequestError> {
        let m = self
            .machines
            .get_mut(svc)
            .ok_or(RequestError::NotContained)?;
        let t = m.release(by).map_err(|_| RequestError::NotContained)?;
        self.machines.remove(svc);
        Ok(t)
    }

    /// The service left upstream: its containment (if any) and its rate go with it.
    pub fn forget(&mut self, svc: &NsName) -> Option<Transition> {
        self.rates.remove(svc);
        self.machines.remove(svc).map(|mut m| m.gone())
    }

    /// Puts back a containment saved before a restart (see [`Machine::restore`]).
    pub fn restore(
        &mut self,
        svc: &NsName,
        now: Instant,
        since: Instant,
        trigger: Trigger,
        cooldown: Option<Duration>,
    ) {
        let mut m = Machine::for_service(self.auto, self.sustained_for, svc.clone());
        m.restore(now, since, trigger, false, cooldown);
        self.machines.insert(svc.clone(), m);
    }

    /// Moves time on: starts due re-checks, contains again a re-checked service whose
    /// endpoints are still over the threshold (`endpoints_over`), and releases those whose
    /// re-check passed. A re-check passes only once upstream has `synced`.
    pub fn tick(
        &mut self,
        now: Instant,
        synced: bool,
        endpoints_over: impl Fn(&NsName) -> Option<Trigger>,
    ) -> Vec<Transition> {
        let mut out = Vec::new();
        let mut released = Vec::new();
        for (svc, m) in &mut self.machines {
            if m.next_deadline().is_some_and(|t| now >= t)
                && let Some(t) = m.tick(now, synced)
            {
                if t.to == StateName::Active {
                    released.push(svc.clone());
                }
                out.push(t);
            }
            // A re-check sees at once a service whose endpoints are still over the threshold
            // (its rate is seen as its events come).
            if matches!(m.state(), State::Rechecking { .. })
                && let Some(trigger) = endpoints_over(svc)
            {
                out.extend(m.trip(now, trigger, true));
            }
        }
        for svc in released {
            self.machines.remove(&svc);
            if let Some(r) = self.rates.get_mut(&svc) {
                r.reset();
            }
        }
        out
    }

    /// When [`Containment::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.machines
            .values()
            .filter_map(Machine::next_deadline)
            .min()
    }

    /// Forgets every rate (the link was quarantined: upstream starts over).
    pub fn reset_rates(&mut self) {
        self.rates.clear();
    }

    /// Services with a rate kept, for tests of what goes when a service goes.
    #[cfg(test)]
    pub fn rates_kept(&self) -> usize {
        self.rates.len()
    }
}
