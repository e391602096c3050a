//! The protobuf forms decode with `k8s-pb` to what the JSON forms say.

use std::sync::Arc;

use k8s_pb::api::core::v1 as pb_core;
use k8s_pb::api::discovery::v1 as pb_discovery;
use prost::Message;
use serde_json::json;

use super::*;
use crate::model::PodObject;

fn service() -> Object {
    Object::Service(Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u-1",
                "labels": {"app": "web"}, "annotations": {"mirror.linkerd.io/exported": "true"},
                "creationTimestamp": "2026-01-02T03:04:05Z", "finalizers": ["f"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "Thing", "name": "t", "uid": "u-2", "controller": true}]},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.7", "clusterIPs": ["10.96.0.7"],
                "selector": {"app": "web"}, "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                          {"name": "admin", "port": 9990, "targetPort": "admin-http", "appProtocol": "http"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4", "ports": [{"port": 80, "protocol": "TCP"}]}]},
                "conditions": [{"type": "Ready", "status": "True", "reason": "R", "message": "m",
                    "lastTransitionTime": "2026-01-02T03:04:06Z"}]}
        }))
        .expect("a service"),
    ))
}

fn slice() -> Object {
    Object::EndpointSlice(
        serde_json::from_value::<crate::model::SliceObject>(json!({
            "metadata": {"name": "web-abc", "namespace": "prod",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": "n1", "zone": "z1", "hints": {"forZones": [{"name": "z1"}]},
                "targetRef": {"kind": "Pod", "name": "web-0", "namespace": "prod", "uid": "p-0"}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }))
        .expect("a slice")
        .into(),
    )
}

fn open_item(envelope: &[u8], api_version: &str, kind: &str) -> Vec<u8> {
    let unknown = open(envelope).expect("an envelope");
    let tm = unknown.type_meta.expect("typeMeta");
    assert_eq!(
        (tm.api_version.as_deref(), tm.kind.as_deref()),
        (Some(api_version), Some(kind))
    );
    unknown.raw.expect("raw")
}

#[test]
fn a_service_decodes_to_what_its_json_says() {
    let bytes = item(&service(), 42).expect("services have a protobuf form");
    let s = pb_core::Service::decode(bytes.as_slice()).expect("decodes");
    let m = s.metadata.expect("metadata");
    assert_eq!(m.name.as_deref(), Some("web"));
    assert_eq!(
        m.resource_version.as_deref(),
        Some("42"),
        "Floodgate's version"
    );
    assert_eq!(m.labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(m.finalizers, ["f"]);
    assert_eq!(m.owner_references[0].controller, Some(true));
    let created =
        jiff::Timestamp::from_second(m.creation_timestamp.and_then(|t| t.seconds).expect("time"))
            .expect("a time");
    assert_eq!(created.to_string(), "2026-01-02T03:04:05Z");
    let spec = s.spec.expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.7"));
    assert_eq!(spec.selector.get("app").map(String::as_str), Some("web"));
    assert_eq!(spec.ip_families, ["IPv4"]);
    assert_eq!(
        spec.session_affinity_config
            .and_then(|c| c.client_ip)
            .and_then(|c| c.timeout_seconds),
        Some(60)
    );
    let numbered = spec.ports[0].target_port.as_ref().expect("targetPort");
    assert_eq!((numbered.r#type, numbered.int_val), (Some(0), Some(8080)));
    let named = spec.ports[1].target_port.as_ref().expect("targetPort");
    assert_eq!(
        (named.r#type, named.str_val.as_deref()),
        (Some(1), Some("admin-http"))
    );
    assert_eq!(spec.ports[1].app_protocol.as_deref(), Some("http"));
    let status = s.status.expect("status");
    let ingress = &status.load_balancer.expect("lb").ingress[0];
    assert_eq!(
        (ingress.ip.as_deref(), ingress.ports[0].port),
        (Some("1.2.3.4"), Some(80))
    );
    assert_eq!(status.conditions[0].reason.as_deref(), Some("R"));
}

#[test]
fn an_endpoint_slice_and_endpoints_decode_to_what_their_json_says() {
    let bytes = item(&slice(), 7).expect("a form");
    let s = pb_discovery::EndpointSlice::decode(bytes.as_slice()).expect("decodes");
    assert_eq!(s.address_type.as_deref(), Some("IPv4"));
    let e = &s.endpoints[0];
    assert_eq!(e.addresses, ["10.0.0.1"]);
    let c = e.conditions.as_ref().expect("conditions");
    assert_eq!(
        (c.ready, c.serving, c.terminating),
        (Some(true), Some(true), Some(false))
    );
    assert_eq!(
        e.target_ref.as_ref().and_then(|r| r.name.as_deref()),
        Some("web-0")
    );
    assert_eq!(
        e.hints.as_ref().map(|h| h.for_zones[0].name.clone()),
        Some(Some("z1".into()))
    );
    assert_eq!(
        (e.node_name.as_deref(), e.zone.as_deref()),
        (Some("n1"), Some("z1"))
    );
    assert_eq!(s.ports[0].port, Some(8080));

    let endpoints = Object::Endpoints(Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "prod"},
            "subsets": [{"addresses": [{"ip": "10.0.0.1", "targetRef": {"kind": "Pod", "name": "web-0"}}],
                "notReadyAddresses": [{"ip": "10.0.0.2", "nodeName": "n2"}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]
        }))
        .expect("endpoints"),
    ));
    let bytes = item(&endpoints, 8).expect("a form");
    let e = pb_core::Endpoints::decode(bytes.as_slice()).expect("decodes");
    let sub = &e.subsets[0];
    assert_eq!(sub.addresses[0].ip.as_deref(), Some("10.0.0.1"));
    assert_eq!(sub.not_ready_addresses[0].node_name.as_deref(), Some("n2"));
    assert_eq!(sub.ports[0].port, Some(8080));
}

#[test]
fn a_trimmed_pod_keeps_every_kept_field_in_protobuf() {
    let full: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "web-0", "namespace": "prod", "uid": "u",
            "labels": {"app": "web"}, "annotations": {"config.linkerd.io/opaque-ports": "4000"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "r"}]},
        "spec": {"nodeName": "n1", "serviceAccountName": "web", "hostNetwork": false,
            "volumes": [{"name": "v"}],
            "containers": [
                {"name": "app", "image": "web:1",
                 "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP", "hostPort": 80}]},
                {"name": "linkerd-proxy", "image": "proxy:1",
                 "env": [{"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "0.0.0.0:4143"},
                         {"name": "_pod_ns", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]}],
            "initContainers": [{"name": "init", "restartPolicy": "Always"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}],
            "hostIP": "192.168.0.1", "hostIPs": [{"ip": "192.168.0.1"}],
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "containerStatuses": [{"name": "app", "ready": true, "started": true, "restartCount": 2,
                "image": "web:1", "imageID": "sha"}]}
    }))
    .expect("a pod");
    let held = Object::Pod(Arc::new(PodObject::from(crate::upstream::trim::pod(full))));
    let bytes = item(&held, 9).expect("a form");
    let p = pb_core::Pod::decode(bytes.as_slice()).expect("decodes");
    let m = p.metadata.expect("metadata");
    assert_eq!(m.owner_references[0].name.as_deref(), Some("web-1"));
    assert_eq!(m.annotations.len(), 1);
    let spec = p.spec.expect("spec");
    assert_eq!(
        (
            spec.node_name.as_deref(),
            spec.service_account_name.as_deref(),
            spec.host_network
        ),
        (Some("n1"), Some("web"), Some(false))
    );
    assert!(spec.volumes.is_empty(), "the trim dropped them");
    let port = &spec.containers[0].ports[0];
    assert_eq!(
        (
            port.name.as_deref(),
            port.container_port,
            port.host_port,
            port.protocol.as_deref()
        ),
        (Some("http"), Some(8080), Some(80), Some("TCP"))
    );
    assert!(spec.containers[0].image.is_none(), "the trim dropped it");
    let env = &spec.containers[1].env;
    assert_eq!(env[0].value.as_deref(), Some("0.0.0.0:4143"));
    assert_eq!(
        env[1]
            .value_from
            .as_ref()
            .and_then(|f| f.field_ref.as_ref())
            .and_then(|r| r.field_path.as_deref()),
        Some("metadata.namespace")
    );
    assert_eq!(
        spec.init_containers[0].restart_policy.as_deref(),
        Some("Always")
    );
    let status = p.status.expect("status");
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(status.pod_ips[0].ip.as_deref(), Some("10.0.0.7"));
    assert_eq!(status.host_ips[0].ip.as_deref(), Some("192.168.0.1"));
    assert_eq!(status.conditions[0].status.as_deref(), Some("True"));
    assert!(status.conditions[0].last_transition_time.is_some());
    let c = &status.container_statuses[0];
    assert_eq!(
        (c.ready, c.started, c.restart_count),
        (Some(true), Some(true), Some(2))
    );
}

#[test]
fn the_three_forms_share_one_buffer_and_nest() {
    let bytes = item(&service(), 42).expect("a form");
    let forms = Forms::new("v1", "Service", &bytes, "MODIFIED");
    assert_eq!(forms.item(), bytes.as_slice());
    assert_eq!(open_item(forms.envelope(), "v1", "Service"), bytes);
    let events = read_watch(&forms.frame()).expect("one frame");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].r#type.as_deref(), Some("MODIFIED"));
    let raw = events[0]
        .object
        .as_ref()
        .and_then(|o| o.raw.clone())
        .expect("raw");
    assert_eq!(raw, forms.envelope(), "the event's object is the envelope");
    assert_eq!(forms.len(), forms.frame().len());
    // The frame built per watcher is the same bytes.
    assert_eq!(watch_frame("MODIFIED", forms.envelope()), forms.frame());
}

#[test]
fn a_list_is_its_items_concatenated() {
    let items: Vec<Vec<u8>> = [service(), service()]
        .iter()
        .enumerate()
        .map(|(i, o)| item(o, i as u64 + 1).expect("a form"))
        .collect();
    let meta = meta::ListMeta {
        resource_version: Some("9".into()),
        r#continue: Some("token".into()),
        remaining_item_count: Some(3),
        self_link: None,
    };
    let body = list("v1", "ServiceList", &meta, items.iter().map(Vec::as_slice));
    let raw = open_item(&body, "v1", "ServiceList");
    let l = pb_core::ServiceList::decode(raw.as_slice()).expect("decodes");
    assert_eq!(l.metadata, Some(meta));
    assert_eq!(l.items.len(), 2);
    assert_eq!(
        l.items[1].encode_to_vec(),
        items[1],
        "each item as encoded once"
    );
    let empty = list(
        "v1",
        "ServiceList",
        &meta::ListMeta::default(),
        std::iter::empty(),
    );
    let l = pb_core::ServiceList::decode(open_item(&empty, "v1", "ServiceList").as_slice())
        .expect("decodes");
    assert!(l.items.is_empty());
}

#[test]
fn servers_have_no_protobuf_form_and_bad_bodies_are_errors() {
    let server = Object::Server(Arc::new(crate::model::Server::default()));
    assert!(item(&server, 1).is_none());
    assert!(!crate::model::Kind::Server.def().protobuf && crate::model::Kind::Pod.def().protobuf);
    assert!(matches!(open(b"{\"kind\":1}"), Err(DecodeError::NoMagic)));
    assert!(matches!(
        open(b"k8s\0\xff\xff"),
        Err(DecodeError::Invalid { .. })
    ));
    let frame = watch_frame("ADDED", &envelope("v1", "Service", b""));
    assert!(matches!(
        read_watch(&frame[..frame.len() - 1]),
        Err(DecodeError::Truncated)
    ));
    assert!(matches!(
        read_watch(&frame[..2]),
        Err(DecodeError::Truncated)
    ));
    assert_eq!(read_watch(b"").expect("no events").len(), 0);
}

#[test]
fn a_config_map_decodes_to_what_its_json_says() {
    let cm = Object::ConfigMap(Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": "linkerd-config", "namespace": "linkerd", "uid": "u-9"},
            "data": {"values": "identityTrustAnchorsPEM: |\n  -----BEGIN CERTIFICATE-----\n"},
            "binaryData": {"raw": "AAEC"},
            "immutable": false
        }))
        .expect("a ConfigMap"),
    ));
    let rv = 7;
    let forms = Forms::new("v1", "ConfigMap", &item(&cm, rv).expect("a form"), "ADDED");
    let raw = open_item(forms.envelope(), "v1", "ConfigMap");
    let c = pb_core::ConfigMap::decode(raw.as_slice()).expect("decodes");
    let m = c.metadata.expect("metadata");
    assert_eq!(m.name.as_deref(), Some("linkerd-config"));
    assert_eq!(m.resource_version.as_deref(), Some("7"));
    assert!(c.data["values"].starts_with("identityTrustAnchorsPEM"));
    assert_eq!(c.binary_data["raw"], [0, 1, 2]);
    assert_eq!(c.immutable, Some(false));
}
