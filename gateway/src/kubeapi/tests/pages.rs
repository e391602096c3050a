//! Paginated lists: `limit` and `continue`, over one snapshot.

use std::collections::BTreeSet;

use axum::http::StatusCode;
use serde_json::Value;
use tokio::time::Instant;

use super::{call, mk_service, shared};
use crate::view::Change;
use crate::view::pages::SNAPSHOTS;

/// GET `uri` with the link's token.
async fn get(router: &axum::Router, uri: &str) -> (StatusCode, Value) {
    call(router.clone(), "GET", uri, Some("t0k3n"), "").await
}

/// Follows the continue tokens from `first` to the end: every page's names, its
/// `remainingItemCount` and the list's resourceVersion.
async fn pages(router: &axum::Router, first: &str) -> Vec<(Vec<String>, Value, Value)> {
    let mut out = Vec::new();
    let mut uri = first.to_owned();
    loop {
        let (code, v) = get(router, &uri).await;
        assert_eq!(code, StatusCode::OK, "{uri}: {v}");
        let names = v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["metadata"]["namespace"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                )
            })
            .collect();
        let meta = &v["metadata"];
        out.push((
            names,
            meta["remainingItemCount"].clone(),
            meta["resourceVersion"].clone(),
        ));
        match meta["continue"].as_str() {
            // Every `first` here has a query already.
            Some(token) => uri = format!("{first}&continue={token}"),
            None => return out,
        }
    }
}

/// The view of [`shared`] grown to 7 services: 5 in `prod`, 2 in `dev`.
fn seven() -> (crate::view::View, axum::Router) {
    let (view, router) = shared();
    view.apply(
        ["a", "b", "c"]
            .map(|n| Change::Upsert(mk_service(n, "prod", "batch")))
            .into_iter()
            .chain([Change::Upsert(mk_service("api", "dev", "web"))]),
        Instant::now(),
    );
    (view, router)
}

#[tokio::test]
async fn a_limited_list_is_served_in_pages_that_add_up_to_the_whole() {
    let (_, router) = seven();
    let got = pages(&router, "/api/v1/services?limit=3").await;
    let sizes: Vec<usize> = got.iter().map(|(n, ..)| n.len()).collect();
    assert_eq!(sizes, [3, 3, 1]);
    let remaining: Vec<Value> = got.iter().map(|(_, r, _)| r.clone()).collect();
    assert_eq!(remaining, [Value::from(4), Value::from(1), Value::Null]);
    let names: Vec<&String> = got.iter().flat_map(|(n, ..)| n).collect();
    let unique: BTreeSet<&String> = names.iter().copied().collect();
    assert_eq!(
        (names.len(), unique.len()),
        (7, 7),
        "each object once: {names:?}"
    );
    let rvs: BTreeSet<String> = got.iter().map(|(.., rv)| rv.to_string()).collect();
    assert_eq!(rvs.len(), 1, "every page carries the snapshot's version");

    let prod = pages(&router, "/api/v1/namespaces/prod/services?limit=2").await;
    let names: Vec<String> = prod.iter().flat_map(|(n, ..)| n.clone()).collect();
    assert_eq!(
        names,
        ["prod/a", "prod/b", "prod/c", "prod/db", "prod/web"],
        "a namespace's objects, in order"
    );
    assert_eq!(
        prod[0].1,
        Value::from(3),
        "the namespace's remaining objects"
    );

    let web = pages(&router, "/api/v1/services?limit=1&labelSelector=app%3Dweb").await;
    let names: Vec<String> = web.iter().flat_map(|(n, ..)| n.clone()).collect();
    assert_eq!(names, ["dev/api", "dev/web", "prod/web"]);
    assert!(
        web.iter().all(|(_, r, _)| r.is_null()),
        "no count is promised under a selector"
    );
}

#[tokio::test]
async fn pages_come_from_the_first_pages_snapshot() {
    let (view, router) = seven();
    let (_, first) = get(&router, "/api/v1/services?limit=4").await;
    let token = first["metadata"]["continue"].as_str().expect("a token");
    // The state moves on between the pages: one object gone, one added at the end.
    view.apply(
        [
            Change::Delete(crate::model::ObjKey {
                kind: crate::model::Kind::Service,
                id: crate::model::NsName::new("prod", "web"),
            }),
            Change::Upsert(mk_service("zzz", "prod", "new")),
        ],
        Instant::now(),
    );
    let (code, rest) = get(
        &router,
        &format!("/api/v1/services?limit=4&continue={token}"),
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    let names: Vec<&str> = rest["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["c", "db", "web"],
        "the snapshot's state, not the new one"
    );
    assert_eq!(
        rest["metadata"]["resourceVersion"],
        first["metadata"]["resourceVersion"]
    );
    assert!(rest["metadata"]["continue"].is_null(), "the last page");
}

#[tokio::test]
async fn lists_from_the_cache_ignore_limit_and_bad_tokens_are_refused() {
    let (view, router) = seven();
    for uri in [
        "/api/v1/services?limit=2&resourceVersion=0",
        "/api/v1/services?limit=0",
    ] {
        let (code, v) = get(&router, uri).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(v["items"].as_array().map(Vec::len), Some(7), "{uri}: whole");
        assert!(v["metadata"]["continue"].is_null());
    }
    for (token, code) in [
        ("not%20base64%21", StatusCode::BAD_REQUEST),
        ("eyJ2IjoxfQ", StatusCode::BAD_REQUEST), // {"v":1}
    ] {
        let (got, v) = get(
            &router,
            &format!("/api/v1/services?limit=2&continue={token}"),
        )
        .await;
        assert_eq!((got, v["kind"].as_str()), (code, Some("Status")), "{token}");
    }
    // Past the cap, the oldest snapshot is dropped: its token is 410 Expired.
    let (_, first) = get(&router, "/api/v1/services?limit=2").await;
    let stale = first["metadata"]["continue"]
        .as_str()
        .expect("a token")
        .to_owned();
    for i in 0..SNAPSHOTS {
        view.apply(
            [Change::Upsert(mk_service(&format!("n{i}"), "prod", "x"))],
            Instant::now(),
        );
        let (_, v) = get(&router, "/api/v1/services?limit=2").await;
        assert!(v["metadata"]["continue"].is_string());
    }
    let (code, v) = get(
        &router,
        &format!("/api/v1/services?limit=2&continue={stale}"),
    )
    .await;
    assert_eq!(
        (code, v["reason"].as_str()),
        (StatusCode::GONE, Some("Expired"))
    );
}
