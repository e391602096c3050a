//! A link-wide removal through the engine: the remote removes a large share of what the link
//! serves at once, and the link is quarantined with its last view served, the first removals
//! held so none escapes; what must flow as before (one service deleted, unexported, scaled to
//! zero, its endpoints not ready, a small remote) flows.

use std::time::Duration;

use super::*;
use crate::churn::flood::Reason;
use crate::churn::removal::QUIET;

const FIVE: [&str; 5] = ["s0", "s1", "s2", "s3", "s4"];

fn svc_key(name: &str) -> ObjKey {
    ObjKey {
        kind: Kind::Service,
        id: NsName::new("ns", name),
    }
}

fn slice_key(name: &str) -> ObjKey {
    ObjKey {
        kind: Kind::EndpointSlice,
        id: NsName::new("ns", name),
    }
}

/// `names`, each with a slice of `per` ready endpoints.
fn world(names: &[&str], per: u32) -> Vec<Object> {
    let mut objects = Vec::new();
    for (i, n) in names.iter().enumerate() {
        objects.push(mk_service(n, true));
        let eps: Vec<(u32, bool)> = (0..per).map(|j| (100 * i as u32 + j, true)).collect();
        objects.push(mk_slice(n, &format!("{n}-1"), &eps));
    }
    objects
}

fn delete(e: &mut Engine, key: ObjKey) {
    e.ingest(Change::Delete(key), Instant::now());
}

/// A service and its slice deleted, as a namespace's deletion removes them.
fn delete_service(e: &mut Engine, name: &str) {
    delete(e, slice_key(&format!("{name}-1")));
    delete(e, svc_key(name));
}

fn served(e: &Engine) -> usize {
    e.view().len(Kind::Service)
}

fn reason(e: &Engine) -> Option<Reason> {
    match e.state() {
        State::Quarantined(q) => Some(q.trigger.reason),
        _ => None,
    }
}

/// Polls in 50 ms steps until `done`, at most `within`; returns how long it took.
async fn until(e: &mut Engine, within: Duration, done: impl Fn(&Engine) -> bool) -> Duration {
    let start = Instant::now();
    while !done(e) {
        assert!(start.elapsed() < within, "not within {within:?}");
        time::advance(Duration::from_millis(50)).await;
        e.poll(Instant::now());
    }
    start.elapsed()
}

/// Three of five services deleted 300 ms apart (a namespace's deletion): none leaves the view,
/// the link is quarantined at the third with the share in its reason; after an operator's
/// release the relist's smaller world reaches consumers.
#[tokio::test(start_paused = true)]
async fn a_namespace_deleted_quarantines_the_link_with_its_view_served() {
    let mut e = synced(&mk_spec(), world(&FIVE, 2));
    assert_eq!(served(&e), 5);
    for name in ["s0", "s1", "s2"] {
        delete_service(&mut e, name);
        if reason(&e).is_some() {
            break;
        }
        for _ in 0..6 {
            time::advance(Duration::from_millis(50)).await;
            e.poll(Instant::now());
        }
        assert_eq!(served(&e), 5, "{name}'s removal waits for what follows it");
    }
    let State::Quarantined(q) = e.state() else {
        panic!("quarantined, not {:?}", e.state())
    };
    assert_eq!(q.trigger.reason, Reason::MassRemoval);
    assert!(
        q.trigger
            .message
            .contains("removed 60% of its exported services"),
        "{}",
        q.trigger.message
    );
    assert_eq!(q.trigger.figures.get("removedServices"), Some(&3));
    assert!(e.take_effects().contains(&Effect::StopUpstream));
    run(&mut e, Duration::from_secs(5), Duration::from_millis(100)).await;
    assert_eq!(served(&e), 5, "the last view is served while quarantined");

    e.release("an operator").expect("released");
    assert!(e.take_effects().contains(&Effect::StartUpstream));
    relist(&mut e, world(&["s3", "s4"], 2));
    until(&mut e, Duration::from_secs(10), |e| served(e) == 2).await;
    assert_eq!(reason(&e), None, "the release let the removals through");
    assert_eq!(e.state(), &State::Active);
}

/// One service deleted, one unexported, one scaled to zero, one whose endpoints all turn not
/// ready, each alone: each reaches consumers within `QUIET` plus the usual coalescing, and
/// the link is never quarantined.
#[tokio::test(start_paused = true)]
async fn one_service_removed_at_a_time_flows() {
    let mut e = synced(&mk_spec(), world(&FIVE, 2));
    delete_service(&mut e, "s0");
    let took = until(&mut e, Duration::from_secs(5), |e| served(e) == 4).await;
    assert!(took <= QUIET + Duration::from_millis(500), "{took:?}");

    apply(&mut e, mk_service("s1", false));
    let took = until(&mut e, Duration::from_secs(5), |e| served(e) == 3).await;
    assert!(took <= QUIET + Duration::from_millis(500), "{took:?}");

    apply(&mut e, mk_slice("s2", "s2-1", &[]));
    let took = until(&mut e, Duration::from_secs(5), |e| {
        e.view()
            .get(&slice_key("s2-1"))
            .is_some_and(|s| slice_endpoints(&s.object) == 0)
    })
    .await;
    assert!(took <= QUIET + Duration::from_millis(500), "{took:?}");

    apply(
        &mut e,
        mk_slice("s3", "s3-1", &[(300, false), (301, false)]),
    );
    until(&mut e, Duration::from_secs(5), |e| {
        e.view()
            .get(&slice_key("s3-1"))
            .is_some_and(|s| ready_endpoints(&s.object) == 0)
    })
    .await;
    assert_eq!(reason(&e), None);
    assert_eq!(e.state(), &State::Active);
}

fn slice_endpoints(o: &Object) -> usize {
    match o {
        Object::EndpointSlice(s) => s.endpoints().count(),
        _ => usize::MAX,
    }
}

fn ready_endpoints(o: &Object) -> usize {
    match o {
        Object::EndpointSlice(s) => s.endpoints().filter(|(_, ready)| *ready).count(),
        _ => usize::MAX,
    }
}

/// A remote that is simply small: its only service deleted, or one of its two, flows.
#[tokio::test(start_paused = true)]
async fn a_small_remote_that_removes_a_service_is_not_a_mass_removal() {
    let mut e = synced(&mk_spec(), world(&["only"], 1));
    delete_service(&mut e, "only");
    until(&mut e, Duration::from_secs(5), |e| served(e) == 0).await;
    assert_eq!(reason(&e), None);

    let mut e = synced(&mk_spec(), world(&["a", "b"], 3));
    delete_service(&mut e, "a");
    until(&mut e, Duration::from_secs(5), |e| served(e) == 1).await;
    assert_eq!(
        reason(&e),
        None,
        "one service of two is not a link-wide removal"
    );
}

/// A relist (a watch expired, the remote restored from an old backup) that lists one of five
/// services is a link-wide removal too.
#[tokio::test(start_paused = true)]
async fn a_relist_that_comes_back_much_smaller_quarantines_the_link() {
    let mut e = synced(&mk_spec(), world(&FIVE, 2));
    relist(&mut e, world(&["s4"], 2));
    assert_eq!(reason(&e), Some(Reason::MassRemoval), "{:?}", e.state());
    run(&mut e, Duration::from_secs(3), Duration::from_millis(100)).await;
    assert_eq!(served(&e), 5);
}

/// Every service keeps a few endpoints but most are gone: a link-wide removal of endpoints.
/// A service's own scale-down is not one.
#[tokio::test(start_paused = true)]
async fn most_endpoints_removed_across_services_quarantine_the_link() {
    let mut e = synced(&mk_spec(), world(&FIVE, 10));
    apply(&mut e, mk_slice("s0", "s0-1", &[(0, true)]));
    until(&mut e, Duration::from_secs(5), |e| {
        e.view()
            .get(&slice_key("s0-1"))
            .is_some_and(|s| slice_endpoints(&s.object) == 1)
    })
    .await;
    assert_eq!(reason(&e), None, "one service scaled down");
    time::advance(QUIET * 2).await;
    e.poll(Instant::now());

    for (i, n) in FIVE.iter().enumerate().skip(1) {
        let base = 100 * i as u32;
        apply(&mut e, mk_slice(n, &format!("{n}-1"), &[(base, true)]));
    }
    let State::Quarantined(q) = e.state() else {
        panic!("quarantined, not {:?}", e.state())
    };
    assert!(
        q.trigger.message.contains("of its exported endpoints"),
        "{}",
        q.trigger.message
    );
}

/// With `removedShare` 100 the guard is off: every service deleted at once flows.
#[tokio::test(start_paused = true)]
async fn a_share_of_100_turns_the_guard_off() {
    let mut spec = mk_spec();
    spec.quarantine.when.removed_share = 100;
    let mut e = synced(&spec, world(&FIVE, 2));
    for n in FIVE {
        delete_service(&mut e, n);
    }
    until(&mut e, Duration::from_secs(5), |e| served(e) == 0).await;
    assert_eq!(reason(&e), None);
}
