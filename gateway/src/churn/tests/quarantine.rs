//! Flood detection and the quarantine state machine, through the engine: every transition,
//! the frozen view, the dropped cache and auto-release backoff.

use std::time::Duration;

use super::*;

fn flood_spec() -> LinkSpec {
    let mut spec = mk_spec();
    spec.quarantine.when.events_per_second = 100;
    // These tests are about the link: no single service is contained on its own.
    spec.quarantine.when.service_events_per_second = 1_000_000;
    spec.quarantine.when.sustained_for = KubeDuration::from_secs(3);
    spec
}

/// Sustained churn quarantines the link: the view freezes, upstream stops, memory is dropped.
#[tokio::test(start_paused = true)]
async fn sustained_churn_quarantines_and_freezes_the_view() {
    let mut e = synced(
        &flood_spec(),
        vec![mk_service("a", true), mk_slice("a", "a-1", &[(1, true)])],
    );
    let mut quarantined_at = None;
    for tick in 0..100u32 {
        for i in 0..30u32 {
            apply(
                &mut e,
                mk_slice("a", "a-1", &[(1, true), (2 + i, tick.is_multiple_of(2))]),
            );
        }
        time::advance(Duration::from_millis(100)).await;
        e.poll(Instant::now());
        if quarantined_at.is_none() && e.phase() == Phase::Quarantined {
            quarantined_at = Some(tick);
        }
    }
    // 300 events/s against 100/s for 3 s.
    let tick = quarantined_at.expect("quarantined");
    assert!((28..=32).contains(&tick), "quarantined at tick {tick}");
    let effects = e.take_effects();
    assert!(effects.contains(&Effect::StopUpstream));
    assert!(
        effects
            .iter()
            .any(|f| matches!(f, Effect::Transition(t) if t.reason.as_str() == "EventRate"))
    );
    assert_eq!(e.objects_held(), 0, "the upstream cache is dropped");
    assert_eq!(
        e.view().len(Kind::Service),
        1,
        "consumers keep the last good view"
    );
    let rv = e.view().resource_version();
    apply(&mut e, mk_slice("a", "a-1", &[]));
    run(&mut e, Duration::from_secs(5), Duration::from_millis(100)).await;
    assert_eq!(e.view().resource_version(), rv, "frozen");
}

/// Release: upstream restarts, and once it has relisted the view converges to it.
#[tokio::test(start_paused = true)]
async fn release_restarts_upstream_and_converges() {
    let mut e = synced(
        &mk_spec(),
        vec![mk_service("a", true), mk_service("b", true)],
    );
    assert_eq!(
        e.release("an operator").err(),
        Some(RequestError::NotQuarantined)
    );
    e.quarantine(Instant::now(), "maintenance")
        .expect("quarantine");
    assert_eq!(
        e.quarantine(Instant::now(), "again").err(),
        Some(RequestError::AlreadyQuarantined)
    );
    assert!(e.take_effects().contains(&Effect::StopUpstream));
    e.release("an operator").expect("release");
    assert!(e.take_effects().contains(&Effect::StartUpstream));
    relist(&mut e, vec![mk_service("a", true), mk_service("c", true)]);
    run(&mut e, Duration::from_secs(2), Duration::from_millis(50)).await;
    let names: Vec<String> = e
        .view()
        .list(Kind::Service)
        .items
        .iter()
        .filter_map(|s| s.object.meta().name.clone())
        .collect();
    assert_eq!(names, ["a", "c"]);
    assert_eq!(e.phase(), Phase::Healthy);
}

/// Auto-release re-checks after the cool-down, doubles it while the flood persists, and
/// releases once a re-check passes.
#[tokio::test(start_paused = true)]
async fn auto_release_backs_off_while_the_flood_persists() {
    let mut spec = flood_spec();
    spec.quarantine.auto_release = Some(AutoRelease {
        after: KubeDuration::from_secs(10),
        max_after: KubeDuration::from_secs(15),
    });
    let mut e = synced(
        &spec,
        vec![mk_service("a", true), mk_slice("a", "a-1", &[(1, true)])],
    );
    e.quarantine(Instant::now(), "x").expect("manual");
    e.release("an operator").expect("manual release");
    relist(
        &mut e,
        vec![mk_service("a", true), mk_slice("a", "a-1", &[(1, true)])],
    );
    e.poll(Instant::now());
    // Flood until quarantined.
    let flood = |e: &mut Engine, round: u32| {
        for i in 0..30u32 {
            apply(
                e,
                mk_slice("a", "a-1", &[(1, true), (2 + i, round.is_multiple_of(2))]),
            );
        }
    };
    let mut round = 0;
    while e.phase() != Phase::Quarantined {
        assert!(round < 1000, "the flood quarantines the link");
        flood(&mut e, round);
        round += 1;
        time::advance(Duration::from_millis(100)).await;
        e.poll(Instant::now());
    }
    let q0 = Instant::now();
    e.take_effects();
    // Cool-down of 10 s, then a re-check that sees the flood again.
    time::advance(Duration::from_secs(10)).await;
    e.poll(Instant::now());
    assert!(matches!(e.state(), State::Rechecking { .. }));
    assert!(e.take_effects().contains(&Effect::StartUpstream));
    relist(
        &mut e,
        vec![mk_service("a", true), mk_slice("a", "a-1", &[(1, true)])],
    );
    while matches!(e.state(), State::Rechecking { .. }) {
        assert!(round < 1000, "the re-check sees the flood");
        flood(&mut e, round);
        round += 1;
        time::advance(Duration::from_millis(100)).await;
        e.poll(Instant::now());
    }
    let State::Quarantined(q) = e.state() else {
        panic!("back in quarantine")
    };
    assert_eq!(
        q.cooldown,
        Some(Duration::from_secs(15)),
        "doubled, capped at maxAfter"
    );
    assert!(Instant::now() - q0 < Duration::from_secs(15));
    // The next re-check sees calm and releases.
    time::advance(Duration::from_secs(15)).await;
    e.poll(Instant::now());
    relist(
        &mut e,
        vec![mk_service("a", true), mk_slice("a", "a-1", &[(1, false)])],
    );
    run(&mut e, Duration::from_secs(8), Duration::from_millis(100)).await;
    assert_eq!(e.phase(), Phase::Healthy);
    let slice = e
        .view()
        .get(&ObjKey {
            kind: Kind::EndpointSlice,
            id: NsName::new("ns", "a-1"),
        })
        .expect("slice");
    let Object::EndpointSlice(s) = &slice.object else {
        panic!()
    };
    assert_eq!(
        Some(s.len()),
        Some(1),
        "converged to the calm upstream state"
    );
}

/// A flood before the first complete sync quarantines the link, which publishes what it had
/// listed, capped, and counts as synced: a quarantine never keeps consumers from syncing.
#[tokio::test(start_paused = true)]
async fn a_flood_before_the_first_sync_publishes_what_was_listed_and_syncs() {
    let mut spec = mk_spec();
    spec.caps.max_objects = 50;
    spec.caps.max_services = 40;
    let now = Instant::now();
    let mut e = Engine::new(&spec, &KINDS, View::new(1, 100), now);
    e.ingest(Change::InitStart(Kind::Service), now);
    for i in 0..60 {
        e.ingest(Change::Apply(mk_service(&format!("s{i}"), true)), now);
    }
    e.poll(now);
    let State::Quarantined(q) = e.state() else {
        panic!("quarantined")
    };
    assert!(q.before_first_sync);
    assert_eq!(q.trigger.figures.get("objects"), Some(&51));
    assert!(e.synced_once(), "a quarantined link counts as synced");
    assert_eq!(
        e.view().len(Kind::Service),
        40,
        "what was listed is served, within caps.maxServices"
    );
    let effects = e.take_effects();
    assert!(effects.iter().any(
        |f| matches!(f, Effect::Transition(t) if t.message.contains("serving what was listed"))
    ));
}

/// Too many endpoints behind one service contain that service, not the link.
#[tokio::test(start_paused = true)]
async fn endpoints_over_the_threshold_contain_the_service() {
    let mut spec = mk_spec();
    spec.quarantine.when.endpoints_per_service = 1000;
    let mut e = synced(&spec, vec![mk_service("a", true)]);
    for s in 0..11u32 {
        let eps: Vec<(u32, bool)> = (s * 100..(s + 1) * 100).map(|i| (i, false)).collect();
        apply(&mut e, mk_slice("a", &format!("a-{s}"), &eps));
    }
    assert_eq!(e.state(), &State::Active, "the link is not quarantined");
    let contained = e.contained();
    assert_eq!(contained.len(), 1);
    assert_eq!(contained[0].service, NsName::new("ns", "a"));
    assert_eq!(
        contained[0].quarantine.trigger.figures.get("endpoints"),
        Some(&1100),
        "tripped by the 11th slice"
    );
}

/// A quarantine saved before a restart comes back with its view; on release the link follows
/// upstream again and deletes what is gone there.
#[tokio::test(start_paused = true)]
async fn a_restored_quarantine_serves_its_view_and_converges_on_release() {
    use crate::churn::restore::Saved;
    let before = vec![
        mk_service("web", true),
        mk_slice("web", "web-1", &[(1, true)]),
        mk_pod("web-1", "Running"),
        mk_service("old", true),
    ];
    let mut first = synced(&mk_spec(), before);
    first
        .quarantine(Instant::now(), "maintenance")
        .expect("quarantined");
    let objects: Vec<Object> = KINDS
        .iter()
        .flat_map(|k| first.view().list(*k).items)
        .map(|s| s.object.clone())
        .collect();
    assert_eq!(objects.len(), 4);

    let now = Instant::now();
    let mut e = Engine::new(&mk_spec(), &KINDS, View::new(2, 1000), now);
    e.restore_quarantined(
        now,
        Saved {
            trigger: crate::churn::flood::Trigger::manual("maintenance"),
            since: now,
            before_first_sync: false,
            cooldown: None,
            objects,
        },
    );
    assert_eq!(e.phase(), Phase::Quarantined);
    assert!(e.synced_once(), "a restored view is served at once");
    assert_eq!(e.view().len(Kind::Service), 2);
    assert_eq!(e.counters().services, 2);
    run(&mut e, Duration::from_secs(30), Duration::from_secs(1)).await;
    assert_eq!(e.view().len(Kind::Service), 2, "frozen while quarantined");

    e.release("an operator").expect("released");
    assert!(e.take_effects().contains(&Effect::StartUpstream));
    relist(
        &mut e,
        vec![
            mk_service("web", true),
            mk_slice("web", "web-1", &[(2, true)]),
            mk_pod("web-2", "Running"),
        ],
    );
    run(&mut e, Duration::from_secs(5), Duration::from_millis(100)).await;
    assert_eq!(e.phase(), Phase::Healthy);
    assert!(
        e.view()
            .get(&ObjKey {
                kind: Kind::Service,
                id: NsName::new("ns", "old")
            })
            .is_none(),
        "gone upstream, deleted downstream"
    );
    let pods: Vec<String> = e
        .view()
        .list(Kind::Pod)
        .items
        .iter()
        .map(|s| s.object.key().id.to_string())
        .collect();
    assert_eq!(pods, ["ns/web-2"]);
}
