//! A core/v1 Endpoints as Floodgate holds it: its metadata and ports typed, and each address as
//! the JSON it encodes to, beside its IP (what the cap chooses by). The reasons are the
//! EndpointSlices' ([`super::SliceObject`]): a decoded `EndpointAddress` is 240 bytes inline
//! (its object reference alone seven optional strings) before its strings, and every address of
//! a selected service is held, published or not.
//!
//! As for slices, the JSON is written by serde from a typed `EndpointAddress`, so it always
//! decodes back to the same one.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset, Endpoints};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use super::NsName;
use super::slice::raw_pod_ref;

/// One address of an [`EndpointsObject`].
#[derive(Clone, Debug)]
pub struct HeldAddress {
    ip: Box<str>,
    json: Box<RawValue>,
}

impl PartialEq for HeldAddress {
    fn eq(&self, other: &Self) -> bool {
        self.json.get() == other.json.get()
    }
}

impl HeldAddress {
    /// Its IP.
    pub fn ip(&self) -> &str {
        &self.ip
    }

    fn decode(&self) -> EndpointAddress {
        serde_json::from_str(self.json.get())
            .expect("the JSON was encoded from an EndpointAddress, so it decodes as one")
    }
}

impl From<EndpointAddress> for HeldAddress {
    fn from(a: EndpointAddress) -> Self {
        let json = serde_json::value::to_raw_value(&a)
            .expect("a k8s-openapi EndpointAddress always encodes as JSON");
        Self {
            ip: a.ip.into_boxed_str(),
            json,
        }
    }
}

/// One subset of an [`EndpointsObject`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeldSubset {
    /// `addresses` (ready).
    pub addresses: Option<Box<[HeldAddress]>>,
    /// `notReadyAddresses`.
    pub not_ready_addresses: Option<Box<[HeldAddress]>>,
    /// `ports`.
    pub ports: Option<Vec<EndpointPort>>,
}

fn held(v: Option<Vec<EndpointAddress>>) -> Option<Box<[HeldAddress]>> {
    v.map(|v| v.into_iter().map(HeldAddress::from).collect())
}

fn typed(v: &Option<Box<[HeldAddress]>>) -> Option<Vec<EndpointAddress>> {
    v.as_ref()
        .map(|v| v.iter().map(HeldAddress::decode).collect())
}

impl HeldSubset {
    /// Its ready addresses, then its not-ready ones, each with its readiness.
    pub fn addresses(&self) -> impl Iterator<Item = (&HeldAddress, bool)> {
        fn all(
            v: &Option<Box<[HeldAddress]>>,
            ready: bool,
        ) -> impl Iterator<Item = (&HeldAddress, bool)> {
            v.as_deref()
                .unwrap_or_default()
                .iter()
                .map(move |a| (a, ready))
        }
        all(&self.addresses, true).chain(all(&self.not_ready_addresses, false))
    }
}

/// A core/v1 Endpoints held compactly (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndpointsObject {
    /// The object's metadata.
    pub metadata: ObjectMeta,
    /// `subsets`.
    pub subsets: Option<Box<[HeldSubset]>>,
}

impl From<Endpoints> for EndpointsObject {
    fn from(e: Endpoints) -> Self {
        Self {
            metadata: e.metadata,
            subsets: e.subsets.map(|s| {
                s.into_iter()
                    .map(|s| {
                        let mut ports = s.ports;
                        if let Some(p) = &mut ports {
                            p.shrink_to_fit();
                        }
                        HeldSubset {
                            addresses: held(s.addresses),
                            not_ready_addresses: held(s.not_ready_addresses),
                            ports,
                        }
                    })
                    .collect()
            }),
        }
    }
}

impl EndpointsObject {
    /// Its subsets (none when it lists none).
    pub fn subsets(&self) -> &[HeldSubset] {
        self.subsets.as_deref().unwrap_or_default()
    }

    /// The same object with only the addresses whose IP `keep` accepts; a list left empty is
    /// left out, as the API server leaves it out.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) -> EndpointsObject {
        let kept = |v: &Option<Box<[HeldAddress]>>| -> Option<Box<[HeldAddress]>> {
            let kept: Box<[HeldAddress]> = v
                .as_deref()
                .unwrap_or_default()
                .iter()
                .filter(|a| keep(a.ip()))
                .cloned()
                .collect();
            (!kept.is_empty()).then_some(kept)
        };
        EndpointsObject {
            metadata: self.metadata.clone(),
            subsets: self.subsets.as_ref().map(|s| {
                s.iter()
                    .map(|s| HeldSubset {
                        addresses: kept(&s.addresses),
                        not_ready_addresses: kept(&s.not_ready_addresses),
                        ports: s.ports.clone(),
                    })
                    .collect()
            }),
        }
    }

    /// The typed object.
    pub fn to_endpoints(&self) -> Endpoints {
        Endpoints {
            metadata: self.metadata.clone(),
            subsets: self.subsets.as_ref().map(|s| {
                s.iter()
                    .map(|s| EndpointSubset {
                        addresses: typed(&s.addresses),
                        not_ready_addresses: typed(&s.not_ready_addresses),
                        ports: s.ports.clone(),
                    })
                    .collect()
            }),
        }
    }

    /// The pods its addresses point at.
    pub fn pod_refs(&self) -> impl Iterator<Item = NsName> + '_ {
        self.pod_refs_ready().map(|(pod, _)| pod)
    }

    /// The pods its addresses point at, each with its address's readiness (`addresses` are
    /// ready, `notReadyAddresses` are not).
    pub fn pod_refs_ready(&self) -> impl Iterator<Item = (NsName, bool)> + '_ {
        let owner: Arc<str> = self
            .metadata
            .namespace
            .as_deref()
            .unwrap_or_default()
            .into();
        self.subsets()
            .iter()
            .flat_map(HeldSubset::addresses)
            .filter_map(move |(a, ready)| Some((raw_pod_ref(a.json.get(), &owner)?, ready)))
    }
}

impl Serialize for HeldSubset {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Raw<'a>(&'a [HeldAddress]);
        impl Serialize for Raw<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter().map(|a| &*a.json))
            }
        }
        let mut st = s.serialize_struct("EndpointSubset", 3)?;
        match &self.addresses {
            Some(a) => st.serialize_field("addresses", &Raw(a))?,
            None => st.skip_field("addresses")?,
        }
        match &self.not_ready_addresses {
            Some(a) => st.serialize_field("notReadyAddresses", &Raw(a))?,
            None => st.skip_field("notReadyAddresses")?,
        }
        match &self.ports {
            Some(p) => st.serialize_field("ports", p)?,
            None => st.skip_field("ports")?,
        }
        st.end()
    }
}

impl Serialize for EndpointsObject {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // `metadata` first: the served forms write `apiVersion`, `kind` and the version before
        // it ([`crate::view::Stored`]).
        let mut st = s.serialize_struct("Endpoints", 2)?;
        st.serialize_field("metadata", &self.metadata)?;
        match &self.subsets {
            Some(v) => st.serialize_field("subsets", v)?,
            None => st.skip_field("subsets")?,
        }
        st.end()
    }
}

impl<'de> Deserialize<'de> for EndpointsObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Decoded typed first, for the reasons the slices' module gives.
        Endpoints::deserialize(d).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;

    fn full() -> Endpoints {
        let addr = |ip: &str, pod: Option<&str>| EndpointAddress {
            ip: ip.into(),
            hostname: Some("h".into()),
            node_name: Some("node-a".into()),
            target_ref: pod.map(|p| ObjectReference {
                kind: Some("Pod".into()),
                name: Some(p.into()),
                ..Default::default()
            }),
        };
        Endpoints {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("prod".into()),
                ..Default::default()
            },
            subsets: Some(vec![EndpointSubset {
                addresses: Some(vec![addr("10.0.0.1", Some("web-1"))]),
                not_ready_addresses: Some(vec![
                    addr("10.0.0.2", Some("web-2")),
                    addr("10.0.0.3", None),
                ]),
                ports: Some(vec![EndpointPort {
                    name: Some("http".into()),
                    port: 8080,
                    ..Default::default()
                }]),
            }]),
        }
    }

    #[test]
    fn held_endpoints_give_back_what_they_were_made_from() {
        let e = full();
        let held = EndpointsObject::from(e.clone());
        assert_eq!(held.to_endpoints(), e, "typed round trip");
        let mut typed = serde_json::to_value(&e).expect("encodes");
        for k in ["kind", "apiVersion"] {
            typed.as_object_mut().map(|m| m.remove(k));
        }
        assert_eq!(
            serde_json::to_value(&held).expect("encodes"),
            typed,
            "same JSON"
        );
        let back: EndpointsObject =
            serde_json::from_str(&serde_json::to_string(&held).expect("encodes")).expect("decodes");
        assert_eq!(back, held, "JSON round trip");
    }

    #[test]
    fn addresses_pods_and_retain() {
        let held = EndpointsObject::from(full());
        let ips: Vec<(&str, bool)> = held.subsets()[0]
            .addresses()
            .map(|(a, r)| (a.ip(), r))
            .collect();
        assert_eq!(
            ips,
            [("10.0.0.1", true), ("10.0.0.2", false), ("10.0.0.3", false)]
        );
        let pods: Vec<NsName> = held.pod_refs().collect();
        assert_eq!(
            pods,
            [NsName::new("prod", "web-1"), NsName::new("prod", "web-2")]
        );
        let kept = held.retain(|ip| ip == "10.0.0.2");
        let s = &kept.subsets()[0];
        assert!(s.addresses.is_none(), "an emptied list is left out");
        assert_eq!(s.addresses().count(), 1);
        assert_eq!(s.ports, held.subsets()[0].ports);
    }
}
