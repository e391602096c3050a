//! kubectl (a client we did not write) against a Floodgate link: tables with the right columns,
//! JSON, selectors, watches of a list and of one object, discovery, version, and a refused
//! delete with a readable error.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use floodgate::kubeapi::ApiStore;
use floodgate_e2e::RunningFacade;
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::sim::SimStore;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

struct Fixture {
    facade: RunningFacade,
    cluster: Cluster,
    kubeconfig: tempfile::NamedTempFile,
}

async fn fixture() -> Fixture {
    let store = Arc::new(SimStore::new(21, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for svc in ["web", "api"] {
        cluster.add_service(svc, true);
        cluster.scale(svc, 3, true);
    }
    cluster.add_service("big", true);
    cluster.scale("big", 150, true);
    let facade = RunningFacade::start(vec![("east", "east-token", store.view().clone())])
        .await
        .expect("facade");
    let kubeconfig = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(kubeconfig.path(), facade.kubeconfig("east")).expect("write kubeconfig");
    Fixture {
        facade,
        cluster,
        kubeconfig,
    }
}

impl Fixture {
    fn kubectl(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.env("KUBECONFIG", self.kubeconfig.path())
            .args(["--request-timeout=10s"])
            .args(args);
        c.kill_on_drop(true);
        c
    }

    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = self
            .kubectl(args)
            .output()
            .await
            .expect("kubectl runs (install it: .ci/run does)");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_prints_kubectl_tables() {
    let f = fixture().await;
    let (ok, out, err) = f.run(&["get", "endpointslices", "-n", "prod"]).await;
    assert!(ok, "{err}");
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]);
    assert!(
        out.contains("web-00000") && out.contains("big-00001"),
        "{out}"
    );
    assert!(
        out.contains("+ 97 more..."),
        "long endpoint lists are shortened like kubectl's: {out}"
    );
    let (ok, out, err) = f.run(&["get", "pods", "-n", "prod", "-l", "app=web"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 4, "header and three pods: {out}");
    assert!(
        out.lines()
            .next()
            .is_some_and(|h| h.contains("READY") && h.contains("STATUS") && h.contains("RESTARTS"))
    );
    let (ok, out, _) = f
        .run(&[
            "get",
            "svc",
            "-n",
            "prod",
            "--field-selector",
            "metadata.name=api",
            "-o",
            "name",
        ])
        .await;
    assert!(ok);
    assert_eq!(out.trim(), "service/api");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_discovery_and_version() {
    let f = fixture().await;
    let (ok, out, err) = f.run(&["get", "svc", "-A", "-o", "json"]).await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["items"].as_array().map(Vec::len), Some(3));
    let (ok, out, err) = f.run(&["api-resources"]).await;
    assert!(ok, "{err}");
    for r in [
        "endpointslices",
        "pods",
        "services",
        "replicasets",
        "servers",
    ] {
        assert!(out.contains(r), "{r} missing from {out}");
    }
    let (ok, out, err) = f.run(&["version"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("Server Version"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_is_refused_readably() {
    let f = fixture().await;
    let (ok, _, err) = f.run(&["delete", "svc", "web", "-n", "prod"]).await;
    assert!(!ok);
    assert!(
        err.contains("MethodNotAllowed") && err.contains("read-only"),
        "{err}"
    );
    let (ok, out, _) = f
        .run(&["get", "svc", "web", "-n", "prod", "-o", "name"])
        .await;
    assert!(ok && out.contains("service/web"), "still there");
}

async fn next_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    what: &str,
) -> String {
    tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{what}: no line within 10 s"))
        .expect("read")
        .unwrap_or_else(|| panic!("{what}: kubectl exited"))
}

/// Waits until the link has served `n` watches (each counted once its receiver is subscribed).
async fn wait_for_watches(f: &Fixture, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while f.facade.apis["east"].counters.snapshot().watches < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no watch {n} within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_a_list_and_one_object() {
    let mut f = fixture().await;
    let mut list = f
        .kubectl(&["get", "svc", "-n", "prod", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(list.stdout.take().expect("stdout")).lines();
    let mut initial = Vec::new();
    for _ in 0..3 {
        initial.push(next_line(&mut lines, "line 1").await);
    }
    initial.sort();
    assert_eq!(initial, ["service/api", "service/big", "service/web"]);
    f.cluster.add_service("cache", true);
    assert_eq!(next_line(&mut lines, "line 2").await, "service/cache");

    let mut one = f
        .kubectl(&[
            "get",
            "endpointslices",
            "web-00000",
            "-n",
            "prod",
            "-w",
            "-o",
            "jsonpath={.endpoints[0].addresses[0]}{\"\\n\"}",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut one_lines = BufReader::new(one.stdout.take().expect("stdout")).lines();
    let first = next_line(&mut one_lines, "line 3").await;
    // kubectl GETs the object, prints it, then watches from resourceVersion 0; a change made
    // before that watch is part of its synthetic ADDED, which kubectl does not print (it takes it
    // for the state it already showed). So change the object once the watch is in place.
    wait_for_watches(&f, 2).await;
    f.cluster.roll_pod("web", 0);
    let second = next_line(&mut one_lines, "line 4").await;
    assert_ne!(first, second, "the rolled pod's new address arrives");
    f.cluster.roll_pod("api", 0);
    // A change to another object does not reach the single-object watch.
    f.cluster.roll_pod("web", 0);
    let third = next_line(&mut one_lines, "line 5").await;
    assert_ne!(third, second);
    assert!(f.facade.apis["east"].counters.snapshot().watches >= 2);
}
