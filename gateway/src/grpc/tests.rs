//! The service called directly (no network): authentication and authorization, and streams
//! following a view through changes, phase changes, lag and a slow consumer.

use std::sync::Arc;
use std::time::Duration;

use floodgate_link_crd::Phase;
use floodgate_proto::v1::mirror_server::Mirror;
use floodgate_proto::v1::{EndpointSnapshot, ListLinksRequest, WatchEndpointsRequest};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tonic::{Code, Request};

use super::snapshot::tests::{mk_endpoint, mk_service, mk_slice};
use super::*;
use crate::model::{NsName, Object};
use crate::view::{Change, FANOUT_BACKLOG};

struct Fixture {
    service: MirrorService,
    east: View,
    east_state: watch::Sender<LinkState>,
    _shutdown: watch::Sender<bool>,
}

fn synced() -> LinkState {
    LinkState {
        synced: true,
        ..Default::default()
    }
}

/// Two links, `east` (token `t-east`) and `west` (token `t-west`), both synced.
fn fixture() -> Fixture {
    let (east_state, east_rx) = watch::channel(synced());
    let (_west_state, west_rx) = watch::channel(synced());
    let east = View::new(1, 100);
    let (shutdown_tx, shutdown) = watch::channel(false);
    let service = MirrorService::new(
        [
            MirrorLink::new("east", "t-east", east.clone(), east_rx),
            MirrorLink::new("west", "t-west", View::new(2, 100), west_rx),
        ],
        shutdown,
    );
    Fixture {
        service,
        east,
        east_state,
        _shutdown: shutdown_tx,
    }
}

fn with_token<T>(msg: T, token: Option<&str>) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("ascii"),
        );
    }
    r
}

fn watch_req(link: &str, service: &str, token: Option<&str>) -> Request<WatchEndpointsRequest> {
    with_token(
        WatchEndpointsRequest {
            link: link.into(),
            service: service.into(),
        },
        token,
    )
}

fn svc(name: &str, annotations: &[(&str, &str)]) -> Change {
    Change::Upsert(Object::Service(Arc::new(mk_service(
        "prod",
        name,
        annotations,
    ))))
}

fn slice(name: &str, service: &str, ready: &[bool]) -> Change {
    let eps = ready
        .iter()
        .enumerate()
        .map(|(i, r)| mk_endpoint(&format!("10.0.0.{i}"), &format!("{service}-{i}"), *r))
        .collect();
    Change::Upsert(Object::EndpointSlice(
        Arc::new(mk_slice("prod", name, service, eps)).into(),
    ))
}

async fn next(s: &mut <MirrorService as Mirror>::WatchEndpointsStream) -> EndpointSnapshot {
    tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .expect("a snapshot within 5 s")
        .expect("stream open")
        .expect("not an error")
}

async fn open(f: &Fixture, service: &str) -> <MirrorService as Mirror>::WatchEndpointsStream {
    f.service
        .watch_endpoints(watch_req("east", service, Some("t-east")))
        .await
        .expect("authorized")
        .into_inner()
}

#[tokio::test]
async fn tokens_open_exactly_their_own_link() {
    let f = fixture();
    let code = |r: Result<_, tonic::Status>| r.err().map(|s| s.code());
    let s = &f.service;
    assert_eq!(
        code(s.watch_endpoints(watch_req("east", "", None)).await),
        Some(Code::Unauthenticated)
    );
    assert_eq!(
        code(s.watch_endpoints(watch_req("east", "", Some("nope"))).await),
        Some(Code::Unauthenticated)
    );
    assert_eq!(
        code(
            s.watch_endpoints(watch_req("east", "", Some("t-west")))
                .await
        ),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(
            s.watch_endpoints(watch_req("north", "", Some("t-east")))
                .await
        ),
        Some(Code::NotFound)
    );
    assert_eq!(
        code(s.watch_endpoints(watch_req("north", "", None)).await),
        Some(Code::Unauthenticated),
        "an anonymous caller learns nothing about which links exist"
    );
    for bad in ["web", "/web", "prod/", "a/b/c"] {
        assert_eq!(
            code(
                s.watch_endpoints(watch_req("east", bad, Some("t-east")))
                    .await
            ),
            Some(Code::InvalidArgument),
            "{bad}"
        );
    }
    assert!(
        s.watch_endpoints(watch_req("east", "prod/web", Some("t-east")))
            .await
            .is_ok()
    );
}

#[test]
fn debug_output_never_shows_a_token() {
    let f = fixture();
    let shown = format!("{:?}", f.service);
    assert!(
        shown.contains("east") && !shown.contains("t-east"),
        "{shown}"
    );
}

#[tokio::test]
async fn list_links_shows_only_the_tokens_own_link() {
    let f = fixture();
    f.east_state.send_modify(|s| {
        s.phase = Phase::Quarantined;
        s.quarantine.reason = Some("EventRate".into());
        s.counters.services = 3;
    });
    let r = f
        .service
        .list_links(with_token(ListLinksRequest {}, Some("t-east")))
        .await
        .expect("listed")
        .into_inner();
    assert_eq!(r.links.len(), 1);
    let l = &r.links[0];
    assert_eq!((l.name.as_str(), l.phase.as_str()), ("east", "Quarantined"));
    assert_eq!(
        (l.reason.as_str(), l.services, l.synced),
        ("EventRate", 3, true)
    );
    let denied = f
        .service
        .list_links(with_token(ListLinksRequest {}, None))
        .await;
    assert_eq!(denied.err().map(|s| s.code()), Some(Code::Unauthenticated));
}

/// A consumer of every service gets one snapshot per service, then one per change, and
/// `exists = false` when a service goes away.
#[tokio::test]
async fn a_stream_follows_changes_and_deletions() {
    let f = fixture();
    f.east.apply(
        [
            svc("db", &[]),
            svc("web", &[]),
            slice("web-a", "web", &[true, true]),
        ],
        Instant::now(),
    );
    let mut s = open(&f, "").await;
    let (a, b) = (next(&mut s).await, next(&mut s).await);
    assert_eq!((a.service.as_str(), b.service.as_str()), ("db", "web"));
    assert_eq!(b.endpoints.len(), 2);
    assert!(b.endpoints.iter().all(|e| e.ready));

    f.east
        .apply([slice("web-a", "web", &[true, false])], Instant::now());
    let c = next(&mut s).await;
    assert_eq!(c.service, "web");
    assert!(c.version > b.version);
    assert_eq!(
        c.endpoints.iter().map(|e| e.ready).collect::<Vec<_>>(),
        [true, false]
    );

    f.east.apply(
        [Change::Delete(crate::model::ObjKey {
            kind: crate::model::Kind::Service,
            id: NsName::new("prod", "db"),
        })],
        Instant::now(),
    );
    let d = next(&mut s).await;
    assert_eq!((d.service.as_str(), d.exists), ("db", false));
}

/// Waiting for the first sync: nothing is sent before it, the current state right after.
#[tokio::test]
async fn a_stream_starts_once_the_link_has_synced() {
    let f = fixture();
    f.east_state.send_modify(|s| s.synced = false);
    f.east.apply([svc("web", &[])], Instant::now());
    let mut s = open(&f, "prod/web").await;
    assert!(
        tokio::time::timeout(Duration::from_millis(50), s.next())
            .await
            .is_err(),
        "no snapshot before the first sync"
    );
    f.east_state.send_modify(|s| s.synced = true);
    let a = next(&mut s).await;
    assert!(a.exists);
}

/// Quarantine: every watched service is resent with the new phase, same endpoints.
#[tokio::test]
async fn a_notable_phase_change_resends_every_snapshot() {
    let f = fixture();
    f.east.apply(
        [svc("web", &[]), slice("web-a", "web", &[true])],
        Instant::now(),
    );
    let mut s = open(&f, "prod/web").await;
    let before = next(&mut s).await;
    assert_eq!(before.link_phase, "Healthy");
    f.east_state.send_modify(|s| s.phase = Phase::Quarantined);
    let after = next(&mut s).await;
    assert_eq!(after.link_phase, "Quarantined");
    assert_eq!(after.endpoints, before.endpoints);
    assert!(stream::resend_on(Phase::Healthy, Phase::Degraded));
    assert!(!stream::resend_on(Phase::Healthy, Phase::Throttled));
}

/// A containment resends the service's snapshot saying `contained`; its release resends it
/// again without.
#[tokio::test]
async fn a_containment_resends_the_snapshot_marked_contained() {
    let f = fixture();
    f.east.apply(
        [svc("web", &[]), slice("web-a", "web", &[true])],
        Instant::now(),
    );
    let mut s = open(&f, "prod/web").await;
    let before = next(&mut s).await;
    assert!(!before.contained);
    let contained = crate::link::ContainedService {
        service: NsName::new("prod", "web"),
        state: crate::churn::quarantine::StateName::Contained,
        reason: crate::churn::flood::Reason::ServiceEventRate,
        message: "web floods".into(),
        figures: Default::default(),
        since: tokio::time::Instant::now(),
        next_check: None,
    };
    f.east_state
        .send_modify(|s| s.containment.contained = vec![contained]);
    let after = next(&mut s).await;
    assert!(after.contained, "{after:?}");
    assert_eq!(after.endpoints, before.endpoints);
    assert_eq!(after.link_phase, "Healthy");
    f.east_state
        .send_modify(|s| s.containment.contained.clear());
    assert!(!next(&mut s).await.contained);
}

/// A consumer that reads nothing while one service changes many times gets a bounded number of
/// snapshots, the last of them the final state.
#[tokio::test]
async fn a_slow_consumer_gets_the_latest_state_not_a_backlog() {
    let f = fixture();
    f.east.apply([svc("web", &[])], Instant::now());
    let mut s = open(&f, "prod/web").await;
    let _first = next(&mut s).await;
    let changes = 200;
    for i in 0..changes {
        f.east.apply(
            [slice("web-a", "web", &vec![true; i % 7 + 1])],
            Instant::now(),
        );
        tokio::task::yield_now().await;
    }
    f.east
        .apply([slice("web-a", "web", &[false; 9])], Instant::now());
    let mut got = 0;
    loop {
        let snap = next(&mut s).await;
        got += 1;
        if snap.endpoints.len() == 9 && snap.endpoints.iter().all(|e| !e.ready) {
            break;
        }
    }
    assert!(
        got <= stream::STREAM_BUFFER + 2,
        "{got} snapshots for {changes} changes: the stream queued instead of coalescing"
    );
}

/// A stream that falls further behind the view's feed than its backlog resyncs and still ends
/// at the final state (current-thread runtime: the stream's task cannot run meanwhile).
#[tokio::test]
async fn a_lagged_stream_resends_full_snapshots() {
    let f = fixture();
    f.east
        .apply([svc("web", &[]), svc("db", &[])], Instant::now());
    let mut s = open(&f, "").await;
    let _ = (next(&mut s).await, next(&mut s).await);
    for i in 0..FANOUT_BACKLOG + 10 {
        f.east.apply(
            [slice("web-a", "web", &vec![true; i % 3 + 1])],
            Instant::now(),
        );
    }
    f.east
        .apply([slice("web-a", "web", &[false; 5])], Instant::now());
    let mut seen_db = false;
    loop {
        let snap = next(&mut s).await;
        seen_db |= snap.service == "db";
        if snap.service == "web" && snap.endpoints.len() == 5 {
            break;
        }
    }
    assert!(
        seen_db,
        "a resync resends every service, not only the changed one"
    );
}

#[tokio::test]
async fn streams_end_on_shutdown() {
    let mut f = fixture();
    let (tx, rx) = watch::channel(false);
    f.service.shutdown = rx;
    f._shutdown = tx;
    f.east.apply([svc("web", &[])], Instant::now());
    let mut s = open(&f, "").await;
    let _ = next(&mut s).await;
    f._shutdown.send_replace(true);
    let end = tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .expect("ends within 5 s");
    assert!(end.is_none(), "the stream ended");
}

#[test]
fn the_grpc_flag_defaults_to_8090_and_insecure_http_keeps_it_on_loopback() {
    use clap::Parser as _;

    use crate::cli::{Cli, Command};
    let dir = std::env::temp_dir().join(format!("floodgate-grpc-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("links.yaml");
    std::fs::write(
        &file,
        "links:\n- name: east\n  spec:\n    remote:\n      kubeconfigPath: /nonexistent\n",
    )
    .expect("write");
    let run = |extra: &[&str]| {
        let mut argv = vec![
            "floodgate",
            "run",
            "--config",
            file.to_str().expect("utf-8"),
        ];
        argv.extend(extra);
        match Cli::try_parse_from(argv).expect("parses").command {
            Command::Run(args) => args,
            other => panic!("not run: {other:?}"),
        }
    };
    let args = run(&[]);
    assert_eq!(args.serve.grpc_listen.to_string(), "0.0.0.0:8090");
    let cfg = args.to_config().expect("valid");
    assert_eq!(cfg.serving.grpc_listen.to_string(), "0.0.0.0:8090");
    let err = run(&["--listen", "127.0.0.1:6443", "--insecure-http"])
        .to_config()
        .expect_err("plain gRPC on every interface is refused");
    assert!(err.to_string().contains("--grpc-listen"), "{err}");
    let ok = run(&[
        "--listen",
        "127.0.0.1:6443",
        "--grpc-listen",
        "127.0.0.1:8090",
        "--insecure-http",
    ]);
    assert!(ok.to_config().is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}
