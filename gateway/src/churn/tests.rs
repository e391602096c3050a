//! The engine's behaviour, in paused time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use floodgate_link_crd::{AutoRelease, KubeDuration, LinkSpec, Phase, RemoteSpec};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::broadcast;
use tokio::time::{self, Instant};

use super::quarantine::{RequestError, State, StateName};
use super::{Answer, Change, Effect, Engine, Fetch, Fetched};
use crate::model::{Kind, NsName, ObjKey, Object, SERVICE_NAME_LABEL, SliceObject};
use crate::view::{Event, View};

pub(crate) fn mk_spec() -> LinkSpec {
    LinkSpec::with_remote(RemoteSpec {
        kubeconfig_path: Some("/k".into()),
        ..RemoteSpec::default()
    })
}

fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("ns".into()),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        ),
        resource_version: Some("123".into()),
        ..Default::default()
    }
}

pub(crate) fn mk_service(name: &str, exported: bool) -> Object {
    let labels: &[(&str, &str)] = if exported {
        &[("mirror.linkerd.io/exported", "true")]
    } else {
        &[]
    };
    Object::Service(Arc::new(Service {
        metadata: meta(name, labels),
        ..Default::default()
    }))
}

/// A slice of `svc` whose endpoints are 10.<n>.x.y with ready flags; each points at pod `<svc>-<i>`.
pub(crate) fn mk_slice(svc: &str, name: &str, eps: &[(u32, bool)]) -> Object {
    Object::EndpointSlice(
        Arc::new(SliceObject::from(EndpointSlice {
            address_type: "IPv4".into(),
            metadata: meta(name, &[(SERVICE_NAME_LABEL, svc)]),
            endpoints: Some(
                eps.iter()
                    .map(|(i, ready)| Endpoint {
                        addresses: vec![format!("10.0.{}.{}", i / 256, i % 256)],
                        conditions: Some(EndpointConditions {
                            ready: Some(*ready),
                            ..Default::default()
                        }),
                        target_ref: Some(ObjectReference {
                            kind: Some("Pod".into()),
                            name: Some(format!("{svc}-{i}")),
                            namespace: Some("ns".into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ports: None,
        }))
        .into(),
    )
}

pub(crate) fn mk_pod(name: &str, phase: &str) -> Object {
    Object::Pod(Arc::new(
        Pod {
            metadata: meta(name, &[]),
            status: Some(k8s_openapi::api::core::v1::PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
        .into(),
    ))
}

/// A running pod whose `Ready` condition is `ready`.
pub(crate) fn mk_ready_pod(name: &str, ready: bool) -> Object {
    Object::Pod(Arc::new(
        Pod {
            metadata: meta(name, &[]),
            status: Some(k8s_openapi::api::core::v1::PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
        .into(),
    ))
}

/// A running pod whose `Ready` condition is `ready`, controlled by ReplicaSet `rs`.
pub(crate) fn mk_owned_pod(name: &str, rs: &str, ready: bool) -> Object {
    let Object::Pod(p) = mk_ready_pod(name, ready) else {
        unreachable!("a pod")
    };
    let mut pod = p.to_pod();
    pod.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: rs.into(),
            uid: format!("uid-{rs}"),
            controller: Some(true),
            ..Default::default()
        },
    ]);
    Object::Pod(Arc::new(pod.into()))
}

const KINDS: [Kind; 3] = [Kind::Service, Kind::EndpointSlice, Kind::Pod];

/// An engine whose first sync delivered `objects`.
fn synced(spec: &LinkSpec, objects: Vec<Object>) -> Engine {
    let now = Instant::now();
    let mut e = Engine::new(spec, &KINDS, View::new(1, 100_000), now);
    relist(&mut e, objects);
    e.poll(now);
    e
}

/// Lists `objects` kind by kind in the order the upstream lists them (services, slices, then
/// pods), as one relist.
fn relist(e: &mut Engine, objects: Vec<Object>) {
    let now = Instant::now();
    for k in KINDS {
        e.ingest(Change::InitStart(k), now);
    }
    for k in KINDS {
        for o in objects.iter().filter(|o| o.kind() == k) {
            e.ingest(Change::Apply(o.clone()), now);
        }
        e.ingest(Change::InitDone(k), now);
    }
}

/// Advances paused time in `step`s up to `total`, polling on the way, and returns the view's
/// events with the instant each was published.
async fn run(e: &mut Engine, total: Duration, step: Duration) -> Vec<(Instant, Event)> {
    let mut feeds = Feeds::of(e.view());
    let mut out = Vec::new();
    let end = Instant::now() + total;
    while Instant::now() < end {
        time::advance(step).await;
        e.poll(Instant::now());
        out.extend(feeds.drain().into_iter().map(|ev| (Instant::now(), ev)));
    }
    out
}

/// [`run`] against a remote that has none of the pods the engine fetches: each fetch is
/// answered absent at once, as the link would pass on the remote's 404s.
async fn run_lacking_pods(e: &mut Engine, total: Duration, step: Duration) {
    let end = Instant::now() + total;
    while Instant::now() < end {
        time::advance(step).await;
        e.poll(Instant::now());
        lack_pods(e);
        e.poll(Instant::now());
    }
}

/// Answers the pod fetches asked so far as a remote that lacks those pods does (absent),
/// leaving the other effects to the test.
pub(crate) fn lack_pods(e: &mut Engine) {
    let now = Instant::now();
    let (fetches, rest): (Vec<Effect>, Vec<Effect>) = std::mem::take(&mut e.effects)
        .into_iter()
        .partition(|f| matches!(f, Effect::FetchPods(_)));
    e.effects = rest;
    for f in fetches {
        if let Effect::FetchPods(f) = f {
            for pod in &f.pods {
                e.ingest(answer(std::slice::from_ref(&f), pod, Answer::Absent), now);
            }
        }
    }
}

/// Receivers of every kind's feed of a view (it has one per kind).
struct Feeds(Vec<broadcast::Receiver<Event>>);

impl Feeds {
    fn of(view: &View) -> Self {
        Self(Kind::ALL.map(|k| view.list_and_watch(k).1).into())
    }

    /// The events queued on every feed, in the order the view published them.
    fn drain(&mut self) -> Vec<Event> {
        let mut events: Vec<Event> = self
            .0
            .iter_mut()
            .flat_map(|rx| std::iter::from_fn(|| rx.try_recv().ok()))
            .collect();
        events.sort_by_key(|ev| ev.resource_version);
        events
    }
}

/// The fetches asked for in the effects the engine had.
pub(crate) fn take_fetches(e: &mut Engine) -> Vec<Fetch> {
    e.take_effects()
        .into_iter()
        .filter_map(|f| match f {
            Effect::FetchPods(f) => Some(f),
            _ => None,
        })
        .collect()
}

/// The answer to `pod`, asked for in one of `asked`, under that fetch's ticket.
pub(crate) fn answer(asked: &[Fetch], pod: &NsName, answer: Answer) -> Change {
    let f = (asked.iter())
        .find(|f| f.pods.contains(pod))
        .unwrap_or_else(|| panic!("{pod} was not asked for"));
    Change::Fetched(Fetched {
        ticket: f.ticket,
        pod: pod.clone(),
        answer,
    })
}

/// The answer that finds `obj`, a pod asked for in one of `asked`.
pub(crate) fn found(asked: &[Fetch], obj: Object) -> Change {
    answer(asked, &obj.key().id, Answer::Found(obj))
}

fn apply(e: &mut Engine, o: Object) {
    e.ingest(Change::Apply(o), Instant::now());
}

#[tokio::test(start_paused = true)]
async fn the_first_sync_is_published_at_once_and_whole() {
    let mut spec = mk_spec();
    spec.rate_limit.per_link.updates_per_second = 1;
    spec.rate_limit.per_link.burst = 1;
    spec.rate_limit.per_service = spec.rate_limit.per_link;
    let objects: Vec<Object> = (0..200)
        .map(|i| mk_service(&format!("s{i}"), true))
        .collect();
    let e = synced(&spec, objects);
    assert!(e.synced_once());
    assert_eq!(
        e.view().len(Kind::Service),
        200,
        "a budget of 1/s does not slow the first sync"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&e.view().list(Kind::Service).items[0].json()).expect("json");
    assert_ne!(
        json["metadata"]["resourceVersion"], "123",
        "upstream versions are replaced"
    );
}

#[tokio::test(start_paused = true)]
async fn nothing_is_published_before_every_kind_has_synced() {
    let now = Instant::now();
    let mut e = Engine::new(&mk_spec(), &KINDS, View::new(1, 100), now);
    e.ingest(Change::InitStart(Kind::Service), now);
    e.ingest(Change::Apply(mk_service("a", true)), now);
    e.ingest(Change::InitDone(Kind::Service), now);
    e.poll(now);
    assert!(e.view().is_empty());
    assert!(!e.synced_once());
}

/// Guarantee 1: over any window, publications stay within the GCRA bounds of both buckets.
#[tokio::test(start_paused = true)]
async fn neither_budget_is_exceeded_over_any_window() {
    let mut spec = mk_spec();
    spec.coalesce.quiet = KubeDuration::from_millis(1);
    spec.coalesce.max = KubeDuration::from_millis(1);
    let services: Vec<String> = (0..40).map(|i| format!("s{i}")).collect();
    let mut objects: Vec<Object> = services.iter().map(|s| mk_service(s, true)).collect();
    objects.extend(
        services
            .iter()
            .map(|s| mk_slice(s, &format!("{s}-1"), &[(1, true)])),
    );
    let mut e = synced(&spec, objects);
    let mut rx = e.view().list_and_watch(Kind::EndpointSlice).1;
    let mut times: Vec<(Instant, String)> = Vec::new();
    for round in 0..300u32 {
        for s in &services {
            apply(&mut e, mk_slice(s, &format!("{s}-1"), &[(round, true)]));
        }
        time::advance(Duration::from_millis(10)).await;
        e.poll(Instant::now());
        lack_pods(&mut e);
        e.poll(Instant::now());
        while let Ok(ev) = rx.try_recv() {
            let name = ev.object.object.meta().name.clone().unwrap_or_default();
            times.push((Instant::now(), name));
        }
    }
    assert!(
        times.len() > 100,
        "the flood does get published: {} {:?}",
        times.len(),
        e.counters()
    );
    let check = |times: &[Instant], rate: f64, burst: usize, what: &str| {
        for (i, start) in times.iter().enumerate() {
            for window_ms in [10u64, 100, 1000, 3000] {
                let end = *start + Duration::from_millis(window_ms);
                let n = times[i..].iter().take_while(|t| **t < end).count();
                let bound = burst + (rate * window_ms as f64 / 1000.0).ceil() as usize;
                assert!(
                    n <= bound,
                    "{what}: {n} publications in {window_ms}ms > {bound}"
                );
            }
        }
    };
    let all: Vec<Instant> = times.iter().map(|(t, _)| *t).collect();
    check(&all, 50.0, 100, "link");
    let one: Vec<Instant> = times
        .iter()
        .filter(|(_, n)| n == "s0-1")
        .map(|(t, _)| *t)
        .collect();
    check(&one, 5.0, 10, "service s0");
    assert_eq!(e.phase(), Phase::Throttled);
}

/// Fairness: while one service floods, a calm service's change goes out within its window.
#[tokio::test(start_paused = true)]
async fn a_hot_service_does_not_starve_a_calm_one() {
    let mut objects = vec![mk_service("hot", true), mk_service("calm", true)];
    objects.push(mk_slice("hot", "hot-1", &[(1, true)]));
    objects.push(mk_slice("calm", "calm-1", &[(2, true)]));
    let mut e = synced(&mk_spec(), objects);
    let mut rx = e.view().list_and_watch(Kind::EndpointSlice).1;
    let mut calm_seen = None;
    let mut changed_at = None;
    for tick in 0..400u32 {
        for i in 0..20 {
            apply(
                &mut e,
                mk_slice("hot", "hot-1", &[(1, (tick + i).is_multiple_of(2))]),
            );
        }
        if tick == 200 {
            apply(&mut e, mk_slice("calm", "calm-1", &[(2, false)]));
            changed_at = Some(Instant::now());
        }
        time::advance(Duration::from_millis(10)).await;
        e.poll(Instant::now());
        lack_pods(&mut e);
        e.poll(Instant::now());
        while let Ok(ev) = rx.try_recv() {
            if ev.object.object.meta().name.as_deref() == Some("calm-1") && calm_seen.is_none() {
                calm_seen = Some(Instant::now());
            }
        }
    }
    let lag = calm_seen
        .zip(changed_at)
        .map(|(s, c)| s - c)
        .expect("calm change published");
    assert!(
        lag <= Duration::from_millis(200),
        "calm change waited {lag:?}"
    );
}

/// Cap stickiness: churn among endpoints beyond the cap changes nothing downstream.
#[tokio::test(start_paused = true)]
async fn churn_beyond_the_cap_publishes_nothing() {
    let mut spec = mk_spec();
    spec.caps.max_endpoints_per_service = 3;
    let eps: Vec<(u32, bool)> = (0..10).map(|i| (i, i < 3)).collect();
    let mut e = synced(
        &spec,
        vec![mk_service("a", true), mk_slice("a", "a-1", &eps)],
    );
    assert_eq!(e.counters().endpoints_published, 3);
    assert_eq!(e.counters().endpoints_truncated, 7);
    let rv = e.view().resource_version();
    for round in 0..20u32 {
        // Not-ready endpoints 3..10 flap between two not-ready states (serving toggles).
        let eps: Vec<(u32, bool)> = (0..10).map(|i| (i, i < 3)).collect();
        let mut slice = mk_slice("a", "a-1", &eps);
        if let Object::EndpointSlice(s) = &mut slice {
            let mut typed = s.to_slice();
            for ep in typed.endpoints.iter_mut().flatten().skip(3) {
                ep.conditions.get_or_insert_default().serving = Some(round.is_multiple_of(2));
            }
            *s = SliceObject::from(typed).into();
        }
        apply(&mut e, slice);
        time::advance(Duration::from_millis(150)).await;
        e.poll(Instant::now());
    }
    assert_eq!(
        e.view().resource_version(),
        rv,
        "withheld endpoints churned; consumers saw nothing"
    );
}

/// A flood of pods behind an unselected service reaches nobody and is not stored.
#[tokio::test(start_paused = true)]
async fn pods_of_unselected_services_are_neither_stored_nor_published() {
    let mut e = synced(
        &mk_spec(),
        vec![mk_service("web", true), mk_service("bad", false)],
    );
    let held = e.objects_held();
    for i in 0..5000 {
        apply(&mut e, mk_pod(&format!("bad-{i}"), "CrashLoopBackOff"));
    }
    apply(&mut e, mk_slice("bad", "bad-1", &[(1, false), (2, false)]));
    let events = run(&mut e, Duration::from_secs(2), Duration::from_millis(100)).await;
    assert!(events.is_empty());
    assert_eq!(e.view().len(Kind::Pod), 0);
    assert_eq!(e.objects_held(), held + 1, "only the slice is kept, no pod");
    // 5000 pods, the slice, and the unselected service listed at sync.
    assert_eq!(e.counters().irrelevant_events, 5002);
}

/// Pods pointed at by published endpoints are served with the slice.
#[tokio::test(start_paused = true)]
async fn pods_behind_published_endpoints_are_served() {
    let mut e = synced(
        &mk_spec(),
        vec![
            mk_service("web", true),
            mk_slice("web", "web-1", &[(1, true)]),
        ],
    );
    apply(&mut e, mk_pod("web-1", "Running"));
    apply(&mut e, mk_pod("other", "Running"));
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert!(
        e.view()
            .get(&ObjKey {
                kind: Kind::Pod,
                id: NsName::new("ns", "web-1")
            })
            .is_some()
    );
    assert!(
        e.view()
            .get(&ObjKey {
                kind: Kind::Pod,
                id: NsName::new("ns", "other")
            })
            .is_none()
    );
}

/// What a service publishes is the object the store holds, shared, not a copy: a slice
/// (deflated by the store) and a pod (the object upstream gave) are each held once, for the
/// engine's store and the view (which writes their served JSON from them).
#[tokio::test(start_paused = true)]
async fn a_published_slice_and_pod_are_the_objects_held() {
    let slice = mk_slice("web", "web-a", &[(1, true)]);
    let pod = mk_pod("web-1", "Running");
    let mut e = synced(&mk_spec(), vec![mk_service("web", true), slice.clone()]);
    apply(&mut e, pod.clone());
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    let Object::EndpointSlice(given) = &slice else {
        unreachable!("mk_slice makes slices")
    };
    let svc = given.service().expect("mk_slice names a service");
    let held = e.store.slices_of(&svc)[0].clone();
    assert!(
        held.dictionary().is_some() && held == *given,
        "the store holds the slice deflated, as it was given"
    );
    let held = Object::EndpointSlice(held);
    for (o, held) in [(&slice, &held), (&pod, &pod)] {
        let served = e.view().get(&o.key()).expect("published");
        let shared = match (&served.object, held) {
            (Object::EndpointSlice(a), Object::EndpointSlice(b)) => a.shares(b),
            (Object::Pod(a), Object::Pod(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        assert!(shared, "the {:?} is shared, not copied", o.kind());
    }
}

/// A relist that changes nothing publishes nothing (no spurious DELETE/ADD).
#[tokio::test(start_paused = true)]
async fn a_relist_without_changes_publishes_nothing() {
    let objects = vec![
        mk_service("a", true),
        mk_slice("a", "a-1", &[(1, true)]),
        mk_service("b", true),
    ];
    let mut e = synced(&mk_spec(), objects.clone());
    let rv = e.view().resource_version();
    relist(&mut e, objects);
    run(&mut e, Duration::from_secs(3), Duration::from_millis(100)).await;
    assert_eq!(e.view().resource_version(), rv);
    // An object missing from a relist is deleted.
    relist(
        &mut e,
        vec![mk_service("a", true), mk_slice("a", "a-1", &[(1, true)])],
    );
    run(&mut e, Duration::from_secs(3), Duration::from_millis(100)).await;
    assert_eq!(e.view().len(Kind::Service), 1);
}

/// The link's watchers relist one kind at a time, in any order (each its own `InitStart`,
/// objects, `InitDone`), and pods, which arrive by every kind's watcher or by fetch, too: a
/// relist that changes nothing publishes nothing, whatever the order.
#[tokio::test(start_paused = true)]
async fn a_relist_kind_by_kind_without_changes_publishes_nothing() {
    let objects = vec![
        mk_service("web", true),
        mk_slice("web", "web-1", &[(1, true), (2, true)]),
        mk_pod("web-1", "Running"),
        mk_pod("web-2", "Running"),
        mk_pod("other", "Running"),
        mk_service("hidden", false),
    ];
    let orders = [
        [Kind::Service, Kind::EndpointSlice, Kind::Pod],
        [Kind::Pod, Kind::EndpointSlice, Kind::Service],
        [Kind::EndpointSlice, Kind::Pod, Kind::Service],
        [Kind::Service, Kind::Pod, Kind::EndpointSlice],
    ];
    for order in orders {
        let mut e = synced(&mk_spec(), objects.clone());
        run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
        let rv = e.view().resource_version();
        for kind in order {
            let now = Instant::now();
            e.ingest(Change::InitStart(kind), now);
            for o in objects.iter().filter(|o| o.key().kind == kind) {
                e.ingest(Change::Apply(o.clone()), now);
            }
            e.ingest(Change::InitDone(kind), now);
            run(
                &mut e,
                Duration::from_millis(300),
                Duration::from_millis(50),
            )
            .await;
        }
        run(&mut e, Duration::from_secs(3), Duration::from_millis(100)).await;
        assert_eq!(e.view().resource_version(), rv, "relisted in {order:?}");
    }
}

/// A slice update that keeps pointing at a pod keeps that pod held and served (regression:
/// releasing the old slice's references first dropped every pod on each slice update).
#[tokio::test(start_paused = true)]
async fn pods_stay_served_across_slice_updates() {
    let mut e = synced(
        &mk_spec(),
        vec![
            mk_service("web", true),
            mk_slice("web", "web-1", &[(1, true)]),
            mk_pod("web-1", "Running"),
        ],
    );
    let pod = ObjKey {
        kind: Kind::Pod,
        id: NsName::new("ns", "web-1"),
    };
    assert!(e.view().get(&pod).is_some());
    apply(&mut e, mk_slice("web", "web-1", &[(1, false)]));
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert!(
        e.view().get(&pod).is_some(),
        "the pod is still behind the slice"
    );
    apply(&mut e, mk_slice("web", "web-1", &[(2, true)]));
    run_lacking_pods(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert!(
        e.view().get(&pod).is_none(),
        "no endpoint points at it any more"
    );
}

mod config;
mod contain;
mod order;
mod prop;
mod publish;
mod quarantine;
mod removal;
mod resolve;
mod schedule;
