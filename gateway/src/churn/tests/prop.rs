//! The engine's contract under arbitrary input (proptest): for any sequence of upstream
//! changes, a contained service's endpoints never change downstream once it has published;
//! every endpoint served as ready, contained or not, has its pod served soon after the pod
//! exists upstream (the consumer resolves it: guarantee 7); once input stops every
//! service that is not contained converges exactly to the selected upstream state, a contained
//! one serves exactly the pods its frozen endpoints name, as upstream holds them but for
//! their status (whose churn waits with the endpoints'), and
//! publications never exceed the link's budget over any window.
//!
//! And the order a consumer receives them in (guarantee 9), event by event as a consumer that
//! follows every kind applies them ([`Order`]): no slice version names as ready a pod that
//! exists upstream and was not published, [`LEAD`] earlier at least, at a lower version; no pod
//! that exists upstream is withdrawn while a slice served names it as ready.
//!
//! The expected state comes from an independent model: a map of upstream objects and the rules
//! of DESIGN.md written out directly (a selected service, every slice of it, the pods its
//! endpoints point at), not from the engine's own indexes. Pod fetches the engine asks for are
//! answered from the model, as the link does from the remote.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::{self, Instant};

use super::*;
use crate::churn::publish::stages::LEAD;
use crate::view::EventType;

const SERVICES: [&str; 3] = ["a", "b", "c"];
const SLICES: [&str; 2] = ["x", "y"];

#[derive(Clone, Debug)]
enum Op {
    Service {
        svc: usize,
        exported: bool,
    },
    DeleteService {
        svc: usize,
    },
    Slice {
        svc: usize,
        slice: usize,
        eps: Vec<(u32, bool)>,
    },
    DeleteSlice {
        svc: usize,
        slice: usize,
    },
    Pod {
        svc: usize,
        i: u32,
        running: bool,
    },
    DeletePod {
        svc: usize,
        i: u32,
    },
    Wait {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let svc = 0..SERVICES.len();
    prop_oneof![
        (svc.clone(), any::<bool>()).prop_map(|(svc, exported)| Op::Service { svc, exported }),
        svc.clone().prop_map(|svc| Op::DeleteService { svc }),
        (
            svc.clone(),
            0..SLICES.len(),
            proptest::collection::vec((0u32..8, any::<bool>()), 0..6)
        )
            .prop_map(|(svc, slice, eps)| Op::Slice { svc, slice, eps }),
        (svc.clone(), 0..SLICES.len()).prop_map(|(svc, slice)| Op::DeleteSlice { svc, slice }),
        (svc.clone(), 0u32..8, any::<bool>()).prop_map(|(svc, i, running)| Op::Pod {
            svc,
            i,
            running
        }),
        (svc, 0u32..8).prop_map(|(svc, i)| Op::DeletePod { svc, i }),
        (0u64..1500).prop_map(|ms| Op::Wait { ms }),
    ]
}

fn slice_name(svc: usize, slice: usize) -> String {
    format!("{}-{}", SERVICES[svc], SLICES[slice])
}

/// Upstream as the model sees it.
#[derive(Default)]
struct Remote {
    objects: BTreeMap<ObjKey, Object>,
    /// When each pod upstream was created (its last creation).
    born: BTreeMap<ObjKey, Instant>,
}

impl Remote {
    fn change(&mut self, op: &Op) -> Option<Change> {
        let obj = match op {
            Op::Service { svc, exported } => mk_service(SERVICES[*svc], *exported),
            Op::Slice { svc, slice, eps } => {
                mk_slice(SERVICES[*svc], &slice_name(*svc, *slice), eps)
            }
            Op::Pod { svc, i, running } => mk_pod(
                &format!("{}-{i}", SERVICES[*svc]),
                if *running { "Running" } else { "Pending" },
            ),
            Op::DeleteService { svc } => return self.delete(Kind::Service, SERVICES[*svc]),
            Op::DeleteSlice { svc, slice } => {
                return self.delete(Kind::EndpointSlice, &slice_name(*svc, *slice));
            }
            Op::DeletePod { svc, i } => {
                return self.delete(Kind::Pod, &format!("{}-{i}", SERVICES[*svc]));
            }
            Op::Wait { .. } => return None,
        };
        if self.objects.insert(obj.key(), obj.clone()).is_none() && obj.kind() == Kind::Pod {
            self.born.insert(obj.key(), Instant::now());
        }
        Some(Change::Apply(obj))
    }

    fn delete(&mut self, kind: Kind, name: &str) -> Option<Change> {
        let key = ObjKey {
            kind,
            id: NsName::new("ns", name),
        };
        self.objects.remove(&key).map(|_| Change::Delete(key))
    }

    /// What consumers must see: selected services, all their slices (the cap is out of reach
    /// here), and the pods those slices' ready endpoints point at that exist. Second, the
    /// pods only not-ready endpoints point at: consumers resolve none of them, so they may be
    /// served (a pod once served stays while its endpoint does) or not, but when served it is
    /// as upstream holds it.
    fn expected(&self) -> (BTreeMap<ObjKey, Object>, BTreeMap<ObjKey, Object>) {
        let mut optional = BTreeMap::new();
        let mut out = BTreeMap::new();
        for (key, obj) in &self.objects {
            let Object::Service(s) = obj else { continue };
            let exported = s
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.get("mirror.linkerd.io/exported").is_some());
            if !exported {
                continue;
            }
            out.insert(key.clone(), obj.clone());
            for (k, o) in &self.objects {
                let Object::EndpointSlice(slice) = o else {
                    continue;
                };
                if slice.service().as_ref().map(|s| &*s.name) != Some(&*key.id.name) {
                    continue;
                }
                out.insert(k.clone(), o.clone());
                for (pod, ready) in slice.pod_refs_ready() {
                    let pk = ObjKey {
                        kind: Kind::Pod,
                        id: pod,
                    };
                    if let Some(p) = self.objects.get(&pk) {
                        if ready {
                            out.insert(pk, p.clone());
                        } else {
                            optional.insert(pk, p.clone());
                        }
                    }
                }
            }
        }
        optional.retain(|k, _| !out.contains_key(k));
        let sanitized = |m: BTreeMap<ObjKey, Object>| -> BTreeMap<ObjKey, Object> {
            m.into_iter()
                .map(|(k, o)| (k, o.into_sanitized()))
                .collect()
        };
        (sanitized(out), sanitized(optional))
    }

    /// Answers the engine's pod fetches, and follows containments: a contained service's
    /// published objects are taken once it has published, then must never change.
    fn answer(&self, e: &mut Engine, now: Instant, contained: &mut Frozen) {
        let effects = e.take_effects();
        for effect in &effects {
            if let Effect::Transition(t) = effect
                && let Some(svc) = &t.service
            {
                if t.to == StateName::Contained {
                    contained.entry(svc.name.to_string()).or_insert(None);
                } else if t.to == StateName::Active {
                    contained.remove(&*svc.name);
                }
            }
        }
        for (svc, snap) in contained.iter_mut() {
            let mut current = of_service(&published(e), svc);
            // Frozen are its endpoints; its pods are kept current (guarantee 7).
            current.retain(|k, _| !matches!(k.kind, Kind::Pod | Kind::ReplicaSet));
            // Taken once its publication is whole: a Service enters after its slices, and a
            // publication's later stages go out after its first.
            let g = crate::model::Group::Service(NsName::new("ns", svc));
            let whole = current.keys().any(|k| k.kind == Kind::Service)
                && e.publisher.busy_until(&g).is_none();
            match snap {
                None if whole => *snap = Some(current),
                Some(before) => assert_eq!(&current, before, "contained {svc} changed"),
                None => {}
            }
        }
        for effect in effects {
            if let Effect::FetchPods(f) = effect {
                for id in &f.pods {
                    let key = ObjKey {
                        kind: Kind::Pod,
                        id: id.clone(),
                    };
                    let got = self.objects.get(&key);
                    let got = got.map_or(Answer::Absent, |p| Answer::Found(p.clone()));
                    e.ingest(answer(std::slice::from_ref(&f), id, got), now);
                }
            }
        }
    }
}

/// Contained services by name, with their published endpoints (the service and its slices)
/// once they have published.
type Frozen = BTreeMap<String, Option<BTreeMap<ObjKey, Object>>>;

/// True for the objects of one service: itself, its slices and its pods (named after it).
fn belongs(k: &ObjKey, svc: &str) -> bool {
    match k.kind {
        Kind::Service => &*k.id.name == svc,
        _ => k.id.name.starts_with(&format!("{svc}-")),
    }
}

fn of_service(objects: &BTreeMap<ObjKey, Object>, svc: &str) -> BTreeMap<ObjKey, Object> {
    objects
        .iter()
        .filter(|(k, _)| belongs(k, svc))
        .map(|(k, o)| (k.clone(), o.clone()))
        .collect()
}

/// The pods that ready endpoints served name, that exist upstream and are not served: what a
/// consumer resolving the view (as Linkerd's destination does) would drop.
fn unresolved(served: &BTreeMap<ObjKey, Object>, remote: &Remote) -> BTreeSet<ObjKey> {
    served
        .values()
        .filter_map(|o| match o {
            Object::EndpointSlice(s) => Some(s),
            _ => None,
        })
        .flat_map(|s| s.pod_refs_ready())
        .filter(|(_, ready)| *ready)
        .map(|(id, _)| ObjKey {
            kind: Kind::Pod,
            id,
        })
        .filter(|k| remote.objects.contains_key(k) && !served.contains_key(k))
        .collect()
}

/// How long a pod may be missing behind a ready endpoint served: the longest coalescing window
/// (2 s) and a token's wait on this spec's buckets, with room to spare. A pod never published
/// waits forever and fails this.
const RESOLVE_WITHIN: Duration = Duration::from_secs(6);

/// How long after a pod's creation upstream a slice naming it may still reach a consumer
/// before the pod: the slice was computed before the pod existed, and its stages (two leads,
/// each applied at the replay's next 50 ms step) were under way.
const BORN_WITHIN: Duration = Duration::from_millis(150);

/// A consumer that applies every event in version order, and what it saw out of order.
#[derive(Default)]
struct Order {
    /// Objects held, each with when it was first added (since its last deletion).
    held: BTreeMap<ObjKey, (Object, Instant)>,
    /// What broke the order, in words (the first few).
    broken: Vec<String>,
}

impl Order {
    fn apply(&mut self, ev: &Event, now: Instant, remote: &Remote) {
        let obj = &ev.object.object;
        let key = obj.key();
        if ev.kind == EventType::Deleted {
            if key.kind == Kind::Pod && remote.objects.contains_key(&key) {
                let naming = self.slices_naming(&key.id);
                if !naming.is_empty() {
                    self.broke(format!(
                        "{:?} withdrawn at {} while {naming:?} name it ready",
                        key.id, ev.resource_version
                    ));
                }
            }
            self.held.remove(&key);
            return;
        }
        if let Object::EndpointSlice(s) = obj {
            for (pod, ready) in s.pod_refs_ready() {
                let pk = ObjKey {
                    kind: Kind::Pod,
                    id: pod,
                };
                let born = remote
                    .born
                    .get(&pk)
                    .filter(|_| remote.objects.contains_key(&pk));
                if !ready || born.is_none_or(|b| now.duration_since(*b) <= BORN_WITHIN) {
                    continue;
                }
                match self.held.get(&pk) {
                    None => self.broke(format!(
                        "{:?} at {} names {:?} ready, not served",
                        key.id, ev.resource_version, pk.id
                    )),
                    Some((_, added)) if now.duration_since(*added) < LEAD => self.broke(format!(
                        "{:?} at {} names {:?} ready, served only {:?} before",
                        key.id,
                        ev.resource_version,
                        pk.id,
                        now.duration_since(*added)
                    )),
                    Some(_) => {}
                }
            }
        }
        let added = self.held.get(&key).map_or(now, |(_, t)| *t);
        self.held.insert(key, (obj.clone(), added));
    }

    fn slices_naming(&self, pod: &NsName) -> Vec<NsName> {
        (self.held.values())
            .filter_map(|(o, _)| match o {
                Object::EndpointSlice(s) => Some(s),
                _ => None,
            })
            .filter(|s| s.pod_refs_ready().into_iter().any(|(p, r)| r && &p == pod))
            .map(|s| s.id().clone())
            .collect()
    }

    fn broke(&mut self, what: String) {
        if self.broken.len() < 5 {
            self.broken.push(what);
        }
    }
}

fn published(e: &Engine) -> BTreeMap<ObjKey, Object> {
    let mut out = BTreeMap::new();
    for kind in KINDS {
        for s in e.view().list(kind).items {
            out.insert(s.object.key(), s.object.clone());
        }
    }
    out
}

/// Runs `ops`, then lets time pass, checking after every step what a consumer would resolve.
async fn replay(ops: &[Op]) -> Replayed {
    let mut spec = mk_spec();
    // A service with more than 6 upstream endpoints (about one in five) is contained.
    spec.quarantine.when.endpoints_per_service = 6;
    // Removals are held as a link-wide removal may follow (`removal.rs`), but never add up to
    // one here: every removal converges (a mass removal's quarantine is `tests/removal.rs`'s).
    spec.quarantine.when.removed_services = u32::MAX;
    // Small buckets, so the budget is what limits the replay.
    spec.rate_limit.per_link.updates_per_second = 4;
    spec.rate_limit.per_link.burst = 3;
    spec.rate_limit.per_service.updates_per_second = 2;
    spec.rate_limit.per_service.burst = 2;
    let mut e = synced(&spec, vec![]);
    // A consumer follows every kind, as Linkerd's destination does.
    let mut feeds = Feeds::of(e.view());
    let mut order = Order::default();
    let mut remote = Remote::default();
    let mut counts = vec![(Instant::now(), e.counters().downstream_updates)];
    let step = Duration::from_millis(50);
    let mut contained = Frozen::new();
    // Since when each unresolved pod has been missing, and the longest wait seen.
    let mut missing: BTreeMap<ObjKey, Instant> = BTreeMap::new();
    let mut longest: Option<(ObjKey, Duration)> = None;
    let mut tick = |e: &mut Engine, remote: &Remote| {
        let now = Instant::now();
        e.poll(now);
        remote.answer(e, now, &mut contained);
        e.poll(now);
        for ev in feeds.drain() {
            order.apply(&ev, now, remote);
        }
        counts.push((now, e.counters().downstream_updates));
        let now_missing = unresolved(&published(e), remote);
        missing.retain(|k, _| now_missing.contains(k));
        for k in now_missing {
            let since = *missing.entry(k.clone()).or_insert(now);
            let waited = now.duration_since(since);
            if longest.as_ref().is_none_or(|(_, d)| waited > *d) {
                longest = Some((k, waited));
            }
        }
    };
    for op in ops {
        if let Op::Wait { ms } = op {
            let end = Instant::now() + Duration::from_millis(*ms);
            while Instant::now() < end {
                time::advance(step).await;
                tick(&mut e, &remote);
            }
        } else if let Some(c) = remote.change(op) {
            e.ingest(c, Instant::now());
            tick(&mut e, &remote);
        }
    }
    // Input stops: every pending group gets its turn within its windows and tokens.
    for _ in 0..(60_000 / step.as_millis() as usize) {
        time::advance(step).await;
        tick(&mut e, &remote);
    }
    Replayed {
        engine: e,
        remote,
        counts,
        contained,
        longest_unresolved: longest,
        order: order.broken,
    }
}

/// What a replay leaves.
struct Replayed {
    engine: Engine,
    remote: Remote,
    /// The publication counter after every step, with its instant.
    counts: Vec<(Instant, u64)>,
    contained: Frozen,
    /// The pod that stayed longest unresolved behind a ready endpoint served, and how long.
    longest_unresolved: Option<(ObjKey, Duration)>,
    /// What a consumer following every kind saw out of order ([`Order`]).
    order: Vec<String>,
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
        .block_on(f)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn converges_to_upstream_within_the_budget(ops in proptest::collection::vec(op(), 1..60)) {
        let Replayed { engine: e, remote, counts, contained, longest_unresolved, order } =
            block_on(replay(&ops));
        // Guarantee 9: pods before the slices that name them, and after them on the way out.
        prop_assert!(order.is_empty(), "out of order: {:?}", order);
        // Guarantee 7, on every view published: a ready endpoint's pod is served soon after it
        // exists upstream, whether its service is contained or not.
        if let Some((pod, waited)) = &longest_unresolved {
            prop_assert!(
                *waited <= RESOLVE_WITHIN,
                "{:?} was missing behind a ready endpoint for {:?} (contained: {:?})",
                pod, waited, contained.keys().collect::<Vec<_>>()
            );
        }
        // Contained services keep what they froze (checked all along by `answer`); every
        // other service converges to upstream.
        let free = |k: &ObjKey| !contained.keys().any(|svc| belongs(k, svc));
        let (mut expected, optional) = remote.expected();
        expected.retain(|k, _| free(k));
        let mut got = published(&e);
        got.retain(|k, _| free(k));
        // A pod only not-ready endpoints point at: served as upstream holds it, or not at all.
        for (k, want) in &optional {
            if let Some(o) = got.remove(k) {
                prop_assert_eq!(&o, want, "{:?} is served, but not as upstream holds it", k);
            }
        }
        prop_assert_eq!(got, expected);
        // Over every window [t1, t2]: updates <= burst + rate * (t2 - t1).
        for (i, (t1, c1)) in counts.iter().enumerate() {
            for (t2, c2) in &counts[i..] {
                let secs = t2.duration_since(*t1).as_secs_f64();
                let allowed = 3.0 + 4.0 * secs;
                prop_assert!(
                    (c2 - c1) as f64 <= allowed + 1e-9,
                    "{} updates in {secs:.2}s, budget {allowed:.2}", c2 - c1
                );
            }
        }
        // A contained service serves exactly the pods its frozen endpoints name, as upstream
        // holds them: those of ready endpoints, and maybe those of not-ready ones.
        let all = published(&e);
        for svc in contained.keys() {
            let mine = of_service(&all, svc);
            let (mut required, mut maybe) = (BTreeSet::new(), BTreeSet::new());
            for o in mine.values() {
                if let Object::EndpointSlice(s) = o {
                    for (id, ready) in s.pod_refs_ready() {
                        let k = ObjKey { kind: Kind::Pod, id };
                        if remote.objects.contains_key(&k) {
                            if ready { required.insert(k) } else { maybe.insert(k) };
                        }
                    }
                }
            }
            for (k, o) in mine.iter().filter(|(k, _)| k.kind == Kind::Pod) {
                prop_assert!(
                    required.contains(k) || maybe.contains(k),
                    "contained {} serves {:?}, which no endpoint of it names upstream", svc, k
                );
                // Kept current in all but its status, which waits with the endpoints.
                let want = remote.objects[k].clone().into_sanitized();
                let current = matches!((o, &want), (Object::Pod(a), Object::Pod(b)) if a.same_but_status(b));
                prop_assert!(current, "contained {} serves {:?} stale: {:?}, upstream {:?}", svc, k, o, want);
            }
            for k in &required {
                prop_assert!(mine.contains_key(k), "contained {} lacks {:?}", svc, k);
            }
        }
        // No pod is invented.
        prop_assert!(all.keys().all(|k| k.kind != Kind::Pod || remote.objects.contains_key(k)));
    }
}
