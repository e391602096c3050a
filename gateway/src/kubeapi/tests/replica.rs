//! `GET /floodgate/v1/view`: a follower's stream of the whole view, with the view's versions.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::time::Instant;
use tower::ServiceExt;

use super::{Api, Fixed, mk_service, mk_view, router};
use crate::view::Change;

/// The stream's lines as they come, one frame of the body at a time.
struct Lines {
    body: Body,
    pending: Vec<u8>,
}

impl Lines {
    async fn next(&mut self) -> Value {
        loop {
            if let Some(i) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=i).collect();
                return serde_json::from_slice(&line).expect("a JSON line");
            }
            let frame = tokio::time::timeout(std::time::Duration::from_secs(10), self.body.frame())
                .await
                .expect("a frame within 10 s")
                .expect("the stream goes on")
                .expect("a frame");
            if let Ok(data) = frame.into_data() {
                self.pending.extend_from_slice(&data);
            }
        }
    }
}

async fn open(router: axum::Router, uri: &str) -> Lines {
    let req = Request::get(uri)
        .header("authorization", "Bearer t0k3n")
        .body(Body::empty())
        .expect("req");
    let resp = router.oneshot(req).await.expect("resp");
    assert_eq!(resp.status(), StatusCode::OK);
    Lines {
        body: resp.into_body(),
        pending: Vec::new(),
    }
}

#[tokio::test]
async fn a_follower_gets_a_snapshot_then_every_change_with_the_views_versions() {
    let view = mk_view();
    let app = router(std::sync::Arc::new(Api::new(Fixed(view.clone()), "t0k3n")));
    let mut lines = open(app.clone(), "/floodgate/v1/view").await;
    let at = view.resource_version().to_string();
    let sync = lines.next().await;
    assert_eq!(
        (sync["type"].as_str(), sync["resourceVersion"].as_str()),
        (Some("SYNC"), Some(at.as_str()))
    );
    for _ in 0..3 {
        let added = lines.next().await;
        assert_eq!(added["type"], "ADDED");
        assert_eq!(added["object"]["kind"], "Service");
    }
    let synced = lines.next().await;
    assert_eq!(
        (synced["type"].as_str(), synced["resourceVersion"].as_str()),
        (Some("SYNCED"), Some(at.as_str()))
    );

    view.apply(
        [Change::Upsert(mk_service("api", "prod", "api"))],
        Instant::now(),
    );
    let change = lines.next().await;
    assert_eq!(change["type"], "ADDED");
    assert_eq!(change["object"]["metadata"]["name"], "api");
    assert_eq!(
        change["object"]["metadata"]["resourceVersion"].as_str(),
        Some(view.resource_version().to_string().as_str())
    );

    // From a version it holds, the stream resumes: the changes after it, no snapshot.
    let mut resumed = open(app, &format!("/floodgate/v1/view?resourceVersion={at}")).await;
    assert_eq!(resumed.next().await["type"], "RESUMED");
    assert_eq!(resumed.next().await["object"]["metadata"]["name"], "api");
}
