//! Fetching pods one by one, against the facade serving a view over loopback.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{MAX_OBJECT_BYTES, Message, UpstreamCounters, fetch_pods};
use crate::churn::{Answer, Change, Fetch};
use crate::kubeapi;
use crate::model::{Kind, NsName, Object};
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
    remote_as(view, "t0k3n").await
}

/// A client presenting `token` to a facade serving `view` (whose token is `t0k3n`).
async fn remote_as(view: View, token: &str) -> kube::Client {
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
    cfg.auth_info.token = Some(token.to_owned().into());
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
    let fetch = Fetch {
        ticket: 3,
        pods: ids.to_vec(),
    };
    fetch_pods(client, fetch, 7, tx, counters.clone()).await;
    let mut answers = BTreeMap::new();
    while let Some(Message { generation, change }) = rx.recv().await {
        assert_eq!(generation, 7);
        let Change::Fetched(f) = change else {
            panic!("only answers: {change:?}");
        };
        assert_eq!(f.ticket, 3, "the fetch's ticket, told back");
        let answer = match f.answer {
            Answer::Found(Object::Pod(p)) => format!("found {}", p.id()),
            other => format!("{other:?}"),
        };
        answers.insert(f.pod.name.to_string(), answer);
    }
    assert_eq!(
        answers,
        BTreeMap::from(
            [
                ("web-0", "found prod/web-0"),
                ("huge", "Absent"),
                ("gone", "Absent"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        ),
        "every pod answered: the one within the limit found, the one refused as absent as \
         the one that is gone"
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

/// A remote that does not answer fails each fetch: the engine asks again later, rather than
/// waiting for an answer that never comes.
#[tokio::test]
async fn a_fetch_the_remote_does_not_answer_fails() {
    // A port that was open a moment ago and is closed now.
    let port = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let cfg = kube::Config::new(format!("http://127.0.0.1:{port}").parse().expect("url"));
    let client = super::client(cfg).expect("client");
    let counters = Arc::new(UpstreamCounters::default());
    let (tx, mut rx) = mpsc::channel(8);
    let pods = ["a", "b"].map(|n| NsName::new("prod", n)).to_vec();
    fetch_pods(client, Fetch { ticket: 1, pods }, 1, tx, counters.clone()).await;
    let mut failed = Vec::new();
    while let Some(Message { change, .. }) = rx.recv().await {
        match change {
            Change::Fetched(f) if matches!(f.answer, Answer::Failed) => failed.push(f.pod),
            other => panic!("only failures: {other:?}"),
        }
    }
    failed.sort();
    assert_eq!(failed, ["a", "b"].map(|n| NsName::new("prod", n)));
    assert_eq!(counters.errors.load(Ordering::Relaxed), 2);
}

/// A GET the remote refuses (here 401: a wrong token) is an answer: the pod is absent to the
/// engine, which leaves it to the pod watcher rather than asking again at every publication.
#[tokio::test]
async fn a_fetch_the_remote_refuses_is_absent() {
    let client = remote_as(View::new(1, 100), "wrong").await;
    let counters = Arc::new(UpstreamCounters::default());
    let (tx, mut rx) = mpsc::channel(8);
    let pods = vec![NsName::new("prod", "a")];
    fetch_pods(client, Fetch { ticket: 1, pods }, 1, tx, counters.clone()).await;
    let Some(Message {
        change: Change::Fetched(f),
        ..
    }) = rx.recv().await
    else {
        panic!("an answer")
    };
    assert!(matches!(f.answer, Answer::Absent), "{:?}", f.answer);
    assert_eq!(counters.errors.load(Ordering::Relaxed), 1);
}

/// A GET the remote refuses for good (400, 401, 403) is an answer; one it cannot serve now
/// (408, 429, 5xx: an API server overloaded or restarting) is a failure, asked again.
#[test]
fn only_a_lasting_refusal_makes_a_fetched_pod_absent() {
    use kube::core::Status;
    let answered = |code: u16| {
        let status = Status::failure("no", "Reason").with_code(code);
        super::fetch::refusal(&kube::Error::Api(status.boxed()))
    };
    for code in [400, 401, 403, 422] {
        assert!(answered(code), "{code} is a refusal");
    }
    for code in [408, 429, 500, 503, 504] {
        assert!(!answered(code), "{code} is asked again");
    }
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

/// The engine is told the pod watcher opened exactly once a run, when the last of the kinds
/// that open it is listed: a relist of one of them opens nothing.
#[test]
fn the_pod_watcher_opens_once_the_opening_kinds_are_listed() {
    let u = super::Upstream {
        _tasks: tokio::task::JoinSet::new(),
        pods_gate: Arc::new(tokio::sync::Semaphore::new(0)),
        listed: std::sync::Mutex::new(Vec::new()),
    };
    let opened = |kind| u.listed(kind);
    assert!(!opened(Kind::Pod), "pods open nothing");
    assert!(!opened(Kind::Service));
    assert!(!opened(Kind::EndpointSlice));
    assert!(!opened(Kind::Service), "listed again");
    assert!(opened(Kind::Endpoints), "the last of the three");
    assert_eq!(
        u.pods_gate.available_permits(),
        3,
        "the gate's three permits"
    );
    assert!(!opened(Kind::Endpoints), "open already");
}
