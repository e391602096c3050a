//! An EndpointSlice as Floodgate holds it: its JSON, written once, with its namespace, name and
//! service beside it (what the engine reads of its metadata) and, for each endpoint, where its
//! JSON and its key lie in that JSON and whether it is ready (what the engine reads of every
//! endpoint on every change).
//!
//! Why: the cap chooses among all of a selected service's endpoints, so the upstream cache
//! holds every one of them, published or not, and a decoded k8s-openapi `Endpoint` spends its
//! fixed layout on every field it could have (376 bytes inline, most of them `None`: the
//! object reference alone is seven optional strings), plus an allocation per string. Held as
//! one JSON a slice costs its own bytes, one allocation for them and 20 bytes an endpoint. Its
//! metadata is not held typed either (a typed `ObjectMeta` with its labels' B-tree cost 700
//! bytes a slice, 7 MB for 1,000 small services): [`SliceObject::metadata`] decodes it from
//! the JSON where a label selector or a metadata-only form reads it. The pods its endpoints
//! name share its namespace's allocation ([`SliceObject::pod_refs_ready`]).
//! The same JSON is what the view serves ([`crate::view::Stored`] writes it behind
//! `apiVersion`, `kind` and the resourceVersion), so a published slice is held once: deflated,
//! as a [`HeldSlice`] (`deflated.rs` says when), and inflated whole where it is served (the
//! facade benchmark's LIST of 10,000 slices was 6-14 ms slower when a slice was written from a
//! buffer per endpoint). The typed form is
//! rebuilt where a consumer reads an endpoint's other fields: the protobuf encoding and the
//! gRPC snapshot, once per published version, and the pod references of published endpoints
//! ([`SliceObject::pod_refs`]).
//!
//! The JSON is written by serde from a typed `EndpointSlice` ([`From<EndpointSlice>`]), never
//! taken from the wire, so it always decodes back to the same slice: [`SliceObject::to_slice`]
//! is exact, and an object that decoded once cannot fail to decode again. It is written
//! without the upstream `resourceVersion` and `managedFields` (what
//! [`super::Object::into_sanitized`] drops of other kinds), `metadata` first and `endpoints`
//! last, so two states compare by their JSON and [`SliceObject::retain`] copies all but the
//! endpoints whole.

use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use super::{NsName, SERVICE_NAME_LABEL};

/// Where one endpoint lies in its slice's buffer.
#[derive(Clone, Copy, Debug)]
struct Held {
    /// Its JSON.
    json: (u32, u32),
    /// Its key: the address inside its JSON (nearly every endpoint has one address), or, for
    /// a key that is not written there as it is, its copy after the slice's JSON.
    key: (u32, u32),
    /// Whether it is ready (an endpoint without the condition counts as ready, as the API
    /// documents).
    ready: bool,
}

/// One endpoint of a [`SliceObject`].
#[derive(Clone, Copy, Debug)]
pub struct SliceEndpoint<'a> {
    buf: &'a str,
    held: &'a Held,
}

impl PartialEq for SliceEndpoint<'_> {
    fn eq(&self, other: &Self) -> bool {
        // The key and readiness are read out of the JSON, so the JSON decides.
        self.json() == other.json()
    }
}

impl<'a> SliceEndpoint<'a> {
    /// Its identity within a service: its addresses, joined by commas.
    pub fn key(&self) -> &'a str {
        at(self.buf, self.held.key)
    }

    /// Its first address (what two states of a slice are matched by).
    pub fn first_address(&self) -> &'a str {
        self.key().split(',').next().unwrap_or_default()
    }

    /// True when it is ready (an endpoint without the condition counts as ready, as the API
    /// documents).
    pub fn is_ready(&self) -> bool {
        self.held.ready
    }

    /// Its JSON.
    pub fn json(&self) -> &'a str {
        at(self.buf, self.held.json)
    }

    /// The typed endpoint.
    pub fn decode(&self) -> Endpoint {
        serde_json::from_str(self.json())
            .expect("the JSON was encoded from an Endpoint, so it decodes as one")
    }
}

/// The text of `buf` at `range` (a range [`Build`] recorded, so always on a character
/// boundary).
fn at(buf: &str, (start, end): (u32, u32)) -> &str {
    &buf[start as usize..end as usize]
}

/// The pod an endpoint's or an address's JSON points at (its `targetRef`), if it is a pod.
/// `owner` is the namespace of the object holding it, for a reference that names none, and
/// shared by a reference that names it.
pub(super) fn raw_pod_ref(json: &str, owner: &Arc<str>) -> Option<NsName> {
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
    let r = serde_json::from_str::<Target<'_>>(json).ok()?.target_ref?;
    if r.kind.as_deref() != Some("Pod") {
        return None;
    }
    let namespace = match r.namespace.as_deref() {
        None => owner.clone(),
        Some(ns) if ns == &**owner => owner.clone(),
        Some(ns) => ns.into(),
    };
    Some(NsName {
        namespace,
        name: r.name?.as_ref().into(),
    })
}

/// The metadata of a slice's JSON, decoded (the rest is skipped).
fn metadata_of(json: &str) -> ObjectMeta {
    #[derive(Deserialize)]
    struct Head {
        #[serde(default)]
        metadata: ObjectMeta,
    }
    serde_json::from_str::<Head>(json)
        .expect("the JSON was encoded from an EndpointSlice, so its metadata decodes")
        .metadata
}

/// An EndpointSlice held compactly (see the module docs).
#[derive(Clone, Debug)]
pub struct SliceObject {
    /// Its namespace and name.
    id: NsName,
    /// Its `kubernetes.io/service-name` label: the service it belongs to.
    service: Option<Arc<str>>,
    /// `{"metadata":..,"addressType":..,"ports":..,"endpoints":[..]}`, then the keys that are
    /// not written in it as they are.
    buf: Box<str>,
    /// Where the JSON ends in `buf`.
    json_end: u32,
    /// Where its `endpoints` array opens in the JSON (`[`); `None` when the slice lists none
    /// (the API server writes `null`).
    endpoints_at: Option<u32>,
    endpoints: Box<[Held]>,
}

impl PartialEq for SliceObject {
    fn eq(&self, other: &Self) -> bool {
        // Everything it holds is read out of the JSON.
        self.json() == other.json()
    }
}

impl Default for SliceObject {
    fn default() -> Self {
        EndpointSlice::default().into()
    }
}

/// A position in a slice's buffer: objects over 2 MiB are refused upstream, so a buffer is
/// far below 4 GiB.
fn pos(n: usize) -> u32 {
    u32::try_from(n).expect("a slice's JSON is under 4 GiB")
}

/// Where a single-address endpoint's key lies in its JSON, when it is written there as it is
/// (serde writes `addresses` first, and an address with nothing to escape as itself).
fn key_in(json: &[u8], key: &str) -> Option<usize> {
    const OPEN: &[u8] = br#"{"addresses":[""#;
    let plain = !key.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20);
    let rest = json.strip_prefix(OPEN)?;
    (plain && rest.strip_prefix(key.as_bytes())?.starts_with(b"\"]")).then_some(OPEN.len())
}

/// Writes a slice's buffer: the JSON up to its endpoints, each endpoint, then the keys that
/// are not in the JSON.
struct Build {
    b: Vec<u8>,
    endpoints_at: Option<u32>,
    held: Vec<Held>,
    /// Endpoints whose key goes after the JSON, with the key.
    own_keys: Vec<(usize, String)>,
}

impl Build {
    /// Starts with what `head` writes (`{"metadata":..` and the fields before `endpoints`, no
    /// closing brace); `endpoints` opens the array.
    fn new(capacity: usize, head: impl FnOnce(&mut Vec<u8>), endpoints: bool) -> Self {
        let mut b = Vec::with_capacity(capacity);
        head(&mut b);
        let mut endpoints_at = None;
        if endpoints {
            b.extend_from_slice(br#","endpoints":"#);
            endpoints_at = Some(pos(b.len()));
            b.push(b'[');
        }
        Self {
            b,
            endpoints_at,
            held: Vec::new(),
            own_keys: Vec::new(),
        }
    }

    /// Adds an endpoint that `write` writes, whose key is `key`.
    fn endpoint(&mut self, write: impl FnOnce(&mut Vec<u8>), key: &str, ready: bool) {
        if !self.held.is_empty() {
            self.b.push(b',');
        }
        let start = self.b.len();
        write(&mut self.b);
        let end = self.b.len();
        let key_at = match key_in(&self.b[start..end], key) {
            Some(off) => (pos(start + off), pos(start + off + key.len())),
            None => {
                self.own_keys.push((self.held.len(), key.to_owned()));
                (0, 0)
            }
        };
        self.held.push(Held {
            json: (pos(start), pos(end)),
            key: key_at,
            ready,
        });
    }

    fn finish(mut self, (id, service): (NsName, Option<Arc<str>>)) -> SliceObject {
        if self.endpoints_at.is_some() {
            self.b.push(b']');
        }
        self.b.push(b'}');
        let json_end = pos(self.b.len());
        for (i, key) in self.own_keys {
            let start = self.b.len();
            self.b.extend_from_slice(key.as_bytes());
            self.held[i].key = (pos(start), pos(self.b.len()));
        }
        let buf = String::from_utf8(self.b)
            .expect("JSON written by serde and keys copied from strings are UTF-8");
        SliceObject {
            id,
            service,
            buf: buf.into_boxed_str(),
            json_end,
            endpoints_at: self.endpoints_at,
            endpoints: self.held.into_boxed_slice(),
        }
    }
}

/// A slice written from `json` (a [`SliceObject`]'s, whose `endpoints` array opens at
/// `endpoints_at`): everything but the endpoints copied as it is written, then, when `open`,
/// an `endpoints` array of `endpoints` (each one's JSON, key and readiness).
fn rebuild<'a>(
    json: &str,
    (endpoints_at, open): (Option<u32>, bool),
    endpoints: impl Iterator<Item = (&'a str, &'a str, bool)>,
    id: (NsName, Option<Arc<str>>),
) -> SliceObject {
    let json = json.as_bytes();
    let head = match endpoints_at {
        Some(at) => &json[..at as usize - r#","endpoints":"#.len()],
        // Without its closing brace.
        None => &json[..json.len() - 1],
    };
    let mut b = Build::new(json.len() + 16, |b| b.extend_from_slice(head), open);
    for (e, key, ready) in endpoints {
        b.endpoint(|out| out.extend_from_slice(e.as_bytes()), key, ready);
    }
    b.finish(id)
}

impl From<EndpointSlice> for SliceObject {
    /// Holds `s` without its upstream `resourceVersion` and `managedFields`.
    fn from(mut s: EndpointSlice) -> Self {
        s.metadata.resource_version = None;
        s.metadata.managed_fields = None;
        // Writing typed values into a `Vec` has no failure case (their keys are strings).
        let head = |b: &mut Vec<u8>| {
            b.extend_from_slice(br#"{"metadata":"#);
            let _ = serde_json::to_writer(&mut *b, &s.metadata);
            b.extend_from_slice(br#","addressType":"#);
            let _ = serde_json::to_writer(&mut *b, &s.address_type);
            if let Some(ports) = &s.ports {
                b.extend_from_slice(br#","ports":"#);
                let _ = serde_json::to_writer(&mut *b, ports);
            }
        };
        let eps = s.endpoints.as_deref();
        // Room for a pod's endpoint with a zone and a node (held without what is left over).
        let capacity = 1024 + 256 * eps.map_or(0, <[_]>::len);
        let mut b = Build::new(capacity, head, eps.is_some());
        for e in eps.into_iter().flatten() {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            let key = match e.addresses.as_slice() {
                [one] => Cow::Borrowed(one.as_str()),
                many => Cow::Owned(many.join(",")),
            };
            b.endpoint(
                |out| {
                    let _ = serde_json::to_writer(out, e);
                },
                &key,
                ready,
            );
        }
        let service = (s.metadata.labels.as_ref())
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .map(|name| Arc::from(name.as_str()));
        b.finish((NsName::of(&s.metadata), service))
    }
}

impl SliceObject {
    /// Its namespace and name.
    pub fn id(&self) -> &NsName {
        &self.id
    }

    /// The service it belongs to (its `kubernetes.io/service-name` label), in its namespace.
    pub fn service(&self) -> Option<NsName> {
        Some(NsName {
            namespace: self.id.namespace.clone(),
            name: self.service.clone()?,
        })
    }

    /// Its metadata, decoded (the rest of the JSON is skipped).
    pub fn metadata(&self) -> ObjectMeta {
        metadata_of(self.json())
    }

    /// Its JSON, without `apiVersion`, `kind` and `metadata.resourceVersion`, `metadata`
    /// first.
    pub fn json(&self) -> &str {
        &self.buf[..self.json_end as usize]
    }

    /// Its endpoints (none when the slice lists none).
    pub fn endpoints(&self) -> impl ExactSizeIterator<Item = SliceEndpoint<'_>> + Clone {
        self.endpoints.iter().map(|held| SliceEndpoint {
            buf: &self.buf,
            held,
        })
    }

    /// The same slice with only the endpoints `keep` accepts (everything but the endpoints
    /// copied as it is written).
    pub fn retain(&self, mut keep: impl FnMut(SliceEndpoint<'_>) -> bool) -> SliceObject {
        let kept = self.endpoints().filter(|e| keep(*e));
        // A slice that listed none (`null`) lists an empty set once retained.
        rebuild(
            self.json(),
            (self.endpoints_at, true),
            kept.map(|e| (e.json(), e.key(), e.is_ready())),
            (self.id.clone(), self.service.clone()),
        )
    }

    /// The typed slice.
    pub fn to_slice(&self) -> EndpointSlice {
        serde_json::from_str(self.json())
            .expect("the JSON was encoded from an EndpointSlice, so it decodes as one")
    }

    /// The pods its endpoints point at.
    pub fn pod_refs(&self) -> impl Iterator<Item = NsName> + '_ {
        self.pod_refs_ready().map(|(pod, _)| pod)
    }

    /// The pods its endpoints point at, each with its endpoint's readiness. A pod of the
    /// slice's namespace shares its allocation of the namespace.
    pub fn pod_refs_ready(&self) -> impl Iterator<Item = (NsName, bool)> + '_ {
        let owner = &self.id.namespace;
        self.endpoints()
            .filter_map(move |e| Some((raw_pod_ref(e.json(), owner)?, e.is_ready())))
    }
}

impl Serialize for SliceObject {
    /// As its JSON.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error as _;
        let raw: &RawValue = serde_json::from_str(self.json()).map_err(S::Error::custom)?;
        raw.serialize(s)
    }
}

impl<'de> Deserialize<'de> for SliceObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Decoded typed first: every field is checked, and the JSON is written from typed
        // values (the module docs say why).
        EndpointSlice::deserialize(d).map(Self::from)
    }
}

mod deflated;

pub use deflated::{DeflatedSlice, Dictionary, Form, HeldSlice, shared_dictionary};

#[cfg(test)]
mod tests;
