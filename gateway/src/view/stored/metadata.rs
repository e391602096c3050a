//! An object's metadata-only forms (`PartialObjectMetadata`, `meta.k8s.io/v1`), which metadata
//! clients ask for: client-go's metadata informers, Linkerd's ReplicaSet watch. Like the full
//! forms they are encoded once per state, the first time a client asks
//! ([`super::Stored::metadata`]), and shared by every list and watcher that wants them: the JSON
//! is a slice of its watch frame, and the protobuf forms share one buffer ([`Forms`]).

use bytes::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::{EventType, json_frame};
use crate::protobuf::{self, Forms};

/// `apiVersion` of the metadata-only forms.
pub const API_VERSION: &str = "meta.k8s.io/v1";
/// `kind` of one object's metadata.
pub const KIND: &str = "PartialObjectMetadata";
/// `kind` of a list of them.
pub const LIST_KIND: &str = "PartialObjectMetadataList";

/// The metadata-only forms of one stored state.
#[derive(Debug)]
pub struct Metadata {
    json_frame: Bytes,
    json: Bytes,
    protobuf: Forms,
}

impl Metadata {
    /// Encodes `meta` at `resource_version` for its state's own `event`.
    pub fn new(meta: &ObjectMeta, resource_version: u64, event: EventType) -> Self {
        let (json_frame, json) = json_frame(event, &partial_metadata(meta, resource_version));
        let rv = resource_version.to_string();
        let item = protobuf::metadata_only(protobuf::convert::object_meta(meta, Some(&rv)));
        Self {
            json_frame,
            json,
            protobuf: Forms::new(API_VERSION, KIND, &item, event.as_str()),
        }
    }

    /// The JSON object.
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    /// The JSON watch frame of the state's own event.
    pub fn json_frame(&self) -> Bytes {
        self.json_frame.clone()
    }

    /// The protobuf forms.
    pub fn protobuf(&self) -> &Forms {
        &self.protobuf
    }
}

/// The JSON of an object's metadata-only form.
pub fn partial_metadata(meta: &ObjectMeta, resource_version: u64) -> Value {
    let mut m = serde_json::to_value(meta).unwrap_or_default();
    m["resourceVersion"] = resource_version.to_string().into();
    json!({ "kind": KIND, "apiVersion": API_VERSION, "metadata": m })
}
