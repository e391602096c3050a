//! [`HeldSlice`]: how a slice is held, whole or deflated, and what a held slice is read as
//! (see the docs of [`super`]); and the [`shared_dictionary`].

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use super::super::{NsName, SliceObject, metadata_of};
use super::{DeflatedSlice, Dictionary, inflate, inflate_into};

/// What a slice of a service within the cap is deflated against: the JSON of a typical
/// EndpointSlice, as [`SliceObject`] writes it, the same for every link. It costs nothing a
/// service (a service of one slice, the common case, would otherwise hold its own JSON as its
/// dictionary) and it gives what every slice repeats: the field names, the endpoint
/// controller's labels and owner reference, an endpoint's shape. A slice of ten pods'
/// endpoints with random uids holds a quarter of its JSON against it (`tests`).
pub fn shared_dictionary() -> &'static Dictionary {
    static SHARED: LazyLock<Dictionary> = LazyLock::new(|| {
        let endpoint = |n: u8| {
            serde_json::json!({
                "addresses": [format!("10.42.{n}.{n}")],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": format!("node-{n}"),
                "targetRef": {
                    "kind": "Pod",
                    "name": format!("web-7d9f8b6c5-x{n}q"),
                    "namespace": "default",
                    "uid": "9f1c7e52-3b4a-4d8e-a1f0-6c2d5e8b7a93",
                },
                "zone": "zone-a",
            })
        };
        let slice = serde_json::json!({
            "metadata": {
                "annotations": {
                    "endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z",
                },
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "generateName": "web-",
                "generation": 1,
                "labels": {
                    "app": "web",
                    "app.kubernetes.io/name": "web",
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                    "kubernetes.io/service-name": "web",
                    "mirror.linkerd.io/exported": "true",
                },
                "name": "web-abcde",
                "namespace": "default",
                "ownerReferences": [{
                    "apiVersion": "v1",
                    "blockOwnerDeletion": true,
                    "controller": true,
                    "kind": "Service",
                    "name": "web",
                    "uid": "0b8e6a4c-2f1d-4e7a-9c3b-5d6f7a8b9c0d",
                }],
                "uid": "4c3b2a1d-0e9f-4a8b-b7c6-d5e4f3a2b1c0",
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [endpoint(1), endpoint(2)],
        });
        let slice: EndpointSlice =
            serde_json::from_value(slice).expect("the shared dictionary is an EndpointSlice");
        Dictionary::from(SliceObject::from(slice).json().as_bytes())
    });
    &SHARED
}

/// The form a slice is to be held in ([`HeldSlice::reform`]).
#[derive(Clone, Copy, Debug)]
pub enum Form<'a> {
    /// Whole.
    Whole,
    /// Deflated, against the dictionary if any.
    Deflated(Option<&'a Dictionary>),
}

/// A slice as Floodgate holds it (see the module docs). Cloning it shares it.
#[derive(Clone, Debug)]
pub enum HeldSlice {
    /// As it is written: a slice just decoded (changed since its service last published), or
    /// one a deflater failed.
    Whole(Arc<SliceObject>),
    /// Deflated. Behind a pointer, so a held slice costs a map a pointer and a tag.
    Deflated(Arc<DeflatedSlice>),
}

impl From<SliceObject> for HeldSlice {
    fn from(s: SliceObject) -> Self {
        Self::Whole(Arc::new(s))
    }
}

impl From<Arc<SliceObject>> for HeldSlice {
    fn from(s: Arc<SliceObject>) -> Self {
        Self::Whole(s)
    }
}

impl PartialEq for HeldSlice {
    /// By their JSON. Two slices deflated against one dictionary compare deflated: the
    /// deflater is deterministic, so the same JSON deflates to the same bytes.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Whole(a), Self::Whole(b)) => Arc::ptr_eq(a, b) || a == b,
            (Self::Deflated(a), Self::Deflated(b)) if Arc::ptr_eq(a, b) => true,
            (Self::Deflated(a), Self::Deflated(b))
                if (a.dictionary.as_ref().map(Arc::as_ptr))
                    == (b.dictionary.as_ref().map(Arc::as_ptr)) =>
            {
                a.json_len == b.json_len && a.deflated == b.deflated
            }
            _ => self.json() == other.json(),
        }
    }
}

impl HeldSlice {
    /// Its namespace and name.
    pub fn id(&self) -> &NsName {
        match self {
            Self::Whole(s) => &s.id,
            Self::Deflated(d) => &d.id,
        }
    }

    /// The service it belongs to (its `kubernetes.io/service-name` label), in its namespace.
    pub fn service(&self) -> Option<NsName> {
        let (id, name) = match self {
            Self::Whole(s) => (&s.id, &s.service),
            Self::Deflated(d) => (&d.id, &d.service),
        };
        Some(NsName {
            namespace: id.namespace.clone(),
            name: name.clone()?,
        })
    }

    /// How many endpoints it lists.
    pub fn len(&self) -> usize {
        match self {
            Self::Whole(s) => s.endpoints.len(),
            Self::Deflated(d) => d.endpoints.len(),
        }
    }

    /// True when it lists no endpoint.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its endpoints' keys and readiness.
    pub fn endpoints(&self) -> Box<dyn Iterator<Item = (&str, bool)> + '_> {
        match self {
            Self::Whole(s) => Box::new(s.endpoints().map(|e| (e.key(), e.is_ready()))),
            Self::Deflated(d) => Box::new(d.endpoints()),
        }
    }

    /// Its JSON ([`SliceObject::json`]): borrowed when held whole, inflated when deflated.
    pub fn json(&self) -> Cow<'_, str> {
        match self {
            Self::Whole(s) => Cow::Borrowed(s.json()),
            Self::Deflated(d) => Cow::Owned(inflate(
                &d.deflated,
                d.json_len as usize,
                d.dictionary.as_deref(),
            )),
        }
    }

    /// Appends its JSON ([`SliceObject::json`]) to `out`: copied when held whole, inflated
    /// there when deflated (no buffer of its own: what a LIST writes 10,000 times).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Self::Whole(s) => out.extend_from_slice(s.json().as_bytes()),
            Self::Deflated(d) => inflate_into(
                &d.deflated,
                d.json_len as usize,
                d.dictionary.as_deref(),
                out,
            ),
        }
    }

    /// Its metadata, decoded (the rest of the JSON is skipped).
    pub fn metadata(&self) -> ObjectMeta {
        metadata_of(&self.json())
    }

    /// The typed slice.
    pub fn to_slice(&self) -> EndpointSlice {
        serde_json::from_str(&self.json())
            .expect("the JSON was encoded from an EndpointSlice, so it decodes as one")
    }

    /// The pods its endpoints point at, each with its endpoint's readiness (read from its
    /// JSON inflated when deflated).
    pub fn pod_refs_ready(&self) -> Vec<(NsName, bool)> {
        match self {
            Self::Whole(s) => s.pod_refs_ready().collect(),
            Self::Deflated(d) => d.pod_refs_ready(),
        }
    }

    /// The slice whole: shared when held whole, thawed when deflated.
    pub fn whole(&self) -> Arc<SliceObject> {
        match self {
            Self::Whole(s) => s.clone(),
            Self::Deflated(d) => Arc::new(d.thaw()),
        }
    }

    /// The slice with only the endpoints `keep` accepts (given each one's key).
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) -> SliceObject {
        match self {
            Self::Whole(s) => s.retain(|e| keep(e.key())),
            Self::Deflated(d) => d.retain(|key, _| keep(key)),
        }
    }

    /// Held in `form`: deflated anew when it is held against another dictionary (a slice
    /// already so is left as it is; one the deflater fails is held whole).
    pub fn reform(&mut self, form: Form<'_>) {
        let same = |d: &DeflatedSlice, to: Option<&Dictionary>| {
            (d.dictionary.as_ref().map(Arc::as_ptr)) == to.map(Arc::as_ptr)
        };
        match (&*self, form) {
            (Self::Deflated(_), Form::Whole) => *self = Self::Whole(self.whole()),
            (Self::Deflated(d), Form::Deflated(to)) if same(d, to) => {}
            (_, Form::Deflated(dictionary)) => {
                let whole = self.whole();
                *self = match DeflatedSlice::new(&whole, dictionary) {
                    Some(d) => Self::Deflated(Arc::new(d)),
                    None => Self::Whole(whole),
                };
            }
            (Self::Whole(_), Form::Whole) => {}
        }
    }

    /// True when `other` is this very slice, held once (not an equal copy).
    pub fn shares(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Whole(a), Self::Whole(b)) => Arc::ptr_eq(a, b),
            (Self::Deflated(a), Self::Deflated(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The dictionary it is deflated against, if any.
    pub fn dictionary(&self) -> Option<&Dictionary> {
        match self {
            Self::Whole(_) => None,
            Self::Deflated(d) => d.dictionary.as_ref(),
        }
    }
}

impl Serialize for HeldSlice {
    /// As its JSON.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error as _;
        let json = self.json();
        let raw: &RawValue = serde_json::from_str(&json).map_err(S::Error::custom)?;
        raw.serialize(s)
    }
}

impl<'de> Deserialize<'de> for HeldSlice {
    /// Held whole, as decoded.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        SliceObject::deserialize(d).map(Self::from)
    }
}
