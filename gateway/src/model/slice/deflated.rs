//! An EndpointSlice held for the cap to choose from, not to serve: its JSON deflated, and beside
//! it what the cap reads of every endpoint (its key and readiness).
//!
//! Why: the cap chooses among all of a service's endpoints, so the upstream cache holds every
//! slice of a capped service, while the view serves at most the cap's worth of them. Held
//! whole, a service of 10,000 endpoints behind a cap of 1,000 cost nine slices' JSON unserved
//! for each one served: 2.48 MB of the 4.48 MB heap of a hub link (docs/figures.md, "Many
//! links"). Deflated at flate2's fastest level, a slice of pods' endpoints is about a
//! quarter of its JSON, and the cap still reads every key without inflating anything.
//!
//! Exact: the JSON deflated is the one [`SliceObject`] wrote, and thawing inflates it and
//! writes the slice as [`SliceObject::retain`] does, so a thawed slice is the slice that was
//! deflated, byte for byte (`tests`).
//!
//! [`HeldSlice`] is what the cache holds: a slice whole (shared with the view when served) or
//! deflated. The store says which (`churn::store`): deflated while its service has more
//! endpoints upstream than the cap.

use std::cell::RefCell;
use std::sync::Arc;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::{NsName, SliceObject, at, pos, rebuild};

/// One endpoint of a [`DeflatedSlice`]: where its JSON lies in the slice's JSON, where its key
/// ends in the slice's keys, and whether it is ready.
#[derive(Clone, Copy, Debug)]
struct Mark {
    json: (u32, u32),
    key_end: u32,
    ready: bool,
}

/// A slice deflated (see the module docs).
#[derive(Clone, Debug)]
pub struct DeflatedSlice {
    id: NsName,
    service: Option<Arc<str>>,
    /// The slice's JSON ([`SliceObject::json`]), deflated.
    deflated: Box<[u8]>,
    /// Its length inflated.
    json_len: u32,
    /// As [`SliceObject`]'s.
    endpoints_at: Option<u32>,
    /// Every endpoint's key, one after the other.
    keys: Box<str>,
    endpoints: Box<[Mark]>,
}

thread_local! {
    /// A deflater and an inflater per thread, reset for each slice: each holds hundreds of KB
    /// of tables, which a fresh one allocates, and the kernel maps in and out, every time
    /// (a hub of 100 links starting took 15 s instead of 6 with one deflater a slice).
    static DEFLATE: RefCell<Compress> = RefCell::new(Compress::new(Compression::fast(), false));
    static INFLATE: RefCell<Decompress> = RefCell::new(Decompress::new(false));
}

/// `input` deflated (raw, no zlib header), or `None` if the deflater fails.
fn deflate(input: &[u8]) -> Option<Vec<u8>> {
    DEFLATE.with_borrow_mut(|z| {
        z.reset();
        let mut out = Vec::with_capacity(input.len() / 3 + 64);
        loop {
            let read = usize::try_from(z.total_in()).ok()?;
            match z.compress_vec(&input[read..], &mut out, FlushCompress::Finish) {
                Ok(Status::StreamEnd) => return Some(out),
                Ok(_) => out.reserve(out.capacity()),
                Err(_) => return None,
            }
        }
    })
}

/// `deflated` inflated: `len` bytes of UTF-8, in one call into a buffer of exactly that size
/// (the length is known, so there is no loop to grow it).
fn inflate(deflated: &[u8], len: usize) -> String {
    let out = INFLATE.with_borrow_mut(|z| {
        z.reset(false);
        let mut out = Vec::with_capacity(len);
        let status = z.decompress_vec(deflated, &mut out, FlushDecompress::Finish);
        assert!(
            matches!(status, Ok(Status::StreamEnd)) && out.len() == len,
            "a slice deflated by `deflate` inflates to its {len} bytes: {status:?}, {} bytes",
            out.len()
        );
        out
    });
    String::from_utf8(out).expect("deflated from a SliceObject's JSON, so it inflates to UTF-8")
}

impl DeflatedSlice {
    /// `s` deflated; `None` if the deflater fails (the slice is then held whole).
    pub fn new(s: &SliceObject) -> Option<Self> {
        let json = s.json();
        let mut keys = String::new();
        let endpoints = s
            .endpoints()
            .map(|e| {
                keys.push_str(e.key());
                Mark {
                    json: e.held.json,
                    key_end: pos(keys.len()),
                    ready: e.is_ready(),
                }
            })
            .collect();
        let deflated = deflate(json.as_bytes())?;
        Some(Self {
            id: s.id.clone(),
            service: s.service.clone(),
            deflated: deflated.into_boxed_slice(),
            json_len: pos(json.len()),
            endpoints_at: s.endpoints_at,
            keys: keys.into_boxed_str(),
            endpoints,
        })
    }

    /// Its endpoints' keys and readiness.
    pub fn endpoints(&self) -> impl ExactSizeIterator<Item = (&str, bool)> + Clone {
        (0..self.endpoints.len()).map(|i| {
            let start = i.checked_sub(1).map_or(0, |p| self.endpoints[p].key_end);
            let m = &self.endpoints[i];
            (at(&self.keys, (start, m.key_end)), m.ready)
        })
    }

    /// The slice it deflated.
    pub fn thaw(&self) -> SliceObject {
        self.rebuild(self.endpoints_at.is_some(), |_, _| true)
    }

    /// The slice it deflated, with only the endpoints `keep` accepts (given each one's key and
    /// readiness), as [`SliceObject::retain`] writes it.
    pub fn retain(&self, keep: impl FnMut(&str, bool) -> bool) -> SliceObject {
        self.rebuild(true, keep)
    }

    /// Inflates its JSON and writes the slice with the endpoints `keep` accepts, in an
    /// `endpoints` array when `open`.
    fn rebuild(&self, open: bool, mut keep: impl FnMut(&str, bool) -> bool) -> SliceObject {
        let json = inflate(&self.deflated, self.json_len as usize);
        let kept = (self.endpoints.iter().zip(self.endpoints()))
            .filter(|(_, (key, ready))| keep(key, *ready))
            .map(|(m, (key, ready))| (at(&json, m.json), key, ready));
        rebuild(
            &json,
            (self.endpoints_at, open),
            kept,
            (self.id.clone(), self.service.clone()),
        )
    }
}

/// A slice as the upstream cache holds it.
#[derive(Clone, Debug)]
pub enum HeldSlice {
    /// As it would be served.
    Whole(Arc<SliceObject>),
    /// Deflated: a slice of a capped service. Boxed, so a slice held whole costs the store's
    /// map a pointer and a tag, as before there were two forms.
    Deflated(Box<DeflatedSlice>),
}

impl HeldSlice {
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

    /// True when held deflated.
    pub fn is_deflated(&self) -> bool {
        matches!(self, Self::Deflated(_))
    }

    /// Its endpoints' keys and readiness.
    pub fn endpoints(&self) -> Box<dyn Iterator<Item = (&str, bool)> + '_> {
        match self {
            Self::Whole(s) => Box::new(s.endpoints().map(|e| (e.key(), e.is_ready()))),
            Self::Deflated(d) => Box::new(d.endpoints()),
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

    /// Held whole when `whole`, deflated when not (a slice already so is left as it is; one
    /// the deflater fails stays whole).
    pub fn reform(&mut self, whole: bool) {
        match self {
            Self::Whole(s) if !whole => {
                if let Some(d) = DeflatedSlice::new(s) {
                    *self = Self::Deflated(Box::new(d));
                }
            }
            Self::Deflated(d) if whole => *self = Self::Whole(Arc::new(d.thaw())),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::{
        Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode, ForZone,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use proptest::prelude::*;

    use super::*;

    /// An endpoint with every field an EndpointSlice's endpoint can have (every one set when
    /// `extra` is).
    fn endpoint(
        addresses: Vec<String>,
        conditions: [Option<bool>; 3],
        pod: Option<String>,
        extra: Option<String>,
    ) -> Endpoint {
        let [ready, serving, terminating] = conditions;
        Endpoint {
            addresses,
            conditions: Some(EndpointConditions {
                ready,
                serving,
                terminating,
            }),
            target_ref: pod.map(|name| ObjectReference {
                api_version: Some("v1".into()),
                field_path: extra.clone(),
                kind: Some("Pod".into()),
                namespace: Some("ns".into()),
                resource_version: Some("42".into()),
                uid: Some(format!("uid-of-{name}")),
                name: Some(name),
            }),
            deprecated_topology: extra
                .clone()
                .map(|e| [("topology.kubernetes.io/zone".into(), e)].into()),
            hostname: extra.clone(),
            node_name: extra.clone().map(|e| format!("node-{e}")),
            zone: extra.clone().map(|e| format!("zone-\"{e}\"")),
            hints: extra.map(|e| EndpointHints {
                for_nodes: Some(vec![ForNode { name: e.clone() }]),
                for_zones: Some(vec![ForZone { name: e }]),
            }),
        }
    }

    fn slice(endpoints: Option<Vec<Endpoint>>) -> SliceObject {
        SliceObject::from(EndpointSlice {
            metadata: ObjectMeta {
                name: Some("web-abc".into()),
                namespace: Some("ns".into()),
                labels: Some([(super::super::SERVICE_NAME_LABEL.into(), "web".into())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints,
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: Some(8080),
                ..Default::default()
            }]),
        })
    }

    fn address() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u8..4, 0u8..255).prop_map(|(a, b)| format!("10.0.{a}.{b}")),
            "[0-9a-f:]{2,12}",
            // Not what a slice should hold, but what it could: written escaped in its JSON.
            "[a-z\"\\\\é]{1,6}",
        ]
    }

    fn endpoints() -> impl Strategy<Value = Option<Vec<Endpoint>>> {
        let condition = prop::option::of(any::<bool>());
        let one = (
            prop::collection::vec(address(), 0..3),
            [condition.clone(), condition.clone(), condition],
            prop::option::of("[a-z0-9-]{1,12}"),
            prop::option::of("[a-z]{1,4}"),
        )
            .prop_map(|(a, c, p, e)| endpoint(a, c, p, e));
        prop::option::of(prop::collection::vec(one, 0..12))
    }

    proptest! {
        /// Thawed, a deflated slice is the slice it deflated, byte for byte, and it lists the
        /// same keys and readiness; what it keeps of it is what the whole slice's `retain`
        /// keeps.
        #[test]
        fn a_deflated_slice_thaws_to_the_slice_it_deflated(eps in endpoints(), every in 1usize..4) {
            let whole = slice(eps);
            let deflated = DeflatedSlice::new(&whole).expect("deflates");
            let thawed = deflated.thaw();
            prop_assert_eq!(thawed.json(), whole.json());
            let marks = |s: &SliceObject| -> Vec<(String, bool)> {
                s.endpoints().map(|e| (e.key().to_owned(), e.is_ready())).collect()
            };
            prop_assert_eq!(marks(&thawed), marks(&whole));
            let listed: Vec<(String, bool)> =
                deflated.endpoints().map(|(k, r)| (k.to_owned(), r)).collect();
            prop_assert_eq!(&listed, &marks(&whole));
            prop_assert_eq!(thawed.service(), whole.service());
            prop_assert_eq!(thawed.id(), whole.id());

            let mut n = 0;
            let mut i = 0;
            let kept = deflated.retain(|_, _| { n += 1; n % every == 0 });
            let expected = whole.retain(|_| { i += 1; i % every == 0 });
            prop_assert_eq!(kept.json(), expected.json());
            prop_assert_eq!(marks(&kept), marks(&expected));
        }
    }

    #[test]
    fn a_slice_of_pods_endpoints_deflates_to_under_a_third_of_its_json() {
        let eps = (0..10)
            .map(|i| {
                let mut e = endpoint(
                    vec![format!("10.0.3.{i}")],
                    [Some(true), Some(true), Some(false)],
                    Some(format!("web-7d9f8b6c5-{i:05}")),
                    None,
                );
                e.node_name = Some(format!("node-{}", i % 4));
                e.zone = Some(format!("zone-{}", i % 3));
                e
            })
            .collect();
        let whole = slice(Some(eps));
        let deflated = DeflatedSlice::new(&whole).expect("deflates");
        // The bytes it holds beyond its fixed layout: the deflated JSON, the keys, the marks.
        let held = deflated.deflated.len()
            + deflated.keys.len()
            + std::mem::size_of_val(&*deflated.endpoints);
        let json = whole.json().len();
        assert!(
            held * 3 < json,
            "deflated, a slice holds {held} bytes of its {json} bytes of JSON"
        );
    }

    #[test]
    fn a_slice_held_whole_costs_the_store_a_pointer_and_a_tag() {
        assert_eq!(std::mem::size_of::<HeldSlice>(), 16);
    }

    #[test]
    fn a_held_slice_reforms_both_ways_and_keeps_what_it_lists() {
        let whole = Arc::new(slice(Some(vec![endpoint(
            vec!["10.0.0.1".into()],
            [Some(false), None, None],
            Some("p".into()),
            None,
        )])));
        let mut held = HeldSlice::Whole(whole.clone());
        held.reform(false);
        assert!(matches!(held, HeldSlice::Deflated(_)));
        assert_eq!(held.endpoints().collect::<Vec<_>>(), [("10.0.0.1", false)]);
        assert_eq!(held.service(), whole.service());
        assert_eq!(held.whole().json(), whole.json());
        held.reform(true);
        let HeldSlice::Whole(again) = &held else {
            panic!("reformed whole, it is {held:?}")
        };
        assert_eq!(again.json(), whole.json());
    }
}
