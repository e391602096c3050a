//! S5: the real `floodgate` binary is killed (SIGKILL) while a link is quarantined. After the
//! restart the link is still quarantined and serves its last good view, though the remote has
//! moved on; released over the admin API, it converges to the remote. The same for one
//! contained service, while the link's other services follow the remote.

use std::collections::BTreeSet;
use std::sync::Arc;

use floodgate_e2e::RunningSim;
use floodgate_e2e::admin;
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::modes::Mode;
use floodgate_e2e::process::{Floodgate, Launch};
use floodgate_e2e::sim::SimStore;
use floodgate_e2e::until;
use floodgate_link_crd::{LinkSpec, RemoteSpec};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;
use serde_json::Value;

const ADMIN_TOKEN: &str = "s5-admin-token";

async fn link(g: &Floodgate) -> Value {
    match admin::call(g.admin, "GET", "/links/east", None, "").await {
        Ok((200, v)) => v,
        _ => Value::Null,
    }
}

async fn ready(g: &Floodgate) -> bool {
    matches!(
        admin::call_text(g.admin, "GET", "/readyz", None, "").await,
        Ok((200, _))
    )
}

/// Addresses a consumer of the link is served for a service, sorted.
async fn addresses(g: &Floodgate, service: &str) -> Vec<String> {
    let api: Api<EndpointSlice> = Api::namespaced(g.consumer().await.expect("a client"), "prod");
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={service}"));
    let mut out: Vec<String> = match api.list(&lp).await {
        Ok(list) => list
            .items
            .into_iter()
            .flat_map(|s| s.endpoints.unwrap_or_default())
            .flat_map(|e| e.addresses)
            .collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

/// The services the link shows contained.
fn contained(v: &Value) -> Vec<String> {
    v["contained"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["service"].as_str().map(str::to_owned))
        .collect()
}

/// Service names a consumer of the link lists.
async fn services(g: &Floodgate) -> BTreeSet<String> {
    let api: Api<Service> = Api::all(g.consumer().await.expect("a client"));
    match api.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect(),
        Err(_) => BTreeSet::new(),
    }
}

fn names(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// A remote with `services` (exported, two pods each) and a directory holding its kubeconfig,
/// the admin token and a links file of one link, `east`, its spec changed by `tune`.
struct Setup {
    cluster: Cluster,
    _sim: RunningSim,
    _tmp: tempfile::TempDir,
    launch: Launch,
}

async fn setup(seed: u32, services: &[&str], tune: impl Fn(&mut LinkSpec)) -> Setup {
    let store = Arc::new(SimStore::new(seed, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for svc in services {
        cluster.add_service(svc, true);
        cluster.scale(svc, 2, true);
    }
    let sim = RunningSim::start(store, "remote-token")
        .await
        .expect("kube-sim");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut spec = LinkSpec::with_remote(RemoteSpec::default());
    tune(&mut spec);
    let launch = Launch::new(Mode::Standalone, tmp.path())
        .link("east", &sim.kubeconfig(), spec)
        .admin_token(ADMIN_TOKEN)
        .log("warn");
    Setup {
        cluster,
        _sim: sim,
        _tmp: tmp,
        launch,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_quarantine_survives_sigkill_and_releases_after_restart() {
    let Setup {
        mut cluster,
        _sim,
        _tmp,
        launch,
    } = setup(75, &["web", "api"], |_| {}).await;
    let mut g = launch.spawn().await.expect("floodgate starts");
    let state = g.state().to_owned();
    until(60, "the first run syncs", async || ready(&g).await).await;
    assert_eq!(services(&g).await, names(&["api", "web"]));
    let (code, v) = admin::call(
        g.admin,
        "POST",
        "/links/east/quarantine",
        Some(ADMIN_TOKEN),
        r#"{"message": "S5"}"#,
    )
    .await
    .expect("POST");
    assert_eq!(code, 200, "{v}");
    let file = state.join("links/east/quarantine.json");
    until(10, "the quarantine is on disk", async || file.exists()).await;

    // The remote moves on, then Floodgate dies without a chance to clean up.
    cluster.add_service("new", true);
    cluster.relabel("api", "mirror.linkerd.io/exported", None);
    g.kill().await.expect("SIGKILL");

    g.respawn().expect("floodgate starts again");
    until(30, "the restarted link serves", async || ready(&g).await).await;
    let v = link(&g).await;
    assert_eq!(v["phase"], "Quarantined", "{v}");
    assert_eq!(v["quarantine"]["message"], "S5", "{v}");
    assert_eq!(
        services(&g).await,
        names(&["api", "web"]),
        "the last good view, not the remote's new state"
    );

    let (code, v) = admin::call(
        g.admin,
        "POST",
        "/links/east/release",
        Some(ADMIN_TOKEN),
        "",
    )
    .await
    .expect("POST");
    assert_eq!(code, 200, "{v}");
    until(
        30,
        "the released link converges to the remote",
        async || services(&g).await == names(&["new", "web"]),
    )
    .await;
    assert!(
        !file.exists(),
        "a released link leaves no quarantine on disk"
    );
    assert_eq!(link(&g).await["phase"], "Healthy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_containment_survives_sigkill_and_its_release_converges() {
    // More than 8 upstream endpoints contain a service (at most 5 are served).
    let Setup {
        mut cluster,
        _sim,
        _tmp,
        launch,
    } = setup(76, &["web", "injector"], |s| {
        s.caps.max_endpoints_per_service = 5;
        s.quarantine.when.endpoints_per_service = 8;
    })
    .await;
    let mut g = launch.spawn().await.expect("floodgate starts");
    let state = g.state().to_owned();
    until(60, "the first run syncs", async || ready(&g).await).await;
    cluster.scale("injector", 12, true);
    until(10, "the injector is contained", async || {
        contained(&link(&g).await) == ["prod/injector"]
    })
    .await;
    let frozen = addresses(&g, "injector").await;
    assert_eq!(frozen.len(), 2, "served at what it published: {frozen:?}");
    let file = state.join("links/east/contained.json");
    until(10, "the containment is on disk", async || file.exists()).await;

    // The remote moves on, then Floodgate dies without a chance to clean up.
    cluster.scale("injector", 20, true);
    cluster.scale("web", 3, true);
    let web_now = 3;
    g.kill().await.expect("SIGKILL");

    g.respawn().expect("floodgate starts again");
    until(30, "the restarted link serves", async || ready(&g).await).await;
    let v = link(&g).await;
    assert_eq!(contained(&v), ["prod/injector"], "{v}");
    assert_eq!(v["contained"][0]["reason"], "EndpointsPerService", "{v}");
    assert_ne!(v["phase"], "Quarantined", "{v}");
    assert_eq!(
        addresses(&g, "injector").await,
        frozen,
        "the contained service is served as it was before the kill"
    );
    until(30, "the calm service follows the remote", async || {
        addresses(&g, "web").await.len() == web_now
    })
    .await;

    // The flood ends; an operator releases the service and it converges.
    cluster.scale("injector", 4, true);
    let (code, v) = admin::call(
        g.admin,
        "POST",
        "/links/east/services/prod/injector/release",
        Some(ADMIN_TOKEN),
        r#"{"message": "rollout fixed"}"#,
    )
    .await
    .expect("POST");
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["service"], "prod/injector", "{v}");
    until(
        30,
        "the released service converges to the remote",
        async || addresses(&g, "injector").await.len() == 4,
    )
    .await;
    let v = link(&g).await;
    assert!(contained(&v).is_empty(), "{v}");
    let (code, v) = admin::call(
        g.admin,
        "POST",
        "/links/east/services/prod/injector/release",
        Some(ADMIN_TOKEN),
        "",
    )
    .await
    .expect("POST");
    assert_eq!(code, 409, "released already: {v}");
}
