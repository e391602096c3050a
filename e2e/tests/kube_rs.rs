//! kube-rs's `watcher` (a client we did not write) against kube-sim, over TLS, with both initial
//! list strategies: initial sync, changes, selector moves, timeouts with resumption, and the 410
//! relist once a watcher's version has left the history.

use std::sync::Arc;
use std::time::Duration;

use floodgate::kubeapi::status::{Reason, StatusError};
use floodgate_e2e::RunningSim;
use floodgate_e2e::drivers::{Cluster, EXPORTED};
use floodgate_e2e::next_event as next;
use floodgate_e2e::sim::SimStore;
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

async fn client(sim: &RunningSim) -> Client {
    let kc = kube::config::Kubeconfig::from_yaml(&sim.kubeconfig()).expect("kubeconfig parses");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(cfg).expect("client")
}

fn name<K: kube::Resource>(k: &K) -> String {
    k.meta().name.clone().unwrap_or_default()
}

/// Names applied during an initial list, once it is done.
async fn initial_names<K: kube::Resource>(
    s: &mut (impl Stream<Item = watcher::Result<Event<K>>> + Unpin),
) -> Vec<String> {
    let mut names = Vec::new();
    loop {
        match next(s).await {
            Event::Init => names.clear(),
            Event::InitApply(k) => names.push(name(&k)),
            Event::InitDone => break,
            Event::Apply(_) | Event::Delete(_) => {}
        }
    }
    names.sort();
    names
}

async fn sync_and_follow(streaming: bool) {
    let store = Arc::new(SimStore::new(11, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for (svc, exported) in [("web", true), ("api", true), ("db", false)] {
        cluster.add_service(svc, exported);
    }
    let sim = RunningSim::start(store, "secret").await.expect("sim");
    let api: Api<Service> = Api::all(client(&sim).await);
    let mut cfg = watcher::Config::default().labels(EXPORTED);
    if streaming {
        cfg = cfg.streaming_lists();
    }
    let mut w = watcher::watcher(api, cfg).boxed();

    assert_eq!(
        initial_names(&mut w).await,
        ["api", "web"],
        "only exported services"
    );
    cluster.add_service("cache", true);
    assert!(matches!(next(&mut w).await, Event::Apply(s) if name(&s) == "cache"));
    cluster.relabel("web", EXPORTED, None);
    assert!(
        matches!(next(&mut w).await, Event::Delete(s) if name(&s) == "web"),
        "leaving the selector is a deletion"
    );
    cluster.relabel("db", EXPORTED, Some("true"));
    assert!(
        matches!(next(&mut w).await, Event::Apply(s) if name(&s) == "db"),
        "entering it is an addition"
    );

    let c = sim.api.counters.snapshot();
    if streaming {
        assert_eq!(c.lists, 0, "a streaming list needs no LIST");
    } else {
        assert_eq!(c.lists, 1);
    }
    assert!(c.watches >= 1);
}

#[tokio::test]
async fn list_then_watch_syncs_and_follows_selector_moves() {
    sync_and_follow(false).await;
}

#[tokio::test]
async fn streaming_list_syncs_and_follows_selector_moves() {
    sync_and_follow(true).await;
}

/// A watch that times out resumes from its last version: no duplicate, no relist.
#[tokio::test]
async fn timed_out_watches_resume_without_duplicates() {
    let store = Arc::new(SimStore::new(12, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 3, true);
    let sim = RunningSim::start(store, "secret").await.expect("sim");
    let api: Api<EndpointSlice> = Api::all(client(&sim).await);
    let mut w = watcher::watcher(api, watcher::Config::default().timeout(1)).boxed();
    assert_eq!(initial_names(&mut w).await, ["web-00000"]);
    let mut seen = Vec::new();
    for i in 0..3 {
        cluster.roll_pod("web", i);
        match next(&mut w).await {
            Event::Apply(s) => seen.push(s.endpoints.unwrap_or_default()[i].addresses[0].clone()),
            other => panic!("expected an update, got {other:?}"),
        }
        // The 1 s watch times out between changes (kube-rs renews it when next polled).
        floodgate_e2e::until(10, "the watch timed out", async || {
            sim.api.open_watches() == 0
        })
        .await;
    }
    seen.dedup();
    assert_eq!(seen.len(), 3, "each change exactly once: {seen:?}");
    let c = sim.api.counters.snapshot();
    assert_eq!(c.lists, 1, "resumed, never relisted");
    assert!(c.watches >= 3, "the watch was renewed: {c:?}");
}

/// Once a watcher's version has left its kind's history, its resume gets an in-stream 410 and
/// it relists. The history is per kind, as an API server's watch cache is per resource: only
/// Service changes made while the watcher was away can push its version out.
#[tokio::test]
async fn an_expired_version_makes_kube_rs_relist() {
    let store = Arc::new(SimStore::new(13, 20));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 3, true);
    cluster.add_service("other", false);
    cluster.scale("other", 1, true);
    let sim = RunningSim::start(store.clone(), "secret")
        .await
        .expect("sim");
    let api: Api<Service> = Api::all(client(&sim).await);
    let mut w = watcher::watcher(api, watcher::Config::default().disable_bookmarks()).boxed();
    assert_eq!(initial_names(&mut w).await, ["other", "web"]);
    // The server goes away and ends the watch; while it is away (and the watcher is not
    // polled, so it does not retry), 30 services are created: more than the 20 changes held.
    store.set_failing(Some(StatusError::new(Reason::InternalError, "restarting")));
    for i in 0..30 {
        cluster.add_service(&format!("s-{i:02}"), false);
    }
    store.set_failing(None);
    // Its resume from the old version gets the in-stream 410 (which kube-rs reports as an
    // error item), and it relists.
    let item = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("an item")
        .expect("stream");
    match item {
        Err(watcher::Error::WatchError(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected the 410, got {other:?}"),
    }
    assert!(
        matches!(next(&mut w).await, Event::Init),
        "kube-rs relisted after the 410"
    );
    let names = initial_names_after_init(&mut w).await;
    assert_eq!(names.len(), 32, "{names:?}");
    assert!(names.contains(&"web".to_owned()) && names.contains(&"s-29".to_owned()));
    assert_eq!(sim.api.counters.snapshot().lists, 2);
}

/// Names applied during an initial list whose `Init` was already received.
async fn initial_names_after_init<K: kube::Resource>(
    s: &mut (impl Stream<Item = watcher::Result<Event<K>>> + Unpin),
) -> Vec<String> {
    let mut names = Vec::new();
    loop {
        match next(s).await {
            Event::InitApply(k) => names.push(name(&k)),
            Event::InitDone => break,
            other => panic!(
                "unexpected {:?} during a relist",
                std::mem::discriminant(&other)
            ),
        }
    }
    names.sort();
    names
}

/// kube-rs's reflector, fed by a streaming list through a Floodgate link, mirrors the link.
#[tokio::test]
async fn a_reflector_mirrors_a_floodgate_link() {
    use floodgate::kubeapi::ApiStore;
    use kube::runtime::reflector;
    let store = Arc::new(SimStore::new(14, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for svc in ["web", "api"] {
        cluster.add_service(svc, true);
        cluster.scale(svc, 120, true);
    }
    let facade = floodgate_e2e::RunningFacade::start(vec![("east", "tok", store.view().clone())])
        .await
        .expect("facade");
    let kc = kube::config::Kubeconfig::from_yaml(&facade.kubeconfig("east")).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .expect("config");
    let api: Api<EndpointSlice> = Api::all(Client::try_from(cfg).expect("client"));
    let (reader, writer) = reflector::store();
    let mut stream = reflector::reflector(
        writer,
        watcher::watcher(api, watcher::Config::default().streaming_lists()),
    )
    .boxed();
    while !matches!(next(&mut stream).await, Event::InitDone) {}
    let mut names: Vec<String> = reader.state().iter().map(|s| name(s.as_ref())).collect();
    names.sort();
    assert_eq!(names, ["api-00000", "api-00001", "web-00000", "web-00001"]);
    cluster.scale("web", 50, true);
    // web-00001 goes away (50 pods fit one slice).
    loop {
        if let Event::Delete(s) = next(&mut stream).await {
            assert_eq!(name(&s), "web-00001");
            break;
        }
    }
    assert_eq!(reader.state().len(), 3);
    assert_eq!(
        facade.apis["east"].counters.snapshot().lists,
        0,
        "streamed, not listed"
    );
}

/// kube-sim's writes, through kube-rs: create, conflicts, merge patch, delete.
#[tokio::test]
async fn kube_sim_accepts_writes_with_api_server_semantics() {
    let store = Arc::new(SimStore::new(15, 1000));
    let sim = RunningSim::start(store, "secret").await.expect("sim");
    let api: Api<Service> = Api::namespaced(client(&sim).await, "prod");
    let mut svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "web", "labels": { "app": "web" } },
        "spec": { "ports": [{ "port": 80 }] },
    }))
    .expect("service");
    let created = api.create(&Default::default(), &svc).await.expect("create");
    assert!(created.metadata.uid.is_some() && created.metadata.resource_version.is_some());
    let again = api
        .create(&Default::default(), &svc)
        .await
        .expect_err("exists");
    assert!(
        matches!(again, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{again:?}"
    );

    svc.metadata.resource_version = created.metadata.resource_version.clone();
    svc.metadata.labels = Some([("app".to_owned(), "web2".to_owned())].into());
    let replaced = api
        .replace("web", &Default::default(), &svc)
        .await
        .expect("replace");
    let stale = api
        .replace("web", &Default::default(), &svc)
        .await
        .expect_err("stale resourceVersion");
    assert!(
        matches!(stale, kube::Error::Api(ref s) if s.code == 409 && s.reason == "Conflict"),
        "{stale:?}"
    );
    assert_ne!(
        replaced.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(
        replaced.metadata.uid, created.metadata.uid,
        "identity is kept"
    );

    let patch = serde_json::json!({ "metadata": { "labels": { "tier": "front" } } });
    let patched = api
        .patch("web", &Default::default(), &kube::api::Patch::Merge(&patch))
        .await
        .expect("patch");
    let labels = patched.metadata.labels.unwrap_or_default();
    assert_eq!(
        (labels["app"].as_str(), labels["tier"].as_str()),
        ("web2", "front")
    );

    api.delete("web", &Default::default())
        .await
        .expect("delete");
    let gone = api.get("web").await.expect_err("deleted");
    assert!(
        matches!(gone, kube::Error::Api(ref s) if s.code == 404),
        "{gone:?}"
    );
    assert_eq!(sim.api.counters.snapshot().writes, 4);
}
