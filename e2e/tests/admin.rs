//! The admin API end to end: Floodgate in front of kube-sim, steered over HTTP on its admin
//! address, watched by a kube-rs reflector through the link.

use std::collections::BTreeMap;
use std::sync::Arc;

use floodgate_e2e::admin;
use floodgate_e2e::drivers::{CONTROLLER_LAG, Cluster};
use floodgate_e2e::gateway::Stack;
use floodgate_e2e::sim::SimStore;
use floodgate_e2e::until;
use futures_util::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;

/// Endpoints per slice name, as the consumer's reflector holds them.
fn slices(reader: &Store<EndpointSlice>) -> BTreeMap<String, usize> {
    reader
        .state()
        .iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap_or_default(),
                s.endpoints.as_ref().map_or(0, Vec::len),
            )
        })
        .collect()
}

async fn link(stack: &Stack) -> Value {
    let (code, v) = admin::call(stack.admin_addr(), "GET", "/links/east", None, "")
        .await
        .expect("GET /links/east");
    assert_eq!(code, 200, "{v}");
    v
}

/// S4: an operator quarantines link `east` over HTTP; the remote changes while the link is
/// quarantined (consumers keep the last good view and the link drops its cache); the operator
/// releases it over HTTP and the consumer's reflector converges to the remote's new state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_link_quarantined_and_released_over_http_converges() {
    let store = Arc::new(SimStore::new(61, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 3, true);
    let stack = Stack::start(store, Stack::default_spec())
        .await
        .expect("stack");
    let addr = stack.admin_addr();
    let token = stack.admin_token.clone();

    let api: Api<EndpointSlice> = Api::all(stack.consumer().await.expect("client"));
    let (reader, writer) = reflector::store();
    let consumer = tokio::spawn(
        reflector::reflector(writer, watcher::watcher(api, watcher::Config::default()))
            .default_backoff()
            .for_each(|_| async {}),
    );
    until(20, "the consumer syncs", async || {
        slices(&reader).get("web-00000") == Some(&3)
    })
    .await;

    let (code, v) = admin::call(addr, "POST", "/links/east/quarantine", None, "")
        .await
        .expect("POST");
    assert_eq!(code, 401, "no token: {v}");
    let (code, v) = admin::call(
        addr,
        "POST",
        "/links/east/quarantine",
        Some(&token),
        r#"{"message": "S4: operator quarantine"}"#,
    )
    .await
    .expect("POST");
    assert_eq!(code, 200, "{v}");
    let q = link(&stack).await;
    assert_eq!(q["phase"], "Quarantined", "{q}");
    assert_eq!(q["quarantine"]["message"], "S4: operator quarantine");
    until(10, "the quarantined link drops its cache", async || {
        link(&stack).await["counters"]["objectsHeld"] == 0
    })
    .await;

    // The remote moves on while the link is quarantined.
    cluster.scale("web", 7, true);
    cluster.add_service("api", true);
    cluster.scale("api", 2, true);
    assert_eq!(
        slices(&reader).get("web-00000"),
        Some(&3),
        "consumers keep the last good view"
    );
    let (code, _) = admin::call(addr, "POST", "/links/east/quarantine", Some(&token), "")
        .await
        .expect("POST");
    assert_eq!(code, 409, "already quarantined");

    let (code, v) = admin::call(addr, "POST", "/links/east/release", Some(&token), "")
        .await
        .expect("POST");
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["transition"]["to"], "Active");
    let (code, _) = admin::call(addr, "POST", "/links/east/release", Some(&token), "")
        .await
        .expect("POST");
    assert_eq!(code, 409, "not quarantined any more");

    let expected = BTreeMap::from([("api-00000".to_owned(), 2), ("web-00000".to_owned(), 7)]);
    until(20, "the consumer converges to the remote", async || {
        slices(&reader) == expected
    })
    .await;
    let healthy = link(&stack).await;
    assert_eq!(healthy["phase"], "Healthy", "{healthy}");
    assert_eq!(healthy["quarantine"], Value::Null);
    assert_eq!(healthy["counters"]["quarantineTransitions"], 2);

    let (code, text) = admin::call_text(addr, "GET", "/metrics", None, "")
        .await
        .expect("metrics");
    assert_eq!(code, 200);
    for line in [
        "floodgate_link_quarantined{link=\"east\"} 0",
        "floodgate_quarantine_transitions_total{link=\"east\"} 2",
        "floodgate_link_phase{link=\"east\",phase=\"Healthy\"} 1",
        "floodgate_services{link=\"east\"} 2",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("floodgate_watchers{link=\"east\"} ") && !l.ends_with(" 0")),
        "the reflector's watch is counted:\n{text}"
    );
    consumer.abort();
}

/// The value of the metrics line `series` (its name and labels exactly), if served.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The signals operators alert on: the facade's requests counted exactly by verb, resource
/// and code; the remote reachable; no ready endpoint without its pod; the publication delay
/// of the changes published; the watch cap; the build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_facade_requests_exactly_and_say_the_view_is_whole() {
    let store = Arc::new(SimStore::new(62, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 3, true);
    let stack = Stack::start(store, Stack::default_spec())
        .await
        .expect("stack");
    let client = stack.consumer().await.expect("client");
    // One LIST in protobuf, as client-go's typed clients ask.
    let req = axum::http::Request::get("/api/v1/namespaces/prod/services")
        .header("Accept", "application/vnd.kubernetes.protobuf")
        .body(kube::client::Body::empty())
        .expect("request");
    let resp = client.send(req).await.expect("a protobuf LIST");
    assert_eq!(resp.status(), 200);
    // One watch open, of EndpointSlices.
    let slices: Api<EndpointSlice> = Api::all(client.clone());
    let watching = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher::watcher(slices, watcher::Config::default()));
        while events.next().await.is_some() {}
    });
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client, "prod");
    for _ in 0..3 {
        services.list(&Default::default()).await.expect("LIST");
    }
    services.get("web").await.expect("GET");
    assert!(services.get("nope").await.is_err(), "GET of a missing one");
    // A change published after the first sync has its delay measured.
    cluster.scale("web", 4, true);
    let metrics = async || {
        admin::call_text(stack.admin_addr(), "GET", "/metrics", None, "")
            .await
            .expect("metrics")
            .1
    };
    let mut text = String::new();
    until(20, "the scale-up published and measured", async || {
        text = metrics().await;
        sample(&text, "floodgate_publication_delay_seconds_count{link=\"east\"}")
            .is_some_and(|n| n >= 1.0)
            && sample(&text, "floodgate_endpoints_published{link=\"east\"}") == Some(4.0)
            // The new endpoint's pod may come a publication later (within 6 s, guarantee 7).
            && sample(&text, "floodgate_ready_endpoints_without_pod{link=\"east\"}") == Some(0.0)
            && sample(
                &text,
                "floodgate_watchers_by_resource{link=\"east\",resource=\"endpointslices\"}",
            ) == Some(1.0)
    })
    .await;
    let east = |labels: &str| format!("{{link=\"east\",{labels}}}");
    let requests = |verb: &str, code: u16, encoding: &str| {
        let labels = format!(
            "verb=\"{verb}\",resource=\"services\",code=\"{code}\",encoding=\"{encoding}\""
        );
        sample(
            &text,
            &format!("floodgate_facade_requests_total{}", east(&labels)),
        )
    };
    assert_eq!(requests("list", 200, "json"), Some(3.0), "{text}");
    assert_eq!(requests("list", 200, "protobuf"), Some(1.0), "{text}");
    assert_eq!(requests("get", 200, "json"), Some(1.0), "{text}");
    assert_eq!(requests("get", 404, "json"), Some(1.0), "{text}");
    for (series, want) in [
        ("floodgate_upstream_reachable{link=\"east\"}", 1.0),
        ("floodgate_upstream_outages_total{link=\"east\"}", 0.0),
        ("floodgate_ready_endpoints_without_pod{link=\"east\"}", 0.0),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }
    assert!(
        sample(&text, "floodgate_watchers_limit{link=\"east\"}").is_some_and(|n| n > 0.0),
        "{text}"
    );
    let le = |b: &str| {
        sample(
            &text,
            &format!("floodgate_publication_delay_seconds_bucket{{le=\"{b}\",link=\"east\"}}"),
        )
    };
    let count = sample(
        &text,
        "floodgate_publication_delay_seconds_count{link=\"east\"}",
    );
    assert!(
        le("0.001") <= le("60.0") && le("60.0") <= le("+Inf") && le("+Inf") == count,
        "cumulative buckets from 1 ms to 60 s, +Inf the count:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("floodgate_build_info{") && l.contains("mode=\"run\"")),
        "{text}"
    );
    let unserved = admin::unserved_monitoring_metrics(&text);
    assert!(
        unserved.is_empty(),
        "the alerts and dashboard use metrics `floodgate run` does not serve: {unserved:?}"
    );
    assert_eq!(
        sample(
            &text,
            "floodgate_watchers_by_resource{link=\"east\",resource=\"services\"}"
        ),
        Some(0.0),
        "{text}"
    );
    watching.abort();
    until(10, "the watch's end is counted", async || {
        sample(
            &metrics().await,
            "floodgate_watchers_by_resource{link=\"east\",resource=\"endpointslices\"}",
        ) == Some(0.0)
    })
    .await;
}

/// `(le, cumulative count)` of link east's publication-delay buckets in `text`.
fn delay_buckets(text: &str) -> Vec<(f64, f64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("floodgate_publication_delay_seconds_bucket{le=\"")?;
            let (le, rest) = rest.split_once('"')?;
            let value = rest.strip_prefix(",link=\"east\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, value.parse().ok()?))
        })
        .collect()
}

/// The median of the observations between two readings of the histogram, interpolated
/// linearly within its bucket as Prometheus's `histogram_quantile` does.
fn median_between(before: &[(f64, f64)], after: &[(f64, f64)]) -> f64 {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .zip(before)
        .map(|((le, a), (_, b))| (*le, a - b))
        .collect();
    let total = counts.last().map_or(0.0, |(_, n)| *n);
    let rank = total / 2.0;
    let mut lower = (0.0, 0.0);
    for (le, n) in counts {
        if n >= rank {
            let (lo, below) = lower;
            return lo + (le - lo) * (rank - below) / (n - below).max(f64::MIN_POSITIVE);
        }
        lower = (le, n);
    }
    f64::NAN
}

/// The publication delay Floodgate reports agrees with what a consumer measures: ten calm
/// changes (a pod rolled, its slice stamped, each after the service has been quiet), the
/// consumer's median from the write to its receipt through the facade, and the histogram's
/// median over those ten publications, within 20 ms of each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publication_delay_histogram_agrees_with_the_consumer() {
    use floodgate_e2e::flood::STAMP;
    let store = Arc::new(SimStore::new(63, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 3, true);
    let spec = Stack::default_spec();
    let quiet = std::time::Duration::from(spec.coalesce.quiet);
    let stack = Stack::start(store, spec).await.expect("stack");
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as u64
    };
    let seen: Arc<std::sync::Mutex<Vec<(u64, u64)>>> = Arc::default();
    let api: Api<EndpointSlice> = Api::all(stack.consumer().await.expect("client"));
    let record = seen.clone();
    let consumer = tokio::spawn(async move {
        let mut events =
            std::pin::pin!(watcher::watcher(api, watcher::Config::default()).applied_objects());
        while let Some(Ok(slice)) = events.next().await {
            let stamp = (slice.metadata.annotations.as_ref())
                .and_then(|a| a.get(STAMP))
                .and_then(|s| s.parse::<u64>().ok());
            if let Some(stamp) = stamp {
                record.lock().expect("lock").push((stamp, now_ms()));
            }
        }
    });
    let metrics = async || {
        admin::call_text(stack.admin_addr(), "GET", "/metrics", None, "")
            .await
            .expect("metrics")
            .1
    };
    until(20, "the consumer has synced", async || {
        sample(&metrics().await, "floodgate_link_synced{link=\"east\"}") == Some(1.0)
    })
    .await;
    tokio::time::sleep(quiet).await;
    let before = delay_buckets(&metrics().await);
    for _ in 0..10 {
        // The stamp rides on the slice's next rewrite: a pod of the service rolled, in a real
        // cluster's order (the pod, then the slice naming its new address: each published at
        // once, as it comes; written at once, the two would go out as one update, the slice a
        // lead after the pod, and the histogram would not know which half the consumer saw).
        let mut stamp = 0;
        cluster
            .roll_pod_in_order("web", 0, CONTROLLER_LAG, |c| {
                stamp = now_ms();
                c.annotate_slices("web", STAMP, Some(&stamp.to_string()));
            })
            .await;
        until(10, "the consumer receives the change", async || {
            seen.lock().expect("lock").iter().any(|(s, _)| *s == stamp)
        })
        .await;
        // Each change after a quiet service, its three updates (pod, slice, Endpoints) within
        // the service's budget (5 a second): published at its leading edge.
        tokio::time::sleep(quiet + std::time::Duration::from_millis(600)).await;
    }
    let after = delay_buckets(&metrics().await);
    consumer.abort();
    let mut measured: Vec<u64> = {
        let seen = seen.lock().expect("lock");
        seen.iter()
            .map(|(stamp, at)| at.saturating_sub(*stamp))
            .collect()
    };
    measured.sort_unstable();
    let consumer_ms = measured[measured.len() / 2] as f64;
    let published = after.last().map_or(0.0, |b| b.1) - before.last().map_or(0.0, |b| b.1);
    let histogram_ms = median_between(&before, &after) * 1000.0;
    println!(
        "publication delay, median of {published} publications: histogram {histogram_ms:.1} ms, \
         consumer {consumer_ms:.1} ms (from the write to the receipt; all: {measured:?} ms)"
    );
    assert!(
        published >= 10.0,
        "the ten changes were measured: {published}"
    );
    assert!(
        (histogram_ms - consumer_ms).abs() <= 20.0,
        "histogram {histogram_ms:.1} ms, consumer {consumer_ms:.1} ms"
    );
}
