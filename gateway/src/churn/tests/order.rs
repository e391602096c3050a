//! Guarantee 9 through the engine: what a consumer looks up when it handles an object reaches it
//! first, and a [`LEAD`] before: a pod before the slice that names it (fetched first when the pod
//! watcher skipped it), a slice's endpoint before its pod goes, a Service's Endpoints before the
//! Service enters. Each test follows the view as a consumer does (a watcher of every kind), so
//! publications are staged.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Endpoints, ServiceSpec};

use super::*;
use crate::churn::publish::AWAIT;
use crate::churn::publish::stages::{CAPPED_LEAD, LEAD};
use crate::churn::removal::QUIET;
use crate::model::EndpointsObject;
use crate::view::{Change as ViewChange, EventType};

/// The events a poll at `now` put out, as (kind, type, name).
fn polled(e: &mut Engine, feeds: &mut Feeds) -> Vec<(Kind, EventType, String)> {
    e.poll(Instant::now());
    feeds
        .drain()
        .into_iter()
        .map(|ev| {
            let key = ev.object.object.key();
            (key.kind, ev.kind, key.id.name.to_string())
        })
        .collect()
}

fn ev(kind: Kind, t: EventType, name: &str) -> (Kind, EventType, String) {
    (kind, t, name.to_owned())
}

/// A synced engine serving `web` with pod web-1 behind a ready endpoint, followed by `feeds`,
/// quiet since (its first sync's changes open no coalescing window any more).
async fn serving_web() -> (Engine, Feeds) {
    let e = synced(
        &mk_spec(),
        vec![
            mk_service("web", true),
            mk_slice("web", "web-x", &[(1, true)]),
            mk_ready_pod("web-1", true),
        ],
    );
    let feeds = Feeds::of(e.view());
    time::advance(Duration::from_secs(1)).await;
    (e, feeds)
}

/// A scale-up in a real cluster's order: the new pod first (skipped: no endpoint names it
/// yet), then the slice naming it. The slice waits while the pod is fetched; the pod goes out,
/// and the slice `LEAD` later.
#[tokio::test(start_paused = true)]
async fn a_new_pod_goes_out_a_lead_before_the_slice_that_names_it() {
    let (mut e, mut feeds) = serving_web().await;
    let pod = mk_ready_pod("web-2", true);
    apply(&mut e, pod.clone());
    assert!(polled(&mut e, &mut feeds).is_empty(), "nothing names it");
    apply(&mut e, mk_slice("web", "web-x", &[(1, true), (2, true)]));
    assert!(
        polled(&mut e, &mut feeds).is_empty(),
        "the slice waits for its pod"
    );
    let asked = take_fetches(&mut e);
    assert_eq!(asked.len(), 1, "web-2 is fetched");
    e.ingest(found(&asked, pod), Instant::now());
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::Pod, EventType::Added, "web-2")],
        "the pod first"
    );
    time::advance(LEAD - Duration::from_millis(1)).await;
    assert!(polled(&mut e, &mut feeds).is_empty(), "not before the lead");
    time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::EndpointSlice, EventType::Modified, "web-x")]
    );
}

/// A synced engine serving `web` (under its cap) with pod web-1 of ReplicaSet `web-rs`.
async fn serving_web_of_a_replicaset(spec: &LinkSpec) -> (Engine, Feeds) {
    let e = synced(
        spec,
        vec![
            mk_service("web", true),
            mk_slice("web", "web-x", &[(1, true)]),
            mk_owned_pod("web-1", "web-rs", true),
        ],
    );
    let feeds = Feeds::of(e.view());
    time::advance(Duration::from_secs(1)).await;
    (e, feeds)
}

/// A scale-up step of a service under its cap: its ReplicaSet's new pod is held as it comes
/// ready, before any endpoint names it, so the slice that names it asks no fetch: the pod goes
/// out at once and the slice a `LEAD` later. A new pod not ready yet is not held.
#[tokio::test(start_paused = true)]
async fn a_new_ready_pod_of_a_served_replicaset_is_held_before_its_slice_names_it() {
    let (mut e, mut feeds) = serving_web_of_a_replicaset(&mk_spec()).await;
    apply(&mut e, mk_owned_pod("web-3", "web-rs", false));
    apply(&mut e, mk_owned_pod("web-2", "web-rs", true));
    assert!(polled(&mut e, &mut feeds).is_empty(), "nothing names them");
    assert!(e.store.pod(&NsName::new("ns", "web-2")).is_some(), "held");
    assert!(
        e.store.pod(&NsName::new("ns", "web-3")).is_none(),
        "not ready"
    );
    apply(&mut e, mk_slice("web", "web-x", &[(1, true), (2, true)]));
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::Pod, EventType::Added, "web-2")],
        "the pod first"
    );
    assert!(take_fetches(&mut e).is_empty(), "no fetch");
    time::advance(LEAD - Duration::from_millis(1)).await;
    assert!(polled(&mut e, &mut feeds).is_empty(), "not before the lead");
    time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::EndpointSlice, EventType::Modified, "web-x")]
    );
}

/// A capped service's ReplicaSet is not followed: a flood of its ready pods costs their
/// decoding, no store, and a pod its kept endpoints come to name is fetched. Once the service
/// is under its cap no more, the pods held ahead of it leave the store.
#[tokio::test(start_paused = true)]
async fn a_capped_services_new_pods_are_not_held_ahead() {
    let mut spec = mk_spec();
    spec.caps.max_endpoints_per_service = 2;
    let (mut e, mut feeds) = serving_web_of_a_replicaset(&spec).await;
    apply(&mut e, mk_owned_pod("web-2", "web-rs", true));
    assert!(e.store.pod(&NsName::new("ns", "web-2")).is_some(), "held");
    // Three ready endpoints: over the cap of 2.
    apply(&mut e, mk_owned_pod("web-3", "web-rs", true));
    apply(
        &mut e,
        mk_slice("web", "web-x", &[(1, true), (2, true), (3, true)]),
    );
    polled(&mut e, &mut feeds);
    time::advance(Duration::from_secs(1)).await;
    polled(&mut e, &mut feeds);
    take_fetches(&mut e);
    apply(&mut e, mk_owned_pod("web-4", "web-rs", true));
    assert!(
        e.store.pod(&NsName::new("ns", "web-4")).is_none(),
        "capped: not held"
    );
    assert!(
        e.store.pod(&NsName::new("ns", "web-3")).is_none(),
        "held ahead, named by no kept endpoint: dropped with its ReplicaSet"
    );
}

/// A view taken over (a follower becoming the holder) follows its services' ReplicaSets again
/// at once, not only once each group republishes: the next scale-up's pod is held ahead.
#[tokio::test(start_paused = true)]
async fn a_view_taken_over_holds_its_replicasets_new_pods_ahead_at_once() {
    let (mut e, _feeds) = serving_web_of_a_replicaset(&mk_spec()).await;
    e.set_following();
    e.adopt_view();
    apply(&mut e, mk_owned_pod("web-2", "web-rs", true));
    assert!(e.store.pod(&NsName::new("ns", "web-2")).is_some(), "held");
}

/// A pod held ahead while this replica decided, whose service left the view it followed since,
/// leaves the store when the view is taken over: nothing published wants it any more.
#[tokio::test(start_paused = true)]
async fn pods_held_ahead_of_a_service_gone_meanwhile_leave_the_store_at_a_take_over() {
    let (mut e, _feeds) = serving_web_of_a_replicaset(&mk_spec()).await;
    apply(&mut e, mk_owned_pod("web-2", "web-rs", true));
    assert!(e.store.pod(&NsName::new("ns", "web-2")).is_some(), "held");
    e.set_following();
    // The holder stopped serving `web`; the followed view says so.
    let gone: Vec<ViewChange> = (Kind::ALL.iter())
        .flat_map(|k| e.view().list(*k).items)
        .map(|s| ViewChange::Delete(s.object.key()))
        .collect();
    e.view().apply(gone, Instant::now());
    e.adopt_view();
    assert!(
        e.store.pod(&NsName::new("ns", "web-2")).is_none(),
        "dropped"
    );
    apply(&mut e, mk_owned_pod("web-3", "web-rs", true));
    assert!(
        e.store.pod(&NsName::new("ns", "web-3")).is_none(),
        "its ReplicaSet is not followed"
    );
}

/// A pod held ahead of its slice that crash-loops is churn of its service as a skipped pod's
/// events are: every event counts, not only the one that brought it in, and the service is
/// contained once over `serviceEventsPerSecond` for `sustainedFor`.
#[tokio::test(start_paused = true)]
async fn a_held_pods_crash_loop_counts_towards_its_services_flood() {
    let mut spec = mk_spec();
    spec.quarantine.when.service_events_per_second = 50;
    spec.quarantine.when.events_per_second = 400;
    spec.quarantine.when.sustained_for = KubeDuration::from_secs(3);
    let (mut e, _feeds) = serving_web_of_a_replicaset(&spec).await;
    let start = Instant::now();
    let mut ready = true;
    // 60 events a second of web-2, held ahead (named by no endpoint).
    while e.contained().is_empty() {
        assert!(
            Instant::now() - start < Duration::from_secs(10),
            "not contained: {:?}",
            e.counters()
        );
        for _ in 0..6 {
            apply(&mut e, mk_owned_pod("web-2", "web-rs", ready));
            ready = !ready;
        }
        assert!(e.store.pod(&NsName::new("ns", "web-2")).is_some(), "held");
        time::advance(Duration::from_millis(100)).await;
        e.poll(Instant::now());
    }
    assert_eq!(e.contained()[0].service, NsName::new("ns", "web"));
    assert!(e.counters().skipped_events >= 150, "{:?}", e.counters());
}

/// A pod the fetch finds absent holds nothing back: the slice goes at once (it names a pod that
/// does not exist, as upstream's does).
#[tokio::test(start_paused = true)]
async fn a_pod_found_absent_lets_its_slice_go() {
    let (mut e, mut feeds) = serving_web().await;
    apply(&mut e, mk_slice("web", "web-x", &[(1, true), (2, true)]));
    assert!(polled(&mut e, &mut feeds).is_empty());
    let asked = take_fetches(&mut e);
    e.ingest(
        answer(&asked, &NsName::new("ns", "web-2"), Answer::Absent),
        Instant::now(),
    );
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::EndpointSlice, EventType::Modified, "web-x")]
    );
}

/// A remote that never answers the fetch holds the slice `AWAIT` at most.
#[tokio::test(start_paused = true)]
async fn a_fetch_never_answered_holds_the_slice_for_a_while_only() {
    let (mut e, mut feeds) = serving_web().await;
    apply(&mut e, mk_slice("web", "web-x", &[(1, true), (2, true)]));
    assert!(polled(&mut e, &mut feeds).is_empty());
    assert_eq!(take_fetches(&mut e).len(), 1);
    let deadline = e.poll(Instant::now()).expect("a deadline");
    assert!(deadline <= Instant::now() + AWAIT, "{deadline:?}");
    time::advance(AWAIT - Duration::from_millis(1)).await;
    assert!(polled(&mut e, &mut feeds).is_empty());
    time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::EndpointSlice, EventType::Modified, "web-x")],
        "published without its pod"
    );
}

/// A scale-down in a real cluster's order: the endpoint leaves its slice, then the pod is
/// deleted. Consumers get the slice first and the pod's deletion a `LEAD` later, even when both
/// changes are published at once.
#[tokio::test(start_paused = true)]
async fn an_endpoint_leaves_its_slice_a_lead_before_its_pod_goes() {
    let (mut e, mut feeds) = synced_with_two(&mk_spec()).await;
    apply(&mut e, mk_slice("web", "web-x", &[(1, true)]));
    e.ingest(
        Change::Delete(mk_ready_pod("web-2", true).key()),
        Instant::now(),
    );
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::EndpointSlice, EventType::Modified, "web-x")]
    );
    time::advance(LEAD).await;
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::Pod, EventType::Deleted, "web-2")]
    );
}

/// A capped service's kept subset changes as its endpoints flip: the cap swaps a ready
/// endpoint in for one turned not ready. The endpoint swapped in has been ready at the remote
/// all along (a consumer reading it directly holds its pod), so its pod, fetched and new to the
/// view, leads it by `CAPPED_LEAD`, not a `LEAD`; the pod swapped out goes a `LEAD` after.
#[tokio::test(start_paused = true)]
async fn a_pod_the_cap_swaps_in_leads_its_endpoint_longer() {
    let mut spec = mk_spec();
    spec.caps.max_endpoints_per_service = 1;
    let (mut e, mut feeds) = synced_with_two(&spec).await;
    assert_eq!(e.view().len(Kind::Pod), 1, "web-1 kept and served");
    apply(&mut e, mk_slice("web", "web-x", &[(1, false), (2, true)]));
    assert!(polled(&mut e, &mut feeds).is_empty(), "web-2 is fetched");
    let asked = take_fetches(&mut e);
    e.ingest(found(&asked, mk_ready_pod("web-2", true)), Instant::now());
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::Pod, EventType::Added, "web-2")],
        "the pod first"
    );
    time::advance(CAPPED_LEAD - Duration::from_millis(1)).await;
    assert!(
        polled(&mut e, &mut feeds).is_empty(),
        "not before the capped lead"
    );
    time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::EndpointSlice, EventType::Modified, "web-x")]
    );
    time::advance(LEAD).await;
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::Pod, EventType::Deleted, "web-1")]
    );
}

/// [`serving_web`] with pods web-1 and web-2, under `spec`.
async fn synced_with_two(spec: &LinkSpec) -> (Engine, Feeds) {
    let e = synced(
        spec,
        vec![
            mk_service("web", true),
            mk_slice("web", "web-x", &[(1, true), (2, true)]),
            mk_ready_pod("web-1", true),
            mk_ready_pod("web-2", true),
        ],
    );
    let feeds = Feeds::of(e.view());
    time::advance(Duration::from_secs(1)).await;
    (e, feeds)
}

/// A Service with a selector, and the Endpoints object the remote's controller writes for it
/// (the same labels).
fn selected(name: &str) -> (Service, Endpoints) {
    let Object::Service(s) = mk_service(name, true) else {
        unreachable!("mk_service makes a Service")
    };
    let mut s = Service::clone(&s);
    s.spec = Some(ServiceSpec {
        selector: Some([("app".to_owned(), name.to_owned())].into()),
        ..Default::default()
    });
    let eps = Endpoints {
        metadata: s.metadata.clone(),
        subsets: None,
    };
    (s, eps)
}

fn service(s: &Service) -> Object {
    Object::Service(Arc::new(s.clone()))
}

fn endpoints(e: &Endpoints) -> Object {
    Object::Endpoints(Arc::new(EndpointsObject::from(e.clone())))
}

/// An empty engine that follows the remote's Endpoints too, synced, and a consumer of it.
fn following_endpoints() -> (Engine, Feeds) {
    let kinds = [
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Endpoints,
        Kind::Pod,
    ];
    let now = Instant::now();
    let mut e = Engine::new(&mk_spec(), &kinds, View::new(1, 1000), now);
    for k in kinds {
        e.ingest(Change::InitStart(k), now);
        e.ingest(Change::InitDone(k), now);
    }
    e.poll(now);
    let feeds = Feeds::of(e.view());
    (e, feeds)
}

/// A service exported (or exported again) enters the view after its Endpoints, with a lead,
/// however the remote's writes came: the Service first, its Endpoints a moment later. On the
/// way out the Service goes first.
#[tokio::test(start_paused = true)]
async fn a_service_enters_after_its_endpoints_and_leaves_before_them() {
    let (mut e, mut feeds) = following_endpoints();
    let (mut svc, mut eps) = selected("web");
    apply(&mut e, service(&svc));
    assert!(
        polled(&mut e, &mut feeds).is_empty(),
        "the Service waits for its Endpoints"
    );
    time::advance(Duration::from_millis(15)).await;
    apply(&mut e, endpoints(&eps));
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::Endpoints, EventType::Added, "web")]
    );
    time::advance(LEAD).await;
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::Service, EventType::Added, "web")]
    );
    // Unexported, once quiet: the Service leaves first, its Endpoints a lead later.
    time::advance(Duration::from_secs(1)).await;
    svc.metadata.labels = None;
    eps.metadata.labels = None;
    apply(&mut e, service(&svc));
    apply(&mut e, endpoints(&eps));
    assert_eq!(polled(&mut e, &mut feeds), [], "a removal waits for others");
    time::advance(QUIET).await;
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::Service, EventType::Deleted, "web")]
    );
    time::advance(LEAD).await;
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::Endpoints, EventType::Deleted, "web")]
    );
}

/// A Service whose Endpoints never come (a remote without an Endpoints controller running)
/// is published after `AWAIT`; one without a selector (hand-made endpoints) at once.
#[tokio::test(start_paused = true)]
async fn a_service_without_its_endpoints_waits_a_while_only() {
    let (mut e, mut feeds) = following_endpoints();
    apply(&mut e, mk_service("plain", true));
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::Service, EventType::Added, "plain")],
        "no selector: nothing to wait for"
    );
    let (svc, _) = selected("web");
    apply(&mut e, service(&svc));
    assert!(polled(&mut e, &mut feeds).is_empty());
    time::advance(AWAIT).await;
    assert_eq!(
        polled(&mut e, &mut feeds),
        [ev(Kind::Service, EventType::Added, "web")]
    );
}
