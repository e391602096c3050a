//! A remote that says everything is gone (issue 52): most of a link's exported services
//! deleted at once, as a namespace's deletion does. The link is quarantined with the removal's
//! share in its reason, its consumers keep every service (no `DELETED` reaches them), and an
//! operator's release lets the removals through; one service deleted alone flows as before.
//! Both modes: `floodgate run` in process, and `floodgate controller` replicas as processes,
//! where the quarantine survives the holder's SIGKILL.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use floodgate_e2e::admin;
use floodgate_e2e::cluster::{ADMIN_TOKEN, lease_holder, service_names};
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::gateway::Stack;
use floodgate_e2e::replicas::Fleet;
use floodgate_e2e::sim::SimStore;
use floodgate_e2e::until;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;

const SIX: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

fn names(of: &[&str]) -> BTreeSet<String> {
    of.iter().map(|s| (*s).to_owned()).collect()
}

/// The Services a consumer saw deleted, by a watcher through the link.
fn deletions(client: kube::Client) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    let api: Api<Service> = Api::all(client);
    tokio::spawn(
        watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .for_each(move |e| {
                if let Ok(watcher::Event::Delete(s)) = e {
                    let name = s.metadata.name.unwrap_or_default();
                    out.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(name);
                }
                async {}
            }),
    );
    seen
}

async fn state(addr: std::net::SocketAddr) -> Value {
    admin::link(addr, "east").await.unwrap_or_default()
}

/// An operator's release of link `east` through the admin API at `addr`.
async fn release(addr: std::net::SocketAddr, token: &str) {
    let (code, v) = admin::call(addr, "POST", "/links/east/release", Some(token), "")
        .await
        .expect("release");
    assert_eq!(code, 200, "{v}");
}

fn quarantined(v: &Value) -> bool {
    v["phase"] == "Quarantined" && v["quarantine"]["reason"] == "MassRemoval"
}

/// `floodgate run`: one service deleted alone reaches consumers; three of the five left,
/// deleted at once, quarantine the link within 5 s, consumers keep all five; released, the
/// three deletions reach them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_services_deleted_at_once_quarantine_the_link() {
    let store = Arc::new(SimStore::new(73, 10_000));
    let mut cluster = Cluster::exported(store.clone(), &SIX, 2);
    let stack = Stack::start(store, Stack::default_spec())
        .await
        .expect("stack");
    let consumer = stack.consumer().await.expect("consumer");
    let deleted = deletions(consumer.clone());
    until(20, "the consumer holds six services", async || {
        service_names(&consumer).await == Some(names(&SIX))
    })
    .await;

    let alone = Instant::now();
    cluster.delete_service("f");
    until(10, "one deletion reaches the consumer", async || {
        service_names(&consumer).await == Some(names(&SIX[..5]))
    })
    .await;
    println!(
        "one service deleted alone: served deleted after {:?}",
        alone.elapsed()
    );
    let v = state(stack.admin_addr()).await;
    assert_eq!(v["phase"], "Healthy", "{v}");

    let at = Instant::now();
    for s in ["a", "b", "c"] {
        cluster.delete_service(s);
    }
    until(5, "the link is quarantined", async || {
        quarantined(&state(stack.admin_addr()).await)
    })
    .await;
    println!(
        "three of five deleted: quarantined after {:?}",
        at.elapsed()
    );
    let v = state(stack.admin_addr()).await;
    assert!(
        v["message"].as_str().is_some_and(|m| m.contains("60%")),
        "the reason names the share: {v}"
    );
    assert_eq!(
        service_names(&consumer).await,
        Some(names(&SIX[..5])),
        "consumers keep every service"
    );
    assert_eq!(
        *deleted.lock().unwrap_or_else(PoisonError::into_inner),
        ["f"],
        "no deletion of the three escaped"
    );

    release(stack.admin_addr(), &stack.admin_token).await;
    until(20, "the removals reach the consumer", async || {
        service_names(&consumer).await == Some(names(&["d", "e"]))
    })
    .await;
}

/// `floodgate controller`, two replicas: the holder quarantines the link, the follower's
/// consumer keeps every service; the holder is SIGKILLed and the new holder keeps the
/// quarantine and the services; an operator's release on it lets the removals through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mass_removal_quarantine_survives_a_failover() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fleet = Fleet::start(dir.path(), &["east"]).await.expect("fleet");
    for s in ["b", "c", "d", "e"] {
        fleet.cluster.add_service(s, true);
        fleet.cluster.scale(s, 2, true);
    }
    let five = ["web", "b", "c", "d", "e"];
    fleet.add_replica("floodgate-0").await.expect("floodgate-0");
    until(30, "floodgate-0 holds the Lease", async || fleet.held_by(1)).await;
    fleet.add_replica("floodgate-1").await.expect("floodgate-1");
    fleet.all_serve(&five).await.expect("both serve five");
    let holder = fleet.holders()[0].clone().expect("a holder");
    let follower = if holder == "floodgate-0" {
        "floodgate-1"
    } else {
        "floodgate-0"
    };
    let consumer = fleet.consumer(follower, "east").await.expect("consumer");
    let deleted = deletions(consumer.clone());

    for s in ["b", "c", "d"] {
        fleet.cluster.delete_service(s);
    }
    let (holder_admin, follower_admin) =
        (fleet.replica(&holder).admin, fleet.replica(follower).admin);
    until(10, "the holder quarantines the link", async || {
        quarantined(&state(holder_admin).await)
    })
    .await;
    until(10, "the follower follows the record", async || {
        state(follower_admin).await["phase"] == "Quarantined"
    })
    .await;
    assert_eq!(service_names(&consumer).await, Some(names(&five)));

    fleet.kill(&holder).await.expect("SIGKILL");
    let local = &fleet.local;
    until(30, "the follower takes the Lease", async || {
        lease_holder(local, "east").as_deref() == Some(follower)
    })
    .await;
    // A replica follows the holder's record as an operator's quarantine that names it.
    until(
        10,
        "the new holder keeps the recorded quarantine",
        async || {
            let v = state(follower_admin).await;
            v["phase"] == "Quarantined"
                && v["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("MassRemoval"))
        },
    )
    .await;
    assert_eq!(
        service_names(&consumer).await,
        Some(names(&five)),
        "the new holder keeps the held services"
    );
    assert!(
        deleted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty(),
        "no deletion reached the consumer"
    );

    release(follower_admin, ADMIN_TOKEN).await;
    until(30, "the removals reach the consumer", async || {
        service_names(&consumer).await == Some(names(&["web", "e"]))
    })
    .await;
}
