//! The order a consumer receives the view in, on the real server: a scale-up one pod at a
//! time, each pod created Ready and then named by its slice (what the ReplicaSet controller,
//! the kubelet and the EndpointSlice controller write, played by the crash-loop driver's
//! `--calm-scale-to`). client-go resolvers that resolve each ready endpoint's pod at the slice
//! event, as Linkerd's destination does, direct and through Floodgate side by side.

use floodgate_e2e::real::{Crashloop, RealKube};

use super::s1::{calm_stamps, staleness};
use super::{floodgate, resolver_direct, resolver_through, spec};

const SERVICE: &str = "calm/calm-0";

/// Every step of a 3 -> 10 scale-up reaches the resolver through Floodgate with no address
/// lost at the event, as direct; each within direct's time + 50 ms at p99 (with room for a
/// loaded 2-core machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn a_scale_up_reaches_a_client_go_resolver_at_the_event_through_floodgate() {
    let kube = RealKube::start().await.expect("the real API server");
    let args = [
        "--calm-services",
        "1",
        "--calm-scale-to",
        "10",
        "--calm-roll-every",
        "400ms",
        "--duration",
        "4s",
        "--wait-stdin",
    ];
    let mut driver = Crashloop::start(kube.kubeconfig_path(), &args, kube.dir()).expect("driver");
    driver
        .wait_ready(60)
        .await
        .expect("the service and its 3 pods");
    let fg = floodgate(&kube, spec()).await;
    let mut direct = resolver_direct(&kube, "direct");
    let mut through = resolver_through(&kube, &fg, "through");
    for r in [&mut direct, &mut through] {
        r.wait_for(60, "the service's 3 addresses", |r| {
            r.synced && r.ready_by_service.get(SERVICE) == Some(&3)
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    }
    driver.go().await.expect("go");
    let done = driver.wait_exit(60).await.expect("the driver's scale-up");
    let stamps = calm_stamps(&done);
    assert_eq!(stamps.len(), 7, "seven steps: {done}");
    let mut reports = Vec::new();
    for r in [&mut direct, &mut through] {
        let report = r
            .wait_for(30, "every step", |r| {
                stamps.iter().all(|s| r.seen_at(*s).is_some())
                    && r.ready_by_service.get(SERVICE) == Some(&10)
            })
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        reports.push(report);
    }
    let (d, t) = (&reports[0], &reports[1]);
    let (d_delays, _) = staleness(d, &stamps);
    let (t_delays, _) = staleness(t, &stamps);
    let p99 = |v: &[u64]| v[(v.len() * 99 / 100).min(v.len() - 1)];
    let in_order = |r: &floodgate_e2e::real::ResolverReport| -> Vec<u64> {
        (stamps.iter())
            .filter_map(|s| r.seen_at(*s).map(|at| at.saturating_sub(*s)))
            .collect()
    };
    println!(
        "step by step, through / direct: {:?} / {:?}",
        in_order(t),
        in_order(d)
    );
    println!(
        "real scale-up 3 -> 10 one pod at a time: from the slice's write, p99 {} ms through Floodgate, {} ms direct (each: {t_delays:?} / {d_delays:?}); addresses lost at the slice event: {} through, {} direct",
        p99(&t_delays),
        p99(&d_delays),
        t.lost_at_event_where(|s| s == SERVICE),
        d.lost_at_event_where(|s| s == SERVICE),
    );
    assert_eq!(d.lost_at_event_where(|s| s == SERVICE), 0, "direct: {d:?}");
    assert_eq!(t.lost_at_event_where(|s| s == SERVICE), 0, "through: {t:?}");
    assert!(
        p99(&t_delays) <= p99(&d_delays) + 50 + 100,
        "{t_delays:?} through, {d_delays:?} direct"
    );
}
