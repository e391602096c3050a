//! Drop-in: unmodified clients through Floodgate in front of the real server: kubectl's tables
//! and a refused delete, client-go informers in all four modes, the Python client's list and
//! watch.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use floodgate_e2e::process::Floodgate;
use floodgate_e2e::real::{Crashloop, RealKube, Resolver, ResolverMode, kubectl};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use super::{CALM, calm_services, floodgate, names, resolver_direct, spec, whole, write};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn drop_in_kubectl_and_client_go_in_four_modes_through_floodgate() {
    let kube = RealKube::start().await.expect("the real API server");
    calm_services(&kube).await;
    let fg = floodgate(&kube, spec()).await;
    let through = write(
        kube.dir(),
        "through.kubeconfig",
        &fg.consumer_kubeconfig().expect("consumer kubeconfig"),
    );
    kubectl_through(&kube, &through).await;
    client_go_through(&kube, &fg).await;
}

/// kubectl: the exported services as the real server lists them, an EndpointSlice table with
/// kubectl's columns, the calm pods, and a delete refused.
async fn kubectl_through(kube: &RealKube, through: &Path) {
    let direct = names(
        &kube
            .kubectl(&[
                "get",
                "services",
                "-A",
                "-l",
                "mirror.linkerd.io/exported=true",
                "-o",
                "name",
            ])
            .await
            .expect("kubectl direct"),
    );
    assert_eq!(direct.len(), CALM, "{direct:?}");
    let mut served = BTreeSet::new();
    floodgate_e2e::until(
        30,
        "kubectl lists the exported services through Floodgate",
        async || {
            served = kubectl(through, &["get", "services", "-A", "-o", "name"])
                .await
                .map(|o| names(&o))
                .unwrap_or_default();
            served == direct
        },
    )
    .await;
    let table = kubectl(through, &["get", "endpointslices", "-n", "calm"])
        .await
        .expect("kubectl get endpointslices through Floodgate");
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"],
        "{table}"
    );
    let pods = kubectl(through, &["get", "pods", "-n", "calm", "-o", "name"])
        .await
        .expect("kubectl get pods through Floodgate");
    assert_eq!(pods.lines().count(), CALM * 3, "{pods}");
    let refused = kubectl(through, &["delete", "service", "-n", "calm", "calm-0"]).await;
    assert!(refused.is_err(), "a delete through Floodgate is refused");
}

/// client-go informers, direct once and through Floodgate in all four modes: each has the calm
/// services whole, no watch error, only the exported services, and the pods' owners.
async fn client_go_through(kube: &RealKube, fg: &Floodgate) {
    let consumer = fg.consumer_kubeconfig().expect("consumer kubeconfig");
    let mut direct = resolver_direct(kube, "direct");
    let mut resolvers: Vec<Resolver> = ResolverMode::ALL
        .iter()
        .enumerate()
        .map(|(i, mode)| {
            Resolver::start(&consumer, *mode, kube.dir(), &format!("through-{i}"))
                .expect("resolver through Floodgate")
        })
        .collect();
    let d = whole(&mut direct, 60).await;
    println!("direct ({}): synced in {} ms", direct.mode, d.sync_ms);
    for r in &mut resolvers {
        let report = whole(r, 60).await;
        println!(
            "through Floodgate ({}): synced in {} ms, {} ready endpoints, {} without their pod, {} watch errors",
            r.mode,
            report.sync_ms,
            report.ready_endpoints,
            report.ready_without_pod,
            report.watch_errors
        );
        assert_eq!(report.watch_errors, 0, "{}: {report:?}", r.mode);
        assert_eq!(
            report.cached.get("services"),
            Some(&(CALM as u64)),
            "{}: only the exported services: {report:?}",
            r.mode
        );
        assert!(
            report
                .cached
                .get("replicasets")
                .is_some_and(|n| *n >= CALM as u64),
            "{}: the pods' owners, metadata only: {report:?}",
            r.mode
        );
    }
}

/// The Python `kubernetes` client (`tests/python/list_and_watch.py`, which reads namespace
/// `prod`) through Floodgate in front of the real server: a list, then a watch that sees a service
/// created on the remote and one relabelled there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn drop_in_python_client_lists_and_watches_through_floodgate() {
    use tokio::io::AsyncBufReadExt as _;
    let kube = RealKube::start().await.expect("the real API server");
    Crashloop::setup(
        kube.kubeconfig_path(),
        &["--calm-services", "2", "--calm-namespace", "prod"],
        kube.dir(),
        60,
    )
    .await
    .expect("the driver creates the services");
    let fg = floodgate(&kube, spec()).await;
    let config = write(
        kube.dir(),
        "python.kubeconfig",
        &fg.consumer_kubeconfig().expect("consumer kubeconfig"),
    );
    let python = std::env::var("FLOODGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/list_and_watch.py"
    );
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .arg(&config)
        .arg("2")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python runs (make test-real sets FLOODGATE_PYTHON to its virtualenv)");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("a line within 30 s")
            .expect("read")
            .expect("the script is still running (is the kubernetes module installed?)")
    };
    assert_eq!(next().await, "LISTED calm-0,calm-1");
    assert_eq!(next().await, "WATCHING");
    let services: Api<Service> = Api::namespaced(kube.client().await.expect("client"), "prod");
    let cache: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cache", "labels": {"mirror.linkerd.io/exported": "true"}},
        "spec": {"ports": [{"port": 80}]}
    }))
    .expect("service");
    services
        .create(&PostParams::default(), &cache)
        .await
        .expect("create");
    assert_eq!(next().await, "EVENT ADDED cache");
    let patch = serde_json::json!({"metadata": {"labels": {"tier": "front"}}});
    services
        .patch("calm-0", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("relabel");
    assert_eq!(next().await, "EVENT MODIFIED calm-0");
    assert_eq!(next().await, "DONE");
}
