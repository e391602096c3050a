//! A hub of many links in one `floodgate run`, over real sockets, as `make bench` measures it
//! (the many-links issue): `links` links, each following the same kube-sim (in this process)
//! that holds `services` exported services of `slices` EndpointSlices of 10 endpoints each and
//! no pods (one service of a thousand slices: the cap serves a tenth; a thousand services of
//! ten: all served). Floodgate is its own process.
//!
//! What it reads:
//! - how long until `/readyz` answers 200 (every link serving);
//! - how the links' first lists reach the remote: kube-sim's LIST and WATCH counters (a link
//!   lists kube-sim with a streaming list, a WATCH), sampled every 10 ms from Floodgate's spawn,
//!   give the time from the first request to the last one of the start;
//! - Floodgate's resident memory once settled, set beside the JSON its links serve;
//! - its CPU while nothing changes (`/proc/<pid>/stat`, 10 s).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use floodgate_link_crd::{LinkSpec, RemoteSpec};
use serde::Serialize;

use crate::RunningSim;
use crate::drivers::Cluster;
use crate::modes::Mode;
use crate::process::{Launch, memory_kib, proc_status_kib};
use crate::sim::SimStore;

/// The hub to start.
#[derive(Debug, Clone)]
pub struct HubPlan {
    /// Links in the one process.
    pub links: usize,
    /// Exported services on the remote every link follows (1 for a hub; 1,000 small ones for
    /// the many-small-services shape).
    pub services: usize,
    /// EndpointSlices of 10 endpoints behind each exported service.
    pub slices: usize,
    /// `--link-starts-per-second` (0: unpaced).
    pub starts_per_second: u32,
    /// Seconds of quiet over which idle CPU is measured.
    pub idle_secs: u64,
}

/// What a hub's start measured.
#[derive(Debug, Clone, Serialize)]
pub struct HubOutcome {
    /// Links started.
    pub links: usize,
    /// `--link-starts-per-second`.
    pub starts_per_second: u32,
    /// Seconds from Floodgate's spawn to `/readyz` answering 200.
    pub ready_s: f64,
    /// LISTs and WATCHes the remote served during the start.
    pub lists: u64,
    /// Seconds from the first LIST or WATCH the remote served to the last one of the start.
    pub lists_spread_s: f64,
    /// The most LISTs and WATCHes the remote served in any 100 ms.
    pub lists_peak_per_100ms: u64,
    /// Resident memory once every link serves and nothing changes (KiB).
    pub steady_kib: u64,
    /// Peak resident memory, the start included (KiB).
    pub peak_kib: u64,
    /// Of the resident memory, what is anonymous (`RssAnon`: the heap, stacks; the rest is
    /// file-backed, the binary's own pages, which a fresh process has too) (KiB).
    pub anon_kib: u64,
    /// The JSON every link serves, in all (bytes, as the admin API counts them).
    pub view_bytes: u64,
    /// Objects the links hold from upstream, in all.
    pub upstream_objects: u64,
    /// Resident memory beyond the JSON served, per link (KiB).
    pub per_link_beyond_json_kib: f64,
    /// CPU while idle, in percent of one core.
    pub idle_cpu_percent: f64,
    /// Dials that waited for their turn (`floodgate_link_dials_paced_total`).
    pub dials_paced: u64,
    /// Pods the links fetched one by one (`podsFetched`), in all.
    pub pods_fetched: u64,
    /// EndpointSlices the links hold deflated (`slicesHeldDeflated`), in all.
    pub slices_deflated: u64,
}

/// Starts the hub in `dir`, measures it, stops it.
pub async fn run(dir: &Path, plan: &HubPlan) -> anyhow::Result<HubOutcome> {
    let store = Arc::new(SimStore::new(std::process::id(), 10_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for s in 0..plan.services {
        let name = if plan.services == 1 {
            "bench".to_owned()
        } else {
            format!("svc-{s:04}")
        };
        cluster.static_slices(&name, plan.slices, 10);
    }
    let sim = RunningSim::start(store, "remote-token").await?;
    let kubeconfig = sim.kubeconfig();
    let spec = LinkSpec::with_remote(RemoteSpec::default());
    let mut launch = Launch::new(Mode::Standalone, dir)
        .args([
            "--link-starts-per-second",
            &plan.starts_per_second.to_string(),
        ])
        .log("warn");
    for i in 0..plan.links {
        launch = launch.link(&format!("link-{i:03}"), &kubeconfig, spec.clone());
    }

    // The remote's LIST counter, every 10 ms from the spawn.
    let counters = sim.api.clone();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(async move {
        let began = Instant::now();
        let mut samples = Vec::new();
        while !*stop.borrow() {
            // Against kube-sim a link's first list is a streaming list: a WATCH.
            let c = &counters.counters;
            let lists = c.lists.load(Ordering::Relaxed) + c.watches.load(Ordering::Relaxed);
            samples.push((began.elapsed(), lists));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        samples
    });
    let started = Instant::now();
    let result = async {
        let mut floodgate = launch.spawn().await?;
        floodgate.wait_ready(120).await?;
        let ready_s = started.elapsed().as_secs_f64();
        Ok::<_, anyhow::Error>((floodgate, ready_s))
    }
    .await;
    let (floodgate, ready_s) = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = stop_tx.send(true);
            sim.stop();
            return Err(e);
        }
    };
    // Let the links settle (their first publications, the cap's choice), then read.
    let settled = settle(&floodgate).await;
    let _ = stop_tx.send(true);
    let samples = sampler.await?;
    let measured = match settled {
        Ok(()) => measure(&floodgate, plan, ready_s, &samples).await,
        Err(e) => Err(e),
    };
    floodgate.stop().await?;
    sim.stop();
    measured
}

async fn measure(
    floodgate: &crate::process::Floodgate,
    plan: &HubPlan,
    ready_s: f64,
    samples: &[(Duration, u64)],
) -> anyhow::Result<HubOutcome> {
    let pid = floodgate.pid().context("floodgate's pid")?;
    let (view_bytes, upstream_objects) = served(floodgate).await?;
    let pods_fetched = links_sum(floodgate, "/counters/podsFetched").await?;
    let slices_deflated = links_sum(floodgate, "/slicesHeldDeflated").await?;
    let (status, metrics) =
        crate::admin::call_text(floodgate.admin, "GET", "/metrics", None, "").await?;
    anyhow::ensure!(status == 200, "GET /metrics answered {status}");
    let dials_paced = (metrics.lines())
        .find_map(|l| l.strip_prefix("floodgate_link_dials_paced_total "))
        .and_then(|v| v.trim().parse().ok())
        .context("floodgate_link_dials_paced_total is not served")?;
    let before = cpu_ticks(pid).context("floodgate's CPU time")?;
    let idle = Instant::now();
    tokio::time::sleep(Duration::from_secs(plan.idle_secs)).await;
    let ticks = cpu_ticks(pid).context("floodgate's CPU time")? - before;
    let idle_cpu_percent = ticks as f64 / clock_ticks() / idle.elapsed().as_secs_f64() * 100.0;
    let (steady_kib, peak_kib) = memory_kib(pid).context("floodgate's memory")?;
    let anon_kib = proc_status_kib(pid, "RssAnon").context("floodgate's memory")?;
    let (lists, lists_spread_s, lists_peak_per_100ms) = list_figures(samples);
    let beyond = (steady_kib as f64 - view_bytes as f64 / 1024.0) / plan.links as f64;
    Ok(HubOutcome {
        links: plan.links,
        starts_per_second: plan.starts_per_second,
        ready_s,
        lists,
        lists_spread_s,
        lists_peak_per_100ms,
        steady_kib,
        peak_kib,
        anon_kib,
        view_bytes,
        upstream_objects,
        per_link_beyond_json_kib: beyond,
        idle_cpu_percent,
        dials_paced,
        pods_fetched,
        slices_deflated,
    })
}

/// Waits until the links' publications are done: at least 3 s after ready, and until the JSON
/// they serve and the objects they hold stayed the same for a second (a slow machine takes
/// longer; 60 s at most).
async fn settle(floodgate: &crate::process::Floodgate) -> anyhow::Result<()> {
    let began = Instant::now();
    let mut last = served(floodgate).await?;
    let mut same_since = Instant::now();
    while began.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = served(floodgate).await?;
        if now != last {
            (last, same_since) = (now, Instant::now());
        } else if began.elapsed() >= Duration::from_secs(3)
            && same_since.elapsed() >= Duration::from_secs(1)
        {
            return Ok(());
        }
    }
    anyhow::bail!("the links' publications did not settle in 60 s: {last:?} served and held")
}

/// The JSON the links serve and the objects they hold upstream, summed over `GET /links`.
async fn served(floodgate: &crate::process::Floodgate) -> anyhow::Result<(u64, u64)> {
    let view_bytes = links_sum(floodgate, "/counters/viewBytes").await?;
    Ok((
        view_bytes,
        links_sum(floodgate, "/counters/objectsHeld").await?,
    ))
}

/// A figure of each link's (at the JSON `pointer`), summed over `GET /links`.
async fn links_sum(floodgate: &crate::process::Floodgate, pointer: &str) -> anyhow::Result<u64> {
    let (status, all) = crate::admin::call(floodgate.admin, "GET", "/links", None, "").await?;
    anyhow::ensure!(status == 200, "GET /links answered {status}");
    let links = all["links"].as_array().context("GET /links: no links")?;
    Ok((links.iter())
        .map(|l| {
            l.pointer(pointer)
                .and_then(|v| v.as_u64())
                .unwrap_or_default()
        })
        .sum())
}

/// LISTs served, the seconds from the first to the last, and the most in any 100 ms, from
/// samples of the remote's LIST counter.
pub fn list_figures(samples: &[(Duration, u64)]) -> (u64, f64, u64) {
    let total = samples.last().map_or(0, |s| s.1);
    let first = samples.iter().find(|s| s.1 > 0).map(|s| s.0);
    let last = samples.iter().find(|s| s.1 == total).map(|s| s.0);
    let spread = match (first, last) {
        (Some(f), Some(l)) => l.saturating_sub(f).as_secs_f64(),
        _ => 0.0,
    };
    let mut peak = 0;
    for (i, (at, n)) in samples.iter().enumerate() {
        let later = samples[i..]
            .iter()
            .take_while(|s| s.0 <= *at + Duration::from_millis(100));
        if let Some((_, m)) = later.last() {
            peak = peak.max(m - n);
        }
    }
    (total, spread, peak)
}

/// User and system CPU time of `pid` so far, in clock ticks (`/proc/<pid>/stat`).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces, inside parentheses).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Clock ticks a second (`getconf CLK_TCK`; Linux's 100 when it cannot be asked).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_figures_read_the_first_and_last_list_and_the_busiest_100_ms() {
        let ms = Duration::from_millis;
        let samples = [
            (ms(0), 0),
            (ms(10), 0),
            (ms(20), 4),
            (ms(60), 10),
            (ms(120), 11),
            (ms(500), 11),
            (ms(900), 15),
            (ms(1000), 15),
        ];
        let (lists, spread, peak) = list_figures(&samples);
        assert_eq!(lists, 15);
        assert!((spread - 0.88).abs() < 1e-9, "{spread}");
        // 10 ms to 60 ms: 0 to 10.
        assert_eq!(peak, 10);
    }
}
