//! The facade's routes and errors, through the router (`oneshot`), over a view.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use super::{Api, ApiStore, Links, links_router, router};
use crate::churn::object::Object;
use crate::view::{Change, View};

struct Fixed(View);

impl ApiStore for Fixed {
    fn view(&self) -> &View {
        &self.0
    }
}

fn mk_service(name: &str, ns: &str, app: &str) -> Object {
    Object::Service(Arc::new(k8s_openapi::api::core::v1::Service {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some([("app".to_owned(), app.to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    }))
}

fn mk_view() -> View {
    let view = View::new(9, 1000);
    view.apply([
        Change::Upsert(mk_service("web", "prod", "web")),
        Change::Upsert(mk_service("db", "prod", "db")),
        Change::Upsert(mk_service("web", "dev", "web")),
    ]);
    view
}

async fn call(
    router: axum::Router,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: &str,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = router
        .oneshot(req.body(Body::from(body.to_owned())).expect("request"))
        .await
        .expect("response");
    let code = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
    (code, v)
}

fn api() -> axum::Router {
    router(Arc::new(Api::new(Fixed(mk_view()), "t0k3n")))
}

#[tokio::test]
async fn discovery_documents() {
    let (code, v) = call(api(), "GET", "/api", Some("t0k3n"), "").await;
    assert_eq!(
        (code, v["kind"].as_str()),
        (StatusCode::OK, Some("APIVersions"))
    );
    let (_, v) = call(api(), "GET", "/apis", Some("t0k3n"), "").await;
    let groups: Vec<&str> = v["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    assert!(
        groups.contains(&"discovery.k8s.io") && groups.contains(&"policy.linkerd.io"),
        "{groups:?}"
    );
    let (_, v) = call(
        api(),
        "GET",
        "/apis/policy.linkerd.io/v1beta3",
        Some("t0k3n"),
        "",
    )
    .await;
    assert_eq!(v["resources"][0]["kind"], "Server");
    let (code, v) = call(api(), "GET", "/apis/nothing.io/v1", Some("t0k3n"), "").await;
    assert_eq!(
        (code, v["reason"].as_str()),
        (StatusCode::NOT_FOUND, Some("NotFound"))
    );
}

#[tokio::test]
async fn lists_filter_by_namespace_labels_and_fields() {
    let (code, v) = call(api(), "GET", "/api/v1/services", Some("t0k3n"), "").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(v["kind"], "ServiceList");
    assert_eq!(v["items"].as_array().map(Vec::len), Some(3));
    assert!(
        v["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|rv| !rv.is_empty())
    );
    let (_, v) = call(
        api(),
        "GET",
        "/api/v1/namespaces/prod/services?labelSelector=app%3Dweb",
        Some("t0k3n"),
        "",
    )
    .await;
    assert_eq!(v["items"].as_array().map(Vec::len), Some(1));
    let (_, v) = call(
        api(),
        "GET",
        "/api/v1/services?fieldSelector=metadata.namespace%3Ddev",
        Some("t0k3n"),
        "",
    )
    .await;
    assert_eq!(v["items"][0]["metadata"]["namespace"], "dev");
    let (_, v) = call(
        api(),
        "GET",
        "/api/v1/namespaces/prod/pods",
        Some("t0k3n"),
        "",
    )
    .await;
    assert_eq!(v["items"], serde_json::json!([]), "items is [] never null");
    let (code, v) = call(
        api(),
        "GET",
        "/api/v1/namespaces/prod/services/db",
        Some("t0k3n"),
        "",
    )
    .await;
    assert_eq!(
        (code, v["metadata"]["name"].as_str()),
        (StatusCode::OK, Some("db"))
    );
    let (code, _) = call(
        api(),
        "GET",
        "/api/v1/namespaces/prod/services/nope",
        Some("t0k3n"),
        "",
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn every_error_is_a_status_with_the_right_code() {
    // A version this incarnation (9) has not issued yet, and one from another run (7).
    let ahead = format!("/api/v1/services?resourceVersion={}", (9u64 << 40) + 100);
    let foreign = format!("/api/v1/services?resourceVersion={}", (7u64 << 40) + 1);
    for (method, uri, token, body, code, reason) in [
        ("GET", "/api/v1/services", None, "", 401, "Unauthorized"),
        (
            "GET",
            "/api/v1/services",
            Some("wrong"),
            "",
            401,
            "Unauthorized",
        ),
        (
            "GET",
            "/api/v1/services?labelSelector=a%20in",
            Some("t0k3n"),
            "",
            400,
            "BadRequest",
        ),
        (
            "GET",
            "/api/v1/services?fieldSelector=spec.type%3DX",
            Some("t0k3n"),
            "",
            400,
            "BadRequest",
        ),
        (
            "GET",
            "/api/v1/services?resourceVersionMatch=Exact",
            Some("t0k3n"),
            "",
            422,
            "Invalid",
        ),
        ("GET", ahead.as_str(), Some("t0k3n"), "", 504, "Timeout"),
        ("GET", foreign.as_str(), Some("t0k3n"), "", 410, "Expired"),
        (
            "GET",
            "/api/v1/services?resourceVersion=abc",
            Some("t0k3n"),
            "",
            422,
            "Invalid",
        ),
        (
            "DELETE",
            "/api/v1/namespaces/prod/services/web",
            Some("t0k3n"),
            "",
            405,
            "MethodNotAllowed",
        ),
        (
            "POST",
            "/api/v1/namespaces/prod/services",
            Some("t0k3n"),
            "{}",
            405,
            "MethodNotAllowed",
        ),
        ("GET", "/api/v1/secrets", Some("t0k3n"), "", 404, "NotFound"),
        ("GET", "/nope", Some("t0k3n"), "", 404, "NotFound"),
        (
            "POST",
            "/api/v1/namespaces/prod/events",
            Some("t0k3n"),
            "{not json",
            400,
            "BadRequest",
        ),
    ] {
        let (got, v) = call(api(), method, uri, token, body).await;
        assert_eq!(got.as_u16(), code, "{method} {uri}: {v}");
        assert_eq!(v["kind"], "Status", "{method} {uri}");
        assert_eq!(v["reason"], reason, "{method} {uri}");
        assert_eq!(v["code"], code, "{method} {uri}");
    }
}

#[tokio::test]
async fn protobuf_only_accept_is_406_and_tables_render() {
    let r = api();
    let req = Request::get("/api/v1/services")
        .header("authorization", "Bearer t0k3n")
        .header("accept", "application/vnd.kubernetes.protobuf")
        .body(Body::empty())
        .expect("req");
    assert_eq!(
        r.clone().oneshot(req).await.expect("resp").status(),
        StatusCode::NOT_ACCEPTABLE
    );
    let req = Request::get("/api/v1/services")
        .header("authorization", "Bearer t0k3n")
        .header(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Body::empty())
        .expect("req");
    let bytes = r
        .oneshot(req)
        .await
        .expect("resp")
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let v: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(v["kind"], "Table");
    assert_eq!(v["columnDefinitions"][0]["name"], "Name");
    assert_eq!(v["rows"].as_array().map(Vec::len), Some(3));
}

#[tokio::test]
async fn events_are_accepted_and_discarded() {
    let api = Arc::new(Api::new(Fixed(mk_view()), "t0k3n"));
    let (code, v) = call(router(api.clone()), "POST", "/api/v1/namespaces/prod/events", Some("t0k3n"),
        r#"{"apiVersion":"v1","kind":"Event","metadata":{"generateName":"mirror-"},"reason":"Test"}"#).await;
    assert_eq!(code, StatusCode::CREATED);
    assert!(
        v["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("mirror-"))
    );
    assert_eq!(api.counters.snapshot().events_discarded, 1);
    assert_eq!(
        api.store().view().len(crate::churn::object::Kind::Service),
        3,
        "nothing written"
    );
}

#[tokio::test]
async fn each_link_opens_with_its_own_token() {
    let links = Arc::new(Links::new(
        [
            (
                "east".to_owned(),
                Arc::new(Api::new(Fixed(mk_view()), "east-token")),
            ),
            (
                "west".to_owned(),
                Arc::new(Api::new(Fixed(View::new(2, 10)), "west-token")),
            ),
        ]
        .into(),
    ));
    let r = links_router(links);
    let (code, v) = call(
        r.clone(),
        "GET",
        "/links/east/api/v1/services",
        Some("east-token"),
        "",
    )
    .await;
    assert_eq!(
        (code, v["items"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(3))
    );
    let (code, _) = call(
        r.clone(),
        "GET",
        "/links/east/api/v1/services",
        Some("west-token"),
        "",
    )
    .await;
    assert_eq!(code, StatusCode::FORBIDDEN, "another link's token");
    let (code, _) = call(r.clone(), "GET", "/links/east/api/v1/services", None, "").await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let (code, _) = call(
        r,
        "GET",
        "/links/north/api/v1/services",
        Some("east-token"),
        "",
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}

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

fn shared() -> (View, axum::Router) {
    let view = mk_view();
    (view.clone(), router(Arc::new(Api::new(view, "t0k3n"))))
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
    view.apply([Change::Upsert(mk_service("db", "prod", "database"))]);
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
    view.apply([Change::Upsert(mk_service("web", "prod", "legacy"))]);
    let left = f.next().await.expect("leaves");
    assert_eq!(
        (
            left["type"].as_str(),
            left["object"]["metadata"]["namespace"].as_str()
        ),
        (Some("DELETED"), Some("prod"))
    );
    view.apply([Change::Upsert(mk_service("db", "prod", "web"))]);
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

#[tokio::test]
async fn metadata_only_lists_and_watches() {
    let (view, r) = shared();
    let accept =
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let req = Request::get("/api/v1/services")
        .header("authorization", "Bearer t0k3n")
        .header("accept", accept);
    let bytes = r
        .clone()
        .oneshot(req.body(Body::empty()).expect("req"))
        .await
        .expect("resp")
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let v: Value = serde_json::from_slice(&bytes).expect("json");
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
    view.apply([Change::Upsert(mk_service("web", "dev", "other"))]);
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
        view.apply([Change::Upsert(mk_service("web", "prod", &format!("v{i}")))]);
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
    fn ready(&self) -> Result<(), super::status::StatusError> {
        Err(super::status::StatusError::unavailable(
            "link east has not completed its first sync",
            1,
        ))
    }
}

#[tokio::test]
async fn a_cold_link_answers_503_with_retry_after_and_watches_are_bounded() {
    let limits = super::Limits {
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

mod fuzz;
mod pages;
