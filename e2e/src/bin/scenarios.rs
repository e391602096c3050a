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
//! - **S2 restart herd** (incident 1): 50 consumer processes restart 10 times each, straight
//!   against kube-sim and then through Floodgate; kube-sim counts the requests it serves.
//!
//! Then `target/floodgate-bench/report.json` and `report.md` gather every figure of the design's
//! performance table: these, the facade benchmark's (`facade.json`, written by `cargo bench -p
//! floodgate-e2e --bench facade`) and criterion's estimates for the engine
//! (`target/criterion/`), each with its target and the machine it ran on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use floodgate_e2e::cold::{self, ColdOutcome, ColdPlan};
use floodgate_e2e::flood::{self, Outcome, Plan, Reporter, Sample, percentile};
use floodgate_e2e::herd;
use floodgate_link_crd::{LinkSpec, RemoteSpec};
use serde_json::{Value, json};

/// Runs S1 and S2 side by side and writes the benchmark report.
#[derive(Debug, Parser)]
struct Args {
    /// S1: pods the bad Deployment scales to.
    #[arg(long, default_value_t = 50_000)]
    pods: usize,
    /// S1: pods flipping between ready and crashed per second.
    #[arg(long, default_value_t = 5_000)]
    flips_per_sec: usize,
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
    /// Run only these scenarios (comma-separated: s1-hidden, s1-exported, calm, cold-flood,
    /// cold-large, s2); the
    /// report then holds their figures only.
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

fn calm_figures(o: &Outcome, out: &mut Vec<Figure>) {
    let (direct, via) = (
        percentile(&o.direct_staleness_ms, 0.5),
        percentile(&o.via_staleness_ms, 0.5),
    );
    out.push(Figure {
        what: format!(
            "Calm: a change's delay with no flood, p50 ({} changes)",
            o.via_staleness_ms.len()
        ),
        direct: format!("{direct} ms"),
        floodgate: format!("{via} ms"),
        ratio: format!("+{} ms", via.saturating_sub(direct)),
        target: "within 20 ms of direct".into(),
        met: Some(via <= direct + 20 && o.via_missed == 0),
    });
}

fn cold_flood_figures(plan: &ColdPlan, o: &ColdOutcome, out: &mut Vec<Figure>) {
    let what = |f: &str| {
        format!(
            "Cold start during a flood ({} pods crash-looping): {f}",
            plan.pods
        )
    };
    out.push(Figure {
        what: what("ready"),
        direct: String::new(),
        floodgate: format!("{:.1} s", o.ready_s),
        ratio: String::new(),
        target: "<= 10 s".into(),
        met: Some(o.ready_s <= 10.0),
    });
    out.push(Figure {
        what: what("a consumer's streaming-list informers synced, after its start"),
        direct: String::new(),
        floodgate: format!("{:.1} s", o.consumer_synced_s),
        ratio: String::new(),
        target: "<= 5 s".into(),
        met: Some(o.consumer_synced_s <= 5.0),
    });
    out.push(Figure {
        what: what("calm services served whole; the flooder contained"),
        direct: String::new(),
        floodgate: format!(
            "{}/3; {} after {}",
            o.calm_served,
            if o.contained.is_empty() {
                "none".to_owned()
            } else {
                o.contained.join(", ")
            },
            o.contained_after_s
                .map_or("never".to_owned(), |c| format!("{c:.1} s"))
        ),
        ratio: String::new(),
        target: "3/3; prod/injector".into(),
        met: Some(
            o.calm_served == 3 && o.contained == ["prod/injector"] && o.phase != "Quarantined",
        ),
    });
    out.push(Figure {
        what: what("Floodgate peak RSS"),
        direct: String::new(),
        floodgate: mib(o.peak_kib),
        ratio: String::new(),
        target: "(reported)".into(),
        met: None,
    });
}

fn cold_large_figures(plan: &ColdPlan, o: &ColdOutcome, out: &mut Vec<Figure>) {
    let what = |f: &str| {
        format!(
            "Cold start, {} ready pods behind {} exported services{}: {f}",
            plan.pods,
            plan.services,
            if plan.one_body {
                ", each list one body"
            } else {
                ", streaming lists"
            }
        )
    };
    out.push(Figure {
        what: what("Floodgate peak RSS"),
        direct: String::new(),
        floodgate: format!("{} ({} pods served)", mib(o.peak_kib), o.pods_served),
        ratio: String::new(),
        target: "<= 128 MiB".into(),
        met: Some(o.peak_kib <= 128 * 1024),
    });
    out.push(Figure {
        what: what("Floodgate steady RSS"),
        direct: String::new(),
        floodgate: format!(
            "{} ({:.1} MB of JSON served)",
            mib(o.steady_kib),
            o.view_bytes as f64 / 1e6
        ),
        ratio: String::new(),
        target: "<= 64 MiB".into(),
        met: Some(o.steady_kib <= 64 * 1024),
    });
}

fn cold_plans(args: &Args) -> (ColdPlan, [ColdPlan; 2]) {
    let flood = ColdPlan {
        pods: args.cold_flood_pods,
        services: 1,
        flips_per_sec: args.flips_per_sec,
        one_body: false,
        spec: default_spec(),
    };
    let large = ColdPlan {
        pods: args.cold_pods,
        services: 5,
        flips_per_sec: 0,
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
        calm_every: Duration::from_millis(500),
        release: exported,
        spec: default_spec(),
    }
}

/// The product's defaults: what a user gets.
fn default_spec() -> LinkSpec {
    LinkSpec::with_remote(RemoteSpec::default())
}

/// Criterion's mean estimate for `group/function`, in ns per iteration, with its interval.
fn criterion_ns(target: &Path, id: &str) -> Option<(f64, f64, f64)> {
    let path = target.join("criterion").join(id).join("new/estimates.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    let m = &v["mean"];
    Some((
        m["point_estimate"].as_f64()?,
        m["confidence_interval"]["lower_bound"].as_f64()?,
        m["confidence_interval"]["upper_bound"].as_f64()?,
    ))
}

fn machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default();
    let mem_kib: u64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_default();
    json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": model,
        "memory_gib": (mem_kib as f64 / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "date": jiff::Timestamp::now().to_string(),
    })
}

/// One row of the report.
struct Figure {
    what: String,
    direct: String,
    floodgate: String,
    ratio: String,
    target: String,
    met: Option<bool>,
}

impl Figure {
    fn json(&self) -> Value {
        json!({"what": self.what, "direct": self.direct, "floodgate": self.floodgate,
               "ratio": self.ratio, "target": self.target, "met": self.met})
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn s1_figures(name: &str, o: &Outcome, out: &mut Vec<Figure>) {
    let ratio = o.direct_events as f64 / o.via_events.max(1) as f64;
    out.push(Figure {
        what: format!("S1 {name}: downstream events, direct / through Floodgate"),
        direct: o.direct_events.to_string(),
        floodgate: o.via_events.to_string(),
        ratio: format!("{ratio:.0}x fewer"),
        target: ">= 100x fewer".into(),
        met: Some(ratio >= 100.0),
    });
    let mem = o.via_peak_kib as f64 / o.direct_peak_kib.max(1) as f64;
    out.push(Figure {
        what: format!("S1 {name}: consumer peak memory (VmHWM), through Floodgate / direct"),
        direct: mib(o.direct_peak_kib),
        floodgate: mib(o.via_peak_kib),
        ratio: format!("{:.1}%", mem * 100.0),
        target: "<= 10%".into(),
        met: Some(mem <= 0.10),
    });
    let p99 = percentile(&o.via_staleness_ms, 0.99);
    out.push(Figure {
        what: format!(
            "S1 {name}: calm service change visible downstream, p99 ({} changes{})",
            o.via_staleness_ms.len(),
            if o.via_missed > 0 {
                format!(", {} never arrived", o.via_missed)
            } else {
                String::new()
            }
        ),
        direct: format!("{} ms", percentile(&o.direct_staleness_ms, 0.99)),
        floodgate: format!("{p99} ms"),
        ratio: String::new(),
        target: "p99 <= 2 s".into(),
        met: Some(p99 <= 2000 && o.via_missed == 0 && !o.via_staleness_ms.is_empty()),
    });
    out.push(Figure {
        what: format!("S1 {name}: Floodgate peak RSS"),
        direct: String::new(),
        floodgate: mib(o.floodgate_peak_kib),
        ratio: String::new(),
        target: "<= 128 MiB".into(),
        met: Some(o.floodgate_peak_kib <= 128 * 1024),
    });
    out.push(Figure {
        what: format!("S1 {name}: calm service change visible downstream, p50"),
        direct: format!("{} ms", percentile(&o.direct_staleness_ms, 0.5)),
        floodgate: format!("{} ms", percentile(&o.via_staleness_ms, 0.5)),
        ratio: String::new(),
        target: "(reported)".into(),
        met: None,
    });
    if let Some(c) = o.contained_after_s {
        out.push(Figure {
            what: format!(
                "S1 {name}: containment of {}, from the start of the scale-up",
                o.contained.join(", ")
            ),
            direct: "never".into(),
            floodgate: format!("{c:.1} s"),
            ratio: String::new(),
            target: "(reported)".into(),
            met: None,
        });
    }
    if let Some(q) = o.quarantined_after_s {
        out.push(Figure {
            what: format!("S1 {name}: quarantine, from the start of the scale-up"),
            direct: "never".into(),
            floodgate: format!("{q:.1} s"),
            ratio: String::new(),
            target: "(reported)".into(),
            met: None,
        });
    }
}

fn engine_figures(target: &Path, out: &mut Vec<Figure>) {
    let rows = [
        (
            "engine/ingest_100k_events_10k_services",
            100_000.0,
            "churn engine, pre-decoded events, one core",
            1_000_000.0,
        ),
        (
            "upstream/decode_and_ingest_10k_slice_frames",
            10_000.0,
            "upstream ingest, JSON decoding included, one core",
            65_000.0,
        ),
        (
            "upstream/decode_10k_slice_frames",
            10_000.0,
            "JSON decoding alone (reference: about 130,000/s)",
            0.0,
        ),
    ];
    for (id, elements, what, goal) in rows {
        let Some((ns, lo, hi)) = criterion_ns(target, id) else {
            out.push(Figure {
                what: what.into(),
                direct: String::new(),
                floodgate: "not measured (run `cargo bench -p floodgate --bench churn`)".into(),
                ratio: String::new(),
                target: String::new(),
                met: None,
            });
            continue;
        };
        let rate = |ns: f64| elements / (ns / 1e9);
        out.push(Figure {
            what: what.into(),
            direct: String::new(),
            floodgate: format!(
                "{:.0} events/s (95% CI {:.0}-{:.0})",
                rate(ns),
                rate(hi),
                rate(lo)
            ),
            ratio: String::new(),
            target: if goal > 0.0 {
                format!(">= {goal:.0} events/s")
            } else {
                "(reference)".into()
            },
            met: (goal > 0.0).then(|| rate(ns) >= goal),
        });
    }
}

fn facade_figures(target: &Path, out: &mut Vec<Figure>) {
    let path = target.join("floodgate-bench/facade.json");
    let Some(f) = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    else {
        out.push(Figure {
            what: "facade: LIST, initial sync, fan-out".into(),
            direct: String::new(),
            floodgate: "not measured (run `cargo bench -p floodgate-e2e --bench facade`)".into(),
            ratio: String::new(),
            target: String::new(),
            met: None,
        });
        return;
    };
    let n = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let mut row = |what: &str, value: String, target: &str, met: bool| {
        out.push(Figure {
            what: what.into(),
            direct: String::new(),
            floodgate: value,
            ratio: String::new(),
            target: target.into(),
            met: Some(met),
        })
    };
    let sync = n(&f["initial_sync"]["median_ms"]);
    row(
        "initial sync (streaming list) of 10,000 EndpointSlices to a kube-rs watcher",
        format!("{sync:.0} ms"),
        "<= 500 ms",
        sync <= 500.0,
    );
    let list = n(&f["list"]["median_ms"]);
    row(
        &format!(
            "LIST of 10,000 EndpointSlices ({:.0} MB of JSON), warm, over TLS",
            n(&f["list"]["bytes"]) / 1e6
        ),
        format!("{list:.1} ms"),
        "<= 100 ms",
        list <= 100.0,
    );
    let fan = &f["fanout"];
    let lat = n(&fan["latency_median_ms"]);
    row(
        "fan-out: one update reaches 1,000 watchers (median)",
        format!("{lat:.1} ms (p99 {:.1} ms)", n(&fan["latency_p99_ms"])),
        "<= 10 ms",
        lat <= 10.0,
    );
    let cpu = n(&fan["server_cpu_us_per_event"]);
    row(
        "fan-out: server CPU per delivered event",
        format!("{cpu:.1} us"),
        "<= 5 us",
        cpu <= 5.0,
    );
    let idle = n(&fan["server_rss_kib_per_idle_watcher"]);
    row(
        "fan-out: memory per idle watcher",
        format!("{idle:.1} KiB"),
        "<= 16 KiB",
        idle <= 16.0,
    );
}

fn markdown(machine: &Value, figures: &[Figure]) -> String {
    let mut md = String::from("# Floodgate benchmark report\n\n");
    md.push_str(&format!(
        "Machine: {} cores ({}), {} GiB, Linux {}; run {}.\n\n",
        machine["cores"],
        machine["cpu"].as_str().unwrap_or("unknown CPU"),
        machine["memory_gib"],
        machine["kernel"].as_str().unwrap_or(""),
        machine["date"].as_str().unwrap_or("")
    ));
    md.push_str("| figure | direct | through Floodgate | ratio | target | met |\n");
    md.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for f in figures {
        let met = match f.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "",
        };
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {met} |\n",
            f.what, f.direct, f.floodgate, f.ratio, f.target
        ));
    }
    md.push_str("\nReproduce with `make bench`.\n");
    md
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
            "(flood behind a service that is not exported)",
            &o,
            &mut figures,
        );
        report["s1"]["hidden"] = strip(&o);
    }
    if args.runs("s1-exported") {
        let plan = s1_plan(&args, true);
        let o = flood::run(&dir("s1-exported")?, &plan, &mut Progress("S1 exported")).await?;
        s1_figures("(flood behind an exported service)", &o, &mut figures);
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
