//! Pods that kept endpoints point at but whose last event came first: the engine asks for them
//! and serves them when they arrive (regression: such a pod was never served until it changed
//! again, and a healthy pod may never change again).

use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::model::{TOTAL_ANNOTATION, TRUNCATED_ANNOTATION};

fn pod_key(name: &str) -> ObjKey {
    ObjKey {
        kind: Kind::Pod,
        id: NsName::new("ns", name),
    }
}

fn fetch_requests(e: &mut Engine) -> Vec<NsName> {
    e.take_effects()
        .into_iter()
        .filter_map(|f| match f {
            Effect::FetchPods(p) => Some(p),
            _ => None,
        })
        .flatten()
        .collect()
}

/// The first sync lists pods before the slice that points at them.
fn synced_pods_first(spec: &LinkSpec) -> Engine {
    let now = Instant::now();
    let mut e = Engine::new(spec, &KINDS, View::new(1, 100_000), now);
    for k in KINDS {
        e.ingest(Change::InitStart(k), now);
    }
    for o in [
        mk_pod("web-1", "Running"),
        mk_pod("web-2", "Running"),
        mk_service("web", true),
        mk_slice("web", "web-1", &[(1, true), (2, true)]),
    ] {
        e.ingest(Change::Apply(o), now);
    }
    for k in KINDS {
        e.ingest(Change::InitDone(k), now);
    }
    e.poll(now);
    e
}

#[tokio::test(start_paused = true)]
async fn a_pod_listed_before_its_slice_is_fetched_and_served() {
    let mut e = synced_pods_first(&mk_spec());
    let mut asked = fetch_requests(&mut e);
    asked.sort();
    assert_eq!(
        asked,
        [NsName::new("ns", "web-1"), NsName::new("ns", "web-2")]
    );
    assert!(e.view().get(&pod_key("web-1")).is_none());

    e.ingest(Change::Fetched(mk_pod("web-1", "Running")), Instant::now());
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert!(e.view().get(&pod_key("web-1")).is_some());
    assert!(
        fetch_requests(&mut e).is_empty(),
        "web-2 is still being fetched: it is not asked for twice"
    );
    assert_eq!(e.counters().pods_fetched, 2);
}

#[tokio::test(start_paused = true)]
async fn a_watch_event_newer_than_the_fetch_wins() {
    let mut e = synced_pods_first(&mk_spec());
    fetch_requests(&mut e);
    apply(&mut e, mk_pod("web-1", "Succeeded"));
    e.ingest(Change::Fetched(mk_pod("web-1", "Running")), Instant::now());
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    let served = e.view().get(&pod_key("web-1")).expect("served");
    let Object::Pod(p) = &served.object else {
        panic!("not a pod")
    };
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    assert_eq!(
        phase,
        Some("Succeeded"),
        "the older fetched state is dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn pods_of_truncated_endpoints_are_not_fetched() {
    let mut spec = mk_spec();
    spec.caps.max_endpoints_per_service = 1;
    let mut e = synced_pods_first(&spec);
    assert_eq!(fetch_requests(&mut e), [NsName::new("ns", "web-1")]);
}

#[tokio::test(start_paused = true)]
async fn a_fetched_pod_nothing_points_at_any_more_is_dropped() {
    let mut e = synced_pods_first(&mk_spec());
    fetch_requests(&mut e);
    apply(&mut e, mk_slice("web", "web-1", &[(3, true)]));
    e.ingest(Change::Fetched(mk_pod("web-1", "Running")), Instant::now());
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert!(e.view().get(&pod_key("web-1")).is_none());
    assert_eq!(fetch_requests(&mut e), [NsName::new("ns", "web-3")]);
}

#[tokio::test(start_paused = true)]
async fn a_truncated_service_says_so_in_its_annotations() {
    let mut spec = mk_spec();
    spec.caps.max_endpoints_per_service = 2;
    let mut e = synced(
        &spec,
        vec![
            mk_service("web", true),
            mk_slice("web", "web-1", &[(1, true), (2, true), (3, false)]),
        ],
    );
    let svc = e
        .view()
        .get(&ObjKey {
            kind: Kind::Service,
            id: NsName::new("ns", "web"),
        })
        .expect("served");
    let notes = svc.object.meta().annotations.clone().unwrap_or_default();
    assert_eq!(
        notes.get(TRUNCATED_ANNOTATION).map(String::as_str),
        Some("1")
    );
    assert_eq!(notes.get(TOTAL_ANNOTATION).map(String::as_str), Some("3"));

    // Back under the cap, the annotations go.
    apply(&mut e, mk_slice("web", "web-1", &[(1, true)]));
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    let svc = e
        .view()
        .get(&ObjKey {
            kind: Kind::Service,
            id: NsName::new("ns", "web"),
        })
        .expect("served");
    assert!(svc.object.meta().annotations.is_none());
}
