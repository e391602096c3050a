//! The order a publication reaches consumers in: an object goes out after the objects its
//! consumers' handlers look up when they handle it (DESIGN guarantee 9).
//!
//! A consumer's informers each run on their own (client-go hands every watch of one HTTP/2
//! connection to a goroutine of its own; kube-rs holds a connection per watch), and their
//! handlers read the other kinds from their caches at the event: Linkerd's destination looks
//! up the pod of each ready endpoint when it handles an EndpointSlice, and drops for good (until
//! that slice changes again) an address whose pod it does not hold; its service mirror reads a
//! Service's Endpoints when it handles the Service's `ADDED`. A resource-version order alone
//! leaves a race a real cluster does not have: its controllers write a pod 9 to 30 ms before the
//! slice that names it. So a publication is split into up to three [`Stage`]s, each applied to
//! the view [`LEAD`] after the one before it produced events ([`CAPPED_LEAD`] behind a pod that
//! enters the view for an endpoint a service's cap has just swapped in):
//!
//! | stage | on the way in | on the way out |
//! | --- | --- | --- |
//! | [`Stage::Pods`] | pods and ReplicaSets (new or changed); the Linkerd configuration | a Service leaving the view; the Linkerd configuration |
//! | [`Stage::Endpoints`] | EndpointSlices and Endpoints; a Service already served changing | slices and Endpoints |
//! | [`Stage::Service`] | a Service entering the view | pods and ReplicaSets |
//!
//! The endpoints wait only for a pod they name as ready (a consumer looks up no pod behind a
//! not-ready endpoint), or behind a Service leaving; a stage whose changes are all no-ops
//! costs no wait. A publication made while nobody follows the view (a first sync, answered
//! only once it is whole) is applied in one step: there is no order to see.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{Kind, NsName, ObjKey, Object};
use crate::view::{Change, View};

/// How long a stage of a publication leads the next at the consumers: longer than a real
/// cluster's pod leads its slice (9 to 30 ms, its controllers' latency), and than a fan-out of
/// one event to 1,000 watchers takes from the first to the last (6 to 16 ms measured,
/// docs/figures.md), so a consumer's pod informer has stored the pod before its slice
/// informer handles the slice, whatever its transport.
pub const LEAD: Duration = Duration::from_millis(30);

/// How long a pod entering the view leads an endpoint the cap has just chosen to name it as
/// ready: a capped service's kept subset changes as its endpoints flip, and the endpoint
/// swapped in has been ready at the remote for a while, so a consumer reading the remote
/// directly has held its pod all along, and no real cluster's lead applies. A consumer's pod
/// informer stores a new pod 0 to 7 ms after Floodgate writes it (client-go through Floodgate
/// beside a real server in a crash loop, `make test-real`'s `s1_rate`), but on a loaded machine
/// a consumer descheduled for longer than [`LEAD`] wakes to both events at once and handles
/// them in either order: with a [`LEAD`] there, that S1 lost 1 and 6 of the flooding service's
/// addresses at the slice event in 2 runs of 6, though Floodgate served each pod before its
/// slice. Nothing waits on the cap's choice, so the lead can be long.
pub const CAPPED_LEAD: Duration = Duration::from_millis(500);

/// A stage of a publication, in the order they are applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Stage {
    /// What a consumer looks up when it handles an endpoint: pods and their ReplicaSets; and
    /// a Service leaving, before what it looked up goes.
    Pods,
    /// Endpoints: EndpointSlices and Endpoints, and a change of a Service already served.
    Endpoints,
    /// A Service entering the view, after its endpoints; pods leaving, after the endpoints
    /// that named them.
    Service,
}

/// The stage a change belongs to; `entering` tells whether an upserted object is new to the
/// view (only a Service's entry waits for its endpoints).
pub(super) fn stage_of(change: &Change, entering: impl FnOnce(&ObjKey) -> bool) -> Stage {
    match change {
        // Every kind named: a new kind takes its place in the order here.
        Change::Upsert(o) => match o.kind() {
            // Looked up by what names them, or looks nothing up: it goes first.
            Kind::Pod | Kind::ReplicaSet | Kind::ConfigMap => Stage::Pods,
            Kind::Service if entering(&o.key()) => Stage::Service,
            Kind::Service | Kind::EndpointSlice | Kind::Endpoints | Kind::Server => {
                Stage::Endpoints
            }
        },
        Change::Delete(k) => match k.kind {
            Kind::Service | Kind::ConfigMap => Stage::Pods,
            Kind::Pod | Kind::ReplicaSet => Stage::Service,
            Kind::EndpointSlice | Kind::Endpoints | Kind::Server => Stage::Endpoints,
        },
    }
}

/// Splits a publication's changes into its stages, in order; empty stages are dropped.
pub(super) fn split(changes: Vec<Change>, view: &View) -> VecDeque<(Stage, Vec<Change>)> {
    let mut stages: [Vec<Change>; 3] = Default::default();
    for c in changes {
        let stage = stage_of(&c, |k| view.get(k).is_none());
        stages[stage as usize].push(c);
    }
    let order = [Stage::Pods, Stage::Endpoints, Stage::Service];
    (order.into_iter().zip(stages))
        .filter(|(_, s)| !s.is_empty())
        .collect()
}

/// What a stage just applied holds that the next may wait for: its changes, and the pods it
/// brought into the view (not merely changed there).
#[derive(Default)]
struct Applied {
    changes: Vec<Change>,
    entered: HashSet<NsName>,
}

/// How long `next` must wait behind `before`, applied just now, if at all: endpoints wait a
/// [`LEAD`] for the pods they name as ready and for a Service leaving before them, and
/// `entering` (the publication's lead for a pod new to the view, [`CAPPED_LEAD`] for a capped
/// service) for a pod that entered; a Service entering and pods leaving wait a [`LEAD`] for
/// the endpoints (their stage only ever follows one).
fn waits(
    before: &Applied,
    (stage, next): (Stage, &[Change]),
    entering: Duration,
) -> Option<Duration> {
    if stage != Stage::Endpoints {
        return Some(LEAD);
    }
    let mut lead = (before.changes.iter())
        .any(|c| matches!(c, Change::Delete(k) if k.kind == Kind::Service))
        .then_some(LEAD);
    let pods: HashSet<&NsName> = (before.changes.iter())
        .filter_map(|c| match c {
            Change::Upsert(Object::Pod(p)) => Some(p.id()),
            _ => None,
        })
        .collect();
    let mut named = |(pod, ready): (NsName, bool)| {
        if ready && pods.contains(&pod) {
            let wait = if before.entered.contains(&pod) {
                entering
            } else {
                LEAD
            };
            lead = lead.max(Some(wait));
        }
    };
    for c in next {
        match c {
            Change::Upsert(Object::EndpointSlice(s)) => {
                s.pod_refs_ready().into_iter().for_each(&mut named)
            }
            Change::Upsert(Object::Endpoints(e)) => e.pod_refs_ready().for_each(&mut named),
            _ => {}
        }
    }
    lead
}

/// The stages of a group's publication still to apply, the next at `due`.
#[derive(Debug)]
pub(super) struct Tail {
    pub(super) due: Instant,
    pub(super) stages: VecDeque<(Stage, Vec<Change>)>,
}

/// Applies `stages` in order from `now`, each after one that produced events by the lead
/// [`waits`] says (`entering`: behind a pod new to the view, [`LEAD`] or [`CAPPED_LEAD`]);
/// returns what is left to apply later, if anything. `keep` drops a deletion that no longer
/// holds (a pod another group publishes since the publication was computed). `staged: false`
/// applies them all at once (nobody follows the view).
pub(super) fn apply(
    view: &View,
    mut stages: VecDeque<(Stage, Vec<Change>)>,
    now: Instant,
    staged: bool,
    entering: Duration,
    keep: impl Fn(&Change) -> bool,
) -> (Option<Tail>, bool) {
    let (mut produced, mut last) = (false, Applied::default());
    while let Some((tag, stage)) = stages.pop_front() {
        let wait = (!last.changes.is_empty() && staged)
            .then(|| waits(&last, (tag, &stage), entering))
            .flatten();
        if let Some(lead) = wait {
            stages.push_front((tag, stage));
            // Stages of no-ops (a Service and slices upserted as they are) wait for nothing.
            if !stages.iter().any(|(_, s)| view.would_change(s)) {
                return (None, true);
            }
            let due = now + lead;
            return (Some(Tail { due, stages }), true);
        }
        let stage: Vec<Change> = stage.into_iter().filter(&keep).collect();
        if !staged {
            produced |= !view.apply(stage, now).is_empty();
            continue;
        }
        let entered = (stage.iter())
            .filter_map(|c| match c {
                Change::Upsert(o @ Object::Pod(p)) if view.get(&o.key()).is_none() => {
                    Some(p.id().clone())
                }
                _ => None,
            })
            .collect();
        let applied = !view.apply(stage.clone(), now).is_empty();
        produced |= applied;
        last = if applied {
            Applied {
                changes: stage,
                entered,
            }
        } else {
            Applied::default()
        };
    }
    (None, produced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::churn::tests::{mk_pod, mk_service, mk_slice};

    fn stages_of(changes: Vec<Change>, view: &View) -> Vec<Vec<Kind>> {
        split(changes, view)
            .into_iter()
            .map(|(_, s)| {
                s.iter()
                    .map(|c| match c {
                        Change::Upsert(o) => o.kind(),
                        Change::Delete(k) => k.kind,
                    })
                    .collect()
            })
            .collect()
    }

    /// A new service: its pods, then its slices, then the Service; a service going: the
    /// Service, then its slices, then its pods.
    #[test]
    fn a_service_enters_after_its_endpoints_and_leaves_before_them() {
        let view = View::new(1, 100);
        let pod = mk_pod("a-1", "Running");
        let slice = mk_slice("a", "a-x", &[(1, true)]);
        let svc = mk_service("a", true);
        let entering = vec![
            Change::Upsert(svc.clone()),
            Change::Upsert(slice.clone()),
            Change::Upsert(pod.clone()),
        ];
        assert_eq!(
            stages_of(entering.clone(), &view),
            [[Kind::Pod], [Kind::EndpointSlice], [Kind::Service]]
        );
        view.apply(entering, Instant::now());
        // Served already, a change of the Service goes with its endpoints.
        assert_eq!(
            stages_of(
                vec![Change::Upsert(svc.clone()), Change::Upsert(slice.clone())],
                &view
            ),
            [[Kind::Service, Kind::EndpointSlice]]
        );
        let leaving = vec![
            Change::Delete(pod.key()),
            Change::Delete(slice.key()),
            Change::Delete(svc.key()),
        ];
        assert_eq!(
            stages_of(leaving, &view),
            [[Kind::Service], [Kind::EndpointSlice], [Kind::Pod]]
        );
    }

    /// Each stage that produced events is followed by the next only `LEAD` later; a stage of
    /// no-ops costs no wait; unstaged, everything goes at once.
    #[tokio::test(start_paused = true)]
    async fn a_stage_waits_only_behind_one_that_produced_events() {
        let view = View::new(1, 100);
        let pod = mk_pod("a-1", "Running");
        let slice = mk_slice("a", "a-x", &[(1, true)]);
        let now = Instant::now();
        let all = |v: &View| {
            split(
                vec![Change::Upsert(slice.clone()), Change::Upsert(pod.clone())],
                v,
            )
        };
        let (tail, produced) = apply(&view, all(&view), now, true, LEAD, |_| true);
        assert!(produced);
        let tail = tail.expect("the slice waits for its pod");
        assert_eq!(tail.due, now + LEAD);
        assert_eq!(view.len(Kind::Pod), 1);
        assert_eq!(view.len(Kind::EndpointSlice), 0);
        let (rest, _) = apply(&view, tail.stages, tail.due, true, LEAD, |_| true);
        assert!(rest.is_none());
        assert_eq!(view.len(Kind::EndpointSlice), 1);
        // The pod is served as it is: its stage is a no-op, the slice's change goes at once.
        let changed = mk_slice("a", "a-x", &[(1, false)]);
        let stages = split(
            vec![Change::Upsert(changed), Change::Upsert(pod.clone())],
            &view,
        );
        assert_eq!(stages.len(), 2);
        let (rest, produced) = apply(&view, stages, now, true, LEAD, |_| true);
        assert!(rest.is_none() && produced);
        // Unstaged: every stage at once.
        let other = View::new(2, 100);
        let (rest, _) = apply(&other, all(&other), now, false, LEAD, |_| true);
        assert!(rest.is_none());
        assert_eq!(other.len(Kind::EndpointSlice), 1);
    }
}
