//! Graceful shutdown of the real `floodgate run` binary: on SIGTERM readiness drops first, each
//! open watch gets a last BOOKMARK and ends, and the process exits 0 within its deadline; a
//! second SIGTERM during a drain that cannot finish (a consumer that never reads) exits at once.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use floodgate::kubeapi::ApiStore;
use floodgate::model::Object;
use floodgate_e2e::RunningSim;
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::modes::Mode;
use floodgate_e2e::process::{Floodgate, Launch};
use floodgate_e2e::sim::SimStore;
use floodgate_e2e::until;
use floodgate_link_crd::{LinkSpec, RemoteSpec};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

/// `floodgate` in `mode` in `dir`, serving `sim` as link `east`, with `extra` flags.
async fn start(mode: Mode, dir: &Path, sim: &RunningSim, extra: &[&str]) -> Floodgate {
    Launch::new(mode, dir)
        .link(
            "east",
            &sim.kubeconfig(),
            LinkSpec::with_remote(RemoteSpec::default()),
        )
        .args(extra.iter().copied())
        .start()
        .await
        .expect("floodgate is ready")
}

/// SIGTERM: readiness turns 503 while the watch is still open, the watch then gets a BOOKMARK
/// with the version it had reached and ends cleanly, and the process exits 0 in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drops_readiness_then_drains_watchers_with_a_last_bookmark() {
    sigterm_drains(Mode::Standalone).await;
}

/// The same for `floodgate controller`: a rollout's SIGTERM costs its consumers nothing more
/// than a resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_controller_the_same_way() {
    sigterm_drains(Mode::Controller).await;
}

async fn sigterm_drains(mode: Mode) {
    let store = Arc::new(SimStore::new(120, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 2, true);
    let sim = RunningSim::start(store, "remote-token")
        .await
        .expect("kube-sim");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut g = start(mode, tmp.path(), &sim, &["--shutdown-timeout", "10"]).await;
    let client = g.consumer().await.expect("a client");
    let list = Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("LIST");
    let rv = list.metadata.resource_version.expect("a list version");
    let path = format!("/api/v1/services?watch=true&allowWatchBookmarks=true&resourceVersion={rv}");
    let resp = floodgate_e2e::gateway::raw_get(&client, &path, "application/json")
        .await
        .expect("watch");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body().into_data_stream();

    let sent = Instant::now();
    g.sigterm();
    // Readiness drops while the watch is still open (nothing has arrived on it yet).
    until(5, "/readyz answers 503", async || {
        g.readyz().await == Some(503)
    })
    .await;
    let unready_at = Instant::now();

    let mut frames = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let ended_cleanly = loop {
        match tokio::time::timeout(Duration::from_secs(15), body.next()).await {
            Ok(Some(Ok(chunk))) => buf.extend_from_slice(&chunk),
            Ok(Some(Err(e))) => panic!("the watch ended with an error: {e}"),
            Ok(None) => break true,
            Err(_) => break false,
        }
        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let frame: Value = serde_json::from_slice(&buf[..i]).expect("a JSON frame");
            buf.drain(..=i);
            frames.push((Instant::now(), frame));
        }
    };
    assert!(ended_cleanly, "the watch ended: {frames:?}");
    let (bookmark_at, last) = frames.last().expect("a last frame");
    assert_eq!(last["type"], "BOOKMARK", "{frames:?}");
    assert_eq!(last["object"]["kind"], "Service");
    assert_eq!(
        last["object"]["metadata"]["resourceVersion"], rv,
        "the bookmark carries the version the watch had reached"
    );
    assert!(
        unready_at <= *bookmark_at,
        "readiness dropped before the watch was drained"
    );
    let status = tokio::time::timeout(Duration::from_secs(15), g.child().wait())
        .await
        .expect("exits within the deadline")
        .expect("exit status");
    assert!(status.success(), "exit 0 after a clean drain: {status}");
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "within the deadline"
    );
}

/// A drain that cannot finish (a consumer that never reads a streaming list bigger than the
/// socket buffers): the process waits for it, and a second SIGTERM makes it exit at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_forces_exit_during_a_slow_drain() {
    let store = Arc::new(SimStore::new(121, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    // 40 services of 400 KB each: 16 MB of streaming list, more than loopback buffers hold.
    let mut big = Vec::new();
    for i in 0..40 {
        let name = format!("big-{i}");
        cluster.add_service(&name, true);
        let key = floodgate::model::ObjKey {
            kind: floodgate::model::Kind::Service,
            id: floodgate::model::NsName::new("prod", &name),
        };
        if let Some(Object::Service(s)) = store.view().get(&key).map(|s| s.object.clone()) {
            let mut s = Service::clone(&s);
            s.metadata
                .annotations
                .get_or_insert_default()
                .insert("padding".into(), "x".repeat(400_000));
            big.push(Object::Service(Arc::new(s)));
        }
    }
    store.apply(big);
    let sim = RunningSim::start(store, "remote-token")
        .await
        .expect("kube-sim");
    let tmp = tempfile::tempdir().expect("tempdir");
    // Standalone only: the stuck consumer writes its request in plain HTTP, and only
    // `floodgate run` serves the facade without TLS.
    let mut g = start(
        Mode::Standalone,
        tmp.path(),
        &sim,
        &["--shutdown-timeout", "120", "--insecure-http"],
    )
    .await;

    // A consumer that asks for everything and never reads.
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.set_recv_buffer_size(4096).expect("small buffer");
    let mut stuck = sock.connect(g.facade).await.expect("connect");
    let req = format!(
        "GET /links/east/api/v1/services?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true HTTP/1.1\r\nhost: floodgate\r\nauthorization: Bearer {}\r\n\r\n",
        g.token()
    );
    stuck.write_all(req.as_bytes()).await.expect("request");

    g.sigterm();
    until(5, "/readyz answers 503", async || {
        g.readyz().await == Some(503)
    })
    .await;
    // The drain is under way and cannot finish: it says so, the stuck watch still open, and
    // the process is still there.
    until(10, "the drain reports the stuck watch", async || {
        g.log_text().lines().any(|l| {
            l.contains("draining: facade connections still open") && l.contains("watches=1")
        })
    })
    .await;
    assert!(
        g.child().try_wait().expect("status").is_none(),
        "still draining"
    );
    assert_eq!(g.readyz().await, Some(503), "still answering, not ready");

    let forced = Instant::now();
    g.sigterm();
    let status = tokio::time::timeout(Duration::from_secs(5), g.child().wait())
        .await
        .expect("a second SIGTERM exits at once")
        .expect("exit status");
    assert!(
        !status.success(),
        "a forced exit is not a clean one: {status}"
    );
    assert!(forced.elapsed() < Duration::from_secs(5));
    drop(stuck);
}
