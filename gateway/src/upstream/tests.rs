//! Fetching pods one by one, against the facade serving a view over loopback.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{MAX_OBJECT_BYTES, Message, UpstreamCounters, fetch_pods};
use crate::churn::Change;
use crate::kubeapi;
use crate::model::{NsName, Object};
use crate::view::{self, View};

fn pod(name: &str, note: &str) -> Object {
    Object::Pod(Arc::new(
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("prod".into()),
                annotations: Some([("note".to_owned(), note.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
        .into(),
    ))
}

/// A client of a facade serving `view` on a loopback port.
async fn remote(view: View) -> kube::Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let router = kubeapi::router(Arc::new(kubeapi::Api::new(view, "t0k3n")));
    tokio::spawn(kubeapi::serve_plain(
        listener,
        router,
        std::future::pending(),
    ));
    let mut cfg = kube::Config::new(url.parse().expect("url"));
    cfg.auth_info.token = Some("t0k3n".to_owned().into());
    super::client(cfg).expect("client")
}

#[tokio::test]
async fn fetched_pods_are_admitted_as_watched_ones() {
    let view = View::new(1, 100);
    view.apply(
        [
            view::Change::Upsert(pod("web-0", "small")),
            view::Change::Upsert(pod("huge", &"x".repeat(MAX_OBJECT_BYTES))),
        ],
        Instant::now(),
    );
    let client = remote(view).await;
    let counters = Arc::new(UpstreamCounters::default());
    let (tx, mut rx) = mpsc::channel(8);
    let ids = ["web-0", "huge", "gone"].map(|n| NsName::new("prod", n));
    fetch_pods(client, ids.to_vec(), 7, tx, counters.clone()).await;
    let mut fetched = Vec::new();
    while let Some(Message { generation, change }) = rx.recv().await {
        assert_eq!(generation, 7);
        let Change::Fetched(Object::Pod(p)) = change else {
            panic!("only fetched pods: {change:?}");
        };
        fetched.push(p.id().clone());
    }
    assert_eq!(
        fetched,
        [NsName::new("prod", "web-0")],
        "the one within the limit"
    );
    assert_eq!(
        counters.oversized.load(Ordering::Relaxed),
        1,
        "the huge one refused"
    );
    assert_eq!(
        counters.errors.load(Ordering::Relaxed),
        0,
        "a pod that is gone is no error"
    );
}

/// A watch the remote ends with 410 is the remote answering (the watcher relists by itself);
/// other watch errors are not that.
#[test]
fn an_expired_watch_is_no_outage() {
    use kube::core::Status;
    use kube::runtime::watcher::Error;
    let expired = Status::failure("too old resource version", "Expired").with_code(410);
    assert!(super::is_expired(&Error::WatchError(expired.boxed())));
    let forbidden = Status::failure("no", "Forbidden").with_code(403);
    assert!(!super::is_expired(&Error::WatchError(forbidden.boxed())));
    let gone = Status::failure("too old", "Expired").with_code(410);
    let start = Error::WatchStartFailed(kube::Error::Api(gone.boxed()));
    assert!(
        !super::is_expired(&start),
        "a refused resume is relisted by Floodgate (needs_relist)"
    );
    assert!(super::needs_relist(&start));
}
