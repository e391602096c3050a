//! The facade's serving figures, against kube-sim running as its own process (so its memory
//! and CPU are measured from /proc, apart from the clients'):
//!
//! - LIST of 10,000 EndpointSlices of 10 endpoints, warm, over TLS;
//! - initial sync of the same through a streaming list, to a kube-rs watcher;
//! - 1,000 watchers on one object: memory per idle watcher, and for each update the time until
//!   every watcher has it and the server CPU per delivered event.
//!
//! Prints the figures with the design's targets and writes
//! `target/floodgate-bench/facade.json`. Run with `make bench`.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::{Api, Client};

const SLICES: usize = 10_000;
const WATCHERS: usize = 1_000;
const UPDATES: usize = 30;

struct Sim {
    child: Child,
    kubeconfig: PathBuf,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_sim(dir: &std::path::Path) -> Sim {
    let kubeconfig = dir.join("bench.kubeconfig");
    let _ = std::fs::remove_file(&kubeconfig);
    let child = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args([
            "--token",
            "bench-token",
            "--scenario",
            "slices",
            "--slices",
            &SLICES.to_string(),
        ])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .spawn()
        .expect("kube-sim starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kubeconfig.exists() {
        assert!(
            Instant::now() < deadline,
            "kube-sim did not write its kubeconfig"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Sim { child, kubeconfig }
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system) a process has used.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    // Linux reports in USER_HZ, 100 per second on every architecture we run on.
    Duration::from_millis(ticks * 10)
}

async fn client(kubeconfig: &std::path::Path) -> Client {
    let yaml = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).expect("parses");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    Client::try_from(cfg).expect("client")
}

async fn raw_get(c: &Client, path: &str) -> (Duration, usize) {
    let req = http::Request::get(path).body(Vec::new()).expect("request");
    let t = Instant::now();
    let resp = c
        .send(req.map(kube::client::Body::from))
        .await
        .expect("response");
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (t.elapsed(), bytes.len())
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        // `cargo test --benches` asks a harness-less bench for its tests: it has none.
        return;
    }
    let out_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/floodgate-bench");
    std::fs::create_dir_all(&out_dir).expect("report dir");
    let sim = start_sim(&out_dir);
    let pid = sim.child.id();
    let c = client(&sim.kubeconfig).await;

    // Wait for the store to be filled (the LIST reports every slice).
    let list_path = "/apis/discovery.k8s.io/v1/endpointslices";
    loop {
        let (_, size) = raw_get(&c, list_path).await;
        if size > SLICES * 1000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // LIST, warm.
    let mut lists = Vec::new();
    let mut list_bytes = 0;
    for _ in 0..12 {
        let (t, size) = raw_get(&c, list_path).await;
        lists.push(t);
        list_bytes = size;
    }
    let list_p50 = percentile(&mut lists[2..], 0.5);
    println!(
        "LIST {SLICES} EndpointSlices ({:.1} MB JSON) over TLS: median {:.1} ms, best {:.1} ms (target <= 100 ms)",
        list_bytes as f64 / 1e6,
        ms(list_p50),
        ms(lists[2..].iter().copied().min().unwrap_or_default())
    );

    // Initial sync through a streaming list, to a kube-rs watcher.
    let mut syncs = Vec::new();
    for _ in 0..3 {
        let api: Api<EndpointSlice> = Api::all(c.clone());
        let t = Instant::now();
        let mut w = watcher::watcher(api, watcher::Config::default().streaming_lists()).boxed();
        let mut n = 0;
        while let Some(ev) = w.next().await {
            match ev.expect("watch") {
                watcher::Event::InitApply(_) => n += 1,
                watcher::Event::InitDone => break,
                _ => {}
            }
        }
        assert_eq!(n, SLICES);
        syncs.push(t.elapsed());
    }
    let sync_p50 = percentile(&mut syncs, 0.5);
    println!(
        "initial sync (streaming list) of {SLICES} slices to a kube-rs watcher: median {:.0} ms (target <= 500 ms)",
        ms(sync_p50)
    );

    // 1,000 watchers of one slice, each on its own connection.
    let rss_before = rss_kib(pid);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(usize, Instant)>(WATCHERS * (UPDATES + 2));
    let mut tasks = Vec::new();
    for i in 0..WATCHERS {
        let c = client(&sim.kubeconfig).await;
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let path = "/apis/discovery.k8s.io/v1/namespaces/prod/endpointslices?watch=true&fieldSelector=metadata.name%3Dbench-00000&timeoutSeconds=600";
            let req = http::Request::get(path).body(Vec::new()).expect("request");
            let resp = c.send(req.map(kube::client::Body::from)).await.expect("watch");
            let mut body = resp.into_body().into_data_stream();
            // Count frames without decoding them: the client's own cost is not what we measure.
            while let Some(Ok(chunk)) = body.next().await {
                for _ in chunk.iter().filter(|b| **b == b'\n') {
                    if tx.send((i, Instant::now())).await.is_err() {
                        return;
                    }
                }
            }
        }));
    }
    // Every watcher first gets the synthetic ADDED.
    for _ in 0..WATCHERS {
        rx.recv().await.expect("initial frame");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = rss_kib(pid);
    let per_watcher_kib = (rss_after.saturating_sub(rss_before)) as f64 / WATCHERS as f64;
    println!(
        "{WATCHERS} idle watchers: server RSS {} -> {} KiB, {per_watcher_kib:.1} KiB per watcher (target <= 16 KiB)",
        rss_before, rss_after
    );

    let api: Api<EndpointSlice> = Api::namespaced(c.clone(), "prod");
    let mut latencies = Vec::new();
    let cpu_before = cpu_time(pid);
    for u in 0..UPDATES {
        let patch =
            serde_json::json!({ "metadata": { "annotations": { "bench/update": u.to_string() } } });
        let t = Instant::now();
        api.patch(
            "bench-00000",
            &Default::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("patch");
        let mut last = t;
        for _ in 0..WATCHERS {
            let (_, at) = rx.recv().await.expect("update frame");
            last = last.max(at);
        }
        latencies.push(last - t);
    }
    let cpu = cpu_time(pid) - cpu_before;
    let per_event_us = cpu.as_secs_f64() * 1e6 / (WATCHERS * UPDATES) as f64;
    let lat_p50 = percentile(&mut latencies, 0.5);
    let lat_p99 = percentile(&mut latencies, 0.99);
    println!(
        "fan-out of one update to {WATCHERS} watchers: all reached in median {:.1} ms, p99 {:.1} ms (target <= 10 ms); server CPU {:.1} us per delivered event (target <= 5 us; includes the PATCH)",
        ms(lat_p50),
        ms(lat_p99),
        per_event_us
    );
    for t in tasks {
        t.abort();
    }

    let report = serde_json::json!({
        "machine": { "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0) },
        "list": { "slices": SLICES, "bytes": list_bytes, "median_ms": ms(list_p50), "target_ms": 100 },
        "initial_sync": { "slices": SLICES, "median_ms": ms(sync_p50), "target_ms": 500 },
        "fanout": {
            "watchers": WATCHERS, "updates": UPDATES,
            "latency_median_ms": ms(lat_p50), "latency_p99_ms": ms(lat_p99), "target_ms": 10,
            "server_cpu_us_per_event": per_event_us, "target_us": 5,
            "server_rss_kib_per_idle_watcher": per_watcher_kib, "target_kib": 16,
        },
    });
    let path = out_dir.join("facade.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&report).unwrap_or_default(),
    )
    .expect("write report");
    println!("report: {}", path.display());
}
