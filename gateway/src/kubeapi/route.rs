//! Routing one authenticated request: its path to a [`Target`], then discovery, the access
//! review, the event sink, or GET/LIST/WATCH against the store's view; writes go to the store.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::list::{self, json_response, negotiate};
use super::query::Query;
use super::resource;
use super::status::{Reason, StatusError};
use super::{Api, ApiStore, MAX_BODY, Simulation, Write, bump, review, watch};
use crate::model::KindDef;

pub(super) fn not_found_path() -> StatusError {
    StatusError::new(
        Reason::NotFound,
        "the server could not find the requested resource",
    )
}

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    Version,
    Api,
    Apis,
    GroupVersion(&'a str, &'a str),
    Review,
    Events,
    /// A follower replica's stream of the whole view ([`super::replica`]).
    Replica,
    Resource {
        def: &'static KindDef,
        namespace: Option<&'a str>,
        name: Option<&'a str>,
    },
    NotFound,
}

fn route(path: &str) -> Target<'_> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Target::Version,
        ["api"] => return Target::Api,
        ["apis"] => return Target::Apis,
        ["floodgate", "v1", "view"] => return Target::Replica,
        ["api", v] => return Target::GroupVersion("", v),
        ["apis", g, v] => return Target::GroupVersion(g, v),
        [
            "apis",
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
        ] => return Target::Review,
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Target::NotFound,
    };
    let (namespace, plural, name) = match rest {
        [plural] => (None, *plural, None),
        ["namespaces", ns, plural] => (Some(*ns), *plural, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
        _ => return Target::NotFound,
    };
    if plural == "events" && matches!((group, version), ("", "v1") | ("events.k8s.io", "v1")) {
        return Target::Events;
    }
    match KindDef::find(group, version, plural) {
        Some(def) => Target::Resource {
            def,
            namespace,
            name,
        },
        None => Target::NotFound,
    }
}

/// Serves one authenticated request; `path` is relative to the API's root.
pub(super) async fn serve<S: ApiStore>(api: &Api<S>, path: &str, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return StatusError::new(
                Reason::RequestEntityTooLarge,
                format!("request body over {MAX_BODY} bytes"),
            )
            .into_response();
        }
    };
    let query = parts.uri.query().unwrap_or_default();
    let resp = match dispatch(api, &parts.method, path, query, &parts.headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    // The encoding served, from the response's own Content-Type (errors are JSON Status).
    let protobuf = (resp.headers().get(axum::http::header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with(crate::protobuf::MEDIA_TYPE));
    let key = (
        verb(&parts.method, path, query),
        resource_of(path),
        resp.status().as_u16(),
        if protobuf { "protobuf" } else { "json" },
    );
    *(api
        .counters
        .requests
        .lock()
        .unwrap_or_else(|e| e.into_inner()))
    .entry(key)
    .or_default() += 1;
    resp
}

/// A request's verb as the API server names it in its audit log and metrics.
fn verb(method: &Method, path: &str, query: &str) -> &'static str {
    let named = matches!(route(path), Target::Resource { name: Some(_), .. });
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    match *method {
        Method::GET if named => "get",
        Method::GET if watch => "watch",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

/// The resource a request is about: a served one's plural, `events`, or `other` (discovery,
/// unknown paths).
fn resource_of(path: &str) -> &'static str {
    match route(path) {
        Target::Resource { def, .. } => def.plural,
        Target::Events => "events",
        _ => "other",
    }
}

/// Answers one request: discovery, the access review, the event sink, or a served resource.
async fn dispatch<S: ApiStore>(
    api: &Api<S>,
    method: &Method,
    path: &str,
    raw_query: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, StatusError> {
    let store = &api.store;
    if let Some(e) = store.simulation().and_then(Simulation::fault) {
        return Err(e);
    }
    let served = store.served();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let read = method == Method::GET || method == Method::HEAD;
    let json = |v: Value, code: StatusCode| json_response(code, v.to_string().into_bytes());
    match route(path) {
        Target::NotFound => Err(not_found_path()),
        Target::Version if read => Ok(json(store.version(), StatusCode::OK)),
        Target::Api if read => Ok(json(resource::api_versions(), StatusCode::OK)),
        Target::Apis if read => Ok(json(resource::api_group_list(&served), StatusCode::OK)),
        Target::GroupVersion(g, v) if read => resource::resource_list(g, v, &served)
            .map(|v| json(v, StatusCode::OK))
            .ok_or_else(not_found_path),
        Target::Review if method == Method::POST => {
            let attrs = parse_review(&body, content_type)?;
            Ok(json(review::answer(&attrs, &served), StatusCode::CREATED))
        }
        Target::Events if method == Method::POST => {
            Ok(json(discard_event(api, &body)?, StatusCode::CREATED))
        }
        Target::Replica if read => {
            wait_ready(store, api.limits.cold_wait).await?;
            super::replica::serve(store.view(), raw_query)
        }
        Target::Resource {
            def,
            namespace,
            name,
        } => {
            if !served.contains(&def) {
                return Err(not_found_path());
            }
            if !read {
                let (code, v) = write(
                    api,
                    Write {
                        method,
                        def,
                        namespace,
                        name,
                        content_type,
                        body: &body,
                    },
                )?;
                return Ok(json(v, code));
            }
            wait_ready(store, api.limits.cold_wait).await?;
            let q = parse_query(store, raw_query)?;
            let format = negotiate(headers, def.kind)?;
            wait_fresh(store, &q).await;
            if q.watch {
                return open_watch(api, def, namespace, name, q, format);
            }
            match name {
                Some(name) => {
                    bump(&api.counters.gets);
                    list::get(store.view(), def, namespace, name, format)
                }
                None => {
                    bump(&api.counters.lists);
                    list::list(store.view(), def, namespace, &q, format)
                }
            }
        }
        _ => Err(StatusError::new(
            Reason::MethodNotAllowed,
            format!("{method} is not allowed on {path}"),
        )),
    }
}

/// An access review's attributes; a body in a media type the API server does not read is
/// refused as it refuses it.
fn parse_review(body: &[u8], content_type: &str) -> Result<review::Attributes, StatusError> {
    review::parse(body, content_type).map_err(|e| {
        if content_type.is_empty()
            || content_type.contains("json")
            || content_type.contains("protobuf")
        {
            e
        } else {
            review::unsupported(content_type)
        }
    })
}

/// Takes an Event a client posts and discards it (consumers record events on the cluster they
/// think they talk to), counted; the answer is the Event as created, named if it came with a
/// `generateName` only.
fn discard_event<S: ApiStore>(api: &Api<S>, body: &[u8]) -> Result<Value, StatusError> {
    let mut event: Value = serde_json::from_slice(body)
        .map_err(|e| StatusError::bad_request(format!("invalid JSON Event: {e}")))?;
    bump(&api.counters.events_discarded);
    if event["metadata"]["name"].as_str().is_none_or(str::is_empty) {
        let prefix = event["metadata"]["generateName"]
            .as_str()
            .unwrap_or("event-")
            .to_owned();
        let n = api.counters.events_discarded.load(Ordering::Relaxed);
        event["metadata"]["name"] = format!("{prefix}{n:x}").into();
    }
    event["metadata"]["resourceVersion"] = api.store.view().resource_version().to_string().into();
    Ok(event)
}

/// A write to a resource: a simulated API server takes it; Floodgate serves read-only.
fn write<S: ApiStore>(api: &Api<S>, w: Write<'_>) -> Result<(StatusCode, Value), StatusError> {
    let Some(sim) = api.store.simulation() else {
        return Err(StatusError::new(
            Reason::MethodNotAllowed,
            format!(
                "Floodgate serves {} read-only: {} is not allowed",
                w.def.plural, w.method
            ),
        ));
    };
    let written = sim.write(w)?;
    bump(&api.counters.writes);
    Ok(written)
}

/// The query of a read, as the store's server would take it: a simulation of a server that
/// ignores `limit` drops it, and one without streaming lists refuses `sendInitialEvents`.
fn parse_query<S: ApiStore>(store: &S, raw_query: &str) -> Result<Query, StatusError> {
    let sim = store.simulation();
    let mut q = Query::parse(raw_query)?;
    if !sim.is_none_or(Simulation::honours_limit) {
        q.limit = None;
    }
    if q.watch
        && q.send_initial_events.is_some()
        && !sim.is_none_or(Simulation::serves_streaming_lists)
    {
        // The API server's words when its WatchList feature is off.
        return Err(StatusError::invalid(
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
        ));
    }
    Ok(q)
}

/// Opens a watch in one of the link's watch slots; with none free, 429 and a retry after 1 s.
fn open_watch<S: ApiStore>(
    api: &Api<S>,
    def: &'static KindDef,
    namespace: Option<&str>,
    name: Option<&str>,
    q: Query,
    format: list::Format,
) -> Result<Response, StatusError> {
    let Ok(slot) = api.watch_slots.clone().try_acquire_owned() else {
        return Err(StatusError {
            details: Some(serde_json::json!({ "retryAfterSeconds": 1 })),
            ..StatusError::new(
                Reason::TooManyRequests,
                format!(
                    "too many open watches on this link (at most {})",
                    api.limits.max_watches
                ),
            )
        });
    };
    let held = watch::Held {
        slot,
        open: super::OpenWatch::of(&api.counters.open_watches, def),
    };
    let resp = watch::watch(api.store.view(), def, namespace, name, q, format, held)?;
    // Counted once the watcher is subscribed: a test that waits for the count knows
    // every later change reaches it.
    bump(&api.counters.watches);
    Ok(resp)
}

/// How long a list or watch from a version not issued yet waits for it, as the API server
/// waits for its watch cache before answering 504 `ResourceVersionTooLarge`.
const FRESH_WAIT: Duration = Duration::from_secs(3);

/// Waits up to [`FRESH_WAIT`] for the version a request names, when the view has not issued
/// it yet: a replica that follows its holder a moment behind, or a consumer that moved from
/// the holder to it. Whatever the wait ends with, the list or watch itself decides.
async fn wait_fresh<S: ApiStore>(store: &S, q: &Query) {
    let asked = q.resource_version.as_deref().and_then(|v| v.parse().ok());
    if let Some(asked) = asked.filter(|&v: &u64| v != 0) {
        let _checked_again_by_the_request = store.view().wait_issued(asked, FRESH_WAIT).await;
    }
}

async fn wait_ready<S: ApiStore>(store: &S, wait: Duration) -> Result<(), StatusError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match store.ready() {
            Ok(()) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => {
                let _ = tokio::time::timeout_at(deadline, store.ready_changed()).await;
            }
        }
    }
}
