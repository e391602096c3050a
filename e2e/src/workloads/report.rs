//! The rows side-by-side runs report, each figure beside the design's target: `make bench`'s
//! report (`src/bin/scenarios/`) and the real-server lane's S1 (`tests/real/s1.rs`) print them
//! with the same code, so docs/figures.md can set one beside the other.

use serde_json::{Value, json};

use crate::flood::percentile;

/// One row of a report.
#[derive(Debug, Clone)]
pub struct Figure {
    /// What was measured.
    pub what: String,
    /// The consumer connected straight to the remote.
    pub direct: String,
    /// The consumer behind Floodgate, or Floodgate itself.
    pub floodgate: String,
    /// The two compared.
    pub ratio: String,
    /// The design's target.
    pub target: String,
    /// Whether the target was met (`None`: reported only).
    pub met: Option<bool>,
}

impl Figure {
    /// A row of Floodgate's own figure, with no direct side and no ratio.
    pub fn own(
        what: impl Into<String>,
        floodgate: String,
        target: &str,
        met: Option<bool>,
    ) -> Self {
        Self {
            what: what.into(),
            direct: String::new(),
            floodgate,
            ratio: String::new(),
            target: target.into(),
            met,
        }
    }

    /// The row as `report.json` holds it.
    pub fn json(&self) -> Value {
        json!({"what": self.what, "direct": self.direct, "floodgate": self.floodgate,
               "ratio": self.ratio, "target": self.target, "met": self.met})
    }
}

/// KiB as MiB with one decimal.
pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The machine a run measured on: cores, CPU model, memory, kernel, date.
pub fn machine() -> Value {
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

/// The machine in one line.
pub fn machine_line(machine: &Value) -> String {
    format!(
        "Machine: {} cores ({}), {} GiB, Linux {}; run {}.",
        machine["cores"],
        machine["cpu"].as_str().unwrap_or("unknown CPU"),
        machine["memory_gib"],
        machine["kernel"].as_str().unwrap_or(""),
        machine["date"].as_str().unwrap_or("")
    )
}

/// The rows as a Markdown table.
pub fn table(figures: &[Figure]) -> String {
    let mut md = String::from("| figure | direct | through Floodgate | ratio | target | met |\n");
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
    md
}

/// What an S1 run measures, wherever it ran (kube-sim in `make bench`, a real API server in
/// `make test-real`): a consumer straight on the remote beside one behind Floodgate.
#[derive(Debug, Clone, Default)]
pub struct S1 {
    /// Events each consumer received during the flood (after its initial sync).
    pub direct_events: u64,
    /// See `direct_events`.
    pub via_events: u64,
    /// Each consumer's peak resident memory (VmHWM), KiB.
    pub direct_peak_kib: u64,
    /// See `direct_peak_kib`.
    pub via_peak_kib: u64,
    /// Floodgate's peak resident memory, KiB.
    pub floodgate_peak_kib: u64,
    /// How long each calm change took to reach the direct consumer, ms, sorted.
    pub direct_staleness_ms: Vec<u64>,
    /// The same behind Floodgate.
    pub via_staleness_ms: Vec<u64>,
    /// Calm changes that never reached the consumer behind Floodgate.
    pub via_missed: usize,
}

/// S1's rows: events, consumer memory, the calm changes' p99, Floodgate's peak RSS (each with
/// its target), and the calm changes' p50.
pub fn s1_figures(name: &str, o: &S1, out: &mut Vec<Figure>) {
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
    out.push(Figure::own(
        format!("S1 {name}: Floodgate peak RSS"),
        mib(o.floodgate_peak_kib),
        "<= 128 MiB",
        Some(o.floodgate_peak_kib <= 128 * 1024),
    ));
    out.push(Figure {
        what: format!("S1 {name}: calm service change visible downstream, p50"),
        direct: format!("{} ms", percentile(&o.direct_staleness_ms, 0.5)),
        floodgate: format!("{} ms", percentile(&o.via_staleness_ms, 0.5)),
        ratio: String::new(),
        target: "(reported)".into(),
        met: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The S1 rows say what the figures say, the targets beside them.
    #[test]
    fn s1_rows_hold_the_figures_and_their_targets() {
        let o = S1 {
            direct_events: 11_034,
            via_events: 15,
            direct_peak_kib: 160 * 1024,
            via_peak_kib: 40 * 1024,
            floodgate_peak_kib: 36 * 1024,
            direct_staleness_ms: vec![10, 20, 30],
            via_staleness_ms: vec![100, 200, 3000],
            via_missed: 1,
        };
        let mut rows = Vec::new();
        s1_figures("(real)", &o, &mut rows);
        let got: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.direct.as_str(),
                    r.floodgate.as_str(),
                    r.ratio.as_str(),
                    r.met,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("11034", "15", "736x fewer", Some(true)),
                ("160.0 MiB", "40.0 MiB", "25.0%", Some(false)),
                ("30 ms", "3000 ms", "", Some(false)),
                ("", "36.0 MiB", "", Some(true)),
                ("20 ms", "200 ms", "", None),
            ]
        );
        assert!(
            rows[2].what.contains("(3 changes, 1 never arrived)"),
            "{}",
            rows[2].what
        );
        let md = table(&rows);
        assert_eq!(md.lines().count(), 2 + rows.len(), "{md}");
        assert!(
            md.contains("| 11034 | 15 | 736x fewer | >= 100x fewer | yes |"),
            "{md}"
        );
    }
}
