//! A remote that says everything is gone, on the real server: most of the link's exported
//! services deleted at once (`kubectl delete services --all -n doomed`, what the namespace
//! controller does when a namespace is deleted; the lane runs no controller-manager, so a
//! namespace's deletion would stay `Terminating`).

use std::collections::BTreeSet;
use std::time::Instant;

use floodgate_e2e::admin;
use floodgate_e2e::process::Floodgate;
use floodgate_e2e::real::RealKube;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::Api;
use kube::api::PostParams;

use super::{floodgate, spec, warns_since};

async fn create(kube: &RealKube, ns: &str, names: &[&str]) {
    let client = kube.client().await.expect("client");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let n: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("namespace");
    namespaces
        .create(&PostParams::default(), &n)
        .await
        .expect("create namespace");
    let services: Api<Service> = Api::namespaced(client, ns);
    for name in names {
        let s: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"mirror.linkerd.io/exported": "true"}},
            "spec": {"ports": [{"port": 80}]}
        }))
        .expect("service");
        services
            .create(&PostParams::default(), &s)
            .await
            .expect("create service");
    }
}

async fn served(fg: &Floodgate) -> BTreeSet<String> {
    let api: Api<Service> = Api::all(fg.consumer().await.expect("consumer"));
    let list = api.list(&Default::default()).await.expect("list");
    (list.items.iter())
        .map(|s| {
            let m = &s.metadata;
            format!(
                "{}/{}",
                m.namespace.as_deref().unwrap_or(""),
                m.name.as_deref().unwrap_or("")
            )
        })
        .collect()
}

fn set(of: &[&str]) -> BTreeSet<String> {
    of.iter().map(|s| (*s).to_owned()).collect()
}

async fn link(fg: &Floodgate) -> serde_json::Value {
    admin::link(fg.admin, "east").await.unwrap_or_default()
}

/// One service deleted alone reaches consumers and quarantines nothing; then three of the five
/// left deleted at once: the link is quarantined within 5 s with the share in its reason,
/// consumers still list all five; after an operator's release the three deletions reach them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn three_of_five_exported_services_deleted_at_once_quarantine_the_link() {
    let kube = RealKube::start().await.expect("the real API server");
    create(&kube, "keep", &["k1", "k2", "k3"]).await;
    create(&kube, "doomed", &["d1", "d2", "d3"]).await;
    let fg = floodgate(&kube, spec()).await;
    let six = set(&[
        "doomed/d1",
        "doomed/d2",
        "doomed/d3",
        "keep/k1",
        "keep/k2",
        "keep/k3",
    ]);
    floodgate_e2e::until(30, "six services served", async || served(&fg).await == six).await;

    let alone = Instant::now();
    kube.kubectl(&["delete", "service", "k3", "-n", "keep"])
        .await
        .expect("delete one service");
    let five = set(&["doomed/d1", "doomed/d2", "doomed/d3", "keep/k1", "keep/k2"]);
    floodgate_e2e::until(10, "the deletion served", async || {
        served(&fg).await == five
    })
    .await;
    let alone = alone.elapsed();
    assert_eq!(link(&fg).await["phase"], "Healthy");

    let at = Instant::now();
    let from = fg.log_text().len();
    kube.kubectl(&["delete", "services", "--all", "-n", "doomed"])
        .await
        .expect("delete the namespace's services");
    floodgate_e2e::until(5, "the link quarantined", async || {
        link(&fg).await["quarantine"]["reason"] == "MassRemoval"
    })
    .await;
    let quarantined = at.elapsed();
    let v = link(&fg).await;
    assert_eq!(v["phase"], "Quarantined", "{v}");
    assert!(
        v["message"].as_str().is_some_and(|m| m.contains("60%")),
        "the share in the reason: {v}"
    );
    assert_eq!(served(&fg).await, five, "consumers still served all five");
    let reason = v["message"].as_str().unwrap_or_default().to_owned();

    // The fault's lines, up to the operator's release (which logs its own).
    let warns = warns_since(&fg, from);
    let released_from = fg.log_text().len();

    let token = fg.admin_token.clone().expect("admin token");
    let (code, v) = admin::call(fg.admin, "POST", "/links/east/release", Some(&token), "")
        .await
        .expect("release");
    assert_eq!(code, 200, "{v}");
    let two = set(&["keep/k1", "keep/k2"]);
    floodgate_e2e::until(20, "the removals served", async || served(&fg).await == two).await;
    println!(
        "mass removal: one service deleted alone served in {:.2} s; three of five deleted at once: quarantined in {:.2} s ({})",
        alone.as_secs_f64(),
        quarantined.as_secs_f64(),
        reason
    );
    let release = warns_since(&fg, released_from);
    println!("  WARN lines of the mass removal: {warns:#?}; of the release: {release:#?}");
    assert!(warns.len() <= 2, "at most two WARN lines: {warns:#?}");
}
