//! kube-sim's local cluster through kube-rs: the API server's rules the controller relies on
//! (create, compare-and-swap update, generation and the status subresource, patches, delete,
//! list and watch with resume, bookmarks and 410).

use std::collections::BTreeMap;

use floodgate_e2e::local::RunningLocal;
use floodgate_e2e::until;
use floodgate_link_crd::{Link, LinkSpec, LinkStatus, Phase, RemoteSpec};
use futures_util::StreamExt as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::json;

const NS: &str = "floodgate";

fn code<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> u16 {
    match r {
        Err(kube::Error::Api(e)) => {
            assert!(
                format!("{:?}", e.status).contains("Failure"),
                "a metav1.Status"
            );
            e.code
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn mk_lease(name: &str, holder: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            ..LeaseSpec::default()
        }),
    }
}

/// Creates set uid, creationTimestamp and a version; a second create is 409 AlreadyExists; an
/// update with a stale version is 409 Conflict (leases' compare-and-swap); delete of an absent
/// object is 404.
#[tokio::test]
async fn writes_follow_the_api_servers_rules() {
    let local = RunningLocal::start().await.expect("local cluster");
    let leases: Api<Lease> = Api::namespaced(local.client(NS).expect("client"), NS);
    let pp = PostParams::default();
    let created = leases
        .create(&pp, &mk_lease("l", "a"))
        .await
        .expect("create");
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(code(leases.create(&pp, &mk_lease("l", "b")).await), 409);

    let mut mine = created.clone();
    mine.spec.as_mut().expect("spec").holder_identity = Some("b".into());
    let updated = leases.replace("l", &pp, &mine).await.expect("update");
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    // `mine` still carries the version it was read at: a lost race.
    assert_eq!(code(leases.replace("l", &pp, &mine).await), 409);
    assert_eq!(
        leases
            .get("l")
            .await
            .expect("get")
            .spec
            .expect("spec")
            .holder_identity
            .as_deref(),
        Some("b")
    );

    let secrets: Api<Secret> = Api::namespaced(local.client(NS).expect("client"), NS);
    assert_eq!(code(secrets.get("nope").await), 404);
    assert_eq!(
        code(secrets.delete("nope", &DeleteParams::default()).await),
        404
    );
    let s = Secret {
        metadata: ObjectMeta {
            name: Some("s".into()),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([("k".into(), "v".into())])),
        ..Secret::default()
    };
    secrets.create(&pp, &s).await.expect("secret");
    let patched = secrets
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(
                    json!([{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}]),
                )
                .expect("patch"),
            ),
        )
        .await
        .expect("json patch");
    assert_eq!(patched.metadata.labels.expect("labels")["x"], "y");
    let selected = secrets
        .list(&ListParams::default().labels("x=y"))
        .await
        .expect("list");
    assert_eq!(selected.items.len(), 1);
    assert!(selected.metadata.resource_version.is_some());
    assert!(
        secrets
            .list(&ListParams::default().labels("x=z"))
            .await
            .expect("list")
            .items
            .is_empty()
    );
    secrets
        .delete("s", &DeleteParams::default())
        .await
        .expect("delete");
    assert_eq!(code(secrets.get("s").await), 404);
}

/// Spec changes bump metadata.generation, status writes do not; status is ignored on create
/// and on the main resource; `/status` ignores everything but status.
#[tokio::test]
async fn links_keep_generation_and_a_status_subresource() {
    let local = RunningLocal::start().await.expect("local cluster");
    let links: Api<Link> = Api::namespaced(local.client(NS).expect("client"), NS);
    let mut link = Link::new("east", LinkSpec::with_remote(RemoteSpec::default()));
    link.status = Some(LinkStatus {
        phase: Some(Phase::Quarantined),
        ..LinkStatus::default()
    });
    let created = links
        .create(&PostParams::default(), &link)
        .await
        .expect("create");
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(created.status, None, "status is ignored on create");

    let pp = PatchParams::default();
    let s = links
        .patch_status(
            "east",
            &pp,
            &Patch::Merge(
                json!({"status": {"phase": "Healthy"}, "spec": {"caps": {"maxServices": 1}}}),
            ),
        )
        .await
        .expect("status");
    assert_eq!(
        s.metadata.generation,
        Some(1),
        "a status write keeps the generation"
    );
    assert_eq!(s.status.and_then(|s| s.phase), Some(Phase::Healthy));
    assert_ne!(s.spec.caps.max_services, 1, "/status ignores the spec");

    let e = links
        .patch(
            "east",
            &pp,
            &Patch::Merge(
                json!({"spec": {"caps": {"maxServices": 1}}, "status": {"phase": "Degraded"}}),
            ),
        )
        .await
        .expect("spec");
    assert_eq!(e.metadata.generation, Some(2));
    assert_eq!(e.spec.caps.max_services, 1);
    assert_eq!(
        e.status.and_then(|s| s.phase),
        Some(Phase::Healthy),
        "the main resource ignores status"
    );
    let relabelled = links
        .patch(
            "east",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect("labels");
    assert_eq!(
        relabelled.metadata.generation,
        Some(2),
        "labels are not the spec"
    );
}

/// A raw watch resumes from a version with exactly the later changes, sends bookmarks when
/// asked, and answers a version older than the history with an in-stream 410; a kube-rs
/// watcher relists after it and carries on.
#[tokio::test]
async fn watches_resume_bookmark_and_expire() {
    let local = RunningLocal::start().await.expect("local cluster");
    let leases: Api<Lease> = Api::namespaced(local.client(NS).expect("client"), NS);
    let pp = PostParams::default();
    leases
        .create(&pp, &mk_lease("one", "a"))
        .await
        .expect("one");
    let listed = leases.list(&ListParams::default()).await.expect("list");
    let rv = listed.metadata.resource_version.expect("list version");
    leases
        .create(&pp, &mk_lease("two", "a"))
        .await
        .expect("two");

    let wp = WatchParams::default().timeout(5);
    let mut w = leases.watch(&wp, &rv).await.expect("watch").boxed();
    match w.next().await {
        Some(Ok(WatchEvent::Added(l))) => assert_eq!(l.metadata.name.as_deref(), Some("two")),
        other => panic!("expected two's ADDED, got {other:?}"),
    }
    leases
        .delete("one", &DeleteParams::default())
        .await
        .expect("delete");
    match w.next().await {
        Some(Ok(WatchEvent::Deleted(l))) => assert_eq!(l.metadata.name.as_deref(), Some("one")),
        other => panic!("expected one's DELETED, got {other:?}"),
    }
    match w.next().await {
        Some(Ok(WatchEvent::Bookmark(_))) => {}
        other => panic!("expected a bookmark while idle, got {other:?}"),
    }

    local.store.compact();
    let mut old = leases.watch(&wp, &rv).await.expect("watch").boxed();
    match old.next().await {
        Some(Ok(WatchEvent::Error(e))) => assert_eq!(e.code, 410),
        other => panic!("expected 410 Expired, got {other:?}"),
    }

    // kube-rs's watcher: an initial list, then every change.
    let store = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = store.clone();
    tokio::spawn(async move {
        let mut s = watcher(leases.clone(), watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(l)) = s.next().await {
            seen.lock()
                .expect("lock")
                .push(l.metadata.name.unwrap_or_default());
        }
    });
    until(10, "the watcher lists two", async || {
        store.lock().expect("lock").contains(&"two".to_owned())
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(local.client(NS).expect("client"), NS);
    leases
        .create(&pp, &mk_lease("three", "a"))
        .await
        .expect("three");
    until(10, "the watcher sees three", async || {
        store.lock().expect("lock").contains(&"three".to_owned())
    })
    .await;
}
