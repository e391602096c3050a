//! A remote that refuses us, on the real server: the link's credentials are a ServiceAccount's
//! token bound to a ClusterRole that reads what a link follows (as Linkerd's remote access
//! is); the binding is deleted (RBAC revoked) and later put back.

use std::time::Instant;

use floodgate_e2e::admin;
use floodgate_e2e::process::Floodgate;
use floodgate_e2e::real::RealKube;

use super::controller::account_kubeconfig;
use super::{CALM, calm_services, served_services, spec, warns_since, write};

const READER: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: remote-reader, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: remote-reader}
rules:
- apiGroups: [""]
  resources: [services, endpoints, pods]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [get, list, watch]
"#;

const BINDING: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: remote-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: remote-reader}
subjects:
- {kind: ServiceAccount, name: remote-reader, namespace: default}
"#;

async fn link(fg: &Floodgate) -> serde_json::Value {
    admin::link(fg.admin, "east").await.unwrap_or_default()
}

/// The binding deleted: `Degraded` within 10 s naming the refusal, the view intact; the binding
/// back: `Healthy` within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn the_links_role_taken_away_is_degraded_and_named_and_the_view_kept() {
    let kube = RealKube::start().await.expect("the real API server");
    calm_services(&kube).await;
    let rbac = write(kube.dir(), "reader.yaml", READER);
    let binding = write(kube.dir(), "binding.yaml", BINDING);
    for f in [&rbac, &binding] {
        kube.kubectl(&["apply", "-f", &f.display().to_string()])
            .await
            .expect("kubectl apply");
    }
    let account = account_kubeconfig(&kube, "default", "remote-reader").await;
    let config = std::fs::read_to_string(&account).expect("kubeconfig");
    let fg = Floodgate::start(&kube.dir().join("floodgate"), "east", &config, spec())
        .await
        .expect("floodgate as the reader");
    floodgate_e2e::until(30, "the calm services served", async || {
        served_services(&fg).await == Ok(CALM)
    })
    .await;

    let revoked = Instant::now();
    let from = fg.log_text().len();
    kube.kubectl(&["delete", "-f", &binding.display().to_string()])
        .await
        .expect("the binding deleted");
    floodgate_e2e::until(10, "Degraded, naming the refusal", async || {
        let v = link(&fg).await;
        v["phase"] == "Degraded"
            && v["message"]
                .as_str()
                .is_some_and(|m| m.contains("refuses our credentials"))
    })
    .await;
    let degraded = revoked.elapsed();
    let v = link(&fg).await;
    assert_eq!(served_services(&fg).await, Ok(CALM), "the view is held");
    assert!(
        v["counters"]["upstreamRefusals"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{v}"
    );
    let message = v["message"].as_str().unwrap_or_default().to_owned();

    let restored = Instant::now();
    kube.kubectl(&["apply", "-f", &binding.display().to_string()])
        .await
        .expect("the binding back");
    floodgate_e2e::until(10, "Healthy again", async || {
        link(&fg).await["phase"] == "Healthy"
    })
    .await;
    println!(
        "role taken away: Degraded in {:.1} s ({message}); back Healthy {:.1} s after the binding returned",
        degraded.as_secs_f64(),
        restored.elapsed().as_secs_f64()
    );
    assert_eq!(served_services(&fg).await, Ok(CALM));
    let warns = warns_since(&fg, from);
    println!("  WARN lines since the binding was deleted: {warns:#?}");
    assert!(warns.len() <= 2, "at most two WARN lines: {warns:#?}");
}
