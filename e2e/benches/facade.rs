//! The facade's serving figures, against kube-sim running as its own process (so its memory
//! and CPU are measured from /proc, apart from the clients'):
//!
//! - LIST of 10,000 EndpointSlices of 10 endpoints, warm, over TLS, in JSON and in protobuf: time,
//!   bytes, and what decoding the same list costs a consumer (in Rust: serde into k8s-openapi
//!   types, prost into k8s-pb types; a Go-free proxy for client-go's decode);
//! - initial sync of the same through a streaming list, to a kube-rs watcher;
//! - 100, 1,000 and 5,000 watchers on one object, each on its own TLS connection over HTTP/1.1
//!   (as kube-rs connects), in JSON and in protobuf; and 1,000 and 5,000 over HTTP/2, ten watches
//!   to a connection (as a client-go consumer multiplexes its informers): memory per idle
//!   watcher, and for each update the time from the PATCH to the last watcher, the spread from
//!   the first watcher to the last, and the server CPU per delivered event.
//!
//! Prints the figures with the targets and writes `target/floodgate-bench/facade.json`.
//! Run with `make bench`.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::{Api, Client};

#[path = "facade/h2.rs"]
mod h2;

use h2::{WatchConn, h2_connection, start_watch};

const SLICES: usize = 10_000;
const WATCHER_COUNTS: [usize; 3] = [100, 1_000, 5_000];
const H2_WATCHER_COUNTS: [usize; 2] = [1_000, 5_000];
/// Watches per HTTP/2 connection: about what one client-go consumer of a link opens.
const H2_STREAMS_PER_CONNECTION: usize = 10;
const UPDATES: usize = 20;
const JSON: &str = "application/json";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json";

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

async fn raw_get(c: &Client, path: &str, accept: &str) -> (Duration, bytes::Bytes) {
    let req = http::Request::get(path)
        .header("accept", accept)
        .body(Vec::new())
        .expect("request");
    let t = Instant::now();
    let resp = c
        .send(req.map(kube::client::Body::from))
        .await
        .expect("response");
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (t.elapsed(), bytes)
}

/// Counts the frames in a watch body as it arrives: newlines for JSON, length prefixes for
/// protobuf (without decoding: the client's own cost is not what is measured).
#[derive(Default)]
struct FrameCounter {
    protobuf: bool,
    /// Protobuf: bytes of the current frame still to skip, and the partial length prefix.
    skip: usize,
    prefix: Vec<u8>,
}

impl FrameCounter {
    fn feed(&mut self, mut chunk: &[u8]) -> usize {
        if !self.protobuf {
            return chunk.iter().filter(|b| **b == b'\n').count();
        }
        let mut frames = 0;
        while !chunk.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(chunk.len());
                self.skip -= n;
                chunk = &chunk[n..];
                if self.skip == 0 {
                    frames += 1;
                }
                continue;
            }
            let need = 4 - self.prefix.len();
            let n = need.min(chunk.len());
            self.prefix.extend_from_slice(&chunk[..n]);
            chunk = &chunk[n..];
            if let Ok(len) = <[u8; 4]>::try_from(self.prefix.as_slice()) {
                self.skip = u32::from_be_bytes(len) as usize;
                self.prefix.clear();
                if self.skip == 0 {
                    frames += 1;
                }
            }
        }
        frames
    }
}

/// A kube-sim whose store is filled (its LIST reports every slice), and a client of it.
async fn filled_sim(dir: &std::path::Path) -> (Sim, Client) {
    let sim = start_sim(dir);
    let c = client(&sim.kubeconfig).await;
    loop {
        let (_, body) = raw_get(&c, "/apis/discovery.k8s.io/v1/endpointslices", JSON).await;
        if body.len() > SLICES * 1000 {
            return (sim, c);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How the watchers reach the server.
#[derive(Clone, Copy, PartialEq)]
enum Transport {
    /// One TLS connection per watch, as kube-rs (HTTP/1.1 only) makes them.
    Http1,
    /// `H2_STREAMS_PER_CONNECTION` watches on each TLS connection, negotiated by ALPN, as
    /// client-go makes them.
    Http2,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Http1 => "HTTP/1.1",
            Transport::Http2 => "HTTP/2",
        }
    }

    /// Server memory per idle watcher at most: HTTP/1.1 holds a connection per watch, HTTP/2
    /// shares one among ten (issue 35's targets).
    fn rss_target_kib(self) -> u32 {
        match self {
            Transport::Http1 => 12,
            Transport::Http2 => 8,
        }
    }
}

/// What one fan-out run measured.
struct Fanout {
    watchers: usize,
    transport: Transport,
    encoding: &'static str,
    rss_kib_per_watcher: f64,
    latency_p50: Duration,
    latency_p99: Duration,
    spread_p50: Duration,
    cpu_us_per_event: f64,
}

/// `watchers` watchers of one slice, each on its own connection, then UPDATES updates.
async fn fanout(
    sim: &Sim,
    c: &Client,
    watchers: usize,
    transport: Transport,
    encoding: &'static str,
    round: usize,
) -> Fanout {
    let pid = sim.child.id();
    let accept = if encoding == "protobuf" {
        PROTOBUF
    } else {
        JSON
    };
    let rss_before = rss_kib(pid);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(usize, Instant)>(watchers * (UPDATES + 2));
    let mut tasks = Vec::new();
    let mut conn = None;
    for i in 0..watchers {
        if transport == Transport::Http1 || i % H2_STREAMS_PER_CONNECTION == 0 {
            conn = Some(Arc::new(match transport {
                Transport::Http1 => WatchConn::Kube(client(&sim.kubeconfig).await),
                Transport::Http2 => {
                    let (send, base) = h2_connection(&sim.kubeconfig).await;
                    WatchConn::H2(send, base)
                }
            }));
        }
        let conn = conn.clone().expect("a connection");
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let path = "/apis/discovery.k8s.io/v1/namespaces/prod/endpointslices?watch=true&fieldSelector=metadata.name%3Dbench-00000&timeoutSeconds=600";
            let (content_type, mut body) = start_watch(&conn, path, accept).await;
            let mut counter = FrameCounter {
                protobuf: content_type
                    .is_some_and(|v| v.as_bytes().starts_with(b"application/vnd.kubernetes.protobuf")),
                ..Default::default()
            };
            assert_eq!(counter.protobuf, encoding == "protobuf", "the encoding asked for");
            while let Some(chunk) = body.next().await {
                for _ in 0..counter.feed(&chunk) {
                    if tx.send((i, Instant::now())).await.is_err() {
                        return;
                    }
                }
            }
        }));
    }
    // Every watcher first gets the synthetic ADDED.
    for _ in 0..watchers {
        rx.recv().await.expect("initial frame");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = rss_kib(pid);
    let rss_kib_per_watcher = rss_after.saturating_sub(rss_before) as f64 / watchers as f64;

    let api: Api<EndpointSlice> = Api::namespaced(c.clone(), "prod");
    let (mut latencies, mut spreads) = (Vec::new(), Vec::new());
    let cpu_before = cpu_time(pid);
    for u in 0..UPDATES {
        let patch = serde_json::json!({ "metadata": { "annotations": {
            "bench/update": format!("{round}-{u}") } } });
        let t = Instant::now();
        api.patch(
            "bench-00000",
            &Default::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("patch");
        let (mut first, mut last) = (None, t);
        for _ in 0..watchers {
            let (_, at) = rx.recv().await.expect("update frame");
            first = Some(first.map_or(at, |f: Instant| f.min(at)));
            last = last.max(at);
        }
        latencies.push(last - t);
        spreads.push(last - first.unwrap_or(last));
    }
    let cpu = cpu_time(pid) - cpu_before;
    for t in tasks {
        t.abort();
    }
    Fanout {
        watchers,
        transport,
        encoding,
        rss_kib_per_watcher,
        latency_p50: percentile(&mut latencies, 0.5),
        latency_p99: percentile(&mut latencies, 0.99),
        spread_p50: percentile(&mut spreads, 0.5),
        cpu_us_per_event: cpu.as_secs_f64() * 1e6 / (watchers * UPDATES) as f64,
    }
}

/// The median time of `f` over `runs` runs.
fn median_of(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut t: Vec<Duration> = (0..runs)
        .map(|_| {
            let at = Instant::now();
            f();
            at.elapsed()
        })
        .collect();
    percentile(&mut t, 0.5)
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
    // 5,000 watchers are 5,000 connections on each side; kube-sim inherits the limit.
    rlimit::increase_nofile_limit(30_000).expect("raise RLIMIT_NOFILE");
    // `-- --fanout-only` runs the fan-out rows alone (into facade-fanout.json).
    let fanout_only = std::env::args().any(|a| a == "--fanout-only");
    let mut report = if fanout_only {
        serde_json::Map::new()
    } else {
        list_and_sync(&out_dir).await
    };
    report.insert("fanout".into(), fanout_rows(&out_dir).await.into());
    report.insert(
        "machine".into(),
        serde_json::json!({ "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0) }),
    );
    let name = if fanout_only {
        "facade-fanout.json"
    } else {
        "facade.json"
    };
    let path = out_dir.join(name);
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&report).unwrap_or_default(),
    )
    .expect("write report");
    println!("report: {}", path.display());
}

/// LIST and the initial sync of SLICES slices: the report's `list` and `initial_sync`.
async fn list_and_sync(out_dir: &std::path::Path) -> serde_json::Map<String, serde_json::Value> {
    let (sim, c) = filled_sim(out_dir).await;
    let list_path = "/apis/discovery.k8s.io/v1/endpointslices";

    // LIST, warm, in both encodings.
    let mut list_figures = serde_json::Map::new();
    let mut bodies = Vec::new();
    for (name, accept) in [("json", JSON), ("protobuf", PROTOBUF)] {
        let mut lists = Vec::new();
        let mut body = bytes::Bytes::new();
        for _ in 0..12 {
            let (t, b) = raw_get(&c, list_path, accept).await;
            lists.push(t);
            body = b;
        }
        let p50 = percentile(&mut lists[2..], 0.5);
        println!(
            "LIST {SLICES} EndpointSlices as {name} ({:.1} MB) over TLS: median {:.1} ms, best {:.1} ms (target <= 30 ms)",
            body.len() as f64 / 1e6,
            ms(p50),
            ms(lists[2..].iter().copied().min().unwrap_or_default())
        );
        list_figures.insert(
            name.into(),
            serde_json::json!({ "bytes": body.len(), "median_ms": ms(p50), "target_ms": 30 }),
        );
        bodies.push(body);
    }
    let (json_body, pb_body) = (&bodies[0], &bodies[1]);
    // What the same list costs a consumer to decode.
    let json_decode = median_of(5, || {
        let l: k8s_openapi::List<EndpointSlice> =
            serde_json::from_slice(json_body).expect("a JSON list");
        assert_eq!(l.items.len(), SLICES);
    });
    let pb_decode = median_of(5, || {
        use prost::Message as _;
        let raw = floodgate::protobuf::open(pb_body)
            .expect("an envelope")
            .raw
            .unwrap_or_default();
        let l = k8s_pb::api::discovery::v1::EndpointSliceList::decode(raw.as_slice())
            .expect("a protobuf list");
        assert_eq!(l.items.len(), SLICES);
    });
    println!(
        "decoding that list in the consumer (Rust): JSON {:.1} ms, protobuf {:.1} ms ({:.1}x); bytes {:.2}x smaller",
        ms(json_decode),
        ms(pb_decode),
        json_decode.as_secs_f64() / pb_decode.as_secs_f64().max(1e-9),
        json_body.len() as f64 / pb_body.len().max(1) as f64
    );
    list_figures.insert(
        "consumer_decode_ms".into(),
        serde_json::json!({ "json": ms(json_decode), "protobuf": ms(pb_decode) }),
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

    drop((c, sim));
    let mut report = serde_json::Map::new();
    report.insert(
        "list".into(),
        serde_json::json!({ "slices": SLICES, "encodings": list_figures }),
    );
    report.insert(
        "initial_sync".into(),
        serde_json::json!({ "slices": SLICES, "median_ms": ms(sync_p50), "target_ms": 500 }),
    );
    report
}

/// 100, 1,000 and 5,000 watchers over HTTP/1.1, 1,000 and 5,000 over HTTP/2: the report's
/// `fanout` rows.
async fn fanout_rows(out_dir: &std::path::Path) -> Vec<serde_json::Value> {
    // 100, 1,000 and 5,000 watchers of one slice, JSON and protobuf.
    let mut runs = Vec::new();
    let plan = WATCHER_COUNTS
        .iter()
        .map(|&n| (n, Transport::Http1))
        .chain(H2_WATCHER_COUNTS.iter().map(|&n| (n, Transport::Http2)));
    for (round, (n, transport)) in plan.enumerate() {
        for encoding in ["json", "protobuf"] {
            // Each run in a kube-sim of its own: memory an earlier run freed would otherwise
            // hide what this one's watchers cost.
            let (sim, c) = filled_sim(out_dir).await;
            let f = fanout(&sim, &c, n, transport, encoding, round).await;
            drop(sim);
            println!(
                "{n} watchers over {}, {encoding}: {:.1} KiB per idle watcher (target <= {} KiB); PATCH to last watcher median {:.1} ms, p99 {:.1} ms; first to last watcher median {:.1} ms (target <= 8 ms); server CPU {:.1} us per delivered event (target <= 8 us; includes the PATCH)",
                transport.name(),
                f.rss_kib_per_watcher,
                transport.rss_target_kib(),
                ms(f.latency_p50),
                ms(f.latency_p99),
                ms(f.spread_p50),
                f.cpu_us_per_event
            );
            runs.push(f);
        }
    }

    runs.iter()
        .map(|f| {
            serde_json::json!({
                "watchers": f.watchers, "transport": f.transport.name(),
                "encoding": f.encoding, "updates": UPDATES,
                "latency_median_ms": ms(f.latency_p50), "latency_p99_ms": ms(f.latency_p99),
                "spread_median_ms": ms(f.spread_p50), "spread_target_ms": 8,
                "server_cpu_us_per_event": f.cpu_us_per_event, "cpu_target_us": 8,
                "server_rss_kib_per_idle_watcher": f.rss_kib_per_watcher, "rss_target_kib": f.transport.rss_target_kib(),
            })
        })
        .collect()
}
