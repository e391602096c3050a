//! When changes publish: the leading edge, bursts and the quiet window.

use std::time::Duration;

use tokio::time::{self, Instant};

use super::*;

/// Drains the view's events and says of which kinds they were, in the order published.
fn kinds(feeds: &mut Feeds) -> Vec<Kind> {
    feeds
        .drain()
        .iter()
        .map(|ev| ev.object.object.kind())
        .collect()
}

/// Debounce: one change goes out after `quiet`; a change every 50 ms goes out after `max`.
#[tokio::test(start_paused = true)]
async fn a_calm_change_goes_at_once_and_a_burst_waits_for_quiet_but_never_longer_than_max() {
    let mut e = synced(
        &mk_spec(),
        vec![mk_service("a", true), mk_slice("a", "a-1", &[(1, true)])],
    );
    let mut rx = e.view().list_and_watch(Kind::EndpointSlice).1;
    // The pods the slices name do not exist: each fetch is answered so at once.
    let poll = |e: &mut Engine| {
        e.poll(Instant::now());
        lack_pods(e);
        e.poll(Instant::now());
    };
    time::advance(Duration::from_secs(1)).await;
    // Quiet for a second, tokens in the bucket: the change is published in the same poll.
    apply(&mut e, mk_slice("a", "a-1", &[(1, false)]));
    poll(&mut e);
    assert!(rx.try_recv().is_ok(), "a calm change costs no quiet window");

    // A second change within the quiet window waits for quiet.
    time::advance(Duration::from_millis(10)).await;
    let t0 = Instant::now();
    apply(&mut e, mk_slice("a", "a-1", &[(2, true)]));
    time::advance(Duration::from_millis(99)).await;
    poll(&mut e);
    assert!(rx.try_recv().is_err(), "still inside the quiet window");
    time::advance(Duration::from_millis(1)).await;
    poll(&mut e);
    assert!(rx.try_recv().is_ok(), "published once quiet for 100ms");
    assert_eq!(Instant::now() - t0, Duration::from_millis(100));

    // A change every 50 ms for 3 s: the first (after 100 ms of quiet) leads, the rest
    // coalesce, and the maximum delay bounds their wait.
    let t1 = Instant::now();
    let mut published_at = Vec::new();
    for i in 0..60u32 {
        apply(&mut e, mk_slice("a", "a-1", &[(10 + i, true)]));
        time::advance(Duration::from_millis(50)).await;
        poll(&mut e);
        if rx.try_recv().is_ok() {
            published_at.push(Instant::now() - t1);
        }
    }
    assert_eq!(
        published_at.first(),
        Some(&Duration::from_millis(50)),
        "the first change of the burst leads, at the next poll"
    );
    assert_eq!(
        published_at.get(1),
        Some(&(Duration::from_millis(50) + Duration::from_secs(2))),
        "max delay bounds the wait of the rest: 2 s after the burst's first coalesced change"
    );
}

/// Service `a` with one endpoint and its pod, synced and then quiet for a second, and a
/// receiver of the view's events.
async fn quiet_service() -> (Engine, Feeds) {
    let e = synced(
        &mk_spec(),
        vec![
            mk_service("a", true),
            mk_slice("a", "a-1", &[(1, true)]),
            mk_pod("a-1", "Running"),
        ],
    );
    let feeds = Feeds::of(e.view());
    time::advance(Duration::from_secs(1)).await;
    (e, feeds)
}

/// One rollout touches a Pod and its EndpointSlice, on two watches, a millisecond apart: both
/// are the leading edge of a quiet service, so neither waits for `quiet`; a second change of
/// either kind inside the window is a burst and does.
#[tokio::test(start_paused = true)]
async fn a_rollout_publishes_its_pod_and_its_slice_at_once_and_a_repeat_waits() {
    let (mut e, mut rx) = quiet_service().await;

    apply(&mut e, mk_pod("a-1", "Pending"));
    e.poll(Instant::now());
    assert_eq!(kinds(&mut rx), [Kind::Pod], "the pod's change leads");
    time::advance(Duration::from_millis(1)).await;
    apply(&mut e, mk_slice("a", "a-1", &[(1, false)]));
    e.poll(Instant::now());
    assert_eq!(
        kinds(&mut rx),
        [Kind::EndpointSlice],
        "the slice's change, 1 ms after its pod's, is the first of its kind: at once"
    );

    time::advance(Duration::from_millis(1)).await;
    let t0 = Instant::now();
    apply(&mut e, mk_slice("a", "a-1", &[(1, true)]));
    e.poll(Instant::now());
    assert_eq!(kinds(&mut rx), [], "a second slice change is a burst");
    time::advance(Duration::from_millis(99)).await;
    e.poll(Instant::now());
    assert_eq!(kinds(&mut rx), [], "still inside the quiet window");
    time::advance(Duration::from_millis(1)).await;
    e.poll(Instant::now());
    assert_eq!(
        kinds(&mut rx),
        [Kind::EndpointSlice],
        "published once quiet for 100 ms"
    );
    assert_eq!(Instant::now() - t0, Duration::from_millis(100));
}

/// A burst of pod changes is coalescing when the slice's first change arrives: the slice goes
/// at once and takes the pending pod change with it.
#[tokio::test(start_paused = true)]
async fn another_kinds_first_change_takes_a_coalescing_burst_with_it() {
    let (mut e, mut rx) = quiet_service().await;
    apply(&mut e, mk_pod("a-1", "Pending"));
    e.poll(Instant::now());
    assert_eq!(kinds(&mut rx), [Kind::Pod], "the first pod change leads");
    time::advance(Duration::from_millis(5)).await;
    apply(&mut e, mk_pod("a-1", "Failed"));
    e.poll(Instant::now());
    assert_eq!(kinds(&mut rx), [], "the second coalesces");
    time::advance(Duration::from_millis(5)).await;
    apply(&mut e, mk_slice("a", "a-1", &[(1, false)]));
    e.poll(Instant::now());
    let mut got = kinds(&mut rx);
    got.sort();
    assert_eq!(
        got,
        [Kind::EndpointSlice, Kind::Pod],
        "the slice's first change goes at once, and the pending pod change with it"
    );
    // Nothing is left pending: the stale due entry of the burst publishes nothing.
    time::advance(Duration::from_millis(200)).await;
    e.poll(Instant::now());
    assert_eq!(kinds(&mut rx), []);
}

/// A link with nothing to do sleeps: after a change is published, the engine asks to be woken
/// only to close the rate buckets that counted it (the second after it, and the empty one
/// after that), then once for each of its history's changes to expire, and then never.
#[tokio::test(start_paused = true)]
async fn an_idle_link_wakes_only_to_close_its_rate_and_expire_its_history() {
    let (mut e, mut rx) = quiet_service().await;
    let changed = Instant::now();
    apply(&mut e, mk_pod("a-1", "Pending"));
    let mut next = e.poll(changed);
    assert_eq!(kinds(&mut rx), [Kind::Pod]);
    let mut wakes = Vec::new();
    while let Some(at) = next {
        assert!(wakes.len() < 10, "an idle link keeps waking: {wakes:?}");
        time::advance(at.saturating_duration_since(Instant::now())).await;
        wakes.push(at - changed);
        next = e.poll(Instant::now());
    }
    let age = crate::view::DEFAULT_HISTORY_AGE;
    let (rate, history): (Vec<Duration>, Vec<Duration>) =
        wakes.iter().partition(|d| **d <= 2 * BUCKET);
    assert!(rate.len() <= 2, "the rate's buckets: {wakes:?}");
    assert!(
        !history.is_empty() && history.iter().all(|d| *d >= age - BUCKET && *d <= age),
        "the history's changes, as they turn {age:?} old (the first sync's a second before \
         the change): {wakes:?}"
    );
    assert_eq!(e.view().oldest_change(), None, "the history expired");
    assert_eq!(kinds(&mut rx), [], "and nothing was published meanwhile");
}

const BUCKET: Duration = Duration::from_secs(1);
