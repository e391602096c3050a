//! Downstream abuse against the real `floodgate` binary in front of kube-sim: every refusal
//! a hostile or broken client can provoke gets its status code and a `metav1.Status`, and,
//! under 10,000 connections, slowloris heads and watchers that never read, Floodgate's peak
//! memory stays bounded while a well-behaved consumer keeps getting answers (`connections`).
//!
//! The facade runs with `--insecure-http` so the test can write raw requests; the bounds are the
//! listener's (`kubeapi::serve`), the same over TLS.

use std::net::SocketAddr;
use std::sync::Arc;

use floodgate_e2e::RunningSim;
use floodgate_e2e::admin;
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::modes::Mode;
use floodgate_e2e::process::{Floodgate, Launch, raw};
use floodgate_e2e::sim::SimStore;
use floodgate_link_crd::{LinkSpec, RemoteSpec};
use serde_json::Value;

struct Gateway {
    fg: Floodgate,
    facade: SocketAddr,
    admin: SocketAddr,
    east: String,
    west: String,
    _dir: tempfile::TempDir,
    _sim: RunningSim,
}

impl Gateway {
    fn pid(&self) -> u32 {
        self.fg.pid().expect("floodgate runs")
    }
}

/// kube-sim with two small exported services and `bulk` services of 1,000 pods, and the
/// binary serving it as links `east` and `west`, started with `args`.
async fn start(bulk: usize, args: &[&str]) -> Gateway {
    let store = Arc::new(SimStore::new(81, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for svc in ["web", "api"] {
        cluster.add_service(svc, true);
        cluster.scale(svc, 3, true);
    }
    for i in 0..bulk {
        let name = format!("bulk-{i}");
        cluster.add_service(&name, true);
        cluster.scale(&name, 1000, true);
    }
    let sim = RunningSim::start(store, "remote-token")
        .await
        .expect("kube-sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = || LinkSpec::with_remote(RemoteSpec::default());
    let fg = Launch::new(Mode::Standalone, dir.path())
        .link("east", &sim.kubeconfig(), spec())
        .link("west", &sim.kubeconfig(), spec())
        .args(["--insecure-http"])
        .args(args.iter().copied())
        .log("warn")
        .start()
        .await
        .expect("both links sync");
    Gateway {
        facade: fg.facade,
        admin: fg.admin,
        east: fg.token_of("east"),
        west: fg.token_of("west"),
        fg,
        _dir: dir,
        _sim: sim,
    }
}

/// Every refusal, over the wire: code, `metav1.Status` kind, reason and code in the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_over_the_wire_is_a_status_with_its_code() {
    let g = start(0, &[]).await;
    let svc = "/links/east/api/v1/services";
    let (east, west) = (Some(g.east.as_str()), Some(g.west.as_str()));
    let cases: Vec<(&str, String, Option<&str>, u16, &str)> = vec![
        ("GET", svc.into(), None, 401, "Unauthorized"),
        ("GET", svc.into(), Some("not-a-token"), 401, "Unauthorized"),
        ("GET", svc.into(), Some(""), 401, "Unauthorized"),
        ("GET", svc.into(), west, 403, "Forbidden"),
        (
            "GET",
            "/links/west/api/v1/pods".into(),
            east,
            403,
            "Forbidden",
        ),
        (
            "GET",
            "/links/north/api/v1/services".into(),
            east,
            404,
            "NotFound",
        ),
        ("GET", "/nothing/here".into(), east, 404, "NotFound"),
        (
            "GET",
            "/links/east/api/v1/secrets".into(),
            east,
            404,
            "NotFound",
        ),
        (
            "GET",
            "/links/east/apis/no.such/v1/things".into(),
            east,
            404,
            "NotFound",
        ),
        (
            "GET",
            "/links/east/api/v1/namespaces/prod/services/web/x/y".into(),
            east,
            404,
            "NotFound",
        ),
        (
            "DELETE",
            "/links/east/api/v1/namespaces/prod/services/web".into(),
            east,
            405,
            "MethodNotAllowed",
        ),
        (
            "PUT",
            "/links/east/api/v1/namespaces/prod/services/web".into(),
            east,
            405,
            "MethodNotAllowed",
        ),
        (
            "PATCH",
            "/links/east/api/v1/namespaces/prod/services/web".into(),
            east,
            405,
            "MethodNotAllowed",
        ),
        (
            "POST",
            svc.replace("/services", "/namespaces/prod/services"),
            east,
            405,
            "MethodNotAllowed",
        ),
        (
            "POST",
            "/links/east/version".into(),
            east,
            405,
            "MethodNotAllowed",
        ),
        (
            "GET",
            format!("{svc}?labelSelector=a%20in%20("),
            east,
            400,
            "BadRequest",
        ),
        (
            "GET",
            format!("{svc}?labelSelector=%3Dx"),
            east,
            400,
            "BadRequest",
        ),
        (
            "GET",
            format!("{svc}?labelSelector=a%20notin"),
            east,
            400,
            "BadRequest",
        ),
        (
            "GET",
            format!("{svc}?labelSelector=%FF%FE"),
            east,
            400,
            "BadRequest",
        ),
        (
            "GET",
            format!("{svc}?fieldSelector=spec.clusterIP%3Dx"),
            east,
            400,
            "BadRequest",
        ),
        (
            "GET",
            format!("{svc}?fieldSelector=metadata.name"),
            east,
            400,
            "BadRequest",
        ),
        ("GET", format!("{svc}?watch=maybe"), east, 400, "BadRequest"),
        (
            "GET",
            format!("{svc}?timeoutSeconds=soon"),
            east,
            400,
            "BadRequest",
        ),
        ("GET", format!("{svc}?limit=-1"), east, 400, "BadRequest"),
        (
            "GET",
            format!("{svc}?resourceVersionMatch=Sometimes"),
            east,
            422,
            "Invalid",
        ),
        (
            "GET",
            format!("{svc}?resourceVersion=abc"),
            east,
            422,
            "Invalid",
        ),
        (
            "POST",
            "/links/east/api/v1/namespaces/prod/events".into(),
            east,
            400,
            "BadRequest",
        ),
    ];
    for (method, path, token, code, reason) in &cases {
        let (got, text) = admin::call_text(g.facade, method, path, *token, "{not json")
            .await
            .expect("an answer");
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert_eq!(got, *code, "{method} {path}: {text}");
        assert_eq!(
            (v["kind"].as_str(), v["reason"].as_str(), v["code"].as_u64()),
            (Some("Status"), Some(*reason), Some(u64::from(*code))),
            "{method} {path}: {text}"
        );
    }
    let (code, _) = admin::call_text(g.facade, "GET", svc, east, "")
        .await
        .expect("an answer");
    assert_eq!(code, 200, "the right token still opens the link");

    // Oversized requests, written raw: hyper's 414 and 431, the facade's 413 Status.
    let long_uri = format!(
        "GET {svc}?x={} HTTP/1.1\r\nhost: x\r\n\r\n",
        "a".repeat(70_000)
    );
    assert_eq!(
        raw(g.facade, long_uri.as_bytes(), 20)
            .await
            .expect("414")
            .code,
        414
    );
    let big = format!(
        "GET {svc} HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(200_000)
    );
    assert_eq!(
        raw(g.facade, big.as_bytes(), 20).await.expect("431").code,
        431
    );
    let n = floodgate::kubeapi::MAX_BODY + 1;
    let mut body = format!(
        "POST /links/east/api/v1/namespaces/prod/events HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {n}\r\nconnection: close\r\n\r\n",
        g.east
    )
    .into_bytes();
    body.resize(body.len() + n, b' ');
    let resp = raw(g.facade, &body, 20).await.expect("413");
    assert_eq!(
        (resp.code, resp.json()["reason"].as_str()),
        (413, Some("RequestEntityTooLarge")),
        "{}",
        resp.body
    );
    // Garbage instead of HTTP: 400 from hyper, and the process lives on.
    let junk = raw(g.facade, b"\x16\x03\x01 not http at all\r\n\r\n", 20)
        .await
        .expect("an answer");
    assert!(matches!(junk.code, 0 | 400), "{junk:?}");
    let (code, _) = admin::call_text(g.facade, "GET", svc, east, "")
        .await
        .expect("still serving");
    assert_eq!(code, 200);
}

mod connections;
