//! The discovery documents that describe the resources the facade serves (`/api`, `/apis`,
//! each group-version's `APIResourceList`), and the Table kubectl shows of each kind. What each
//! resource is (its group, version, names and columns) is its kind's [`KindDef`].

use serde_json::{Value, json};

use crate::model::{Kind, KindDef};

/// The verbs a read-only resource supports.
const READ_VERBS: [&str; 3] = ["get", "list", "watch"];

/// `GET /version` when the upstream's is not known yet.
pub fn default_version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-floodgate",
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "", "compiler": "", "platform": "linux/amd64",
    })
}

/// `GET /api`.
pub fn api_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": "" }],
    })
}

/// `GET /apis`: the groups of the served resources, plus authorization for access reviews.
pub fn api_group_list(served: &[&'static KindDef]) -> Value {
    let mut groups: Vec<(&str, &str)> = served
        .iter()
        .filter(|r| !r.group.is_empty())
        .map(|r| (r.group, r.version))
        .collect();
    groups.push(("authorization.k8s.io", "v1"));
    groups.sort();
    groups.dedup();
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, v)| {
            let gv = json!({ "groupVersion": format!("{g}/{v}"), "version": v });
            json!({ "name": g, "versions": [gv.clone()], "preferredVersion": gv })
        })
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// `GET /api/v1` or `GET /apis/{group}/{version}`, or `None` when nothing is served there.
pub fn resource_list(group: &str, version: &str, served: &[&'static KindDef]) -> Option<Value> {
    let mut resources: Vec<Value> = served
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .map(|r| {
            json!({
                "name": r.plural, "singularName": r.singular, "namespaced": true,
                "kind": r.name, "verbs": READ_VERBS, "shortNames": r.short_names,
            })
        })
        .collect();
    if group == "authorization.k8s.io" && version == "v1" {
        resources.push(json!({
            "name": "selfsubjectaccessreviews", "singularName": "selfsubjectaccessreview",
            "namespaced": false, "kind": "SelfSubjectAccessReview", "verbs": ["create"],
        }));
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": group_version, "resources": resources,
    }))
}

/// Table column definitions for a kind, as kubectl prints them.
pub fn table_columns(kind: Kind) -> Vec<Value> {
    let names = kind.def().columns;
    names
        .iter()
        .map(|(name, ty)| {
            json!({ "name": name, "type": ty, "format": if *ty == "name" { "name" } else { "" }, "description": "", "priority": 0 })
        })
        .collect()
}

/// A Table row's cells for an object (as JSON).
pub fn table_cells(kind: Kind, o: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let name = o["metadata"]["name"].clone();
    let age = Value::String(age(&o["metadata"]["creationTimestamp"], now));
    // kubectl's printers show three entries and count the rest.
    let join = |items: Vec<String>, none: &str| match items.len() {
        0 => none.to_owned(),
        1..=3 => items.join(","),
        n => format!("{} + {} more...", items[..3].join(","), n - 3),
    };
    match kind {
        Kind::Service => {
            let ports: Vec<String> = arr(&o["spec"]["ports"])
                .iter()
                .map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP")))
                .collect();
            vec![
                name,
                o["spec"]["type"].as_str().unwrap_or("ClusterIP").into(),
                o["spec"]["clusterIP"].as_str().unwrap_or("<none>").into(),
                join(ports, "<none>").into(),
                age,
            ]
        }
        Kind::EndpointSlice => {
            let ports: Vec<String> = arr(&o["ports"])
                .iter()
                .map(|p| p["port"].to_string())
                .collect();
            let addrs: Vec<String> = arr(&o["endpoints"])
                .iter()
                .flat_map(|e| {
                    arr(&e["addresses"])
                        .iter()
                        .filter_map(|a| a.as_str().map(str::to_owned))
                        .collect::<Vec<_>>()
                })
                .collect();
            vec![
                name,
                o["addressType"].clone(),
                join(ports, "<unset>").into(),
                join(addrs, "<unset>").into(),
                age,
            ]
        }
        Kind::Endpoints => {
            let addrs: Vec<String> = arr(&o["subsets"])
                .iter()
                .flat_map(|s| {
                    let port = arr(&s["ports"]).first().map(|p| p["port"].to_string());
                    arr(&s["addresses"])
                        .iter()
                        .filter_map(|a| a["ip"].as_str())
                        .map(|ip| match &port {
                            Some(p) => format!("{ip}:{p}"),
                            None => ip.to_owned(),
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            vec![name, join(addrs, "<none>").into(), age]
        }
        Kind::Pod => {
            let statuses = arr(&o["status"]["containerStatuses"]);
            let ready = statuses
                .iter()
                .filter(|c| c["ready"].as_bool() == Some(true))
                .count();
            let restarts: i64 = statuses
                .iter()
                .filter_map(|c| c["restartCount"].as_i64())
                .sum();
            vec![
                name,
                format!("{ready}/{}", statuses.len()).into(),
                o["status"]["phase"].as_str().unwrap_or("Unknown").into(),
                restarts.into(),
                age,
            ]
        }
        Kind::ReplicaSet | Kind::Server => vec![name, age],
        Kind::ConfigMap => {
            let keys = |f: &str| o[f].as_object().map_or(0, serde_json::Map::len);
            vec![name, (keys("data") + keys("binaryData")).into(), age]
        }
    }
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// kubectl's short age: `42s`, `5m`, `3h`, `2d`.
fn age(created: &Value, now: jiff::Timestamp) -> String {
    let Some(t) = created
        .as_str()
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
    else {
        return "<unknown>".to_owned();
    };
    let secs = now.as_second().saturating_sub(t.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}
