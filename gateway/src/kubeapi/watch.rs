//! WATCH: the event stream (newline-delimited JSON, or length-delimited protobuf frames), with
//! synthetic ADDED for a start from scratch, resumption from the view's history, streaming
//! lists (`sendInitialEvents`), bookmarks, selector-driven ADDED/DELETED, a bounded lifetime,
//! and a bounded backlog per watcher.
//!
//! Live events reuse the frame the view encoded once (JSON with the event; protobuf and
//! metadata-only forms the first time a watcher asks); only frames whose event type differs
//! from the state's own (synthetic ADDED, selector transitions) are built per watcher. A watcher
//! whose backlog overflows (it reads slower than the link publishes) is closed: the client
//! resumes from its last version, or relists on 410. When the view lets its watchers go
//! (`View::disconnect`) while the API drains (`Api::drain_watches`, Floodgate's shutdown), each
//! watch ends with a BOOKMARK carrying its latest version.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream;
use serde_json::json;
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::{Instant, sleep_until};

use super::list::{Encoding, Format, Render, selected};
use super::query::{Query, parse_rv};
use super::status::StatusError;
use crate::model::KindDef;
use crate::protobuf;
use crate::view::metadata;
use crate::view::{Event, EventType, ResumeError, Scope, Stored, View, frame, stored_frame};

/// How often an idle watch with bookmarks gets one (the API server: about every minute).
pub const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

/// Everything one watcher needs; it lives as long as the stream.
struct Watcher {
    def: &'static KindDef,
    namespace: Option<String>,
    query: Query,
    format: Format,
    rx: broadcast::Receiver<Event>,
    initial: VecDeque<Arc<Stored>>,
    initial_end_bookmark: bool,
    last_rv: u64,
    deadline: Instant,
    next_bookmark: Instant,
    done: bool,
    /// The API's watch slot, held for the stream's life.
    slot: Option<OwnedSemaphorePermit>,
    /// This watch in the facade's count by resource, for the stream's life.
    open: Option<super::OpenWatch>,
}

/// What an open watch holds for its life: one of the API's watch slots, and its place in the
/// count of open watches by resource.
#[derive(Debug)]
pub struct Held {
    /// The slot.
    pub slot: OwnedSemaphorePermit,
    /// The count.
    pub open: super::OpenWatch,
}

/// Serves a WATCH. Errors known before the stream starts are HTTP errors, except an expired
/// version, which clients only understand in-stream (kube-rs relists on that alone).
pub fn watch(
    view: &View,
    def: &'static KindDef,
    namespace: Option<&str>,
    name: Option<&str>,
    mut query: Query,
    format: Format,
    held: Held,
) -> Result<Response, StatusError> {
    let Held { slot, open } = held;
    if let Some(name) = name {
        // The legacy `/<plural>/<name>?watch=true` form: a field selector on the name.
        query.fields = super::selector::FieldFilter::parse(&format!("metadata.name={name}"))?;
    }
    let rv = query.resource_version.clone().unwrap_or_default();
    let streaming = query.send_initial_events == Some(true);
    let from_scratch = rv.is_empty() || rv == "0";
    let (initial, rx, last_rv): (VecDeque<Arc<Stored>>, _, u64) = if from_scratch || streaming {
        if !from_scratch {
            // NotOlderThan a version: it must be one this incarnation issued.
            match view.check_issued(parse_rv(&rv)?) {
                Err(ResumeError::TooLarge) => return Err(StatusError::too_large(&rv)),
                Err(ResumeError::Expired) => return Ok(expired_stream(&rv, format.encoding)),
                Ok(()) => {}
            }
        }
        // A watch of one namespace, or of one object in it, copies only that part.
        let scope = match (namespace, query.fields.exact_name()) {
            (Some(ns), Some(name)) => Scope::Object(ns, name),
            (Some(ns), None) => Scope::Namespace(ns),
            (None, _) => Scope::Kind,
        };
        let (snap, rx) = view.list_and_watch_scope(def.kind, scope);
        let items = selected_copy(&snap.items, |s| selected(s, namespace, &query));
        (items, rx, snap.resource_version)
    } else {
        let asked = parse_rv(&rv)?;
        match view.watch_from(def.kind, asked) {
            Ok((events, rx)) => {
                // History comes first: replay it through the same path as live events.
                let mut w = Watcher::new(
                    def,
                    namespace,
                    query,
                    format,
                    rx,
                    VecDeque::new(),
                    false,
                    asked,
                );
                w.slot = Some(slot);
                w.open = Some(open);
                let replay: Vec<Bytes> = events.iter().filter_map(|e| w.render_event(e)).collect();
                return Ok(w.into_response(replay));
            }
            Err(ResumeError::TooLarge) => return Err(StatusError::too_large(&rv)),
            Err(ResumeError::Expired) => return Ok(expired_stream(&rv, format.encoding)),
        }
    };
    let mut w = Watcher::new(
        def, namespace, query, format, rx, initial, streaming, last_rv,
    );
    w.slot = Some(slot);
    w.open = Some(open);
    Ok(w.into_response(Vec::new()))
}

/// The objects of `items` that `keep` selects, in a buffer of their own. Collecting the
/// snapshot by value would reuse its allocation in place: a watcher of one object among 10,000
/// then held an 80 KB buffer for as long as it stayed open (109 KiB per idle watcher, measured
/// over real sockets against kube-sim with 10,000 EndpointSlices).
fn selected_copy(items: &[Arc<Stored>], keep: impl Fn(&Stored) -> bool) -> VecDeque<Arc<Stored>> {
    items.iter().filter(|s| keep(s)).cloned().collect()
}

/// HTTP 200 with one ERROR event carrying a 410 Status, then the end.
fn expired_stream(rv: &str, encoding: Encoding) -> Response {
    let status = StatusError::expired(rv);
    let body = match encoding {
        Encoding::Json => Bytes::from(format!(
            "{}\n",
            json!({ "type": "ERROR", "object": status.to_json() })
        )),
        Encoding::Protobuf => protobuf::watch_frame("ERROR", &status.to_protobuf()),
    };
    streaming_response(Body::from(body), encoding)
}

fn streaming_response(body: Body, encoding: Encoding) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let content_type = match encoding {
        Encoding::Json => "application/json",
        Encoding::Protobuf => protobuf::WATCH_MEDIA_TYPE,
    };
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    resp
}

impl Watcher {
    #[allow(clippy::too_many_arguments)]
    fn new(
        def: &'static KindDef,
        namespace: Option<&str>,
        query: Query,
        format: Format,
        rx: broadcast::Receiver<Event>,
        initial: VecDeque<Arc<Stored>>,
        initial_end_bookmark: bool,
        last_rv: u64,
    ) -> Self {
        let now = Instant::now();
        Self {
            def,
            namespace: namespace.map(str::to_owned),
            deadline: now + query.timeout,
            next_bookmark: now + BOOKMARK_EVERY,
            query,
            format,
            rx,
            initial,
            initial_end_bookmark,
            last_rv,
            done: false,
            slot: None,
            open: None,
        }
    }

    fn into_response(self, replay: Vec<Bytes>) -> Response {
        let encoding = self.format.encoding;
        let replay: VecDeque<Bytes> = replay.into();
        let body = stream::unfold((self, replay), |(mut w, mut replay)| async move {
            if let Some(b) = replay.pop_front() {
                return Some((Ok::<Bytes, std::convert::Infallible>(b), (w, replay)));
            }
            let next = w.next_frame().await?;
            Some((Ok(next), (w, replay)))
        });
        streaming_response(Body::from_stream(body), encoding)
    }

    /// The next frame to write, or `None` to end the stream.
    async fn next_frame(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if let Some(s) = self.initial.pop_front() {
            if self.initial.is_empty() {
                // The initial events are written: an idle watcher keeps no buffer for them.
                self.initial = VecDeque::new();
            }
            return Some(self.object_frame(EventType::Added, &s));
        }
        if self.initial_end_bookmark {
            self.initial_end_bookmark = false;
            return Some(self.bookmark(true));
        }
        loop {
            let bookmark_at = if self.query.bookmarks {
                self.next_bookmark
            } else {
                self.deadline
            };
            tokio::select! {
                ev = self.rx.recv() => match ev {
                    Ok(ev) => {
                        if let Some(b) = self.render_event(&ev) {
                            return Some(b);
                        }
                    }
                    // Too slow: close so the client resumes from its last version or relists.
                    Err(RecvError::Lagged(_)) => return None,
                    // The view let its watchers go. When the API is draining (Floodgate shuts
                    // down) a last BOOKMARK with the latest version, so the client resumes
                    // without a relist; otherwise (kube-sim's faults) just the end.
                    Err(RecvError::Closed) => {
                        self.done = true;
                        let draining = self.slot.as_ref().is_some_and(|p| p.semaphore().is_closed());
                        return (draining && self.query.bookmarks).then(|| self.bookmark(false));
                    }
                },
                () = sleep_until(self.deadline) => {
                    self.done = true;
                    return self.query.bookmarks.then(|| self.bookmark(false));
                }
                () = sleep_until(bookmark_at), if self.query.bookmarks => {
                    self.next_bookmark = Instant::now() + BOOKMARK_EVERY;
                    return Some(self.bookmark(false));
                }
            }
        }
    }

    /// The frame of a view event for this watcher, or `None` when it does not concern it.
    fn render_event(&mut self, ev: &Event) -> Option<Bytes> {
        if ev.resource_version <= self.last_rv {
            return None;
        }
        // The feed carries this watcher's kind only. Every event of it moves the version on,
        // selected or not, so a bookmark or a resume skips what this watcher did not need; a
        // resume from it is valid while that kind's history holds the later changes.
        self.last_rv = ev.resource_version;
        let (ns, q) = (self.namespace.as_deref(), &self.query);
        let now_in = selected(&ev.object, ns, q);
        let kind = match (ev.kind, &ev.previous) {
            (EventType::Modified, Some(prev)) => match (selected(prev, ns, q), now_in) {
                (true, true) => EventType::Modified,
                (false, true) => EventType::Added,
                (true, false) => EventType::Deleted,
                (false, false) => return None,
            },
            (k, _) if now_in => k,
            _ => return None,
        };
        if kind == ev.kind && self.format == Format::JSON {
            // The common case: the frame the view encoded with the event (written again
            // for one the history kept without it).
            return Some(ev.json_frame());
        }
        Some(self.object_frame(kind, &ev.object))
    }

    /// The frame of a `kind` event for `s`: its own event's, shared, when `kind` is that
    /// event's; otherwise built here.
    fn object_frame(&self, kind: EventType, s: &Stored) -> Bytes {
        let own = kind == s.event;
        match (self.format.encoding, self.format.render) {
            (Encoding::Json, Render::Full) => stored_frame(kind, s),
            (Encoding::Json, Render::Metadata | Render::Table) => match own {
                true => s.metadata().json_frame(),
                false => frame(kind.as_str(), s.metadata().json()),
            },
            (Encoding::Protobuf, render) => {
                let forms = match s.protobuf() {
                    Some(forms) if render == Render::Full => forms,
                    _ => s.metadata().protobuf(),
                };
                match own {
                    true => forms.frame(),
                    false => protobuf::watch_frame(kind.as_str(), forms.envelope()),
                }
            }
        }
    }

    fn bookmark(&self, initial_events_end: bool) -> Bytes {
        let (kind, api_version) = match self.format.render {
            Render::Full => (
                self.def.kind.name().to_owned(),
                self.def.api_version.to_owned(),
            ),
            _ => (metadata::KIND.to_owned(), metadata::API_VERSION.to_owned()),
        };
        if self.format.encoding == Encoding::Protobuf {
            let meta = k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                resource_version: Some(self.last_rv.to_string()),
                annotations: if initial_events_end {
                    [(INITIAL_EVENTS_END.to_owned(), "true".to_owned())].into()
                } else {
                    Default::default()
                },
                ..Default::default()
            };
            let item = protobuf::metadata_only(meta);
            return protobuf::watch_frame(
                "BOOKMARK",
                &protobuf::envelope(&api_version, &kind, &item),
            );
        }
        let mut meta = json!({ "resourceVersion": self.last_rv.to_string() });
        if initial_events_end {
            meta["annotations"] = json!({ INITIAL_EVENTS_END: "true" });
        }
        let obj = json!({ "kind": kind, "apiVersion": api_version, "metadata": meta });
        frame("BOOKMARK", obj.to_string().as_bytes())
    }
}

/// The annotation of the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Object;

    /// A watcher of one object among many keeps a buffer for that one, not for the kind.
    #[test]
    fn the_initial_events_of_one_object_hold_no_copy_of_the_kind() {
        let items: Vec<Arc<Stored>> = (0..10_000)
            .map(|i| {
                let svc = k8s_openapi::api::core::v1::Service {
                    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                        name: Some(format!("svc-{i:05}")),
                        namespace: Some("prod".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                Arc::new(Stored::new(Object::Service(Arc::new(svc)), i + 1))
            })
            .collect();
        let initial = selected_copy(&items, |s| {
            s.object.meta().name.as_deref() == Some("svc-04242")
        });
        assert_eq!(initial.len(), 1);
        assert!(
            initial.capacity() < 16,
            "a buffer of {} for one object",
            initial.capacity()
        );
    }
}
