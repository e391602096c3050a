//! A pod as its `k8s-pb` message. Floodgate holds a pod as the JSON of the fields the upstream
//! trim keeps ([`crate::upstream::trim`]), so this reads exactly those from that JSON: a field
//! the trim drops is in neither form.

use k8s_pb::api::core::v1 as pb;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
use serde_json::Value;

use super::convert::object_meta;
use crate::model::PodObject;

/// The pod's message.
pub fn pod(p: &PodObject, resource_version: &str) -> pb::Pod {
    let v: Value = serde_json::from_str(p.json().get()).unwrap_or_default();
    pb::Pod {
        metadata: Some(object_meta(&p.metadata(), Some(resource_version))),
        spec: v.get("spec").map(spec),
        status: v.get("status").map(status),
    }
}

fn string(v: &Value, key: &str) -> Option<String> {
    v.get(key)?.as_str().map(str::to_owned)
}

fn boolean(v: &Value, key: &str) -> Option<bool> {
    v.get(key)?.as_bool()
}

fn int(v: &Value, key: &str) -> Option<i32> {
    v.get(key)?.as_i64().and_then(|i| i32::try_from(i).ok())
}

fn each<'a, T>(v: &'a Value, key: &str, f: impl Fn(&'a Value) -> T) -> Vec<T> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(f)
        .collect()
}

fn time(v: &Value, key: &str) -> Option<pb_meta::Time> {
    let t: jiff::Timestamp = v.get(key)?.as_str()?.parse().ok()?;
    Some(pb_meta::Time {
        seconds: Some(t.as_second()),
        nanos: Some(t.subsec_nanosecond()),
    })
}

fn spec(s: &Value) -> pb::PodSpec {
    pb::PodSpec {
        node_name: string(s, "nodeName"),
        service_account_name: string(s, "serviceAccountName"),
        host_network: boolean(s, "hostNetwork"),
        containers: each(s, "containers", container),
        init_containers: each(s, "initContainers", container),
        ..pb::PodSpec::default()
    }
}

fn container(c: &Value) -> pb::Container {
    pb::Container {
        name: string(c, "name"),
        ports: each(c, "ports", |p| pb::ContainerPort {
            name: string(p, "name"),
            host_port: int(p, "hostPort"),
            container_port: int(p, "containerPort"),
            protocol: string(p, "protocol"),
            host_ip: string(p, "hostIP"),
        }),
        env: each(c, "env", env_var),
        restart_policy: string(c, "restartPolicy"),
        ..pb::Container::default()
    }
}

fn env_var(e: &Value) -> pb::EnvVar {
    let key_ref = |r: &Value| (string(r, "name"), string(r, "key"), boolean(r, "optional"));
    pb::EnvVar {
        name: string(e, "name"),
        value: string(e, "value"),
        value_from: e.get("valueFrom").map(|f| pb::EnvVarSource {
            field_ref: f.get("fieldRef").map(|r| pb::ObjectFieldSelector {
                api_version: string(r, "apiVersion"),
                field_path: string(r, "fieldPath"),
            }),
            resource_field_ref: f
                .get("resourceFieldRef")
                .map(|r| pb::ResourceFieldSelector {
                    container_name: string(r, "containerName"),
                    resource: string(r, "resource"),
                    divisor: string(r, "divisor").map(|q| Quantity { string: Some(q) }),
                }),
            config_map_key_ref: f.get("configMapKeyRef").map(|r| {
                let (name, key, optional) = key_ref(r);
                pb::ConfigMapKeySelector {
                    local_object_reference: Some(pb::LocalObjectReference { name }),
                    key,
                    optional,
                }
            }),
            secret_key_ref: f.get("secretKeyRef").map(|r| {
                let (name, key, optional) = key_ref(r);
                pb::SecretKeySelector {
                    local_object_reference: Some(pb::LocalObjectReference { name }),
                    key,
                    optional,
                }
            }),
            file_key_ref: f.get("fileKeyRef").map(|r| pb::FileKeySelector {
                volume_name: string(r, "volumeName"),
                path: string(r, "path"),
                key: string(r, "key"),
                optional: boolean(r, "optional"),
            }),
        }),
    }
}

fn status(s: &Value) -> pb::PodStatus {
    pb::PodStatus {
        phase: string(s, "phase"),
        conditions: each(s, "conditions", |c| pb::PodCondition {
            r#type: string(c, "type"),
            observed_generation: c.get("observedGeneration").and_then(Value::as_i64),
            status: string(c, "status"),
            last_probe_time: time(c, "lastProbeTime"),
            last_transition_time: time(c, "lastTransitionTime"),
            reason: string(c, "reason"),
            message: string(c, "message"),
        }),
        pod_ip: string(s, "podIP"),
        pod_ips: each(s, "podIPs", |i| pb::PodIp {
            ip: string(i, "ip"),
        }),
        host_ip: string(s, "hostIP"),
        host_ips: each(s, "hostIPs", |i| pb::HostIp {
            ip: string(i, "ip"),
        }),
        container_statuses: each(s, "containerStatuses", |c| pb::ContainerStatus {
            name: string(c, "name"),
            ready: boolean(c, "ready"),
            started: boolean(c, "started"),
            restart_count: int(c, "restartCount"),
            // Required by the type; the trim leaves them empty, as the JSON does.
            image: Some(string(c, "image").unwrap_or_default()),
            image_id: Some(string(c, "imageID").unwrap_or_default()),
            ..pb::ContainerStatus::default()
        }),
        ..pb::PodStatus::default()
    }
}
