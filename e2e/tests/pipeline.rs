//! The whole pipeline, in-process: kube-sim as the remote, Floodgate in front of it, consumers
//! through the link. Reduced scale for `make test`.

use std::sync::Arc;
use std::time::Duration;

use floodgate::kubeapi::review::client_go_body;
use floodgate_e2e::drivers::{Cluster, EXPORTED};
use floodgate_e2e::gateway::{Stack, raw_get};
use floodgate_e2e::sim::SimStore;
use floodgate_link_crd::{KubeDuration, Phase};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::Value;

async fn send(
    c: &Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, Value) {
    let mut req = http::Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = c
        .send(
            req.body(body)
                .expect("request")
                .map(kube::client::Body::from),
        )
        .await
        .expect("response");
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Opens a watch and reads frames until the initial-events-end bookmark: the ADDED count. The
/// frames are decoded by the response's Content-Type, as client-go decodes them: newline-delimited
/// JSON, or length-delimited protobuf `WatchEvent`s.
async fn streaming_list(c: &Client, path: &str, accept: &str) -> usize {
    let q = "allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&timeout=9m47s&timeoutSeconds=587&watch=true";
    let resp = raw_get(c, &format!("{path}?{q}"), accept)
        .await
        .expect("watch");
    assert_eq!(resp.status(), 200, "{path}");
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let protobuf = content_type == floodgate::protobuf::WATCH_MEDIA_TYPE;
    assert!(
        protobuf || content_type == "application/json",
        "{path}: {content_type}"
    );
    assert_eq!(
        protobuf,
        accept.starts_with(floodgate::protobuf::MEDIA_TYPE) && !path.contains("/servers"),
        "{path}: protobuf exactly when asked first for a kind that has it ({content_type})"
    );
    let mut body = resp.into_body().into_data_stream();
    let (mut buf, mut added) = (Vec::new(), 0);
    loop {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .expect("frames")
            .expect("open")
            .expect("chunk");
        buf.extend_from_slice(&chunk);
        while let Some((kind, end)) = next_event(&mut buf, protobuf) {
            match kind.as_str() {
                "ADDED" => added += 1,
                "BOOKMARK" if end => return added,
                other => panic!("{path}: unexpected {other:?}"),
            }
        }
    }
}

/// Takes the next whole event off `buf`: its type, and whether it ends the initial events.
fn next_event(buf: &mut Vec<u8>, protobuf: bool) -> Option<(String, bool)> {
    if !protobuf {
        let i = buf.iter().position(|b| *b == b'\n')?;
        let frame: Value = serde_json::from_slice(&buf[..i]).expect("frame");
        buf.drain(..=i);
        let end = frame["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true";
        return Some((frame["type"].as_str().unwrap_or_default().to_owned(), end));
    }
    use prost::Message as _;
    let (len, rest) = buf.split_first_chunk::<4>()?;
    let len = u32::from_be_bytes(*len) as usize;
    if rest.len() < len {
        return None;
    }
    let frame: Vec<u8> = buf.drain(..4 + len).collect();
    let ev = floodgate::protobuf::read_watch(&frame)
        .expect("a protobuf frame")
        .pop()
        .expect("one event");
    let envelope = ev.object.and_then(|o| o.raw).expect("an object");
    let raw = floodgate::protobuf::open(&envelope)
        .expect("an envelope")
        .raw
        .unwrap_or_default();
    // Every kind's metadata is its field 1, as in PartialObjectMetadata.
    let meta =
        k8s_pb::apimachinery::pkg::apis::meta::v1::PartialObjectMetadata::decode(raw.as_slice())
            .expect("an object")
            .metadata
            .unwrap_or_default();
    let end = meta
        .annotations
        .get("k8s.io/initial-events-end")
        .is_some_and(|v| v == "true");
    Some((ev.r#type.unwrap_or_default(), end))
}

/// The request sequence of Linkerd's destination (remote discovery) and service mirror, as
/// FACADE.md lists it, through a link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_linkerd_consumer_profile_is_answered() {
    let store = Arc::new(SimStore::new(41, 10_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for svc in ["web", "api"] {
        cluster.add_service(svc, true);
        cluster.scale(svc, 3, true);
    }
    cluster.add_service("hidden", false);
    cluster.scale("hidden", 5, true);
    let stack = Stack::start(store, Stack::default_spec())
        .await
        .expect("stack");
    let c = stack.consumer().await.expect("client");
    let proto = [
        ("content-type", "application/vnd.kubernetes.protobuf"),
        ("accept", "application/vnd.kubernetes.protobuf, */*"),
    ];
    let review = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

    // 1. Destination: may it list pods? (protobuf body)
    let (code, v) = send(
        &c,
        "POST",
        review,
        &proto,
        client_go_body("list", "", "pods"),
    )
    .await;
    assert_eq!(
        (code, v["status"]["allowed"].as_bool()),
        (201, Some(true)),
        "{v}"
    );
    let (code, v) = send(
        &c,
        "GET",
        "/apis/policy.linkerd.io/v1beta3",
        &[],
        Vec::new(),
    )
    .await;
    assert_eq!(code, 200);
    assert!(
        v["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .any(|r| r["kind"] == "Server")
    );
    let (code, v) = send(
        &c,
        "POST",
        review,
        &proto,
        client_go_body("list", "policy.linkerd.io", "servers"),
    )
    .await;
    assert_eq!((code, v["status"]["allowed"].as_bool()), (201, Some(true)));

    // 2. Its informers: streaming lists, in protobuf as client-go's typed clients ask for it
    //    (JSON for the Server custom resource); replicasets through the metadata client.
    let json = "application/json";
    let typed = "application/vnd.kubernetes.protobuf, application/json";
    assert_eq!(
        streaming_list(&c, "/apis/discovery.k8s.io/v1/endpointslices", typed).await,
        2,
        "only the exported services' slices"
    );
    assert_eq!(
        streaming_list(&c, "/api/v1/pods", typed).await,
        6,
        "only pods behind exported services"
    );
    assert_eq!(streaming_list(&c, "/api/v1/services", typed).await, 2);
    assert_eq!(
        streaming_list(&c, "/api/v1/services", json).await,
        2,
        "the same in JSON"
    );
    assert_eq!(
        streaming_list(&c, "/apis/policy.linkerd.io/v1beta3/servers", typed).await,
        0
    );
    let meta_list =
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let meta_protobuf = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    assert_eq!(
        streaming_list(&c, "/apis/apps/v1/replicasets", meta_protobuf).await,
        2,
        "the pods' owners"
    );
    // The fallback when a streaming list fails: LIST ?limit=500&resourceVersion=0, then WATCH.
    let (code, v) = send(
        &c,
        "GET",
        "/apis/apps/v1/replicasets?limit=500&resourceVersion=0",
        &[("accept", meta_list)],
        Vec::new(),
    )
    .await;
    assert_eq!(
        (code, v["kind"].as_str()),
        (200, Some("PartialObjectMetadataList"))
    );
    assert_eq!(v["items"].as_array().map(Vec::len), Some(2));

    // 3. Service mirror: version, its informers, an Event.
    let (code, v) = send(&c, "GET", "/version", &[], Vec::new()).await;
    assert_eq!(
        (code, v["gitVersion"].as_str()),
        (200, Some("v1.33.0-kube-sim")),
        "the remote's version"
    );
    assert_eq!(streaming_list(&c, "/api/v1/endpoints", typed).await, 2);
    let event = serde_json::json!({"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "linkerd-service-mirror-", "namespace": "prod"}, "reason": "Mirrored", "message": "x"});
    let (code, v) = send(
        &c,
        "POST",
        "/api/v1/namespaces/prod/events",
        &[("content-type", json)],
        event.to_string().into_bytes(),
    )
    .await;
    assert_eq!((code, v["kind"].as_str()), (201, Some("Event")));
    assert_eq!(
        stack.floodgate.apis["east"]
            .counters
            .snapshot()
            .events_discarded,
        1
    );
    assert_eq!(
        stack.sim.api.counters.snapshot().writes,
        0,
        "Floodgate never writes upstream"
    );
}

/// S1, hidden: 10,000 crash-looping pods behind a service the link does not select reach no
/// consumer and are not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_a_flood_behind_an_unselected_service_reaches_nobody() {
    let store = Arc::new(SimStore::new(42, 10_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 3, true);
    cluster.add_service("injector", false);
    let stack = Stack::start(store, Stack::default_spec())
        .await
        .expect("stack");
    let through = stack.consumer().await.expect("client");
    let mut consumer = watcher::watcher(
        Api::<EndpointSlice>::all(through),
        watcher::Config::default(),
    )
    .boxed();
    loop {
        if let Some(Ok(watcher::Event::InitDone)) = consumer.next().await {
            break;
        }
    }
    let before = stack.settled().await.expect("settled").counters;
    cluster.scale("injector", 10_000, false);
    for _ in 0..20 {
        cluster.crash_loop_step("injector", 500);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Wait until the link has seen the flood (each pod at least once) before asserting that
    // nothing of it went out.
    stack
        .wait_link("the flood seen", Duration::from_secs(20), |s| {
            s.counters.irrelevant_events + s.upstream.pods_skipped >= 10_000
        })
        .await
        .expect("the link saw the flood");
    let got = tokio::time::timeout(Duration::from_millis(300), consumer.next()).await;
    assert!(got.is_err(), "the consumer received nothing: {got:?}");
    let link = stack.link();
    assert_eq!(
        link.counters.downstream_updates, before.downstream_updates,
        "nothing was published"
    );
    // Each pod event is dropped: undecoded at the watcher (no published endpoint names the
    // pod), or by the engine.
    let dropped = link.counters.irrelevant_events + link.upstream.pods_skipped;
    assert!(
        dropped >= 10_000,
        "the pods were seen and dropped: {dropped}; {:?}",
        link.counters
    );
    assert!(
        link.engine.objects_held < 100,
        "no pod of the flood is held: {}",
        link.engine.objects_held
    );
    assert_eq!(link.phase, Phase::Healthy, "{link:?}");
}

/// The addresses a slice serves.
fn addresses(s: &EndpointSlice) -> Vec<String> {
    s.endpoints
        .iter()
        .flatten()
        .flat_map(|e| e.addresses.iter().cloned())
        .collect()
}

/// The injector's slices as consumers are served them: name and addresses, sorted.
fn injector_served(stack: &Stack) -> Vec<(String, Vec<String>)> {
    let view = &stack.floodgate.links[0].view;
    let mut out: Vec<(String, Vec<String>)> = view
        .list(floodgate::model::Kind::EndpointSlice)
        .items
        .iter()
        .filter_map(|s| match &s.object {
            floodgate::model::Object::EndpointSlice(e) => {
                let name = e.metadata().name.clone()?;
                name.starts_with("injector")
                    .then(|| (name, addresses(&e.to_slice())))
            }
            _ => None,
        })
        .collect();
    out.sort();
    out
}

/// S1, exported: the flooding service is contained (capped, frozen at what it published),
/// the link stays out of quarantine, the budget holds, and a calm service's rollout keeps
/// arriving within 2 s, before and after the containment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_an_exported_flood_is_contained_while_calm_services_flow() {
    let store = Arc::new(SimStore::new(43, 10_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 3, true);
    cluster.add_service("injector", true);
    cluster.scale("injector", 3, true);
    let mut spec = Stack::default_spec();
    spec.caps.max_endpoints_per_service = 100;
    spec.quarantine.when.service_events_per_second = 200;
    spec.quarantine.when.sustained_for = KubeDuration::from_secs(2);
    let (rate, burst) = (
        spec.rate_limit.per_link.updates_per_second,
        spec.rate_limit.per_link.burst,
    );
    let stack = Stack::start(store, spec).await.expect("stack");
    let through = stack.consumer().await.expect("client");
    let slices: Api<EndpointSlice> = Api::namespaced(through, "prod");
    stack.settled().await.expect("settled");
    let started = tokio::time::Instant::now();
    let updates_before = stack.link().counters.downstream_updates;

    // The rollout grows the injector to 10,000 pods that crash-loop, 1,000 flips per 100 ms.
    cluster.scale("injector", 10_000, false);
    let mut calm = Vec::new();
    let mut contained_at = None;
    let mut frozen = None;
    let mut step = 0u32;
    while step < 80 || calm.len() < 3 {
        assert!(step < 200, "three calm changes were seen: {calm:?}");
        cluster.crash_loop_step("injector", 1000);
        // A calm change every 2 s: web's pod 0 gets a new address; wait for it through
        // Floodgate while the flood goes on.
        if step % 20 == 5 {
            let before = addresses(&slices.get("web-00000").await.expect("web slice"));
            cluster.roll_pod("web", 0);
            let rolled = tokio::time::Instant::now();
            loop {
                cluster.crash_loop_step("injector", 100);
                let now = addresses(&slices.get("web-00000").await.expect("web slice"));
                if now != before && now.len() == 3 {
                    calm.push(rolled.elapsed());
                    break;
                }
                assert!(
                    rolled.elapsed() < Duration::from_secs(10),
                    "the calm change arrived: {:?}",
                    stack.link()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let link = stack.link();
        assert_ne!(link.phase, Phase::Quarantined, "{link:?}");
        if contained_at.is_none() && !link.containment.contained.is_empty() {
            contained_at = Some(started.elapsed());
            frozen = Some(injector_served(&stack));
        }
        step += 1;
    }
    let link = stack.link();
    let contained_after = contained_at.expect("the injector was contained");
    let names: Vec<String> = link
        .containment
        .contained
        .iter()
        .map(|c| c.service.to_string())
        .collect();
    assert_eq!(names, ["prod/injector"], "only the flooding service");
    assert!(
        calm.iter().all(|d| *d <= Duration::from_secs(2)),
        "calm changes arrive within 2 s: {calm:?}"
    );
    let served = injector_served(&stack);
    assert_eq!(
        Some(&served),
        frozen.as_ref(),
        "a contained service does not change downstream"
    );
    let injector: usize = served.iter().map(|(_, a)| a.len()).sum();
    assert!(
        injector <= 100,
        "the cap holds: {injector} endpoints served"
    );
    let updates = link.counters.downstream_updates - updates_before;
    let bound =
        u64::from(burst) + (u64::from(rate) as f64 * started.elapsed().as_secs_f64()).ceil() as u64;
    assert!(
        updates <= bound,
        "{updates} publications in {:?} exceed the budget ({bound})",
        started.elapsed()
    );
    assert!(link.synced, "{link:?}");
    eprintln!(
        "S1 exported: injector contained after {contained_after:?} ({}); calm changes visible after {calm:?}; {updates} publications in {:?}; {injector} injector endpoints served",
        link.containment.contained[0].reason,
        started.elapsed()
    );
}

/// Cold start during a flood: Floodgate starts while 10,000 pods behind an exported service
/// already crash-loop. It is ready within 10 s, every calm service is served, the flooding one
/// is served capped and then contained, and a consumer's streaming-list informer syncs within
/// 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floodgate_started_during_a_flood_syncs_and_contains_the_flooder() {
    let store = Arc::new(SimStore::new(45, 10_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    let calm = ["web", "api", "billing"];
    for svc in calm {
        cluster.add_service(svc, true);
        cluster.scale(svc, 3, true);
    }
    cluster.add_service("injector", true);
    cluster.scale("injector", 10_000, false);
    // The flood runs before Floodgate starts and all along: 1,000 flips per 100 ms.
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    let (steps_tx, mut steps) = tokio::sync::watch::channel(0u64);
    let flood = tokio::spawn(async move {
        let mut n = 0;
        loop {
            cluster.crash_loop_step("injector", 1000);
            n += 1;
            steps_tx.send_replace(n);
            tokio::select! {
                _ = stop.changed() => return cluster,
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    });
    steps.wait_for(|n| *n >= 10).await.expect("the flood runs");

    let mut spec = Stack::default_spec();
    spec.caps.max_endpoints_per_service = 100;
    spec.quarantine.when.sustained_for = KubeDuration::from_secs(2);
    let started = tokio::time::Instant::now();
    let stack = Stack::start(store, spec).await.expect("stack");
    let ready = started.elapsed();
    assert!(ready <= Duration::from_secs(10), "ready after {ready:?}");

    let through = stack.consumer().await.expect("client");
    let informer_started = tokio::time::Instant::now();
    let mut informer = watcher::watcher(
        Api::<EndpointSlice>::all(through.clone()),
        watcher::Config::default().streaming_lists(),
    )
    .boxed();
    let synced = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match informer.next().await {
                Some(Ok(watcher::Event::InitDone)) => return,
                Some(_) => {}
                None => panic!("the informer's stream ended"),
            }
        }
    })
    .await;
    let informer_synced = informer_started.elapsed();
    assert!(
        synced.is_ok(),
        "the streaming-list informer synced within 5 s"
    );

    let slices: Api<EndpointSlice> = Api::namespaced(through, "prod");
    for svc in calm {
        let s = slices
            .get(&format!("{svc}-00000"))
            .await
            .expect("calm slice");
        assert_eq!(addresses(&s).len(), 3, "{svc} is served whole");
    }
    let link = stack
        .wait_link("the injector contained", Duration::from_secs(20), |s| {
            !s.containment.contained.is_empty()
        })
        .await
        .expect("contained");
    let names: Vec<String> = link
        .containment
        .contained
        .iter()
        .map(|c| c.service.to_string())
        .collect();
    assert_eq!(names, ["prod/injector"]);
    assert_ne!(link.phase, Phase::Quarantined, "{link:?}");
    let injector: usize = injector_served(&stack).iter().map(|(_, a)| a.len()).sum();
    assert!(
        (1..=100).contains(&injector),
        "the flooder is served capped: {injector} endpoints"
    );
    stop_tx.send_replace(true);
    let _cluster = flood.await.expect("the flood task");
    eprintln!(
        "cold start during a flood: ready after {ready:?}; streaming-list informer synced in {informer_synced:?}; injector contained ({}), {injector} endpoints served",
        link.containment.contained[0].reason
    );
}

/// S2: 50 consumers restarting 10 times each cost the remote nothing beyond the link's own
/// LIST+WATCH per resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_a_restart_herd_costs_the_remote_nothing() {
    let store = Arc::new(SimStore::new(44, 10_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for svc in ["web", "api", "billing"] {
        cluster.add_service(svc, true);
        cluster.scale(svc, 20, true);
    }
    let stack = Stack::start(store, Stack::default_spec())
        .await
        .expect("stack");
    let upstream_before = stack.sim.api.counters.snapshot();
    let mut herd = Vec::new();
    for i in 0..50 {
        let client = stack.consumer().await.expect("client");
        herd.push(tokio::spawn(async move {
            for r in 0..10 {
                let mut cfg = watcher::Config::default();
                if (i + r) % 2 == 0 {
                    cfg = cfg.streaming_lists();
                }
                let mut w =
                    watcher::watcher(Api::<EndpointSlice>::all(client.clone()), cfg).boxed();
                loop {
                    match w.next().await {
                        Some(Ok(watcher::Event::InitDone)) => break,
                        Some(Ok(_)) => {}
                        other => panic!("consumer {i} restart {r}: {other:?}"),
                    }
                }
            }
        }));
    }
    for h in herd {
        h.await.expect("consumer");
    }
    let upstream_after = stack.sim.api.counters.snapshot();
    assert_eq!(
        upstream_after.lists, upstream_before.lists,
        "no LIST reached the remote"
    );
    assert_eq!(
        upstream_after.watches, upstream_before.watches,
        "no WATCH reached the remote"
    );
    let served = stack.floodgate.apis["east"].counters.snapshot();
    assert!(
        served.lists + served.watches >= 500,
        "the herd was served by Floodgate: {served:?}"
    );
    let _ = EXPORTED;
}
