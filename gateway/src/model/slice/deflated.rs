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
//! Deflated against a [`Dictionary`]: the JSON of one slice of the service, which the others
//! mostly repeat (their metadata and ports, the shape of every endpoint, the namespace and
//! the pods' names but for their suffix). Alone, each slice deflates its own first endpoint
//! and metadata; against the dictionary those are back-references: slices of ten pods'
//! endpoints, each pod with a random uid, deflate to 521 bytes each against 854 alone (`tests`).
//!
//! Exact: the JSON deflated is the one [`SliceObject`] wrote, and thawing inflates it and
//! writes the slice as [`SliceObject::retain`] does, so a thawed slice is the slice that was
//! deflated, byte for byte (`tests`).
//!
//! [`HeldSlice`] is how Floodgate holds a slice, in the upstream cache and in the view alike:
//! whole, or deflated. The store deflates every slice it holds (`churn::store`): against its
//! service's dictionary while the service has more endpoints upstream than the cap, against
//! [`shared_dictionary`] otherwise (a new slice as it arrives, a changed one when its service
//! publishes), and a slice it holds is the one its publication shares with the view. So a served slice is held once, deflated, and inflated where it is read:
//! written into a LIST or a resume, compared, or its pods read at a publication (see
//! ARCHITECTURE.md, "What a link holds, per object", for what that costs and saves).

use std::cell::RefCell;
use std::sync::Arc;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::{NsName, SliceObject, at, pos, raw_pod_ref, rebuild};

mod held;

pub use held::{Form, HeldSlice, shared_dictionary};

/// One endpoint of a [`DeflatedSlice`]: where its key ends in the slice's keys (the low 31
/// bits), and whether it is ready (the high bit). Where its JSON lies is found again when the
/// slice is thawed ([`spans`]).
#[derive(Clone, Copy, Debug)]
struct Mark(u32);

impl Mark {
    const READY: u32 = 1 << 31;

    fn new(key_end: usize, ready: bool) -> Self {
        let end = pos(key_end);
        assert!(end < Self::READY, "a slice's keys are under 2 GiB");
        Self(end | if ready { Self::READY } else { 0 })
    }

    fn key_end(self) -> u32 {
        self.0 & !Self::READY
    }

    fn ready(self) -> bool {
        self.0 & Self::READY != 0
    }
}

/// Where each element of the JSON array that opens at `at` in `json` lies: the endpoints of a
/// slice's JSON, as [`SliceObject`] wrote them (no space between them).
fn spans(json: &str, at: usize) -> Vec<(u32, u32)> {
    use serde::Deserialize;
    let mut de = serde_json::Deserializer::from_str(&json[at..]);
    let elements = Vec::<&serde_json::value::RawValue>::deserialize(&mut de)
        .expect("a SliceObject's endpoints are a JSON array");
    let base = json.as_ptr() as usize;
    (elements.iter())
        .map(|e| {
            let start = e.get().as_ptr() as usize - base;
            (pos(start), pos(start + e.get().len()))
        })
        .collect()
}

/// What the slices of one service are deflated against: the JSON of one of them (see the
/// module docs). Shared by the slices deflated against it, so any of them inflates alone.
pub type Dictionary = Arc<[u8]>;

/// A slice deflated (see the module docs).
#[derive(Clone, Debug)]
pub struct DeflatedSlice {
    id: NsName,
    service: Option<Arc<str>>,
    /// The slice's JSON ([`SliceObject::json`]), deflated against `dictionary`.
    deflated: Box<[u8]>,
    dictionary: Option<Dictionary>,
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

/// `input` deflated (raw, no zlib header) against `dictionary`, or `None` if the deflater
/// fails.
fn deflate(input: &[u8], dictionary: Option<&[u8]>) -> Option<Vec<u8>> {
    DEFLATE.with_borrow_mut(|z| {
        z.reset();
        if let Some(d) = dictionary {
            z.set_dictionary(d).ok()?;
        }
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

/// `deflated` inflated against the `dictionary` it was deflated against: `len` bytes of
/// UTF-8, in one call into a buffer of exactly that size (the length is known, so there is no
/// loop to grow it).
fn inflate(deflated: &[u8], len: usize, dictionary: Option<&[u8]>) -> String {
    let mut out = Vec::new();
    inflate_into(deflated, len, dictionary, &mut out);
    String::from_utf8(out).expect("deflated from a SliceObject's JSON, so it inflates to UTF-8")
}

/// [`inflate`], appended to `out` (which grows by exactly `len` bytes).
fn inflate_into(deflated: &[u8], len: usize, dictionary: Option<&[u8]>, out: &mut Vec<u8>) {
    INFLATE.with_borrow_mut(|z| {
        z.reset(false);
        if let Some(d) = dictionary {
            z.set_dictionary(d)
                .expect("a raw inflater takes a dictionary before its input");
        }
        out.reserve(len);
        let before = out.len();
        let status = z.decompress_vec(deflated, out, FlushDecompress::Finish);
        let inflated = out.len() - before;
        assert!(
            matches!(status, Ok(Status::StreamEnd)) && inflated == len,
            "a slice deflated by `deflate` inflates to its {len} bytes: {status:?}, {inflated} bytes",
        );
    });
}

impl DeflatedSlice {
    /// `s` deflated against `dictionary`; `None` if the deflater fails (the slice is then
    /// held whole).
    pub fn new(s: &SliceObject, dictionary: Option<&Dictionary>) -> Option<Self> {
        let json = s.json();
        let mut keys = String::new();
        let endpoints = s
            .endpoints()
            .map(|e| {
                keys.push_str(e.key());
                Mark::new(keys.len(), e.is_ready())
            })
            .collect();
        let deflated = deflate(json.as_bytes(), dictionary.map(|d| &d[..]))?;
        Some(Self {
            id: s.id.clone(),
            service: s.service.clone(),
            deflated: deflated.into_boxed_slice(),
            dictionary: dictionary.cloned(),
            json_len: pos(json.len()),
            endpoints_at: s.endpoints_at,
            keys: keys.into_boxed_str(),
            endpoints,
        })
    }

    /// Its endpoints' keys and readiness.
    pub fn endpoints(&self) -> impl ExactSizeIterator<Item = (&str, bool)> + Clone {
        (0..self.endpoints.len()).map(|i| {
            let start = i.checked_sub(1).map_or(0, |p| self.endpoints[p].key_end());
            let m = self.endpoints[i];
            (at(&self.keys, (start, m.key_end())), m.ready())
        })
    }

    /// The pods its endpoints point at, each with its endpoint's readiness, read from its
    /// JSON inflated (not thawed: no slice is written again to read them).
    fn pod_refs_ready(&self) -> Vec<(NsName, bool)> {
        let dictionary = self.dictionary.as_deref();
        let json = inflate(&self.deflated, self.json_len as usize, dictionary);
        let spans = (self.endpoints_at).map_or_else(Vec::new, |at| spans(&json, at as usize));
        let owner = &self.id.namespace;
        (spans.into_iter().zip(self.endpoints.iter()))
            .filter_map(|(span, m)| Some((raw_pod_ref(at(&json, span), owner)?, m.ready())))
            .collect()
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
        let dictionary = self.dictionary.as_deref();
        let json = inflate(&self.deflated, self.json_len as usize, dictionary);
        let spans = (self.endpoints_at).map_or_else(Vec::new, |at| spans(&json, at as usize));
        assert_eq!(
            spans.len(),
            self.endpoints.len(),
            "a slice's JSON lists the endpoints it was deflated with"
        );
        let kept = (spans.into_iter().zip(self.endpoints()))
            .filter(|(_, (key, ready))| keep(key, *ready))
            .map(|(span, (key, ready))| (at(&json, span), key, ready));
        rebuild(
            &json,
            (self.endpoints_at, open),
            kept,
            (self.id.clone(), self.service.clone()),
        )
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
        /// same keys and readiness, pods, JSON and serialized form; what it keeps of it is
        /// what the whole slice's `retain` keeps. Alike with no dictionary, against another
        /// slice's JSON, or against its own.
        #[test]
        fn a_deflated_slice_thaws_to_the_slice_it_deflated(
            eps in endpoints(),
            other in endpoints(),
            against in 0usize..3,
            every in 1usize..4,
        ) {
            let whole = slice(eps);
            let dictionary = match against {
                0 => None,
                1 => Some(Dictionary::from(slice(other).json().as_bytes())),
                _ => Some(Dictionary::from(whole.json().as_bytes())),
            };
            let deflated = DeflatedSlice::new(&whole, dictionary.as_ref()).expect("deflates");
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
            // Read without thawing: its pods, its JSON, its serialized form.
            let held = HeldSlice::Deflated(Arc::new(deflated.clone()));
            let pods: Vec<(NsName, bool)> = whole.pod_refs_ready().collect();
            prop_assert_eq!(held.pod_refs_ready(), pods);
            let mut written = Vec::new();
            held.write_json(&mut written);
            prop_assert_eq!(&written[..], whole.json().as_bytes());
            prop_assert_eq!(
                serde_json::to_string(&held).expect("serializes"),
                serde_json::to_string(&whole).expect("serializes")
            );

            let mut n = 0;
            let mut i = 0;
            let kept = deflated.retain(|_, _| { n += 1; n % every == 0 });
            let expected = whole.retain(|_| { i += 1; i % every == 0 });
            prop_assert_eq!(kept.json(), expected.json());
            prop_assert_eq!(marks(&kept), marks(&expected));
        }
    }

    /// Slice `n` of a service: ten pods' endpoints, with uids as random as a real pod's when
    /// `random_uids`.
    fn pods_slice(n: usize, random_uids: bool) -> SliceObject {
        let eps = (0..10)
            .map(|i| {
                let ip = n * 10 + i;
                let mut e = endpoint(
                    vec![format!("10.0.{}.{}", ip / 256, ip % 256)],
                    [Some(true), Some(true), Some(false)],
                    Some(format!("web-7d9f8b6c5-{ip:05}")),
                    None,
                );
                if let Some(r) = e.target_ref.as_mut().filter(|_| random_uids) {
                    // As random as a real uid: a hash of the index, in a uid's shape.
                    let h = |k: u64| (ip as u64 + 1).wrapping_mul(k).rotate_left(29);
                    let (a, b) = (h(0x9e37_79b9_7f4a_7c15), h(0xc2b2_ae3d_27d4_eb4f));
                    r.uid = Some(format!(
                        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                        a >> 32,
                        (a >> 16) & 0xffff,
                        a & 0xffff,
                        b >> 48,
                        b & 0xffff_ffff_ffff
                    ));
                }
                e.node_name = Some(format!("node-{}", ip % 4));
                e.zone = Some(format!("zone-{}", ip % 3));
                e
            })
            .collect();
        slice(Some(eps))
    }

    /// The bytes a deflated slice holds beyond its fixed layout: the deflated JSON, the keys,
    /// the marks.
    fn held(d: &DeflatedSlice) -> usize {
        d.deflated.len() + d.keys.len() + std::mem::size_of_val(&*d.endpoints)
    }

    #[test]
    fn a_slice_of_pods_endpoints_deflates_to_under_a_third_of_its_json() {
        let whole = pods_slice(0, false);
        let held = held(&DeflatedSlice::new(&whole, None).expect("deflates"));
        let json = whole.json().len();
        assert!(
            held * 3 < json,
            "deflated, a slice holds {held} bytes of its {json} bytes of JSON"
        );
    }

    /// Against the shared dictionary, a slice of ten pods' endpoints with uids as random as a
    /// real pod's holds under a third of its JSON (760 of 3,032 bytes), and under four fifths
    /// of what it holds deflated alone (988): what every slice repeats (field names, the
    /// endpoint controller's labels, an endpoint's shape) is in the dictionary.
    #[test]
    fn a_slice_deflated_against_the_shared_dictionary_holds_under_a_third_of_its_json() {
        let (mut json, mut alone, mut shared) = (0, 0, 0);
        for n in 0..20 {
            let s = pods_slice(n, true);
            json += s.json().len();
            alone += held(&DeflatedSlice::new(&s, None).expect("deflates"));
            let d = DeflatedSlice::new(&s, Some(shared_dictionary())).expect("deflates");
            assert_eq!(d.thaw().json(), s.json());
            shared += held(&d);
        }
        println!("20 slices: {json} bytes of JSON, {alone} held alone, {shared} shared");
        assert!(shared * 3 < json, "{shared} bytes held of {json}");
        assert!(
            shared * 5 < alone * 4,
            "{shared} bytes against the dictionary, {alone} alone"
        );
    }

    /// Two held slices are equal when their JSON is, whichever form each is held in, and
    /// deflated against one dictionary they compare without inflating.
    #[test]
    fn held_slices_compare_by_their_json_in_any_form() {
        let (a, b) = (pods_slice(1, true), pods_slice(2, true));
        let dictionary = Dictionary::from(a.json().as_bytes());
        let forms = |s: &SliceObject| -> Vec<HeldSlice> {
            [
                Form::Whole,
                Form::Deflated(None),
                Form::Deflated(Some(&dictionary)),
            ]
            .into_iter()
            .map(|f| {
                let mut h = HeldSlice::from(s.clone());
                h.reform(f);
                h
            })
            .collect()
        };
        for x in forms(&a) {
            assert_eq!(x.json(), a.json());
            for y in forms(&a) {
                assert_eq!(x, y, "{x:?} and {y:?}");
            }
            for y in forms(&b) {
                assert_ne!(x, y, "{x:?} and {y:?}");
            }
        }
        let mut c = HeldSlice::from(a.clone());
        c.reform(Form::Deflated(Some(shared_dictionary())));
        let d = c.clone();
        assert!(c.shares(&d) && c == d);
        c.reform(Form::Deflated(Some(&dictionary)));
        assert!(
            !c.shares(&d) && c == d,
            "deflated anew against another dictionary"
        );
    }

    /// Against another slice of its service, a slice's deflated JSON is under two thirds of
    /// what it is alone: what the slices repeat (metadata, ports, every endpoint's shape) is
    /// in the dictionary; what is the slice's own (addresses, names, uids) is not.
    #[test]
    fn a_slice_deflated_against_its_services_dictionary_holds_less() {
        let dictionary = Dictionary::from(pods_slice(0, true).json().as_bytes());
        let (mut alone, mut against, mut json) = (0, 0, 0);
        for n in 1..=20 {
            let s = pods_slice(n, true);
            json += s.json().len();
            alone += DeflatedSlice::new(&s, None)
                .expect("deflates")
                .deflated
                .len();
            let d = DeflatedSlice::new(&s, Some(&dictionary)).expect("deflates");
            assert_eq!(d.thaw().json(), s.json());
            against += d.deflated.len();
        }
        assert!(
            against * 3 < alone * 2,
            "20 slices of {json} bytes of JSON: deflated alone {alone} bytes, against the \
             dictionary {against}"
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
        let dictionary = Dictionary::from(slice(None).json().as_bytes());
        held.reform(Form::Deflated(Some(&dictionary)));
        assert!(matches!(held, HeldSlice::Deflated(_)));
        assert!(
            held.dictionary()
                .is_some_and(|d| Arc::ptr_eq(d, &dictionary))
        );
        assert_eq!(held.endpoints().collect::<Vec<_>>(), [("10.0.0.1", false)]);
        assert_eq!(held.service(), whole.service());
        assert_eq!(held.whole().json(), whole.json());
        held.reform(Form::Whole);
        let HeldSlice::Whole(again) = &held else {
            panic!("reformed whole, it is {held:?}")
        };
        assert_eq!(again.json(), whole.json());
    }
}
