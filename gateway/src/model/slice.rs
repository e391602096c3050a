//! An EndpointSlice as Floodgate holds it: its metadata, address type and ports typed, and each
//! endpoint as the JSON it encodes to, beside the two things the engine reads of every endpoint
//! on every change (its key, the addresses, and its conditions).
//!
//! Why: the cap chooses among all of a selected service's endpoints, so the upstream cache
//! holds every one of them, published or not, and a decoded k8s-openapi `Endpoint` spends its
//! fixed layout on every field it could have (376 bytes inline, most of them `None`: the
//! object reference alone is seven optional strings), plus an allocation per string. Held as
//! JSON an endpoint costs its own bytes (about 150 for a pod's endpoint) and two small
//! allocations. The typed form is rebuilt where a consumer reads an endpoint's other fields:
//! the protobuf encoding and the gRPC snapshot, once per published version, and the pod
//! references of published endpoints ([`SliceObject::pod_refs`]).
//!
//! The JSON is written by serde from a typed `Endpoint` ([`From<EndpointSlice>`]), never taken
//! from the wire, so it always decodes back to the same `Endpoint`: [`SliceObject::to_slice`]
//! is exact, and an object that decoded once cannot fail to decode again.

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use super::NsName;

/// One endpoint of a [`SliceObject`].
#[derive(Clone, Debug)]
pub struct SliceEndpoint {
    key: Box<str>,
    conditions: Option<EndpointConditions>,
    json: Box<RawValue>,
}

impl PartialEq for SliceEndpoint {
    fn eq(&self, other: &Self) -> bool {
        // The key and conditions are read out of the JSON, so the JSON decides.
        self.json.get() == other.json.get()
    }
}

impl SliceEndpoint {
    /// Its identity within a service: its addresses, joined by commas.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Its first address (what two states of a slice are matched by).
    pub fn first_address(&self) -> &str {
        self.key.split(',').next().unwrap_or_default()
    }

    /// True when it is ready (an endpoint without the condition counts as ready, as the API
    /// documents).
    pub fn is_ready(&self) -> bool {
        self.conditions
            .as_ref()
            .and_then(|c| c.ready)
            .unwrap_or(true)
    }

    /// The typed endpoint.
    pub fn decode(&self) -> Endpoint {
        serde_json::from_str(self.json.get())
            .expect("the JSON was encoded from an Endpoint, so it decodes as one")
    }
}

/// The pod an endpoint's or an address's JSON points at (its `targetRef`), if it is a pod.
/// `owner` is the namespace of the object holding it, for a reference that names none.
pub(super) fn raw_pod_ref(json: &RawValue, owner: &str) -> Option<NsName> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Target<'a> {
        #[serde(borrow, default)]
        target_ref: Option<Reference<'a>>,
    }
    #[derive(Deserialize)]
    struct Reference<'a> {
        #[serde(borrow, default)]
        kind: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow, default)]
        namespace: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow, default)]
        name: Option<std::borrow::Cow<'a, str>>,
    }
    let r = serde_json::from_str::<Target<'_>>(json.get())
        .ok()?
        .target_ref?;
    if r.kind.as_deref() != Some("Pod") {
        return None;
    }
    Some(NsName::new(
        r.namespace.as_deref().unwrap_or(owner),
        &r.name?,
    ))
}

impl From<Endpoint> for SliceEndpoint {
    fn from(e: Endpoint) -> Self {
        let json = serde_json::value::to_raw_value(&e)
            .expect("a k8s-openapi Endpoint always encodes as JSON");
        Self {
            key: e.addresses.join(",").into_boxed_str(),
            conditions: e.conditions,
            json,
        }
    }
}

/// An EndpointSlice held compactly (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceObject {
    /// The slice's metadata.
    pub metadata: ObjectMeta,
    /// `addressType`.
    pub address_type: String,
    /// `ports`.
    pub ports: Option<Vec<EndpointPort>>,
    /// `endpoints`; `None` when the slice had none listed (the API server writes `null`).
    pub endpoints: Option<Box<[SliceEndpoint]>>,
}

impl From<EndpointSlice> for SliceObject {
    fn from(s: EndpointSlice) -> Self {
        let mut ports = s.ports;
        if let Some(p) = &mut ports {
            p.shrink_to_fit();
        }
        Self {
            metadata: s.metadata,
            address_type: s.address_type,
            ports,
            endpoints: s
                .endpoints
                .map(|v| v.into_iter().map(SliceEndpoint::from).collect()),
        }
    }
}

impl SliceObject {
    /// Its endpoints (none when the slice lists none).
    pub fn endpoints(&self) -> &[SliceEndpoint] {
        self.endpoints.as_deref().unwrap_or_default()
    }

    /// The same slice with only the endpoints `keep` accepts (metadata and ports shared in
    /// value, the kept endpoints' JSON copied).
    pub fn retain(&self, mut keep: impl FnMut(&SliceEndpoint) -> bool) -> SliceObject {
        SliceObject {
            metadata: self.metadata.clone(),
            address_type: self.address_type.clone(),
            ports: self.ports.clone(),
            endpoints: Some(
                self.endpoints()
                    .iter()
                    .filter(|e| keep(e))
                    .cloned()
                    .collect(),
            ),
        }
    }

    /// The typed slice.
    pub fn to_slice(&self) -> EndpointSlice {
        EndpointSlice {
            metadata: self.metadata.clone(),
            address_type: self.address_type.clone(),
            ports: self.ports.clone(),
            endpoints: self
                .endpoints
                .as_ref()
                .map(|v| v.iter().map(SliceEndpoint::decode).collect()),
        }
    }

    /// The pods its endpoints point at.
    pub fn pod_refs(&self) -> impl Iterator<Item = NsName> + '_ {
        self.pod_refs_ready().map(|(pod, _)| pod)
    }

    /// The pods its endpoints point at, each with its endpoint's readiness.
    pub fn pod_refs_ready(&self) -> impl Iterator<Item = (NsName, bool)> + '_ {
        let owner = self.metadata.namespace.as_deref().unwrap_or_default();
        self.endpoints()
            .iter()
            .filter_map(move |e| Some((raw_pod_ref(&e.json, owner)?, e.is_ready())))
    }
}

impl Serialize for SliceObject {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Endpoints<'a>(&'a [SliceEndpoint]);
        impl Serialize for Endpoints<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter().map(|e| &*e.json))
            }
        }
        let mut st = s.serialize_struct("EndpointSlice", 4)?;
        st.serialize_field("addressType", &self.address_type)?;
        match &self.endpoints {
            Some(e) => st.serialize_field("endpoints", &Endpoints(e))?,
            None => st.skip_field("endpoints")?,
        }
        st.serialize_field("metadata", &self.metadata)?;
        match &self.ports {
            Some(p) => st.serialize_field("ports", p)?,
            None => st.skip_field("ports")?,
        }
        st.end()
    }
}

impl<'de> Deserialize<'de> for SliceObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Decoded typed first: every field is checked, and the endpoints' JSON is written
        // from typed values (the module docs say why).
        EndpointSlice::deserialize(d).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::EndpointHints;

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
            ]),
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
        let back: SliceObject = serde_json::from_str(&text).expect("decodes");
        assert_eq!(back, held, "JSON round trip");
        let none = SliceObject::from(EndpointSlice {
            endpoints: None,
            ..s
        });
        assert_eq!(
            none.to_slice().endpoints,
            None,
            "no endpoints stays no endpoints"
        );
        assert!(none.endpoints().is_empty());
    }

    #[test]
    fn what_the_engine_reads_is_read_out() {
        let held = SliceObject::from(full());
        let e = held.endpoints();
        assert_eq!(e[0].key(), "10.0.0.1");
        assert_eq!(e[1].key(), "10.0.0.2,10.0.0.3");
        assert_eq!(e[1].first_address(), "10.0.0.2");
        assert!(!e[0].is_ready());
        assert!(e[1].is_ready(), "no condition reads as ready");
        let pods: Vec<NsName> = held.pod_refs().collect();
        assert_eq!(
            pods,
            [NsName::new("prod", "web-0")],
            "a pod without a namespace is in the slice's; a node is no pod"
        );
        let kept = held.retain(|e| e.key() == "10.0.0.1");
        assert_eq!(kept.endpoints().len(), 1);
        assert_eq!(kept.metadata, held.metadata);
    }

    #[test]
    fn a_slice_of_the_wrong_shape_is_refused() {
        let bad = r#"{"addressType":"IPv4","endpoints":[{"addresses":"10.0.0.1"}],"metadata":{}}"#;
        assert!(serde_json::from_str::<SliceObject>(bad).is_err());
    }
}
