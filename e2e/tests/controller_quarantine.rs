//! Quarantine and containment in cluster mode: recorded in the Link's status by the holder,
//! honoured after a restart, followed by the replicas that do not hold the Lease.

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

/// Link `link`'s Lease, held for an hour by "the-holder" (played by the test).
async fn held_by_the_test(client: &kube::Client, link: &str) -> Lease {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(lease::lease_name(link)),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some("the-holder".into()),
            lease_duration_seconds: Some(3600),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..Default::default()
        }),
    };
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("lease")
}

/// Writes `field` of link east's status, as the holder would.
async fn record_status(client: &kube::Client, field: &str, value: serde_json::Value) {
    let links: Api<Link> = Api::namespaced(client.clone(), NS);
    links
        .patch_status(
            "east",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {field: value}})),
        )
        .await
        .expect("status");
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
    let lease = held_by_the_test(&client, "east").await;
    let b = Replica::start(&local, "replica-b").await;
    let consumer = b.consumer("east", &token("east")).await;
    until(30, "b serves east", async || {
        service_names(&consumer).await == Some(["web"].map(String::from).into())
    })
    .await;

    let record = |v: serde_json::Value| record_status(&client, "quarantine", v);
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

/// The contained services a replica's admin API shows for link `east`.
async fn contained_on(admin: std::net::SocketAddr) -> Vec<String> {
    match floodgate_e2e::admin::call(admin, "GET", "/links/east", None, "").await {
        Ok((200, v)) => v["contained"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["service"].as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// The endpoints a consumer is served for `service`.
async fn endpoints_of(c: &kube::Client, service: &str) -> usize {
    let api: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(c.clone(), "prod");
    let lp =
        kube::api::ListParams::default().labels(&format!("kubernetes.io/service-name={service}"));
    api.list(&lp).await.map_or(0, |l| {
        l.items
            .iter()
            .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
            .sum()
    })
}

/// A replica that does not hold the Lease follows the containments the holder records: it
/// contains what `status.containedServices` names (the service's later changes do not reach
/// its view, the other services' do) and releases what the record drops. It never contains a
/// service on its own, however the service floods.
#[tokio::test]
async fn a_replica_without_the_lease_follows_the_recorded_containments() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, mut cluster) = remote(&["web", "injector"]).await;
    let mut link = mk_link("east");
    // More than 8 upstream endpoints would contain a service, were this replica deciding.
    link.spec.caps.max_endpoints_per_service = 5;
    link.spec.quarantine.when.endpoints_per_service = 8;
    add_link(&local, "east", &sim, link).await;
    let client = local.client(NS).expect("client");
    held_by_the_test(&client, "east").await;
    let b = Replica::start(&local, "replica-b").await;
    let consumer = b.consumer("east", &token("east")).await;
    until(30, "b serves east", async || {
        endpoints_of(&consumer, "injector").await == 2
    })
    .await;
    // The injector floods past the threshold: b, not deciding, contains nothing.
    cluster.scale("injector", 12, true);
    until(30, "b follows the remote (capped)", async || {
        endpoints_of(&consumer, "injector").await == 5
    })
    .await;
    assert!(contained_on(b.admin).await.is_empty(), "b never decides");

    let record = |v: serde_json::Value| record_status(&client, "containedServices", v);
    record(
        serde_json::json!({"count": 1, "first": [{"service": "prod/injector",
        "reason": "EndpointsPerService", "since": "2026-01-01T00:00:00Z",
        "message": "12 endpoints, over 8", "figures": {"endpoints": 12}}]}),
    )
    .await;
    until(30, "b follows the recorded containment", async || {
        contained_on(b.admin).await == ["prod/injector"]
    })
    .await;
    // Contained: the injector's changes wait, web's flow.
    cluster.scale("injector", 3, true);
    cluster.scale("web", 4, true);
    until(30, "web's change reaches b's view", async || {
        endpoints_of(&consumer, "web").await == 4
    })
    .await;
    assert_eq!(
        endpoints_of(&consumer, "injector").await,
        5,
        "the contained service is frozen"
    );
    assert_eq!(lease_holder(&local, "east").as_deref(), Some("the-holder"));

    // The holder releases it: b follows and converges.
    record(serde_json::Value::Null).await;
    until(30, "b follows the release and converges", async || {
        endpoints_of(&consumer, "injector").await == 3
    })
    .await;
    assert!(contained_on(b.admin).await.is_empty());
    b.stop().await;
}

/// The phase and upstream event count a replica's admin API shows for link `east`.
async fn phase_and_upstream_on(admin: std::net::SocketAddr) -> Option<(String, u64)> {
    let v = floodgate_e2e::admin::link(admin, "east").await?;
    Some((
        v["phase"].as_str()?.to_owned(),
        v["counters"]["upstreamEvents"].as_u64()?,
    ))
}

/// A replica that starts while its link is quarantined serves the last good view within 5 s,
/// taken from its peer, quarantined, without reading its remote (which floods meanwhile); a
/// replica with no peer serves the remote's view instead. The release, sent to the new
/// replica, brings both to the remote.
#[tokio::test]
async fn a_replica_started_during_a_quarantine_serves_the_last_good_view_from_its_peer() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, mut cluster) = remote(&["web"]).await;
    add_link(&local, "east", &sim, mk_link("east")).await;
    let a = Replica::start(&local, "replica-a").await;
    let on_a = a.consumer("east", &token("east")).await;
    until(30, "a holds the Lease and serves east", async || {
        lease_holder(&local, "east").as_deref() == Some("replica-a")
            && service_names(&on_a).await == Some(["web"].map(String::from).into())
    })
    .await;
    let (code, v) = floodgate_e2e::admin::post(
        a.admin,
        "/links/east/quarantine",
        ADMIN_TOKEN,
        r#"{"message": "the remote floods"}"#,
    )
    .await;
    assert_eq!(code, 200, "{v}");
    until(10, "status records the quarantine", async || {
        status(&local, "east")
            .await
            .is_some_and(|s| s.quarantine.is_some())
    })
    .await;
    // The remote changes under the quarantine: the last good view has web alone.
    cluster.add_service("api", true);
    cluster.scale("api", 1, true);

    let started = tokio::time::Instant::now();
    let b = Replica::start_beside(&local, "replica-b", &a).await;
    let on_b = b.consumer("east", &token("east")).await;
    until(5, "b serves the last good view, quarantined", async || {
        service_names(&on_b).await == Some(["web"].map(String::from).into())
            && phase_and_upstream_on(b.admin)
                .await
                .is_some_and(|(phase, _)| phase == "Quarantined")
    })
    .await;
    eprintln!(
        "b served the peer's view {:?} after it started",
        started.elapsed()
    );
    // Its upstream never started: the view is the peer's, not its remote's.
    loops_go_round(&local).await;
    assert_eq!(
        phase_and_upstream_on(b.admin).await,
        Some(("Quarantined".to_owned(), 0))
    );
    assert_eq!(
        service_names(&on_b).await,
        Some(["web"].map(String::from).into())
    );

    // With no peer, a replica's link starts from its remote: it syncs (capped), then follows
    // the recorded quarantine.
    let c = Replica::start(&local, "replica-c").await;
    let on_c = c.consumer("east", &token("east")).await;
    until(30, "c serves the remote's view", async || {
        service_names(&on_c).await == Some(["api", "web"].map(String::from).into())
            && phase_and_upstream_on(c.admin)
                .await
                .is_some_and(|(phase, _)| phase == "Quarantined")
    })
    .await;
    c.stop().await;

    let (code, v) =
        floodgate_e2e::admin::post(b.admin, "/links/east/release", ADMIN_TOKEN, "").await;
    assert_eq!(code, 200, "{v}");
    until(30, "both converge to the remote", async || {
        let both = Some(["api", "web"].map(String::from).into());
        service_names(&on_a).await == both && service_names(&on_b).await == both
    })
    .await;
    b.stop().await;
    a.stop().await;
}

/// A service already over `endpointsPerService` when this replica takes the Lease, nothing
/// changing on the remote: the replica listed the remote before it decided (the test held the
/// Lease), and contains the service within 5 s of taking the Lease over, from the state it
/// holds. Before, the count was checked only when a slice or the Service changed, and such a
/// service stayed uncontained for as long as the flood was static.
#[tokio::test]
async fn a_service_already_over_its_threshold_is_contained_once_the_lease_is_taken() {
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, mut cluster) = remote(&["web", "injector"]).await;
    cluster.scale("injector", 12, true);
    let mut link = mk_link("east");
    link.spec.caps.max_endpoints_per_service = 5;
    link.spec.quarantine.when.endpoints_per_service = 8;
    add_link(&local, "east", &sim, link).await;
    let client = local.client(NS).expect("client");
    let lease = held_by_the_test(&client, "east").await;
    let b = Replica::start(&local, "replica-b").await;
    let consumer = b.consumer("east", &token("east")).await;
    until(30, "b serves east (capped)", async || {
        endpoints_of(&consumer, "injector").await == 5
    })
    .await;
    assert!(contained_on(b.admin).await.is_empty(), "b does not decide");

    // The holder goes: its Lease is deleted, and b takes it at its next renewal.
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    leases
        .delete(&lease::lease_name("east"), &Default::default())
        .await
        .expect("the Lease deleted");
    drop(lease);
    until(30, "b holds the Lease", async || {
        lease_holder(&local, "east").as_deref() == Some("replica-b")
    })
    .await;
    let held = tokio::time::Instant::now();
    until(
        5,
        "the service over its threshold is contained",
        async || contained_on(b.admin).await == ["prod/injector"],
    )
    .await;
    eprintln!("contained {:?} after b held the Lease", held.elapsed());
    b.stop().await;
}

/// `floodgate status` in a cluster: a link with a contained service and a quarantined link
/// are both in its table, from the Links' status and from a replica's admin API; `--wait`
/// fails while they stand and succeeds once both are released.
#[tokio::test]
async fn floodgate_status_shows_containment_and_quarantine_and_waits_for_their_release() {
    use floodgate::cli::status::{Output, Source, StatusArgs, status};
    let local = RunningLocal::start().await.expect("local cluster");
    let (sim, mut cluster) = remote(&["web", "injector"]).await;
    cluster.scale("injector", 12, true);
    let mut east = mk_link("east");
    east.spec.caps.max_endpoints_per_service = 5;
    east.spec.quarantine.when.endpoints_per_service = 8;
    add_link(&local, "east", &sim, east).await;
    add_link(&local, "west", &sim, mk_link("west")).await;
    let a = Replica::start(&local, "replica-a").await;
    until(30, "east contains the injector", async || {
        contained_on(a.admin).await == ["prod/injector"]
    })
    .await;
    let (code, v) = floodgate_e2e::admin::post(
        a.admin,
        "/links/west/quarantine",
        ADMIN_TOKEN,
        r#"{"message": "ticket 9"}"#,
    )
    .await;
    assert_eq!(code, 200, "{v}");

    let links = Source::Cluster(Api::namespaced(local.client(NS).expect("client"), NS));
    let args = |wait: bool, timeout: &str, output: Output| StatusArgs {
        admin: None,
        namespace: NS.into(),
        wait,
        timeout: timeout.parse().expect("a duration"),
        output,
    };
    let mut shown = String::new();
    until(30, "the table shows both", async || {
        shown = status(&links, &args(false, "1s", Output::Table))
            .await
            .expect("status")
            .text;
        let line = |name: &str| {
            shown
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_default()
                .to_owned()
        };
        let (east, west) = (line("east "), line("west "));
        east.contains("1 (prod/injector)")
            && east.contains(" reachable ")
            && east.contains("replica-a")
            && west.contains("Quarantined")
            && west.contains("Manual since")
            && west.contains("ticket 9")
    })
    .await;
    println!("{shown}");
    let waited = status(&links, &args(true, "2s", Output::Table))
        .await
        .expect("status");
    assert!(!waited.ok, "{}", waited.text);
    assert!(
        waited
            .text
            .contains("2 of 2 links not well (east Healthy, west Quarantined)"),
        "{}",
        waited.text
    );

    // The same from the admin API, which knows watchers and objects too.
    let admin = kube::Client::try_from(kube::Config::new(
        format!("http://{}", a.admin).parse().expect("URL"),
    ))
    .expect("client");
    let rows = Source::Admin(admin).rows().await.expect("rows");
    let row = |name: &str| rows.iter().find(|r| r.name == name).expect("a row");
    assert_eq!(row("east").contained_first, ["prod/injector"]);
    assert_eq!(row("west").phase, "Quarantined");
    assert_eq!(
        (row("east").remote.as_str(), row("west").remote.as_str()),
        ("reachable", "-")
    );
    assert!(row("east").watchers.is_some() && row("east").objects.is_some());

    // Released: the flood ends and the operator releases the service and the link.
    cluster.scale("injector", 3, true);
    for path in [
        "/links/east/services/prod/injector/release",
        "/links/west/release",
    ] {
        let (code, v) = floodgate_e2e::admin::post(a.admin, path, ADMIN_TOKEN, "").await;
        assert_eq!(code, 200, "{path}: {v}");
    }
    let waited = status(&links, &args(true, "30s", Output::Json))
        .await
        .expect("status");
    assert!(waited.ok, "{}", waited.text);
    let rows: serde_json::Value = serde_json::from_str(&waited.text).expect("JSON");
    assert_eq!(rows.as_array().map(Vec::len), Some(2), "{rows}");
    assert!(
        rows.as_array()
            .into_iter()
            .flatten()
            .all(|r| r["phase"] == "Healthy" && r["contained"] == 0),
        "{rows}"
    );
    a.stop().await;
}
