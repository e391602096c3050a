//! `floodgate controller` in-process against kube-sim's local cluster (Links, Secrets, Leases,
//! Events), with kube-sim remotes behind the Links: Links created, updated and deleted; an
//! invalid Link beside a good one; status and Events on transitions; two replicas sharing a
//! Lease; losing the Lease stops the writer; new credentials keep the view.

use std::collections::BTreeSet;
use std::time::Duration;

use floodgate::controller::lease;
use floodgate::controller::writer;
use floodgate_e2e::cluster::*;
use floodgate_e2e::local::RunningLocal;
use floodgate_e2e::replicas::{WatchSampler, describe, next_change};
use floodgate_e2e::until;
use floodgate_link_crd::{Link, LinkStatus, Phase};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use tokio::sync::watch;

/// A good Link and an invalid one: the good one serves its remote's exported services through
/// the facade and reports Ready with observedGeneration; the invalid one gets SpecValid=False
/// with the reason and no run, and the good one is untouched. A spec change bumps the
/// generation and the status follows it; a phase transition is recorded as an Event; deleting
/// the Link stops it and its facade route goes away.
#[tokio::test]
async fn links_are_created_updated_and_deleted() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, _cluster) = remote(&["web", "api"]).await;
    add_link(&local, "east", &sim, mk_link("east")).await;
    let mut bad = mk_link("bad");
    bad.spec.coalesce.quiet = "5s".parse().expect("duration");
    add_link(&local, "bad", &sim, bad).await;
    let replica = Replica::start(&local, "replica-a").await;

    until(30, "east is Ready at generation 1", async || {
        ready_at(&local, "east", 1).await
    })
    .await;
    let consumer = replica.consumer("east", &token("east")).await;
    let want: BTreeSet<String> = ["api", "web"].map(String::from).into();
    until(10, "east's services through the facade", async || {
        service_names(&consumer).await.as_ref() == Some(&want)
    })
    .await;
    until(10, "bad says why it does not run", async || {
        status(&local, "bad").await.is_some_and(|s| {
            condition(&s, "SpecValid").is_some_and(|c| {
                c.status == "False"
                    && c.reason == "InvalidSpec"
                    && c.message.contains("spec.coalesce.quiet")
                    && c.observed_generation == Some(1)
            }) && condition(&s, "Ready").is_some_and(|c| c.status == "False")
        })
    })
    .await;
    let bad_consumer = replica.consumer("bad", &token("bad")).await;
    assert_eq!(
        service_names(&bad_consumer).await,
        None,
        "an invalid Link serves nothing"
    );
    // The transition to Healthy was recorded by the holder.
    until(10, "an Event for east's phase change", async || {
        local.store.objects("events").iter().any(|e| {
            e["regarding"]["name"] == "east"
                && e["reason"] == "Healthy"
                && e["reportingInstance"] == "replica-a"
        })
    })
    .await;

    // A spec change: the generation moves and the status follows it.
    let links: Api<Link> = Api::namespaced(local.client(NS).expect("client"), NS);
    let edited = links
        .patch(
            "east",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"caps": {"maxEndpointsPerService": 1}}})),
        )
        .await
        .expect("edit");
    assert_eq!(edited.metadata.generation, Some(2));
    until(30, "east is Ready at generation 2", async || {
        ready_at(&local, "east", 2).await
    })
    .await;
    let consumer = replica.consumer("east", &token("east")).await;
    until(10, "east serves again after the restart", async || {
        service_names(&consumer).await.as_ref() == Some(&want)
    })
    .await;
    assert!(
        status(&local, "bad")
            .await
            .is_some_and(|s| s.observed_generation == Some(1)),
        "bad's status is untouched"
    );

    links
        .delete("east", &DeleteParams::default())
        .await
        .expect("delete");
    until(10, "east's facade route is gone", async || {
        let api: Api<Service> = Api::all(consumer.clone());
        matches!(api.list(&ListParams::default()).await, Err(kube::Error::Api(e)) if e.code == 404)
    })
    .await;
    assert!(!replica.task.is_finished(), "the controller runs on");
    replica.stop().await;
}

/// Two replicas: exactly one holds the link's Lease and writes its status; when it stops, the
/// other takes the Lease over once it expires and writes from then on (a spec change's
/// generation reaches the status).
#[tokio::test]
async fn a_second_replica_takes_over_when_the_holder_stops() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, _cluster) = remote(&["web"]).await;
    add_link(&local, "east", &sim, mk_link("east")).await;
    let a = Replica::start(&local, "replica-a").await;
    until(30, "a holds east and it is Ready", async || {
        lease_holder(&local, "east").as_deref() == Some("replica-a")
            && ready_at(&local, "east", 1).await
    })
    .await;
    let b = Replica::start(&local, "replica-b").await;
    // Both serve the view, whoever holds the Lease.
    let via_b = b.consumer("east", &token("east")).await;
    until(30, "b serves east too", async || {
        service_names(&via_b)
            .await
            .is_some_and(|s| s.contains("web"))
    })
    .await;
    assert_eq!(
        lease_holder(&local, "east").as_deref(),
        Some("replica-a"),
        "b never takes a live Lease"
    );

    a.stop().await;
    until(20, "b takes the Lease over", async || {
        lease_holder(&local, "east").as_deref() == Some("replica-b")
    })
    .await;
    let links: Api<Link> = Api::namespaced(local.client(NS).expect("client"), NS);
    links
        .patch(
            "east",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"caps": {"maxServices": 10}}})),
        )
        .await
        .expect("edit");
    until(30, "b writes east's status at generation 2", async || {
        ready_at(&local, "east", 2).await
    })
    .await;
    b.stop().await;
}

/// The writer writes only while the lease loop holds the Lease: another holder taking the
/// Lease empties the held set at the next renewal, and from then on nothing is written for
/// that link (checked with a second, still held link whose write comes after). The holder
/// records the base of its view's versions on the Leases whose base it knows.
#[tokio::test]
async fn losing_the_lease_stops_writing() {
    let local = RunningLocal::start().await.expect("local cluster");
    let client = local.client(NS).expect("client");
    let links: Api<Link> = Api::namespaced(client.clone(), NS);
    for name in ["east", "west"] {
        links
            .create(&PostParams::default(), &mk_link(name))
            .await
            .expect("link");
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let (_wanted_tx, wanted) = watch::channel(BTreeSet::from(["east".into(), "west".into()]));
    let (held_tx, held) = watch::channel(BTreeSet::new());
    let (_stop, shutdown) = watch::channel(false);
    tokio::spawn(lease::run(
        leases.clone(),
        lease::Claimant {
            identity: "replica-a".into(),
            facade: None,
        },
        fast().lease,
        lease::Links {
            links: wanted,
            reading: watch::channel(BTreeSet::new()).1,
            synced: watch::channel(BTreeSet::from(["east".into(), "west".into()])).1,
            view_bases: watch::channel([("east".to_owned(), 7 << 40)].into()).1,
        },
        held_tx,
        kube::runtime::reflector::store().1,
        shutdown,
    ));
    until(10, "a holds both", async || held.borrow().len() == 2).await;
    let recorded = |lease: &Lease| {
        let annotations = lease.metadata.annotations.clone().unwrap_or_default();
        annotations.get(lease::VIEW_BASE_ANNOTATION).cloned()
    };
    let east = leases.get(&lease::lease_name("east")).await.expect("lease");
    assert_eq!(
        recorded(&east),
        Some((7u64 << 40).to_string()),
        "the holder records its view's base"
    );
    let west = leases.get(&lease::lease_name("west")).await.expect("lease");
    assert_eq!(recorded(&west), None, "no base known, none recorded");

    // Someone else holds east now (as after a partition: a's claim looked expired to them).
    let mut stolen = leases.get(&lease::lease_name("east")).await.expect("lease");
    let spec = stolen.spec.as_mut().expect("spec");
    spec.holder_identity = Some("replica-z".into());
    spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
    spec.lease_duration_seconds = Some(3600);
    leases
        .replace(&lease::lease_name("east"), &PostParams::default(), &stolen)
        .await
        .expect("steal");
    until(10, "a lets east go", async || {
        !held.borrow().contains("east")
    })
    .await;

    let (tx, rx) = tokio::sync::mpsc::channel(writer::STATUS_QUEUE);
    tokio::spawn(writer::run(
        rx,
        writer::KubeStatusApi(links.clone()),
        held.clone(),
        Duration::from_millis(100),
    ));
    let quarantined = LinkStatus {
        phase: Some(Phase::Quarantined),
        ..LinkStatus::default()
    };
    for link in ["east", "west"] {
        tx.send(writer::StatusUpdate {
            link: link.into(),
            observed: None,
            status: quarantined.clone(),
        })
        .await
        .expect("send");
    }
    until(10, "west's status is written", async || {
        status(&local, "west").await.and_then(|s| s.phase) == Some(Phase::Quarantined)
    })
    .await;
    assert_eq!(
        status(&local, "east").await,
        None,
        "nothing is written for a link whose Lease is lost"
    );
}

/// New credentials in a Link's Secret (here: another remote's kubeconfig) swap the upstream,
/// not the view: a consumer's watch opened before the rotation stays open and receives the
/// differences (the second remote has `db` instead of `api`), with versions that go on rising.
#[tokio::test]
async fn new_credentials_swap_the_upstream_and_keep_the_view() {
    use futures_util::StreamExt as _;
    use kube::api::{WatchEvent, WatchParams};

    let local = RunningLocal::start().await.expect("local cluster");
    let (first, _c1) = remote(&["web", "api"]).await;
    let (second, _c2) = remote(&["web", "db"]).await;
    add_link(&local, "east", &first, mk_link("east")).await;
    let replica = Replica::start(&local, "replica-a").await;
    let consumer = replica.consumer("east", &token("east")).await;
    let services: Api<Service> = Api::all(consumer.clone());
    until(30, "east serves the first remote", async || {
        service_names(&consumer).await == Some(["api", "web"].map(String::from).into())
    })
    .await;
    let listed = services.list(&ListParams::default()).await.expect("list");
    let rv = listed.metadata.resource_version.expect("version");
    let mut watch = services
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();

    let secrets: Api<Secret> = Api::namespaced(
        local.client(CREDENTIALS_NS).expect("client"),
        CREDENTIALS_NS,
    );
    let mut creds = secrets.get("east-credentials").await.expect("credentials");
    creds.data = mk_secret("x", "kubeconfig", &second.kubeconfig()).data;
    secrets
        .replace("east-credentials", &PostParams::default(), &creds)
        .await
        .expect("rotate");

    let (mut added, mut deleted) = (false, false);
    let mut last_rv: u64 = rv.parse().expect("numeric version");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !(added && deleted) {
        let ev = tokio::time::timeout_at(deadline, watch.next())
            .await
            .expect("the differences within 30 s")
            .expect("the watch stays open across the swap")
            .expect("a frame");
        let (svc, is_add) = match ev {
            WatchEvent::Added(s) => (s, true),
            WatchEvent::Deleted(s) => (s, false),
            WatchEvent::Modified(s) => (s, false),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("the watch failed: {e:?}"),
        };
        let v: u64 = svc
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .expect("a version");
        assert!(v > last_rv, "versions go on rising: {v} after {last_rv}");
        last_rv = v;
        match (svc.metadata.name.as_deref(), is_add) {
            (Some("db"), true) => added = true,
            (Some("api"), false) => deleted = true,
            (name, _) => assert_eq!(name, Some("web"), "only real differences are published"),
        }
    }
    assert_eq!(
        service_names(&consumer).await,
        Some(["db", "web"].map(String::from).into())
    );
    replica.stop().await;
}

/// The controller reads Secrets from its watch, never by name: a Link whose token Secret does
/// not exist yet is blocked (TokenNotFound), and creating the Secret starts it, with no GET of
/// either Secret at any point (the loop before kube-runtime's Controller fetched every Secret
/// every 30 s).
#[tokio::test]
async fn a_secret_that_appears_starts_its_link_from_the_watch() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, _cluster) = remote(&["web"]).await;
    add_credentials(&local, "east", &sim.kubeconfig()).await;
    let links: Api<Link> = Api::namespaced(local.client(NS).expect("client"), NS);
    links
        .create(&PostParams::default(), &mk_link("east"))
        .await
        .expect("link");
    let replica = Replica::start(&local, "replica-a").await;
    until(30, "east is blocked on its token", async || {
        status(&local, "east")
            .await
            .is_some_and(|s| condition(&s, "Ready").is_some_and(|c| c.reason == "TokenNotFound"))
    })
    .await;
    add_token(&local, "east").await;
    let consumer = replica.consumer("east", &token("east")).await;
    until(30, "east starts and serves its remote", async || {
        service_names(&consumer).await == Some(["web"].map(String::from).into())
    })
    .await;
    until(30, "east is ready", async || {
        ready_at(&local, "east", 1).await
    })
    .await;
    // The count is real: status() above read the Link by name.
    let link = format!("/apis/floodgate.dev/v1alpha1/namespaces/{NS}/links/east");
    assert!(local.store.requests_to("GET", &link) > 0, "GET {link}");
    for name in ["east-credentials", "floodgate-token-east"] {
        let path = format!("/api/v1/namespaces/{CREDENTIALS_NS}/secrets/{name}");
        assert_eq!(local.store.requests_to("GET", &path), 0, "GET {path}");
    }
    replica.stop().await;
}

/// A rolling restart with the production Lease timings (15 s, renewed every 5 s): the holder,
/// told to stop (SIGTERM), gives its Lease back, and the other replica, watching the Leases,
/// takes the link over in under 2 s instead of the Lease's 15 s.
#[tokio::test]
async fn a_draining_holder_hands_its_links_over_at_once() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, _cluster) = remote(&["web"]).await;
    add_link(&local, "east", &sim, mk_link("east")).await;
    let a = Replica::start_slow(&local, "replica-a").await;
    until(30, "a holds east's Lease", async || {
        lease_holder(&local, "east").as_deref() == Some("replica-a")
    })
    .await;
    let b = Replica::start_slow(&local, "replica-b").await;
    let on_b = b.consumer("east", &token("east")).await;
    // A rolling update stops the old pod once the new one is ready.
    until(30, "b serves east and is ready", async || {
        service_names(&on_b).await == Some(["web"].map(String::from).into())
            && floodgate_e2e::admin::call_text(b.admin, "GET", "/readyz", None, "")
                .await
                .is_ok_and(|(code, _)| code == 200)
    })
    .await;
    assert_eq!(lease_holder(&local, "east").as_deref(), Some("replica-a"));
    // Who decides, as operators see it: either replica's admin API and the Link's status.
    let shown = async |replica: &Replica| {
        floodgate_e2e::admin::link(replica.admin, "east")
            .await
            .and_then(|l| l["leaseHolder"].as_str().map(str::to_owned))
    };
    until(
        10,
        "both replicas and the status name a as the holder",
        async || {
            shown(&a).await.as_deref() == Some("replica-a")
                && shown(&b).await.as_deref() == Some("replica-a")
                && status(&local, "east")
                    .await
                    .is_some_and(|s| s.lease_holder.as_deref() == Some("replica-a"))
        },
    )
    .await;

    let stopped = tokio::time::Instant::now();
    let stopping = tokio::spawn(a.stop());
    until(15, "b holds east's Lease", async || {
        lease_holder(&local, "east").as_deref() == Some("replica-b")
    })
    .await;
    let handover = stopped.elapsed();
    eprintln!("the link was handed over {handover:?} after the holder was told to stop");
    assert!(
        handover < Duration::from_secs(2),
        "handover took {handover:?}"
    );
    stopping.await.expect("a stopped");
    until(10, "b's admin API and the status name b", async || {
        shown(&b).await.as_deref() == Some("replica-b")
            && status(&local, "east")
                .await
                .is_some_and(|s| s.lease_holder.as_deref() == Some("replica-b"))
    })
    .await;
    b.stop().await;
}

/// One upstream watch per resource per link however many replicas run: a second replica
/// follows the Lease holder's facade, not the remote, so the remote's open watches do not grow
/// and a change on the remote reaches the second replica's consumers through the holder. When
/// the holder drains, the follower takes the Lease and watches the remote itself, and a change
/// made after the handover reaches its consumers.
#[tokio::test]
async fn a_replica_without_the_lease_follows_the_holder_not_the_remote() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, mut cluster) = remote(&["web"]).await;
    add_link(&local, "east", &sim, mk_link("east")).await;
    let a = Replica::start(&local, "replica-a").await;
    let on_a = a.consumer("east", &token("east")).await;
    until(30, "a holds east and serves it", async || {
        lease_holder(&local, "east").as_deref() == Some("replica-a")
            && service_names(&on_a).await == Some(["web"].map(String::from).into())
    })
    .await;
    let alone = sim.api.open_watches();
    assert!(alone > 0, "a watches the remote");

    let b = Replica::start_beside(&local, "replica-b", &a).await;
    let on_b = b.consumer("east", &token("east")).await;
    until(30, "b serves east", async || {
        service_names(&on_b).await == Some(["web"].map(String::from).into())
    })
    .await;
    // b serves a's view version for version: a consumer that listed through a watches through
    // b from a's version, with no relist, and gets the remote's next change.
    let services = |c: &kube::Client| Api::<Service>::all(c.clone());
    let listed = services(&on_a)
        .list(&ListParams::default())
        .await
        .expect("a list through a");
    let namespace = listed.items[0]
        .metadata
        .namespace
        .clone()
        .expect("a namespace");
    let web_on_b = Api::<Service>::namespaced(on_b.clone(), &namespace)
        .get("web")
        .await
        .expect("web through b");
    assert_eq!(
        web_on_b.metadata.resource_version, listed.items[0].metadata.resource_version,
        "web has a's version through b"
    );
    let from = listed.metadata.resource_version.expect("a list version");
    let mut watch = Box::pin(
        services(&on_b)
            .watch(&kube::api::WatchParams::default(), &from)
            .await
            .expect("b takes a watch from a's version"),
    );
    assert_eq!(
        sim.api.open_watches(),
        alone,
        "the remote's watches once a second replica serves the link"
    );
    cluster.add_service("api", true);
    cluster.scale("api", 2, true);
    let first = next_change(&mut watch, 30).await;
    assert_eq!(
        first.as_ref().map(describe).as_deref(),
        Some("ADDED api"),
        "api's addition through b"
    );
    until(
        30,
        "a change on the remote reaches b's consumers",
        async || service_names(&on_b).await == Some(["api", "web"].map(String::from).into()),
    )
    .await;
    assert_eq!(sim.api.open_watches(), alone);
    // b's admin API says what it followed (its state is refreshed on a tick) and that it runs
    // no watcher of the remote.
    let mut counters = serde_json::Value::Null;
    until(10, "b counts api's addition as followed", async || {
        let link = floodgate_e2e::admin::link(b.admin, "east").await;
        counters = link.map(|l| l["counters"].clone()).unwrap_or_default();
        counters["followedChanges"].as_u64() >= Some(1)
    })
    .await;
    assert_eq!(counters["upstreamWatchers"], 0, "{counters}");
    assert_eq!(counters["followedSnapshots"], 1, "{counters}");

    // The holder drains: b takes the Lease and reads the remote itself.
    a.stop().await;
    until(15, "b holds east", async || {
        lease_holder(&local, "east").as_deref() == Some("replica-b")
    })
    .await;
    until(15, "b watches the remote (a is gone)", async || {
        sim.api.open_watches() == alone
    })
    .await;
    cluster.add_service("billing", true);
    cluster.scale("billing", 2, true);
    // The consumer that watches through b from a's version saw the handover as nothing: b went
    // on from the view it followed, and its next event is the remote's next change.
    let next = next_change(&mut watch, 30).await;
    assert_eq!(
        next.as_ref().map(describe).as_deref(),
        Some("ADDED billing"),
        "the remote's change and nothing before it, through b after the handover"
    );
    until(
        30,
        "a change after the handover reaches b's consumers",
        async || {
            service_names(&on_b).await == Some(["api", "billing", "web"].map(String::from).into())
        },
    )
    .await;
    b.stop().await;
}

/// A follower partitioned from its Lease holder (the holder alive, its Lease held) says so:
/// `Degraded` on its admin API with why and where it reads from, its metrics say it follows and
/// cannot reach what it follows, its consumers keep the last view, and it does not turn to the
/// remote (only the Lease decides that). Healed, it is Healthy again.
#[tokio::test]
async fn a_follower_cut_off_from_its_holder_says_so_and_keeps_serving() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, _cluster) = remote(&["web"]).await;
    add_link(&local, "east", &sim, mk_link("east")).await;
    let a = Replica::start_behind_relay(&local, "replica-a").await;
    until(30, "a holds east", async || {
        lease_holder(&local, "east").as_deref() == Some("replica-a")
    })
    .await;
    let b = Replica::start_beside(&local, "replica-b", &a).await;
    let on_b = b.consumer("east", &token("east")).await;
    let follower = async || {
        floodgate_e2e::admin::link(b.admin, "east")
            .await
            .unwrap_or_default()
    };
    until(30, "b serves east from a's facade", async || {
        let l = follower().await;
        l["phase"] == "Healthy"
            && l["readsFrom"]
                .as_str()
                .is_some_and(|r| r.contains("replica-a"))
            && service_names(&on_b).await == Some(["web"].map(String::from).into())
    })
    .await;
    let watches = sim.api.open_watches();
    let metric = async |name: &str| {
        let (_, text) = floodgate_e2e::admin::call_text(b.admin, "GET", "/metrics", None, "")
            .await
            .expect("metrics");
        let line = format!("{name}{{link=\"east\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&line).map(str::to_owned))
            .unwrap_or_default()
    };
    assert_eq!(metric("floodgate_link_follows_holder").await, "1");
    assert_eq!(metric("floodgate_link_lease_held").await, "0");

    a.relay.as_ref().expect("a relay").cut();
    until(30, "b says it cannot reach its holder", async || {
        let l = follower().await;
        l["phase"] == "Degraded"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.contains("unreachable since"))
    })
    .await;
    assert_eq!(metric("floodgate_upstream_reachable").await, "0");
    assert_eq!(
        service_names(&on_b).await,
        Some(["web"].map(String::from).into()),
        "b's consumers keep the last view"
    );
    assert_eq!(lease_holder(&local, "east").as_deref(), Some("replica-a"));
    let l = follower().await;
    assert!(
        l["readsFrom"]
            .as_str()
            .is_some_and(|r| r.contains("replica-a")),
        "{l}"
    );
    assert_eq!(
        sim.api.open_watches(),
        watches,
        "b does not turn to the remote"
    );

    a.relay.as_ref().expect("a relay").mend();
    until(30, "b is Healthy again", async || {
        follower().await["phase"] == "Healthy"
    })
    .await;
    assert_eq!(metric("floodgate_upstream_reachable").await, "1");
    b.stop().await;
    a.stop().await;
}

/// The links spread over the replicas: two replicas and two links, each replica holds one
/// Lease (the first held both until the second joined and gave one back), and each link's
/// remote keeps the watches of one replica: the other follows the holder.
#[tokio::test]
async fn two_replicas_share_two_links_and_each_remote_is_watched_once() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, _cluster) = remote(&["web"]).await;
    add_link(&local, "east", &sim, mk_link("east")).await;
    add_link(&local, "west", &sim, mk_link("west")).await;
    let a = Replica::start_first(&local, "replica-a").await;
    until(30, "a holds both links", async || {
        lease_holder(&local, "east").as_deref() == Some("replica-a")
            && lease_holder(&local, "west").as_deref() == Some("replica-a")
    })
    .await;
    let on_a = a.consumer("west", &token("west")).await;
    until(30, "a serves west", async || {
        service_names(&on_a).await == Some(["web"].map(String::from).into())
    })
    .await;
    let one_replica = sim.api.open_watches();

    let b = Replica::start_beside(&local, "replica-b", &a).await;
    until(30, "each replica holds one link", async || {
        let (east, west) = (lease_holder(&local, "east"), lease_holder(&local, "west"));
        east.is_some() && west.is_some() && east != west
    })
    .await;
    eprintln!(
        "east held by {:?}, west by {:?}",
        lease_holder(&local, "east"),
        lease_holder(&local, "west")
    );
    let on_b = b.consumer("east", &token("east")).await;
    until(
        30,
        "both serve both links, the remote watched once per link",
        async || {
            service_names(&on_b).await == Some(["web"].map(String::from).into())
                && service_names(&on_a).await == Some(["web"].map(String::from).into())
                && sim.api.open_watches() == one_replica
        },
    )
    .await;
    b.stop().await;
    a.stop().await;
}

/// A replica that joins while it cannot reach the holder's facade (its view holds nothing of
/// the holder's) does not take the link the holder hands it at once: taken over from that
/// view, the link's versions would begin below the holder's, and the holder's consumers,
/// following it, would have to relist. It takes the link once the Lease given back has stayed
/// free half a Lease duration longer than it lasts (1 s), before the holder (at its share)
/// would take it back, and serves it from the remote. Its versions go on above the holder's
/// (the base the holder recorded on the Lease), so a consumer that watched the link through
/// the old holder from before keeps its watch and sees the next remote change.
#[tokio::test]
async fn a_replica_that_cannot_sync_the_holders_view_takes_a_handed_link_only_later() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, mut cluster) = remote(&["web"]).await;
    add_link(&local, "east", &sim, mk_link("east")).await;
    add_link(&local, "west", &sim, mk_link("west")).await;
    let a = Replica::start_behind_relay(&local, "replica-a").await;
    let holders = || [lease_holder(&local, "east"), lease_holder(&local, "west")];
    until(30, "a holds both links", async || {
        holders() == [Some("replica-a".into()), Some("replica-a".into())]
    })
    .await;
    // A consumer of each link through a, watching from its list's version.
    let services = |c: &kube::Client| Api::<Service>::all(c.clone());
    let mut watches = Vec::new();
    for link in ["east", "west"] {
        let on_a = a.consumer(link, &token(link)).await;
        let listed = (services(&on_a).list(&ListParams::default()).await).expect("a list");
        let from = listed.metadata.resource_version.expect("a list version");
        let params = kube::api::WatchParams::default().timeout(290);
        let watch = (services(&on_a).watch(&params, &from).await).expect("a watch");
        watches.push((from, Box::pin(watch)));
    }
    a.relay.as_ref().expect("a relay").cut();
    let joined = std::time::Instant::now();
    let b = Replica::start_beside(&local, "replica-b", &a).await;
    until(30, "b takes one link", async || {
        holders().contains(&Some("replica-b".into()))
    })
    .await;
    let took = joined.elapsed();
    // The Lease went back after b joined; a given-back Lease lasts 1 s.
    let wait = Duration::from_secs(1) + fast().lease.duration / 2;
    eprintln!("b took a link {took:?} after it joined (at least {wait:?})");
    assert!(
        took >= wait,
        "b took the link {took:?} after it joined, its view never synced with a's"
    );
    let link = if holders()[0].as_deref() == Some("replica-b") {
        "east"
    } else {
        "west"
    };
    let on_b = b.consumer(link, &token(link)).await;
    until(
        30,
        "b serves the link it took from the remote",
        async || service_names(&on_b).await == Some(["web"].map(String::from).into()),
    )
    .await;
    assert_eq!(
        holders().iter().flatten().count(),
        2,
        "both links are held: {:?}",
        holders()
    );
    let served = (services(&on_b).list(&ListParams::default()).await)
        .expect("a list through b")
        .metadata
        .resource_version
        .expect("a version");
    let i = usize::from(link == "west");
    let base = |rv: &str| rv.parse::<u64>().expect("a number") >> 40;
    assert!(
        base(&served) > base(&watches[i].0),
        "b's versions ({served}) go on above a's ({})",
        watches[i].0
    );
    cluster.add_service("api", true);
    cluster.scale("api", 2, true);
    for (from, watch) in &mut watches {
        let first = next_change(watch, 30).await;
        assert_eq!(
            first.as_ref().map(describe).as_deref(),
            Some("ADDED api"),
            "the watch through a from {from} goes on through the hand-over"
        );
    }
    b.stop().await;
    a.stop().await;
}

/// Three replicas and three Links: one replica holds all three Leases and watches each remote
/// once; the second and third take their share (one Lease each, handed over at renewal); the
/// third drains and its link goes to another; from the start to the end the remote never serves
/// more watches than one replica's (kube-sim counts them, sampled every 20 ms throughout).
#[tokio::test]
async fn three_replicas_hold_one_link_each_and_each_remote_is_watched_once_throughout() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, _cluster) = remote(&["web"]).await;
    let names = ["east", "west", "north"];
    for name in names {
        add_link(&local, name, &sim, mk_link(name)).await;
    }
    let a = Replica::start_first(&local, "replica-a").await;
    let mut on_a = Vec::new();
    for n in names {
        on_a.push(a.consumer(n, &token(n)).await);
    }
    until(30, "a holds and serves the three links", async || {
        let mut all = true;
        for (n, c) in names.iter().zip(&on_a) {
            all &= lease_holder(&local, n).as_deref() == Some("replica-a")
                && service_names(c).await == Some(["web"].map(String::from).into());
        }
        all
    })
    .await;
    let one_replica = sim.api.open_watches();
    assert!(one_replica >= 3 * 4, "a watches each remote: {one_replica}");
    // The most watches the remote serves at any moment from here on.
    let sampler = WatchSampler::start(&sim);

    let b = Replica::start_beside(&local, "replica-b", &a).await;
    let c = Replica::start_beside(&local, "replica-c", &a).await;
    until(60, "each replica holds one link", async || {
        let mut holders: Vec<String> = names
            .iter()
            .filter_map(|n| lease_holder(&local, n))
            .collect();
        holders.sort();
        holders == ["replica-a", "replica-b", "replica-c"]
    })
    .await;
    eprintln!("holders: {:?}", names.map(|n| (n, lease_holder(&local, n))));
    let mut on_c = Vec::new();
    for n in names {
        on_c.push(c.consumer(n, &token(n)).await);
    }
    until(
        30,
        "c serves the three links, the remote watched once per link",
        async || {
            let mut all = sim.api.open_watches() == one_replica;
            for client in &on_c {
                all &= service_names(client).await == Some(["web"].map(String::from).into());
            }
            all
        },
    )
    .await;
    // c drains, as in a rolling restart: its link goes to a or b, which reads the remote only
    // once c has stopped reading it.
    c.stop().await;
    until(
        30,
        "a and b hold the three links, the remote watched once per link",
        async || {
            let holders = names.map(|n| lease_holder(&local, n));
            holders
                .iter()
                .all(|h| matches!(h.as_deref(), Some("replica-a" | "replica-b")))
                && sim.api.open_watches() == one_replica
        },
    )
    .await;
    let most = sampler.stop().await;
    eprintln!(
        "remote watches: {one_replica} with one replica, at most {most} with three and after one drained"
    );
    assert_eq!(
        most, one_replica,
        "the remote never served more watches than one replica's"
    );
    b.stop().await;
    a.stop().await;
}
