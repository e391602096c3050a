//! S2, the restart herd (incident 1): consumer processes restart again and again, straight
//! against kube-sim and then through Floodgate, and kube-sim counts the requests it serves.
//! Through Floodgate the herd should cost the remote nothing.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate_link_crd::LinkSpec;

use crate::RunningSim;
use crate::drivers::Cluster;
use crate::process::{Floodgate, restart_herd};
use crate::sim::SimStore;

/// S2's figures: upstream requests kube-sim served.
#[derive(Debug)]
pub struct Herd {
    /// Requests kube-sim served to the consumers wired straight to it.
    pub direct_requests: u64,
    /// Requests kube-sim served while the same herd restarted through Floodgate.
    pub via_requests: u64,
    /// Floodgate's own requests when it started (its LIST+WATCH per resource).
    pub floodgate_own_requests: u64,
    /// Seconds the direct herd took.
    pub direct_secs: f64,
    /// Seconds the herd through Floodgate took.
    pub via_secs: f64,
}

fn requests(sim: &RunningSim) -> u64 {
    let c = sim.api.counters.snapshot();
    c.lists + c.watches + c.gets
}

/// Runs `consumers` processes restarting `restarts` times each, straight against a kube-sim
/// and then through Floodgate (link spec `spec`), counting the requests kube-sim serves.
pub async fn run(
    dir: &Path,
    consumers: usize,
    restarts: u32,
    spec: LinkSpec,
) -> anyhow::Result<Herd> {
    let store = Arc::new(SimStore::new(std::process::id(), 10_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for i in 0..20 {
        let name = format!("svc-{i}");
        cluster.add_service(&name, i % 4 != 0);
        cluster.scale(&name, 10, true);
    }
    let sim = RunningSim::start(store, "remote-token").await?;

    let t = Instant::now();
    let before = requests(&sim);
    restart_herd(dir, &sim.kubeconfig(), consumers, restarts).await?;
    let direct_requests = requests(&sim) - before;
    let direct_secs = t.elapsed().as_secs_f64();

    let before = requests(&sim);
    let fg_dir = dir.join("floodgate");
    std::fs::create_dir_all(&fg_dir)?;
    let fg = Floodgate::start(&fg_dir, "east", &sim.kubeconfig(), spec).await?;
    // Floodgate's own LIST+WATCH per resource, and the pods it fetches: settle first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = requests(&sim);
    let t = Instant::now();
    restart_herd(&fg_dir, &fg.consumer_kubeconfig()?, consumers, restarts).await?;
    let via_requests = requests(&sim) - settled;
    let via_secs = t.elapsed().as_secs_f64();
    fg.stop().await?;
    Ok(Herd {
        direct_requests,
        via_requests,
        floodgate_own_requests: settled - before,
        direct_secs,
        via_secs,
    })
}
