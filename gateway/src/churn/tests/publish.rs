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
    names(&take_fetches(e))
}

fn names(asked: &[Fetch]) -> Vec<NsName> {
    asked.iter().flat_map(|f| f.pods.iter().cloned()).collect()
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
    let fetches = take_fetches(&mut e);
    let mut asked = names(&fetches);
    asked.sort();
    assert_eq!(
        asked,
        [NsName::new("ns", "web-1"), NsName::new("ns", "web-2")]
    );
    assert!(e.view().get(&pod_key("web-1")).is_none());

    e.ingest(found(&fetches, mk_pod("web-1", "Running")), Instant::now());
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
    let asked = take_fetches(&mut e);
    apply(&mut e, mk_pod("web-1", "Succeeded"));
    e.ingest(found(&asked, mk_pod("web-1", "Running")), Instant::now());
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    let served = e.view().get(&pod_key("web-1")).expect("served");
    let Object::Pod(p) = &served.object else {
        panic!("not a pod")
    };
    let status = p.to_pod().status;
    let phase = status.and_then(|s| s.phase);
    assert_eq!(
        phase.as_deref(),
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
    let asked = take_fetches(&mut e);
    apply(&mut e, mk_slice("web", "web-1", &[(3, true)]));
    e.ingest(found(&asked, mk_pod("web-1", "Running")), Instant::now());
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

/// The pods the view serves, by name.
fn served_pods(e: &Engine) -> Vec<String> {
    e.view()
        .list(Kind::Pod)
        .items
        .iter()
        .filter_map(|s| s.object.meta().name.clone())
        .collect()
}

/// Answers every fetch the engine asked for with a running pod, and returns what it asked.
fn answer_fetches(e: &mut Engine) -> Vec<NsName> {
    let fetches = take_fetches(e);
    let mut asked = names(&fetches);
    asked.sort();
    for p in &asked {
        e.ingest(found(&fetches, mk_pod(&p.name, "Running")), Instant::now());
    }
    asked
}

/// A service grows under its cap: the new pods' events came before the slice named them (as
/// on a real remote, where a pod exists before its endpoint), so the store dropped them. The
/// slice's growth fetches exactly those pods, once; the one behind a ready endpoint is served
/// with it, the one behind a not-ready endpoint is held but served only once it is `Ready`,
/// before its endpoint turns ready (the remote's own order), and it stays served after.
#[tokio::test(start_paused = true)]
async fn growing_published_endpoints_fetches_exactly_the_new_pods() {
    let mut e = synced(
        &mk_spec(),
        vec![
            mk_service("web", true),
            mk_slice("web", "web-1", &[(1, true), (2, true)]),
        ],
    );
    assert_eq!(answer_fetches(&mut e).len(), 2);
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert_eq!(served_pods(&e), ["web-1", "web-2"]);
    let fetched = e.counters().pods_fetched;

    // Two pods start; their endpoints are not in the slice yet: nobody wants them.
    apply(&mut e, mk_pod("web-3", "Pending"));
    apply(&mut e, mk_pod("web-4", "Pending"));
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert_eq!(
        served_pods(&e),
        ["web-1", "web-2"],
        "no endpoint names them"
    );
    assert!(fetch_requests(&mut e).is_empty());

    apply(
        &mut e,
        mk_slice(
            "web",
            "web-1",
            &[(1, true), (2, true), (3, false), (4, true)],
        ),
    );
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert_eq!(
        answer_fetches(&mut e),
        [NsName::new("ns", "web-3"), NsName::new("ns", "web-4")],
        "exactly the pods the growth needs"
    );
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert_eq!(
        served_pods(&e),
        ["web-1", "web-2", "web-4"],
        "web-3's endpoint is not ready and web-3 is not Ready: no consumer looks it up"
    );
    assert_eq!(e.counters().pods_fetched, fetched + 2);
    assert!(fetch_requests(&mut e).is_empty(), "nothing asked twice");

    // The kubelet marks web-3 Ready: it is served before its endpoint is marked.
    apply(&mut e, mk_ready_pod("web-3", true));
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert_eq!(served_pods(&e), ["web-1", "web-2", "web-3", "web-4"]);

    let four = |three_ready| {
        mk_slice(
            "web",
            "web-1",
            &[(1, true), (2, true), (3, three_ready), (4, true)],
        )
    };
    apply(&mut e, four(true));
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert_eq!(served_pods(&e), ["web-1", "web-2", "web-3", "web-4"]);

    // It crashes: the pod, then its endpoint, turn not ready; it stays served, as it is now.
    apply(&mut e, mk_ready_pod("web-3", false));
    apply(&mut e, four(false));
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert_eq!(served_pods(&e), ["web-1", "web-2", "web-3", "web-4"]);
    let web3 = e
        .view()
        .list(Kind::Pod)
        .items
        .into_iter()
        .find(|s| s.object.meta().name.as_deref() == Some("web-3"))
        .expect("web-3 is served");
    assert!(
        !std::str::from_utf8(&web3.json())
            .expect("JSON")
            .contains(r#""status":"True""#),
        "served as the remote holds it now, not Ready"
    );
    assert!(fetch_requests(&mut e).is_empty(), "every pod was held");
}

/// Under a cap of 2 the cap prefers ready endpoints: when a withheld endpoint turns ready it
/// takes the place of a not-ready one, its pod is fetched (only it) and the other's pod goes.
#[tokio::test(start_paused = true)]
async fn an_endpoint_turning_ready_under_the_cap_fetches_its_pod_only() {
    let mut spec = mk_spec();
    spec.caps.max_endpoints_per_service = 2;
    let mut e = synced(
        &spec,
        vec![
            mk_service("web", true),
            mk_slice("web", "web-1", &[(1, true), (2, false), (3, false)]),
        ],
    );
    let first = answer_fetches(&mut e);
    assert_eq!(first.len(), 2, "two endpoints published: {first:?}");
    assert!(first.contains(&NsName::new("ns", "web-1")));
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    let withheld = if first.contains(&NsName::new("ns", "web-2")) {
        3
    } else {
        2
    };
    let kept = 5 - withheld;

    let mut eps = vec![(1, true), (2, false), (3, false)];
    eps[withheld as usize - 1].1 = true;
    apply(&mut e, mk_slice("web", "web-1", &eps));
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert_eq!(
        answer_fetches(&mut e),
        [NsName::new("ns", &format!("web-{withheld}"))],
        "only the endpoint that became published needs its pod"
    );
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert_eq!(
        served_pods(&e),
        ["web-1".to_owned(), format!("web-{withheld}")],
        "web-{kept}'s endpoint is withheld now, and its pod with it"
    );
}

/// A pod the remote answers it does not have is not asked for again while it stays absent
/// (regression: it held one of the 4,096 places of the fetches in flight for as long as it was
/// wanted, so enough of them stopped every other fetch), and it is served when it comes.
#[tokio::test(start_paused = true)]
async fn a_pod_answered_absent_is_not_asked_again_and_is_served_when_it_comes() {
    let mut e = synced_pods_first(&mk_spec());
    let asked = take_fetches(&mut e);
    let web2 = NsName::new("ns", "web-2");
    e.ingest(answer(&asked, &web2, Answer::Absent), Instant::now());
    e.ingest(found(&asked, mk_pod("web-1", "Running")), Instant::now());
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert!(e.view().get(&pod_key("web-1")).is_some());

    // The slice grows: the service publishes again, still lacking web-2.
    assert_eq!(
        grow_and_fetch(&mut e).await,
        [NsName::new("ns", "web-3")],
        "web-2 is known absent: the pod watcher sends it if it comes"
    );
    // web-3's fetch is not answered: the slice that names it waits that long at most.
    run(
        &mut e,
        crate::churn::publish::AWAIT,
        Duration::from_millis(50),
    )
    .await;
    apply(&mut e, mk_pod("web-2", "Running"));
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert!(e.view().get(&pod_key("web-2")).is_some());
}

/// A pod the remote did not answer for is asked for again at its service's next publication.
#[tokio::test(start_paused = true)]
async fn a_pod_whose_fetch_failed_is_asked_for_again() {
    let mut e = synced_pods_first(&mk_spec());
    let asked = take_fetches(&mut e);
    for pod in names(&asked) {
        e.ingest(answer(&asked, &pod, Answer::Failed), Instant::now());
    }
    assert_eq!(
        grow_and_fetch(&mut e).await,
        ["web-1", "web-2", "web-3"].map(|n| NsName::new("ns", n))
    );
}

/// The first sync as the upstream runs it: Services and slices are listed, the selections
/// want their pods, and only then does the pod watcher start (`Engine::pods_listing`). Its
/// list brings every pod wanted by then that exists, so none is fetched (a remote whose
/// endpoints name 100,000 pods that are not there saw 4,096 GETs at every start); a pod wanted
/// while the list streams may have been passed by it, and is fetched.
#[tokio::test(start_paused = true)]
async fn the_pod_list_answers_the_pods_wanted_before_it_began() {
    let now = Instant::now();
    let mut e = Engine::new(&mk_spec(), &KINDS, View::new(1, 100_000), now);
    for k in KINDS {
        e.ingest(Change::InitStart(k), now);
    }
    e.ingest(Change::Apply(mk_service("web", true)), now);
    e.ingest(
        Change::Apply(mk_slice("web", "web-1", &[(1, true), (2, true)])),
        now,
    );
    e.ingest(Change::InitDone(Kind::Service), now);
    e.ingest(Change::InitDone(Kind::EndpointSlice), now);
    e.pods_listing();
    // The list streams: web-1 is there, web-2 is not; web-3 is wanted meanwhile.
    e.ingest(Change::Apply(mk_pod("web-1", "Running")), now);
    e.ingest(
        Change::Apply(mk_slice("web", "web-1", &[(1, true), (2, true), (3, true)])),
        now,
    );
    e.ingest(Change::InitDone(Kind::Pod), now);
    e.poll(now);
    assert!(e.view().get(&pod_key("web-1")).is_some(), "listed");
    assert_eq!(
        fetch_requests(&mut e),
        [NsName::new("ns", "web-3")],
        "web-2 is absent from the list; web-3 was wanted once it had begun"
    );
    apply(&mut e, mk_pod("web-2", "Running"));
    run(&mut e, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert!(e.view().get(&pod_key("web-2")).is_some(), "created later");
}

/// A new run of watchers (new credentials, a release from quarantine) drops the old run's
/// fetches with its messages: what the engine knew of the wanted pods is forgotten, and a pod
/// it had asked for is asked for again rather than waited for.
#[tokio::test(start_paused = true)]
async fn a_new_upstream_asks_again_for_what_the_old_one_was_fetching() {
    let mut e = synced_pods_first(&mk_spec());
    assert_eq!(fetch_requests(&mut e).len(), 2);
    e.upstream_starts();
    assert_eq!(
        grow_and_fetch(&mut e).await,
        ["web-1", "web-2", "web-3"].map(|n| NsName::new("ns", n))
    );
}

/// web's slice grows by web-3: the pods its next publication asks for.
async fn grow_and_fetch(e: &mut Engine) -> Vec<NsName> {
    apply(
        e,
        mk_slice("web", "web-1", &[(1, true), (2, true), (3, true)]),
    );
    run(e, Duration::from_secs(1), Duration::from_millis(50)).await;
    let mut asked = fetch_requests(e);
    asked.sort();
    asked
}
