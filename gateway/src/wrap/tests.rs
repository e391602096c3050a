//! `floodgate wrap` on Linkerd's exact output: the two credentials Secrets `link-gen` prints
//! (as `sigs.k8s.io/yaml` marshals a `corev1.Secret`: sorted keys, `creationTimestamp: null`),
//! its `multicluster.linkerd.io` Link, and round trips back to the original kubeconfig.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use serde::Deserialize;
use serde_json::Value;

use super::*;

const REMOTE_KUBECONFIG: &str = "apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
    server: https://east.example.com:6443
  name: k3d-east
contexts:
- context:
    cluster: k3d-east
    user: linkerd-service-mirror-remote-access-default
  name: k3d-east
current-context: k3d-east
kind: Config
preferences: {}
users:
- name: linkerd-service-mirror-remote-access-default
  user:
    token: remote-sa-token
";

/// What `linkerd --context=east multicluster link-gen --cluster-name east` prints, up to and
/// including its Link (the service mirror's manifests follow in `link`, not in `link-gen`).
fn link_gen_output() -> String {
    let kc = base64::engine::general_purpose::STANDARD.encode(REMOTE_KUBECONFIG);
    format!(
        "apiVersion: v1
data:
  kubeconfig: {kc}
kind: Secret
metadata:
  creationTimestamp: null
  name: cluster-credentials-east
  namespace: linkerd-multicluster
type: mirror.linkerd.io/remote-kubeconfig
---
apiVersion: v1
data:
  kubeconfig: {kc}
kind: Secret
metadata:
  annotations:
    multicluster.linkerd.io/cluster-domain: cluster.local
    multicluster.linkerd.io/trust-domain: cluster.local
  creationTimestamp: null
  labels:
    multicluster.linkerd.io/cluster-name: east
  name: cluster-credentials-east
  namespace: linkerd
type: mirror.linkerd.io/remote-kubeconfig
---
apiVersion: multicluster.linkerd.io/v1alpha3
kind: Link
metadata:
  annotations:
    linkerd.io/created-by: linkerd/cli edge-25.1.1
  creationTimestamp: null
  name: east
  namespace: linkerd-multicluster
spec:
  clusterCredentialsSecret: cluster-credentials-east
  gatewayAddress: 203.0.113.7
  gatewayIdentity: linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local
  gatewayPort: \"4143\"
  targetClusterDomain: cluster.local
  targetClusterLinkerdNamespace: linkerd
  targetClusterName: east
---
"
    )
}

fn opts() -> WrapOptions {
    WrapOptions {
        namespace: "floodgate".into(),
        credentials_namespace: "floodgate-credentials".into(),
        server: "https://floodgate.floodgate.svc:6443/".into(),
        ca_pem: Some(
            "-----BEGIN CERTIFICATE-----\nfloodgate-ca\n-----END CERTIFICATE-----\n".into(),
        ),
    }
}

fn run(input: &str) -> Result<Vec<Value>, WrapError> {
    let mut asked = Vec::new();
    let text = wrap(input, &opts(), &mut |link| {
        asked.push(link.to_owned());
        Ok(format!("token-of-{link}"))
    })?;
    assert!(asked.len() <= 1, "one token per link: {asked:?}");
    Ok(serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).expect("wrap prints YAML"))
        .filter(|v| !v.is_null())
        .collect())
}

fn find<'a>(docs: &'a [Value], kind: &str, ns: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| {
            d["kind"] == kind && d["metadata"]["namespace"] == ns && d["metadata"]["name"] == name
        })
        .unwrap_or_else(|| panic!("no {kind} {ns}/{name} in {docs:#?}"))
}

/// The kubeconfig in a Secret, checked to parse as one, as plain values.
fn kubeconfig_of(secret: &Value) -> Value {
    let s: Secret = serde_json::from_value(secret.clone()).expect("a Secret");
    let bytes = &s.data.expect("data")[LINKERD_KUBECONFIG_KEY].0;
    let text = std::str::from_utf8(bytes).expect("utf-8");
    kube::config::Kubeconfig::from_yaml(text).expect("a kubeconfig");
    serde_yaml::from_str(text).expect("yaml")
}

#[test]
fn link_gen_output_becomes_a_link_its_upstream_and_secrets_pointing_at_floodgate() {
    let docs = run(&link_gen_output()).expect("wraps");
    // Link, upstream copy, token, two rewritten Secrets, and Linkerd's Link passed through.
    assert_eq!(docs.len(), 6, "{docs:#?}");

    let link = find(&docs, "Link", "floodgate", "east");
    assert_eq!(link["apiVersion"], "floodgate.dev/v1alpha1");
    assert_eq!(
        link["spec"]["remote"]["kubeconfigSecret"]["name"],
        "cluster-credentials-east-upstream"
    );
    let spec: floodgate_link_crd::LinkSpec =
        serde_json::from_value(link["spec"].clone()).expect("a Link spec");
    floodgate_link_crd::validate(&spec, "spec").expect("a valid spec");

    // The upstream copy holds Linkerd's original kubeconfig, byte for byte.
    let upstream = find(
        &docs,
        "Secret",
        "floodgate-credentials",
        "cluster-credentials-east-upstream",
    );
    assert_eq!(upstream["type"], "Opaque");
    let s: Secret = serde_json::from_value(upstream.clone()).expect("secret");
    assert_eq!(
        s.data.expect("data")[LINKERD_KUBECONFIG_KEY].0,
        REMOTE_KUBECONFIG.as_bytes()
    );

    let token = find(
        &docs,
        "Secret",
        "floodgate-credentials",
        "floodgate-token-east",
    );
    let s: Secret = serde_json::from_value(token.clone()).expect("secret");
    assert_eq!(s.data.expect("data")[TOKEN_KEY].0, b"token-of-east");

    // Both of Linkerd's Secrets now point at Floodgate, with Linkerd's metadata kept.
    for ns in ["linkerd-multicluster", "linkerd"] {
        let secret = find(&docs, "Secret", ns, "cluster-credentials-east");
        assert_eq!(secret["type"], LINKERD_SECRET_TYPE);
        assert_eq!(
            secret["metadata"]["annotations"][WRAPPED_ANNOTATION],
            "floodgate/east"
        );
        let kc = kubeconfig_of(secret);
        let cluster = &kc["clusters"][0]["cluster"];
        assert_eq!(
            cluster["server"],
            "https://floodgate.floodgate.svc:6443/links/east"
        );
        let ca = base64::engine::general_purpose::STANDARD
            .decode(
                cluster["certificate-authority-data"]
                    .as_str()
                    .expect("a CA"),
            )
            .expect("base64");
        assert!(String::from_utf8_lossy(&ca).contains("floodgate-ca"));
        assert_eq!(kc["users"][0]["user"]["token"], "token-of-east");
    }
    let dest = find(&docs, "Secret", "linkerd", "cluster-credentials-east");
    let labels: BTreeMap<String, String> =
        serde_json::from_value(dest["metadata"]["labels"].clone()).expect("labels");
    assert_eq!(labels[LINKERD_CLUSTER_LABEL], "east");
    let ann = &dest["metadata"]["annotations"];
    assert_eq!(ann["multicluster.linkerd.io/trust-domain"], "cluster.local");
    assert_eq!(
        ann["multicluster.linkerd.io/cluster-domain"],
        "cluster.local"
    );
    assert!(dest["metadata"].get("creationTimestamp").is_none());

    // Linkerd's own Link is untouched.
    let l5d = find(&docs, "Link", "linkerd-multicluster", "east");
    assert_eq!(l5d["apiVersion"], "multicluster.linkerd.io/v1alpha3");
    assert_eq!(l5d["spec"]["gatewayPort"], "4143");
}

#[test]
fn unwrapping_by_hand_gets_the_original_back() {
    // The round trip an operator does to undo an adoption: the upstream copy's kubeconfig put
    // back into Linkerd's Secret is exactly what link-gen printed.
    let input = link_gen_output();
    let docs = run(&input).expect("wraps");
    let upstream = find(
        &docs,
        "Secret",
        "floodgate-credentials",
        "cluster-credentials-east-upstream",
    );
    let original: Vec<Value> = serde_yaml::Deserializer::from_str(&input)
        .map(|d| Value::deserialize(d).expect("yaml"))
        .filter(|v| !v.is_null())
        .collect();
    let mut restored = find(&docs, "Secret", "linkerd", "cluster-credentials-east").clone();
    restored["data"] = upstream["data"].clone();
    let ann = restored["metadata"]["annotations"]
        .as_object_mut()
        .expect("annotations");
    ann.remove(WRAPPED_ANNOTATION);
    let want = find(&original, "Secret", "linkerd", "cluster-credentials-east");
    let a: Secret = serde_json::from_value(restored).expect("secret");
    let b: Secret = serde_json::from_value(want.clone()).expect("secret");
    assert_eq!(a, b);
}

#[test]
fn wrapping_twice_is_refused() {
    let once = run(&link_gen_output()).expect("wraps");
    let rewritten = find(&once, "Secret", "linkerd", "cluster-credentials-east");
    let text = serde_yaml::to_string(rewritten).expect("yaml");
    let err = run(&text).expect_err("a wrapped Secret is not wrapped again");
    assert!(matches!(err, WrapError::AlreadyWrapped { .. }), "{err}");
}

#[test]
fn a_list_from_kubectl_get_is_wrapped_too() {
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&link_gen_output())
        .map(|d| Value::deserialize(d).expect("yaml"))
        .filter(|v| !v.is_null())
        .collect();
    let mut secret = docs[1].clone();
    // What `kubectl get secret -o yaml` adds: server-owned fields and the last applied config.
    secret["metadata"]["resourceVersion"] = "123".into();
    secret["metadata"]["uid"] = "0b9e5d43-2d53-4bd4-9a6e-3a4f6f0d1c11".into();
    secret["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
        "{}".into();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [secret]});
    let out = run(&serde_yaml::to_string(&list).expect("yaml")).expect("wraps");
    let s = find(&out, "Secret", "linkerd", "cluster-credentials-east");
    assert!(s["metadata"].get("resourceVersion").is_none());
    assert!(s["metadata"].get("uid").is_none());
    assert!(
        s["metadata"]["annotations"]
            .get("kubectl.kubernetes.io/last-applied-configuration")
            .is_none()
    );
    find(&out, "Link", "floodgate", "east");
}

#[test]
fn bad_input_gets_a_clear_error() {
    assert!(matches!(
        run("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"),
        Err(WrapError::NothingToWrap)
    ));
    assert!(matches!(
        run("a: [unclosed"),
        Err(WrapError::Parse { doc: 1, .. })
    ));
    let no_data = "apiVersion: v1\nkind: Secret\nmetadata: {name: cluster-credentials-west, namespace: linkerd}\ntype: mirror.linkerd.io/remote-kubeconfig\n";
    assert!(matches!(run(no_data), Err(WrapError::NoKubeconfig { .. })));
    let bad_kc = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: cluster-credentials-west, namespace: linkerd}}\ntype: mirror.linkerd.io/remote-kubeconfig\ndata: {{kubeconfig: {}}}\n",
        base64::engine::general_purpose::STANDARD.encode("clusters: 7")
    );
    assert!(matches!(run(&bad_kc), Err(WrapError::BadKubeconfig { .. })));
    let nameless = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: remote, namespace: linkerd}}\ntype: mirror.linkerd.io/remote-kubeconfig\ndata: {{kubeconfig: {}}}\n",
        base64::engine::general_purpose::STANDARD.encode(REMOTE_KUBECONFIG)
    );
    assert!(matches!(run(&nameless), Err(WrapError::NoCluster { .. })));
}

/// The Floodgate Link keeps Linkerd's `targetClusterLinkerdNamespace` (where the remote's
/// `linkerd-config` is read), whether Linkerd's Link comes after its credentials (link-gen's
/// order) or before them.
#[test]
fn the_link_keeps_linkerds_target_cluster_linkerd_namespace() {
    let docs = run(&link_gen_output()).expect("wraps");
    let link = find(&docs, "Link", "floodgate", "east");
    assert_eq!(link["spec"]["targetClusterLinkerdNamespace"], "linkerd");

    let custom = link_gen_output().replace(
        "targetClusterLinkerdNamespace: linkerd",
        "targetClusterLinkerdNamespace: linkerd-prod",
    );
    let (secrets, l5d_link) = custom
        .split_once("---\napiVersion: multicluster.linkerd.io")
        .expect("link-gen's Link follows the Secrets");
    let link_first = format!("apiVersion: multicluster.linkerd.io{l5d_link}{secrets}");
    for input in [custom.as_str(), link_first.as_str()] {
        let docs = run(input).expect("wraps");
        let link = find(&docs, "Link", "floodgate", "east");
        assert_eq!(
            link["spec"]["targetClusterLinkerdNamespace"],
            "linkerd-prod"
        );
        let spec: floodgate_link_crd::LinkSpec =
            serde_json::from_value(link["spec"].clone()).expect("a Link spec");
        floodgate_link_crd::validate(&spec, "spec").expect("valid");
    }
}
