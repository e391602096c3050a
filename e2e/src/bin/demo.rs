//! `make demo`: incident 2 (the discovery flood), live, over loopback.
//!
//! kube-sim (in this process) plays the remote cluster: three calm exported services that roll
//! a pod now and then, and an exported Deployment that a bad rollout scales to 20,000
//! crash-looping pods. Floodgate (`floodgate run`, its own process) links to it. Two identical
//! consumers (`consumer`, kube-rs reflectors of Services, EndpointSlices and Pods, each its own
//! process) follow: one straight from kube-sim, as Linkerd is wired today, one through Floodgate.
//! A table is printed every second, with the delay of the calm services' changes through each
//! consumer: the flood contains the bad service while the calm ones keep changing through
//! Floodgate. The consumer behind Floodgate also resolves as Linkerd's destination does: the
//! `no pod` column counts its ready endpoints whose pod it does not hold (those waiting more
//! than 2 s, the flooder's / every service's), which a destination would drop. The remote is
//! fixed; the demo releases the service through the admin API and the
//! consumer converges. It ends with a summary and stops every process it started.

use std::time::Duration;

use clap::Parser;
use floodgate_e2e::drivers::FloodShape;
use floodgate_e2e::flood::{self, Outcome, Plan, Reporter, Sample, percentile};
use floodgate_link_crd::{KubeDuration, LinkSpec, RemoteSpec};

/// Replays the discovery-flood incident with and without Floodgate, side by side.
#[derive(Debug, Parser)]
struct Args {
    /// Pods the bad Deployment scales to.
    #[arg(long, default_value_t = 20_000)]
    pods: usize,
    /// Pods flipping between ready and crashed per second during the crash loop.
    #[arg(long, default_value_t = 2_000)]
    flips_per_sec: usize,
    /// How the bad Deployment's pods behave (`crash-loop`: created Ready, named by their
    /// slices, then two in three Ready at any moment; `crash-loop:SHARE`; `never-ready`).
    #[arg(long, default_value = "crash-loop")]
    flood_shape: FloodShape,
    /// Seconds the crash loop lasts.
    #[arg(long, default_value_t = 15)]
    flood_secs: u64,
    /// Small and short: 2,000 pods for 8 s (CI's smoke test).
    #[arg(long)]
    smoke: bool,
    /// After the summary, keep everything running (the status page stays up) until Ctrl-C.
    #[arg(long)]
    hold: bool,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

struct Table {
    hold: bool,
}

impl Reporter for Table {
    fn started(&mut self, status_page: &str) {
        println!("status page: {status_page} (live while the demo runs)\n");
        println!(
            "{:>4}  {:>13}  {:>22}  {:>22}  {:>13}  {:>17}  {:>11}  {:>9}  {:>14}",
            "t(s)",
            "upstream ev/s",
            "direct: events (MiB)",
            "via Floodgate (MiB)",
            "Floodgate MiB",
            "calm ms dir / via",
            "link phase",
            "contained",
            "no pod / ready"
        );
    }

    fn sample(&mut self, s: &Sample) {
        let ms = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        println!(
            "{:>4}  {:>13}  {:>22}  {:>22}  {:>13.1}  {:>17}  {:>11}  {:>9}  {:>14}",
            s.t,
            s.upstream_events,
            format!("{} ({:.1})", s.direct_events, mib(s.direct_rss_kib)),
            format!("{} ({:.1})", s.via_events, mib(s.via_rss_kib)),
            mib(s.floodgate_rss_kib),
            format!("{} / {}", ms(s.direct_calm_ms), ms(s.via_calm_ms)),
            s.phase,
            s.contained,
            format!("{} ({})", s.via_without_pod_settled, s.via_flooder_ready)
        );
    }

    async fn done(&mut self, o: &Outcome) {
        summary(o);
        if self.hold {
            println!("\nholding: the status page stays up until Ctrl-C");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn summary(o: &Outcome) {
    let ratio = o.direct_events as f64 / o.via_events.max(1) as f64;
    println!("\nSummary");
    println!("  {:<48} {:>12} {:>16}", "", "direct", "via Floodgate");
    println!(
        "  {:<48} {:>12} {:>16}",
        "objects received during the run", o.direct_events, o.via_events
    );
    println!(
        "  {:<48} {:>12.1} {:>16.1}",
        "consumer peak memory (MiB, VmHWM)",
        mib(o.direct_peak_kib),
        mib(o.via_peak_kib)
    );
    for (name, p) in [("p50", 0.5), ("p99", 0.99)] {
        println!(
            "  {:<48} {:>12} {:>16}",
            format!("calm-service changes, {name} delay (ms)"),
            percentile(&o.direct_staleness_ms, p),
            percentile(&o.via_staleness_ms, p)
        );
    }
    println!(
        "  {:<48} {:>12} {:>16}",
        "calm-service changes delivered",
        o.direct_staleness_ms.len(),
        format!("{} ({} missed)", o.via_staleness_ms.len(), o.via_missed)
    );
    println!(
        "  {ratio:.0}x fewer objects through Floodgate; Floodgate itself peaked at {:.1} MiB; \
         upstream changed {} objects",
        mib(o.floodgate_peak_kib),
        o.upstream_events
    );
    let r = &o.resolved;
    println!(
        "  ready endpoints without their pod for > 2 s, through Floodgate: flooder max {} \
         (end {}), calm services max {}; direct consumer max {}",
        r.flooder_settled_max, r.flooder_settled_end, r.calm_settled_max, r.direct_settled_max
    );
    if let Some(ready) = r.flooder_ready_contained {
        println!(
            "  while contained, the flooder was served with {ready} ready endpoints, {} of \
             them without their pod",
            r.flooder_without_pod_contained.unwrap_or_default()
        );
    }
    match o.contained_after_s {
        Some(c) => println!(
            "  contained {} {c:.0} s into the rollout; the calm services kept flowing",
            o.contained.join(", ")
        ),
        None => println!("  no service was contained"),
    }
    match (o.quarantined_after_s, o.converged_after_release_s) {
        (q, Some(c)) => println!(
            "  link quarantined: {}; released through the admin API, the consumer converged \
             {c:.0} s later; phase now {}",
            q.map_or("no".into(), |q| format!("after {q:.0} s")),
            o.final_phase
        ),
        (q, None) => println!(
            "  link quarantined: {}; phase now {}",
            q.map_or("no".into(), |q| format!("after {q:.0} s")),
            o.final_phase
        ),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.pods = 2_000;
        args.flips_per_sec = 1_000;
        args.flood_secs = 8;
    }
    let mut spec = LinkSpec::with_remote(RemoteSpec::default());
    spec.quarantine.when.events_per_second = 500;
    spec.quarantine.when.sustained_for = KubeDuration::from_secs(5);
    spec.quarantine.when.endpoints_per_service = 50_000;
    spec.quarantine.when.service_events_per_second = 100;
    println!(
        "Floodgate demo: incident 2 (discovery flood), {} crash-looping pods, {} flips/s",
        args.pods, args.flips_per_sec
    );
    println!(
        "link: quiet {} max {}, budget {}/s burst {} per link, {}/s burst {} per service, \
         cap {} endpoints/service; contain a service over {} events/s, quarantine the link \
         over {} events/s, each for {}",
        spec.coalesce.quiet,
        spec.coalesce.max,
        spec.rate_limit.per_link.updates_per_second,
        spec.rate_limit.per_link.burst,
        spec.rate_limit.per_service.updates_per_second,
        spec.rate_limit.per_service.burst,
        spec.caps.max_endpoints_per_service,
        spec.quarantine.when.service_events_per_second,
        spec.quarantine.when.events_per_second,
        spec.quarantine.when.sustained_for
    );
    let plan = Plan {
        pods: args.pods,
        exported: true,
        ramp: 5,
        flood: args.flood_secs,
        flips_per_sec: args.flips_per_sec,
        shape: args.flood_shape,
        calm_every: Duration::from_millis(700),
        release: true,
        spec,
    };
    let dir = tempfile::tempdir()?;
    let mut table = Table { hold: args.hold };
    let outcome = tokio::select! {
        o = flood::run(dir.path(), &plan, &mut table) => o?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted"),
    };
    anyhow::ensure!(
        outcome.contained == ["prod/injector"],
        "the flood should have contained the bad service, and only it: {:?}",
        outcome.contained
    );
    anyhow::ensure!(
        outcome.quarantined_after_s.is_none(),
        "one flooding service should not quarantine the link"
    );
    anyhow::ensure!(
        outcome.via_missed == 0,
        "every calm change should reach the consumer behind Floodgate ({} missed)",
        outcome.via_missed
    );
    anyhow::ensure!(
        outcome.final_phase == "Healthy",
        "the link should be Healthy after release, not {}",
        outcome.final_phase
    );
    anyhow::ensure!(
        outcome.via_events < outcome.direct_events,
        "the consumer behind Floodgate should receive fewer objects"
    );
    Ok(())
}
