//! The shapes a real cluster's controllers make of a service's endpoints, judged at the event as
//! Linkerd's destination judges them (DESIGN guarantee 9): two [`EventResolver`]s, one direct
//! and one through Floodgate, while kube-sim writes each new pod before the slice naming it and
//! drops an endpoint before its pod, with a real cluster's lag ([`CONTROLLER_LAG`]).
//!
//! The shapes, on service `prod/web` of 3 ready pods: a scale-up one pod at a time (3 -> 10), a
//! burst (10 -> 200), a scale-down (200 -> 5) and a rolling update of the 5 to a new
//! ReplicaSet. `e2e/tests/order.rs` asserts on them; `make bench` reports them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::drivers::{CONTROLLER_LAG, Cluster};
use crate::gateway::{Stack, client_from};
use crate::replicas::Fleet;
use crate::resolve::EventResolver;
use crate::sim::SimStore;

/// How long a step may take to reach a consumer (a loaded 2-core machine); the figures are
/// what the comparison is about.
const WITHIN: Duration = Duration::from_secs(10);

/// Through Floodgate and direct, from the write of the slice that makes the step.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Pair {
    /// The consumer through Floodgate.
    pub through: Duration,
    /// The consumer of the remote.
    pub direct: Duration,
}

/// What the two consumers saw of every shape.
#[derive(Clone, Debug, Serialize)]
pub struct Shapes {
    /// Which Floodgate the consumer read: `floodgate run`, or a follower replica.
    pub path: String,
    /// Scale-up one pod at a time, p99 of the 7 steps.
    pub scale_up: Pair,
    /// The burst to 200.
    pub burst: Pair,
    /// The scale-down to 5.
    pub shrink: Pair,
    /// The rolling update, p99 of the 5 steps.
    pub rollout: Pair,
    /// Addresses the consumer through Floodgate lost at a slice event (its pod not held then).
    pub lost_through: u64,
    /// Those lost addresses by service, with the pods first lost.
    pub lost_through_by_service: BTreeMap<String, (u64, Vec<String>)>,
    /// The same, direct.
    pub lost_direct: u64,
    /// Slice events the consumer through Floodgate handled.
    pub slice_events: u64,
}

/// The shapes through `floodgate run` (in process) in front of kube-sim.
pub async fn through_run() -> anyhow::Result<Shapes> {
    let store = Arc::new(SimStore::new(21, 10_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 3, true);
    let stack = Stack::start(store, Stack::default_spec()).await?;
    let via = EventResolver::start(stack.consumer().await?);
    let direct = EventResolver::start(stack.direct().await?);
    run(&mut cluster, &via, &direct, "floodgate run").await
}

/// The same shapes through the follower of two `floodgate controller` replicas (in process):
/// the follower republishes its holder's view.
pub async fn through_follower(dir: &Path) -> anyhow::Result<Shapes> {
    let mut fleet = Fleet::start(dir, &["east"]).await?;
    fleet.add_replica("floodgate-0").await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !fleet.held_by(1) {
        anyhow::ensure!(Instant::now() < deadline, "floodgate-0 holds no Lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fleet.add_replica("floodgate-1").await?;
    fleet.all_serve(&["web"]).await?;
    fleet.cluster.scale_in_order("web", 3, CONTROLLER_LAG).await;
    let holder = fleet.holders()[0].clone().context("a holder")?;
    let follower = if holder == "floodgate-0" {
        "floodgate-1"
    } else {
        "floodgate-0"
    };
    let via = EventResolver::start(fleet.consumer(follower, "east").await?);
    let direct = EventResolver::start(client_from(&fleet.sim.kubeconfig()).await?);
    run(&mut fleet.cluster, &via, &direct, "a follower replica").await
}

/// The pods `web` has now, as the resolvers name them.
fn pods(names: impl IntoIterator<Item = u32>) -> BTreeSet<String> {
    names.into_iter().map(|i| format!("prod/web-{i}")).collect()
}

/// Waits until both consumers hold `want`, and returns how long each took from `written`.
async fn step(
    via: &EventResolver,
    direct: &EventResolver,
    want: &BTreeSet<String>,
    written: Instant,
) -> anyhow::Result<Pair> {
    direct
        .wait_for("prod/web", want, WITHIN)
        .await
        .context("direct")?;
    let d = written.elapsed();
    via.wait_for("prod/web", want, WITHIN)
        .await
        .context("through Floodgate")?;
    Ok(Pair {
        through: written.elapsed(),
        direct: d,
    })
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

fn p99_pair(steps: &[Pair]) -> Pair {
    Pair {
        through: p99(steps.iter().map(|p| p.through).collect()),
        direct: p99(steps.iter().map(|p| p.direct).collect()),
    }
}

/// Drives `web` (3 ready pods, or about to be) through the shapes, each step waited for on
/// both consumers; prints each shape's figures as it ends.
pub async fn run(
    cluster: &mut Cluster,
    via: &EventResolver,
    direct: &EventResolver,
    path: &str,
) -> anyhow::Result<Shapes> {
    for r in [via, direct] {
        r.synced(WITHIN).await?;
        r.wait_for("prod/web", &pods(0..3), WITHIN)
            .await
            .context("first sync")?;
    }
    let shown = |shape: &str, p: &Pair| {
        println!(
            "{path}: {shape}: {:?} through Floodgate, {:?} direct, from the slice's write",
            p.through, p.direct
        );
    };

    let mut steps = Vec::new();
    for n in 4..=10 {
        // A step after the last one's coalescing window closed: this measures the order's
        // cost, not `coalesce.quiet` (a burst of slice changes waits for it by design).
        tokio::time::sleep(Duration::from_millis(250)).await;
        cluster.scale_in_order("web", n, CONTROLLER_LAG).await;
        steps.push(step(via, direct, &pods(0..n as u32), Instant::now()).await?);
    }
    let scale_up = p99_pair(&steps);
    shown("scale-up 3 -> 10 one pod at a time, p99", &scale_up);
    cluster.scale_in_order("web", 200, CONTROLLER_LAG).await;
    let burst = step(via, direct, &pods(0..200), Instant::now()).await?;
    shown("burst 10 -> 200", &burst);
    cluster.scale_in_order("web", 5, CONTROLLER_LAG).await;
    let shrink = step(via, direct, &pods(0..5), Instant::now()).await?;
    shown("scale-down 200 -> 5", &shrink);
    // A rolling update: pods 0..5 replaced one by one by pods 200.. (the driver's next names)
    // of a new ReplicaSet, which no endpoint names before the first of them.
    let mut now = pods(0..5);
    let mut steps = Vec::new();
    for i in 0..5u32 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        cluster
            .replace_pod_in_order("web", i as usize, CONTROLLER_LAG)
            .await;
        now.remove(&format!("prod/web-{i}"));
        now.insert(format!("prod/web-{}", 200 + i));
        steps.push(step(via, direct, &now, Instant::now()).await?);
    }
    let rollout = p99_pair(&steps);
    shown("rolling update of 5 to a new ReplicaSet, p99", &rollout);
    Ok(Shapes {
        path: path.to_owned(),
        scale_up,
        burst,
        shrink,
        rollout,
        lost_through: via.lost(),
        lost_through_by_service: via.lost_by_service(),
        lost_direct: direct.lost(),
        slice_events: via.slice_events(),
    })
}
