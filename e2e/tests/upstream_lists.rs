//! How a link takes its upstream lists: streaming lists where the remote serves them, paged
//! lists where it refuses them (and ignores `limit`, as a real API server's watch cache does).
//! Either way the link syncs, follows changes, and says which strategy each watcher uses.

use std::sync::Arc;

use floodgate::kubeapi::ApiStore as _;
use floodgate::model::{Kind, NsName, ObjKey};
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::gateway::Stack;
use floodgate_e2e::sim::SimStore;
use floodgate_e2e::until;

/// The `status.podIP` of pod `prod/<name>` in `view`.
fn pod_ip(view: &floodgate::view::View, name: &str) -> Option<String> {
    let s = view.get(&ObjKey {
        kind: Kind::Pod,
        id: NsName::new("prod", name),
    })?;
    let v: serde_json::Value = serde_json::from_slice(&s.json()).ok()?;
    v["status"]["podIP"].as_str().map(str::to_owned)
}

/// Starts a remote of two exported services (refusing streaming lists and ignoring `limit`
/// when `refusing`), a link on it, checks the strategy every watcher reports, then rolls a pod
/// and waits until the link serves its new address.
async fn syncs_and_follows(refusing: bool) {
    let store = Arc::new(SimStore::new(47, 10_000));
    store.set_refuse_streaming_lists(refusing);
    store.set_ignore_limit(refusing);
    let mut cluster = Cluster::exported(store.clone(), &["web", "api"], 3);
    let stack = Stack::start(store.clone(), Stack::default_spec())
        .await
        .expect("the link syncs");
    let want = if refusing { "paged" } else { "streaming" };
    let state = stack.link();
    for kind in ["Service", "EndpointSlice", "Endpoints", "Pod", "ReplicaSet"] {
        assert_eq!(
            state.upstream.list_strategies.get(kind).copied(),
            Some(want),
            "{kind}: {:?}",
            state.upstream.list_strategies
        );
    }
    let lists = stack.sim.api.counters.snapshot().lists;
    if refusing {
        assert!(lists >= 5, "paged: every watcher listed ({lists})");
    } else {
        assert_eq!(lists, 0, "streaming: no LIST reached the remote");
    }
    let view = stack.floodgate.links[0].view.clone();
    assert!(
        pod_ip(&view, "web-0").is_some(),
        "the pod is served at sync: {:?}",
        stack.link()
    );

    cluster.roll_pod("web", 0);
    let ip = pod_ip(store.view(), "web-0").expect("the remote's pod");
    until(10, "the rolled pod is served", async || {
        pod_ip(&view, "web-0").as_deref() == Some(ip.as_str())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_streaming_lists_sync_and_follow() {
    syncs_and_follows(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_lists_fall_back_to_pages_when_streaming_is_refused() {
    syncs_and_follows(true).await;
}
