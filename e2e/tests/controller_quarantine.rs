//! Quarantine in cluster mode: recorded in the Link's status by the holder, honoured after a
//! restart, followed by the replicas that do not hold the Lease.

use floodgate::controller::lease;
use floodgate_e2e::cluster::*;
use floodgate_e2e::local::RunningLocal;
use floodgate_e2e::until;
use floodgate_link_crd::{Link, Phase};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

/// A quarantine recorded in the Link's status (by an earlier holder, before a restart) is
/// honoured: the controller starts the link quarantined, and the status it writes keeps the
/// quarantine, its reason and its start, instead of the Healthy the remote alone would give.
#[tokio::test]
async fn a_recorded_quarantine_is_honoured_after_a_restart() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, _cluster) = remote(&["web"]).await;
    add_link(&local, "east", &sim, mk_link("east")).await;
    let links: Api<Link> = Api::namespaced(local.client(NS).expect("client"), NS);
    let since = "2026-01-01T00:00:00Z";
    links
        .patch_status(
            "east",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {
                "phase": "Quarantined",
                "quarantine": {"since": since, "reason": "EventRate",
                    "message": "4000 events/s for 10 s", "figures": {"eventsPerSecond": 4000}},
            }})),
        )
        .await
        .expect("recorded quarantine");
    let replica = Replica::start(&local, "replica-a").await;
    until(
        30,
        "the holder writes a status that keeps the quarantine",
        async || {
            status(&local, "east").await.is_some_and(|s| {
                s.phase == Some(Phase::Quarantined)
                    && condition(&s, "Quarantined").is_some_and(|c| c.status == "True")
                    && s.quarantine.is_some()
            })
        },
    )
    .await;
    // It stays quarantined while the remote is healthy (nothing releases it but an operator).
    let written = status(&local, "east").await.expect("status");
    assert!(
        written
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(1)),
        "{written:?}"
    );
    // Let lease renewals and status ticks pass (ten more writes in the cluster).
    let rv = local.store.resource_version();
    until(10, "ten more writes", async || {
        local.store.resource_version() >= rv + 10
    })
    .await;
    let later = status(&local, "east").await.expect("status");
    assert_eq!(later.phase, Some(Phase::Quarantined), "{later:?}");
    replica.stop().await;
}

/// Waits until the controller's loops have gone round: twenty more requests to the local
/// cluster.
async fn loops_go_round(local: &RunningLocal) {
    let n = local.store.requests();
    until(
        10,
        "b's loops go round (twenty more requests)",
        async || local.store.requests() >= n + 20,
    )
    .await;
}

/// A replica that does not hold the Lease follows the holder's decisions as the status records
/// them: quarantined while `status.quarantine` is set (the remote's new service does not reach
/// its view), released when the holder clears it (the view converges). The holder is played by
/// the test: it holds the Lease and writes the status.
#[tokio::test]
async fn a_replica_without_the_lease_follows_the_recorded_quarantine() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, mut cluster) = remote(&["web"]).await;
    add_link(&local, "east", &sim, mk_link("east")).await;
    let client = local.client(NS).expect("client");
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let mut lease = Lease {
        metadata: ObjectMeta {
            name: Some(lease::lease_name("east")),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some("the-holder".into()),
            lease_duration_seconds: Some(3600),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..Default::default()
        }),
    };
    lease = leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("lease");
    let b = Replica::start(&local, "replica-b").await;
    let consumer = b.consumer("east", &token("east")).await;
    until(30, "b serves east", async || {
        service_names(&consumer).await == Some(["web"].map(String::from).into())
    })
    .await;

    let links: Api<Link> = Api::namespaced(client.clone(), NS);
    let record = |q: serde_json::Value| {
        let links = links.clone();
        async move {
            links
                .patch_status(
                    "east",
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"status": {"quarantine": q}})),
                )
                .await
                .expect("status")
        }
    };
    record(
        serde_json::json!({"since": "2026-01-01T00:00:00Z", "reason": "EventRate",
        "message": "flood", "figures": {}}),
    )
    .await;
    // Status ticks pass (b reads the record and quarantines its link).
    loops_go_round(&local).await;
    cluster.add_service("api", true);
    cluster.scale("api", 1, true);
    loops_go_round(&local).await;
    assert_eq!(
        service_names(&consumer).await,
        Some(["web"].map(String::from).into()),
        "a quarantined view is frozen"
    );
    assert_eq!(
        lease_holder(&local, "east").as_deref(),
        Some("the-holder"),
        "b never took the Lease"
    );
    assert!(
        status(&local, "east")
            .await
            .is_some_and(|s| s.conditions.is_empty()),
        "b writes no status"
    );

    record(serde_json::Value::Null).await;
    until(30, "b follows the release and converges", async || {
        service_names(&consumer).await == Some(["api", "web"].map(String::from).into())
    })
    .await;
    drop(lease);
    b.stop().await;
}
