//! `linkerd multicluster check` against a wrapped link, on the real server under RBAC: the
//! remote's credentials are Linkerd's remote-access ServiceAccount, bound to the rules Linkerd
//! gives it, plus the Role `manifests/examples/remote-linkerd-config-rbac.yaml` adds. The check's
//! requests, replayed with kube-rs through Floodgate and straight to the remote with the same
//! account: `/version`, a SelfSubjectAccessReview each for get, list and watch on services, and
//! the GET of `linkerd-config`; every answer as the remote's, the trust anchors equal; then the
//! same requests with client-go's typed clientset, JSON and protobuf, as Linkerd's CLI makes
//! them (the lane's `linkerdcheck`). Then what
//! only Floodgate answers differently (another ConfigMap: 404 where the remote says 403), and a
//! trust-anchor rotation reaching a watch through Floodgate.

use std::path::Path;

use floodgate_e2e::next_event;
use floodgate_e2e::real::{self, RealKube};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

use super::controller::account_kubeconfig;
use super::{floodgate_with, spec, write};

/// The account `linkerd multicluster link` makes on the remote.
const ACCOUNT: &str = "linkerd-service-mirror-remote-access-default";

/// The remote as Linkerd leaves it: its configuration with a trust anchor, another ConfigMap
/// beside it, and the remote-access account with Linkerd's rules (reads of what the service
/// mirror and the destination follow; only `get` on `linkerd-config`).
fn linkerd_remote(anchor: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: linkerd}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: linkerd-multicluster}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: linkerd-config, namespace: linkerd}}
data:
  values: |
    identityTrustAnchorsPEM: |
      {anchor}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: linkerd-identity-trust-roots, namespace: linkerd}}
data: {{ca-bundle.crt: other}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {ACCOUNT}, namespace: linkerd-multicluster}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {ACCOUNT}}}
rules:
- apiGroups: [""]
  resources: [pods, endpoints, services]
  verbs: [get, list, watch]
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [linkerd-config]
  verbs: [get]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {ACCOUNT}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {ACCOUNT}}}
subjects:
- {{kind: ServiceAccount, name: {ACCOUNT}, namespace: linkerd-multicluster}}
"#
    )
}

/// The three reviews of "remote cluster access credentials are valid": get, list and watch
/// on services in every namespace; whether each is allowed.
async fn reviews(client: &Client) -> Vec<bool> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut allowed = Vec::new();
    for verb in ["get", "list", "watch"] {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    resource: Some("services".into()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .unwrap_or_else(|e| panic!("a review of {verb} services: {e}"));
        allowed.push(answer.status.is_some_and(|s| s.allowed));
    }
    allowed
}

/// The lane's `linkerdcheck` (client-go, as `linkerd multicluster check` asks) with the
/// credentials of `kubeconfig`: its answers.
async fn client_go_check(kubeconfig: &Path, protobuf: bool) -> serde_json::Value {
    let out = tokio::process::Command::new(real::bin("linkerdcheck").expect("linkerdcheck"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg(format!("--protobuf={protobuf}"))
        .output()
        .await
        .expect("linkerdcheck runs");
    assert!(
        out.status.success(),
        "linkerdcheck with {}: {}",
        kubeconfig.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("its JSON line")
}

fn anchors(c: &ConfigMap) -> String {
    (c.data.as_ref())
        .and_then(|d| d.get("values"))
        .cloned()
        .unwrap_or_default()
}

fn code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("an API error, not {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn linkerd_multicluster_check_passes_through_a_wrapped_link() {
    let kube = RealKube::start().await.expect("the real API server");
    let remote = write(
        kube.dir(),
        "linkerd-remote.yaml",
        &linkerd_remote("anchor-1"),
    );
    kube.kubectl(&["apply", "-f", &remote.to_string_lossy()])
        .await
        .expect("Linkerd's remote side");
    let role = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../manifests/examples/remote-linkerd-config-rbac.yaml");
    kube.kubectl(&["apply", "-f", &role.to_string_lossy()])
        .await
        .expect("the Role the docs tell users to add");
    let account = account_kubeconfig(&kube, "linkerd-multicluster", ACCOUNT).await;
    let account_yaml = std::fs::read_to_string(&account).expect("kubeconfig");
    let direct = floodgate_e2e::gateway::client_from(&account_yaml)
        .await
        .expect("the account's client");
    let fg = floodgate_with(&kube, "floodgate", &account_yaml, spec()).await;
    let through = fg.consumer().await.expect("consumer");

    // "remote cluster access credentials are valid".
    let (v_through, v_direct) = (
        through.apiserver_version().await.expect("/version"),
        direct.apiserver_version().await.expect("/version"),
    );
    assert_eq!(v_through.git_version, v_direct.git_version);
    assert_eq!(reviews(&direct).await, [true, true, true]);
    assert_eq!(reviews(&through).await, [true, true, true]);

    // "clusters share trust anchors".
    let l5d_through: Api<ConfigMap> = Api::namespaced(through.clone(), "linkerd");
    let l5d_direct: Api<ConfigMap> = Api::namespaced(direct.clone(), "linkerd");
    let want = l5d_direct
        .get("linkerd-config")
        .await
        .expect("the remote's");
    let got = l5d_through
        .get("linkerd-config")
        .await
        .expect("linkerd-config through Floodgate");
    assert!(anchors(&want).contains("anchor-1"), "{want:?}");
    assert_eq!(anchors(&got), anchors(&want));
    assert_eq!(got.metadata.uid, want.metadata.uid);

    // What the remote refuses this account (403), Floodgate does not serve (404).
    let other = "linkerd-identity-trust-roots";
    assert_eq!(code(l5d_direct.get(other).await.expect_err("refused")), 403);
    assert_eq!(code(l5d_through.get(other).await.expect_err("absent")), 404);
    let default_ns: Api<ConfigMap> = Api::namespaced(through.clone(), "default");
    let elsewhere = default_ns.get("linkerd-config").await;
    assert_eq!(code(elsewhere.expect_err("absent")), 404);

    // The same requests as Linkerd's CLI makes them: client-go's typed clientset, JSON and
    // protobuf, directly and through Floodgate with the same account.
    let through_config = write(
        kube.dir(),
        "through.kubeconfig",
        &fg.consumer_kubeconfig().expect("consumer kubeconfig"),
    );
    for protobuf in [false, true] {
        let direct = client_go_check(&account, protobuf).await;
        let via = client_go_check(&through_config, protobuf).await;
        println!("client-go (protobuf {protobuf}): direct {direct}, through Floodgate {via}");
        for answer in ["version", "allowed", "values", "uid"] {
            assert_eq!(via[answer], direct[answer], "{answer}: {via} / {direct}");
        }
        assert_eq!(direct["allowed"], serde_json::json!([true, true, true]));
        assert!(
            direct["values"]
                .as_str()
                .is_some_and(|v| v.contains("anchor-1"))
        );
        assert_eq!(
            (direct["other"].as_i64(), via["other"].as_i64()),
            (Some(403), Some(404))
        );
        assert_eq!(via["elsewhere"].as_i64(), Some(404));
    }

    // The remote rotates its trust anchors: a watch through Floodgate sees it.
    let cfg = watcher::Config::default().fields("metadata.name=linkerd-config");
    let mut watch = Box::pin(watcher::watcher(l5d_through.clone(), cfg));
    while !matches!(next_event(&mut watch).await, Event::InitDone) {}
    let admin: Api<ConfigMap> =
        Api::namespaced(kube.client().await.expect("admin client"), "linkerd");
    let rotated =
        serde_json::json!({"data": {"values": "identityTrustAnchorsPEM: |\n  anchor-2\n"}});
    admin
        .patch(
            "linkerd-config",
            &PatchParams::default(),
            &Patch::Merge(&rotated),
        )
        .await
        .expect("the rotation");
    let seen = loop {
        if let Event::Apply(c) = next_event(&mut watch).await {
            break c;
        }
    };
    assert!(anchors(&seen).contains("anchor-2"), "{seen:?}");
    let want = l5d_direct
        .get("linkerd-config")
        .await
        .expect("the remote's");
    assert_eq!(anchors(&seen), anchors(&want));
}
