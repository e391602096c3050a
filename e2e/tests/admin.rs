//! The admin API end to end: Floodgate in front of kube-sim, steered over HTTP on its admin
//! address, watched by a kube-rs reflector through the link.

use std::collections::BTreeMap;
use std::sync::Arc;

use floodgate_e2e::admin;
use floodgate_e2e::drivers::Cluster;
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
