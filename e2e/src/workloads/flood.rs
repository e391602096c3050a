//! Incident 2 replayed side by side over loopback: kube-sim (in this process) floods, Floodgate
//! (its own process) follows it, and two identical consumers (their own processes) watch: one
//! wired straight to kube-sim, one through Floodgate. The demo and the S1 benchmark run this.
//!
//! The timeline, in seconds after both consumers have synced:
//!
//! - calm services (three, exported, three pods each) roll a pod every `calm_every`, stamping
//!   the changed slice with the time (`consumer`'s `STAMP`), all along;
//! - at 2 s the bad Deployment scales to `pods` pods over `ramp` seconds (Ready, or not, as the
//!   flood's [`FloodShape`] says), then `flips_per_sec` pods a second change between Ready and
//!   crashed for `flood` seconds;
//! - then the remote is fixed (scaled back to 3 ready pods);
//! - with `release`, 2 s later an operator releases, through the admin API, each service the
//!   flood had contained (and the link, if it was quarantined);
//! - the run ends when the consumer behind Floodgate has converged to the fixed remote.
//!
//! Each second, beside events, memory and the calm changes' delays, it reads what the consumer
//! behind Floodgate could resolve ([`crate::resolve`]): the ready endpoints it holds without
//! their pod, for the flooder and for the calm services ([`Resolved`]).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use floodgate_link_crd::LinkSpec;
use serde::Serialize;

use crate::RunningSim;
use crate::drivers::{Cluster, FloodShape};
use crate::process::{Consumer, ConsumerStats, Floodgate, memory_kib};
use crate::resolve::Resolved;
use crate::sim::SimStore;

/// The annotation a calm change is stamped with (its wall-clock time in ms), which
/// `src/bin/consumer.rs` reads.
pub const STAMP: &str = "e2e.floodgate.dev/changed-at-ms";
const CALM: [&str; 3] = ["web", "api", "billing"];
const BAD: &str = "injector";
/// The flooding service, as consumers and the admin API name it.
pub const FLOODER: &str = "prod/injector";

/// What to replay.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Pods the bad Deployment scales to.
    pub pods: usize,
    /// Whether the bad service is exported (selected by the link).
    pub exported: bool,
    /// Seconds the scale-up takes.
    pub ramp: u64,
    /// Seconds the crash loop lasts after the ramp.
    pub flood: u64,
    /// Pods flipped between ready and crashed per second.
    pub flips_per_sec: usize,
    /// How the bad Deployment's pods behave.
    pub shape: FloodShape,
    /// How often a calm service changes.
    pub calm_every: Duration,
    /// Release the link through the admin API after the fix.
    pub release: bool,
    /// The link's spec (its remote is filled in).
    pub spec: LinkSpec,
}

/// One second of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the flood's timeline began.
    pub t: u64,
    /// Objects kube-sim changed in that second.
    pub upstream_events: u64,
    /// Objects the direct consumer has received so far.
    pub direct_events: u64,
    /// Objects the consumer behind Floodgate has received so far.
    pub via_events: u64,
    /// The direct consumer's resident memory, KiB.
    pub direct_rss_kib: u64,
    /// The consumer behind Floodgate's resident memory, KiB.
    pub via_rss_kib: u64,
    /// Floodgate's resident memory, KiB.
    pub floodgate_rss_kib: u64,
    /// The link's phase.
    pub phase: String,
    /// Services the link contains.
    pub contained: usize,
    /// The slowest calm change that reached the direct consumer in that second, ms.
    pub direct_calm_ms: Option<u64>,
    /// The same through Floodgate.
    pub via_calm_ms: Option<u64>,
    /// Ready endpoints the consumer behind Floodgate holds without their pod (at once).
    pub via_without_pod: u64,
    /// Of those, the ones waiting for more than 2 s.
    pub via_without_pod_settled: u64,
    /// Ready endpoints of the flooder the consumer behind Floodgate holds.
    pub via_flooder_ready: u64,
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Every second.
    pub samples: Vec<Sample>,
    /// Objects kube-sim changed during the run.
    pub upstream_events: u64,
    /// Objects each consumer received during the run (after its initial sync).
    pub direct_events: u64,
    /// See `direct_events`.
    pub via_events: u64,
    /// Peak resident memory (VmHWM), KiB.
    pub direct_peak_kib: u64,
    /// See `direct_peak_kib`.
    pub via_peak_kib: u64,
    /// See `direct_peak_kib`.
    pub floodgate_peak_kib: u64,
    /// Delays of calm changes made while the link followed its remote, ms, sorted.
    pub via_staleness_ms: Vec<u64>,
    /// The same for the direct consumer (every calm change).
    pub direct_staleness_ms: Vec<u64>,
    /// Calm changes made while the link followed its remote that never reached the consumer
    /// behind Floodgate before the run ended.
    pub via_missed: usize,
    /// Seconds from the start of the scale-up to the quarantine, if there was one.
    pub quarantined_after_s: Option<f64>,
    /// Seconds from the start of the scale-up to the bad service's containment, if any.
    pub contained_after_s: Option<f64>,
    /// The services the link had contained before the release.
    pub contained: Vec<String>,
    /// Seconds from the release to the consumer's convergence, if released.
    pub converged_after_release_s: Option<f64>,
    /// The link's phase at the end.
    pub final_phase: String,
    /// What the consumer behind Floodgate could resolve.
    pub resolved: Resolved,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The slowest delay (ms) of the stamped changes that arrived in `(from, to]` (wall-clock ms).
fn slowest_arrival(seen: &[(u64, u64)], from: u64, to: u64) -> Option<u64> {
    seen.iter()
        .filter(|(_, at)| *at > from && *at <= to)
        .map(|(stamp, at)| at.saturating_sub(*stamp))
        .max()
}

/// The services a link's admin state lists as contained.
pub fn contained_services(link: &serde_json::Value) -> Vec<String> {
    link["contained"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["service"].as_str().map(str::to_owned))
        .collect()
}

/// The `p`-th percentile of sorted `v` (0 when empty).
pub fn percentile(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// A running side-by-side replay.
#[derive(Debug)]
struct Rig {
    sim: RunningSim,
    cluster: Cluster,
    floodgate: Floodgate,
    direct: Consumer,
    via: Consumer,
}

impl Rig {
    fn store(&self) -> &Arc<SimStore> {
        self.cluster.store()
    }

    fn upstream_version(&self) -> u64 {
        use floodgate::kubeapi::ApiStore as _;
        self.store().view().resource_version()
    }

    /// Resident and peak memory (KiB) of the direct consumer, the one behind Floodgate, and
    /// Floodgate.
    fn memory(&self) -> [(u64, u64); 3] {
        [self.direct.pid(), self.via.pid(), self.floodgate.pid()]
            .map(|pid| pid.and_then(memory_kib).unwrap_or_default())
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.direct.stop().await?;
        self.via.stop().await?;
        self.floodgate.stop().await?;
        self.sim.stop();
        Ok(())
    }
}

async fn start(dir: &Path, plan: &Plan) -> anyhow::Result<Rig> {
    let store = Arc::new(SimStore::new(std::process::id(), 100_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for svc in CALM {
        cluster.add_service(svc, true);
        cluster.scale(svc, 3, true);
    }
    cluster.add_service(BAD, plan.exported);
    cluster.scale(BAD, 3, true);
    let sim = RunningSim::start(store, "remote-token").await?;
    let floodgate = Floodgate::start(dir, "east", &sim.kubeconfig(), plan.spec.clone()).await?;
    let direct = Consumer::start(dir, "direct", &sim.kubeconfig())?;
    let via = Consumer::start(dir, "via-floodgate", &floodgate.consumer_kubeconfig()?)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(direct.stats().synced && via.stats().synced) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the consumers did not sync within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Rig {
        sim,
        cluster,
        floodgate,
        direct,
        via,
    })
}

/// The consumer behind Floodgate holds exactly the fixed remote's selected objects.
fn converged(s: &ConsumerStats, exported: bool) -> bool {
    let services = CALM.len() as u64 + u64::from(exported);
    s.services == services && s.slices == services && s.pods == 3 * services
}

/// Who watches a run.
pub trait Reporter {
    /// Everything runs and both consumers have synced; the status page is at `status_page`.
    fn started(&mut self, status_page: &str);
    /// One second's figures.
    fn sample(&mut self, sample: &Sample);
    /// The run is over and its processes still run (a demo may hold them for a look).
    fn done(&mut self, outcome: &Outcome) -> impl Future<Output = ()>;
}

/// Runs `plan` in `dir`, telling `reporter` as it goes; stops every process it started.
pub async fn run(dir: &Path, plan: &Plan, reporter: &mut impl Reporter) -> anyhow::Result<Outcome> {
    let mut rig = start(dir, plan).await?;
    reporter.started(&format!("http://{}/", rig.floodgate.admin));
    let result = drive(&mut rig, plan, reporter).await;
    if let Ok(outcome) = &result {
        reporter.done(outcome).await;
    }
    rig.stop().await?;
    result
}

async fn drive(
    rig: &mut Rig,
    plan: &Plan,
    reporter: &mut impl Reporter,
) -> anyhow::Result<Outcome> {
    const TICK: Duration = Duration::from_millis(100);
    let ticks_per_sec = 10;
    let (direct0, via0) = (rig.direct.stats().events, rig.via.stats().events);
    let ramp_start = 2 * ticks_per_sec;
    let ramp_end = ramp_start + plan.ramp.max(1) * ticks_per_sec;
    let fix_at = ramp_end + plan.flood * ticks_per_sec;
    let release_at = fix_at + 2 * ticks_per_sec;
    let give_up = fix_at + 60 * ticks_per_sec;
    let calm_every = (plan.calm_every.as_millis() / TICK.as_millis()).max(1) as u64;

    let mut samples = Vec::new();
    let mut resolved = Resolved::default();
    let mut calm_made: Vec<u64> = Vec::new();
    let (mut phase, mut quarantined_at, mut released_at, mut converged_at) =
        (String::new(), None, None, None);
    let (mut contained_at, mut contained) = (None, Vec::<String>::new());
    let mut second_ms = now_ms();
    // Wall-clock ms of the quarantine (the link's own `since`) and of the release.
    let (mut quarantine_ms, mut release_ms) = (None, None);
    let (mut last_version, mut upstream_total, mut upstream_second) =
        (rig.upstream_version(), 0u64, 0u64);
    let mut next = tokio::time::Instant::now();
    for tick in 1u64.. {
        next += TICK;
        tokio::time::sleep_until(next).await;
        // The remote.
        if (ramp_start..ramp_end).contains(&tick) {
            let steps = ramp_end - ramp_start;
            let target = 3 + (plan.pods - 3) * (tick - ramp_start + 1) as usize / steps as usize;
            rig.cluster.scale(BAD, target, plan.shape.starts_ready());
        } else if (ramp_end..fix_at).contains(&tick) {
            let flips = plan.flips_per_sec / ticks_per_sec as usize;
            rig.cluster.flood_step(BAD, plan.shape, flips);
        } else if tick == fix_at {
            rig.cluster.scale(BAD, 0, true);
            rig.cluster.scale(BAD, 3, true);
        }
        if tick % calm_every == 0 && tick < fix_at {
            let svc = CALM[(tick / calm_every) as usize % CALM.len()];
            let stamp = now_ms();
            rig.cluster
                .annotate_slices(svc, STAMP, Some(&stamp.to_string()));
            rig.cluster.roll_pod(svc, 0);
            calm_made.push(stamp);
        }
        let version = rig.upstream_version();
        upstream_second += version.saturating_sub(last_version);
        last_version = version;

        // Once a second: the table, and the operator.
        if tick % ticks_per_sec == 0 {
            let link = rig.floodgate.link_state().await;
            phase = link["phase"].as_str().unwrap_or("unknown").to_owned();
            let now_contained = contained_services(&link);
            if !now_contained.is_empty() && contained_at.is_none() {
                contained_at = Some(tick);
            }
            if released_at.is_none() {
                for c in &now_contained {
                    if !contained.contains(c) {
                        contained.push(c.clone());
                    }
                }
            }
            if phase == "Quarantined" && quarantined_at.is_none() {
                quarantined_at = Some(tick);
                quarantine_ms = link["quarantine"]["since"]
                    .as_str()
                    .and_then(|s| s.parse::<jiff::Timestamp>().ok())
                    .map(|t| t.as_millisecond().max(0) as u64)
                    .or(Some(now_ms()));
            }
            let (d, v) = (rig.direct.stats(), rig.via.stats());
            let flooder_contained = now_contained.iter().any(|c| c == FLOODER);
            // The fix deletes the flood's pods: from then on a frozen view names pods that
            // are gone, which no gateway can serve.
            resolved.look(&v, Some(&d), FLOODER, flooder_contained, tick < fix_at);
            let [direct_mem, via_mem, floodgate_mem] = rig.memory();
            let now = now_ms();
            let sample = Sample {
                t: tick / ticks_per_sec,
                upstream_events: upstream_second,
                direct_events: d.events - direct0,
                via_events: v.events - via0,
                direct_rss_kib: direct_mem.0,
                via_rss_kib: via_mem.0,
                floodgate_rss_kib: floodgate_mem.0,
                phase: phase.clone(),
                contained: now_contained.len(),
                direct_calm_ms: slowest_arrival(&d.seen, second_ms, now),
                via_calm_ms: slowest_arrival(&v.seen, second_ms, now),
                via_without_pod: v.ready_without_pod.total,
                via_without_pod_settled: v.ready_without_pod_settled.total,
                via_flooder_ready: v.ready_of(FLOODER),
            };
            second_ms = now;
            upstream_total += upstream_second;
            upstream_second = 0;
            reporter.sample(&sample);
            samples.push(sample);
            // A quarantined link (a contained service) serves its last good view until it is
            // released, which may look like the fixed remote: only a released (or never
            // stopped) link counts.
            let stopped = quarantined_at.is_some() || contained_at.is_some();
            let frozen = plan.release && stopped && released_at.is_none();
            if tick >= fix_at && !frozen && converged_at.is_none() && converged(&v, plan.exported) {
                converged_at = Some(tick);
            }
            if converged_at.is_some() && tick >= release_at {
                break;
            }
            anyhow::ensure!(
                tick < give_up,
                "the consumer behind Floodgate did not converge within 60 s of the fix \
                 (phase {phase}, it holds {} services, {} slices, {} pods)",
                v.services,
                v.slices,
                v.pods
            );
        }
        // The operator releases at `release_at`, and again every 2 s while something is still
        // contained: Floodgate may still be taking in the fix (the deletion of a large
        // Deployment's pods), see the service over a threshold and contain it again.
        let retry = tick > release_at && (tick - release_at).is_multiple_of(2 * ticks_per_sec);
        if plan.release && (tick == release_at || retry) {
            if phase == "Quarantined" && tick == release_at {
                let (code, body) = rig.floodgate.admin_post("release").await?;
                anyhow::ensure!(code == 200, "release answered {code}: {body}");
                released_at = Some(tick);
                release_ms = Some(now_ms());
            }
            let link = rig.floodgate.link_state().await;
            for svc in contained_services(&link) {
                let (code, body) = rig
                    .floodgate
                    .admin_post(&format!("services/{svc}/release"))
                    .await?;
                // 409: it was released (its re-check passed) in the meantime.
                anyhow::ensure!(
                    code == 200 || code == 409,
                    "release of {svc} answered {code}: {body}"
                );
                released_at = Some(tick);
                release_ms.get_or_insert_with(now_ms);
            }
        }
    }

    let (d, v) = (rig.direct.stats(), rig.via.stats());
    // Changes made during a quarantine arrive at release, by design, and so may those made in
    // the coalescing window before it (`max`, 2 s by default): they are not counted as stale.
    let window = plan.spec.coalesce.max.get().as_millis() as u64;
    let following = |stamp: u64| match (quarantine_ms, release_ms) {
        (None, _) => true,
        (Some(q), r) => stamp + window < q || r.is_some_and(|r| stamp > r),
    };
    let staleness = |seen: &[(u64, u64)], only_following: bool| {
        let mut out: Vec<u64> = calm_made
            .iter()
            .filter(|stamp| !only_following || following(**stamp))
            .filter_map(|stamp| seen.iter().find(|(s, _)| s == stamp))
            .map(|(s, at)| at.saturating_sub(*s))
            .collect();
        out.sort_unstable();
        out
    };
    let via_staleness_ms = staleness(&v.seen, true);
    let followed = calm_made.iter().filter(|s| following(**s)).count();
    let peaks = rig.memory();
    Ok(Outcome {
        upstream_events: upstream_total,
        direct_events: d.events - direct0,
        via_events: v.events - via0,
        direct_peak_kib: peaks[0].1,
        via_peak_kib: peaks[1].1,
        floodgate_peak_kib: peaks[2].1,
        via_missed: followed - via_staleness_ms.len(),
        via_staleness_ms,
        direct_staleness_ms: staleness(&d.seen, false),
        quarantined_after_s: quarantined_at
            .map(|t| t.saturating_sub(ramp_start) as f64 / ticks_per_sec as f64),
        contained_after_s: contained_at
            .map(|t| t.saturating_sub(ramp_start) as f64 / ticks_per_sec as f64),
        contained,
        converged_after_release_s: released_at
            .zip(converged_at)
            .map(|(r, c)| c.saturating_sub(r) as f64 / ticks_per_sec as f64),
        final_phase: phase,
        resolved,
        samples,
    })
}
