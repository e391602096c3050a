//! GET and LIST: content negotiation, filtering, and the list body built from each object's
//! pre-encoded JSON or protobuf message (no object is re-encoded for a full list).

mod page;

use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::time::Instant;
use tower_http::compression::predicate::Predicate;
use tower_http::compression::{CompressionLayer, CompressionLevel};

use self::page::{ContinueToken, continue_expired, next_page, page};
use super::query::{Query, RvMatch, parse_rv};
use super::resource::{table_cells, table_columns};
use super::status::{Reason, StatusError};
use crate::model::KindDef;
use crate::model::{Kind, NsName, ObjKey};
use crate::protobuf;
use crate::view::metadata::{self, partial_metadata};
use crate::view::pages::Items;
use crate::view::{ResumeError, Stored, View};

/// Responses of this size or more are gzipped when the client accepts it (the API server's
/// threshold).
pub const GZIP_OVER: usize = 128 * 1024;

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

/// The wire encoding of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// `application/json`.
    Json,
    /// `application/vnd.kubernetes.protobuf` ([`crate::protobuf`]).
    Protobuf,
}

/// What a request gets, from its Accept header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    /// Objects, metadata or a Table.
    pub render: Render,
    /// JSON or protobuf.
    pub encoding: Encoding,
}

impl Format {
    /// Plain JSON objects.
    pub const JSON: Format = Format {
        render: Render::Full,
        encoding: Encoding::Json,
    };
}

/// Picks a format from the Accept header, as the API server does: the first entry it can
/// serve, in the order given. JSON when the header is absent or names `*/*`,
/// `application/json` with any parameters; protobuf for `application/vnd.kubernetes.protobuf`
/// when `kind` has a protobuf form (a custom resource has none, except as metadata); Tables in
/// JSON only. 406 when no entry can be served.
pub fn negotiate(headers: &HeaderMap, kind: Kind) -> Result<Format, StatusError> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.trim().is_empty() {
        return Ok(Format::JSON);
    }
    for entry in accept.split(',') {
        let mut parts = entry.split(';').map(str::trim);
        let encoding = match parts.next().unwrap_or("") {
            "application/json" | "*/*" | "application/*" => Encoding::Json,
            protobuf::MEDIA_TYPE => Encoding::Protobuf,
            _ => continue,
        };
        let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        let get = |k: &str| params.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        let render = match (get("as"), get("g")) {
            (Some("Table"), Some("meta.k8s.io")) if encoding == Encoding::Json => Render::Table,
            (Some("PartialObjectMetadata" | "PartialObjectMetadataList"), Some("meta.k8s.io")) => {
                Render::Metadata
            }
            (None, _) if encoding == Encoding::Json || kind.def().protobuf => Render::Full,
            // An `as=` or an encoding we do not serve for this kind: the client listed it
            // first but may accept another further on; keep looking.
            _ => continue,
        };
        return Ok(Format { render, encoding });
    }
    Err(StatusError::new(
        Reason::NotAcceptable,
        format!(
            "{} is served as {}; Accept was {accept:?}",
            kind.name(),
            if kind.def().protobuf {
                "application/json or application/vnd.kubernetes.protobuf"
            } else {
                "application/json (a custom resource: protobuf for its metadata only)"
            }
        ),
    ))
}

/// True when an object passes the namespace, label and field filters of a request.
pub fn selected(stored: &Stored, namespace: Option<&str>, q: &Query) -> bool {
    let o = &stored.object;
    let ns = o.namespace();
    namespace.is_none_or(|n| n == ns)
        && q.fields.matches(ns, o.name())
        // A pod's metadata is decoded for a label selector only.
        && (q.labels.is_empty() || q.labels.matches(o.meta().labels.as_ref()))
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
    def: &KindDef,
    namespace: Option<&str>,
    q: &Query,
    format: Format,
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
                .get(def.kind, namespace, t.rv, Instant::now())
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
    let page = page(all, after.as_ref(), namespace, q);
    let mut list_meta = k8s_pb::apimachinery::pkg::apis::meta::v1::ListMeta {
        resource_version: Some(resource_version.to_string()),
        ..Default::default()
    };
    if page.more {
        if after.is_none() {
            view.pages().keep(
                def.kind,
                namespace,
                resource_version,
                Items::from(all),
                Instant::now(),
            );
        }
        (list_meta.r#continue, list_meta.remaining_item_count) =
            next_page(resource_version, all, page.last, namespace, q);
    }
    if format.encoding == Encoding::Protobuf {
        let body = protobuf_list(def, format.render, &list_meta, &page.items);
        return Ok(response(StatusCode::OK, body, protobuf::MEDIA_TYPE));
    }
    let body = json_list_body(def, format.render, &list_meta, &page.items)?;
    Ok(json_response(StatusCode::OK, body))
}

/// A protobuf list body of `items`, rendered as `render` asks.
fn protobuf_list(
    def: &KindDef,
    render: Render,
    list_meta: &k8s_pb::apimachinery::pkg::apis::meta::v1::ListMeta,
    items: &[&Arc<Stored>],
) -> Vec<u8> {
    match render {
        Render::Metadata => protobuf::list(
            metadata::API_VERSION,
            metadata::LIST_KIND,
            list_meta,
            items.iter().map(|s| s.metadata().protobuf().item()),
        ),
        // Negotiation gives protobuf objects only for kinds that have a form.
        _ => protobuf::list(
            def.api_version,
            &def.list_kind(),
            list_meta,
            items
                .iter()
                .filter_map(|s| s.protobuf())
                .map(protobuf::Forms::item),
        ),
    }
}

/// A JSON list body of `items`, rendered as `render` asks: the objects' own JSON spliced in,
/// their metadata, or a Table.
fn json_list_body(
    def: &KindDef,
    render: Render,
    list_meta: &k8s_pb::apimachinery::pkg::apis::meta::v1::ListMeta,
    items: &[&Arc<Stored>],
) -> Result<Vec<u8>, StatusError> {
    let mut meta = json!({ "resourceVersion": list_meta.resource_version });
    if let Some(c) = &list_meta.r#continue {
        meta["continue"] = c.as_str().into();
    }
    if let Some(n) = list_meta.remaining_item_count {
        meta["remainingItemCount"] = n.into();
    }
    Ok(match render {
        Render::Full => json_list(
            &def.list_kind(),
            def.api_version,
            &meta,
            items
                .iter()
                .map(|s| (s.json_len(), |b: &mut Vec<u8>| s.write_json(b))),
        ),
        Render::Metadata => json_list(
            metadata::LIST_KIND,
            metadata::API_VERSION,
            &meta,
            items.iter().map(|s| {
                let json = s.metadata().json();
                (json.len(), move |b: &mut Vec<u8>| b.extend_from_slice(json))
            }),
        ),
        Render::Table => serde_json::to_vec(&table(def, items, meta)).map_err(internal)?,
    })
}

fn json_list<W: FnOnce(&mut Vec<u8>)>(
    list_kind: &str,
    api_version: &str,
    meta: &Value,
    items: impl Iterator<Item = (usize, W)> + Clone,
) -> Vec<u8> {
    let size: usize = items.clone().map(|(len, _)| len + 1).sum();
    let mut b = Vec::with_capacity(size + 256);
    // Writing into a `Vec` has no failure case.
    let _ = write!(
        b,
        r#"{{"kind":"{list_kind}","apiVersion":"{api_version}","metadata":{meta},"items":["#
    );
    for (i, (_, write)) in items.enumerate() {
        if i > 0 {
            b.push(b',');
        }
        write(&mut b);
    }
    b.extend_from_slice(b"]}");
    b
}

/// Serves a GET of one object.
pub fn get(
    view: &View,
    def: &KindDef,
    namespace: Option<&str>,
    name: &str,
    format: Format,
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
            .find(|s| s.object.name() == name),
    };
    let Some(stored) = found.as_ref() else {
        return Err(StatusError::not_found(def.plural, name));
    };
    if format.encoding == Encoding::Protobuf {
        let body = match stored.protobuf() {
            Some(forms) if format.render == Render::Full => forms.envelope().to_vec(),
            _ => stored.metadata().protobuf().envelope().to_vec(),
        };
        return Ok(response(StatusCode::OK, body, protobuf::MEDIA_TYPE));
    }
    let body = match format.render {
        Render::Full => stored.json().into_owned(),
        Render::Metadata => stored.metadata().json().to_vec(),
        Render::Table => {
            let meta = json!({ "resourceVersion": resource_version.to_string() });
            serde_json::to_vec(&table(def, &[stored], meta)).map_err(internal)?
        }
    };
    Ok(json_response(StatusCode::OK, body))
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

fn table(def: &KindDef, items: &[&Arc<Stored>], meta: Value) -> Value {
    let now = jiff::Timestamp::now();
    let rows: Vec<Value> = items
        .iter()
        .map(|s| {
            let o: Value = serde_json::from_slice(&s.json()).unwrap_or_default();
            let object = partial_metadata(&s.object.meta(), s.resource_version);
            json!({ "cells": table_cells(def.kind, &o, now), "object": object })
        })
        .collect();
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": table_columns(def.kind),
        "rows": rows,
    })
}

/// A JSON response.
pub fn json_response(code: StatusCode, body: Vec<u8>) -> Response {
    response(code, body, "application/json")
}

/// A response of `content_type`.
fn response(code: StatusCode, body: Vec<u8>, content_type: &'static str) -> Response {
    let mut resp = (code, Body::from(body)).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// gzip for responses of [`GZIP_OVER`] bytes or more, when the client accepts it (tower-http
/// reads `Accept-Encoding` and sets `Content-Encoding` and `Vary`). It compresses as hyper
/// writes, one buffer at a time, so a large list is neither compressed whole before its first
/// byte nor held twice. Watch streams have no known size and are never compressed.
pub fn compression() -> CompressionLayer<LargeBodies> {
    CompressionLayer::new()
        .quality(CompressionLevel::Fastest)
        .compress_when(LargeBodies)
}

/// The bodies [`compression`] compresses: a known size of at least [`GZIP_OVER`].
#[derive(Clone, Copy, Debug)]
pub struct LargeBodies;

impl Predicate for LargeBodies {
    fn should_compress<B: http_body::Body>(&self, response: &axum::http::Response<B>) -> bool {
        response
            .body()
            .size_hint()
            .exact()
            .is_some_and(|n| n >= GZIP_OVER as u64)
    }
}

fn internal(e: impl std::fmt::Display) -> StatusError {
    StatusError::new(
        Reason::InternalError,
        format!("encoding the response failed: {e}"),
    )
}
