//! WATCH on the local cluster, as kube-rs watchers and client-go informers expect it: newline
//! separated `{"type", "object"}` frames; `BOOKMARK`s while idle when `allowWatchBookmarks`;
//! `sendInitialEvents` streaming lists ending with the `k8s.io/initial-events-end` bookmark; a
//! resume from `resourceVersion`, or an in-stream `ERROR` 410 when it is older than the
//! history; the stream ends after `timeoutSeconds`, or when the watcher falls too far behind.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::store::{Frame, LocalStore};
use super::{RESOURCES, Selector};

/// How long an idle watch waits before sending a bookmark.
const BOOKMARK_EVERY: Duration = Duration::from_secs(1);
/// The longest a watch lasts when the client names no timeout (the API server picks 30-60 min).
const MAX_TIMEOUT: Duration = Duration::from_secs(1800);
/// Frames in flight to one watcher's connection; when the connection is slower the broadcast
/// backlog grows and, past its bound, the watch is ended.
const CONNECTION_QUEUE: usize = 64;

/// What a watch request asked for.
#[derive(Debug)]
pub struct WatchRequest {
    /// Index into [`RESOURCES`].
    pub resource: usize,
    /// `None`: every namespace.
    pub namespace: Option<String>,
    /// Label and field selectors.
    pub selector: Selector,
    /// `resourceVersion`: `None` (or "0") starts with every object.
    pub from: Option<u64>,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `sendInitialEvents`.
    pub initial_events: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
}

fn line(type_: &str, object: &Value) -> Bytes {
    let mut b = serde_json::to_vec(&json!({ "type": type_, "object": object }))
        .unwrap_or_else(|_| b"{}".to_vec());
    b.push(b'\n');
    Bytes::from(b)
}

fn bookmark(resource: usize, rv: u64, initial_end: bool) -> Bytes {
    let r = &RESOURCES[resource];
    let mut meta = json!({ "resourceVersion": rv.to_string() });
    if initial_end {
        meta["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    line(
        "BOOKMARK",
        &json!({ "apiVersion": r.api_version(), "kind": r.kind, "metadata": meta }),
    )
}

fn wanted(req: &WatchRequest, f: &Frame) -> bool {
    f.resource == req.resource
        && req.namespace.as_ref().is_none_or(|ns| *ns == f.namespace)
        && req.selector.matches(&f.object)
}

/// Serves one watch.
pub fn serve(store: &Arc<LocalStore>, req: WatchRequest) -> Response {
    let from = if req.initial_events { None } else { req.from };
    let super::store::WatchStart {
        frames: replay,
        mut rx,
        rv: start_rv,
    } = match store.watch_from(req.resource, from) {
        Ok(r) => r,
        // The API server answers a too-old version inside the stream, with a 200.
        Err(e) => return stream_of(vec![line("ERROR", &e.to_json())], None),
    };
    let mut first: Vec<Bytes> = replay
        .iter()
        .filter(|f| wanted(&req, f))
        .map(|f| line(f.type_, &f.object))
        .collect();
    if req.initial_events && req.bookmarks {
        first.push(bookmark(req.resource, start_rv, true));
    }
    let (tx, body_rx) = tokio::sync::mpsc::channel::<Bytes>(CONNECTION_QUEUE);
    let timeout = req.timeout.unwrap_or(MAX_TIMEOUT).min(MAX_TIMEOUT);
    tokio::spawn(async move {
        for b in first {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        let mut last_rv = start_rv;
        let end = tokio::time::sleep(timeout);
        tokio::pin!(end);
        loop {
            let idle = tokio::time::sleep(BOOKMARK_EVERY);
            let frame = tokio::select! {
                () = &mut end => return,
                () = tx.closed() => return,
                () = idle, if req.bookmarks => {
                    if tx.send(bookmark(req.resource, last_rv, false)).await.is_err() {
                        return;
                    }
                    continue;
                }
                f = rx.recv() => f,
            };
            match frame {
                Ok(f) => {
                    last_rv = f.rv;
                    if f.rv <= start_rv || !wanted(&req, &f) {
                        continue;
                    }
                    if tx.send(line(f.type_, &f.object)).await.is_err() {
                        return;
                    }
                }
                // Too far behind, or the store is gone: end the watch; the client resumes.
                Err(RecvError::Lagged(_) | RecvError::Closed) => return,
            }
        }
    });
    stream_of(Vec::new(), Some(body_rx))
}

fn stream_of(first: Vec<Bytes>, rest: Option<tokio::sync::mpsc::Receiver<Bytes>>) -> Response {
    let head = futures_util::stream::iter(first.into_iter().map(Ok::<_, std::convert::Infallible>));
    let tail = futures_util::stream::unfold(rest, |rx| async move {
        let mut rx = rx?;
        let b = rx.recv().await?;
        Some((Ok(b), Some(rx)))
    });
    let body = Body::from_stream(futures_util::StreamExt::chain(head, tail));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}
