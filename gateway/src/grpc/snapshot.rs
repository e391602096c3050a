//! Building one [`EndpointSnapshot`] from the published Kubernetes objects of a service: its
//! Service (for the cap's annotations) and its EndpointSlices. Pure: objects in, message out.

use floodgate_link_crd::Phase;
use floodgate_proto::v1::{Endpoint, EndpointSnapshot, Port};
use k8s_openapi::api::core::v1::Service;

use crate::model::{HeldSlice, NsName};

/// The annotation on a published Service that counts the endpoints the cap withheld.
pub const TRUNCATED_ANNOTATION: &str = "floodgate.dev/endpoints-truncated";

/// The annotation on a published Service that counts its endpoints upstream, before the cap.
pub const TOTAL_ANNOTATION: &str = "floodgate.dev/endpoints-total";

/// The snapshot of service `id` at view version `version`: `service` is its published Service
/// (`None` when it is gone: `exists = false`, nothing else), `slices` its published slices in
/// the order they are to be listed.
pub fn build<'a>(
    id: &NsName,
    service: Option<&Service>,
    slices: impl IntoIterator<Item = &'a HeldSlice>,
    version: u64,
    phase: Phase,
) -> EndpointSnapshot {
    let mut snap = EndpointSnapshot {
        version,
        namespace: id.namespace.to_string(),
        service: id.name.to_string(),
        exists: service.is_some(),
        link_phase: phase.as_str().to_owned(),
        ..Default::default()
    };
    let Some(service) = service else {
        return snap;
    };
    for held in slices {
        // Decoded once: its ports and every endpoint are read.
        let slice = held.to_slice();
        for p in slice.ports.iter().flatten() {
            let port = Port {
                name: p.name.clone().unwrap_or_default(),
                port: p.port.and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                app_protocol: p.app_protocol.clone().unwrap_or_default(),
            };
            if !snap.ports.contains(&port) {
                snap.ports.push(port);
            }
        }
        let slice_ns = slice.metadata.namespace.as_deref().unwrap_or(&id.namespace);
        snap.endpoints.extend(
            slice
                .endpoints
                .iter()
                .flatten()
                .map(|e| endpoint(e, slice_ns)),
        );
    }
    let annotation = |key: &str| {
        service
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    snap.truncated = annotation(TRUNCATED_ANNOTATION).unwrap_or(0);
    let published = u32::try_from(snap.endpoints.len()).unwrap_or(u32::MAX);
    snap.total = annotation(TOTAL_ANNOTATION).unwrap_or(published.saturating_add(snap.truncated));
    snap
}

/// One endpoint, with the conditions' Kubernetes defaults (unset ready means ready; unset
/// serving means as ready; unset terminating means not terminating).
fn endpoint(e: &k8s_openapi::api::discovery::v1::Endpoint, slice_ns: &str) -> Endpoint {
    let c = e.conditions.as_ref();
    let ready = c.and_then(|c| c.ready).unwrap_or(true);
    let pod = e
        .target_ref
        .as_ref()
        .filter(|r| r.kind.as_deref() == Some("Pod"))
        .and_then(|r| {
            let name = r.name.as_deref()?;
            let ns = r.namespace.as_deref().unwrap_or(slice_ns);
            Some(format!("{ns}/{name}"))
        })
        .unwrap_or_default();
    Endpoint {
        addresses: e.addresses.clone(),
        ready,
        serving: c.and_then(|c| c.serving).unwrap_or(ready),
        terminating: c.and_then(|c| c.terminating).unwrap_or(false),
        zone: e.zone.clone().unwrap_or_default(),
        node: e.node_name.clone().unwrap_or_default(),
        pod,
        hostname: e.hostname.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::{self as discovery, EndpointConditions};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use crate::model::{SERVICE_NAME_LABEL, SliceObject};

    pub(crate) fn mk_service(ns: &str, name: &str, annotations: &[(&str, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                annotations: (!annotations.is_empty()).then(|| {
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect()
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// An endpoint of pod `pod` at `ip`, ready or not, in zone `z1` on node `n1`.
    pub(crate) fn mk_endpoint(ip: &str, pod: &str, ready: bool) -> discovery::Endpoint {
        discovery::Endpoint {
            addresses: vec![ip.into()],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(ready),
                terminating: Some(false),
            }),
            zone: Some("z1".into()),
            node_name: Some("n1".into()),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                namespace: Some("prod".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub(crate) fn mk_slice(
        ns: &str,
        name: &str,
        service: &str,
        endpoints: Vec<discovery::Endpoint>,
    ) -> SliceObject {
        SliceObject::from(discovery::EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some([(SERVICE_NAME_LABEL.to_owned(), service.to_owned())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: Some(endpoints),
            ports: Some(vec![discovery::EndpointPort {
                name: Some("http".into()),
                port: Some(8080),
                protocol: Some("TCP".into()),
                app_protocol: None,
            }]),
        })
    }

    #[test]
    fn a_snapshot_carries_every_endpoint_with_its_conditions_zone_node_and_pod() {
        let id = NsName::new("prod", "web");
        let svc = mk_service("prod", "web", &[]);
        let a = mk_slice(
            "prod",
            "web-a",
            "web",
            vec![
                mk_endpoint("10.0.0.1", "web-0", true),
                mk_endpoint("10.0.0.2", "web-1", false),
            ],
        );
        let b = mk_slice(
            "prod",
            "web-b",
            "web",
            vec![mk_endpoint("10.0.0.3", "web-2", true)],
        );
        let snap = build(
            &id,
            Some(&svc),
            [&a.clone().into(), &b.clone().into()],
            42,
            Phase::Healthy,
        );
        assert_eq!(snap.version, 42);
        assert_eq!(
            (snap.namespace.as_str(), snap.service.as_str()),
            ("prod", "web")
        );
        assert!(snap.exists);
        assert_eq!(snap.link_phase, "Healthy");
        let addrs: Vec<_> = snap
            .endpoints
            .iter()
            .map(|e| e.addresses[0].as_str())
            .collect();
        assert_eq!(addrs, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        let e1 = &snap.endpoints[1];
        assert!(!e1.ready && !e1.serving && !e1.terminating);
        assert_eq!((e1.zone.as_str(), e1.node.as_str()), ("z1", "n1"));
        assert_eq!(e1.pod, "prod/web-1");
        assert_eq!(snap.ports.len(), 1, "the slices' shared port appears once");
        assert_eq!(
            (snap.ports[0].name.as_str(), snap.ports[0].port),
            ("http", 8080)
        );
        assert_eq!((snap.truncated, snap.total), (0, 3));
    }

    #[test]
    fn unset_conditions_take_the_kubernetes_defaults() {
        let mut e = mk_endpoint("10.0.0.1", "p", true);
        e.conditions = Some(EndpointConditions {
            ready: Some(false),
            serving: None,
            terminating: None,
        });
        let mut bare = mk_endpoint("10.0.0.2", "p", true);
        bare.conditions = None;
        bare.target_ref = None;
        let slice = mk_slice("prod", "s", "web", vec![e, bare]);
        let snap = build(
            &NsName::new("prod", "web"),
            Some(&mk_service("prod", "web", &[])),
            [&slice.clone().into()],
            1,
            Phase::Healthy,
        );
        let (e, bare) = (&snap.endpoints[0], &snap.endpoints[1]);
        assert!(!e.ready && !e.serving && !e.terminating);
        assert!(bare.ready && bare.serving && !bare.terminating);
        assert_eq!(bare.pod, "", "no targetRef, no pod");
    }

    #[test]
    fn the_caps_annotations_give_truncated_and_total() {
        let svc = mk_service(
            "prod",
            "web",
            &[(TRUNCATED_ANNOTATION, "7"), (TOTAL_ANNOTATION, "9")],
        );
        let slice = mk_slice(
            "prod",
            "s",
            "web",
            vec![
                mk_endpoint("10.0.0.1", "a", true),
                mk_endpoint("10.0.0.2", "b", true),
            ],
        );
        let snap = build(
            &NsName::new("prod", "web"),
            Some(&svc),
            [&slice.clone().into()],
            1,
            Phase::Throttled,
        );
        assert_eq!((snap.truncated, snap.total), (7, 9));
        assert_eq!(snap.link_phase, "Throttled");
        let garbled = mk_service("prod", "web", &[(TRUNCATED_ANNOTATION, "many")]);
        let snap = build(
            &NsName::new("prod", "web"),
            Some(&garbled),
            [&slice.clone().into()],
            1,
            Phase::Healthy,
        );
        assert_eq!(
            (snap.truncated, snap.total),
            (0, 2),
            "unparsable counts as missing"
        );
    }

    #[test]
    fn a_gone_service_is_exists_false_and_empty() {
        let slice = mk_slice("prod", "s", "web", vec![mk_endpoint("10.0.0.1", "a", true)]);
        let snap = build(
            &NsName::new("prod", "web"),
            None,
            [&slice.clone().into()],
            5,
            Phase::Quarantined,
        );
        assert!(!snap.exists);
        assert!(snap.endpoints.is_empty() && snap.ports.is_empty());
        assert_eq!(snap.link_phase, "Quarantined");
    }
}
