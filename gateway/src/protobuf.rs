//! The Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`), which client-go's
//! typed clients ask for first: Linkerd's destination controller decodes protobuf about an order
//! of magnitude cheaper than JSON, and the wire carries about half the bytes.
//!
//! The wire forms (as the API server writes them, `k8s.io/apimachinery` serializers):
//! - an object or a list: the magic `k8s\0`, then a `runtime.Unknown` whose `typeMeta` names the
//!   kind and whose `raw` is the object's message (the *envelope*);
//! - a list's message: `ListMeta` (field 1), then each item's message (field 2), so a list is
//!   the items' pre-encoded bytes concatenated, with no object encoded again;
//! - a watch stream (`;stream=watch`): frames of a 4-byte big-endian length and a bare
//!   `metav1.WatchEvent` (no magic), whose `object.raw` is the object's envelope.
//!
//! Each stored object's three forms share one buffer, its watch frame ([`Forms`]), encoded the
//! first time a protobuf client asks for it and kept beside its JSON: a link whose consumers
//! all speak JSON holds no protobuf bytes. The objects come from k8s-openapi types through the
//! `k8s-pb` types ([`convert`]); Linkerd `Server`s, a custom resource, have no protobuf form
//! (the API server serves custom resources as JSON only), except as metadata.

use std::ops::Range;

use bytes::Bytes;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

use crate::model::Object;

pub mod convert;
mod pod;

/// The media type.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The media type of a watch stream.
pub const WATCH_MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// The four bytes every envelope starts with.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// The message of `object` (no envelope) with `resource_version` in its metadata, or `None`
/// for a kind without a protobuf form.
pub fn item(object: &Object, resource_version: u64) -> Option<Vec<u8>> {
    let rv = resource_version.to_string();
    Some(match object {
        Object::Service(s) => convert::service(s, &rv).encode_to_vec(),
        Object::EndpointSlice(s) => convert::endpoint_slice(&s.to_slice(), &rv).encode_to_vec(),
        Object::Endpoints(e) => convert::endpoints(&e.to_endpoints(), &rv).encode_to_vec(),
        Object::Pod(p) => pod::pod(p, &rv).encode_to_vec(),
        Object::ReplicaSet(m) => metadata_only(convert::object_meta(m, Some(&rv))),
        Object::Server(_) => return None,
        Object::ConfigMap(c) => convert::config_map(c, &rv).encode_to_vec(),
    })
}

/// The message of an object that has only its metadata (every kind's field 1): a ReplicaSet as
/// Floodgate holds it, a bookmark, a `PartialObjectMetadata`.
pub fn metadata_only(m: meta::ObjectMeta) -> Vec<u8> {
    meta::PartialObjectMetadata { metadata: Some(m) }.encode_to_vec()
}

/// A stored object's protobuf forms, in one buffer: its watch frame, whose event object is its
/// envelope, whose `raw` is its message.
#[derive(Debug)]
pub struct Forms {
    frame: Bytes,
    envelope: Range<usize>,
    item: Range<usize>,
}

impl Forms {
    /// Encodes `item` (a message of the kind `kind` of `api_version`) as the frame of an
    /// `event` event.
    pub fn new(api_version: &str, kind: &str, item: &[u8], event: &str) -> Self {
        let type_meta = type_meta(api_version, kind);
        let unknown = unknown_len(&type_meta, item.len());
        let mut b = frame_head(event, MAGIC.len() + unknown);
        let start = b.len();
        let item_at = put_envelope(&mut b, &type_meta, item);
        let end = b.len();
        debug_assert_eq!(end, b.capacity(), "lengths are computed before writing");
        let frame = Bytes::from(b);
        Self {
            frame,
            envelope: start..end,
            item: item_at..item_at + item.len(),
        }
    }

    /// The watch frame of the object's own event.
    pub fn frame(&self) -> Bytes {
        self.frame.clone()
    }

    /// The envelope: a GET's body, a watch event's object.
    pub fn envelope(&self) -> &[u8] {
        &self.frame[self.envelope.clone()]
    }

    /// The bare message: an item of a list.
    pub fn item(&self) -> &[u8] {
        &self.frame[self.item.clone()]
    }

    /// The bytes held.
    pub fn len(&self) -> usize {
        self.frame.len()
    }

    /// Never true: a frame has at least its length.
    pub fn is_empty(&self) -> bool {
        self.frame.is_empty()
    }
}

/// An envelope: `item` (a message of the kind `kind` of `api_version`) wrapped.
pub fn envelope(api_version: &str, kind: &str, item: &[u8]) -> Vec<u8> {
    let type_meta = type_meta(api_version, kind);
    let mut b = Vec::with_capacity(MAGIC.len() + unknown_len(&type_meta, item.len()));
    put_envelope(&mut b, &type_meta, item);
    b
}

/// One watch frame of an `event` carrying `envelope`.
pub fn watch_frame(event: &str, envelope: &[u8]) -> Bytes {
    let mut b = frame_head(event, envelope.len());
    b.extend_from_slice(envelope);
    b.into()
}

/// A watch frame up to its envelope, in a vector with room for exactly an envelope of
/// `envelope_len` bytes more: the length prefix, the `WatchEvent`'s type, and the headers of
/// its `object` (a `runtime.RawExtension`) and of that one's `raw`.
fn frame_head(event: &str, envelope_len: usize) -> Vec<u8> {
    let raw_extension = field_len(1, envelope_len);
    let watch_event = field_len(1, event.len()) + field_len(2, raw_extension);
    let mut b = Vec::with_capacity(4 + watch_event);
    b.extend_from_slice(&frame_len(watch_event));
    put_bytes(&mut b, 1, event.as_bytes());
    put_header(&mut b, 2, raw_extension);
    put_header(&mut b, 1, envelope_len);
    b
}

/// A list's envelope: `meta`, then `items` (each a bare message), as `list_kind`.
pub fn list<'a>(
    api_version: &str,
    list_kind: &str,
    meta: &meta::ListMeta,
    items: impl Iterator<Item = &'a [u8]> + Clone,
) -> Vec<u8> {
    let meta_len = meta.encoded_len();
    let list_len =
        field_len(1, meta_len) + items.clone().map(|i| field_len(2, i.len())).sum::<usize>();
    let type_meta = type_meta(api_version, list_kind);
    let mut b = Vec::with_capacity(MAGIC.len() + unknown_len(&type_meta, list_len));
    b.extend_from_slice(MAGIC);
    put_bytes(&mut b, 1, &type_meta);
    put_header(&mut b, 2, list_len);
    put_header(&mut b, 1, meta_len);
    meta.encode_raw(&mut b);
    for i in items {
        put_bytes(&mut b, 2, i);
    }
    put_bytes(&mut b, 3, b"");
    put_bytes(&mut b, 4, b"");
    b
}

/// What is wrong with a protobuf body.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// It does not start with [`MAGIC`].
    #[error("protobuf body without the k8s\\0 magic prefix")]
    NoMagic,
    /// Its envelope or message does not decode.
    #[error("invalid protobuf {what}: {source}")]
    Invalid {
        /// What was being decoded.
        what: &'static str,
        /// Why it failed.
        source: prost::DecodeError,
    },
    /// A watch stream ends inside a frame.
    #[error("a watch stream ends inside a frame")]
    Truncated,
}

/// Opens an envelope: its `runtime.Unknown` (type and raw message).
pub fn open(body: &[u8]) -> Result<k8s_pb::apimachinery::pkg::runtime::Unknown, DecodeError> {
    let rest = body.strip_prefix(MAGIC).ok_or(DecodeError::NoMagic)?;
    k8s_pb::apimachinery::pkg::runtime::Unknown::decode(rest).map_err(|source| {
        DecodeError::Invalid {
            what: "runtime.Unknown",
            source,
        }
    })
}

/// Splits a protobuf watch stream into its events.
pub fn read_watch(mut body: &[u8]) -> Result<Vec<meta::WatchEvent>, DecodeError> {
    let mut events = Vec::new();
    while !body.is_empty() {
        let (len, rest) = body
            .split_first_chunk::<4>()
            .ok_or(DecodeError::Truncated)?;
        let len = u32::from_be_bytes(*len) as usize;
        let frame = rest.get(..len).ok_or(DecodeError::Truncated)?;
        events.push(
            meta::WatchEvent::decode(frame).map_err(|source| DecodeError::Invalid {
                what: "WatchEvent",
                source,
            })?,
        );
        body = &rest[len..];
    }
    Ok(events)
}

/// `runtime.TypeMeta` (apiVersion is field 1, kind field 2), encoded.
fn type_meta(api_version: &str, kind: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(api_version.len() + kind.len() + 4);
    put_bytes(&mut b, 1, api_version.as_bytes());
    put_bytes(&mut b, 2, kind.as_bytes());
    b
}

/// The encoded length of a `runtime.Unknown` of `type_meta` around `raw` bytes (its
/// `contentEncoding` and `contentType` are written empty, as the API server writes them).
fn unknown_len(type_meta: &[u8], raw: usize) -> usize {
    field_len(1, type_meta.len()) + field_len(2, raw) + 2 * field_len(3, 0)
}

/// Writes the magic and the `runtime.Unknown` around `item`; returns where `item` starts.
fn put_envelope(b: &mut Vec<u8>, type_meta: &[u8], item: &[u8]) -> usize {
    b.extend_from_slice(MAGIC);
    put_bytes(b, 1, type_meta);
    put_header(b, 2, item.len());
    let at = b.len();
    b.extend_from_slice(item);
    put_bytes(b, 3, b"");
    put_bytes(b, 4, b"");
    at
}

fn frame_len(len: usize) -> [u8; 4] {
    // A frame is one object (the API server's limit is far below 4 GiB).
    u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes()
}

/// The encoded length of a length-delimited field with `len` bytes.
fn field_len(tag: u32, len: usize) -> usize {
    prost::encoding::key_len(tag) + encoded_len_varint(len as u64) + len
}

fn put_header(b: &mut Vec<u8>, tag: u32, len: usize) {
    encode_key(tag, WireType::LengthDelimited, b);
    encode_varint(len as u64, b);
}

fn put_bytes(b: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    put_header(b, tag, bytes.len());
    b.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests;
