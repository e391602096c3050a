//! GET and LIST: content negotiation, filtering, and the list body built from each object's
//! pre-encoded JSON (no object is re-encoded for a full list).

use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use serde_json::{Value, json};

use super::query::{Query, RvMatch, parse_rv};
use super::resource::{ResourceDef, table_cells, table_columns};
use super::status::{Reason, StatusError};
use crate::model::{NsName, ObjKey};
use crate::view::pages::Items;
use crate::view::{ResumeError, Stored, View};

/// Lists larger than this are gzipped when the client accepts it (the API server's threshold).
const GZIP_OVER: usize = 128 * 1024;

/// How the client wants objects rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Render {
    /// The objects themselves.
    Full,
    /// `as=PartialObjectMetadata[List]`: metadata only.
    Metadata,
    /// `as=Table`: kubectl's columns.
    Table,
}

/// Picks a rendering from the Accept header: JSON when it is absent, `*/*`, or lists
/// `application/json` with any parameters; 406 otherwise.
pub fn negotiate(headers: &HeaderMap) -> Result<Render, StatusError> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.trim().is_empty() {
        return Ok(Render::Full);
    }
    for entry in accept.split(',') {
        let mut parts = entry.split(';').map(str::trim);
        let media = parts.next().unwrap_or("");
        if !matches!(media, "application/json" | "*/*" | "application/*") {
            continue;
        }
        let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        let get = |k: &str| params.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        return Ok(match (get("as"), get("g")) {
            (Some("Table"), Some("meta.k8s.io")) => Render::Table,
            (Some("PartialObjectMetadata" | "PartialObjectMetadataList"), Some("meta.k8s.io")) => {
                Render::Metadata
            }
            // An `as=` we do not serve: the client listed it first but may accept plain JSON
            // further on; keep looking.
            (Some(_), _) => continue,
            (None, _) => Render::Full,
        });
    }
    Err(StatusError::new(
        Reason::NotAcceptable,
        format!("only application/json is served; Accept was {accept:?}"),
    ))
}

/// The metadata-only form of an object.
pub fn partial_metadata(stored: &Stored) -> Value {
    let mut meta = serde_json::to_value(stored.object.meta()).unwrap_or_default();
    meta["resourceVersion"] = stored.resource_version.to_string().into();
    json!({ "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta })
}

/// True when an object passes the namespace, label and field filters of a request.
pub fn selected(stored: &Stored, namespace: Option<&str>, q: &Query) -> bool {
    let meta = stored.object.meta();
    let ns = meta.namespace.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    namespace.is_none_or(|n| n == ns)
        && q.fields.matches(ns, name)
        && q.labels.matches(meta.labels.as_ref())
}

/// Serves a LIST, whole or one page of it.
///
/// `limit` is honoured where the API server reads from etcd: a list of the current state
/// (`resourceVersion` unset) or of an exact version. A list it serves from its watch cache
/// (`resourceVersion=0`, or `NotOlderThan` a version) is served whole, as that cache does, so
/// the fallback list of client-go and Linkerd (`limit=500&resourceVersion=0`) stays one
/// response. Pages come from the snapshot the first page saw ([`crate::view::pages`]).
pub fn list(
    view: &View,
    def: &ResourceDef,
    namespace: Option<&str>,
    q: &Query,
    render: Render,
    headers: &HeaderMap,
) -> Result<Response, StatusError> {
    // A first page lists the current state, and copies it into a kept snapshot only when
    // more pages follow; later pages read the kept one.
    let (kept, fresh): (Items, Vec<Arc<Stored>>);
    let (resource_version, all, after): (u64, &[Arc<Stored>], _) = match q.continue_token.as_deref()
    {
        Some(token) => {
            let t = ContinueToken::decode(token)?;
            kept = view
                .pages()
                .get(def.kind, namespace, t.rv)
                .ok_or_else(continue_expired)?;
            (t.rv, &kept, Some(t.after))
        }
        None => {
            // A namespaced list copies its namespace only.
            let snap = match namespace {
                Some(ns) => view.list_namespace(def.kind, ns),
                None => view.list(def.kind),
            };
            check_list_version(view, q, snap.resource_version)?;
            fresh = snap.items;
            (snap.resource_version, &fresh, None)
        }
    };
    let start = after.as_ref().map_or(0, |k| {
        all.partition_point(|s| NsName::of(s.object.meta()) <= *k)
    });
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
    let mut meta = json!({ "resourceVersion": resource_version.to_string() });
    if more {
        if after.is_none() {
            view.pages()
                .keep(def.kind, namespace, resource_version, Items::from(all));
        }
        let token = ContinueToken {
            v: TOKEN_VERSION.into(),
            rv: resource_version,
            after: NsName::of(all[last].object.meta()),
        };
        meta["continue"] = token.encode().into();
        if q.labels.is_empty() && q.fields.is_empty() {
            // The objects of the namespace (or all of them) after this page.
            let end = namespace.map_or(all.len(), |n| {
                all.partition_point(|s| s.object.meta().namespace.as_deref().unwrap_or("") <= n)
            });
            meta["remainingItemCount"] = (end - last - 1).into();
        }
    }
    let body: Vec<u8> = match render {
        Render::Full => {
            let size: usize = items.iter().map(|s| s.json.len() + 1).sum();
            let mut b = Vec::with_capacity(size + 256);
            write!(
                b,
                r#"{{"kind":"{}","apiVersion":"{}","metadata":{meta},"items":["#,
                def.list_kind(),
                def.api_version()
            )
            .map_err(internal)?;
            for (i, s) in items.iter().enumerate() {
                if i > 0 {
                    b.push(b',');
                }
                b.extend_from_slice(&s.json);
            }
            b.extend_from_slice(b"]}");
            b
        }
        Render::Metadata => serde_json::to_vec(&json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": meta,
            "items": items.iter().map(|s| partial_metadata(s)).collect::<Vec<_>>(),
        }))
        .map_err(internal)?,
        Render::Table => serde_json::to_vec(&table(def, &items, meta)).map_err(internal)?,
    };
    Ok(json_response(StatusCode::OK, body, accepts_gzip(headers)))
}

/// The page size a list is served with, if it is paginated (see [`list`]). A `continue` comes
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
struct ContinueToken {
    v: String,
    rv: u64,
    #[serde(with = "ns_name")]
    after: NsName,
}

impl ContinueToken {
    fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    fn decode(token: &str) -> Result<Self, StatusError> {
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
fn continue_expired() -> StatusError {
    StatusError::new(
        Reason::Expired,
        "The provided continue parameter is too old to display a consistent list result. \
         You can start a new list without the continue parameter.",
    )
}

/// Serves a GET of one object.
pub fn get(
    view: &View,
    def: &ResourceDef,
    namespace: Option<&str>,
    name: &str,
    render: Render,
) -> Result<Response, StatusError> {
    // The version is read first: the object is at least as new as the version a Table says.
    let resource_version = view.resource_version();
    let found = match namespace {
        // The view's index: no copy of the kind, no scan.
        Some(ns) => view.get(&ObjKey {
            kind: def.kind,
            id: NsName::new(ns, name),
        }),
        // Every served kind is namespaced: without a namespace, the first of that name.
        None => view
            .list(def.kind)
            .items
            .into_iter()
            .find(|s| s.object.meta().name.as_deref() == Some(name)),
    };
    let Some(stored) = found.as_ref() else {
        return Err(StatusError::not_found(def.plural, name));
    };
    let body = match render {
        Render::Full => stored.json.to_vec(),
        Render::Metadata => serde_json::to_vec(&partial_metadata(stored)).map_err(internal)?,
        Render::Table => {
            let meta = json!({ "resourceVersion": resource_version.to_string() });
            serde_json::to_vec(&table(def, &[stored], meta)).map_err(internal)?
        }
    };
    Ok(json_response(StatusCode::OK, body, false))
}

/// The resourceVersion rules of a LIST, for Floodgate's versions (no snapshots are kept: only
/// the current state can be served).
fn check_list_version(view: &View, q: &Query, current: u64) -> Result<(), StatusError> {
    let Some(rv) = q
        .resource_version
        .as_deref()
        .filter(|rv| !rv.is_empty() && *rv != "0")
    else {
        return Ok(());
    };
    let asked = parse_rv(rv)?;
    match view.check_issued(asked) {
        Err(ResumeError::TooLarge) => Err(StatusError::too_large(rv)),
        Err(ResumeError::Expired) => Err(StatusError::expired(rv)),
        Ok(_) if q.rv_match == RvMatch::Exact && asked != current => Err(StatusError::expired(rv)),
        Ok(_) => Ok(()),
    }
}

fn table(def: &ResourceDef, items: &[&Arc<Stored>], meta: Value) -> Value {
    let now = jiff::Timestamp::now();
    let rows: Vec<Value> = items
        .iter()
        .map(|s| {
            let o: Value = serde_json::from_slice(&s.json).unwrap_or_default();
            json!({ "cells": table_cells(def.kind, &o, now), "object": partial_metadata(s) })
        })
        .collect();
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": table_columns(def.kind),
        "rows": rows,
    })
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|e| e.trim().starts_with("gzip")))
}

/// A JSON response, gzipped when large and accepted.
pub fn json_response(code: StatusCode, body: Vec<u8>, gzip: bool) -> Response {
    let mut resp = if gzip && body.len() > GZIP_OVER {
        let mut enc = flate2::write::GzEncoder::new(
            Vec::with_capacity(body.len() / 8),
            flate2::Compression::fast(),
        );
        match enc.write_all(&body).and_then(|()| enc.finish()) {
            Ok(z) => {
                let mut r = (code, Body::from(Bytes::from(z))).into_response();
                r.headers_mut()
                    .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                r
            }
            Err(_) => (code, Body::from(body)).into_response(),
        }
    } else {
        (code, Body::from(body)).into_response()
    };
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn internal(e: impl std::fmt::Display) -> StatusError {
    StatusError::new(
        Reason::InternalError,
        format!("encoding the response failed: {e}"),
    )
}
