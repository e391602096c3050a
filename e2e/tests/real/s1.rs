//! S1 at the lane's scale: a crash loop of 10,000 pods behind one exported service on the real
//! server, the resolver straight on it and through Floodgate side by side, reported in the rows
//! `make bench` reports its S1 with ([`floodgate_e2e::report`]).

use std::time::{Duration, Instant};

use floodgate_e2e::process::Floodgate;
use floodgate_e2e::real::{Crashloop, RealKube, Resolver, ResolverReport};
use floodgate_e2e::report::{self, Figure};
use serde_json::Value;

use super::{
    CALM, floodgate, floodgate_in, is_calm, resolver_direct, resolver_through, resolver_whole,
    spec, whole,
};

/// Pods behind the flooding service (`FLOODGATE_REAL_S1_PODS` overrides).
fn s1_pods() -> usize {
    std::env::var("FLOODGATE_REAL_S1_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// Seconds of churn.
const CHURN_SECS: u64 = 60;

/// The flooding service as the resolver names it.
const FLOODER: &str = "flood/flood";

/// S1 at the lane's scale. The driver creates one exported service of 10,000 pods, about 2/3
/// Ready and named by 100 slices, and three calm services; Floodgate starts in front of it (the
/// flooding service over `endpointsPerService`, so contained from the first look), then the
/// resolver, direct and through Floodgate, syncs; then pods flip between Ready and
/// CrashLoopBackOff for a minute while the calm services roll a pod every 10 s, each roll's
/// slice stamped with the time of its write. Events counted from the sync on; each roll's delay
/// from its stamp to each resolver's handler. Once the churn is under way, a second Floodgate
/// starts cold and must be ready and serve the calm services whole within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn s1_flood_of_crash_looping_pods_at_lane_scale() {
    let pods = s1_pods();
    let kube = RealKube::start().await.expect("the real API server");
    let (mut driver, ready) = flood(&kube, pods).await;

    let mut s1 = spec();
    // The flooding service is contained from the first look; the calm ones never are.
    s1.quarantine.when.endpoints_per_service = 5_000;
    let started = Instant::now();
    let fg = floodgate(&kube, s1.clone()).await;
    println!(
        "Floodgate ready {:.1} s after its start, {pods} pods on the remote",
        started.elapsed().as_secs_f64()
    );
    let mut direct = resolver_direct(&kube, "direct");
    let mut through = resolver_through(&kube, &fg, "through");
    let d0 = whole(&mut direct, 120).await;
    let t0 = whole(&mut through, 120).await;
    println!(
        "synced: direct in {} ms, through Floodgate in {} ms",
        d0.sync_ms, t0.sync_ms
    );
    let (d0, t0) = (
        direct.latest().unwrap_or_default(),
        through.latest().unwrap_or_default(),
    );

    driver.go().await.expect("the churn begins");
    floodgate_e2e::until(30, "the churn under way", async || {
        driver
            .last_line()
            .is_some_and(|l| l["phase"] == "churn" && l["flips"].as_u64() >= Some(300))
    })
    .await;
    let cold = cold_start(&kube, s1).await;

    let done = churn_done(&mut driver, &ready).await;
    // The remote is calm again: both take in what is left and converge, the calm services whole.
    let quiet = Duration::from_secs(3);
    direct.settled(60, quiet).await.expect("direct settles");
    through.settled(60, quiet).await.expect("through settles");
    let d1 = whole(&mut direct, 30).await;
    let t1 = whole(&mut through, 30).await;

    let stamps = calm_stamps(&done);
    let (direct_staleness_ms, direct_missed) = staleness(&d1, &stamps);
    let (via_staleness_ms, via_missed) = staleness(&t1, &stamps);
    let figures = report::S1 {
        direct_events: d1.events_total() - d0.events_total(),
        via_events: t1.events_total() - t0.events_total(),
        direct_peak_kib: direct.peak_kib().unwrap_or(0),
        via_peak_kib: through.peak_kib().unwrap_or(0),
        floodgate_peak_kib: fg.pid().and_then(peak_kib).unwrap_or(0),
        direct_staleness_ms,
        via_staleness_ms,
        via_missed,
    };
    print_report(pods, &figures, &cold, &direct, &through, &t1);
    println!("  link: {}", fg.link_state().await);

    assert!(
        figures.direct_events > 1000,
        "the flood reached the direct consumer: {d1:?}"
    );
    assert!(
        figures.direct_events >= 100 * figures.via_events.max(1),
        "at least 100x fewer events through Floodgate: {figures:?}"
    );
    assert!(
        !stamps.is_empty(),
        "the calm services rolled during the churn: {done}"
    );
    assert_eq!(
        (direct_missed, via_missed),
        (0, 0),
        "every calm roll reached both resolvers: stamps {stamps:?}, direct {:?}, through {:?}",
        d1.stamped,
        t1.stamped
    );
    assert_eq!(t1.without_pod_where(is_calm), 0, "{t1:?}");
    assert_eq!(
        t1.without_pod_where(|s| s == FLOODER),
        0,
        "the contained service is served whole: {t1:?}"
    );
    assert!(
        cold.served <= Duration::from_secs(10),
        "a cold start during the flood serves the calm services within 10 s: {cold:?}"
    );
}

/// Starts the driver: the flooding service of `pods` pods and the calm services, created; the
/// churn waits for [`Crashloop::go`]. Returns it with its `ready` line.
async fn flood(kube: &RealKube, pods: usize) -> (Crashloop, Value) {
    let started = Instant::now();
    let mut driver = Crashloop::start(
        kube.kubeconfig_path(),
        &[
            "--pods",
            &pods.to_string(),
            "--calm-services",
            &CALM.to_string(),
            "--rate",
            "300",
            "--duration",
            &format!("{CHURN_SECS}s"),
            "--calm-roll-every",
            "10s",
            "--wait-stdin",
        ],
        kube.dir(),
    )
    .expect("the driver");
    let ready = driver.wait_ready(600).await.expect("the driver's objects");
    println!("setup: {ready} ({:.1} s)", started.elapsed().as_secs_f64());
    (driver, ready)
}

/// Waits for the end of the churn; returns the driver's last line, with every calm roll's stamp.
async fn churn_done(driver: &mut Crashloop, ready: &Value) -> Value {
    let done = driver
        .wait_exit(CHURN_SECS + 120)
        .await
        .expect("the churn ends");
    println!(
        "churn: {done}, about {:.0} writes/s reached",
        (done["writes"].as_f64().unwrap_or(0.0) - ready["writes"].as_f64().unwrap_or(0.0))
            / CHURN_SECS as f64
    );
    done
}

/// The stamps of the calm rolls the driver made (wall-clock ms), from its last line.
fn calm_stamps(done: &Value) -> Vec<u64> {
    done["calmStamps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
        .collect()
}

/// A cold start during the flood, from the start of the process.
#[derive(Debug)]
struct Cold {
    /// `/readyz` answered 200.
    ready: Duration,
    /// A fresh resolver had the calm services whole.
    served: Duration,
}

/// A second Floodgate, started once the churn is under way: how long until it is ready, and
/// until it serves the calm services whole to a fresh resolver.
async fn cold_start(kube: &RealKube, spec: floodgate_link_crd::LinkSpec) -> Cold {
    let started = Instant::now();
    let fg: Floodgate = floodgate_in(kube, "floodgate-cold", spec).await;
    let ready = started.elapsed();
    let _resolver = resolver_whole(kube, &fg, "cold", 30).await;
    let served = started.elapsed();
    println!(
        "cold start during the flood: ready in {:.1} s, the calm services whole in a resolver in {:.1} s",
        ready.as_secs_f64(),
        served.as_secs_f64()
    );
    Cold { ready, served }
}

/// Each stamp's delay to the resolver of `r` (ms, sorted), and how many never reached it.
fn staleness(r: &ResolverReport, stamps: &[u64]) -> (Vec<u64>, usize) {
    let mut delays: Vec<u64> = stamps
        .iter()
        .filter_map(|s| r.seen_at(*s).map(|at| at.saturating_sub(*s)))
        .collect();
    delays.sort_unstable();
    let missed = stamps.len() - delays.len();
    (delays, missed)
}

fn peak_kib(pid: u32) -> Option<u64> {
    floodgate_e2e::process::proc_status_kib(pid, "VmHWM")
}

/// `make bench`'s S1 rows, then the lane's own: the cold start, and what the resolver through
/// Floodgate could resolve.
fn print_report(
    pods: usize,
    s1: &report::S1,
    cold: &Cold,
    direct: &Resolver,
    through: &Resolver,
    end: &ResolverReport,
) {
    let name = format!("(real kube-apiserver 1.32, {pods} pods crash-looping, {CHURN_SECS} s)");
    let mut rows = Vec::new();
    report::s1_figures(&name, s1, &mut rows);
    rows.push(Figure::own(
        format!("S1 {name}: a cold start during the flood, ready / the calm services whole in a resolver"),
        format!(
            "{:.1} s / {:.1} s",
            cold.ready.as_secs_f64(),
            cold.served.as_secs_f64()
        ),
        "<= 10 s",
        Some(cold.served <= Duration::from_secs(10)),
    ));
    let calm_max = |r: &Resolver| {
        r.max_without_pod()
            .into_iter()
            .filter(|(s, _)| is_calm(s))
            .map(|(_, n)| n)
            .max()
            .unwrap_or(0)
    };
    let flooder = end.without_pod_where(|s| s == FLOODER);
    rows.push(Figure {
        what: format!("S1 {name}: ready endpoints without their pod in the resolver, any second"),
        direct: format!("calm max {}", calm_max(direct)),
        floodgate: format!(
            "calm max {}; flooder {flooder} of {} served while contained",
            calm_max(through),
            end.ready_by_service.get(FLOODER).copied().unwrap_or(0)
        ),
        ratio: String::new(),
        target: "0 calm; 0 flooder".into(),
        met: Some(calm_max(through) == 0 && flooder == 0),
    });
    // As Linkerd's destination resolves: each ready endpoint's pod looked up when the slice's
    // handler runs, a miss an address lost until the slice changes again.
    let lost = |r: &Resolver| {
        r.latest().map_or((0, 0), |l| {
            let flooder = l.lost_at_event_where(|s| s == FLOODER);
            (l.lost_at_event_where(is_calm), flooder)
        })
    };
    let ((direct_calm, direct_flooder), (calm, flooder)) = (lost(direct), lost(through));
    rows.push(Figure {
        what: format!("S1 {name}: addresses lost at the slice event (calm; flooder)"),
        direct: format!("{direct_calm}; {direct_flooder}"),
        floodgate: format!("{calm}; {flooder}"),
        ratio: String::new(),
        target: "0 calm".into(),
        met: Some(calm == 0),
    });
    println!("\n{}\n", report::machine_line(&report::machine()));
    println!("{}", report::table(&rows));
}
