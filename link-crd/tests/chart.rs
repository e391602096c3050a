//! The Helm chart `charts/floodgate` as `helm template` renders it, against the kustomize base it
//! stands beside: with its default values it renders exactly the objects `kubectl kustomize
//! manifests/` does, with monitoring on exactly those of the base with the monitoring component,
//! and the values people set land where they should. Its copies of the CRD, the alerts and the
//! dashboard are the files of `manifests/`.
//!
//! helm is the one `make helm` builds from its Go module (`charts/helm/build.sh`), or the one
//! `FLOODGATE_HELM` names; without it these tests fail and say how to get it. `make chart-check`
//! runs them after `helm lint`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::Deserialize;
use serde_json::{Value, json};

/// The release's namespace, as the README installs it.
const NS: &str = "floodgate";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository")
}

fn chart() -> PathBuf {
    root().join("charts/floodgate")
}

/// `FLOODGATE_HELM`, or what `make helm` builds into the target directory.
fn helm() -> PathBuf {
    let path = match std::env::var_os("FLOODGATE_HELM") {
        Some(p) => PathBuf::from(p),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| root().join("target"), PathBuf::from)
            .join("helm/bin/helm"),
    };
    assert!(
        path.is_file(),
        "no helm at {}: build it with `make helm` (charts/helm/build.sh, from Go modules), or \
         name one in FLOODGATE_HELM",
        path.display()
    );
    path
}

/// `helm template` of the chart in namespace `ns` with `--set` pairs, CRDs included.
fn helm_template(ns: &str, set: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(helm());
    cmd.args(["template", "floodgate"])
        .arg(chart())
        .args(["--namespace", ns, "--include-crds"]);
    for (k, v) in set {
        cmd.arg("--set").arg(format!("{k}={v}"));
    }
    cmd.output().expect("helm runs")
}

/// The objects the chart renders in `ns` with `set`.
fn render(ns: &str, set: &[(&str, &str)]) -> Vec<Value> {
    let out = helm_template(ns, set);
    assert!(
        out.status.success(),
        "helm template with {set:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    documents(&String::from_utf8(out.stdout).expect("utf-8"))
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
    documents(&String::from_utf8(out.stdout).expect("utf-8"))
}

/// The YAML documents of `text`, empty ones (a template that rendered nothing) left out.
fn documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("each rendered document is YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// `kind namespace/name` of an object.
fn key(o: &Value) -> String {
    let meta = &o["metadata"];
    format!(
        "{} {}/{}",
        o["kind"].as_str().unwrap_or("?"),
        meta["namespace"].as_str().unwrap_or(""),
        meta["name"].as_str().unwrap_or("?")
    )
}

fn by_key(objs: Vec<Value>) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    for o in objs {
        let k = key(&o);
        assert!(map.insert(k.clone(), o).is_none(), "{k} rendered twice");
    }
    map
}

/// Where `a` and `b` first differ (numbers compare by value), or `None`.
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

/// Helm installs `crds/` as it is, untemplated, so the chart's CRD is the file `make crds`
/// writes, without the `part-of` label kustomize's `labels:` adds to everything: the one
/// difference between the two installs, taken out of kustomize's CRD before comparing.
fn without_kustomize_crd_label(mut objs: Vec<Value>) -> Vec<Value> {
    for o in &mut objs {
        if o["kind"] != "CustomResourceDefinition" {
            continue;
        }
        let meta = o["metadata"].as_object_mut().expect("metadata");
        let labels = meta
            .get_mut("labels")
            .and_then(Value::as_object_mut)
            .expect("kustomize labels the CRD");
        assert_eq!(
            labels.remove("app.kubernetes.io/part-of"),
            Some(json!("floodgate"))
        );
        if labels.is_empty() {
            meta.remove("labels");
        }
    }
    objs
}

/// Every object of `want` is in `got`, equal field for field, and nothing else is.
fn assert_same_objects(got: Vec<Value>, want: Vec<Value>) {
    let got = by_key(got);
    let want = by_key(want);
    let got_keys: Vec<&String> = got.keys().collect();
    let want_keys: Vec<&String> = want.keys().collect();
    assert_eq!(got_keys, want_keys, "the chart renders other objects");
    for (k, w) in &want {
        let g = &got[k];
        if let Some(at) = first_difference(g, w, String::new()) {
            panic!(
                "{k} differs at {at}:\n  chart:     {}\n  kustomize: {}",
                pointer(g, &at),
                pointer(w, &at)
            );
        }
    }
}

/// The value at a path of `first_difference`, for messages.
fn pointer(v: &Value, at: &str) -> String {
    let mut cur = Some(v);
    for part in at.split('.').skip(1) {
        let (name, index) = match part.split_once('[') {
            Some((n, i)) => (n, i.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        cur = cur.and_then(|c| c.get(name));
        if let Some(i) = index {
            cur = cur.and_then(|c| c.get(i));
        }
    }
    cur.map_or_else(|| "(absent)".to_owned(), Value::to_string)
}

fn one<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = objs
        .iter()
        .filter(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "one {kind} {name} in {:?}", keys(objs));
    found[0]
}

fn keys(objs: &[Value]) -> Vec<String> {
    objs.iter().map(key).collect()
}

/// A kustomize overlay in a directory of its own: the base and the monitoring component, as
/// docs/monitoring.md adds them (kustomize takes only relative paths to them).
fn monitoring_overlay() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("floodgate-chart-overlay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let dir = dir.canonicalize().expect("temp dir");
    let up = "../".repeat(dir.components().count() - 1);
    let manifests = root().join("manifests");
    let rel = format!(
        "{up}{}",
        manifests.display().to_string().trim_start_matches('/')
    );
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!("resources: [{rel}]\ncomponents: [{rel}/monitoring]\n"),
    )
    .expect("write overlay");
    dir
}

#[test]
fn the_default_values_render_the_kustomize_base() {
    let chart = render(NS, &[]);
    let base = without_kustomize_crd_label(kustomize(&root().join("manifests")));
    assert_same_objects(chart, base);
}

#[test]
fn with_monitoring_on_it_renders_the_base_with_the_monitoring_component() {
    let chart = render(
        NS,
        &[
            ("monitoring.prometheusRule.enabled", "true"),
            ("monitoring.podMonitor.enabled", "true"),
            ("monitoring.dashboard.enabled", "true"),
        ],
    );
    let overlay = monitoring_overlay();
    let want = without_kustomize_crd_label(kustomize(&overlay));
    std::fs::remove_dir_all(&overlay).ok();
    for kind in ["PrometheusRule", "PodMonitor", "ConfigMap"] {
        assert!(
            want.iter().any(|o| o["kind"] == kind),
            "{kind} in the overlay"
        );
    }
    assert_same_objects(chart, want);
}

#[test]
fn the_charts_copies_are_the_files_of_the_manifests() {
    for (copy, original) in [
        (
            "crds/links.floodgate.dev.yaml",
            "manifests/crds/links.floodgate.dev.yaml",
        ),
        (
            "files/floodgate.rules.yaml",
            "manifests/monitoring/floodgate.rules.yaml",
        ),
        (
            "files/floodgate-dashboard.json",
            "manifests/monitoring/floodgate-dashboard.json",
        ),
    ] {
        let read = |p: &Path| {
            std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        };
        assert!(
            read(&chart().join(copy)) == read(&root().join(original)),
            "charts/floodgate/{copy} is not {original}: `cp {original} charts/floodgate/{copy}`"
        );
    }
}

/// The values people set most, each where it belongs: replicas, image, a credentials
/// namespace of their own, a controller flag, the admin token Secret, monitoring with their
/// Prometheus's labels, in a namespace other than `floodgate`.
#[test]
fn values_land_where_they_should() {
    let ns = "gateway";
    let objs = render(
        ns,
        &[
            ("replicas", "3"),
            ("image.repository", "registry.example.com/mirror/floodgate"),
            ("image.tag", "v9"),
            ("image.pullPolicy", "Always"),
            ("resources.limits.memory", "1Gi"),
            ("credentials.namespace", "link-secrets"),
            ("controller.leaseDuration", "30s"),
            ("controller.leaseRenew", "10s"),
            ("controller.logLevel", "debug"),
            ("adminToken.secretName", "my-admin-token"),
            ("adminToken.create", "true"),
            ("adminToken.value", "s3cret"),
            ("monitoring.prometheusRule.enabled", "true"),
            (
                "monitoring.prometheusRule.labels.release",
                "kube-prometheus-stack",
            ),
            ("monitoring.dashboard.enabled", "true"),
        ],
    );
    // Every object is in the release's namespace but the credentials' own.
    for o in &objs {
        let meta = &o["metadata"];
        match o["kind"].as_str().unwrap_or_default() {
            "CustomResourceDefinition" => {}
            "Namespace" => assert!(meta["name"] == ns || meta["name"] == "link-secrets"),
            _ if meta["name"] == "floodgate-credentials" => {
                assert_eq!(meta["namespace"], "link-secrets", "{}", key(o));
            }
            _ => assert_eq!(meta["namespace"], ns, "{}", key(o)),
        }
    }
    let ns_obj = one(&objs, "Namespace", ns);
    assert_eq!(
        ns_obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let binding = one(&objs, "RoleBinding", "floodgate-credentials");
    assert_eq!(
        binding["subjects"][0],
        json!({"kind": "ServiceAccount", "name": "floodgate", "namespace": ns})
    );

    let d = one(&objs, "Deployment", "floodgate");
    assert_eq!(d["spec"]["replicas"], 3);
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "registry.example.com/mirror/floodgate:v9");
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(c["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(
        c["resources"]["requests"]["memory"], "128Mi",
        "the rest kept"
    );
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in [
        "--credentials-namespace=link-secrets",
        "--lease-duration=30s",
        "--lease-renew=10s",
    ] {
        assert!(args.contains(&want), "{want} in {args:?}");
    }
    assert!(
        !args.iter().any(|a| a.starts_with("--max-connections")),
        "flags left unset are not passed: {args:?}"
    );
    let env = c["env"].as_array().expect("env");
    assert!(env.contains(&json!({"name": "FLOODGATE_LOG", "value": "debug"})));
    let volumes = d["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes");
    let admin = volumes
        .iter()
        .find(|v| v["name"] == "admin-token")
        .expect("the admin token's volume");
    assert_eq!(admin["secret"]["secretName"], "my-admin-token");

    let token = one(&objs, "Secret", "my-admin-token");
    assert_eq!(token["data"]["token"], "czNjcmV0", "base64 of s3cret");

    let rule = one(&objs, "PrometheusRule", "floodgate");
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    assert!(
        rule["spec"]["groups"][0]["rules"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    );
    let dashboard = one(&objs, "ConfigMap", "floodgate-dashboard");
    let json: Value = serde_json::from_str(
        dashboard["data"]["floodgate-dashboard.json"]
            .as_str()
            .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    assert!(json["title"].is_string(), "a dashboard with a title");
    assert!(
        !objs.iter().any(|o| o["kind"] == "PodMonitor"),
        "the PodMonitor stays off"
    );
}

#[test]
fn one_replica_gets_no_disruption_budget_and_switches_leave_objects_out() {
    let objs = render(
        NS,
        &[
            ("replicas", "1"),
            ("createNamespace", "false"),
            ("credentials.createNamespace", "false"),
            ("networkPolicy.enabled", "false"),
        ],
    );
    for kind in [
        "PodDisruptionBudget",
        "Namespace",
        "NetworkPolicy",
        "Secret",
    ] {
        assert!(
            !objs.iter().any(|o| o["kind"] == kind),
            "no {kind}: {:?}",
            keys(&objs)
        );
    }
    assert_eq!(one(&objs, "Deployment", "floodgate")["spec"]["replicas"], 1);
    let np = render(
        NS,
        &[("networkPolicy.consumerNamespaces", "{linkerd,mesh}")],
    );
    let consumers = &one(&np, "NetworkPolicy", "floodgate")["spec"]["ingress"][0]["from"][0];
    assert_eq!(
        consumers["namespaceSelector"]["matchExpressions"][0]["values"],
        json!(["linkerd", "mesh"])
    );
}

/// Values that would hurt are refused, saying why: owning (labelling, deleting on uninstall) a
/// shared namespace, and credentials in the namespace of the admin token.
#[test]
fn values_that_would_hurt_are_refused() {
    for (ns, set, says) in [
        ("default", vec![], "install it in a namespace of its own"),
        (
            "kube-system",
            vec![],
            "install it in a namespace of its own",
        ),
        (
            NS,
            vec![("credentials.namespace", "default")],
            "would own the namespace \"default\" (credentials.createNamespace)",
        ),
        (
            NS,
            vec![("credentials.namespace", NS)],
            "give the links' Secrets a namespace of their own",
        ),
    ] {
        let out = helm_template(ns, &set);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{ns} {set:?} rendered");
        assert!(err.contains(says), "{ns} {set:?}: {err}");
    }
    // A shared namespace the chart does not own is fine.
    render("default", &[("createNamespace", "false")]);
}
