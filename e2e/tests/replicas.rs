//! `floodgate controller` replicas as processes with 2 s Leases, against kube-sim: a consumer
//! of a follower keeps its watch across the holder's SIGKILL, and links spread over replicas
//! that join and die, the remote never serving more watches than one replica's.
//! (`floodgate_e2e::replicas` runs them; `scenarios --only replicas` prints the same figures.)

use std::time::{Duration, Instant};

use floodgate_e2e::cluster::{lease_holder, service_names};
use floodgate_e2e::replicas::{self, Fleet, LEASE};
use floodgate_e2e::until;

/// A consumer watching through a follower while the holder is SIGKILLed: its watch, never
/// reopened, gets the remote's next change (made right after the SIGKILL) within the Lease
/// duration plus 5 s, and nothing before it (no 410, no DELETED or ADDED for what did not
/// change); reopened on the third replica from the last version it saw, it resumes there
/// (the next change, no 410). The remote serves one replica's watches throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_of_a_follower_keeps_its_watch_across_the_holders_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = replicas::failover(dir.path()).await.expect("the failover");
    eprintln!("{f:#?}");
    assert_eq!(
        f.events,
        ["ADDED api"],
        "only the real change reached the consumer"
    );
    assert!(
        f.change_reached_s <= (LEASE.as_secs() + 5) as f64,
        "the change reached the consumer within the Lease duration plus 5 s: {f:?}"
    );
    assert_eq!(
        f.resumed_on_another,
        ["ADDED billing"],
        "the watch reopened on another replica resumed from its last version"
    );
    assert_eq!(
        f.watches_most, f.watches_one_replica,
        "the remote never served more watches than one replica's"
    );
}

/// Four Links over replicas: three replicas hold them 2, 1, 1; a fourth takes one within two
/// Lease durations; one of the four SIGKILLed, its link is held by another within a Lease
/// duration of its expiry; the remote never serves more watches than one replica's; consumers
/// that watched every link through the replicas that lived, from before the join, saw a later
/// remote change as their next event (no 410, nothing for what did not change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_spread_over_replicas_that_join_and_die_and_each_remote_is_watched_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = replicas::spread(dir.path()).await.expect("the spread");
    eprintln!("{s:#?}");
    assert!(
        s.joined_s <= 2.0 * LEASE.as_secs_f64(),
        "the fourth replica took a link within two Lease durations: {s:?}"
    );
    // The Lease lasts LEASE after its last renewal, then the next renewal of a survivor
    // (every 200 ms) takes it.
    assert!(
        s.moved_s <= 2.0 * LEASE.as_secs_f64(),
        "the link moved within a Lease duration of its Lease's expiry: {s:?}"
    );
    assert_eq!(
        s.watches_most, s.watches_one_replica,
        "the remote never served more watches than one replica's"
    );
    assert!(
        s.view_bases.iter().all(|b| b.ends_with(" same")),
        "every Lease records the base of its holder's versions: {:?}",
        s.view_bases
    );
    let seen: Vec<&str> = (s.consumers.iter())
        .filter_map(|c| c.split_once(": ").map(|(_, e)| e))
        .collect();
    assert_eq!(
        seen,
        vec!["ADDED api"; 8],
        "every consumer of the two surviving replicas watched through the hand-over and the \
         SIGKILL, and saw the change and nothing else: {:?}",
        s.consumers
    );
}

/// The holder stopped with SIGSTOP (alive, its Lease held until it lapses: 15 s, the
/// production timing): its follower says `Degraded` within 10 s, why, and whom it reads from,
/// and its consumers keep the last view; it does not take the link (only the Lease decides).
/// SIGCONT, and the follower is Healthy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_holder_is_sigstopped_says_so_within_10_s_and_serves_its_view() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fleet = Fleet::start(dir.path(), &["east"]).await.expect("fleet");
    fleet.lease(Duration::from_secs(15), Duration::from_secs(5));
    fleet.add_replica("floodgate-0").await.expect("floodgate-0");
    until(30, "floodgate-0 holds the Lease", async || fleet.held_by(1)).await;
    fleet.add_replica("floodgate-1").await.expect("floodgate-1");
    fleet.all_serve(&["web"]).await.expect("both serve");
    let follower = fleet.replica("floodgate-1").admin;
    let on_follower = fleet.consumer("floodgate-1", "east").await.expect("client");
    let state = async || {
        floodgate_e2e::admin::link(follower, "east")
            .await
            .unwrap_or_default()
    };
    until(30, "floodgate-1 follows floodgate-0, Healthy", async || {
        let l = state().await;
        l["phase"] == "Healthy"
            && l["readsFrom"]
                .as_str()
                .is_some_and(|r| r.contains("floodgate-0"))
    })
    .await;

    let stopped = Instant::now();
    fleet.replica("floodgate-0").signal("STOP");
    let mut seen = serde_json::Value::Null;
    until(
        10,
        "the follower says it cannot reach its holder",
        async || {
            seen = state().await;
            seen["phase"] == "Degraded"
                && seen["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("unreachable since"))
        },
    )
    .await;
    let degraded = stopped.elapsed();
    eprintln!(
        "Degraded {:.1} s after SIGSTOP: {seen}",
        degraded.as_secs_f64()
    );
    assert!(
        seen["readsFrom"]
            .as_str()
            .is_some_and(|r| r.contains("floodgate-0")),
        "it says whom it reads from: {seen}"
    );
    assert_eq!(
        service_names(&on_follower).await,
        Some(["web"].map(String::from).into()),
        "its consumers keep the last view"
    );
    assert_eq!(
        lease_holder(&fleet.local, "east").as_deref(),
        Some("floodgate-0"),
        "the Lease, not the silence, decides who holds the link"
    );

    fleet.replica("floodgate-0").signal("CONT");
    until(30, "the follower is Healthy again", async || {
        state().await["phase"] == "Healthy"
    })
    .await;
}
