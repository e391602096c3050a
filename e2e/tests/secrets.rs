//! Secrets never leak: the real binary runs at debug log level with recognizable secrets in
//! its inputs (the remote's bearer token, a client key in a failing link's kubeconfig, the
//! admin token, the links' own tokens), is exercised with wrong tokens, a failing remote and
//! every read route, and no secret appears in what it printed or in any response body.

use std::sync::Arc;

use base64::Engine as _;
use floodgate_e2e::RunningSim;
use floodgate_e2e::admin;
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::modes::Mode;
use floodgate_e2e::process::{Launch, free_addr};
use floodgate_e2e::sim::SimStore;
use floodgate_e2e::until;
use floodgate_link_crd::{LinkSpec, RemoteSpec};

const REMOTE_TOKEN: &str = "remote-bearer-SECRET-7f3a9c";
const CLIENT_KEY: &str = "client-key-SECRET-91c2d4";
const WEST_TOKEN: &str = "west-bearer-SECRET-c0ffee";
const ADMIN_TOKEN: &str = "admin-SECRET-5e5e5e";
const WRONG_TOKEN: &str = "presented-SECRET-bad0bad";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_logs_metrics_config_or_error_bodies() {
    let store = Arc::new(SimStore::new(83, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 2, true);
    let sim = RunningSim::start(store, REMOTE_TOKEN)
        .await
        .expect("kube-sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    // West's remote is down and its kubeconfig carries a client key and a token.
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let west = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: w\n  cluster:\n    server: https://{}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: w\n  context: {{cluster: w, user: w}}\ncurrent-context: w\nusers:\n- name: w\n  user:\n    token: {WEST_TOKEN}\n    client-key-data: {}\n    client-certificate-data: {}\n",
        free_addr(),
        b64(&format!(
            "-----BEGIN PRIVATE KEY-----\n{CLIENT_KEY}\n-----END PRIVATE KEY-----\n"
        )),
        b64("-----BEGIN CERTIFICATE-----\nnot-a-cert\n-----END CERTIFICATE-----\n"),
    );
    let spec = || LinkSpec::with_remote(RemoteSpec::default());
    let fg = Launch::new(Mode::Standalone, p)
        .link("east", &sim.kubeconfig(), spec())
        .link("west", &west, spec())
        .admin_token(ADMIN_TOKEN)
        .args(["--insecure-http"])
        .log("debug")
        .piped()
        .spawn()
        .await
        .expect("floodgate starts");
    let (facade, admin_addr) = (fg.facade, fg.admin);

    let east_synced = async || {
        matches!(
            admin::call(admin_addr, "GET", "/links/east", None, "").await,
            Ok((200, v)) if v["synced"] == true
        )
    };
    until(60, "east syncs", east_synced).await;
    let (east_token, west_link_token) = (fg.token_of("east"), fg.token_of("west"));

    let mut seen = String::new();
    let svc = "/links/east/api/v1/services";
    let facade_calls: Vec<(&str, String, Option<&str>)> = vec![
        ("GET", svc.into(), Some(WRONG_TOKEN)),
        ("GET", svc.into(), None),
        ("GET", svc.into(), Some(&west_link_token)),
        ("GET", svc.into(), Some(&east_token)),
        (
            "GET",
            "/links/west/api/v1/services".into(),
            Some(&west_link_token),
        ),
        (
            "GET",
            format!("{svc}?labelSelector=a%20in%20("),
            Some(&east_token),
        ),
        ("DELETE", format!("{svc}/web"), Some(&east_token)),
        ("GET", "/links/east/version".into(), Some(&east_token)),
    ];
    for (method, path, t) in &facade_calls {
        let (code, body) = admin::call_text(facade, method, path, *t, "")
            .await
            .expect("an answer");
        seen.push_str(&format!("{method} {path} -> {code} {body}\n"));
    }
    for (method, path, t) in [
        ("POST", "/links/east/quarantine", Some(WRONG_TOKEN)),
        ("POST", "/links/east/release", None),
        ("POST", "/links/east/release", Some(ADMIN_TOKEN)),
        ("POST", "/links/nope/release", Some(ADMIN_TOKEN)),
        ("GET", "/config", None),
        ("GET", "/metrics", None),
        ("GET", "/", None),
        ("GET", "/links", None),
        ("GET", "/links/west", None),
        ("GET", "/readyz", None),
    ] {
        let (code, body) = admin::call_text(admin_addr, method, path, t, "")
            .await
            .expect("an answer");
        seen.push_str(&format!("{method} {path} -> {code} {body}\n"));
    }
    assert!(seen.contains("GET /config -> 200"), "{seen}");
    // Give the failing link time to retry, so its errors are in the log.
    until(30, "west reports its failing remote", async || {
        matches!(
            admin::call(admin_addr, "GET", "/links/west", None, "").await,
            Ok((200, v)) if v["phase"] == "Degraded" || v["counters"]["upstreamErrors"].as_u64() > Some(0)
        )
    })
    .await;
    let (_, west) = admin::call_text(admin_addr, "GET", "/links/west", None, "")
        .await
        .expect("west");
    seen.push_str(&west);

    let mut child = fg.into_child();
    child.start_kill().expect("kill");
    let out = child.wait_with_output().await.expect("its output");
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        logs.contains("floodgate is serving") && logs.contains("DEBUG"),
        "the log was captured at debug level: {logs}"
    );
    for secret in [
        REMOTE_TOKEN,
        CLIENT_KEY,
        WEST_TOKEN,
        ADMIN_TOKEN,
        WRONG_TOKEN,
        east_token.as_str(),
        west_link_token.as_str(),
        &b64(&format!(
            "-----BEGIN PRIVATE KEY-----\n{CLIENT_KEY}\n-----END PRIVATE KEY-----\n"
        )),
    ] {
        for (what, text) in [("the log", &logs), ("a response", &seen)] {
            if let Some(at) = text.find(secret) {
                let from = text[..at].rfind('\n').map_or(0, |i| i + 1);
                let line = text[from..].lines().next().unwrap_or_default();
                panic!("{secret:?} leaked into {what}: {line}");
            }
        }
    }
}
