//! The facade's routes and errors, through the router (`oneshot`), over a view.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::time::Instant;
use tower::ServiceExt;

use super::{Api, ApiStore, Links, links_router, router};
use crate::model::Object;
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
    view.apply(
        [
            Change::Upsert(mk_service("web", "prod", "web")),
            Change::Upsert(mk_service("db", "prod", "db")),
            Change::Upsert(mk_service("web", "dev", "web")),
        ],
        Instant::now(),
    );
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

/// GET `uri` with the token and `accept`: the JSON answered.
async fn get_as(router: axum::Router, uri: &str, accept: &str) -> Value {
    let (_, _, body) = fetch(router, uri, accept).await;
    serde_json::from_slice(&body).expect("json")
}

/// GET `uri` with `accept`: the status, the Content-Type and the body.
pub(super) async fn fetch(
    router: axum::Router,
    uri: &str,
    accept: &str,
) -> (StatusCode, String, Vec<u8>) {
    let req = Request::get(uri)
        .header("authorization", "Bearer t0k3n")
        .header("accept", accept)
        .body(Body::empty())
        .expect("req");
    let resp = router.oneshot(req).await.expect("resp");
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let code = resp.status();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (code, content_type, body.to_vec())
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

// Paused: a version not issued yet is waited for (3 s) before its 504.
#[tokio::test(start_paused = true)]
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
async fn protobuf_only_accept_for_a_custom_resource_is_406_and_tables_render() {
    let r = api();
    let req = Request::get("/apis/policy.linkerd.io/v1beta3/servers")
        .header("authorization", "Bearer t0k3n")
        .header("accept", "application/vnd.kubernetes.protobuf")
        .body(Body::empty())
        .expect("req");
    assert_eq!(
        r.clone().oneshot(req).await.expect("resp").status(),
        StatusCode::NOT_ACCEPTABLE
    );
    let v = get_as(
        r,
        "/api/v1/services",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .await;
    assert_eq!(v["kind"], "Table");
    assert_eq!(v["columnDefinitions"][0]["name"], "Name");
    assert_eq!(v["rows"].as_array().map(Vec::len), Some(3));
}

#[tokio::test]
async fn large_lists_are_gzipped_for_clients_that_accept_it_and_watches_never() {
    let view = View::new(9, 1000);
    let note = "x".repeat(1024);
    view.apply(
        (0..200).map(|i| {
            let mut s = mk_service(&format!("svc-{i:03}"), "prod", "web");
            if let Object::Service(svc) = &mut s {
                Arc::make_mut(svc).metadata.annotations =
                    Some([("note".to_owned(), note.clone())].into());
            }
            Change::Upsert(s)
        }),
        Instant::now(),
    );
    let r = router(Arc::new(Api::new(Fixed(view), "t0k3n")));
    let get = |uri: &str, gzip: bool| {
        let mut req = Request::get(uri).header("authorization", "Bearer t0k3n");
        if gzip {
            req = req.header("accept-encoding", "gzip");
        }
        r.clone().oneshot(req.body(Body::empty()).expect("req"))
    };
    let plain = get("/api/v1/services", false).await.expect("resp");
    assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
    let plain = plain.into_body().collect().await.expect("body").to_bytes();
    assert!(
        plain.len() > super::list::GZIP_OVER,
        "{} bytes",
        plain.len()
    );
    let zipped = get("/api/v1/services", true).await.expect("resp");
    assert_eq!(
        zipped
            .headers()
            .get(header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok()),
        Some("gzip")
    );
    let zipped = zipped.into_body().collect().await.expect("body").to_bytes();
    assert!(
        zipped.len() < plain.len() / 4,
        "{} of {}",
        zipped.len(),
        plain.len()
    );
    let mut unzipped = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(&zipped[..]),
        &mut unzipped,
    )
    .expect("gzip");
    assert_eq!(unzipped, plain.to_vec(), "the same list");
    // Small answers and streams stay as they are.
    let one = get("/api/v1/namespaces/prod/services/svc-001", true)
        .await
        .expect("resp");
    assert!(one.headers().get(header::CONTENT_ENCODING).is_none());
    let watch = get("/api/v1/services?watch=1&timeoutSeconds=1", true)
        .await
        .expect("resp");
    assert!(watch.headers().get(header::CONTENT_ENCODING).is_none());
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
        api.store().view().len(crate::model::Kind::Service),
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

fn shared() -> (View, axum::Router) {
    let view = mk_view();
    (view.clone(), router(Arc::new(Api::new(view, "t0k3n"))))
}

mod fuzz;
mod pages;
mod protobuf;
mod replica;
mod watch;
