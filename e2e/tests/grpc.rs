//! The gRPC API end to end: Floodgate in-process in front of kube-sim, a tonic client over TLS
//! receiving endpoint snapshots across churn, the cap and a quarantine; authentication; the
//! standard health service.

use std::time::Duration;

use floodgate::grpc::snapshot::TRUNCATED_ANNOTATION;
use floodgate::model::{Kind, NsName, ObjKey, Object};
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::gateway::Stack;
use floodgate_e2e::sim::SimStore;
use floodgate_proto::v1::mirror_client::MirrorClient;
use floodgate_proto::v1::{EndpointSnapshot, ListLinksRequest, WatchEndpointsRequest};
use std::sync::Arc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Streaming};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

async fn channel(stack: &Stack) -> Channel {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(stack.ca_pem()))
        .domain_name("localhost");
    Endpoint::from_shared(stack.grpc_url())
        .expect("url")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .expect("connect")
}

fn authed<T>(msg: T, token: Option<&str>) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("ascii"),
        );
    }
    r
}

async fn watch(stack: &Stack, service: &str) -> Streaming<EndpointSnapshot> {
    MirrorClient::new(channel(stack).await)
        .watch_endpoints(authed(
            WatchEndpointsRequest {
                link: "east".into(),
                service: service.into(),
            },
            Some(stack.token()),
        ))
        .await
        .expect("watch")
        .into_inner()
}

async fn next(s: &mut Streaming<EndpointSnapshot>) -> EndpointSnapshot {
    tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .expect("a snapshot within 10 s")
        .expect("no error")
        .expect("stream open")
}

/// Reads snapshots until one satisfies `done`, failing after 20 s; returns it and every
/// snapshot before it.
async fn until(
    s: &mut Streaming<EndpointSnapshot>,
    what: &str,
    done: impl Fn(&EndpointSnapshot) -> bool,
) -> (EndpointSnapshot, Vec<EndpointSnapshot>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut before = Vec::new();
    loop {
        assert!(tokio::time::Instant::now() < deadline, "never saw: {what}");
        let snap = next(s).await;
        if done(&snap) {
            return (snap, before);
        }
        before.push(snap);
    }
}

fn ready_count(s: &EndpointSnapshot) -> usize {
    s.endpoints.iter().filter(|e| e.ready).count()
}

async fn stack_with(services: &[(&str, usize)], max_endpoints: u32) -> (Cluster, Stack) {
    let store = Arc::new(SimStore::new(1, 10_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for (svc, pods) in services {
        cluster.add_service(svc, true);
        cluster.scale(svc, *pods, true);
    }
    let mut spec = Stack::default_spec();
    spec.caps.max_endpoints_per_service = max_endpoints;
    let stack = Stack::start(store, spec).await.expect("stack");
    (cluster, stack)
}

/// Pods becoming not ready and ready again, and a scale-up, reach a gRPC consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_follow_pods_becoming_ready_and_not() {
    let (mut cluster, stack) = stack_with(&[("web", 3), ("api", 2)], 1000).await;

    let mut all = watch(&stack, "").await;
    let (a, b) = (next(&mut all).await, next(&mut all).await);
    assert_eq!((a.service.as_str(), b.service.as_str()), ("api", "web"));
    assert!(a.exists && b.exists);
    assert_eq!((a.endpoints.len(), b.endpoints.len()), (2, 3));
    assert_eq!(b.link_phase, "Healthy");
    let e = &b.endpoints[0];
    assert!(e.ready && e.serving && !e.terminating);
    assert!(e.pod.starts_with("prod/web-"), "{}", e.pod);
    assert_eq!(b.ports.len(), 1);

    let mut web = watch(&stack, "prod/web").await;
    let first = next(&mut web).await;
    assert_eq!((first.service.as_str(), ready_count(&first)), ("web", 3));

    cluster.crash_loop_step("web", 1);
    let (down, _) = until(&mut web, "one web pod not ready", |s| ready_count(s) == 2).await;
    assert_eq!(down.endpoints.len(), 3);
    assert!(down.version > first.version);
    cluster.crash_loop_step("web", 2);
    until(&mut web, "no web pod ready", |s| ready_count(s) == 0).await;
    cluster.crash_loop_step("web", 3);
    until(&mut web, "web ready again", |s| ready_count(s) == 3).await;
    cluster.scale("web", 5, true);
    until(&mut web, "web scaled to 5", |s| ready_count(s) == 5).await;
    // The all-services stream saw the same end state.
    until(&mut all, "web at 5 on the all-services stream", |s| {
        s.service == "web" && ready_count(s) == 5
    })
    .await;
}

/// A service with more endpoints than `caps.maxEndpointsPerService`: the snapshot holds the cap,
/// and says how many were withheld.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_service_reports_what_it_withholds() {
    let (_cluster, stack) = stack_with(&[("big", 12)], 5).await;
    let mut s = watch(&stack, "prod/big").await;
    let snap = next(&mut s).await;
    assert_eq!(snap.endpoints.len(), 5, "capped at maxEndpointsPerService");
    // The truncation count comes from the published Service's annotation.
    let published = stack.floodgate.links[0].view.get(&ObjKey {
        kind: Kind::Service,
        id: NsName::new("prod", "big"),
    });
    let annotated = match published.as_ref().map(|p| &p.object) {
        Some(Object::Service(svc)) => svc
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(TRUNCATED_ANNOTATION)),
        _ => panic!("the service is published"),
    };
    if annotated {
        assert_eq!((snap.truncated, snap.total), (7, 12));
    } else {
        assert_eq!(snap.truncated, 0, "no annotation yet, nothing claimed");
    }
    let links = MirrorClient::new(channel(&stack).await)
        .list_links(authed(ListLinksRequest {}, Some(stack.token())))
        .await
        .expect("list")
        .into_inner()
        .links;
    assert_eq!(links.len(), 1);
    assert_eq!(links[0].name, "east");
    assert_eq!(links[0].endpoints_truncated, 7);
    assert_eq!(links[0].endpoints_published, 5);
    assert!(links[0].synced);
}

/// A quarantine is announced on every stream; while it lasts the endpoints are the last good
/// view whatever the remote does; after the release the stream converges to the remote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_keeps_the_last_good_view_on_the_stream() {
    let (mut cluster, stack) = stack_with(&[("web", 3)], 1000).await;
    let mut s = watch(&stack, "prod/web").await;
    let good = next(&mut s).await;
    assert_eq!(ready_count(&good), 3);

    let link = &stack.floodgate.links[0];
    link.quarantine("grpc test".into())
        .await
        .expect("quarantined");
    let (q, _) = until(&mut s, "the Quarantined phase", |s| {
        s.link_phase == "Quarantined"
    })
    .await;
    assert_eq!(q.endpoints, good.endpoints);

    cluster.crash_loop_step("web", 3);
    link.release("the test").await.expect("released");
    let (after, during) = until(&mut s, "all web pods not ready after release", |s| {
        ready_count(s) == 0
    })
    .await;
    assert_ne!(after.link_phase, "Quarantined");
    for snap in during.iter().filter(|s| s.link_phase == "Quarantined") {
        assert_eq!(snap.endpoints, good.endpoints, "frozen while quarantined");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_the_links_token_are_refused() {
    let (_cluster, stack) = stack_with(&[("web", 1)], 1000).await;
    let mut client = MirrorClient::new(channel(&stack).await);
    let req = |link: &str, service: &str, token: Option<&str>| {
        authed(
            WatchEndpointsRequest {
                link: link.into(),
                service: service.into(),
            },
            token,
        )
    };
    let code = |r: Result<_, tonic::Status>| r.err().map(|s| s.code());
    assert_eq!(
        code(client.watch_endpoints(req("east", "", None)).await),
        Some(Code::Unauthenticated)
    );
    assert_eq!(
        code(client.watch_endpoints(req("east", "", Some("wrong"))).await),
        Some(Code::Unauthenticated)
    );
    let token = stack.token().to_owned();
    assert_eq!(
        code(client.watch_endpoints(req("west", "", Some(&token))).await),
        Some(Code::NotFound)
    );
    assert_eq!(
        code(
            client
                .watch_endpoints(req("east", "web", Some(&token)))
                .await
        ),
        Some(Code::InvalidArgument)
    );
    let listed = client.list_links(authed(ListLinksRequest {}, None)).await;
    assert_eq!(listed.err().map(|s| s.code()), Some(Code::Unauthenticated));
}

/// `grpc.health.v1`: SERVING once the link has synced (the stack waits for that), NOT_SERVING
/// as soon as Floodgate shuts down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_serving_when_synced_and_not_on_shutdown() {
    let (_cluster, stack) = stack_with(&[("web", 1)], 1000).await;
    let mut health = HealthClient::new(channel(&stack).await);
    for service in ["", "floodgate.v1.Mirror"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("check")
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }
    let mut updates = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = updates.message().await.expect("ok").expect("update");
    assert_eq!(first.status(), ServingStatus::Serving);
    let stop = tokio::spawn(stack.floodgate.stop());
    let last = tokio::time::timeout(Duration::from_secs(10), updates.message())
        .await
        .expect("an update before the grace period ends");
    match last {
        Ok(Some(u)) => assert_eq!(u.status(), ServingStatus::NotServing),
        other => panic!("expected NOT_SERVING, got {other:?}"),
    }
    stop.await.expect("stopped");
}
