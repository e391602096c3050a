//! Watches through the router: streaming lists, selectors, expiry and timeouts, metadata-only
//! watches, watchers that never read, and a cold link.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use tokio::time::Instant;
use tower::ServiceExt;

use super::{call, get_as, mk_service, mk_view, shared};
use crate::kubeapi::status::StatusError;
use crate::kubeapi::{Api, ApiStore, Limits, router};
use crate::view::{Change, View};

/// Reads a watch body frame by frame.
struct Frames {
    body: axum::body::BodyDataStream,
    buf: Vec<u8>,
}

impl Frames {
    async fn open(router: axum::Router, uri: &str, accept: Option<&str>) -> (StatusCode, Self) {
        let mut req = Request::get(uri).header("authorization", "Bearer t0k3n");
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let resp = router
            .oneshot(req.body(Body::empty()).expect("req"))
            .await
            .expect("resp");
        (
            resp.status(),
            Self {
                body: resp.into_body().into_data_stream(),
                buf: Vec::new(),
            },
        )
    }

    /// The next frame, or `None` when the stream ends.
    async fn next(&mut self) -> Option<Value> {
        use futures_util::StreamExt;
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(serde_json::from_slice(&line).expect("each frame is one JSON object"));
            }
            let chunk = tokio::time::timeout(std::time::Duration::from_secs(5), self.body.next())
                .await
                .expect("a frame within 5 s")?;
            self.buf.extend_from_slice(&chunk.expect("body chunk"));
        }
    }
}

#[tokio::test]
async fn a_streaming_list_ends_its_initial_events_with_the_bookmark() {
    let (view, r) = shared();
    let (code, mut f) = Frames::open(
        r,
        "/api/v1/namespaces/prod/services?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
        None,
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    let mut added = Vec::new();
    let bookmark = loop {
        let ev = f.next().await.expect("frame");
        match ev["type"].as_str() {
            Some("ADDED") => added.push(
                ev["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            ),
            Some("BOOKMARK") => break ev,
            other => panic!("unexpected {other:?}"),
        }
    };
    added.sort();
    assert_eq!(added, ["db", "web"]);
    assert_eq!(
        bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(bookmark["object"]["kind"], "Service");
    assert!(
        bookmark["object"]["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|rv| !rv.is_empty())
    );
    view.apply(
        [Change::Upsert(mk_service("db", "prod", "database"))],
        Instant::now(),
    );
    let ev = f.next().await.expect("live event");
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["labels"]["app"].as_str()
        ),
        (Some("MODIFIED"), Some("database"))
    );
}

#[tokio::test]
async fn a_selector_turns_moves_into_added_and_deleted() {
    let (view, r) = shared();
    let (_, mut f) = Frames::open(
        r,
        "/api/v1/services?watch=true&labelSelector=app%3Dweb",
        None,
    )
    .await;
    let mut initial = [f.next().await.expect("1"), f.next().await.expect("2")];
    initial.sort_by_key(|e| {
        e["object"]["metadata"]["namespace"]
            .as_str()
            .map(str::to_owned)
    });
    assert!(
        initial
            .iter()
            .all(|e| e["type"] == "ADDED" && e["object"]["metadata"]["name"] == "web")
    );
    view.apply(
        [Change::Upsert(mk_service("web", "prod", "legacy"))],
        Instant::now(),
    );
    let left = f.next().await.expect("leaves");
    assert_eq!(
        (
            left["type"].as_str(),
            left["object"]["metadata"]["namespace"].as_str()
        ),
        (Some("DELETED"), Some("prod"))
    );
    view.apply(
        [Change::Upsert(mk_service("db", "prod", "web"))],
        Instant::now(),
    );
    let entered = f.next().await.expect("enters");
    assert_eq!(
        (
            entered["type"].as_str(),
            entered["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("db"))
    );
}

#[tokio::test]
async fn an_expired_resume_is_an_in_stream_410_and_a_timeout_ends_with_a_bookmark() {
    let (view, r) = shared();
    let foreign = (3u64 << 40) + 5;
    let (code, mut f) = Frames::open(
        r.clone(),
        &format!("/api/v1/services?watch=true&resourceVersion={foreign}"),
        None,
    )
    .await;
    assert_eq!(
        code,
        StatusCode::OK,
        "kube-rs only relists on an in-stream 410"
    );
    let ev = f.next().await.expect("error event");
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(
        (
            ev["object"]["code"].as_u64(),
            ev["object"]["reason"].as_str()
        ),
        (Some(410), Some("Expired"))
    );
    assert!(f.next().await.is_none(), "then the stream ends");

    let rv = view.resource_version();
    let (_, mut f) = Frames::open(r, &format!("/api/v1/services?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=1"), None).await;
    let ev = f.next().await.expect("final bookmark");
    assert_eq!(ev["type"], "BOOKMARK");
    assert!(f.next().await.is_none(), "the watch ends at its timeout");
}

/// A watch from the next version, one the view has not issued yet (a consumer that moved
/// from a holder to a follower a moment behind it), waits for it as the API server waits for
/// its cache, and resumes: the change at that version is not in its stream, the next one is.
/// A version still not issued after the 3 s wait is 504 `ResourceVersionTooLarge`.
#[tokio::test(start_paused = true)]
async fn a_version_a_moment_ahead_is_waited_for_then_resumed() {
    let (view, r) = shared();
    let next = view.resource_version() + 1;
    let uri = format!("/api/v1/namespaces/prod/services?watch=true&resourceVersion={next}");
    let router = r.clone();
    let opened = tokio::spawn(async move { Frames::open(router, &uri, None).await });
    // The request is waiting (it has parsed, authenticated and checked the version).
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(!opened.is_finished(), "the watch waits for its version");
    view.apply(
        [Change::Upsert(mk_service("api", "prod", "api"))],
        Instant::now(),
    );
    assert_eq!(view.resource_version(), next);
    let (code, mut f) = opened.await.expect("opened");
    assert_eq!(code, StatusCode::OK);
    view.apply(
        [Change::Upsert(mk_service("billing", "prod", "billing"))],
        Instant::now(),
    );
    let ev = f.next().await.expect("the next change");
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("billing")),
        "resumed after the version waited for: {ev}"
    );

    let far = view.resource_version() + 10;
    let waited = Instant::now();
    let (code, v) = call(
        r,
        "GET",
        &format!("/api/v1/services?resourceVersion={far}"),
        Some("t0k3n"),
        "",
    )
    .await;
    assert_eq!(
        (code.as_u16(), v["reason"].as_str()),
        (504, Some("Timeout")),
        "{v}"
    );
    assert_eq!(waited.elapsed(), std::time::Duration::from_secs(3));
}

#[tokio::test]
async fn metadata_only_lists_and_watches() {
    let (view, r) = shared();
    let accept =
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let v = get_as(r.clone(), "/api/v1/services", accept).await;
    assert_eq!(v["kind"], "PartialObjectMetadataList");
    assert_eq!(v["items"][0]["kind"], "PartialObjectMetadata");
    assert!(v["items"][0].get("spec").is_none());
    let (_, mut f) = Frames::open(
        r,
        "/api/v1/namespaces/dev/services?watch=true",
        Some("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
    )
    .await;
    let ev = f.next().await.expect("added");
    assert_eq!(ev["object"]["kind"], "PartialObjectMetadata");
    view.apply(
        [Change::Upsert(mk_service("web", "dev", "other"))],
        Instant::now(),
    );
    let ev = f.next().await.expect("modified");
    assert_eq!(
        (ev["type"].as_str(), ev["object"]["apiVersion"].as_str()),
        (Some("MODIFIED"), Some("meta.k8s.io/v1"))
    );
}

/// A watcher that never reads falls behind; it is closed once its backlog overflows, and the
/// view's memory does not grow with it (the backlog is the shared, bounded broadcast ring).
#[tokio::test]
async fn a_watcher_that_never_reads_is_closed() {
    let (view, r) = shared();
    let (_, mut f) = Frames::open(r, "/api/v1/services?watch=true", None).await;
    for i in 0..(crate::view::FANOUT_BACKLOG + 100) {
        view.apply(
            [Change::Upsert(mk_service("web", "prod", &format!("v{i}")))],
            Instant::now(),
        );
    }
    let mut frames = 0;
    while f.next().await.is_some() {
        frames += 1;
    }
    assert!(
        frames < crate::view::FANOUT_BACKLOG,
        "closed after {frames} frames instead of being fed everything"
    );
}

struct Cold(View);

impl ApiStore for Cold {
    fn view(&self) -> &View {
        &self.0
    }
    fn ready(&self) -> Result<(), StatusError> {
        Err(StatusError::unavailable(
            "link east has not completed its first sync",
            1,
        ))
    }
}

#[tokio::test]
async fn a_cold_link_answers_503_with_retry_after_and_watches_are_bounded() {
    let limits = Limits {
        cold_wait: std::time::Duration::from_millis(200),
        max_watches: 1,
    };
    let cold = router(Arc::new(Api::with_limits(Cold(mk_view()), "t0k3n", limits)));
    let (code, v) = call(cold, "GET", "/api/v1/services", Some("t0k3n"), "").await;
    assert_eq!(
        (code.as_u16(), v["reason"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
    assert_eq!(v["details"]["retryAfterSeconds"], 1);

    let api = Arc::new(Api::with_limits(mk_view(), "t0k3n", limits));
    let (_, mut first) =
        Frames::open(router(api.clone()), "/api/v1/services?watch=true", None).await;
    assert!(first.next().await.is_some());
    assert_eq!(api.open_watches(), 1);
    let (code, v) = call(
        router(api.clone()),
        "GET",
        "/api/v1/services?watch=true",
        Some("t0k3n"),
        "",
    )
    .await;
    assert_eq!(
        (code.as_u16(), v["reason"].as_str()),
        (429, Some("TooManyRequests"))
    );
    drop(first);
    // The slot is released with the stream.
    let (code, _) = call(
        router(api.clone()),
        "GET",
        "/api/v1/services?watch=true&timeoutSeconds=1",
        Some("t0k3n"),
        "",
    )
    .await;
    assert_eq!(code, StatusCode::OK);
}
