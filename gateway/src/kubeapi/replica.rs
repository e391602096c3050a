//! `GET /floodgate/v1/view` under a link: its whole view for a replica that follows it, in
//! the holder's order and with the holder's resource versions ([`crate::view::replica`]).
//!
//! The body is newline-delimited JSON, one line a frame:
//! - `{"type":"SYNC","resourceVersion":"N"}`, then every object as an `ADDED` watch frame, then
//!   `{"type":"SYNCED","resourceVersion":"N"}`: a snapshot, when the follower could not resume
//!   from the `resourceVersion` it asked for (or asked for none);
//! - `{"type":"RESUMED","resourceVersion":"N"}`: the changes after `N` follow;
//! - watch frames (`ADDED`, `MODIFIED`, `DELETED`), each with its version in the object;
//! - `{"type":"HEARTBEAT","resourceVersion":"N"}` every [`HEARTBEAT`] while nothing changes,
//!   so a follower tells a silent holder from a stopped one.
//!
//! The stream ends when the follower falls more than [`crate::view::replica::REPLICA_BACKLOG`]
//! publications behind: it asks again from the version it has.

use std::collections::VecDeque;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use futures_util::stream;
use tokio::sync::broadcast::error::RecvError;

use super::query::{Query, parse_rv};
use super::status::StatusError;
use crate::view::replica::Start;
use crate::view::{Event, EventType, View, stored_frame};

/// The stream's path, under a link's.
pub const PATH: &str = "/floodgate/v1/view";

/// How often a follower hears from its holder while nothing changes.
pub const HEARTBEAT: Duration = Duration::from_secs(2);

/// The media type of the stream.
pub const MEDIA_TYPE: &str = "application/x-ndjson";

fn control(kind: &str, rv: u64) -> Bytes {
    Bytes::from(format!(
        "{{\"type\":\"{kind}\",\"resourceVersion\":\"{rv}\"}}\n"
    ))
}

/// The stream for a follower asking from `query`'s `resourceVersion`.
pub(super) fn serve(view: &View, query: &str) -> Result<Response, StatusError> {
    let query = Query::parse(query)?;
    let from = match query.resource_version.as_deref() {
        None | Some("") => None,
        Some(v) => Some(parse_rv(v)?),
    };
    let (start, rx) = view.replicate(from);
    tracing::debug!(
        ?from,
        resumed = matches!(start, Start::Resumed(_)),
        "a replica follows this view"
    );
    let mut first: VecDeque<Bytes> = VecDeque::new();
    match start {
        Start::Resumed(events) => {
            first.push_back(control("RESUMED", from.unwrap_or_default()));
            first.extend(events.iter().map(Event::json_frame));
        }
        Start::Snapshot {
            resource_version,
            items,
        } => {
            first.push_back(control("SYNC", resource_version));
            first.extend(items.iter().map(|s| stored_frame(EventType::Added, s)));
            first.push_back(control("SYNCED", resource_version));
        }
    }
    let view = view.clone();
    let body = stream::unfold((first, rx, view), |(mut first, mut rx, view)| async move {
        if let Some(b) = first.pop_front() {
            return Some((Ok::<Bytes, std::convert::Infallible>(b), (first, rx, view)));
        }
        let frame = match tokio::time::timeout(HEARTBEAT, rx.recv()).await {
            Err(_) => control("HEARTBEAT", view.resource_version()),
            Ok(Ok(batch)) => {
                let mut b = Vec::with_capacity(batch.iter().map(|e| e.frame.len()).sum());
                for e in batch.iter() {
                    b.extend_from_slice(&e.frame);
                }
                Bytes::from(b)
            }
            // Fallen behind, or the view disconnected its followers: they ask again.
            Ok(Err(RecvError::Lagged(_) | RecvError::Closed)) => return None,
        };
        Some((Ok(frame), (first, rx, view)))
    });
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, MEDIA_TYPE)],
        Body::from_stream(body),
    )
        .into_response())
}
