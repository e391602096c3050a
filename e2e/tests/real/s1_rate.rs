//! S1 under the endpoint threshold: 15,000 crash-looping pods behind one exported service,
//! under `endpointsPerService` (20,000), so the service is contained by its event rate alone,
//! most of its events being pod events the pod watcher skips (no kept endpoint names those
//! pods). They count towards `serviceEventsPerSecond` all the same.
//!
//! The crash loop runs at 100 writes/s (50 flips: a pod's status, then its slice), a rate a
//! loaded 2-core machine sustains beside the server, against `serviceEventsPerSecond` 75: the
//! slice changes and the kept pods' events alone come to about 53 a second, under it; with
//! the skipped pod events, about 100, over it. A detector that did not count what the pod
//! watcher skips never contains this service.

use std::time::{Duration, Instant};

use floodgate_e2e::admin;
use floodgate_e2e::process::Floodgate;
use floodgate_e2e::real::{Crashloop, RealKube};

use super::{CALM, floodgate, resolver_direct, resolver_through, spec, whole};

/// Pods behind the flooding service (`FLOODGATE_REAL_S1_RATE_PODS` overrides).
fn pods() -> usize {
    std::env::var("FLOODGATE_REAL_S1_RATE_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15_000)
}

/// The crash loop's writes a second and the link's `serviceEventsPerSecond`
/// (`FLOODGATE_REAL_S1_RATE=350/200` runs the figures on a machine that sustains them).
fn rate() -> (u32, u32) {
    std::env::var("FLOODGATE_REAL_S1_RATE")
        .ok()
        .and_then(|v| {
            let (w, t) = v.split_once('/')?;
            Some((w.parse().ok()?, t.parse().ok()?))
        })
        .unwrap_or((100, 75))
}

const CHURN_SECS: u64 = 60;

async fn contained(fg: &Floodgate) -> bool {
    let v = admin::link(fg.admin, "east").await.unwrap_or_default();
    (v["contained"].as_array().into_iter().flatten()).any(|c| c["service"] == "flood/flood")
}

/// The crash loop at 100 writes/s: the flooding service is contained within 20 s of the
/// churn's start (`sustainedFor` is 10 s), and the resolver through Floodgate loses no address
/// at a slice event; the events it gets are printed beside direct's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn s1_under_the_endpoint_threshold_is_contained_by_its_event_rate() {
    let pods = pods();
    let (writes, threshold) = rate();
    let kube = RealKube::start().await.expect("the real API server");
    let started = Instant::now();
    let mut driver = Crashloop::start(
        kube.kubeconfig_path(),
        &[
            "--pods",
            &pods.to_string(),
            "--calm-services",
            &CALM.to_string(),
            "--rate",
            &writes.to_string(),
            "--duration",
            &format!("{CHURN_SECS}s"),
            "--calm-roll-every",
            "10s",
            "--wait-stdin",
        ],
        kube.dir(),
    )
    .expect("the driver");
    driver.wait_ready(900).await.expect("the driver's objects");
    println!(
        "setup: {pods} pods in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut spec = spec();
    spec.quarantine.when.service_events_per_second = threshold;
    let fg = floodgate(&kube, spec).await;
    let mut direct = resolver_direct(&kube, "direct");
    let mut through = resolver_through(&kube, &fg, "through");
    let d0 = whole(&mut direct, 120).await;
    let t0 = whole(&mut through, 120).await;
    assert!(!contained(&fg).await, "not contained before the churn");

    driver.go().await.expect("the churn begins");
    let churn = Instant::now();
    let mut last_print = Instant::now();
    while !contained(&fg).await {
        if last_print.elapsed() >= Duration::from_secs(5)
            || churn.elapsed() > Duration::from_secs(60)
        {
            last_print = Instant::now();
            let v = admin::link(fg.admin, "east").await.unwrap_or_default();
            println!(
                "  {:.0} s: not contained; relevant events last second {}, upstream pods skipped {}; driver {}",
                churn.elapsed().as_secs_f64(),
                v["counters"]["eventsLastSecond"],
                v["counters"]["upstreamPodsSkipped"],
                driver.last_line().unwrap_or_default()
            );
            assert!(
                churn.elapsed() <= Duration::from_secs(60),
                "not contained within 60 s"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let took = churn.elapsed();
    driver
        .wait_exit(CHURN_SECS + 60)
        .await
        .expect("the churn ends");
    let quiet = Duration::from_secs(3);
    let d1 = direct.settled(60, quiet).await.expect("direct settles");
    let t1 = through.settled(60, quiet).await.expect("through settles");
    let (d, t) = (
        d1.events_total() - d0.events_total(),
        t1.events_total() - t0.events_total(),
    );
    println!(
        "S1 under the endpoint threshold ({pods} pods, {writes} writes/s asked, serviceEventsPerSecond {threshold}, {CHURN_SECS} s): contained {:.1} s after the churn began; events {t} through Floodgate, {d} direct ({:.1}x); lost at the slice event through: {} {:?}, direct: {}",
        took.as_secs_f64(),
        d as f64 / t.max(1) as f64,
        t1.lost_at_event_where(|_| true),
        t1.lost_at_event_by_service,
        d1.lost_at_event_where(|_| true),
    );
    println!("  link: {}", fg.link_state().await);
    assert!(
        took <= Duration::from_secs(20),
        "contained within 20 s of the churn's start: {took:?}"
    );
    // The capped flooder's kept subset changes as its endpoints flip until it is contained:
    // each pod swapped in reaches the consumer before the slice that names it.
    assert_eq!(
        t1.lost_at_event_where(|_| true),
        0,
        "addresses lost at the slice event through Floodgate: {:?}",
        t1.lost_at_event_by_service
    );
}
