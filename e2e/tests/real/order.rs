//! The order a consumer receives the view in, on the real server: the shapes a real cluster
//! makes, written in its controllers' order by the crash-loop driver's `--calm-plan` (what the
//! ReplicaSet controller, the kubelet and the EndpointSlice controller write): a scale-up one pod
//! at a time (3 -> 10), a burst (10 -> 200), a scale-down (200 -> 5: endpoints dropped, then the
//! pods deleted) and a rolling update (each pod replaced by one of a new ReplicaSet). client-go
//! resolvers that resolve each ready endpoint's pod at the slice event, as Linkerd's destination
//! does, direct and through Floodgate side by side: through `floodgate run`, and through the
//! follower of two `floodgate controller` replicas (it republishes the Lease holder's view).

use std::collections::BTreeMap;

use floodgate_e2e::process::Floodgate;
use floodgate_e2e::real::{Crashloop, RealKube, ResolverReport};
use serde_json::Value;

use super::replicas::two_replicas;
use super::{floodgate, resolver_direct, resolver_through, spec};

/// The namespace of the service the plan drives (beside the calm services of the cluster-mode
/// setup), and the service.
const NS: &str = "shapes";
const SERVICE: &str = "shapes/calm-0";
const PLAN: &str = "grow:10,burst:200,shrink:5,rollout";

/// One step the driver carried out: its shape, its slices' stamp, the pods after it.
struct Step {
    shape: String,
    stamp: u64,
    pods: u64,
}

fn steps(done: &Value) -> Vec<Step> {
    (done["calmSteps"].as_array().into_iter().flatten())
        .map(|s| Step {
            shape: s["shape"].as_str().unwrap_or_default().to_owned(),
            stamp: s["stamp"].as_u64().unwrap_or_default(),
            pods: s["pods"].as_u64().unwrap_or_default(),
        })
        .collect()
}

/// Per shape, each step's delay from its slice write to the resolver's handler (ms, in order).
fn delays(r: &ResolverReport, steps: &[Step]) -> BTreeMap<String, Vec<u64>> {
    let mut by_shape = BTreeMap::<String, Vec<u64>>::new();
    for s in steps {
        let at = r.seen_at(s.stamp).expect("every step was waited for");
        by_shape
            .entry(s.shape.clone())
            .or_default()
            .push(at.saturating_sub(s.stamp));
    }
    by_shape
}

fn p99(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

/// Every step of every shape reaches the resolver through `floodgate run` with no address lost
/// at the event, as direct; each scale-up step within direct's time + 50 ms at p99 (with room
/// for a loaded 2-core machine), every other step within 2 s of direct's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn the_shapes_of_a_real_cluster_reach_a_client_go_resolver_at_the_event_through_floodgate() {
    let kube = RealKube::start().await.expect("the real API server");
    let fg = floodgate(&kube, spec()).await;
    shapes(&kube, &fg, "floodgate run").await;
}

/// The same through the follower of two `floodgate controller` replicas under the shipped
/// RBAC: it serves the holder's view as the holder publishes it, and the order holds there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn the_shapes_of_a_real_cluster_reach_a_resolver_through_a_follower_replica() {
    let kube = RealKube::start().await.expect("the real API server");
    let (replicas, holder) = two_replicas(&kube).await;
    let follower = if holder == "floodgate-0" {
        &replicas[1]
    } else {
        &replicas[0]
    };
    shapes(&kube, follower, "a follower replica").await;
}

/// Drives the plan on a service of its own and judges it through `fg` beside direct.
async fn shapes(kube: &RealKube, fg: &Floodgate, path: &str) {
    let args = [
        "--calm-namespace",
        NS,
        "--calm-services",
        "1",
        "--calm-plan",
        PLAN,
        "--calm-roll-every",
        "400ms",
        "--duration",
        "60s",
        "--wait-stdin",
    ];
    let mut driver = Crashloop::start(kube.kubeconfig_path(), &args, kube.dir()).expect("driver");
    driver
        .wait_ready(60)
        .await
        .expect("the service and its 3 pods");
    let mut direct = resolver_direct(kube, "direct");
    let mut through = resolver_through(kube, fg, "through");
    for r in [&mut direct, &mut through] {
        r.wait_for(60, "the service's 3 addresses", |r| {
            r.synced && r.ready_by_service.get(SERVICE) == Some(&3)
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    }
    driver.go().await.expect("go");
    let done = driver.wait_exit(90).await.expect("the driver's plan");
    let steps = steps(&done);
    let shapes: Vec<(&str, u64)> = steps.iter().map(|s| (s.shape.as_str(), s.pods)).collect();
    assert_eq!(
        shapes.iter().filter(|(s, _)| *s == "grow").count(),
        7,
        "seven scale-up steps: {done}"
    );
    assert!(
        shapes.contains(&("burst", 200)) && shapes.contains(&("shrink", 5)),
        "{done}"
    );
    assert_eq!(
        shapes.iter().filter(|(s, _)| *s == "rollout").count(),
        5,
        "five rollout steps: {done}"
    );
    let mut reports = Vec::new();
    for r in [&mut direct, &mut through] {
        let report = r
            .wait_for(30, "every step", |r| {
                steps.iter().all(|s| r.seen_at(s.stamp).is_some())
                    && r.ready_by_service.get(SERVICE) == Some(&5)
            })
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        reports.push(report);
    }
    let (d, t) = (&reports[0], &reports[1]);
    let (d_delays, t_delays) = (delays(d, &steps), delays(t, &steps));
    for (shape, through_ms) in &t_delays {
        println!(
            "real {shape} ({PLAN}) through {path}: from the slice's write, {through_ms:?} ms through, direct {:?} ms",
            d_delays[shape]
        );
    }
    println!(
        "real shapes ({PLAN}) through {path}: addresses lost at the slice event: {} through, {} direct",
        t.lost_at_event_where(|s| s == SERVICE),
        d.lost_at_event_where(|s| s == SERVICE),
    );
    assert_eq!(d.lost_at_event_where(|s| s == SERVICE), 0, "direct: {d:?}");
    assert_eq!(
        t.lost_at_event_where(|s| s == SERVICE),
        0,
        "through {path}: {t:?}"
    );
    let (tg, dg) = (&t_delays["grow"], &d_delays["grow"]);
    assert!(
        p99(tg) <= p99(dg) + 50 + 100,
        "scale-up through {path}: {tg:?} through, {dg:?} direct"
    );
    for (shape, through_ms) in &t_delays {
        assert!(
            p99(through_ms) <= p99(&d_delays[shape]) + 2_000,
            "{shape} through {path}: {through_ms:?} through, {:?} direct",
            d_delays[shape]
        );
    }
}
