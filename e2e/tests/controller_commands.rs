//! Operators' commands in cluster mode: sent to any replica's admin API, or set on the Link
//! with nothing but kubectl, they reach the link's Lease holder, which decides, records the
//! decision in status and an Event naming the sender, and clears the command with its result.

use floodgate::command::{self, COMMAND, COMMAND_RESULT, Order, SendArgs};
use floodgate_e2e::admin::{call, link, post};
use floodgate_e2e::cluster::*;
use floodgate_e2e::local::RunningLocal;
use floodgate_e2e::until;
use floodgate_link_crd::Link;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

/// The phase a replica's admin API shows for link `east`.
async fn phase_on(admin: std::net::SocketAddr) -> Option<String> {
    link(admin, "east").await?["phase"]
        .as_str()
        .map(str::to_owned)
}

async fn east(local: &RunningLocal) -> Link {
    let links: Api<Link> = Api::namespaced(local.client(NS).expect("client"), NS);
    links.get("east").await.expect("Link east")
}

fn annotation(link: &Link, key: &str) -> Option<String> {
    link.metadata.annotations.as_ref()?.get(key).cloned()
}

/// The Events on the Link with this reason, by note.
fn events(local: &RunningLocal, reason: &str) -> Vec<String> {
    local
        .store
        .objects("events")
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .map(|e| {
            e["note"]
                .as_str()
                .or(e["message"].as_str())
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

/// A local cluster with Link `east` to a remote of one service, and replica-a holding its
/// Lease and serving it.
async fn holder_serving_east() -> (
    RunningLocal,
    (floodgate_e2e::RunningSim, floodgate_e2e::drivers::Cluster),
    Replica,
) {
    let local = RunningLocal::start().await.expect("local cluster");
    let remote = remote(&["web"]).await;
    add_link(&local, "east", &remote.0, mk_link("east")).await;
    let a = Replica::start(&local, "replica-a").await;
    until(30, "a holds east's Lease and serves it", async || {
        lease_holder(&local, "east").as_deref() == Some("replica-a")
            && phase_on(a.admin).await.as_deref() == Some("Healthy")
    })
    .await;
    (local, remote, a)
}

/// A release or quarantine sent to the replica that does not hold the Lease is decided by
/// the holder: both replicas follow, status records it, an Event names where it came from,
/// and the sender gets the holder's answer (409 when the holder refuses). A wrong token
/// changes nothing.
#[tokio::test]
async fn a_command_sent_to_the_replica_without_the_lease_is_decided_by_the_holder() {
    let (local, _sim, a) = holder_serving_east().await;
    let b = Replica::start(&local, "replica-b").await;
    until(30, "b serves east", async || {
        phase_on(b.admin).await.as_deref() == Some("Healthy")
    })
    .await;

    let post = async |path: &str, body: &str| post(b.admin, path, ADMIN_TOKEN, body).await;
    let (code, _) = call(b.admin, "POST", "/links/east/quarantine", Some("wrong"), "")
        .await
        .expect("admin");
    assert_eq!(code, 401);
    assert_eq!(
        annotation(&east(&local).await, COMMAND),
        None,
        "nothing written"
    );

    let body = r#"{"message": "ticket 7: the remote floods"}"#;
    let (code, v) = post("/links/east/quarantine", body).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["decidedBy"], "replica-a", "{v}");
    until(30, "both replicas quarantine east", async || {
        phase_on(a.admin).await.as_deref() == Some("Quarantined")
            && phase_on(b.admin).await.as_deref() == Some("Quarantined")
    })
    .await;
    until(10, "status records the quarantine", async || {
        status(&local, "east").await.is_some_and(|s| {
            s.quarantine
                .is_some_and(|q| q.message.contains("ticket 7: the remote floods"))
        })
    })
    .await;

    let (code, v) = post("/links/east/release", "").await;
    assert_eq!(code, 200, "{v}");
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("the admin API of replica replica-b")),
        "{v}"
    );
    until(30, "both replicas release east", async || {
        phase_on(a.admin).await.as_deref() == Some("Healthy")
            && phase_on(b.admin).await.as_deref() == Some("Healthy")
    })
    .await;
    until(10, "Events name where the commands came from", async || {
        let done = events(&local, "CommandCarriedOut");
        done.iter()
            .any(|n| n.starts_with("\"release\" from the admin API of replica replica-b"))
            && done.iter().any(|n| n.starts_with("\"quarantine ticket 7"))
    })
    .await;

    // The holder refuses what makes no sense, and the sender hears why.
    let (code, v) = post("/links/east/release", "").await;
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["decidedBy"], "replica-a", "{v}");
    let (code, v) = post("/links/east/services/prod/nope/release", "").await;
    assert_eq!(code, 404, "{v}");
    let link = east(&local).await;
    assert_eq!(annotation(&link, COMMAND), None, "every command cleared");
    let result: Value =
        serde_json::from_str(&annotation(&link, COMMAND_RESULT).expect("a result")).expect("JSON");
    assert_eq!(result["code"], 404, "{result}");
    b.stop().await;
    a.stop().await;
}

/// The kubectl path: a command set as an annotation (what `kubectl annotate` sends) is
/// carried out by the holder and cleared with its result; `floodgate release` waits for that
/// result; a command the holder cannot read is cleared with a Warning Event and changes
/// nothing.
#[tokio::test]
async fn a_command_annotation_is_carried_out_and_cleared() {
    let (local, _sim, a) = holder_serving_east().await;
    let client = local.client(NS).expect("client");
    let links: Api<Link> = Api::namespaced(client.clone(), NS);
    let annotate = async |value: &str| {
        let patch = json!({"metadata": {"annotations": {COMMAND: value}}});
        links
            .patch("east", &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect("annotate");
    };
    let result = async || {
        let link = east(&local).await;
        if annotation(&link, COMMAND).is_some() {
            return None;
        }
        command::result_of(&link)
    };

    annotate("quarantine ticket 9").await;
    until(
        30,
        "the holder quarantines east and clears the command",
        async || {
            result().await.is_some_and(|o| o.code == 200)
                && phase_on(a.admin).await.as_deref() == Some("Quarantined")
        },
    )
    .await;

    let args = SendArgs {
        namespace: NS.into(),
        wait: 20,
    };
    let said = command::send_from_cli(client.clone(), "east", &Order::Release, &args)
        .await
        .expect("released");
    assert!(
        said.contains("released by an operator through the floodgate CLI"),
        "{said}"
    );
    assert!(said.contains("decided by replica-a"), "{said}");
    assert_eq!(phase_on(a.admin).await.as_deref(), Some("Healthy"));
    let refused = command::send_from_cli(client.clone(), "east", &Order::Release, &args)
        .await
        .expect_err("not quarantined");
    assert!(refused.to_string().contains("(409)"), "{refused}");

    annotate("relase").await;
    until(
        30,
        "an unreadable command is cleared with its reason",
        async || {
            result()
                .await
                .is_some_and(|o| o.code == 400 && o.message.contains("unknown command"))
        },
    )
    .await;
    until(10, "a Warning Event says why", async || {
        events(&local, "CommandUnreadable")
            .iter()
            .any(|n| n.starts_with("\"relase\"") && n.contains("unknown command"))
    })
    .await;
    assert_eq!(
        phase_on(a.admin).await.as_deref(),
        Some("Healthy"),
        "nothing else changed"
    );
    a.stop().await;
}

/// Three commands of the same kind from three senders (the admin APIs of the holder and of
/// the two replicas that do not hold the Lease), all refused (the link is not quarantined):
/// three Events, each naming its own sender. kube's Recorder folded them into one series that
/// kept the first sender's note, and a command sent to the holder's own admin API got none.
#[tokio::test]
async fn each_command_gets_an_event_naming_its_own_sender() {
    let (local, _sim, a) = holder_serving_east().await;
    let b = Replica::start(&local, "replica-b").await;
    let c = Replica::start(&local, "replica-c").await;
    until(30, "b and c serve east", async || {
        phase_on(b.admin).await.as_deref() == Some("Healthy")
            && phase_on(c.admin).await.as_deref() == Some("Healthy")
    })
    .await;
    for replica in [&a, &b, &c] {
        let (code, v) = post(replica.admin, "/links/east/release", ADMIN_TOKEN, "").await;
        assert_eq!(code, 409, "{v}");
        assert_eq!(v["decidedBy"], "replica-a", "{v}");
    }
    until(10, "three Events, one per sender", async || {
        let refused = events(&local, "CommandRefused");
        let from = |r: &str| {
            let prefix = format!("\"release\" from the admin API of replica {r}");
            refused.iter().filter(|n| n.starts_with(&prefix)).count() == 1
        };
        refused.len() == 3 && from("replica-a") && from("replica-b") && from("replica-c")
    })
    .await;
    c.stop().await;
    b.stop().await;
    a.stop().await;
}

/// Least privilege, judged from the controller's side: two replicas, authenticated to the
/// local cluster as the manifests' ServiceAccount, serve a link, carry out a command sent to
/// the non-holder, and hand the Lease over on a drain. Every request they made is one the
/// shipped Roles grant, and the only Secrets they read, or could read, are the links'
/// (the credentials namespace), while a Secret of Floodgate's own sits beside the Links.
#[tokio::test]
async fn every_request_of_the_controller_is_granted_by_the_shipped_roles() {
    let (local, _sim, a) = holder_serving_east().await;
    let own: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(local.client(NS).expect("client"), NS);
    own.create(
        &Default::default(),
        &mk_secret("floodgate-admin-token", "token", ADMIN_TOKEN),
    )
    .await
    .expect("a Secret of Floodgate's own");
    let b = Replica::start(&local, "replica-b").await;
    until(30, "b serves east", async || {
        phase_on(b.admin).await.as_deref() == Some("Healthy")
    })
    .await;
    let (code, v) = post(b.admin, "/links/east/quarantine", ADMIN_TOKEN, "").await;
    assert_eq!(code, 200, "{v}");
    until(10, "status records the quarantine", async || {
        status(&local, "east")
            .await
            .is_some_and(|s| s.quarantine.is_some())
    })
    .await;
    // The holder drains: it gives its Lease back, and b takes it.
    a.stop().await;
    until(30, "b takes east's Lease", async || {
        lease_holder(&local, "east").as_deref() == Some("replica-b")
    })
    .await;
    b.stop().await;

    let grants = floodgate_e2e::rbac::Grants::of_service_account("floodgate", "floodgate")
        .expect("the manifests' grants");
    let asked = local.store.accesses_of(SERVICE_ACCOUNT);
    let refused: Vec<_> = asked.iter().filter(|a| !grants.allow(a)).collect();
    assert!(
        refused.is_empty(),
        "requests the shipped Roles refuse: {refused:#?}"
    );
    // What the controller must have asked for the above to happen: the check is not one of
    // an empty list.
    let did = |verb: &str, resource: &str, ns: &str| {
        asked
            .iter()
            .any(|a| a.verb == verb && a.resource == resource && a.namespace == ns)
    };
    for (verb, resource, ns) in [
        ("list", "secrets", CREDENTIALS_NS),
        ("watch", "secrets", CREDENTIALS_NS),
        ("watch", "links", NS),
        ("patch", "links", NS),
        ("patch", "links/status", NS),
        ("update", "leases", NS),
        ("create", "events", NS),
    ] {
        assert!(
            did(verb, resource, ns),
            "{verb} {resource} in {ns}: {asked:#?}"
        );
    }
    let secrets: Vec<_> = asked.iter().filter(|a| a.resource == "secrets").collect();
    assert!(
        secrets.iter().all(|a| a.namespace == CREDENTIALS_NS),
        "Secrets read outside the credentials namespace: {secrets:#?}"
    );
    assert_eq!(
        grants.namespaces_granting("", "secrets"),
        [CREDENTIALS_NS],
        "the Roles let the gateway read Secrets only where the links' are"
    );
}

/// The alerts and the dashboard of `manifests/monitoring/` find every metric they use on a
/// controller replica too, with the mode in `floodgate_build_info`.
#[tokio::test]
async fn a_replica_serves_every_metric_the_alerts_and_dashboard_use() {
    let (_local, _sim, a) = holder_serving_east().await;
    let (code, text) = floodgate_e2e::admin::call_text(a.admin, "GET", "/metrics", None, "")
        .await
        .expect("metrics");
    assert_eq!(code, 200);
    let unserved = floodgate_e2e::admin::unserved_monitoring_metrics(&text);
    assert!(unserved.is_empty(), "not served: {unserved:?}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("floodgate_build_info{") && l.contains("mode=\"controller\"")),
        "{text}"
    );
    a.stop().await;
}
