//! Fetching pods one by one, and the pod watcher's skipped events, against the facade serving a
//! view over loopback.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::watch::{Gate, Watch};
use super::{MAX_OBJECT_BYTES, Message, UpstreamCounters, fetch_pods};
use crate::churn::{Answer, Change, Fetch};
use crate::kubeapi;
use crate::model::wanted::{PodHash, WantedPods};
use crate::model::{Kind, NsName, Object};
use crate::view::{self, View};

fn pod(name: &str, note: &str) -> Object {
    pod_of(name, note, None)
}

/// A pod owned by ReplicaSet `prod/web-rs`, with `note` to tell its versions apart.
fn owned_pod(name: &str, note: &str) -> Object {
    let owner = OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "web-rs".into(),
        uid: "u1".into(),
        controller: Some(true),
        ..OwnerReference::default()
    };
    pod_of(name, note, Some(owner))
}

fn pod_of(name: &str, note: &str, owner: Option<OwnerReference>) -> Object {
    Object::Pod(Arc::new(
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("prod".into()),
                annotations: Some([("note".to_owned(), note.to_owned())].into()),
                owner_references: owner.map(|o| vec![o]),
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
    while let Some(Message {
        generation, change, ..
    }) = rx.recv().await
    {
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

/// The next message that is not a list's marker.
async fn next_change(rx: &mut mpsc::Receiver<Message>) -> Message {
    loop {
        let m = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("a message within 10 s")
            .expect("the watcher runs");
        if !matches!(m.change, Change::InitStart(_) | Change::InitDone(_)) {
            return m;
        }
    }
}

/// The pod watcher counts the watch events of pods it skips by ReplicaSet and sends the counts
/// in the queue, in the order it read them: before a later change, or on their own within
/// `SKIPPED_SEND`; each as of its first event. A list's skipped pods are state, not counted.
#[tokio::test]
async fn skipped_pod_events_are_sent_in_order_as_of_when_they_were_read() {
    let view = View::new(1, 100);
    view.apply(
        [
            view::Change::Upsert(owned_pod("skipped", "0")),
            view::Change::Upsert(owned_pod("kept", "0")),
        ],
        Instant::now(),
    );
    let client = remote(view.clone()).await;
    let counters = Arc::new(UpstreamCounters::default());
    let (tx, mut rx) = mpsc::channel(64);
    let wanted = WantedPods::default();
    wanted.insert(PodHash::of("prod", "kept"));
    let mut tasks = tokio::task::JoinSet::new();
    let w = Watch {
        client: &client,
        generation: 1,
        tx: &tx,
        counters: &counters,
    };
    w.pods(&mut tasks, watcher::Config::default(), Gate::Open, wanted);
    let listed = next_change(&mut rx).await;
    assert!(
        matches!(&listed.change, Change::Apply(o) if &*o.key().id.name == "kept"),
        "the list brings the kept pod only: {listed:?}"
    );
    // Three events of the skipped pod, then one of the kept pod.
    let before = Instant::now();
    for note in ["1", "2", "3"] {
        view.apply(
            [view::Change::Upsert(owned_pod("skipped", note))],
            Instant::now(),
        );
    }
    view.apply(
        [view::Change::Upsert(owned_pod("kept", "1"))],
        Instant::now(),
    );
    // One count as a rule; more only if the watcher was descheduled past `SKIPPED_SEND`
    // between two of the events (a loaded machine): all before the kept pod's change.
    let mut counted = Vec::new();
    let kept = loop {
        let m = next_change(&mut rx).await;
        match &m.change {
            Change::Skipped { replicaset, events } => {
                assert_eq!(replicaset, &NsName::new("prod", "web-rs"));
                counted.push((*events, m.at));
            }
            _ => break m,
        }
    };
    assert!(
        !counted.is_empty(),
        "the skipped events come first: {kept:?}"
    );
    assert_eq!(counted.iter().map(|(n, _)| n).sum::<u64>(), 3);
    assert!(
        matches!(&kept.change, Change::Apply(o) if &*o.key().id.name == "kept"),
        "{kept:?}"
    );
    assert!(
        (counted.iter()).all(|(_, at)| before <= *at && *at <= kept.at),
        "as of when they were read"
    );
    // One more, and nothing after it: sent on its own.
    view.apply(
        [view::Change::Upsert(owned_pod("skipped", "4"))],
        Instant::now(),
    );
    let alone = next_change(&mut rx).await;
    assert!(
        matches!(alone.change, Change::Skipped { events: 1, .. }),
        "{alone:?}"
    );
    assert_eq!(
        counters.pods_skipped.load(Ordering::Relaxed),
        5,
        "the list's too"
    );
}
