//! Guarantee 7 through the engine: a contained service is served whole (every endpoint served
//! as ready has its pod served, when the pod exists upstream), whatever order the remote wrote
//! things in; and containment is judged from the state held when the engine starts deciding,
//! not only from the changes that come after.

use std::collections::BTreeSet;

use super::*;

fn svc(name: &str) -> NsName {
    NsName::new("ns", name)
}

/// Answers the engine's pod fetches from `remote`, as the link does, until it asks for none.
fn answer_fetches(e: &mut Engine, remote: &[Object]) -> usize {
    let mut fetched = 0;
    loop {
        let now = Instant::now();
        e.poll(now);
        let asks = take_fetches(e);
        if asks.is_empty() {
            return fetched;
        }
        for id in asks.iter().flat_map(|f| &f.pods) {
            let got = remote
                .iter()
                .find(|o| o.kind() == Kind::Pod && o.key().id == *id);
            fetched += usize::from(got.is_some());
            let got = got.map_or(Answer::Absent, |p| Answer::Found(p.clone()));
            e.ingest(answer(&asks, id, got), now);
        }
    }
}

/// The ready endpoints served whose pod is not served, and how many ready endpoints there are.
fn unresolved(e: &Engine) -> (Vec<NsName>, usize) {
    let pods: BTreeSet<NsName> = e
        .view()
        .list(Kind::Pod)
        .items
        .iter()
        .map(|s| s.object.key().id)
        .collect();
    let mut ready = 0;
    let mut missing = Vec::new();
    for s in e.view().list(Kind::EndpointSlice).items {
        if let Object::EndpointSlice(sl) = &s.object {
            for (pod, r) in sl.pod_refs_ready() {
                if r {
                    ready += 1;
                    if !pods.contains(&pod) {
                        missing.push(pod);
                    }
                }
            }
        }
    }
    (missing, ready)
}

/// A real surge, in the order a cluster writes it: the pods start and turn Ready (quiet from
/// then on, and skipped, since no endpoint names them yet), then the exported Service, then the
/// EndpointSlice controller names them, 30 slices of 100. The service goes over
/// `endpointsPerService` and is contained; the pods its kept endpoints name, fetched after the
/// containment, are served all the same.
#[tokio::test(start_paused = true)]
async fn a_contained_service_is_served_with_the_pods_of_its_ready_endpoints() {
    let mut spec = mk_spec();
    spec.quarantine.when.endpoints_per_service = 2000;
    let mut e = synced(&spec, vec![]);
    let pods: Vec<Object> = (0..3000)
        .map(|i| mk_ready_pod(&format!("flood-{i}"), true))
        .collect();
    for p in &pods {
        apply(&mut e, p.clone());
    }
    apply(&mut e, mk_service("flood", true));
    for s in 0..30u32 {
        let eps: Vec<(u32, bool)> = (s * 100..(s + 1) * 100).map(|i| (i, true)).collect();
        apply(&mut e, mk_slice("flood", &format!("flood-{s}"), &eps));
    }
    assert_eq!(
        e.contained().len(),
        1,
        "over endpointsPerService: contained"
    );
    let fetched = answer_fetches(&mut e, &pods);
    run(&mut e, Duration::from_secs(10), Duration::from_millis(100)).await;
    answer_fetches(&mut e, &pods);
    run(&mut e, Duration::from_secs(10), Duration::from_millis(100)).await;
    let (missing, ready) = unresolved(&e);
    assert!(ready > 0, "the contained service serves ready endpoints");
    assert!(fetched > 0, "its pods were fetched after the containment");
    assert!(
        missing.is_empty(),
        "{} of {ready} ready endpoints served without their pod, e.g. {:?}",
        missing.len(),
        missing.first()
    );
    assert_eq!(e.contained().len(), 1, "still contained");
}

/// A contained service's endpoints stay frozen while its pods are kept current in all but
/// their status: a pod that turns not ready keeps its served form (its readiness flip is the
/// flood's churn, held back with its endpoint's), a pod relabelled upstream is served as it is
/// now.
#[tokio::test(start_paused = true)]
async fn a_contained_service_keeps_its_endpoints_and_follows_its_pods() {
    let mut spec = mk_spec();
    spec.quarantine.when.endpoints_per_service = 3;
    let pods: Vec<Object> = (0..4)
        .map(|i| mk_ready_pod(&format!("hot-{i}"), true))
        .collect();
    let mut world = vec![
        mk_service("hot", true),
        mk_slice(
            "hot",
            "hot-a",
            &[(0, true), (1, true), (2, true), (3, true)],
        ),
    ];
    world.extend(pods.iter().cloned());
    let mut e = synced(&spec, world);
    answer_fetches(&mut e, &pods);
    assert_eq!(e.contained().len(), 1);
    let slice_before = e
        .view()
        .get(&ObjKey {
            kind: Kind::EndpointSlice,
            id: svc("hot-a"),
        })
        .map(|s| s.object.clone());
    assert!(unresolved(&e).0.is_empty(), "whole from the first sync");

    // Pod 0 turns not ready, and its endpoint with it.
    apply(&mut e, mk_ready_pod("hot-0", false));
    apply(
        &mut e,
        mk_slice(
            "hot",
            "hot-a",
            &[(0, false), (1, true), (2, true), (3, true)],
        ),
    );
    run(&mut e, Duration::from_secs(5), Duration::from_millis(100)).await;
    let pod0 = e.view().get(&ObjKey {
        kind: Kind::Pod,
        id: svc("hot-0"),
    });
    let served_ready = match pod0.as_ref().map(|s| &s.object) {
        Some(Object::Pod(p)) => p.is_ready(),
        other => panic!("hot-0 is served while its endpoint is kept: {other:?}"),
    };
    assert!(served_ready, "a status flip waits with the endpoints");

    // Pod 1 is relabelled upstream: served as it is now.
    let relabelled = match mk_ready_pod("hot-1", true) {
        Object::Pod(p) => {
            let mut pod = p.to_pod();
            pod.metadata.labels = Some([("version".to_owned(), "2".to_owned())].into());
            Object::Pod(Arc::new(pod.into()))
        }
        _ => unreachable!("mk_ready_pod makes a pod"),
    };
    apply(&mut e, relabelled.clone());
    run(&mut e, Duration::from_secs(5), Duration::from_millis(100)).await;
    let pod1 = e.view().get(&ObjKey {
        kind: Kind::Pod,
        id: svc("hot-1"),
    });
    assert_eq!(
        pod1.map(|s| s.object.clone()),
        Some(relabelled.into_sanitized()),
        "what identifies a pod is kept current"
    );
    let slice_after = e
        .view()
        .get(&ObjKey {
            kind: Kind::EndpointSlice,
            id: svc("hot-a"),
        })
        .map(|s| s.object.clone());
    assert_eq!(slice_before, slice_after, "the endpoints stay frozen");
}

/// A replica that starts deciding (it took the Lease) while a service is already over
/// `endpointsPerService`, nothing changing upstream, contains it at once.
#[tokio::test(start_paused = true)]
async fn a_service_already_over_its_threshold_is_contained_when_deciding_starts() {
    let mut spec = mk_spec();
    spec.quarantine.when.endpoints_per_service = 100;
    let mut world = vec![mk_service("big", true), mk_service("calm", true)];
    for s in 0..2u32 {
        let eps: Vec<(u32, bool)> = (s * 100..(s + 1) * 100).map(|i| (i, true)).collect();
        world.push(mk_slice("big", &format!("big-{s}"), &eps));
    }
    world.push(mk_slice("calm", "calm-a", &[(900, true)]));
    let now = Instant::now();
    let mut e = Engine::new(&spec, &KINDS, View::new(1, 100_000), now);
    e.set_deciding(false);
    relist(&mut e, world);
    e.poll(now);
    run(&mut e, Duration::from_secs(3), Duration::from_millis(100)).await;
    assert!(
        e.contained().is_empty(),
        "a follower measures, never decides"
    );

    e.set_deciding(true);
    e.poll(Instant::now());
    let contained: Vec<NsName> = e.contained().into_iter().map(|c| c.service).collect();
    assert_eq!(
        contained,
        vec![svc("big")],
        "contained at once, nothing having changed"
    );
}
