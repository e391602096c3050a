//! Two `floodgate controller` replicas under the shipped RBAC on the real server: commands reach
//! the Lease holder whichever way they are sent, and the other replica takes over when the
//! holder is SIGKILLed, serving throughout.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use floodgate::command::{self, COMMAND, Outcome};
use floodgate::controller::lease::lease_name;
use floodgate_e2e::process::Floodgate;
use floodgate_e2e::real::{RealKube, kubectl};
use floodgate_e2e::{admin, cluster, until};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::Api;

use super::controller::{account_kubeconfig, link_east, link_phase, replica, shipped_cluster};
use super::{CALM, served_services};

/// Who holds link `east`'s Lease.
async fn lease_holder(kube: &RealKube) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(kube.client().await.ok()?, cluster::NS);
    let lease = leases.get_opt(&lease_name("east")).await.ok()??;
    lease.spec?.holder_identity
}

/// The holder's answer on the Link, once the command is gone from it.
async fn answered(kube: &RealKube) -> Option<Outcome> {
    let link = link_east(kube).await?;
    let annotations = link.metadata.annotations.as_ref();
    if annotations.is_some_and(|a| a.contains_key(COMMAND)) {
        return None;
    }
    command::result_of(&link)
}

/// The notes of the Events on the Link with `reason`.
async fn event_notes(kube: &RealKube, reason: &str) -> Vec<String> {
    let client = kube.client().await.expect("client");
    let events: Api<Event> = Api::namespaced(client, cluster::NS);
    let list = events.list(&Default::default()).await.expect("Events");
    list.items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

/// The phase replica `fg`'s admin API shows for link `east`.
async fn phase_on(fg: &Floodgate) -> Option<String> {
    let link = admin::link(fg.admin, "east").await?;
    link["phase"].as_str().map(str::to_owned)
}

/// Waits until both the Link's status and every replica in `on` show `phase`.
async fn phase_everywhere(kube: &RealKube, on: &[&Floodgate], phase: &str) {
    until(
        30,
        &format!("{phase} in status and on every replica"),
        async || {
            if link_phase(kube).await.as_deref() != Some(phase) {
                return false;
            }
            for fg in on {
                if phase_on(fg).await.as_deref() != Some(phase) {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

/// The two replicas of the shipped manifests, both ready and serving the calm services, and
/// the holder's identity.
pub(super) async fn two_replicas(kube: &RealKube) -> ([Floodgate; 2], String) {
    let account = shipped_cluster(kube, str::to_owned).await;
    two_replicas_as(kube, &account).await
}

/// Two replicas as the ServiceAccount of `account` (a kubeconfig file), both ready and serving
/// the calm services, one upstream watch between them; and the holder's identity.
pub(super) async fn two_replicas_as(kube: &RealKube, account: &Path) -> ([Floodgate; 2], String) {
    let before = upstream_watches(kube, "endpointslices").await;
    // As the manifests run them: each says where its facade is, and follows the holder of a
    // link it does not hold.
    let mut first = replica(kube, account, "floodgate-0", |l| l.first_of_peers()).await;
    first
        .wait_ready(60)
        .await
        .expect("the first replica is ready");
    let mut second = replica(kube, account, "floodgate-1", |l| l.beside(&first)).await;
    second
        .wait_ready(60)
        .await
        .expect("the second replica is ready");
    let replicas = [first, second];
    until(60, "both replicas serve the calm services", async || {
        served_services(&replicas[0]).await == Ok(CALM)
            && served_services(&replicas[1]).await == Ok(CALM)
    })
    .await;
    let mut holder = None;
    until(30, "one replica holds east's Lease", async || {
        holder = lease_holder(kube).await;
        holder.is_some()
    })
    .await;
    // The remote (the same server here) keeps one upstream's watches: the other replica
    // follows the holder's facade.
    let mut watches = 0;
    until(
        30,
        "one upstream watch of EndpointSlices on the real server",
        async || {
            watches = upstream_watches(kube, "endpointslices").await;
            watches == before + 1
        },
    )
    .await;
    println!(
        "  the real server's open watches of EndpointSlices: {before} before, {watches} with two replicas"
    );
    (replicas, holder.expect("a holder"))
}

/// Open watches of `resource` on the real server, from its own gauge
/// (`apiserver_longrunning_requests`, every scope).
async fn upstream_watches(kube: &RealKube, resource: &str) -> u64 {
    let Ok(metrics) = kube.kubectl(&["get", "--raw", "/metrics"]).await else {
        return 0;
    };
    let want = format!("resource=\"{resource}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{"))
        .filter(|l| l.contains(&want) && l.contains("verb=\"WATCH\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Two replicas of `floodgate controller`, each as the `floodgate` ServiceAccount:
///
/// 1. a quarantine sent to the admin API of the replica without the Lease is decided by the
///    holder: its answer names the holder, both replicas and the Link's status are
///    `Quarantined`, and the Event names the sender;
/// 2. an operator bound only to the shipped `floodgate-operator` Role (a ServiceAccount of
///    their own, a RoleBinding, a TokenRequest token) releases with `kubectl annotate` alone,
///    and cannot read the Secrets; the holder carries the release out and answers on the Link;
/// 3. the holder SIGKILLed: the other replica takes the Lease and decides and writes status
///    (a quarantine through its admin API), every LIST through its facade answering meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn cluster_mode_two_replicas_commands_reach_the_holder_and_it_fails_over() {
    let kube = RealKube::start().await.expect("the real API server");
    let ([a, b], holder_id) = two_replicas(&kube).await;
    let (mut holder, other) = if holder_id == "floodgate-0" {
        (a, b)
    } else {
        (b, a)
    };
    let other_id = if holder_id == "floodgate-0" {
        "floodgate-1"
    } else {
        "floodgate-0"
    };
    println!("cluster mode, two replicas: {holder_id} holds east's Lease");

    quarantine_through_the_other(&kube, [&holder, &other], &holder_id, other_id).await;
    release_with_kubectl_alone(&kube, [&holder, &other], &holder_id).await;

    // Failover: every LIST through the survivor's facade answers while its peer is gone.
    let listing = Lister::start(&other).await;
    let killed = Instant::now();
    holder.kill().await.expect("SIGKILL the holder");
    until(40, "the survivor takes east's Lease", async || {
        lease_holder(&kube).await.as_deref() == Some(other_id)
    })
    .await;
    let took = killed.elapsed();
    until(
        10,
        "the survivor names itself holder in the Link's status",
        async || {
            link_east(&kube)
                .await
                .and_then(|l| l.status?.lease_holder)
                .as_deref()
                == Some(other_id)
        },
    )
    .await;
    let named = killed.elapsed();
    let (code, v) = admin::post(
        other.admin,
        "/links/east/quarantine",
        cluster::ADMIN_TOKEN,
        r#"{"message": "ticket 8: after the failover"}"#,
    )
    .await;
    assert_eq!(
        (code, v["decidedBy"].as_str()),
        (200, Some(other_id)),
        "{v}"
    );
    phase_everywhere(&kube, &[&other], "Quarantined").await;
    let wrote = killed.elapsed();
    let lists = listing.stop().await;
    println!(
        "  failover: {other_id} took the Lease {:.1} s after the SIGKILL, named itself holder in \
         status at {:.1} s, wrote a quarantine it decided at {:.1} s; {} LISTs through its facade \
         meanwhile, the slowest {} ms",
        took.as_secs_f64(),
        named.as_secs_f64(),
        wrote.as_secs_f64(),
        lists.count,
        lists.slowest_ms
    );
    assert_eq!(lists.failures, Vec::<String>::new(), "every LIST answered");
    assert!(lists.count > 0, "LISTs were made during the failover");
}

/// A quarantine through the admin API of the replica without the Lease.
async fn quarantine_through_the_other(
    kube: &RealKube,
    both: [&Floodgate; 2],
    holder_id: &str,
    other_id: &str,
) {
    let sent = Instant::now();
    let (code, v) = admin::post(
        both[1].admin,
        "/links/east/quarantine",
        cluster::ADMIN_TOKEN,
        r#"{"message": "ticket 7: the remote floods"}"#,
    )
    .await;
    println!(
        "  quarantine through {other_id}'s admin API: {code} in {} ms: {v}",
        sent.elapsed().as_millis()
    );
    assert_eq!(
        (code, v["decidedBy"].as_str()),
        (200, Some(holder_id)),
        "{v}"
    );
    phase_everywhere(kube, &both, "Quarantined").await;
    let status = link_east(kube).await.and_then(|l| l.status);
    let message = status.and_then(|s| s.quarantine).map(|q| q.message);
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("ticket 7: the remote floods")),
        "the status records the operator's reason: {message:?}"
    );
    let result = answered(kube)
        .await
        .expect("the holder's answer on the Link");
    assert_eq!(result.decided_by, holder_id, "{result:?}");
    let sender = format!("the admin API of replica {other_id}");
    assert!(
        result.from.as_deref().is_some_and(|f| f.contains(&sender)),
        "{result:?}"
    );
    let mut notes = Vec::new();
    until(
        10,
        "an Event names the sender and the decider",
        async || {
            notes = event_notes(kube, "CommandCarriedOut").await;
            notes.iter().any(|n| {
                n.starts_with("\"quarantine ticket 7")
                    && n.contains(&sender)
                    && n.contains(&format!("decided by {holder_id}"))
            })
        },
    )
    .await;
    println!("  Events: {notes:?}");
}

/// An operator with the `floodgate-operator` Role only releases with `kubectl annotate`.
async fn release_with_kubectl_alone(kube: &RealKube, both: [&Floodgate; 2], holder_id: &str) {
    kube.kubectl(&["create", "serviceaccount", "alice", "-n", cluster::NS])
        .await
        .expect("ServiceAccount alice");
    kube.kubectl(&[
        "create",
        "rolebinding",
        "alice-floodgate-operator",
        "-n",
        cluster::NS,
        "--role=floodgate-operator",
        &format!("--serviceaccount={}:alice", cluster::NS),
    ])
    .await
    .expect("alice bound to the shipped floodgate-operator Role");
    let alice = account_kubeconfig(kube, cluster::NS, "alice").await;
    let secrets = kubectl(&alice, &["get", "secrets", "-n", cluster::NS]).await;
    assert!(
        secrets
            .as_ref()
            .is_err_and(|e| e.to_string().contains("forbidden")),
        "the operator's Role reads no Secret: {secrets:?}"
    );
    let sent = Instant::now();
    kubectl(
        &alice,
        &[
            "-n",
            cluster::NS,
            "annotate",
            "link",
            "east",
            "floodgate.dev/command=release",
        ],
    )
    .await
    .expect("kubectl annotate as the operator");
    let mut result = None;
    until(
        30,
        "the holder answers the operator's release",
        async || {
            result = answered(kube).await.filter(|o| o.command == "release");
            result.is_some()
        },
    )
    .await;
    let result = result.expect("an answer");
    println!(
        "  release by kubectl annotate as alice: answered in {} ms: {result:?}",
        sent.elapsed().as_millis()
    );
    assert_eq!(
        (result.code, result.decided_by.as_str()),
        (200, holder_id),
        "{result:?}"
    );
    phase_everywhere(kube, &both, "Healthy").await;
}

/// LISTs of the Services through a replica's facade, one after the other, until stopped.
struct Lister {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Lists>,
}

/// What the LISTs got.
#[derive(Debug, Default)]
struct Lists {
    count: usize,
    slowest_ms: u128,
    /// Each LIST that failed or did not hold the calm services, with what it got.
    failures: Vec<String>,
}

impl Lister {
    async fn start(fg: &Floodgate) -> Self {
        let api: Api<Service> = Api::all(fg.consumer().await.expect("consumer client"));
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut lists = Lists::default();
            while !stopped.load(Ordering::Relaxed) {
                let started = Instant::now();
                let got =
                    tokio::time::timeout(Duration::from_secs(5), api.list(&Default::default()))
                        .await;
                lists.count += 1;
                lists.slowest_ms = lists.slowest_ms.max(started.elapsed().as_millis());
                match got {
                    Ok(Ok(l)) if l.items.len() == CALM => {}
                    Ok(Ok(l)) => lists.failures.push(format!("{} services", l.items.len())),
                    Ok(Err(e)) => lists.failures.push(e.to_string()),
                    Err(_) => lists.failures.push("no answer within 5 s".into()),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            lists
        });
        Self { stop, task }
    }

    async fn stop(self) -> Lists {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the lister")
    }
}
