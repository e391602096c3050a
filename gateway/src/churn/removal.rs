//! A link-wide removal: the remote takes away, within a short window, a large share of what
//! the link serves (a namespace deleted, a deploy that strips the export label from every
//! service, an etcd restored from an old backup, a relist that comes back much smaller). Like
//! a flood, it quarantines the link with its last view served, until an operator releases it.
//!
//! The guard follows the services in the view and their upstream endpoints (each counted up
//! to `caps.maxEndpointsPerService`, as the view serves them). A service *removed* is one that
//! leaves upstream selection (deleted, unexported) or whose endpoints drop to none. Within a
//! window that opens at the first removal and adds up for `removedWithin`, the link trips
//! when over `removedShare` percent of the services in the view at the window's opening were
//! removed, or of their endpoints, and at least `removedServices` services lost something:
//! one service deleted or scaled to zero never trips, however small the remote.
//!
//! So that the first removals of a mass removal do not reach consumers before the rest shows
//! it for what it is, a publication that would take a removed service out of the view waits
//! while the window is open: until no removal has come for [`QUIET`], at most `removedWithin`
//! after the first. A removal alone is served [`QUIET`] later than any other change.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use floodgate_link_crd::LinkSpec;
use tokio::time::Instant;

use super::flood::Trigger;
use crate::model::{Group, NsName};

/// How long removals wait for the next one before the window closes.
pub const QUIET: Duration = Duration::from_secs(1);

/// The removal guard of one link.
#[derive(Debug)]
pub struct RemovalGuard {
    share: u64,
    services: usize,
    within: Duration,
    max_endpoints: usize,
    /// The services in the view, each with its upstream endpoints as last seen (capped).
    served: HashMap<NsName, usize>,
    window: Option<Window>,
}

/// Removals adding up since the first.
#[derive(Debug)]
struct Window {
    opened: Instant,
    last: Instant,
    /// Services in the view when the window opened, and their endpoints.
    services_then: usize,
    endpoints_then: usize,
    /// Services removed (gone upstream, or emptied) in the window: their removal waits.
    removed: BTreeSet<NsName>,
    /// Services that lost endpoints (the removed ones included), and how many they lost.
    thinned: BTreeSet<NsName>,
    endpoints_lost: usize,
}

impl Window {
    fn closes(&self, within: Duration) -> Instant {
        (self.last + QUIET).min(self.opened + within)
    }
}

impl RemovalGuard {
    /// A guard with the spec's thresholds.
    pub fn new(spec: &LinkSpec) -> Self {
        let when = &spec.quarantine.when;
        Self {
            share: when.removed_share.into(),
            services: when.removed_services as usize,
            within: when.removed_within.get(),
            max_endpoints: spec.caps.max_endpoints_per_service as usize,
            served: HashMap::new(),
            window: None,
        }
    }

    /// `svc` is in the view after a publication, its upstream endpoints `endpoints`.
    pub fn served(&mut self, svc: &NsName, endpoints: usize) {
        self.served
            .insert(svc.clone(), endpoints.min(self.max_endpoints));
    }

    /// `svc` left the view.
    pub fn unserved(&mut self, svc: &NsName) {
        self.served.remove(svc);
    }

    /// Upstream changed `svc`: `upstream` is its endpoints now, `None` when the link no longer
    /// selects it. Returns the trigger when the removals in the window add up to a link-wide
    /// one.
    pub fn observe(
        &mut self,
        svc: &NsName,
        upstream: Option<usize>,
        now: Instant,
    ) -> Option<Trigger> {
        if self.share >= 100 {
            // Off: nothing is held, nothing trips.
            return None;
        }
        let &before = self.served.get(svc)?;
        let after = upstream.map_or(0, |n| n.min(self.max_endpoints));
        let removed = upstream.is_none() || (after == 0 && before > 0);
        if after >= before && !removed {
            self.served.insert(svc.clone(), after);
            return None;
        }
        if self.window.is_none() {
            self.window = Some(Window {
                opened: now,
                last: now,
                services_then: self.served.len(),
                endpoints_then: self.served.values().sum(),
                removed: BTreeSet::new(),
                thinned: BTreeSet::new(),
                endpoints_lost: 0,
            });
        }
        self.served.insert(svc.clone(), after);
        let w = self.window.as_mut()?;
        w.last = now;
        w.endpoints_lost += before.saturating_sub(after);
        if before > after {
            w.thinned.insert(svc.clone());
        }
        if removed {
            w.thinned.insert(svc.clone());
            w.removed.insert(svc.clone());
        }
        self.trips(now)
    }

    fn trips(&self, now: Instant) -> Option<Trigger> {
        let w = self.window.as_ref()?;
        if w.thinned.len() < self.services {
            return None;
        }
        let over = |lost: usize, of: usize| (lost as u64) * 100 > self.share * (of as u64);
        let took = now.duration_since(w.opened);
        let (what, lost, of) = if over(w.removed.len(), w.services_then) {
            ("services", w.removed.len(), w.services_then)
        } else if over(w.endpoints_lost, w.endpoints_then) {
            ("endpoints", w.endpoints_lost, w.endpoints_then)
        } else {
            return None;
        };
        let percent = (lost as u64 * 100) / (of.max(1) as u64);
        Some(Trigger::removal(
            format!(
                "the remote removed {percent}% of its exported {what} ({lost} of {of}) in {:.1}s, over quarantine.when.removedShare {}%",
                took.as_secs_f64(),
                self.share
            ),
            &[
                ("removedPercent", percent),
                (
                    if what == "services" {
                        "removedServices"
                    } else {
                        "removedEndpoints"
                    },
                    lost as u64,
                ),
                ("servedBefore", of as u64),
                ("servicesAffected", w.thinned.len() as u64),
                ("thresholdRemovedShare", self.share),
                ("windowMillis", took.as_millis() as u64),
            ],
        ))
    }

    /// Until when a publication of `g` waits: a service removed in the open window.
    pub fn held_until(&self, g: &Group) -> Option<Instant> {
        let (Some(w), Group::Service(svc)) = (&self.window, g) else {
            return None;
        };
        w.removed.contains(svc).then(|| w.closes(self.within))
    }

    /// Closes the window once no removal came for [`QUIET`] (or `removedWithin` passed): the
    /// removals it held go out.
    pub fn tick(&mut self, now: Instant) {
        if self
            .window
            .as_ref()
            .is_some_and(|w| w.closes(self.within) <= now)
        {
            self.window = None;
        }
    }

    /// When the open window closes.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.window.as_ref().map(|w| w.closes(self.within))
    }

    /// Forgets the open window (the link was quarantined: what it held is frozen with the
    /// view, and what comes after a release converges through the budget).
    pub fn reset(&mut self) {
        self.window = None;
    }
}
