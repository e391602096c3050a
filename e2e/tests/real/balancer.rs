//! A remote of two API servers on one etcd behind a TCP balancer, as managed control planes
//! run, and one of them restarted gracefully (SIGTERM, as a rolling upgrade sends it): the
//! other serves every new connection, Floodgate's watches resume on it, and nothing reaches the
//! consumers but the changes themselves.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate_e2e::process::Floodgate;
use floodgate_e2e::real::{Balancer, RealKube};
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::watcher::{self, Event};

use super::outage::phase_timeline;
use super::{floodgate_with, spec, warns_since};

/// What a consumer's watcher yielded, with when.
#[derive(Debug, Clone)]
enum Seen {
    /// A list began (the first, or a relist after a 410 or a failed resume).
    Init,
    /// A service applied (listed or watched).
    Applied(String),
    /// The watch failed (a 410 among others); the watcher resumes or relists after it.
    Error(String),
}

type Log = Arc<Mutex<Vec<(Instant, Seen)>>>;

/// A kube-rs watcher of the Services a consumer of `fg` is served, each event logged.
async fn consumer(fg: &Floodgate) -> (Log, tokio::task::JoinHandle<()>) {
    let api: Api<Service> = Api::all(fg.consumer().await.expect("consumer client"));
    let log = Log::default();
    let keep = log.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(e) = events.next().await {
            let seen = match e {
                Ok(Event::Init) => Seen::Init,
                Ok(Event::Apply(s) | Event::InitApply(s)) => {
                    Seen::Applied(s.metadata.name.unwrap_or_default())
                }
                Ok(_) => continue,
                Err(e) => Seen::Error(e.to_string()),
            };
            keep.lock().expect("log").push((Instant::now(), seen));
        }
    });
    (log, task)
}

/// When the consumer first saw service `name` applied.
fn seen_at(log: &Log, name: &str) -> Option<Instant> {
    let log = log.lock().expect("log");
    log.iter()
        .find(|(_, s)| matches!(s, Seen::Applied(n) if n == name))
        .map(|(at, _)| *at)
}

/// Creates exported service `name` in `default` through `api` (a server straight, not the
/// balancer); when the request was sent (a consumer may see the service before the answer
/// comes back).
async fn create(api: &Api<Service>, name: &str) -> (String, Instant) {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"mirror.linkerd.io/exported": "true"}},
        "spec": {"ports": [{"port": 80}]}
    }))
    .expect("service");
    let sent = Instant::now();
    api.create(&PostParams::default(), &svc)
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    (name.to_owned(), sent)
}

async fn counters(fg: &Floodgate) -> serde_json::Value {
    fg.link_state().await["counters"].clone()
}

/// Servers A and B on one etcd behind a balancer that prefers A; Floodgate's link at the
/// balancer, so all its connections are on A; a kube-rs consumer through Floodgate. A is sent
/// SIGTERM, and while it lingers (about 60 s, its open watches kept), after it exits and after
/// it is back, services are created through B. The link stays `Healthy` while A lingers (A's
/// old watches go on delivering), the consumer sees no error and no relist, and every service
/// reaches it within 10 s; at most two WARN lines; the link `Healthy` throughout, A's exit
/// included. It still relists its quiet kinds upstream at A's exit (see below), which issue
/// 52 asks to be gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn one_of_two_api_servers_behind_a_balancer_restarted_gracefully_loses_nothing() {
    let mut kube = RealKube::start().await.expect("API server A");
    let b = kube.second_apiserver("b").await.expect("API server B");
    let a_addr = kube.apiserver().addr;
    let lb = Balancer::start(&[a_addr, b.addr]).await.expect("balancer");
    let through_b: Api<Service> = Api::namespaced(b.client().await.expect("client"), "default");
    let mut changes = vec![create(&through_b, "before").await];
    let fg = floodgate_with(&kube, "floodgate", &kube.kubeconfig_at(&lb.url()), spec()).await;
    let (log, task) = consumer(&fg).await;
    floodgate_e2e::until(30, "the consumer sees the first service", async || {
        seen_at(&log, "before").is_some()
    })
    .await;
    let before = counters(&fg).await;
    let watchers = before["upstreamWatchers"].as_u64().expect("watchers");
    assert!(watchers > 0, "{before}");
    assert!(
        lb.open(0) >= watchers && lb.opened(1) == 0,
        "every watch of Floodgate's on A: {} open to A, {} ever to B, {watchers} watchers",
        lb.open(0),
        lb.opened(1)
    );

    let t0 = Instant::now();
    let (timeline, phases) = phase_timeline(&fg, t0);
    let from = fg.log_text().len();
    kube.terminate_apiserver().expect("SIGTERM to A");
    // While A lingers: a change every 4 s until it exits (its exit timed within 100 ms).
    let (mut i, mut next) = (0, Instant::now());
    while !kube.apiserver().exited() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "A exits within 2 minutes"
        );
        if Instant::now() >= next {
            changes.push(create(&through_b, &format!("lingering-{i}")).await);
            (i, next) = (i + 1, next + Duration::from_secs(4));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let exited = t0.elapsed();
    kube.wait_apiserver_exit(Duration::from_secs(1))
        .await
        .expect("A reaped");
    floodgate_e2e::until(30, "Floodgate's watches on B", async || {
        lb.open(0) == 0 && lb.open(1) >= watchers
    })
    .await;
    for i in 0..3 {
        changes.push(create(&through_b, &format!("a-gone-{i}")).await);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    kube.start_apiserver().await.expect("A again");
    let back = t0.elapsed();
    for i in 0..2 {
        changes.push(create(&through_b, &format!("a-back-{i}")).await);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let mut delays = Vec::new();
    for (name, at) in &changes {
        floodgate_e2e::until(30, &format!("the consumer sees {name}"), async || {
            seen_at(&log, name).is_some()
        })
        .await;
        let seen = seen_at(&log, name).expect("seen");
        delays.push((name.clone(), seen.saturating_duration_since(*at)));
    }
    phases.abort();
    task.abort();

    let after = counters(&fg).await;
    let timeline = timeline.lock().expect("timeline").clone();
    let warns = warns_since(&fg, from);
    let upstream: Vec<String> = (fg.log_text().get(from..).unwrap_or_default().lines())
        .filter(|l| l.contains("floodgate::upstream"))
        .map(str::to_owned)
        .collect();
    let seen = log.lock().expect("log").clone();
    let inits = seen.iter().filter(|(_, s)| matches!(s, Seen::Init)).count();
    let errors: Vec<_> = (seen.iter())
        .filter_map(|(_, s)| match s {
            Seen::Error(e) => Some(e.clone()),
            _ => None,
        })
        .collect();
    println!(
        "balancer: SIGTERM to A at 0 s; A exited at {:.1} s, back at {:.1} s; {} changes",
        exited.as_secs_f64(),
        back.as_secs_f64(),
        changes.len()
    );
    for (name, d) in &delays {
        println!(
            "  {name}: at the consumer {:.3} s after its creation was sent",
            d.as_secs_f64()
        );
    }
    println!("  link phase timeline (s since the SIGTERM): {timeline:?}");
    println!(
        "  Floodgate's upstream: relists {} -> {}, forced {} -> {}, errors {} -> {}",
        before["upstreamRelists"],
        after["upstreamRelists"],
        before["upstreamForcedRelists"],
        after["upstreamForcedRelists"],
        before["upstreamErrors"],
        after["upstreamErrors"],
    );
    println!(
        "  connections through the balancer: A {} ever, B {} ever ({} open)",
        lb.opened(0),
        lb.opened(1),
        lb.open(1)
    );
    println!("  consumer: {inits} list(s), errors {errors:?}");
    println!("  Floodgate's upstream lines since the SIGTERM: {upstream:#?}");
    // Healthy throughout: while A lingers the probe's fresh connections reach B, and at A's
    // exit a watcher whose resume breaks on a connection A closes is a suspicion the probe
    // checks on B (`Health::suspect`), not an outage.
    assert!(
        timeline.iter().all(|(_, p)| p == "Healthy"),
        "Healthy throughout: {timeline:?}"
    );
    // Not yet what issue 52 asks (no upstream relist): the kinds nothing changed since A's
    // watch cache began resume from that cache's first version, older than B's cache, so B
    // answers 410 and they relist (docs/faults.md). Bounded here: relists only those 410s, one
    // a watcher at most.
    let relists = |c: &serde_json::Value, k: &str| c[k].as_u64().unwrap_or_default();
    let relisted = relists(&after, "upstreamRelists") - relists(&before, "upstreamRelists");
    let expired =
        relists(&after, "upstreamForcedRelists") - relists(&before, "upstreamForcedRelists");
    assert!(
        relisted == expired && relisted <= watchers,
        "upstream relists only on 410, one a watcher at most: {relisted} relists, {expired} 410s"
    );
    // What consumers see: nothing but the changes.
    assert_eq!(inits, 1, "the consumer listed once: {seen:?}");
    assert!(
        errors.is_empty(),
        "no error (no 410) at the consumer: {errors:?}"
    );
    assert!(
        delays.iter().all(|(_, d)| *d <= Duration::from_secs(10)),
        "every change at the consumer within 10 s: {delays:?}"
    );
    assert!(warns.len() <= 2, "at most two WARN lines: {warns:#?}");
}
