//! Containment of the services that flood, through the engine: the flooding service freezes,
//! every other service keeps flowing, the link syncs even when the flood came first, too many
//! contained services quarantine the link, releases and re-checks.

use std::time::Duration;

use super::*;

const CALM: [&str; 5] = ["c0", "c1", "c2", "c3", "c4"];

/// Per-service threshold 50 events/s sustained 3 s; the link's threshold far above.
fn contain_spec() -> LinkSpec {
    let mut spec = mk_spec();
    spec.quarantine.when.service_events_per_second = 50;
    spec.quarantine.when.events_per_second = 400;
    spec.quarantine.when.sustained_for = KubeDuration::from_secs(3);
    spec
}

fn svc(name: &str) -> NsName {
    NsName::new("ns", name)
}

fn calm_world() -> Vec<Object> {
    let mut objects = vec![
        mk_service("hot", true),
        mk_slice("hot", "hot-1", &[(1, true)]),
    ];
    for (i, c) in CALM.iter().enumerate() {
        objects.push(mk_service(c, true));
        objects.push(mk_slice(c, &format!("{c}-1"), &[(100 + i as u32, true)]));
    }
    objects
}

/// The endpoint addresses a slice of `name` publishes now.
fn published_slice(e: &Engine, name: &str) -> Option<Object> {
    e.view()
        .get(&ObjKey {
            kind: Kind::EndpointSlice,
            id: svc(name),
        })
        .map(|s| s.object.clone())
}

/// One service floods at 200 events/s for 20 s while five calm services change once a second
/// each: the flooding one is contained after `sustainedFor` and frozen; every calm change is
/// published within 200 ms; the link is never quarantined.
#[tokio::test(start_paused = true)]
async fn a_flooding_service_is_contained_and_calm_services_keep_flowing() {
    let mut e = synced(&contain_spec(), calm_world());
    let step = Duration::from_millis(50);
    let mut frozen: Option<Object> = None;
    let mut contained_at = None;
    let mut delays = Vec::new();
    let start = Instant::now();
    for tick in 0..400u32 {
        // The flood: 10 events a tick, the slice's ready flag flipping.
        for i in 0..10u32 {
            apply(
                &mut e,
                mk_slice("hot", "hot-1", &[(1, (tick + i) % 2 == 0), (2, true)]),
            );
        }
        // A calm change every second for each calm service, spread over the second.
        let changed = (tick % 20 < 5).then_some((tick % 20) as usize);
        if let Some(c) = changed {
            let name = CALM[c];
            let ip = 1000 + tick;
            apply(&mut e, mk_slice(name, &format!("{name}-1"), &[(ip, true)]));
            let at = Instant::now();
            e.poll(at);
            lack_pods(&mut e);
            e.poll(at);
            let mut waited = Duration::ZERO;
            loop {
                let want = format!("10.0.{}.{}", ip / 256, ip % 256);
                let seen = published_slice(&e, &format!("{name}-1")).is_some_and(|o| {
                    matches!(o, Object::EndpointSlice(s) if s.endpoints().any(|(key, _)| key == want))
                });
                if seen {
                    delays.push(waited);
                    break;
                }
                assert!(waited < Duration::from_secs(2), "{name} never published");
                time::advance(Duration::from_millis(10)).await;
                waited += Duration::from_millis(10);
                e.poll(Instant::now());
                lack_pods(&mut e);
                e.poll(Instant::now());
            }
        }
        time::advance(step).await;
        e.poll(Instant::now());
        lack_pods(&mut e);
        e.poll(Instant::now());
        if contained_at.is_none() && !e.contained().is_empty() {
            contained_at = Some(Instant::now() - start);
            frozen = published_slice(&e, "hot-1");
        }
        if let Some(f) = &frozen {
            assert_eq!(
                published_slice(&e, "hot-1").as_ref(),
                Some(f),
                "contained: frozen"
            );
        }
        assert_eq!(e.state(), &State::Active, "the link is never quarantined");
    }
    let at = contained_at.expect("the flooding service is contained");
    assert!(
        at >= Duration::from_secs(3) && at < Duration::from_secs(6),
        "contained at {at:?}"
    );
    let contained = e.contained();
    assert_eq!(contained.len(), 1);
    assert_eq!(contained[0].service, svc("hot"));
    assert_eq!(contained[0].state, StateName::Contained);
    assert_eq!(
        contained[0].quarantine.trigger.reason,
        crate::churn::flood::Reason::ServiceEventRate
    );
    assert_eq!(delays.len(), 100, "every calm change was published");
    let worst = delays.iter().max().copied().unwrap_or_default();
    assert!(
        worst <= Duration::from_millis(200),
        "a calm change waited {worst:?}"
    );
    assert!(
        e.counters().contained_events > 1000,
        "the flood was held back"
    );
}

/// Each kind has its own watch, so a service's slices may come before the service: the
/// endpoint count is checked when the service arrives too.
#[tokio::test(start_paused = true)]
async fn a_service_whose_slices_came_first_is_still_checked() {
    let mut spec = contain_spec();
    spec.caps.max_endpoints_per_service = 5;
    spec.quarantine.when.endpoints_per_service = 8;
    let mut e = synced(&spec, calm_world());
    let eps: Vec<(u32, bool)> = (0..12).map(|i| (200 + i, true)).collect();
    apply(&mut e, mk_slice("late", "late-1", &eps));
    assert!(e.contained().is_empty(), "no service yet: nothing selected");
    apply(&mut e, mk_service("late", true));
    e.poll(Instant::now());
    let contained = e.contained();
    assert_eq!(contained.len(), 1, "contained when the service came");
    assert_eq!(contained[0].service, svc("late"));
    assert_eq!(
        contained[0].quarantine.trigger.reason,
        crate::churn::flood::Reason::EndpointsPerService
    );
}

/// A crash loop the remote batches into few slice updates still counts its flips: a slice of
/// 40 endpoints rewritten 5 times a second with 20 endpoints flipped each time is 5 events/s
/// by objects but 100 by endpoints changed, over the 50 of the spec: the service is contained.
#[tokio::test(start_paused = true)]
async fn a_slice_that_batches_many_flips_counts_each_flip() {
    let mut e = synced(&contain_spec(), calm_world());
    for tick in 0..30u32 {
        let eps: Vec<(u32, bool)> = (0..40).map(|i| (i, i % 2 == tick % 2)).collect();
        apply(&mut e, mk_slice("hot", "hot-1", &eps));
        time::advance(Duration::from_millis(200)).await;
        e.poll(Instant::now());
    }
    let contained = e.contained();
    assert_eq!(contained.len(), 1, "contained by endpoints changed");
    assert_eq!(contained[0].service, svc("hot"));
    assert_eq!(
        contained[0].quarantine.trigger.reason,
        crate::churn::flood::Reason::ServiceEventRate
    );
}

/// A link that starts while a service already floods syncs at once: the flooding service,
/// over `endpointsPerService` in its first list, is contained and served at its first capped
/// subset, ready endpoints first; the calm service is served whole.
#[tokio::test(start_paused = true)]
async fn a_cold_start_during_a_flood_syncs_with_the_flooding_service_capped_and_contained() {
    let mut spec = contain_spec();
    spec.caps.max_endpoints_per_service = 10;
    spec.quarantine.when.endpoints_per_service = 100;
    let mut objects = vec![mk_service("hot", true), mk_service("calm", true)];
    for s in 0..3u32 {
        // 150 endpoints, one in ten ready.
        let eps: Vec<(u32, bool)> = (s * 50..(s + 1) * 50).map(|i| (i, i % 10 == 0)).collect();
        objects.push(mk_slice("hot", &format!("hot-{s}"), &eps));
    }
    objects.push(mk_slice("calm", "calm-1", &[(500, true), (501, true)]));
    let e = synced(&spec, objects);
    assert!(e.synced_once(), "the link syncs");
    assert_eq!(e.state(), &State::Active);
    assert_eq!(e.contained().len(), 1);
    let hot_endpoints: Vec<bool> = e
        .view()
        .list(Kind::EndpointSlice)
        .items
        .iter()
        .filter_map(|s| match &s.object {
            Object::EndpointSlice(sl)
                if sl
                    .metadata()
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("hot-")) =>
            {
                Some(sl.clone())
            }
            _ => None,
        })
        .flat_map(|sl| sl.endpoints().map(|(_, ready)| ready).collect::<Vec<_>>())
        .collect();
    assert_eq!(hot_endpoints.len(), 10, "capped");
    assert!(hot_endpoints.iter().all(|r| *r), "ready endpoints first");
    assert!(
        published_slice(&e, "calm-1").is_some(),
        "the calm service is served"
    );
}

/// More services contained at once than `containedServices` allows quarantine the link; it
/// keeps serving every service.
#[tokio::test(start_paused = true)]
async fn too_many_contained_services_quarantine_the_link() {
    let mut spec = contain_spec();
    spec.quarantine.when.endpoints_per_service = 2;
    spec.quarantine.when.contained_services = 2;
    let mut e = synced(&spec, calm_world());
    for (i, c) in CALM.iter().take(3).enumerate() {
        let base = 200 + 10 * i as u32;
        apply(
            &mut e,
            mk_slice(
                c,
                &format!("{c}-1"),
                &[(base, true), (base + 1, true), (base + 2, true)],
            ),
        );
    }
    let State::Quarantined(q) = e.state() else {
        panic!("quarantined, not {:?}", e.state())
    };
    assert_eq!(
        q.trigger.reason,
        crate::churn::flood::Reason::ContainedServices
    );
    assert_eq!(q.trigger.figures.get("containedServices"), Some(&3));
    assert_eq!(e.view().len(Kind::Service), 6, "every service still served");
    assert!(e.synced_once());
}

/// An operator's release of a contained service: 404-like for a service the link does not
/// select, 409-like for one not contained; after the release it converges to upstream.
#[tokio::test(start_paused = true)]
async fn a_released_service_converges_and_requests_are_checked() {
    let mut spec = contain_spec();
    spec.quarantine.when.endpoints_per_service = 2;
    let mut e = synced(&spec, calm_world());
    let now = Instant::now();
    assert_eq!(
        e.release_service(&svc("nope"), now, "an operator").err(),
        Some(RequestError::UnknownService)
    );
    assert_eq!(
        e.release_service(&svc("c0"), now, "an operator").err(),
        Some(RequestError::NotContained)
    );
    apply(
        &mut e,
        mk_slice("hot", "hot-1", &[(1, true), (2, true), (3, true)]),
    );
    assert_eq!(e.contained().len(), 1);
    let frozen = published_slice(&e, "hot-1");
    run(&mut e, Duration::from_secs(2), Duration::from_millis(100)).await;
    assert_eq!(
        published_slice(&e, "hot-1"),
        frozen,
        "frozen while contained"
    );

    // The flood shrinks back, unseen while contained; an operator releases the service.
    apply(&mut e, mk_slice("hot", "hot-1", &[(7, true)]));
    let t = e
        .release_service(
            &svc("hot"),
            Instant::now(),
            "an operator through the admin API",
        )
        .expect("released");
    assert_eq!(t.service, Some(svc("hot")));
    assert_eq!(t.to, StateName::Active);
    assert_eq!(t.message, "released by an operator through the admin API");
    run(&mut e, Duration::from_secs(1), Duration::from_millis(100)).await;
    assert!(e.contained().is_empty());
    let Some(Object::EndpointSlice(s)) = published_slice(&e, "hot-1") else {
        panic!("published")
    };
    assert_eq!(Some(s.len()), Some(1), "converged to upstream");
}

/// With auto-release, a contained service is re-checked after the cool-down: still flooding,
/// it is contained again with a doubled cool-down; quiet, it is released and converges.
#[tokio::test(start_paused = true)]
async fn auto_release_rechecks_a_contained_service_with_backoff() {
    let mut spec = contain_spec();
    spec.quarantine.when.endpoints_per_service = 2;
    spec.quarantine.auto_release = Some(AutoRelease {
        after: KubeDuration::from_secs(10),
        max_after: KubeDuration::from_secs(60),
    });
    let mut e = synced(&spec, calm_world());
    apply(
        &mut e,
        mk_slice("hot", "hot-1", &[(1, true), (2, true), (3, true)]),
    );
    assert_eq!(
        e.contained()[0].quarantine.cooldown,
        Some(Duration::from_secs(10))
    );
    // After 10 s the re-check starts, sees the endpoints still over, contains it again.
    run(&mut e, Duration::from_secs(11), Duration::from_millis(500)).await;
    let c = e.contained();
    assert_eq!(c.len(), 1);
    assert_eq!(
        c[0].quarantine.cooldown,
        Some(Duration::from_secs(20)),
        "doubled"
    );
    // The flood ends; the next re-check (20 s, then 6 s of watching) passes.
    apply(&mut e, mk_slice("hot", "hot-1", &[(9, true)]));
    run(&mut e, Duration::from_secs(30), Duration::from_millis(500)).await;
    assert!(e.contained().is_empty(), "released by the re-check");
    let Some(Object::EndpointSlice(s)) = published_slice(&e, "hot-1") else {
        panic!("published")
    };
    assert_eq!(Some(s.len()), Some(1));
    let reasons: Vec<&'static str> = e
        .take_effects()
        .into_iter()
        .filter_map(|f| match f {
            Effect::Transition(t) => Some(t.reason.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        reasons.contains(&"CooldownOver") && reasons.contains(&"RecheckPassed"),
        "{reasons:?}"
    );
}

/// A service's state goes when the service goes: its slot, its bucket, its publication.
#[tokio::test(start_paused = true)]
async fn a_groups_state_goes_when_its_service_goes() {
    let mut spec = contain_spec();
    // Five of six services deleted at once would be a link-wide removal.
    spec.quarantine.when.removed_share = 100;
    let mut e = synced(&spec, calm_world());
    let (sched, published) = e.groups_held();
    assert!(sched >= 1 && published >= 6);
    for c in CALM {
        apply(&mut e, mk_slice(c, &format!("{c}-1"), &[(300, true)]));
    }
    run(&mut e, Duration::from_secs(2), Duration::from_millis(100)).await;
    let before = e.groups_held();
    for c in CALM {
        e.ingest(
            Change::Delete(ObjKey {
                kind: Kind::Service,
                id: svc(c),
            }),
            Instant::now(),
        );
    }
    run(&mut e, Duration::from_secs(3), Duration::from_millis(100)).await;
    let after = e.groups_held();
    assert_eq!(e.view().len(Kind::Service), 1, "only hot is left");
    assert!(
        after.0 <= before.0 - 5,
        "slots dropped: {before:?} -> {after:?}"
    );
    assert!(
        after.1 <= before.1 - 5,
        "publications dropped: {before:?} -> {after:?}"
    );
}

/// A replica that does not hold the link's Lease measures floods but contains nothing.
#[tokio::test(start_paused = true)]
async fn an_engine_that_does_not_decide_contains_nothing() {
    let mut spec = contain_spec();
    spec.quarantine.when.endpoints_per_service = 2;
    let mut e = synced(&spec, calm_world());
    e.set_deciding(false);
    apply(
        &mut e,
        mk_slice("hot", "hot-1", &[(1, true), (2, true), (3, true)]),
    );
    run_lacking_pods(&mut e, Duration::from_secs(1), Duration::from_millis(100)).await;
    assert!(e.contained().is_empty());
    let Some(Object::EndpointSlice(s)) = published_slice(&e, "hot-1") else {
        panic!("published")
    };
    assert_eq!(Some(s.len()), Some(3), "it flows, as the holder decided");
}

/// Containment saved before a restart comes back: the service is served at its saved state
/// and stays contained while upstream differs.
#[tokio::test(start_paused = true)]
async fn a_restored_containment_serves_its_saved_state() {
    use crate::churn::restore::SavedContained;
    let now = Instant::now();
    let mut e = Engine::new(&contain_spec(), &KINDS, View::new(1, 1000), now);
    e.restore_contained(
        now,
        vec![SavedContained {
            service: svc("hot"),
            trigger: crate::churn::flood::Trigger::manual("flood"),
            since: now,
            cooldown: None,
            objects: vec![
                mk_service("hot", true),
                mk_slice("hot", "hot-1", &[(1, true)]),
            ],
        }],
    );
    relist(
        &mut e,
        vec![
            mk_service("hot", true),
            mk_slice("hot", "hot-1", &[(1, true), (2, true), (3, true)]),
            mk_service("calm", true),
        ],
    );
    run(&mut e, Duration::from_secs(2), Duration::from_millis(100)).await;
    assert_eq!(e.contained().len(), 1);
    let Some(Object::EndpointSlice(s)) = published_slice(&e, "hot-1") else {
        panic!("published")
    };
    assert_eq!(Some(s.len()), Some(1), "the saved state");
    assert_eq!(e.view().len(Kind::Service), 2, "the calm service is served");
}

/// A crash loop whose pods are mostly beyond what is served: the pod watcher skips their
/// events, and the few that reach the engine stay under `serviceEventsPerSecond`. The skipped
/// events still count, for the service that serves their ReplicaSet's pods: it is contained
/// once they have been over the threshold for `sustainedFor`; a calm service whose pods
/// belong to another ReplicaSet is not.
#[tokio::test(start_paused = true)]
async fn a_flood_whose_events_are_skipped_is_contained_all_the_same() {
    let spec = contain_spec();
    let mut world = calm_world();
    world.push(mk_service("hot", true));
    world.push(mk_slice("hot", "hot-1", &[(1, true), (2, true)]));
    world.push(mk_owned_pod("hot-1", "hot-rs", true));
    world.push(mk_owned_pod("hot-2", "hot-rs", true));
    let mut e = synced(&spec, world);
    assert!(e.contained().is_empty());
    let rs = svc("hot-rs");
    let start = Instant::now();
    // 60 skipped events a second (the threshold is 50), sent as the pod watcher sends them.
    while e.contained().is_empty() {
        assert!(
            Instant::now() - start < Duration::from_secs(10),
            "not contained: {:?}",
            e.counters()
        );
        e.ingest(skipped(&rs, 6), Instant::now());
        time::advance(Duration::from_millis(100)).await;
        e.poll(Instant::now());
    }
    let contained = e.contained();
    assert_eq!(contained.len(), 1);
    assert_eq!(contained[0].service, svc("hot"));
    assert!(
        Instant::now() - start >= Duration::from_secs(3),
        "after sustainedFor"
    );
    assert!(e.counters().skipped_events >= 150, "{:?}", e.counters());
    // An unknown ReplicaSet's skipped pods are nobody's churn.
    e.ingest(skipped(&svc("other-rs"), 1000), Instant::now());
    assert_eq!(e.contained().len(), 1);
}

fn skipped(rs: &NsName, events: u64) -> Change {
    Change::Skipped {
        replicaset: rs.clone(),
        events,
    }
}
