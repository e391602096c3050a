//! The link's own tests (the task and the engine are tested in `churn` and `e2e/`).

use super::*;

/// A request that came before the first sync is let through by the sync itself, not by a
/// timer: on a paused clock no time passes between the sync and the wake.
#[tokio::test(start_paused = true)]
async fn a_request_waiting_for_the_first_sync_wakes_when_it_completes() {
    let (tx, state) = watch::channel(LinkState::default());
    let store = LinkStore {
        name: "east".into(),
        view: View::new(1, 10),
        state,
        version: watch::channel(None).1,
        has_servers: watch::channel(false).1,
    };
    assert!(store.ready().is_err());
    let waiting = tokio::spawn(store.ready_changed());
    tokio::task::yield_now().await;
    let synced_at = tokio::time::Instant::now();
    tx.send_modify(|s| s.synced = true);
    waiting.await.expect("woken");
    assert_eq!(tokio::time::Instant::now(), synced_at);
    assert!(store.ready().is_ok());
}
