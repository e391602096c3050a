//! One stored object ([`Stored`]: the object, its version, its JSON as a slice of its watch
//! frame, and its protobuf and metadata-only forms encoded on first use) and the change events
//! watchers receive ([`Event`]).

use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::metadata::Metadata;
use crate::model::Object;
use crate::protobuf::{self, Forms};

/// One stored object.
#[derive(Debug)]
pub struct Stored {
    /// Floodgate's resource version of this state.
    pub resource_version: u64,
    /// The object, as served.
    pub object: Object,
    /// Its JSON, with `kind`, `apiVersion` and `metadata.resourceVersion`.
    pub json: Bytes,
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
    /// stored JSON is a slice of that frame: the object and its event share one buffer.
    pub(super) fn framed(object: Object, resource_version: u64, kind: EventType) -> (Self, Bytes) {
        let value = object.to_json(&resource_version.to_string());
        let (frame, json) = json_frame(kind, &value);
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

    /// Its protobuf forms, encoded on the first call and kept; `None` for a kind without one.
    pub fn protobuf(&self) -> Option<&Forms> {
        if !protobuf::has_protobuf(self.object.kind()) {
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

/// The watch frame of a `kind` event carrying `value`, and the object's JSON, a slice of it.
pub(super) fn json_frame(kind: EventType, value: &serde_json::Value) -> (Bytes, Bytes) {
    let mut b = Vec::with_capacity(256);
    b.extend_from_slice(FRAME_TYPE);
    b.extend_from_slice(kind.as_str().as_bytes());
    b.extend_from_slice(FRAME_OBJECT);
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
    /// of it.
    pub frame: Bytes,
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
