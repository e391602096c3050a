//! k8s-openapi objects as their `k8s-pb` messages. Each conversion names every field of both
//! sides (no `..Default::default()`, no `..` in a pattern), so a field either type gains in a
//! new release fails the build here instead of vanishing from the protobuf form.

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_pb::api::core::v1 as pb_core;
use k8s_pb::api::discovery::v1 as pb_discovery;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
use k8s_pb::apimachinery::pkg::util::intstr as pb_intstr;

/// A timestamp.
pub fn time(t: &meta::Time) -> pb_meta::Time {
    pb_meta::Time {
        seconds: Some(t.0.as_second()),
        nanos: Some(t.0.subsec_nanosecond()),
    }
}

fn list<A, B>(v: &Option<Vec<A>>, f: impl Fn(&A) -> B) -> Vec<B> {
    v.iter().flatten().map(f).collect()
}

/// Metadata, with `resource_version` in place of the object's own when given.
pub fn object_meta(m: &meta::ObjectMeta, resource_version: Option<&str>) -> pb_meta::ObjectMeta {
    let meta::ObjectMeta {
        annotations,
        creation_timestamp,
        deletion_grace_period_seconds,
        deletion_timestamp,
        finalizers,
        generate_name,
        generation,
        labels,
        managed_fields,
        name,
        namespace,
        owner_references,
        resource_version: own_version,
        self_link,
        uid,
    } = m;
    pb_meta::ObjectMeta {
        name: name.clone(),
        generate_name: generate_name.clone(),
        namespace: namespace.clone(),
        self_link: self_link.clone(),
        uid: uid.clone(),
        resource_version: resource_version.map(str::to_owned).or(own_version.clone()),
        generation: *generation,
        creation_timestamp: creation_timestamp.as_ref().map(time),
        deletion_timestamp: deletion_timestamp.as_ref().map(time),
        deletion_grace_period_seconds: *deletion_grace_period_seconds,
        labels: labels.clone().unwrap_or_default(),
        annotations: annotations.clone().unwrap_or_default(),
        owner_references: list(owner_references, owner_reference),
        finalizers: finalizers.clone().unwrap_or_default(),
        managed_fields: list(managed_fields, managed_fields_entry),
    }
}

fn owner_reference(o: &meta::OwnerReference) -> pb_meta::OwnerReference {
    let meta::OwnerReference {
        api_version,
        block_owner_deletion,
        controller,
        kind,
        name,
        uid,
    } = o;
    pb_meta::OwnerReference {
        api_version: Some(api_version.clone()),
        kind: Some(kind.clone()),
        name: Some(name.clone()),
        uid: Some(uid.clone()),
        controller: *controller,
        block_owner_deletion: *block_owner_deletion,
    }
}

fn managed_fields_entry(e: &meta::ManagedFieldsEntry) -> pb_meta::ManagedFieldsEntry {
    let meta::ManagedFieldsEntry {
        api_version,
        fields_type,
        fields_v1,
        manager,
        operation,
        subresource,
        time: at,
    } = e;
    pb_meta::ManagedFieldsEntry {
        manager: manager.clone(),
        operation: operation.clone(),
        api_version: api_version.clone(),
        time: at.as_ref().map(time),
        fields_type: fields_type.clone(),
        // `FieldsV1.raw` is the JSON of the field set.
        fields_v1: fields_v1.as_ref().map(|f| pb_meta::FieldsV1 {
            raw: Some(f.0.to_string().into_bytes()),
        }),
        subresource: subresource.clone(),
    }
}

fn condition(c: &meta::Condition) -> pb_meta::Condition {
    let meta::Condition {
        last_transition_time,
        message,
        observed_generation,
        reason,
        status,
        type_,
    } = c;
    pb_meta::Condition {
        r#type: Some(type_.clone()),
        status: Some(status.clone()),
        observed_generation: *observed_generation,
        last_transition_time: Some(time(last_transition_time)),
        reason: Some(reason.clone()),
        message: Some(message.clone()),
    }
}

fn int_or_string(v: &IntOrString) -> pb_intstr::IntOrString {
    match v {
        IntOrString::Int(i) => pb_intstr::IntOrString {
            r#type: Some(0),
            int_val: Some(*i),
            str_val: None,
        },
        IntOrString::String(s) => pb_intstr::IntOrString {
            r#type: Some(1),
            int_val: None,
            str_val: Some(s.clone()),
        },
    }
}

/// An object reference (an endpoint's target).
pub fn object_reference(r: &core::ObjectReference) -> pb_core::ObjectReference {
    let core::ObjectReference {
        api_version,
        field_path,
        kind,
        name,
        namespace,
        resource_version,
        uid,
    } = r;
    pb_core::ObjectReference {
        kind: kind.clone(),
        namespace: namespace.clone(),
        name: name.clone(),
        uid: uid.clone(),
        api_version: api_version.clone(),
        resource_version: resource_version.clone(),
        field_path: field_path.clone(),
    }
}

/// A ConfigMap (the remote's `linkerd-config`).
pub fn config_map(c: &core::ConfigMap, resource_version: &str) -> pb_core::ConfigMap {
    let core::ConfigMap {
        metadata,
        data,
        binary_data,
        immutable,
    } = c;
    pb_core::ConfigMap {
        metadata: Some(object_meta(metadata, Some(resource_version))),
        immutable: *immutable,
        data: data.clone().unwrap_or_default(),
        binary_data: (binary_data.iter().flatten())
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect(),
    }
}

/// A Service.
pub fn service(s: &core::Service, resource_version: &str) -> pb_core::Service {
    let core::Service {
        metadata,
        spec,
        status,
    } = s;
    pb_core::Service {
        metadata: Some(object_meta(metadata, Some(resource_version))),
        spec: spec.as_ref().map(service_spec),
        status: status.as_ref().map(service_status),
    }
}

fn service_spec(s: &core::ServiceSpec) -> pb_core::ServiceSpec {
    let core::ServiceSpec {
        allocate_load_balancer_node_ports,
        cluster_ip,
        cluster_ips,
        external_ips,
        external_name,
        external_traffic_policy,
        health_check_node_port,
        internal_traffic_policy,
        ip_families,
        ip_family_policy,
        load_balancer_class,
        load_balancer_ip,
        load_balancer_source_ranges,
        ports,
        publish_not_ready_addresses,
        selector,
        session_affinity,
        session_affinity_config,
        traffic_distribution,
        type_,
    } = s;
    pb_core::ServiceSpec {
        ports: list(ports, service_port),
        selector: selector.clone().unwrap_or_default(),
        cluster_ip: cluster_ip.clone(),
        cluster_ips: cluster_ips.clone().unwrap_or_default(),
        r#type: type_.clone(),
        external_ips: external_ips.clone().unwrap_or_default(),
        session_affinity: session_affinity.clone(),
        load_balancer_ip: load_balancer_ip.clone(),
        load_balancer_source_ranges: load_balancer_source_ranges.clone().unwrap_or_default(),
        external_name: external_name.clone(),
        external_traffic_policy: external_traffic_policy.clone(),
        health_check_node_port: *health_check_node_port,
        publish_not_ready_addresses: *publish_not_ready_addresses,
        session_affinity_config: session_affinity_config.as_ref().map(|c| {
            let core::SessionAffinityConfig { client_ip } = c;
            pb_core::SessionAffinityConfig {
                client_ip: client_ip.as_ref().map(|c| {
                    let core::ClientIPConfig { timeout_seconds } = c;
                    pb_core::ClientIpConfig {
                        timeout_seconds: *timeout_seconds,
                    }
                }),
            }
        }),
        ip_families: ip_families.clone().unwrap_or_default(),
        ip_family_policy: ip_family_policy.clone(),
        allocate_load_balancer_node_ports: *allocate_load_balancer_node_ports,
        load_balancer_class: load_balancer_class.clone(),
        internal_traffic_policy: internal_traffic_policy.clone(),
        traffic_distribution: traffic_distribution.clone(),
    }
}

fn service_port(p: &core::ServicePort) -> pb_core::ServicePort {
    let core::ServicePort {
        app_protocol,
        name,
        node_port,
        port,
        protocol,
        target_port,
    } = p;
    pb_core::ServicePort {
        name: name.clone(),
        protocol: protocol.clone(),
        app_protocol: app_protocol.clone(),
        port: Some(*port),
        target_port: target_port.as_ref().map(int_or_string),
        node_port: *node_port,
    }
}

fn service_status(s: &core::ServiceStatus) -> pb_core::ServiceStatus {
    let core::ServiceStatus {
        conditions,
        load_balancer,
    } = s;
    pb_core::ServiceStatus {
        load_balancer: load_balancer.as_ref().map(|lb| {
            let core::LoadBalancerStatus { ingress } = lb;
            pb_core::LoadBalancerStatus {
                ingress: list(ingress, load_balancer_ingress),
            }
        }),
        conditions: list(conditions, condition),
    }
}

fn load_balancer_ingress(i: &core::LoadBalancerIngress) -> pb_core::LoadBalancerIngress {
    let core::LoadBalancerIngress {
        hostname,
        ip,
        ip_mode,
        ports,
    } = i;
    pb_core::LoadBalancerIngress {
        ip: ip.clone(),
        hostname: hostname.clone(),
        ip_mode: ip_mode.clone(),
        ports: list(ports, |p| {
            let core::PortStatus {
                error,
                port,
                protocol,
            } = p;
            pb_core::PortStatus {
                port: Some(*port),
                protocol: Some(protocol.clone()),
                error: error.clone(),
            }
        }),
    }
}

/// An EndpointSlice.
pub fn endpoint_slice(
    s: &discovery::EndpointSlice,
    resource_version: &str,
) -> pb_discovery::EndpointSlice {
    let discovery::EndpointSlice {
        address_type,
        endpoints,
        metadata,
        ports,
    } = s;
    pb_discovery::EndpointSlice {
        metadata: Some(object_meta(metadata, Some(resource_version))),
        address_type: Some(address_type.clone()),
        endpoints: list(endpoints, endpoint),
        ports: list(ports, |p| {
            let discovery::EndpointPort {
                app_protocol,
                name,
                port,
                protocol,
            } = p;
            pb_discovery::EndpointPort {
                name: name.clone(),
                protocol: protocol.clone(),
                port: *port,
                app_protocol: app_protocol.clone(),
            }
        }),
    }
}

fn endpoint(e: &discovery::Endpoint) -> pb_discovery::Endpoint {
    let discovery::Endpoint {
        addresses,
        conditions,
        deprecated_topology,
        hints,
        hostname,
        node_name,
        target_ref,
        zone,
    } = e;
    pb_discovery::Endpoint {
        addresses: addresses.clone(),
        conditions: conditions.as_ref().map(|c| {
            let discovery::EndpointConditions {
                ready,
                serving,
                terminating,
            } = c;
            pb_discovery::EndpointConditions {
                ready: *ready,
                serving: *serving,
                terminating: *terminating,
            }
        }),
        hostname: hostname.clone(),
        target_ref: target_ref.as_ref().map(object_reference),
        deprecated_topology: deprecated_topology.clone().unwrap_or_default(),
        node_name: node_name.clone(),
        zone: zone.clone(),
        hints: hints.as_ref().map(|h| {
            let discovery::EndpointHints {
                for_nodes,
                for_zones,
            } = h;
            pb_discovery::EndpointHints {
                for_zones: list(for_zones, |z| pb_discovery::ForZone {
                    name: Some(z.name.clone()),
                }),
                for_nodes: list(for_nodes, |n| pb_discovery::ForNode {
                    name: Some(n.name.clone()),
                }),
            }
        }),
    }
}

/// A core/v1 Endpoints.
pub fn endpoints(e: &core::Endpoints, resource_version: &str) -> pb_core::Endpoints {
    let core::Endpoints { metadata, subsets } = e;
    pb_core::Endpoints {
        metadata: Some(object_meta(metadata, Some(resource_version))),
        subsets: list(subsets, |s| {
            let core::EndpointSubset {
                addresses,
                not_ready_addresses,
                ports,
            } = s;
            pb_core::EndpointSubset {
                addresses: list(addresses, endpoint_address),
                not_ready_addresses: list(not_ready_addresses, endpoint_address),
                ports: list(ports, |p| {
                    let core::EndpointPort {
                        app_protocol,
                        name,
                        port,
                        protocol,
                    } = p;
                    pb_core::EndpointPort {
                        name: name.clone(),
                        port: Some(*port),
                        protocol: protocol.clone(),
                        app_protocol: app_protocol.clone(),
                    }
                }),
            }
        }),
    }
}

fn endpoint_address(a: &core::EndpointAddress) -> pb_core::EndpointAddress {
    let core::EndpointAddress {
        hostname,
        ip,
        node_name,
        target_ref,
    } = a;
    pb_core::EndpointAddress {
        ip: Some(ip.clone()),
        hostname: hostname.clone(),
        node_name: node_name.clone(),
        target_ref: target_ref.as_ref().map(object_reference),
    }
}
