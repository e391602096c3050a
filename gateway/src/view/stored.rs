//! One stored object ([`Stored`]: the object, its version, its JSON, and its protobuf and
//! metadata-only forms ([`metadata`]) encoded on first use) and the change events watchers
//! receive ([`Event`]).
//!
//! A pod's JSON is held once. Pods and EndpointSlices (most of what a link serves) are held
//! as their JSON already ([`crate::model::PodObject`], and a slice's deflated:
//! [`crate::model::HeldSlice`]), shared with the engine's store: their served JSON is written
//! from it where it is served (lists, initial events; a slice's inflated), behind
//! `apiVersion`, `kind` and the resourceVersion, so the view holds no second copy. So is a core/v1 Endpoints' (one a service, rarely listed: encoded where it is
//! served). Every other kind's served JSON is a slice of the watch frame of the event that
//! stored it. Every event's frame is written whole, once, for every watcher. The history keeps
//! it only for those other kinds (their JSON is the frame); a pod's, a slice's or an Endpoints'
//! frame lives while the fan-out still holds its event, and a resume writes it again
//! ([`Event::kept`]).

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use crate::model::{Form, HeldSlice, Object, shared_dictionary};
use crate::protobuf::{self, Forms};
use metadata::Metadata;

pub mod metadata;

/// One stored object.
#[derive(Debug)]
pub struct Stored {
    /// Floodgate's resource version of this state.
    pub resource_version: u64,
    /// The object, as served.
    pub object: Object,
    /// Its JSON, with `kind`, `apiVersion` and `metadata.resourceVersion`: read it with
    /// [`Stored::json`] or [`Stored::write_json`].
    json: Json,
    /// The event this state came with (its watch frames are of this type).
    pub event: EventType,
    /// Its protobuf forms, encoded when a protobuf client first asks ([`Stored::protobuf`]).
    protobuf: OnceLock<Box<Forms>>,
    /// Its metadata-only forms, encoded when a metadata client first asks.
    metadata: OnceLock<Box<Metadata>>,
}

impl Stored {
    /// Stamps `object` with a version and encodes it.
    pub fn new(object: Object, resource_version: u64) -> Self {
        Self::framed(object, resource_version, EventType::Added).0
    }

    /// Stamps `object` with a version and encodes it as the frame of a `kind` event. The
    /// stored JSON is a slice of that frame (the object and its event share one buffer), or,
    /// for the kinds [`written_on_demand`], written from the object where it is served. A
    /// slice is kept deflated: one a link's engine publishes is already (shared with its
    /// store); one a follower or a restored view decoded is deflated here, once its frame is
    /// written.
    pub(super) fn framed(
        mut object: Object,
        resource_version: u64,
        kind: EventType,
    ) -> (Self, Bytes) {
        let (frame, json) = match &object {
            o if written_on_demand(o) => {
                let mut b = Vec::with_capacity(1024);
                frame_head(&mut b, kind);
                let start = b.len();
                write_served(&mut b, o, resource_version);
                let len = b.len() - start;
                b.extend_from_slice(FRAME_END);
                // Held while the history keeps the event: without its growth room.
                b.shrink_to_fit();
                (Bytes::from(b), Json::Written(len))
            }
            _ => {
                let value = object.to_json(&resource_version.to_string());
                let (frame, json) = json_frame(kind, &value);
                (frame, Json::Framed(json))
            }
        };
        if let Object::EndpointSlice(slice @ HeldSlice::Whole(_)) = &mut object {
            slice.reform(Form::Deflated(Some(shared_dictionary())));
        }
        let stored = Self {
            resource_version,
            object,
            json,
            event: kind,
            protobuf: OnceLock::new(),
            metadata: OnceLock::new(),
        };
        (stored, frame)
    }

    /// Its JSON, with `kind`, `apiVersion` and `metadata.resourceVersion` (written here for
    /// the kinds [`written_on_demand`]: prefer [`Stored::write_json`] where it goes into a
    /// buffer).
    pub fn json(&self) -> Cow<'_, [u8]> {
        match &self.json {
            Json::Framed(json) => Cow::Borrowed(json),
            Json::Written(_) => {
                let mut b = Vec::with_capacity(self.json_len());
                self.write_json(&mut b);
                Cow::Owned(b)
            }
        }
    }

    /// Appends its JSON to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match &self.json {
            Json::Written(_) => write_served(out, &self.object, self.resource_version),
            Json::Framed(json) => out.extend_from_slice(json),
        }
    }

    /// The length of its JSON.
    pub fn json_len(&self) -> usize {
        match &self.json {
            Json::Written(len) => *len,
            Json::Framed(json) => json.len(),
        }
    }

    /// Its protobuf forms, encoded on the first call and kept; `None` for a kind without one.
    pub fn protobuf(&self) -> Option<&Forms> {
        if !self.object.kind().def().protobuf {
            return None;
        }
        let forms = self.protobuf.get_or_init(|| {
            let item = protobuf::item(&self.object, self.resource_version).unwrap_or_default();
            let kind = self.object.kind();
            Box::new(Forms::new(
                kind.api_version(),
                kind.name(),
                &item,
                self.event.as_str(),
            ))
        });
        Some(forms)
    }

    /// Its metadata-only forms, encoded on the first call and kept.
    pub fn metadata(&self) -> &Metadata {
        self.metadata.get_or_init(|| {
            Box::new(Metadata::new(
                &self.object.meta(),
                self.resource_version,
                self.event,
            ))
        })
    }
}

/// Where a stored object's JSON is.
#[derive(Debug)]
enum Json {
    /// A slice of the frame it was stored with.
    Framed(Bytes),
    /// Written from the object where it is served ([`write_served`]); its length.
    Written(usize),
}

/// How the held JSON of a kind written on demand starts: `metadata` first, always an object.
const METADATA_OPEN: &str = r#"{"metadata":{"#;

/// True for the kinds whose served JSON is written from the held object where it is served
/// (the module docs say why); the others keep theirs as a slice of their frame.
fn written_on_demand(object: &Object) -> bool {
    matches!(
        object,
        Object::Pod(_) | Object::EndpointSlice(_) | Object::Endpoints(_)
    )
}

/// Appends the served JSON of `object` (a kind [`written_on_demand`]) to `out`: `apiVersion`,
/// `kind`, `metadata` opened with the version, then the object's own JSON from inside its
/// `metadata` on: a pod's and a slice's as they are held, an Endpoints' encoded here (its
/// addresses as they are held).
fn write_served(out: &mut Vec<u8>, object: &Object, resource_version: u64) {
    let encoded;
    let (head, held): (&[u8], &str) = match object {
        Object::Pod(pod) => (POD_HEAD, pod.json().get()),
        Object::EndpointSlice(slice) => {
            // Inflated where it goes, then its `{"metadata":{` made the head's.
            let start = out.len();
            out.extend_from_slice(SLICE_HEAD);
            // A number into a `Vec`: no failure case.
            let _ = serde_json::to_writer(&mut *out, &resource_version);
            let at = out.len();
            slice.write_json(out);
            if let Some(rest) = out[at..].strip_prefix(METADATA_OPEN.as_bytes()) {
                // A comma if the metadata has fields.
                let comma: &[u8] = if rest.starts_with(b"}") {
                    b"\""
                } else {
                    b"\","
                };
                out.splice(at..at + METADATA_OPEN.len(), comma.iter().copied());
                return;
            }
            out.truncate(start);
            (SLICE_HEAD, "")
        }
        Object::Endpoints(e) => {
            // One Endpoints a service, rarely listed (consumers read slices): encoded here.
            encoded = serde_json::to_string(e.as_ref()).unwrap_or_default();
            (ENDPOINTS_HEAD, &encoded)
        }
        _ => (&[], ""),
    };
    if let Some(rest) = held.strip_prefix(METADATA_OPEN) {
        out.extend_from_slice(head);
        // A number into a `Vec`: no failure case.
        let _ = serde_json::to_writer(&mut *out, &resource_version);
        // A comma if the metadata has fields.
        out.extend_from_slice(if rest.starts_with('}') { b"\"" } else { b"\"," });
        out.extend_from_slice(rest.as_bytes());
        return;
    }
    // Not reached: these kinds write `metadata` first (the tests hold them to it). Were one
    // not to, the general path still serves it whole.
    debug_assert!(false, "{} writes metadata first", object.kind().name());
    let value = object.to_json(&resource_version.to_string());
    let _ = serde_json::to_writer(out, &value);
}

/// What precedes the version in the served JSON of the kinds [`written_on_demand`]: their
/// `apiVersion` and `kind` ([`crate::model::Kind::api_version`], [`crate::model::Kind::name`]: the tests compare), and
/// `metadata` opened.
const POD_HEAD: &[u8] = br#"{"apiVersion":"v1","kind":"Pod","metadata":{"resourceVersion":""#;
const SLICE_HEAD: &[u8] = br#"{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"resourceVersion":""#;
const ENDPOINTS_HEAD: &[u8] =
    br#"{"apiVersion":"v1","kind":"Endpoints","metadata":{"resourceVersion":""#;

/// Starts the watch frame of a `kind` event in `b`: what precedes the object.
fn frame_head(b: &mut Vec<u8>, kind: EventType) {
    b.extend_from_slice(FRAME_TYPE);
    b.extend_from_slice(kind.as_str().as_bytes());
    b.extend_from_slice(FRAME_OBJECT);
}

/// The watch frame of a `kind` event carrying `value`, and the object's JSON, a slice of it.
pub(super) fn json_frame(kind: EventType, value: &serde_json::Value) -> (Bytes, Bytes) {
    let mut b = Vec::with_capacity(256);
    frame_head(&mut b, kind);
    let start = b.len();
    // Writing a `Value` into a `Vec` has no failure case (its keys are strings).
    let _ = serde_json::to_writer(&mut b, value);
    let end = b.len();
    b.extend_from_slice(FRAME_END);
    // Held as long as the object is served: without its growth room (the vector doubled
    // from 256 bytes, so a 1.1 KB pod held 2 KB).
    b.shrink_to_fit();
    let frame = Bytes::from(b);
    let json = frame.slice(start..end);
    (frame, json)
}

const FRAME_TYPE: &[u8] = b"{\"type\":\"";
const FRAME_OBJECT: &[u8] = b"\",\"object\":";
const FRAME_END: &[u8] = b"}\n";

/// One watch frame: `{"type":..,"object":..}` and a newline.
pub fn frame(kind: &str, object_json: &[u8]) -> Bytes {
    let mut b = Vec::with_capacity(object_json.len() + 32);
    b.extend_from_slice(FRAME_TYPE);
    b.extend_from_slice(kind.as_bytes());
    b.extend_from_slice(FRAME_OBJECT);
    b.extend_from_slice(object_json);
    b.extend_from_slice(FRAME_END);
    b.into()
}

/// The watch frame of a `kind` event carrying `stored`.
pub fn stored_frame(kind: EventType, stored: &Stored) -> Bytes {
    let mut b = Vec::with_capacity(stored.json_len() + 32);
    frame_head(&mut b, kind);
    stored.write_json(&mut b);
    b.extend_from_slice(FRAME_END);
    b.into()
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// It appeared.
    Added,
    /// It changed.
    Modified,
    /// It went away; the event carries its last state.
    Deleted,
}

/// One change, as watchers receive it.
#[derive(Clone, Debug)]
pub struct Event {
    /// The version of the change (for a deletion, a new version carried by the last state).
    pub resource_version: u64,
    /// The change.
    pub kind: EventType,
    /// The object after the change (before it, for a deletion).
    pub object: Arc<Stored>,
    /// The state before a modification: watchers with a selector need it to turn a change
    /// that leaves (enters) their selection into DELETED (ADDED).
    pub previous: Option<Arc<Stored>>,
    /// The watch frame of this event, encoded once for every watcher: `object.json` is a slice
    /// of it, or it is empty when the history let it go ([`Event::kept`]): read it with
    /// [`Event::json_frame`].
    pub frame: Bytes,
}

impl Event {
    /// The event as the history keeps it. A kind [`written_on_demand`] keeps no frame: its
    /// JSON is held once, in the object, and a watcher or a follower that resumes writes the
    /// frame again ([`Event::json_frame`]). Held by the history, the frames of a link's
    /// slices and pods were a second copy of everything it serves (21.9 MB beside 18.2 MB of
    /// slices for 1,000 small services).
    pub(super) fn kept(&self) -> Event {
        let mut e = self.clone();
        if written_on_demand(&e.object.object) {
            e.frame = Bytes::new();
        }
        e
    }

    /// Its JSON watch frame: the one encoded with it, or, for an event the history kept
    /// without it, written from its object.
    pub fn json_frame(&self) -> Bytes {
        match self.frame.is_empty() {
            false => self.frame.clone(),
            true => stored_frame(self.kind, &self.object),
        }
    }
}

impl EventType {
    /// The watch event type as the API names it.
    pub const fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}
