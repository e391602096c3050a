//! How soon a remote that dies, stops gracefully or refuses us is seen (`Degraded` within
//! 10 s, `Healthy` within 10 s of its return), and how often the binary logs it.

use std::sync::Arc;
use std::time::Duration;

use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::gateway::Stack;
use floodgate_e2e::sim::SimStore;
use floodgate_link_crd::Phase;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;

use super::{next_slice_event, slice_events};

/// The remote goes away for `outage` (listener closed, every connection dropped) and comes
/// back on the same port: the link says `Degraded` within 10 s and serves its view throughout;
/// a change made after the restart reaches consumers within 10 s, and they see no other event.
async fn a_dead_remote_is_degraded_and_back_quickly(outage: Duration) {
    use floodgate_e2e::chaos::ChaosStack;
    let store = Arc::new(SimStore::new(48, 10_000));
    let mut cluster = Cluster::exported(store.clone(), &["web", "api"], 3);
    let stack = ChaosStack::start(store.clone(), Stack::default_spec())
        .await
        .expect("stack");
    assert_eq!(stack.link().phase, Phase::Healthy);
    let through = stack.consumer().await.expect("client");
    let slices = Api::<EndpointSlice>::all(through);
    let mut events = slice_events(slices.clone()).await;

    stack.chaos.kill();
    let killed = tokio::time::Instant::now();
    floodgate_e2e::until(10, "Degraded", async || {
        stack.link().phase == Phase::Degraded
    })
    .await;
    let state = stack.link();
    assert!(
        state.message.contains("unreachable since"),
        "{}",
        state.message
    );
    let served = slices.list(&ListParams::default()).await.expect("served");
    assert_eq!(
        served.items.len(),
        2,
        "the view is served while the remote is down"
    );
    tokio::time::sleep(outage.saturating_sub(killed.elapsed())).await;
    assert_eq!(stack.link().phase, Phase::Degraded, "still down");

    stack.chaos.restart().await.expect("restart");
    let back = tokio::time::Instant::now();
    cluster.roll_pod("web", 0);
    let got = next_slice_event(&mut events, 10, "the change after the restart within 10 s").await;
    assert_eq!(got, "apply web-00000");
    eprintln!(
        "the first change after the restart arrived in {:?}",
        back.elapsed()
    );
    // A second change is the marker: whatever came before it came in between.
    cluster.roll_pod("api", 1);
    let got = next_slice_event(&mut events, 10, "the marker").await;
    assert_eq!(got, "apply api-00000", "no other event");
    floodgate_e2e::until(20, "Healthy again", async || {
        stack.link().phase == Phase::Healthy
    })
    .await;
}

/// How a remote goes away without dropping what it has open.
#[derive(Clone, Copy, Debug)]
enum Quietly {
    /// Stopped as a kube-apiserver sent SIGTERM is (a rolling upgrade, a drained node): it
    /// refuses new connections at once but keeps the open watches, silent, until it exits.
    Stops,
    /// It takes our RBAC away: every request but `/version` gets 403, the watches it allowed go
    /// on, as an API server's do.
    Refuses,
}

/// The remote goes away `how`: the link says `Degraded` within 10 s (it trusted its open
/// watches for 58 s before), with a message that says what (`says`), and serves its view
/// meanwhile; once the remote is back it is `Healthy` within 10 s, and a change made meanwhile
/// is served.
async fn a_remote_that_goes_away_quietly_is_degraded_within_seconds(how: Quietly, says: &str) {
    use floodgate_e2e::chaos::ChaosStack;
    use std::sync::atomic::Ordering;
    let store = Arc::new(SimStore::new(49, 10_000));
    let mut cluster = Cluster::exported(store.clone(), &["web", "api"], 3);
    let stack = ChaosStack::start(store.clone(), Stack::default_spec())
        .await
        .expect("stack");
    assert_eq!(stack.link().phase, Phase::Healthy);
    let slices = Api::<EndpointSlice>::all(stack.consumer().await.expect("client"));
    let mut events = slice_events(slices.clone()).await;

    match how {
        Quietly::Stops => stack.chaos.stop_gracefully(),
        Quietly::Refuses => stack.chaos.faults.refuse.store(true, Ordering::Relaxed),
    }
    let gone = tokio::time::Instant::now();
    floodgate_e2e::until(10, "Degraded", async || {
        stack.link().phase == Phase::Degraded
    })
    .await;
    eprintln!("{how:?}: Degraded {:?} after", gone.elapsed());
    let state = stack.link();
    assert!(state.message.contains(says), "{}", state.message);
    if let Quietly::Refuses = how {
        assert!(state.upstream.refusals >= 1, "counted");
    }
    let served = slices.list(&ListParams::default()).await.expect("served");
    assert_eq!(served.items.len(), 2, "the view is served meanwhile");

    // Written while the remote is away: served once it is back.
    cluster.roll_pod("web", 0);
    match how {
        Quietly::Stops => {
            stack.chaos.kill();
            stack.chaos.restart().await.expect("restart");
        }
        Quietly::Refuses => stack.chaos.faults.refuse.store(false, Ordering::Relaxed),
    }
    let back = tokio::time::Instant::now();
    let got = next_slice_event(&mut events, 10, "the change made meanwhile within 10 s").await;
    assert_eq!(got, "apply web-00000");
    floodgate_e2e::until(10, "Healthy again", async || {
        stack.link().phase == Phase::Healthy
    })
    .await;
    eprintln!("{how:?}: Healthy {:?} after the return", back.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_stopping_gracefully_is_degraded_within_seconds() {
    a_remote_that_goes_away_quietly_is_degraded_within_seconds(Quietly::Stops, "unreachable since")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_that_refuses_our_credentials_is_degraded_and_named() {
    a_remote_that_goes_away_quietly_is_degraded_within_seconds(
        Quietly::Refuses,
        "the remote refuses our credentials (403 Forbidden)",
    )
    .await;
}

/// The scenario, 60 s down (`make e2e`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a minute long: make e2e"]
async fn outage_of_60_s_is_degraded_and_short() {
    a_dead_remote_is_degraded_and_back_quickly(Duration::from_secs(60)).await;
}

/// The same, 15 s down (`make test`): long enough for every watcher's backoff to reach its
/// ceiling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_of_15_s_is_degraded_and_short() {
    a_dead_remote_is_degraded_and_back_quickly(Duration::from_secs(15)).await;
}

/// The real binary with its default log filter, its stderr written to a file, and a remote
/// that dies as a killed process does (its port closed, its connections dropped) for 15 s
/// (60 s in `make e2e`): `Degraded` within 10 s, the view served throughout, at most two lines
/// at WARN or above for the outage (when it begins, and if it lasts past a minute), `Healthy`
/// within 10 s of the remote answering again, and no escape character in the file.
async fn the_binary_logs_an_outage_once(outage: Duration) {
    use floodgate_e2e::chaos::{Chaos, PlainSim, REMOTE_TOKEN};
    use floodgate_e2e::modes::Mode;
    use floodgate_e2e::process::Launch;
    let store = Arc::new(SimStore::new(48, 10_000));
    let _cluster = Cluster::exported(store.clone(), &["web", "api"], 3);
    let sim = PlainSim::start(store, REMOTE_TOKEN).await.expect("sim");
    let chaos = Chaos::start(&sim.url()).await.expect("proxy");
    let dir = tempfile::tempdir().expect("tempdir");
    let remote = floodgate_e2e::sim::kubeconfig(&chaos.url(), REMOTE_TOKEN, None, "east");
    let fg = Launch::new(Mode::Standalone, dir.path())
        .link("east", &remote, Stack::default_spec())
        .log("")
        .start()
        .await
        .expect("floodgate");
    let phase = async || fg.link_state().await["phase"].as_str().map(str::to_owned);
    floodgate_e2e::until(30, "Healthy", async || {
        phase().await.as_deref() == Some("Healthy")
    })
    .await;
    let warnings = |text: &str| {
        text.lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let before = warnings(&fg.log_text()).len();

    chaos.kill();
    let killed = tokio::time::Instant::now();
    floodgate_e2e::until(10, "Degraded", async || {
        phase().await.as_deref() == Some("Degraded")
    })
    .await;
    eprintln!("Degraded {:?} after the kill", killed.elapsed());
    tokio::time::sleep(outage.saturating_sub(killed.elapsed())).await;
    assert_eq!(phase().await.as_deref(), Some("Degraded"), "still down");
    // `floodgate status` says since when the remote has not answered.
    let row = floodgate::cli::status::LinkRow::of_admin(&fg.link_state().await);
    assert!(row.remote.starts_with("unreachable since 20"), "{row:?}");
    chaos.restart().await.expect("restart");
    let back = tokio::time::Instant::now();
    floodgate_e2e::until(10, "Healthy again", async || {
        phase().await.as_deref() == Some("Healthy")
    })
    .await;
    eprintln!("Healthy {:?} after the restart", back.elapsed());

    let text = fg.log_text();
    let during: Vec<String> = warnings(&text).into_iter().skip(before).collect();
    let allowed = if outage >= Duration::from_secs(60) {
        2
    } else {
        1
    };
    assert!(
        during.len() <= allowed,
        "{} lines at WARN or above for one outage:\n{}",
        during.len(),
        during.join("\n")
    );
    assert!(
        text.lines().any(|l| l.contains("the remote answers again")),
        "its end is logged:\n{text}"
    );
    assert!(
        !text.contains('\u{1b}'),
        "no escape character in a log file"
    );
    fg.stop().await.expect("stop");
}

/// The binary's logs through a 15 s outage (`make test`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_logs_a_15_s_outage_once() {
    the_binary_logs_an_outage_once(Duration::from_secs(15)).await;
}

/// The same, 60 s down (`make e2e`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a minute long: make e2e"]
async fn the_binary_logs_a_60_s_outage_at_most_twice() {
    the_binary_logs_an_outage_once(Duration::from_secs(65)).await;
}
