//! Admission of each upstream object before it goes to the engine: within
//! [`MAX_OBJECT_BYTES`], and (kept as JSON) of its kind's shape; a refusal is counted and logged.

use std::sync::atomic::Ordering;

use super::wire::Wire;
use super::{MAX_OBJECT_BYTES, UpstreamCounters};
use crate::model::{Kind, NsName, Object};

/// The length of `o`'s JSON encoding, counted without building it.
pub fn encoded_len<K: serde::Serialize>(o: &K) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    // Writing into a counter cannot fail; an object serde refuses counts as what it wrote.
    let _ = serde_json::to_writer(&mut c, o);
    c.0
}

/// Why an upstream object was refused, naming it.
#[derive(Debug)]
pub enum Refused {
    /// Its JSON is `bytes` long, over [`MAX_OBJECT_BYTES`].
    Oversized {
        /// The object.
        object: NsName,
        /// The size of its JSON.
        bytes: usize,
    },
    /// It was not wanted when it was decoded, so only its identity was kept
    /// ([`super::wire::WANTED`]); it became wanted since, and the fetch that wanting it asks
    /// for brings it.
    Unwanted,
    /// Its JSON is valid but not of its kind's shape.
    Undecodable {
        /// The object.
        object: NsName,
        /// Why it does not decode.
        error: serde_json::Error,
    },
}

/// A typed object, admitted if its JSON is within [`MAX_OBJECT_BYTES`] (counted by encoding it).
pub(super) fn typed<K: kube::Resource + serde::Serialize>(
    o: K,
    wrap: impl FnOnce(K) -> Object,
) -> Result<Object, Refused> {
    match encoded_len(&o) {
        bytes if bytes > MAX_OBJECT_BYTES => Err(Refused::Oversized {
            object: NsName::of(o.meta()),
            bytes,
        }),
        _ => Ok(wrap(o)),
    }
}

/// An object kept as its JSON ([`Wire`]), admitted if its JSON is within [`MAX_OBJECT_BYTES`]
/// and decodes as its kind.
pub(super) fn wired<K: kube::Resource + serde::de::DeserializeOwned>(
    w: Wire<K>,
    wrap: impl FnOnce(K) -> Object,
) -> Result<Object, Refused> {
    let object = || NsName::of(kube::Resource::meta(&w));
    if w.is_skipped() {
        return Err(Refused::Unwanted);
    }
    match w.bytes() {
        bytes if bytes > MAX_OBJECT_BYTES => Err(Refused::Oversized {
            object: object(),
            bytes,
        }),
        _ => match w.decode() {
            Ok(o) => Ok(wrap(o)),
            Err(error) => Err(Refused::Undecodable {
                object: object(),
                error,
            }),
        },
    }
}

/// Counts and logs an object [`Refused`]: it goes no further, and its last good version, if
/// any, stays served.
pub(super) fn refuse(kind: Kind, why: Refused, counters: &UpstreamCounters) {
    match why {
        Refused::Oversized { object, bytes } => {
            counters.oversized.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                kind = kind.name(),
                %object,
                bytes,
                limit = MAX_OBJECT_BYTES,
                "refused an upstream object over the size limit"
            );
        }
        Refused::Unwanted => {
            counters.pods_skipped.fetch_add(1, Ordering::Relaxed);
        }
        Refused::Undecodable { object, error } => {
            counters.decode_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                kind = kind.name(),
                %object,
                %error,
                "refused an upstream object that does not decode"
            );
        }
    }
}
