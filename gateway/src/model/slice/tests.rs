//! The held form of an EndpointSlice against the typed one: round trips, keys, `retain`.

use super::*;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointHints, EndpointPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

fn full() -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some("web-abc".into()),
            namespace: Some("prod".into()),
            labels: Some([("kubernetes.io/service-name".into(), "web".into())].into()),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            app_protocol: Some("http".into()),
        }]),
        endpoints: Some(vec![
            Endpoint {
                addresses: vec!["10.0.0.1".into()],
                conditions: Some(EndpointConditions {
                    ready: Some(false),
                    serving: Some(true),
                    terminating: Some(true),
                }),
                hostname: Some("web-0".into()),
                node_name: Some("node-a".into()),
                zone: Some("zone-1".into()),
                hints: Some(EndpointHints {
                    for_zones: Some(vec![Default::default()]),
                    ..Default::default()
                }),
                target_ref: Some(ObjectReference {
                    kind: Some("Pod".into()),
                    name: Some("web-0".into()),
                    uid: Some("u-1".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            Endpoint {
                addresses: vec!["10.0.0.2".into(), "10.0.0.3".into()],
                target_ref: Some(ObjectReference {
                    kind: Some("Node".into()),
                    name: Some("n".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            // An address with characters JSON escapes: its key is not in the JSON as it is.
            Endpoint {
                addresses: vec!["fe80::1\"\\".into()],
                ..Default::default()
            },
            Endpoint {
                addresses: vec!["10.0.0.4".into()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]),
    }
}

fn with_endpoints(s: &EndpointSlice, mut keep: impl FnMut(&Endpoint) -> bool) -> EndpointSlice {
    EndpointSlice {
        endpoints: Some(
            s.endpoints
                .iter()
                .flatten()
                .filter(|e| keep(e))
                .cloned()
                .collect(),
        ),
        ..s.clone()
    }
}

#[test]
fn a_held_slice_gives_back_the_slice_it_was_made_from() {
    let s = full();
    let held = SliceObject::from(s.clone());
    assert_eq!(held.to_slice(), s, "typed round trip");
    let mut typed = serde_json::to_value(&s).expect("encodes");
    // k8s-openapi writes its type's kind and apiVersion; [`crate::model::Object::to_json`]
    // adds them for every kind.
    for k in ["kind", "apiVersion"] {
        typed.as_object_mut().map(|m| m.remove(k));
    }
    assert_eq!(
        serde_json::to_value(&held).expect("encodes"),
        typed,
        "the same JSON as the typed slice"
    );
    let text = serde_json::to_string(&held).expect("encodes");
    assert_eq!(text, held.json(), "serialized as the JSON it holds");
    let back: SliceObject = serde_json::from_str(&text).expect("decodes");
    assert_eq!(back, held, "JSON round trip");
    assert_eq!(
        back.endpoints().map(|e| e.key()).collect::<Vec<_>>(),
        held.endpoints().map(|e| e.key()).collect::<Vec<_>>()
    );
    let none = SliceObject::from(EndpointSlice {
        endpoints: None,
        ports: None,
        ..s
    });
    assert_eq!(
        none.to_slice().endpoints,
        None,
        "no endpoints stays no endpoints"
    );
    assert_eq!(none.endpoints().len(), 0);
}

#[test]
fn the_json_starts_with_metadata_and_holds_no_upstream_version() {
    let mut s = full();
    s.metadata.resource_version = Some("123".into());
    s.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
    let held = SliceObject::from(s);
    assert!(
        held.json().starts_with(r#"{"metadata":{"labels":"#),
        "{}",
        held.json()
    );
    assert_eq!(held.metadata().resource_version, None);
    assert_eq!(held.metadata().managed_fields, None);
    assert_eq!(held.to_slice().metadata, held.metadata());
    let empty = SliceObject::default();
    assert_eq!(empty.json(), r#"{"metadata":{},"addressType":""}"#);
}

#[test]
fn what_the_engine_reads_is_read_out() {
    let held = SliceObject::from(full());
    let e: Vec<SliceEndpoint<'_>> = held.endpoints().collect();
    assert_eq!(e[0].key(), "10.0.0.1");
    assert_eq!(e[1].key(), "10.0.0.2,10.0.0.3");
    assert_eq!(e[1].first_address(), "10.0.0.2");
    assert_eq!(
        e[2].key(),
        "fe80::1\"\\",
        "an escaped address keys as itself"
    );
    assert!(!e[0].is_ready());
    assert!(e[1].is_ready(), "no condition reads as ready");
    assert!(e[3].is_ready());
    for (e, typed) in e.iter().zip(full().endpoints.unwrap_or_default()) {
        assert_eq!(e.decode(), typed);
    }
    let pods: Vec<NsName> = held.pod_refs().collect();
    assert_eq!(
        pods,
        [NsName::new("prod", "web-0")],
        "a pod without a namespace is in the slice's; a node is no pod"
    );
}

#[test]
fn retain_holds_what_the_kept_endpoints_alone_would() {
    let s = full();
    let held = SliceObject::from(s.clone());
    let keys = |h: &SliceObject| {
        h.endpoints()
            .map(|e| e.key().to_owned())
            .collect::<Vec<_>>()
    };
    // Every subset of the four endpoints.
    for mask in 0..16u32 {
        let keep = |i: usize| mask & (1 << i) != 0;
        let mut i = 0;
        let kept = held.retain(|_| {
            i += 1;
            keep(i - 1)
        });
        let mut j = 0;
        let expected = SliceObject::from(with_endpoints(&s, |_| {
            j += 1;
            keep(j - 1)
        }));
        assert_eq!(kept, expected, "mask {mask:04b}");
        assert_eq!(keys(&kept), keys(&expected), "mask {mask:04b}");
        assert_eq!(kept.to_slice(), expected.to_slice());
        assert_eq!(kept.metadata(), held.metadata());
    }
    let none = SliceObject::from(EndpointSlice {
        endpoints: None,
        ..s.clone()
    });
    assert_eq!(
        none.retain(|_| true),
        SliceObject::from(with_endpoints(&s, |_| false)),
        "a slice that listed none lists an empty set once retained"
    );
}

#[test]
fn a_slice_of_the_wrong_shape_is_refused() {
    let bad = r#"{"addressType":"IPv4","endpoints":[{"addresses":"10.0.0.1"}],"metadata":{}}"#;
    assert!(serde_json::from_str::<SliceObject>(bad).is_err());
}

#[test]
fn a_slice_holds_its_name_and_service_and_its_pods_share_its_namespace() {
    let held = SliceObject::from(full());
    assert_eq!(held.id(), &NsName::new("prod", "web-abc"));
    assert_eq!(held.service(), Some(NsName::new("prod", "web")));
    assert_eq!(
        held.retain(|_| false).service(),
        held.service(),
        "kept by retain"
    );
    let pods: Vec<_> = held.pod_refs_ready().collect();
    assert_eq!(pods, [(NsName::new("prod", "web-0"), false)]);
    assert!(
        Arc::ptr_eq(&pods[0].0.namespace, &held.id().namespace),
        "one allocation of the namespace"
    );
    let unlabelled = SliceObject::from(EndpointSlice {
        metadata: ObjectMeta::default(),
        ..full()
    });
    assert_eq!(unlabelled.service(), None);
}
