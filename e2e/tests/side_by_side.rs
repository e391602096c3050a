//! The demo's and the scenario benchmarks' machinery at a small scale, with every process real:
//! kube-sim floods, `floodgate run` follows it, two `consumer` processes watch (one direct, one
//! through Floodgate). The figures the report prints come from here, so they are checked here.
//!
//! The consumer behind Floodgate also resolves as Linkerd's destination does (each ready
//! endpoint looked up by its pod): a calm service never has a ready endpoint without its pod
//! for more than 2 s, nor, once contained, does the flooder, which keeps at least one ready
//! endpoint (issue 32; until the engine serves a contained service's pods, the flooder's
//! assertions fail).

use std::time::Duration;

use floodgate_e2e::cold::{self, ColdPlan};
use floodgate_e2e::drivers::FloodShape;
use floodgate_e2e::flood::{self, Outcome, Plan, Reporter, Sample};
use floodgate_e2e::herd;
use floodgate_e2e::resolve::Resolved;
use floodgate_link_crd::{KubeDuration, LinkSpec, RemoteSpec};

#[derive(Default)]
struct Record {
    status_page: String,
    samples: Vec<Sample>,
    done: bool,
}

impl Reporter for Record {
    fn started(&mut self, status_page: &str) {
        self.status_page = status_page.to_owned();
    }

    fn sample(&mut self, sample: &Sample) {
        self.samples.push(sample.clone());
    }

    async fn done(&mut self, _: &Outcome) {
        self.done = true;
    }
}

fn spec() -> LinkSpec {
    let mut spec = LinkSpec::with_remote(RemoteSpec::default());
    spec.quarantine.when.events_per_second = 200;
    spec.quarantine.when.service_events_per_second = 100;
    spec.quarantine.when.sustained_for = KubeDuration::from_secs(2);
    spec
}

/// The resolver consumer's figures through Floodgate: the calm services never hold a ready
/// endpoint without its pod for more than 2 s; with `flooder_contained`, neither does the
/// contained flooder, which is served with at least one ready endpoint.
fn assert_resolved(r: &Resolved, flooder_contained: bool) {
    println!("resolved through Floodgate: {r:?}");
    assert!(r.looks > 0, "{r:?}");
    assert_eq!(r.calm_settled_max, 0, "calm services: {r:?}");
    if flooder_contained {
        assert!(
            r.flooder_ready_contained.is_some_and(|n| n > 0),
            "the contained flooder is served with a ready endpoint: {r:?}"
        );
        assert_eq!(
            r.flooder_settled_max, 0,
            "the contained flooder's ready endpoints have their pods: {r:?}"
        );
        assert_eq!(r.flooder_settled_end, 0, "{r:?}");
    }
}

fn s1_plan(shape: FloodShape) -> Plan {
    Plan {
        pods: 1_500,
        exported: true,
        ramp: 2,
        flood: 5,
        flips_per_sec: 600,
        shape,
        calm_every: Duration::from_millis(300),
        release: true,
        spec: spec(),
    }
}

/// S1 exported at a small scale: the flood is contained, released, and costs the consumer
/// behind Floodgate less; what that consumer holds resolves.
async fn an_exported_flood(shape: FloodShape) {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = s1_plan(shape);
    let mut record = Record::default();
    let o = flood::run(dir.path(), &plan, &mut record)
        .await
        .expect("the run completes");
    assert!(record.done && record.status_page.starts_with("http://127.0.0.1:"));
    assert_eq!(record.samples.len(), o.samples.len());
    assert_eq!(o.contained, ["prod/injector"], "contained: {:?}", o.samples);
    assert!(o.contained_after_s.is_some());
    assert_eq!(o.quarantined_after_s, None, "the link is not quarantined");
    assert!(
        o.converged_after_release_s.is_some(),
        "converged after the service's release"
    );
    assert_eq!(o.final_phase, "Healthy");
    assert!(
        o.samples.iter().any(|s| s.contained == 1),
        "the table shows the containment"
    );
    assert!(
        o.samples.iter().any(|s| s.via_calm_ms.is_some()),
        "the table shows calm delays through Floodgate"
    );
    // The direct consumer saw at least every pod created; the one behind Floodgate far fewer.
    assert!(o.direct_events >= 1_500, "{}", o.direct_events);
    assert!(
        o.via_events * 2 < o.direct_events,
        "{} via vs {} direct",
        o.via_events,
        o.direct_events
    );
    assert!(o.upstream_events >= o.direct_events / 2);
    // Memory was read from the processes.
    assert!(o.direct_peak_kib > 1024 && o.via_peak_kib > 1024 && o.floodgate_peak_kib > 1024);
    // Every calm change reached both consumers, during the flood too.
    assert!(!o.direct_staleness_ms.is_empty());
    assert!(!o.via_staleness_ms.is_empty(), "{o:?}");
    assert_eq!(o.via_missed, 0, "{o:?}");
    assert_resolved(&o.resolved, true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exported_flood_is_contained_released_and_costs_the_consumer_less() {
    an_exported_flood(FloodShape::default()).await;
}

/// The same with kube-sim's first flood: pods created not Ready, toggled in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_never_ready_exported_flood_is_contained_and_released() {
    an_exported_flood(FloodShape::NeverReady).await;
}

/// No flood: only the calm services change; every ready endpoint they are served with has its
/// pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calm_remote_is_served_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = Plan {
        pods: 3,
        flips_per_sec: 0,
        flood: 3,
        release: false,
        ..s1_plan(FloodShape::default())
    };
    let o = flood::run(dir.path(), &plan, &mut Record::default())
        .await
        .expect("the run completes");
    assert!(o.contained.is_empty(), "{:?}", o.contained);
    assert_eq!(o.via_missed, 0, "{o:?}");
    assert_resolved(&o.resolved, false);
    assert_eq!(o.resolved.settled_max, 0, "{:?}", o.resolved);
}

/// The cold start during a flood at a small scale: 3,000 pods behind the exported flooder,
/// created Ready and crash-looping (two in three Ready) before Floodgate starts and all along.
/// Floodgate is ready within 10 s, serves the calm services whole, contains the flooder, and
/// what the consumer holds resolves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_during_a_flood_contains_it_and_serves_what_resolves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = LinkSpec::with_remote(RemoteSpec::default());
    spec.quarantine.when.endpoints_per_service = 2_000;
    let plan = ColdPlan {
        pods: 3_000,
        services: 1,
        flips_per_sec: 600,
        shape: FloodShape::default(),
        one_body: false,
        spec,
    };
    let o = cold::run(dir.path(), &plan).await.expect("cold start");
    println!("{o:?}");
    assert!(o.ready_s <= 10.0, "{o:?}");
    assert_eq!(o.calm_served, 3, "{o:?}");
    assert_eq!(o.contained, ["prod/injector"], "{o:?}");
    assert_ne!(o.phase, "Quarantined", "{o:?}");
    assert_resolved(&o.resolved, true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_herd_through_floodgate_costs_the_remote_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = herd::run(dir.path(), 4, 2, spec())
        .await
        .expect("the herd runs");
    // Each restart of a direct consumer is one streaming list per resource at least.
    assert!(h.direct_requests >= 4 * 2 * 3, "{h:?}");
    assert_eq!(h.via_requests, 0, "{h:?}");
    assert!(h.floodgate_own_requests > 0, "{h:?}");
}

/// The cold start `make bench` runs at 50,000 pods, at 10,000: five exported services of 2,000
/// ready pods each behind a cap of 1,000. Floodgate serves the cap's 5,000 pods and the calm
/// services' 9, no more (the slices' cap agrees with the Endpoints controller's truncation),
/// and its peak memory stays under a bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_of_a_large_remote_serves_the_cap_and_memory_follows_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = ColdPlan {
        pods: 10_000,
        services: 5,
        flips_per_sec: 0,
        shape: FloodShape::default(),
        one_body: false,
        spec: LinkSpec::with_remote(RemoteSpec::default()),
    };
    let o = cold::run(dir.path(), &plan).await.expect("cold start");
    println!("{o:?}");
    assert_eq!(o.calm_served, 3, "{o:?}");
    assert_eq!(o.pods_served, 5 * 1000 + 9, "{o:?}");
    assert!(o.ready_s <= 10.0 && o.consumer_synced_s <= 5.0, "{o:?}");
    assert_eq!(o.phase, "Healthy", "{o:?}");
    assert_resolved(&o.resolved, false);
    assert!(
        o.peak_kib <= PEAK_BOUND_MIB * 1024,
        "peak {} KiB over {PEAK_BOUND_MIB} MiB",
        o.peak_kib
    );
}

/// The bound on Floodgate's peak at the 10,000-pod cold start (measured: 79 MiB with the debug
/// build; `make bench`'s 50,000-pod run, serving the same 5,009 pods: 103 MiB).
const PEAK_BOUND_MIB: u64 = 96;
