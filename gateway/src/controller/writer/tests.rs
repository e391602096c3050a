//! The writer in paused time with a recording API: counter churn is rate limited, transitions
//! go at once, and a replica that loses its lease writes nothing more.

use std::sync::{Arc, Mutex};

use floodgate_link_crd::{Counters, Phase};

use super::*;

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(String, Value)>>>);

impl StatusApi for Recorder {
    fn patch(&self, link: &str, patch: Value) -> BoxFuture<'static, Result<(), kube::Error>> {
        self.0.lock().expect("lock").push((link.to_owned(), patch));
        Box::pin(async { Ok(()) })
    }
}

impl Recorder {
    fn count(&self) -> usize {
        self.0.lock().expect("lock").len()
    }
}

fn mk_status(phase: Phase, events: i64) -> LinkStatus {
    LinkStatus {
        phase: Some(phase),
        counters: Some(Counters {
            upstream_events: events,
            ..Counters::default()
        }),
        ..LinkStatus::default()
    }
}

fn update(status: LinkStatus) -> StatusUpdate {
    StatusUpdate {
        link: "east".into(),
        observed: None,
        status,
    }
}

/// Yields until the writer has handled what was sent.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Ten seconds of a counter changing every 100 ms makes about one write per interval, not a
/// hundred; a phase change in between is written at once.
#[tokio::test(start_paused = true)]
async fn counters_are_rate_limited_and_transitions_are_not() {
    let rec = Recorder::default();
    let (tx, rx) = mpsc::channel(STATUS_QUEUE);
    let (_held_tx, held) = watch::channel(BTreeSet::from(["east".to_owned()]));
    let task = tokio::spawn(run(rx, rec.clone(), held, Duration::from_secs(5)));
    for i in 0..100 {
        tx.send(update(mk_status(Phase::Healthy, i)))
            .await
            .expect("send");
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
    }
    let writes = rec.count();
    assert!(
        (2..=4).contains(&writes),
        "{writes} writes in 10 s at a 5 s interval"
    );
    tx.send(update(mk_status(Phase::Quarantined, 100)))
        .await
        .expect("send");
    tokio::time::advance(Duration::from_millis(600)).await;
    settle().await;
    assert_eq!(rec.count(), writes + 1, "the transition is written at once");
    let last = rec
        .0
        .lock()
        .expect("lock")
        .last()
        .cloned()
        .expect("a write");
    assert_eq!(last.1["status"]["phase"], "Quarantined");
    drop(tx);
    task.await.expect("writer ends when the channel closes");
}

/// Losing the lease stops writing before the next patch; links never held are not written.
#[tokio::test(start_paused = true)]
async fn a_replica_without_the_lease_writes_nothing() {
    let rec = Recorder::default();
    let (tx, rx) = mpsc::channel(STATUS_QUEUE);
    let (held_tx, held) = watch::channel(BTreeSet::from(["east".to_owned()]));
    let _task = tokio::spawn(run(rx, rec.clone(), held, Duration::from_secs(5)));
    tx.send(update(mk_status(Phase::Healthy, 1)))
        .await
        .expect("send");
    tokio::time::advance(Duration::from_millis(600)).await;
    settle().await;
    assert_eq!(rec.count(), 1);
    held_tx.send_replace(BTreeSet::new());
    tx.send(update(mk_status(Phase::Quarantined, 2)))
        .await
        .expect("send");
    tokio::time::advance(Duration::from_secs(30)).await;
    settle().await;
    assert_eq!(rec.count(), 1, "no write after the lease is lost");
    tx.send(StatusUpdate {
        link: "west".into(),
        observed: None,
        status: mk_status(Phase::Healthy, 1),
    })
    .await
    .expect("send");
    tokio::time::advance(Duration::from_secs(30)).await;
    settle().await;
    assert_eq!(rec.count(), 1, "a link never held is never written");
}

/// An unchanged status is not written again, and the first write diffs against the cluster's.
#[tokio::test(start_paused = true)]
async fn only_differences_are_written() {
    let rec = Recorder::default();
    let (tx, rx) = mpsc::channel(STATUS_QUEUE);
    let (_held_tx, held) = watch::channel(BTreeSet::from(["east".to_owned()]));
    let _task = tokio::spawn(run(rx, rec.clone(), held, Duration::from_secs(1)));
    let s = mk_status(Phase::Healthy, 5);
    tx.send(StatusUpdate {
        link: "east".into(),
        observed: Some(s.clone()),
        status: s.clone(),
    })
    .await
    .expect("send");
    tokio::time::advance(Duration::from_secs(3)).await;
    settle().await;
    assert_eq!(rec.count(), 0, "the cluster already has it");
    tx.send(StatusUpdate {
        link: "east".into(),
        observed: Some(s.clone()),
        status: mk_status(Phase::Healthy, 6),
    })
    .await
    .expect("send");
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    let writes = rec.0.lock().expect("lock").clone();
    assert_eq!(writes.len(), 1);
    assert_eq!(
        writes[0].1,
        serde_json::json!({"status": {"counters": {"upstreamEvents": 6}}})
    );
}

#[test]
fn a_containment_is_a_warning_and_a_release_normal_each_naming_the_service() {
    use crate::churn::flood::Reason;
    use crate::churn::quarantine::{Cause, StateName, Transition};
    let t = |from, to, reason| Transition {
        service: Some(crate::model::NsName::new("prod", "injector")),
        from,
        to,
        reason,
        message: "900 events/s".into(),
    };
    let contained = service_event(&t(
        StateName::Active,
        StateName::Contained,
        Cause::Tripped(Reason::ServiceEventRate),
    ));
    assert_eq!(contained.type_, EventType::Warning);
    assert_eq!(contained.reason, "ServiceEventRate");
    assert_eq!(contained.action, "ContainService");
    assert_eq!(
        contained.note.as_deref(),
        Some("service prod/injector: 900 events/s")
    );
    let released = service_event(&t(StateName::Contained, StateName::Active, Cause::Released));
    assert_eq!(released.type_, EventType::Normal);
    assert_eq!(released.reason, "Released");
    assert_eq!(released.action, "ReleaseService");
}
