//! The kustomize base in `manifests/` as a cluster would get it: `kubectl kustomize` renders
//! it, every rendered object parses into its Kubernetes type without losing a field, the
//! Deployment and RBAC say what the design promises (two replicas, probes, a restricted
//! security context, least privilege), a user's `images:` override takes, and the CRD's OpenAPI
//! schema accepts the examples and rejects invalid Links.
//!
//! The schema checks use the `jsonschema` crate on the schema generated from the Rust types
//! (the committed CRD is checked to be that schema by `spec.rs`). The CRD's one CEL rule
//! (exactly one of `kubeconfigSecret` and `kubeconfigPath`) is evaluated by the API server,
//! not by a JSON-schema validator: `validate()` checks it, and a test here says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use floodgate_link_crd::{LinkSpec, LinksFile, crd, validate};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

/// `kubectl kustomize DIR`, as documents.
fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl is installed (the facade's client tests need it too)");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("each rendered document is YAML"))
        .collect()
}

/// Parses `obj` into `T` and checks that nothing was dropped on the way: a misspelt or
/// misplaced field would vanish from the typed object, so the round trip would differ.
fn parse_exact<T: DeserializeOwned + serde::Serialize>(obj: &Value) -> T {
    let typed: T = serde_json::from_value(obj.clone()).unwrap_or_else(|e| {
        panic!(
            "{} {} does not parse: {e}",
            obj["kind"], obj["metadata"]["name"]
        )
    });
    let back = serde_json::to_value(&typed).expect("serializes");
    if let Some(at) = first_difference(obj, &back, String::new()) {
        panic!(
            "{} {} lost or changed a field when parsed into its type, at {at}",
            obj["kind"], obj["metadata"]["name"]
        );
    }
    typed
}

/// Where `a` and `b` first differ (numbers compare by value: `1` is `1.0`), or `None`.
fn first_difference(a: &Value, b: &Value, at: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let path = format!("{at}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => first_difference(p, q, path),
                    _ => Some(path),
                }
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, format!("{at}[{i}]"))),
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if a == b => None,
        _ => Some(at),
    }
}

fn of_kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

#[test]
fn the_base_renders_and_every_object_parses_into_its_type() {
    let objs = kustomize(&manifests());
    let mut kinds: Vec<String> = objs
        .iter()
        .map(|o| o["kind"].as_str().unwrap_or("?").to_owned())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "CustomResourceDefinition",
            "Deployment",
            "Namespace",
            "Namespace",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Role",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "Service",
            "Service",
            "Service",
            "ServiceAccount",
        ]
    );
    for o in &objs {
        match o["kind"].as_str().unwrap_or_default() {
            "Namespace" => drop(parse_exact::<Namespace>(o)),
            "CustomResourceDefinition" => drop(parse_exact::<CustomResourceDefinition>(o)),
            "ServiceAccount" => drop(parse_exact::<ServiceAccount>(o)),
            "Role" => drop(parse_exact::<Role>(o)),
            "RoleBinding" => drop(parse_exact::<RoleBinding>(o)),
            "Deployment" => drop(parse_exact::<Deployment>(o)),
            "Service" => drop(parse_exact::<Service>(o)),
            "NetworkPolicy" => drop(parse_exact::<NetworkPolicy>(o)),
            "PodDisruptionBudget" => drop(parse_exact::<PodDisruptionBudget>(o)),
            other => panic!("unexpected kind {other}"),
        }
        let cluster_scoped = matches!(
            o["kind"].as_str(),
            Some("Namespace" | "CustomResourceDefinition")
        );
        if !cluster_scoped {
            // The credentials namespace holds the links' Secrets and the rights to read them.
            let want = if o["metadata"]["name"] == "floodgate-credentials" {
                "floodgate-credentials"
            } else {
                "floodgate"
            };
            assert_eq!(
                o["metadata"]["namespace"], want,
                "{} {} is in namespace {want}",
                o["kind"], o["metadata"]["name"]
            );
        }
    }
    // The CRD in the base is the one the Rust types generate.
    let crd_obj = of_kind(&objs, "CustomResourceDefinition")[0];
    let typed: CustomResourceDefinition = serde_json::from_value(crd_obj.clone()).expect("crd");
    assert_eq!(typed.spec, crd().spec);
}

#[test]
fn the_deployment_runs_two_restricted_replicas_with_probes_and_state() {
    let objs = kustomize(&manifests());
    let d: Deployment = parse_exact(of_kind(&objs, "Deployment")[0]);
    let spec = d.spec;
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some("floodgate"));
    let psc = pod.security_context.expect("pod security context");
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.map(|s| s.type_),
        Some("RuntimeDefault".to_owned())
    );
    let c = &pod.containers[0];
    assert_eq!(
        c.args
            .as_deref()
            .and_then(|a| a.first())
            .map(String::as_str),
        Some("controller")
    );
    let sc = c
        .security_context
        .clone()
        .expect("container security context");
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.and_then(|c| c.drop),
        Some(vec!["ALL".to_owned()])
    );
    for (probe, path) in [
        (c.liveness_probe.clone(), "/livez"),
        (c.readiness_probe.clone(), "/readyz"),
    ] {
        let get = probe.and_then(|p| p.http_get).expect("an HTTP probe");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            serde_json::to_value(&get.port).expect("port"),
            json!("admin")
        );
    }
    let ports: Vec<(String, i32)> = c
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap_or_default(), p.container_port))
        .collect();
    for want in [("facade", 6443), ("grpc", 8090), ("admin", 9990)] {
        assert!(
            ports.contains(&(want.0.to_owned(), want.1)),
            "{want:?} in {ports:?}"
        );
    }
    let res = c.resources.clone().expect("resources");
    assert!(
        res.requests
            .is_some_and(|r| r.contains_key("cpu") && r.contains_key("memory"))
    );
    assert!(res.limits.is_some_and(|l| l.contains_key("memory")));
    let mounts: Vec<&str> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(mounts.contains(&"/var/lib/floodgate"), "{mounts:?}");
    assert!(
        c.args
            .iter()
            .flatten()
            .any(|a| a == "--state-dir=/var/lib/floodgate")
    );

    let services: Vec<Service> = of_kind(&objs, "Service")
        .into_iter()
        .map(parse_exact)
        .collect();
    let mut ports: Vec<i32> = services
        .iter()
        .flat_map(|s| s.spec.iter().flat_map(|s| s.ports.iter().flatten()))
        .map(|p| p.port)
        .collect();
    ports.sort_unstable();
    assert_eq!(ports, [6443, 6443, 8090, 9990]);
    // The peers' Service is headless and names every replica, ready or not.
    let peers = services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("floodgate-peers"))
        .and_then(|s| s.spec.as_ref())
        .expect("floodgate-peers");
    assert_eq!(peers.cluster_ip.as_deref(), Some("None"));
    assert_eq!(peers.publish_not_ready_addresses, Some(true));
    let env = &deployment_env(&objs);
    assert!(
        env.iter().any(|(k, v)| k == "FLOODGATE_PEERS"
            && v == "floodgate-peers.$(FLOODGATE_NAMESPACE).svc:6443"),
        "{env:?}"
    );
    let pdb: PodDisruptionBudget = parse_exact(of_kind(&objs, "PodDisruptionBudget")[0]);
    assert!(pdb.spec.and_then(|s| s.min_available).is_some());
}

/// The floodgate container's environment: name and literal value.
fn deployment_env(objs: &[Value]) -> Vec<(String, String)> {
    of_kind(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let v = e["value"].as_str().unwrap_or_default();
            (
                e["name"].as_str().unwrap_or_default().to_owned(),
                v.to_owned(),
            )
        })
        .collect()
}

#[test]
fn rbac_is_least_privilege() {
    let objs = kustomize(&manifests());
    assert!(
        of_kind(&objs, "ClusterRole").is_empty(),
        "no cluster-wide rights"
    );
    let grants = |name: &str| {
        let role = of_kind(&objs, "Role")
            .into_iter()
            .find(|r| r["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("Role {name}"));
        let role: Role = parse_exact(role);
        let mut grants: Vec<(String, String, String)> = Vec::new();
        for rule in role.rules.iter().flatten() {
            for g in rule.api_groups.iter().flatten() {
                for r in rule.resources.iter().flatten() {
                    for v in &rule.verbs {
                        assert_ne!(v, "*", "no wildcard verbs");
                        grants.push((g.clone(), r.clone(), v.clone()));
                    }
                }
            }
        }
        grants
    };
    let floodgate = grants("floodgate");
    let has = |g: &str, r: &str, v: &str| floodgate.contains(&(g.into(), r.into(), v.into()));
    // `patch` clears operators' command annotations.
    for v in ["get", "list", "watch", "patch"] {
        assert!(has("floodgate.dev", "links", v));
    }
    assert!(has("floodgate.dev", "links/status", "patch"));
    assert!(
        !has("floodgate.dev", "links/status", "get"),
        "status is read from the watch"
    );
    for v in ["create", "update", "delete"] {
        assert!(
            !has("floodgate.dev", "links", v),
            "the spec is not ours to write ({v})"
        );
    }
    // Operators with kubectl alone read a Link and set its command annotation, nothing else.
    let operator = grants("floodgate-operator");
    let link = |v: &str| ("floodgate.dev".to_owned(), "links".to_owned(), v.to_owned());
    assert_eq!(operator, [link("get"), link("patch")]);
    // No Secret of Floodgate's own namespace (its admin token, its TLS key) is readable
    // through the API; the links' Secrets are, from a watch of the credentials namespace:
    // read by name never, written never.
    assert!(
        !floodgate.iter().any(|(_, r, _)| r == "secrets"),
        "no Secret of the floodgate namespace: {floodgate:?}"
    );
    let secret = |v: &str| (String::new(), "secrets".to_owned(), v.to_owned());
    assert_eq!(
        grants("floodgate-credentials"),
        [secret("list"), secret("watch")]
    );
    assert!(has("events.k8s.io", "events", "create"));
    for v in ["get", "create", "update"] {
        assert!(has("coordination.k8s.io", "leases", v));
    }
    // Both Roles are bound to the ServiceAccount, each in its namespace.
    let mut bound: Vec<(String, String)> = Vec::new();
    for b in of_kind(&objs, "RoleBinding") {
        let binding: RoleBinding = parse_exact(b);
        let subject = &binding.subjects.expect("subjects")[0];
        assert_eq!(
            (
                subject.kind.as_str(),
                subject.name.as_str(),
                subject.namespace.as_deref()
            ),
            ("ServiceAccount", "floodgate", Some("floodgate"))
        );
        bound.push((
            binding.metadata.namespace.unwrap_or_default(),
            binding.role_ref.name,
        ));
    }
    bound.sort();
    assert_eq!(
        bound,
        [
            ("floodgate".to_owned(), "floodgate".to_owned()),
            (
                "floodgate-credentials".to_owned(),
                "floodgate-credentials".to_owned()
            ),
        ]
    );
}

#[test]
fn a_user_overrides_the_image_with_kustomize() {
    let dir = tempfile_dir();
    // kustomize takes only relative paths to a base.
    let base = manifests().canonicalize().expect("manifests/");
    let up = "../".repeat(dir.components().count() - 1);
    let base = format!("{up}{}", base.display().to_string().trim_start_matches('/'));
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "resources: [{base}]\nimages:\n  - name: ghcr.io/floodgate-dev/floodgate\n    newName: registry.example.com/mirror/floodgate\n    newTag: v9\n"
        ),
    )
    .expect("write overlay");
    let objs = kustomize(&dir);
    let d = of_kind(&objs, "Deployment")[0];
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example.com/mirror/floodgate:v9"
    );
    std::fs::remove_dir_all(&dir).ok();
}

fn tempfile_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("floodgate-overlay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.canonicalize().expect("temp dir")
}

/// The Link CRD's OpenAPI schema as a JSON-schema validator. OpenAPI v3.0 schemas are JSON
/// Schema draft 4 plus keywords a validator ignores (`nullable`, `x-kubernetes-*`).
fn schema_validator() -> jsonschema::Validator {
    let crd = crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("the CRD has a schema");
    let schema = serde_json::to_value(schema).expect("schema serializes");
    jsonschema::draft4::new(&schema).expect("the CRD's schema is a valid JSON schema")
}

/// The instance paths of every schema error.
fn schema_errors(v: &jsonschema::Validator, obj: &Value) -> Vec<String> {
    v.iter_errors(obj)
        .map(|e| e.instance_path().to_string())
        .collect()
}

fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read example");
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).expect("YAML"))
        .collect()
}

fn mk_link(spec: Value) -> Value {
    json!({
        "apiVersion": "floodgate.dev/v1alpha1",
        "kind": "Link",
        "metadata": {"name": "east", "namespace": "floodgate"},
        "spec": spec,
    })
}

#[test]
fn the_crd_schema_accepts_the_examples() {
    let v = schema_validator();
    let examples = manifests().join("examples");
    let mut links = Vec::new();
    for doc in yaml_docs(&examples.join("link-linkerd.yaml")) {
        assert_eq!(doc["kind"], "Link");
        links.push(doc);
    }
    // The standalone file's specs are Link specs too.
    let file = std::fs::read_to_string(examples.join("links.yaml")).expect("links.yaml");
    for l in LinksFile::from_yaml(&file).expect("valid").links {
        links.push(mk_link(serde_json::to_value(&l.spec).expect("spec")));
    }
    assert!(links.len() >= 2);
    for link in &links {
        assert_eq!(schema_errors(&v, link), Vec::<String>::new(), "{link}");
        // And Floodgate's own validation agrees.
        let spec: LinkSpec = serde_json::from_value(link["spec"].clone()).expect("spec parses");
        validate(&spec, "spec").expect("valid");
    }
}

#[test]
fn the_crd_schema_rejects_invalid_links() {
    let v = schema_validator();
    let secret = json!({"kubeconfigSecret": {"name": "cluster-credentials-east"}});
    let cases: Vec<(&str, Value, &str)> = vec![
        ("no remote", json!({}), ""),
        (
            "a cap of zero",
            json!({"remote": secret, "caps": {"maxEndpointsPerService": 0}}),
            "/spec/caps/maxEndpointsPerService",
        ),
        (
            "a duration without a unit",
            json!({"remote": secret, "coalesce": {"quiet": "100"}}),
            "/spec/coalesce/quiet",
        ),
        (
            "a word for a duration",
            json!({"remote": secret, "quarantine": {"when": {"sustainedFor": "a while"}}}),
            "/spec/quarantine/when/sustainedFor",
        ),
        (
            "a string for a number",
            json!({"remote": secret, "rateLimit": {"perLink": {"updatesPerSecond": "fifty", "burst": 100}}}),
            "/spec/rateLimit/perLink/updatesPerSecond",
        ),
        (
            "a bucket without its burst",
            json!({"remote": secret, "rateLimit": {"perService": {"updatesPerSecond": 5}}}),
            "/spec/rateLimit/perService",
        ),
        (
            "an empty Secret name",
            json!({"remote": {"kubeconfigSecret": {"name": ""}}}),
            "/spec/remote/kubeconfigSecret/name",
        ),
        (
            "a selector that is not an object",
            json!({"remote": secret, "select": {"services": "app=web"}}),
            "/spec/select/services",
        ),
    ];
    for (what, spec, path) in cases {
        let errs = schema_errors(&v, &mk_link(spec));
        let want = if path.is_empty() { "/spec" } else { path };
        assert!(
            errs.iter()
                .any(|e| e == want || (path.is_empty() && e.is_empty())),
            "{what}: expected an error at {want:?}, got {errs:?}"
        );
    }
    // A Link without a spec at all.
    let mut no_spec = mk_link(json!({}));
    no_spec.as_object_mut().expect("object").remove("spec");
    assert!(!v.is_valid(&no_spec), "spec is required");
}

#[test]
fn the_cel_rule_is_left_to_validate() {
    // Both remotes at once: the CRD's x-kubernetes-validations rule refuses it in a real API
    // server, but CEL is not JSON schema, so the schema alone accepts it and validate() is what
    // catches it (and reports a status condition in controller mode).
    let v = schema_validator();
    let both = json!({
        "remote": {
            "kubeconfigSecret": {"name": "cluster-credentials-east"},
            "kubeconfigPath": "/etc/east.kubeconfig"
        }
    });
    assert!(v.is_valid(&mk_link(both.clone())));
    let spec: LinkSpec = serde_json::from_value(both).expect("parses");
    let errs = validate(&spec, "spec").expect_err("validate() refuses two remotes");
    assert!(errs.0.iter().any(|e| e.path == "spec.remote"), "{errs:?}");
    // The rule is in the schema for the API server to evaluate.
    let schema = serde_json::to_value(crd().spec.versions[0].schema.clone()).expect("schema");
    assert!(
        schema
            .to_string()
            .contains("has(self.kubeconfigSecret) != has(self.kubeconfigPath)"),
        "the CEL rule is in the CRD"
    );
}
