//! Pods trimmed to the fields their consumers read, at the upstream edge, before the engine
//! holds them. Pods are the kind a remote has most of, and most of a pod's JSON (volumes,
//! images, probes, resources, tolerations, affinity, container states, managed fields) is read
//! by nobody Floodgate serves. A trimmed pod is then held as a [`crate::model::PodObject`]:
//! the JSON of these fields, beside its name and its ReplicaSet owners.
//!
//! What is kept, from what Linkerd's destination controller (endpoint translation, workload
//! and opaque-ports lookups, identity) and the facade's own views read (docs/internals.md, "What
//! Floodgate keeps of a pod", says the same for operators):
//! - `metadata`: name, namespace, uid, resourceVersion, creationTimestamp, deletionTimestamp,
//!   labels, annotations (opaque ports, proxy settings), ownerReferences (the workload);
//! - `spec`: nodeName, serviceAccountName (the identity), hostNetwork, and of each container
//!   and init container (a native sidecar proxy is one) its name, ports (named ports, host
//!   ports) and restartPolicy; the `linkerd-proxy` container keeps its env (its listen ports);
//! - `status`: phase, conditions (Ready), podIP, podIPs, hostIP, hostIPs, and of each
//!   container status its name, ready, started and restartCount (kubectl's READY and
//!   RESTARTS columns; `image` and `imageID`, required by the type, are left empty).

//!
//! EndpointSlices and Endpoints are held with every field (the cap chooses among all of a
//! service's endpoints, and Linkerd reads nearly every field of a kept one), each endpoint or
//! address as its JSON ([`crate::model::SliceObject`], [`crate::model::EndpointsObject`]); the
//! slices of a service over the cap deflated ([`crate::model::DeflatedSlice`]). Every kept
//! object's metadata (a ReplicaSet's is all Floodgate holds of it) has its owner references
//! and finalizers shrunk to their length: a decoder grows a vector by doubling from four.

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Endpoints, Pod, PodSpec, PodStatus};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::model::{EndpointsObject, SliceObject};

/// The proxy container whose environment is kept.
const PROXY: &str = "linkerd-proxy";

/// `p` with only the fields listed in the module docs.
pub fn pod(p: Pod) -> Pod {
    let mut m = p.metadata;
    metadata(&mut m);
    Pod {
        metadata: ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            labels: m.labels,
            annotations: m.annotations,
            owner_references: m.owner_references,
            ..ObjectMeta::default()
        },
        spec: p.spec.map(|s| PodSpec {
            node_name: s.node_name,
            service_account_name: s.service_account_name,
            host_network: s.host_network,
            containers: s.containers.into_iter().map(container).collect(),
            init_containers: s
                .init_containers
                .map(|c| c.into_iter().map(container).collect()),
            ..PodSpec::default()
        }),
        status: p.status.map(|s| PodStatus {
            phase: s.phase,
            conditions: s.conditions,
            pod_ip: s.pod_ip,
            pod_ips: s.pod_ips,
            host_ip: s.host_ip,
            host_ips: s.host_ips,
            container_statuses: s
                .container_statuses
                .map(|c| c.into_iter().map(container_status).collect()),
            ..PodStatus::default()
        }),
    }
}

/// `m`'s vectors shrunk to their length: a decoder grows a vector from four, so one owner
/// reference held room for four (about 700 bytes an object).
fn metadata(m: &mut ObjectMeta) {
    if let Some(v) = &mut m.owner_references {
        v.shrink_to_fit();
    }
    if let Some(v) = &mut m.finalizers {
        v.shrink_to_fit();
    }
}

/// A ReplicaSet's metadata (all Floodgate holds of one) with its vectors shrunk: a remote keeps
/// ten old ReplicaSets a Deployment, each with an owner reference.
pub fn replica_set(mut m: ObjectMeta) -> ObjectMeta {
    metadata(&mut m);
    m
}

/// `s` as it is held: its JSON, with its name and service beside it.
pub fn slice(s: EndpointSlice) -> SliceObject {
    s.into()
}

/// `e` as it is held: its metadata's vectors shrunk, its addresses as their JSON.
pub fn endpoints(mut e: Endpoints) -> EndpointsObject {
    metadata(&mut e.metadata);
    e.into()
}

fn container(c: Container) -> Container {
    Container {
        env: if c.name == PROXY { c.env } else { None },
        name: c.name,
        ports: c.ports,
        restart_policy: c.restart_policy,
        ..Container::default()
    }
}

fn container_status(c: ContainerStatus) -> ContainerStatus {
    ContainerStatus {
        name: c.name,
        ready: c.ready,
        started: c.started,
        restart_count: c.restart_count,
        ..ContainerStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// Every key path of `v` (array items under `[]`).
    fn paths(v: &Value, at: &str, out: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let p = format!("{at}.{k}");
                    out.insert(p.clone());
                    paths(v, &p, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| paths(v, &format!("{at}[]"), out)),
            _ => {}
        }
    }

    #[test]
    fn held_objects_have_no_spare_room() {
        let endpoint = |i: u32| {
            json!({"addresses": [format!("10.0.0.{i}")], "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "name": format!("web-{i}"), "namespace": "prod"}})
        };
        // Decoded from text, as a watch event is (a `Value` knows its lengths; text does not).
        let text = json!({
            "metadata": {"name": "web-1", "namespace": "prod", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "u1"}]},
            "addressType": "IPv4",
            "endpoints": (0..100).map(endpoint).collect::<Vec<_>>(),
            "ports": [{"name": "http", "port": 8080}]
        })
        .to_string();
        let s: EndpointSlice = serde_json::from_str(&text).expect("a slice");
        let room = |s: &EndpointSlice| s.endpoints.as_ref().map_or(0, Vec::capacity);
        assert!(room(&s) > 100, "the decoder leaves room");
        let s = slice(s);
        assert_eq!(s.endpoints().len(), 100, "all its endpoints held");
        assert_eq!(s.metadata().owner_references.map(|o| o.len()), Some(1));
        let owners = |m: &ObjectMeta| m.owner_references.as_ref().map(Vec::capacity);
        // A pod's and a ReplicaSet's metadata, each decoded from text.
        let owned = || -> Pod {
            serde_json::from_str(
                &json!({"metadata": {"name": "web-1", "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7c", "uid": "u2"}]}})
                .to_string(),
            )
            .expect("a pod")
        };
        let (p, rs) = (owned(), owned().metadata);
        assert!(owners(&p.metadata) > Some(1), "the decoder leaves room");
        assert!(owners(&rs) > Some(1), "the decoder leaves room");
        assert_eq!(owners(&pod(p).metadata), Some(1));
        assert_eq!(owners(&replica_set(rs)), Some(1));

        let text = json!({
            "metadata": {"name": "web", "namespace": "prod"},
            "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "notReadyAddresses": [{"ip": "10.0.0.2"}],
                "ports": [{"port": 8080}]}]
        })
        .to_string();
        let e: Endpoints = serde_json::from_str(&text).expect("an Endpoints");
        let e = endpoints(e);
        let subsets = e.subsets();
        assert_eq!(subsets.len(), 1);
        assert_eq!(
            subsets[0].addresses().count(),
            2,
            "held as boxed slices, no room"
        );
        assert_eq!(subsets[0].ports.as_ref().map(Vec::capacity), Some(1));
    }

    #[test]
    fn a_trimmed_pod_keeps_exactly_the_listed_fields() {
        let full = json!({
            "metadata": {"name": "web-0", "namespace": "prod", "uid": "u", "resourceVersion": "7",
                "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"app": "web"}, "annotations": {"config.linkerd.io/opaque-ports": "4000"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "r"}],
                "finalizers": ["x"], "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "n1", "serviceAccountName": "web", "hostNetwork": false,
                "volumes": [{"name": "v"}], "tolerations": [{"key": "k"}],
                "containers": [
                    {"name": "app", "image": "web:1", "env": [{"name": "SECRET", "value": "s"}],
                     "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                     "resources": {"limits": {"cpu": "1"}}},
                    {"name": "linkerd-proxy", "image": "proxy:1",
                     "env": [{"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "0.0.0.0:4143"}]}
                ]},
            "status": {"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}],
                "hostIP": "192.168.0.1", "qosClass": "Burstable", "startTime": "2026-01-01T00:00:00Z",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "app", "ready": true, "restartCount": 2, "image": "web:1",
                    "imageID": "sha", "state": {"running": {}}}]}
        });
        let p: Pod = serde_json::from_value(full).expect("a pod");
        let trimmed = serde_json::to_value(pod(p)).expect("json");
        let mut got = std::collections::BTreeSet::new();
        paths(&trimmed, "", &mut got);
        let want: std::collections::BTreeSet<String> = [
            ".apiVersion",
            ".kind",
            ".metadata",
            ".metadata.name",
            ".metadata.namespace",
            ".metadata.uid",
            ".metadata.resourceVersion",
            ".metadata.creationTimestamp",
            ".metadata.labels",
            ".metadata.labels.app",
            ".metadata.annotations",
            ".metadata.annotations.config.linkerd.io/opaque-ports",
            ".metadata.ownerReferences",
            ".metadata.ownerReferences[].apiVersion",
            ".metadata.ownerReferences[].kind",
            ".metadata.ownerReferences[].name",
            ".metadata.ownerReferences[].uid",
            ".spec",
            ".spec.nodeName",
            ".spec.serviceAccountName",
            ".spec.hostNetwork",
            ".spec.containers",
            ".spec.containers[].name",
            ".spec.containers[].ports",
            ".spec.containers[].ports[].name",
            ".spec.containers[].ports[].containerPort",
            ".spec.containers[].ports[].protocol",
            ".spec.containers[].env",
            ".spec.containers[].env[].name",
            ".spec.containers[].env[].value",
            ".status",
            ".status.phase",
            ".status.podIP",
            ".status.podIPs",
            ".status.podIPs[].ip",
            ".status.hostIP",
            ".status.conditions",
            ".status.conditions[].type",
            ".status.conditions[].status",
            ".status.containerStatuses",
            ".status.containerStatuses[].name",
            ".status.containerStatuses[].ready",
            ".status.containerStatuses[].restartCount",
            ".status.containerStatuses[].image",
            ".status.containerStatuses[].imageID",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        assert_eq!(
            got,
            want,
            "extra: {:?}, missing: {:?}",
            got.difference(&want),
            want.difference(&got)
        );
        assert_eq!(
            trimmed["spec"]["containers"][0].get("env"),
            None,
            "only the proxy keeps env"
        );
        assert_eq!(
            trimmed["spec"]["containers"][1]["env"][0]["name"],
            "LINKERD2_PROXY_INBOUND_LISTEN_ADDR"
        );
    }
}
