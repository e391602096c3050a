//! The report: one row per figure with its target (`report.json`, `report.md`), the machine it
//! ran on, and the rows read from criterion's and the facade benchmark's own output. The rows
//! and the table are [`floodgate_e2e::report`]'s, which the real-server lane prints too.

use std::path::Path;

use floodgate_e2e::report::{Figure, machine_line, table};
use serde_json::Value;

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

pub fn engine_figures(target: &Path, out: &mut Vec<Figure>) {
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
            out.push(Figure::own(
                what,
                "not measured (run `cargo bench -p floodgate --bench churn`)".into(),
                "",
                None,
            ));
            continue;
        };
        let rate = |ns: f64| elements / (ns / 1e9);
        out.push(Figure::own(
            what,
            format!(
                "{:.0} events/s (95% CI {:.0}-{:.0})",
                rate(ns),
                rate(hi),
                rate(lo)
            ),
            &if goal > 0.0 {
                format!(">= {goal:.0} events/s")
            } else {
                "(reference)".into()
            },
            (goal > 0.0).then(|| rate(ns) >= goal),
        ));
    }
}

pub fn facade_figures(target: &Path, out: &mut Vec<Figure>) {
    let path = target.join("floodgate-bench/facade.json");
    let Some(f) = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    else {
        out.push(Figure::own(
            "facade: LIST, initial sync, fan-out",
            "not measured (run `cargo bench -p floodgate-e2e --bench facade`)".into(),
            "",
            None,
        ));
        return;
    };
    let n = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let mut row = |what: &str, value: String, target: &str, met: Option<bool>| {
        out.push(Figure::own(what, value, target, met))
    };
    let sync = n(&f["initial_sync"]["median_ms"]);
    row(
        "initial sync (streaming list) of 10,000 EndpointSlices to a kube-rs watcher",
        format!("{sync:.0} ms"),
        "<= 500 ms",
        Some(sync <= 500.0),
    );
    for encoding in ["json", "protobuf"] {
        let l = &f["list"]["encodings"][encoding];
        let ms = n(&l["median_ms"]);
        row(
            &format!(
                "LIST of 10,000 EndpointSlices as {encoding} ({:.1} MB), warm, over TLS (median)",
                n(&l["bytes"]) / 1e6
            ),
            format!("{ms:.1} ms"),
            "<= 30 ms",
            Some(ms <= 30.0),
        );
    }
    // The design's fan-out targets are for 1,000 watchers; the other counts are reported.
    for fan in f["fanout"].as_array().into_iter().flatten() {
        let watchers = fan["watchers"].as_u64().unwrap_or_default();
        let who = format!(
            "fan-out, {watchers} watchers over {}, {}",
            fan["transport"].as_str().unwrap_or("?"),
            fan["encoding"].as_str().unwrap_or("?")
        );
        let (spread, cpu, idle) = (
            n(&fan["spread_median_ms"]),
            n(&fan["server_cpu_us_per_event"]),
            n(&fan["server_rss_kib_per_idle_watcher"]),
        );
        let value = format!(
            "first to last watcher {spread:.1} ms; {cpu:.1} us CPU per event; {idle:.1} KiB per idle watcher"
        );
        if watchers == 1_000 {
            // HTTP/1.1 holds a connection per watch: its own memory target (12 KiB; reports
            // from before it was written carry none and had 8 for both).
            let rss_target = fan["rss_target_kib"].as_f64().unwrap_or(8.0);
            row(
                &who,
                value,
                &format!("<= 8 ms; <= 8 us; <= {rss_target} KiB"),
                Some(spread <= 8.0 && cpu <= 8.0 && idle <= rss_target),
            );
        } else {
            row(&who, value, "(reported)", None);
        }
    }
}

pub fn markdown(machine: &Value, figures: &[Figure]) -> String {
    let mut md = String::from("# Floodgate benchmark report\n\n");
    md.push_str(&machine_line(machine));
    md.push_str("\n\n");
    md.push_str(&table(figures));
    md.push_str("\nReproduce with `make bench`.\n");
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The facade rows read what the facade benchmark writes (`e2e/benches/facade.rs`): a
    /// change of its shape that this reader misses shows as NaN in the report.
    #[test]
    fn facade_rows_read_the_facade_benchmarks_report() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(dir.path().join("floodgate-bench")).expect("dir");
        let fan = |watchers: u64, transport: &str, spread: f64| {
            let (idle, target) = if transport == "HTTP/2" {
                (6.1, 8)
            } else {
                (11.9, 12)
            };
            json!({"watchers": watchers, "transport": transport, "encoding": "json",
                   "spread_median_ms": spread, "server_cpu_us_per_event": 7.5,
                   "server_rss_kib_per_idle_watcher": idle, "rss_target_kib": target})
        };
        let report = json!({
            "initial_sync": {"median_ms": 646.0},
            "list": {"encodings": {
                "json": {"bytes": 23_899_684, "median_ms": 25.3},
                "protobuf": {"bytes": 8_579_636, "median_ms": 7.3},
            }},
            "fanout": [
                fan(100, "HTTP/1.1", 0.7), fan(1_000, "HTTP/2", 6.2),
                fan(1_000, "HTTP/1.1", 10.6), fan(1_000, "HTTP/1.1", 7.9),
            ],
        });
        std::fs::write(
            dir.path().join("floodgate-bench/facade.json"),
            report.to_string(),
        )
        .expect("write");
        let mut rows = Vec::new();
        facade_figures(dir.path(), &mut rows);
        let got: Vec<_> = rows.iter().map(|r| (r.floodgate.as_str(), r.met)).collect();
        assert!(rows.iter().all(|r| !r.floodgate.contains("NaN")), "{got:?}");
        assert_eq!(
            got,
            [
                ("646 ms", Some(false)),
                ("25.3 ms", Some(true)),
                ("7.3 ms", Some(true)),
                (
                    "first to last watcher 0.7 ms; 7.5 us CPU per event; 11.9 KiB per idle watcher",
                    None
                ),
                (
                    "first to last watcher 6.2 ms; 7.5 us CPU per event; 6.1 KiB per idle watcher",
                    Some(true)
                ),
                (
                    "first to last watcher 10.6 ms; 7.5 us CPU per event; 11.9 KiB per idle watcher",
                    Some(false)
                ),
                // HTTP/1.1's idle watcher is judged against its own 12 KiB.
                (
                    "first to last watcher 7.9 ms; 7.5 us CPU per event; 11.9 KiB per idle watcher",
                    Some(true)
                ),
            ]
        );
        assert_eq!(rows[4].target, "<= 8 ms; <= 8 us; <= 8 KiB");
        assert_eq!(rows[6].target, "<= 8 ms; <= 8 us; <= 12 KiB");
        assert!(
            rows[1].what.contains("as json (23.9 MB)"),
            "{}",
            rows[1].what
        );
    }
}
