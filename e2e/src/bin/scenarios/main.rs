//! `make bench`'s side-by-side half: the scenario benchmarks S1 and S2, then the report.
//!
//! - **S1 flood** (incident 2), twice: a Deployment scaled to 50,000 crash-looping pods behind a
//!   service that is not exported, then behind an exported one, while calm exported services
//!   change now and then. Two identical consumers watch, one straight from kube-sim and one
//!   through Floodgate ([`floodgate_e2e::flood`]); memory is each process's own VmHWM.
//! - **Calm**: the same rig with no flood at all: how much a calm change's delay through
//!   Floodgate adds to the direct consumer's.
//! - **Cold starts** ([`floodgate_e2e::cold`]): Floodgate starts while 30,000 pods behind an
//!   exported service crash-loop (ready within 10 s, calm services served, the flooder
//!   contained); and against 50,000 ready pods behind five exported services, no flood, twice:
//!   with streaming lists, then with each list sent as one body (peak and steady memory).
//! - **Many links** ([`floodgate_e2e::hub`]): 100 links in one `floodgate run`, each following
//!   a remote of one capped service of 1,000 EndpointSlices: ready time, how the start's lists
//!   reach the remote (unpaced, then at the default pace), memory a link beyond the JSON it
//!   serves, idle CPU.
//! - **Replicas** ([`floodgate_e2e::replicas`]): `floodgate controller` processes with 2 s
//!   Leases against kube-sim: the remote's watches with one replica and with three or four,
//!   a failover by SIGKILL as a consumer of a follower sees it, and links that move as
//!   replicas join and die.
//! - **S2 restart herd** (incident 1): 50 consumer processes restart 10 times each, straight
//!   against kube-sim and then through Floodgate; kube-sim counts the requests it serves.
//!
//! Then `target/floodgate-bench/report.json` and `report.md` gather every figure of the design's
//! performance table: these, the facade benchmark's (`facade.json`, written by `cargo bench -p
//! floodgate-e2e --bench facade`) and criterion's estimates for the engine
//! (`target/criterion/`), each with its target and the machine it ran on.

mod figures;
mod report;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use floodgate_e2e::cold::{self, ColdPlan};
use floodgate_e2e::drivers::FloodShape;
use floodgate_e2e::flood::{self, Outcome, Plan, Reporter, Sample};

use crate::figures::{
    calm_figures, cold_flood_figures, cold_large_figures, cold_wide_figures, hub_figures,
    replica_figures, s1_figures, shapes_figures, small_services_figures,
};
use crate::report::{engine_figures, facade_figures, markdown};
use floodgate_e2e::herd;
use floodgate_e2e::hub::{self, HubPlan};
use floodgate_e2e::report::{Figure, machine};
use floodgate_link_crd::{LinkSpec, RemoteSpec};
use serde_json::json;

/// Runs S1 and S2 side by side and writes the benchmark report.
#[derive(Debug, Parser)]
struct Args {
    /// S1: pods the bad Deployment scales to.
    #[arg(long, default_value_t = 50_000)]
    pods: usize,
    /// S1: pods flipping between ready and crashed per second.
    #[arg(long, default_value_t = 5_000)]
    flips_per_sec: usize,
    /// S1 and the cold start during a flood: how the flood's pods behave (`crash-loop`: created
    /// Ready, then two in three Ready at any moment; `crash-loop:SHARE`; `never-ready`).
    #[arg(long, default_value = "crash-loop")]
    flood_shape: FloodShape,
    /// S1: seconds of crash loop after the scale-up.
    #[arg(long, default_value_t = 20)]
    flood_secs: u64,
    /// S2: consumers that restart.
    #[arg(long, default_value_t = 50)]
    consumers: usize,
    /// S2: restarts of each.
    #[arg(long, default_value_t = 10)]
    restarts: u32,
    /// Cargo's target directory (default: the one this binary was built in).
    #[arg(long)]
    target_dir: Option<PathBuf>,
    /// Cold start during a flood: crash-looping pods behind the exported flooder.
    #[arg(long, default_value_t = 30_000)]
    cold_flood_pods: usize,
    /// Cold start of a calm, large remote: ready pods behind exported services.
    #[arg(long, default_value_t = 50_000)]
    cold_pods: usize,
    /// Serving cost: exported services of 100 ready pods each (`WIDE_PODS`), all served.
    #[arg(long, default_value_t = 1_000)]
    wide_services: usize,
    /// Many links: links in one `floodgate run`, each following a remote of one capped service.
    #[arg(long, default_value_t = 100)]
    hub_links: usize,
    /// Many links: EndpointSlices of 10 endpoints behind each link's one service.
    #[arg(long, default_value_t = 1_000)]
    hub_slices: usize,
    /// Many small services: exported services of 10 EndpointSlices of 10 endpoints, no pods.
    #[arg(long, default_value_t = 1_000)]
    small_services: usize,
    /// Run only these scenarios (comma-separated: s1-hidden, s1-exported, calm, cold-flood,
    /// cold-large, cold-wide, many-links, small-services, replicas, shapes, s2); the report then
    /// holds their figures only.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

impl Args {
    fn runs(&self, scenario: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == scenario)
    }
}

/// Prints a line every five seconds.
struct Progress(&'static str);

impl Reporter for Progress {
    fn started(&mut self, _: &str) {
        println!("{}: running", self.0);
    }

    fn sample(&mut self, s: &Sample) {
        if s.t.is_multiple_of(5) {
            println!(
                "{}: t={:>3}s upstream {:>6}/s  direct {:>8} ev {:>6.1} MiB  via {:>6} ev {:>5.1} MiB  Floodgate {:>6.1} MiB  {}",
                self.0,
                s.t,
                s.upstream_events,
                s.direct_events,
                s.direct_rss_kib as f64 / 1024.0,
                s.via_events,
                s.via_rss_kib as f64 / 1024.0,
                s.floodgate_rss_kib as f64 / 1024.0,
                s.phase
            );
        }
    }

    async fn done(&mut self, _: &Outcome) {}
}

/// No flood: the bad Deployment keeps its 3 ready pods; only the calm services change.
fn calm_plan(args: &Args) -> Plan {
    Plan {
        pods: 3,
        flips_per_sec: 0,
        flood: 10,
        release: false,
        ..s1_plan(args, true)
    }
}

fn cold_plans(args: &Args) -> (ColdPlan, [ColdPlan; 2]) {
    let flood = ColdPlan {
        pods: args.cold_flood_pods,
        services: 1,
        flips_per_sec: args.flips_per_sec,
        shape: args.flood_shape,
        one_body: false,
        spec: default_spec(),
    };
    let large = ColdPlan {
        pods: args.cold_pods,
        services: 5,
        flips_per_sec: 0,
        shape: args.flood_shape,
        one_body: false,
        spec: default_spec(),
    };
    let one_body = ColdPlan {
        one_body: true,
        ..large.clone()
    };
    (flood, [large, one_body])
}

fn s1_plan(args: &Args, exported: bool) -> Plan {
    Plan {
        pods: args.pods,
        exported,
        ramp: 10,
        flood: args.flood_secs,
        flips_per_sec: args.flips_per_sec,
        shape: args.flood_shape,
        calm_every: Duration::from_millis(500),
        release: exported,
        spec: default_spec(),
    }
}

/// Ready pods behind each service of the cold-wide scenario: all under the default cap.
const WIDE_PODS: usize = 100;

/// The product's defaults: what a user gets.
fn default_spec() -> LinkSpec {
    LinkSpec::with_remote(RemoteSpec::default())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let target = match &args.target_dir {
        Some(t) => t.clone(),
        None => std::env::current_exe()?
            .parent()
            .and_then(Path::parent)
            .context("target/<profile>/scenarios")?
            .to_path_buf(),
    };
    let out = target.join("floodgate-bench");
    std::fs::create_dir_all(&out)?;
    let work = tempfile::tempdir()?;

    let dir = |name: &str| -> anyhow::Result<PathBuf> {
        let d = work.path().join(name);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    };
    let mut figures = Vec::new();
    let mut report = json!({ "s1": {"pods": args.pods, "flips_per_sec": args.flips_per_sec} });
    let strip = |o: &Outcome| {
        let mut v = serde_json::to_value(o).unwrap_or_default();
        if let Some(samples) = v.as_object_mut().and_then(|m| m.remove("samples")) {
            v["samples_every_second"] = samples;
        }
        v
    };
    if args.runs("s1-hidden") {
        let plan = s1_plan(&args, false);
        let o = flood::run(&dir("s1-hidden")?, &plan, &mut Progress("S1 hidden")).await?;
        s1_figures(
            &format!(
                "(flood behind a service that is not exported, {})",
                plan.shape
            ),
            &o,
            &mut figures,
        );
        report["s1"]["hidden"] = strip(&o);
    }
    if args.runs("s1-exported") {
        let plan = s1_plan(&args, true);
        let o = flood::run(&dir("s1-exported")?, &plan, &mut Progress("S1 exported")).await?;
        s1_figures(
            &format!("(flood behind an exported service, {})", plan.shape),
            &o,
            &mut figures,
        );
        report["s1"]["exported"] = strip(&o);
    }
    if args.runs("calm") {
        let o = flood::run(&dir("calm")?, &calm_plan(&args), &mut Progress("calm")).await?;
        calm_figures(&o, &mut figures);
        report["calm"] = strip(&o);
    }
    let (flood_plan, large_plans) = cold_plans(&args);
    if args.runs("cold-flood") {
        println!("cold start during a flood: {} pods", flood_plan.pods);
        let o = cold::run(&dir("cold-flood")?, &flood_plan).await?;
        cold_flood_figures(&flood_plan, &o, &mut figures);
        report["cold_flood"] = serde_json::to_value(&o)?;
    }
    if args.runs("cold-large") {
        let mut runs = Vec::new();
        for (i, plan) in large_plans.iter().enumerate() {
            println!(
                "cold start: {} ready pods{}",
                plan.pods,
                if plan.one_body { ", one list body" } else { "" }
            );
            let o = cold::run(&dir(&format!("cold-large-{i}"))?, plan).await?;
            cold_large_figures(plan, &o, &mut figures);
            runs.push(serde_json::to_value(&o)?);
        }
        report["cold_large"] = runs.into();
    }
    if args.runs("cold-wide") {
        let plan = ColdPlan {
            pods: args.wide_services * WIDE_PODS,
            services: args.wide_services,
            ..large_plans[0].clone()
        };
        println!(
            "cold start: {} services of {WIDE_PODS} ready pods, all served",
            plan.services
        );
        let o = cold::run(&dir("cold-wide")?, &plan).await?;
        cold_wide_figures(&plan, &o, &mut figures);
        report["cold_wide"] = serde_json::to_value(&o)?;
    }
    if args.runs("many-links") {
        let mut runs = Vec::new();
        // Unpaced first, then with the default pace: how the start's lists reach the remote.
        for pace in [0, floodgate::link::DEFAULT_LINK_STARTS_PER_SECOND] {
            let plan = HubPlan {
                links: args.hub_links,
                services: 1,
                slices: args.hub_slices,
                starts_per_second: pace,
                idle_secs: 10,
            };
            println!(
                "many links: {} links of {} EndpointSlices, {pace} link starts a second",
                plan.links, plan.slices
            );
            runs.push(hub::run(&dir(&format!("many-links-{pace}"))?, &plan).await?);
        }
        // What a link costs with nothing to serve: the same links against an empty remote.
        let plan = HubPlan {
            links: args.hub_links,
            services: 0,
            slices: 0,
            starts_per_second: floodgate::link::DEFAULT_LINK_STARTS_PER_SECOND,
            idle_secs: 10,
        };
        println!("many links: {} links of an empty remote", plan.links);
        runs.push(hub::run(&dir("many-links-empty")?, &plan).await?);
        hub_figures(&runs[0], &runs[1], &runs[2], &mut figures);
        report["many_links"] = serde_json::to_value(&runs)?;
    }
    if args.runs("small-services") {
        let plan = HubPlan {
            links: 1,
            services: args.small_services,
            slices: 10,
            starts_per_second: floodgate::link::DEFAULT_LINK_STARTS_PER_SECOND,
            idle_secs: 10,
        };
        println!(
            "many small services: {} exported services of 10 EndpointSlices of 10 endpoints, no pods",
            plan.services
        );
        let o = hub::run(&dir("small-services")?, &plan).await?;
        small_services_figures(&plan, &o, &mut figures);
        report["small_services"] = serde_json::to_value(&o)?;
    }
    if args.runs("replicas") {
        println!("replicas: a failover by SIGKILL, then four links over replicas that come and go");
        let failover = floodgate_e2e::replicas::failover(&dir("replicas-failover")?).await?;
        let spread = floodgate_e2e::replicas::spread(&dir("replicas-spread")?).await?;
        replica_figures(&failover, &spread, &mut figures);
        report["replicas"] = json!({"failover": failover, "spread": spread});
    }
    if args.runs("shapes") {
        println!("shapes: a scale-up, a burst, a scale-down and a rollout, judged at the event");
        let run = floodgate_e2e::shapes::through_run().await?;
        let follower = floodgate_e2e::shapes::through_follower(&dir("shapes-follower")?).await?;
        shapes_figures(&[&run, &follower], &mut figures);
        report["shapes"] = json!([run, follower]);
    }
    if args.runs("s2") {
        println!(
            "S2: {} consumers x {} restarts",
            args.consumers, args.restarts
        );
        let herd = herd::run(&dir("s2")?, args.consumers, args.restarts, default_spec()).await?;
        figures.push(Figure {
            what: format!(
                "S2: upstream requests caused by {} consumers restarting {} times",
                args.consumers, args.restarts
            ),
            direct: herd.direct_requests.to_string(),
            floodgate: format!(
                "{} (Floodgate's own start: {})",
                herd.via_requests, herd.floodgate_own_requests
            ),
            ratio: String::new(),
            target: "0 (one LIST+WATCH per resource per link)".into(),
            met: Some(herd.via_requests == 0),
        });
        report["s2"] = json!({"consumers": args.consumers, "restarts": args.restarts,
               "direct_requests": herd.direct_requests, "via_requests": herd.via_requests,
               "floodgate_own_requests": herd.floodgate_own_requests,
               "direct_secs": herd.direct_secs, "via_secs": herd.via_secs});
    }
    engine_figures(&target, &mut figures);
    facade_figures(&target, &mut figures);

    let machine = machine();
    report["machine"] = machine.clone();
    report["figures"] = figures.iter().map(Figure::json).collect();
    std::fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let md = markdown(&machine, &figures);
    std::fs::write(out.join("report.md"), &md)?;
    println!("\n{md}");
    println!(
        "reports: {} and {}",
        out.join("report.json").display(),
        out.join("report.md").display()
    );
    Ok(())
}
