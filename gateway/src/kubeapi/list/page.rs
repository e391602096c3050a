//! The pages of a LIST: which objects a page serves, and the continue token that names the
//! snapshot the next page reads ([`crate::view::pages`]) and the last object served.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::selected;
use crate::kubeapi::query::{Query, RvMatch};
use crate::kubeapi::status::{Reason, StatusError};
use crate::model::NsName;
use crate::view::Stored;

/// One page of a list.
pub(super) struct Page<'a> {
    /// The objects it serves.
    pub(super) items: Vec<&'a Arc<Stored>>,
    /// The index, in the state listed, of the last object it serves.
    pub(super) last: usize,
    /// Whether selected objects follow it.
    pub(super) more: bool,
}

/// The page of `all` (a kind's objects by namespace and name) after the object `after` (from
/// the first: `None`): the objects `q` selects in `namespace`, at most its limit.
pub(super) fn page<'a>(
    all: &'a [Arc<Stored>],
    after: Option<&NsName>,
    namespace: Option<&str>,
    q: &Query,
) -> Page<'a> {
    let start = after.map_or(0, |k| all.partition_point(|s| s.object.id() <= *k));
    let limit = page_limit(q).unwrap_or(usize::MAX);
    let mut selected_items = all[start..]
        .iter()
        .enumerate()
        .filter(|(_, s)| selected(s, namespace, q));
    let mut items: Vec<&Arc<Stored>> = Vec::new();
    let mut last = start;
    for (i, s) in selected_items.by_ref().take(limit) {
        items.push(s);
        last = start + i;
    }
    let more = items.len() == limit && selected_items.next().is_some();
    Page { items, last, more }
}

/// The continue token of the page after the object at `last` in `all` (the state at
/// `resource_version`), and, for an unfiltered list, how many objects remain after it.
pub(super) fn next_page(
    resource_version: u64,
    all: &[Arc<Stored>],
    last: usize,
    namespace: Option<&str>,
    q: &Query,
) -> (Option<String>, Option<i64>) {
    let token = ContinueToken {
        v: TOKEN_VERSION.into(),
        rv: resource_version,
        after: all[last].object.id(),
    };
    let remaining = (q.labels.is_empty() && q.fields.is_empty()).then(|| {
        // The objects of the namespace (or all of them) after this page.
        let end = namespace.map_or(all.len(), |n| {
            all.partition_point(|s| s.object.namespace() <= n)
        });
        i64::try_from(end - last - 1).ok()
    });
    (Some(token.encode()), remaining.flatten())
}

/// The page size a list is served with, if it is paginated (see [`super::list`]). A `continue` comes
/// without `resourceVersion` ([`Query::parse`] refuses both), so it is a read of the current
/// state too.
fn page_limit(q: &Query) -> Option<usize> {
    let from_current_state = match q.resource_version.as_deref() {
        None | Some("") => true,
        Some(_) => q.rv_match == RvMatch::Exact,
    };
    q.limit
        .filter(|l| *l > 0 && from_current_state)
        .map(|l| usize::try_from(l).unwrap_or(usize::MAX))
}

/// The continue tokens' format version (the API server names it the same way).
const TOKEN_VERSION: &str = "meta.k8s.io/v1";

/// A page's continue token: the snapshot's version and the last object served, as unpadded
/// URL-safe base64 of JSON. Clients treat it as opaque.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct ContinueToken {
    v: String,
    pub(super) rv: u64,
    #[serde(with = "ns_name")]
    pub(super) after: NsName,
}

impl ContinueToken {
    fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    pub(super) fn decode(token: &str) -> Result<Self, StatusError> {
        let invalid =
            |why: String| StatusError::bad_request(format!("invalid continue token: {why}"));
        let bytes = URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|e| invalid(e.to_string()))?;
        let t: Self = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        if t.v != TOKEN_VERSION {
            return Err(invalid(format!("unknown version {:?}", t.v)));
        }
        Ok(t)
    }
}

/// `namespace/name` in a token.
mod ns_name {
    use crate::model::NsName;

    pub fn serialize<S: serde::Serializer>(k: &NsName, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{}/{}", k.namespace, k.name))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<NsName, D::Error> {
        let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
        let (ns, name) = s
            .split_once('/')
            .ok_or_else(|| serde::de::Error::custom("no namespace/name"))?;
        Ok(NsName::new(ns, name))
    }
}

/// 410 for a token whose snapshot is no longer kept.
pub(super) fn continue_expired() -> StatusError {
    StatusError::new(
        Reason::Expired,
        "The provided continue parameter is too old to display a consistent list result. \
         You can start a new list without the continue parameter.",
    )
}
