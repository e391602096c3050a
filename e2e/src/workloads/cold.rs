//! Cold starts over real sockets, as `make bench` measures them: kube-sim (in this process)
//! already holds a large remote when Floodgate (its own process) starts, then a consumer (its
//! own process, streaming-list informers) syncs through it.
//!
//! - **During a flood** (the containment issue's cold start): `pods` crash-looping pods behind
//!   one exported service flip all along (the plan's [`FloodShape`]: by default created Ready
//!   and named by their slices, then two in three Ready at any moment), before Floodgate
//!   starts and after. Floodgate must be
//!   ready, serve every calm service whole and the flooder capped, and contain the flooder.
//! - **Calm and large** (the memory issue's cold start): `pods` ready pods spread over
//!   `services` exported services, no flood. Floodgate holds only the pods behind the endpoints
//!   it publishes, so its memory follows the cap, not the remote.
//!
//! - **Wide** (what serving costs): many exported services, every endpoint under the cap, so
//!   Floodgate serves all it holds; its memory is set beside the JSON it serves.
//!
//! Every scenario also reads what the consumer could resolve ([`Resolved`]): the ready
//! endpoints it holds without their pod, the flooder's apart, once a second from its sync.
//!
//! Memory is Floodgate's own: the peak (`VmHWM`, the cold start included) and the steady
//! resident size after the view has settled.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use floodgate_link_crd::LinkSpec;
use serde::Serialize;

use crate::RunningSim;
use crate::drivers::{Cluster, FloodShape};
use crate::flood::{FLOODER, contained_services};
use crate::process::{Consumer, Floodgate, memory_kib};
use crate::resolve::Resolved;
use crate::sim::SimStore;

const CALM: [&str; 3] = ["web", "api", "billing"];
const BAD: &str = "injector";

/// What the remote holds when Floodgate starts.
#[derive(Debug, Clone)]
pub struct ColdPlan {
    /// Pods behind the large services, in all.
    pub pods: usize,
    /// How many exported services share them (the flood uses one).
    pub services: usize,
    /// Pods flipping between ready and crashed per second, before and during the start; 0
    /// for a calm remote whose pods are all ready.
    pub flips_per_sec: usize,
    /// How the flood's pods behave.
    pub shape: FloodShape,
    /// Whether the remote refuses streaming lists and ignores `limit` (sends each list as one
    /// body, as a real API server does for `resourceVersion=0`).
    pub one_body: bool,
    /// The link's spec.
    pub spec: LinkSpec,
}

/// What a cold start measured.
#[derive(Debug, Clone, Serialize)]
pub struct ColdOutcome {
    /// Seconds from Floodgate's spawn to `/readyz` answering 200.
    pub ready_s: f64,
    /// Seconds from the consumer's spawn to all three of its informers' sync.
    pub consumer_synced_s: f64,
    /// Calm services the consumer holds whole (3 endpoints each).
    pub calm_served: usize,
    /// Pods the consumer holds (every served pod).
    pub pods_served: u64,
    /// Objects of every kind the consumer holds: Services, EndpointSlices and pods.
    pub objects_served: u64,
    /// Seconds from Floodgate's spawn to the flooder's containment, if it was contained.
    pub contained_after_s: Option<f64>,
    /// The services the link lists as contained at the end.
    pub contained: Vec<String>,
    /// The link's phase at the end.
    pub phase: String,
    /// Floodgate's peak resident memory (KiB), the cold start included.
    pub peak_kib: u64,
    /// Floodgate's resident memory (KiB) once the view has settled.
    pub steady_kib: u64,
    /// The JSON bytes the link serves, as its admin API counts them.
    pub view_bytes: u64,
    /// Objects the link holds from upstream, as its admin API counts them.
    pub upstream_objects: u64,
    /// What the consumer could resolve, from its sync to the end.
    pub resolved: Resolved,
}

/// Runs one cold start in `dir`; stops every process it started.
pub async fn run(dir: &Path, plan: &ColdPlan) -> anyhow::Result<ColdOutcome> {
    let store = Arc::new(SimStore::new(std::process::id(), 100_000));
    store.set_refuse_streaming_lists(plan.one_body);
    store.set_ignore_limit(plan.one_body);
    let mut cluster = Cluster::exported(store.clone(), &CALM, 3);
    let flooding = plan.flips_per_sec > 0;
    let large: Vec<String> = if flooding {
        vec![BAD.to_owned()]
    } else {
        (0..plan.services.max(1))
            .map(|i| format!("big-{i}"))
            .collect()
    };
    for svc in &large {
        cluster.add_service(svc, true);
        cluster.scale(
            svc,
            plan.pods / large.len(),
            !flooding || plan.shape.starts_ready(),
        );
    }
    let sim = RunningSim::start(store, "remote-token").await?;

    // The flood runs before Floodgate starts and all along.
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    let flips = plan.flips_per_sec / 10;
    let shape = plan.shape;
    let flood = tokio::spawn(async move {
        if flips > 0 {
            loop {
                cluster.flood_step(BAD, shape, flips);
                tokio::select! {
                    _ = stop.changed() => break,
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        }
        cluster
    });
    if flooding {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    let started = Instant::now();
    let floodgate = Floodgate::start(dir, "east", &sim.kubeconfig(), plan.spec.clone()).await?;
    let result = measure(dir, &floodgate, started, flooding).await;
    let _ = stop_tx.send(true);
    let _ = flood.await;
    floodgate.stop().await?;
    sim.stop();
    result
}

async fn measure(
    dir: &Path,
    floodgate: &Floodgate,
    started: Instant,
    flooding: bool,
) -> anyhow::Result<ColdOutcome> {
    // `Floodgate::start` returns once `/readyz` answers 200.
    let ready_s = started.elapsed().as_secs_f64();
    let pid = floodgate.pid().context("floodgate's pid")?;
    let consumer_started = Instant::now();
    let consumer = Consumer::start(dir, "consumer", &floodgate.consumer_kubeconfig()?)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !consumer.stats().synced {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the consumer did not sync through Floodgate within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let consumer_synced_s = consumer_started.elapsed().as_secs_f64();

    // Settle: the flooder contained (during a flood), then ten quiet seconds.
    let mut contained_after_s = None;
    let settle_until = Instant::now() + Duration::from_secs(if flooding { 30 } else { 10 });
    let mut link = floodgate.link_state().await;
    let mut resolved = Resolved::default();
    let mut next_look = Instant::now();
    while Instant::now() < settle_until {
        link = floodgate.link_state().await;
        if Instant::now() >= next_look {
            // The consumer reports once a second.
            next_look += Duration::from_secs(1);
            let contained = contained_services(&link).iter().any(|c| c == FLOODER);
            resolved.look(&consumer.stats(), None, FLOODER, contained, true);
        }
        if contained_after_s.is_none() && !contained_services(&link).is_empty() {
            contained_after_s = Some(started.elapsed().as_secs_f64());
        }
        if flooding && contained_after_s.is_some_and(|c| started.elapsed().as_secs_f64() > c + 10.0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (steady_kib, peak_kib) = memory_kib(pid).context("floodgate's memory")?;
    let stats = consumer.stats();
    let calm_served = calm_whole(floodgate).await?;
    consumer.stop().await?;
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or_default();
    Ok(ColdOutcome {
        ready_s,
        consumer_synced_s,
        calm_served,
        pods_served: stats.pods,
        objects_served: stats.services + stats.slices + stats.pods,
        contained_after_s,
        contained: contained_services(&link),
        phase: link["phase"].as_str().unwrap_or_default().to_owned(),
        peak_kib,
        steady_kib,
        view_bytes: n(&link["counters"]["viewBytes"]),
        upstream_objects: n(&link["counters"]["objectsHeld"]),
        resolved,
    })
}

/// How many calm services the facade serves whole: one slice of 3 endpoints each.
async fn calm_whole(floodgate: &Floodgate) -> anyhow::Result<usize> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, ListParams};
    let client = crate::gateway::client_from(&floodgate.consumer_kubeconfig()?).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client, "prod");
    let mut whole = 0;
    for svc in CALM {
        let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
        let endpoints: usize = slices
            .list(&lp)
            .await?
            .items
            .iter()
            .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
            .sum();
        whole += usize::from(endpoints == 3);
    }
    Ok(whole)
}
