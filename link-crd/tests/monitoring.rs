//! The monitoring component, `manifests/monitoring/`, as a user gets it: the alerts as a
//! Prometheus rules file and the same groups in a `PrometheusRule`, each alert documented and
//! unit-tested; the Grafana dashboard, every panel with a query that `promtool` accepts; the
//! overlay of docs/monitoring.md rendered by `kubectl kustomize`; and `metrics.txt`, every
//! metric the alerts and the dashboard read, which the gateway's tests check Floodgate serves.
//!
//! The rules' behaviour is `promtool test rules`' business (`make monitoring-check`); here are
//! the checks that tie the files to each other and to the docs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::ConfigMap;
use serde::Deserialize;
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository")
}

fn monitoring() -> PathBuf {
    root().join("manifests/monitoring")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn yaml(path: &Path) -> Value {
    serde_yaml::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rules_file() -> Value {
    yaml(&monitoring().join("floodgate.rules.yaml"))
}

fn dashboard() -> Value {
    let path = monitoring().join("floodgate-dashboard.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every rule of a rules file's `groups`.
fn rules(groups: &Value) -> Vec<&Value> {
    groups
        .as_array()
        .expect("groups is a list")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("a group has rules"))
        .collect()
}

fn alerts(groups: &Value) -> Vec<&Value> {
    rules(groups)
        .into_iter()
        .filter(|r| r.get("alert").is_some())
        .collect()
}

/// Every panel, those inside collapsed rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for p in dashboard["panels"]
        .as_array()
        .expect("the dashboard has panels")
    {
        all.push(p);
        all.extend(p["panels"].as_array().into_iter().flatten());
    }
    all
}

/// The PromQL of every dashboard panel's targets.
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    panels(dashboard)
        .into_iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect()
}

/// The query of each templating variable that has one (a string, or Grafana 10's object).
fn variable_queries(dashboard: &Value) -> Vec<String> {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
        .filter_map(|v| {
            v["query"]
                .as_str()
                .or_else(|| v["query"]["query"].as_str())
                .map(str::to_owned)
        })
        .collect()
}

/// Floodgate's metric names in a PromQL expression: identifiers starting with `floodgate_`, a
/// histogram's `_bucket`, `_sum` and `_count` series by the histogram's name.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    for (at, _) in expr.match_indices("floodgate_") {
        if expr[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let rest = &expr[at..];
        let name = &rest[..rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len())];
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.insert(name.to_owned());
    }
    names
}

#[test]
fn metric_names_are_found_in_promql() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (link, le) (rate(floodgate_publication_delay_seconds_bucket{link=~"$link"}[5m]))) > 5 or floodgate_watchers / floodgate_watchers_limit unless up{job="floodgate_x"} or notfloodgate_y"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "floodgate_publication_delay_seconds",
            "floodgate_watchers",
            "floodgate_watchers_limit",
            // A label value is not told apart from a name: keep such values out of the queries.
            "floodgate_x",
        ]
    );
}

#[test]
fn the_prometheus_rule_has_the_rules_files_groups() {
    let rule = yaml(&monitoring().join("prometheusrule.yaml"));
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    assert_eq!(rule["metadata"]["namespace"], "floodgate");
    assert!(
        rule["spec"]["groups"] == rules_file()["groups"],
        "prometheusrule.yaml's groups differ from floodgate.rules.yaml's: run `make monitoring-rules`"
    );
}

#[test]
fn every_alert_has_a_severity_a_summary_a_description_naming_the_link_and_a_runbook() {
    let file = rules_file();
    let alerts = alerts(&file["groups"]);
    assert!(alerts.len() >= 8, "the alerts of issue 36 are all there");
    let docs = read(&root().join("docs/monitoring.md"));
    for a in alerts {
        let name = a["alert"].as_str().expect("an alert's name is a string");
        let severity = &a["labels"]["severity"];
        assert!(
            severity == "critical" || severity == "warning",
            "{name}: severity {severity}"
        );
        assert!(
            a["for"].is_string(),
            "{name} fires on a sustained condition"
        );
        for annotation in ["summary", "description"] {
            assert!(
                a["annotations"][annotation]
                    .as_str()
                    .is_some_and(|s| !s.trim().is_empty()),
                "{name} has no {annotation}"
            );
        }
        let description = a["annotations"]["description"].as_str().unwrap_or_default();
        assert!(
            description.contains("$labels.link"),
            "{name}'s description names the link"
        );
        let anchor = name.to_lowercase();
        assert_eq!(
            a["annotations"]["runbook_url"],
            format!(
                "https://github.com/floodgate-dev/floodgate/blob/main/docs/monitoring.md#{anchor}"
            ),
            "{name}'s runbook"
        );
        assert!(
            docs.contains(&format!("\n### {name}\n")),
            "docs/monitoring.md has no runbook section for {name}"
        );
    }
}

#[test]
fn every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() {
    let file = rules_file();
    let tests = yaml(&monitoring().join("floodgate.rules.test.yaml"));
    assert_eq!(tests["rule_files"][0], "floodgate.rules.yaml");
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .collect();
    for a in alerts(&file["groups"]) {
        let name = &a["alert"];
        let fired = |yes: bool| {
            cases.iter().any(|c| {
                c["alertname"] == *name
                    && c["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()) == yes
            })
        };
        assert!(fired(true), "no unit test fires {name}");
        assert!(fired(false), "no unit test checks {name} stays silent");
    }
}

#[test]
fn every_dashboard_panel_has_a_query_for_the_chosen_links() {
    let d = dashboard();
    assert!(d["uid"].is_string() && d["title"].is_string());
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .expect("templating variables")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(vars.contains(&"link"), "a `link` variable: {vars:?}");
    let panels = panels(&d);
    assert!(!panels.is_empty());
    let mut ids = BTreeSet::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?");
        assert!(ids.insert(p["id"].to_string()), "{title}: id used twice");
        assert!(p["gridPos"]["w"].is_u64(), "{title} has a place");
        let exprs: Vec<&str> = p["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["expr"].as_str())
            .filter(|e| !e.trim().is_empty())
            .collect();
        assert!(!exprs.is_empty(), "panel {title} has no query");
        for e in exprs {
            // Per link: every query of a link's series follows the variable.
            assert!(
                e.contains(r#"link=~"$link""#) || e.contains("floodgate_build_info"),
                "{title}: {e} ignores the `link` variable"
            );
        }
    }
}

/// `promtool check rules` on a rules file of one recording rule per dashboard query, Grafana's
/// variables replaced by what they stand for: a query Prometheus would refuse fails here
/// instead of as an empty panel.
#[test]
fn promtool_accepts_every_dashboard_query() {
    let d = dashboard();
    let mut exprs = dashboard_exprs(&d);
    exprs.extend(
        variable_queries(&d)
            .into_iter()
            .filter_map(label_values_metric),
    );
    let rules: Vec<Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let expr = e.replace("$__rate_interval", "5m").replace("$link", ".*");
            serde_json::json!({"record": format!("dashboard:query{i}"), "expr": expr})
        })
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = temp_dir("dashboard-rules");
    let path = dir.join("dashboard.rules.yaml");
    std::fs::write(&path, serde_json::to_string(&file).expect("JSON")).expect("write rules");
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .expect("promtool is installed (`make prereqs`, Debian's prometheus package)");
    assert!(
        out.status.success(),
        "promtool refuses a dashboard query: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// The metric of `label_values(METRIC, label)`, a query PromQL would check.
fn label_values_metric(query: String) -> Option<String> {
    let inner = query.strip_prefix("label_values(")?;
    Some(inner.split(',').next()?.trim().to_owned())
}

#[test]
fn metrics_txt_lists_every_metric_the_alerts_and_the_dashboard_read() {
    let file = rules_file();
    let d = dashboard();
    let exprs = rules(&file["groups"])
        .into_iter()
        .map(|r| r["expr"].as_str().expect("a rule's expr").to_owned())
        .chain(dashboard_exprs(&d))
        .chain(variable_queries(&d));
    let used: BTreeSet<String> = exprs.flat_map(|e| metric_names(&e)).collect();
    let want: String = used.iter().map(|n| format!("{n}\n")).collect();
    let path = monitoring().join("metrics.txt");
    assert!(
        read(&path) == want,
        "{} is not what the rules and the dashboard read; write this into it:\n{want}",
        path.display()
    );
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

fn temp_dir(what: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("floodgate-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.canonicalize().expect("temp dir")
}

/// The overlay docs/monitoring.md gives a user: the first YAML block of "Adding the component".
fn documented_overlay() -> String {
    let docs = read(&root().join("docs/monitoring.md"));
    let section = docs
        .split("\n## Adding the component\n")
        .nth(1)
        .expect("docs/monitoring.md has a section \"Adding the component\"");
    let block = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("the section opens with a YAML block");
    block.to_owned()
}

#[test]
fn the_documented_overlay_renders_with_the_component() {
    let dir = temp_dir("monitoring-overlay");
    // kustomize takes only relative paths to a base; the repository's URL becomes this checkout.
    let up = "../".repeat(dir.components().count() - 1);
    let checkout = format!(
        "{up}{}/",
        root().display().to_string().trim_start_matches('/')
    );
    let overlay = documented_overlay();
    assert!(overlay.contains("components:"), "{overlay}");
    let overlay = overlay
        .replace("github.com/floodgate-dev/floodgate//", &checkout)
        .replace("?ref=v0.1.0", "");
    std::fs::write(dir.join("kustomization.yaml"), &overlay).expect("write overlay");
    let objs = kustomize(&dir);
    std::fs::remove_dir_all(&dir).ok();

    let named = |kind: &str, name: &str| {
        objs.iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
    };
    // The base is all there, with the component beside it.
    named("Deployment", "floodgate");

    let rule = named("PrometheusRule", "floodgate");
    assert_eq!(rule["metadata"]["namespace"], "floodgate");
    assert!(rule["spec"]["groups"] == rules_file()["groups"]);
    let monitor = named("PodMonitor", "floodgate");
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"], "admin");
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "floodgate"
    );
    // The documented patch adds the label Prometheus selects rules and monitors by.
    for o in [rule, monitor] {
        assert_eq!(o["metadata"]["labels"]["release"], "kube-prometheus-stack");
    }

    let cm: ConfigMap = serde_json::from_value(named("ConfigMap", "floodgate-dashboard").clone())
        .expect("a ConfigMap");
    assert_eq!(cm.metadata.namespace.as_deref(), Some("floodgate"));
    let labels = cm.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("grafana_dashboard").map(String::as_str),
        Some("1")
    );
    let json = cm
        .data
        .unwrap_or_default()
        .remove("floodgate-dashboard.json")
        .expect("the dashboard in the ConfigMap");
    let rendered: Value = serde_json::from_str(&json).expect("the dashboard's JSON");
    assert!(rendered == dashboard());
}
