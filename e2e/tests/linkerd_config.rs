//! The remote's `linkerd-config` ConfigMap through a link, as `linkerd multicluster check`
//! ("clusters share trust anchors") and a client-go informer read it: get, list and watch,
//! by name with a field selector, JSON and protobuf, equal to the remote's; every other
//! ConfigMap of the remote (another name, or another namespace) 404; a trust-anchor rotation
//! reaching an open watch; kubectl's table and JSON.

use std::collections::BTreeMap;
use std::sync::Arc;

use floodgate::model::Object;
use floodgate_e2e::gateway::Stack;
use floodgate_e2e::next_event as next;
use floodgate_e2e::sim::SimStore;
use futures_util::{Stream, StreamExt};
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use prost::Message as _;

const BY_NAME: &str = "metadata.name=linkerd-config";

/// A ConfigMap as Linkerd's control plane writes `linkerd-config`: its `values` hold the
/// identity trust anchors.
fn config_map(namespace: &str, name: &str, anchors: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(format!("uid-{namespace}-{name}")),
            creation_timestamp: Some(Time(
                jiff::Timestamp::from_second(1_700_000_000).expect("t"),
            )),
            labels: Some(BTreeMap::from([(
                "linkerd.io/control-plane-component".into(),
                "controller".into(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "values".into(),
            format!("identityTrustAnchorsPEM: |\n  {anchors}\nclusterDomain: cluster.local\n"),
        )])),
        ..ConfigMap::default()
    }
}

fn put(store: &SimStore, cm: ConfigMap) {
    store.apply([Object::ConfigMap(Arc::new(cm))]);
}

/// The objects of an initial list, once it is done.
async fn initial<K>(s: &mut (impl Stream<Item = watcher::Result<Event<K>>> + Unpin)) -> Vec<K> {
    let mut items = Vec::new();
    loop {
        match next(s).await {
            Event::Init => items.clear(),
            Event::InitApply(k) => items.push(k),
            Event::InitDone => return items,
            Event::Apply(_) | Event::Delete(_) => {}
        }
    }
}

fn same(through: &ConfigMap, remote: &ConfigMap) {
    assert_eq!(through.metadata.uid, remote.metadata.uid);
    assert_eq!(through.metadata.name, remote.metadata.name);
    assert_eq!(through.metadata.namespace, remote.metadata.namespace);
    assert_eq!(through.metadata.labels, remote.metadata.labels);
    assert_eq!(through.data, remote.data);
}

fn code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("an API error, not {other}"),
    }
}

/// A GET of the object in protobuf, as client-go's typed clients ask for it.
async fn get_protobuf(client: &Client, path: &str) -> k8s_pb::api::core::v1::ConfigMap {
    let req = http::Request::get(path)
        .header(
            "Accept",
            "application/vnd.kubernetes.protobuf, application/json",
        )
        .body(kube::client::Body::empty())
        .expect("request");
    let res = client.send(req).await.expect("an answer");
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.headers()["content-type"],
        "application/vnd.kubernetes.protobuf"
    );
    let body = res.into_body().collect().await.expect("body").to_bytes();
    let unknown = floodgate::protobuf::open(&body).expect("an envelope");
    let type_meta = unknown.type_meta.expect("type meta");
    assert_eq!(type_meta.kind.as_deref(), Some("ConfigMap"));
    assert_eq!(type_meta.api_version.as_deref(), Some("v1"));
    k8s_pb::api::core::v1::ConfigMap::decode(unknown.raw.unwrap_or_default().as_slice())
        .expect("a ConfigMap")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_remotes_linkerd_config_is_served_alone_and_followed() {
    let store = Arc::new(SimStore::new(53, 1000));
    put(
        &store,
        config_map("linkerd", "linkerd-config", "anchor-one"),
    );
    // What the link must never read or serve.
    put(
        &store,
        config_map("linkerd", "linkerd-identity-trust-roots", "x"),
    );
    put(&store, config_map("prod", "linkerd-config", "not-linkerds"));
    let stack = Stack::start(store.clone(), Stack::default_spec())
        .await
        .expect("stack");
    let (through, direct) = (
        stack.consumer().await.expect("consumer"),
        stack.direct().await.expect("direct"),
    );
    // The upstream watch selected the one object: the link holds nothing else.
    let state = stack.settled().await.expect("settled");
    assert_eq!(state.engine.objects_by_kind.get("ConfigMap"), Some(&1));

    // GET, as `linkerd multicluster check` makes it.
    let linkerd: Api<ConfigMap> = Api::namespaced(through.clone(), "linkerd");
    let remote: Api<ConfigMap> = Api::namespaced(direct, "linkerd");
    let got = linkerd.get("linkerd-config").await.expect("served");
    let want = remote.get("linkerd-config").await.expect("the remote's");
    same(&got, &want);
    // Another name, or another namespace: 404, as for an object that does not exist.
    let other = linkerd.get("linkerd-identity-trust-roots").await;
    assert_eq!(code(other.expect_err("not served")), 404);
    let prod: Api<ConfigMap> = Api::namespaced(through.clone(), "prod");
    assert_eq!(code(prod.get("linkerd-config").await.expect_err("no")), 404);

    // Lists: cluster-wide, in the namespace, by name (client-go's one-object informer).
    let all: Api<ConfigMap> = Api::all(through.clone());
    let names = |l: Vec<ConfigMap>| -> Vec<String> {
        l.iter()
            .map(|c| format!("{:?}/{:?}", c.metadata.namespace, c.metadata.name))
            .collect()
    };
    let one = [format!(
        "{:?}/{:?}",
        Some("linkerd"),
        Some("linkerd-config")
    )];
    assert_eq!(
        names(all.list(&ListParams::default()).await.expect("list").items),
        one
    );
    let by_name = ListParams::default().fields(BY_NAME);
    assert_eq!(
        names(linkerd.list(&by_name).await.expect("list").items),
        one
    );
    assert_eq!(names(all.list(&by_name).await.expect("list").items), one);
    assert!(prod.list(&by_name).await.expect("list").items.is_empty());

    // Protobuf, as client-go's typed client asks.
    let pb = get_protobuf(
        &through,
        "/api/v1/namespaces/linkerd/configmaps/linkerd-config",
    )
    .await;
    let meta = pb.metadata.expect("metadata");
    assert_eq!(meta.uid, want.metadata.uid);
    assert_eq!(Some(pb.data), want.data);

    // Watches by name, streaming (client-go's default) and list-then-watch.
    let cfg = watcher::Config::default().fields(BY_NAME);
    let mut streaming = watcher::watcher(linkerd.clone(), cfg.clone().streaming_lists()).boxed();
    let mut listed = watcher::watcher(all.clone(), cfg).boxed();
    for w in [&mut streaming, &mut listed] {
        let items = initial(w).await;
        assert_eq!(items.len(), 1);
        same(&items[0], &want);
    }

    // The remote rotates its trust anchors: both watches see it.
    put(
        &store,
        config_map("linkerd", "linkerd-config", "anchor-two"),
    );
    let rotated = remote.get("linkerd-config").await.expect("the remote's");
    for w in [&mut streaming, &mut listed] {
        loop {
            if let Event::Apply(c) = next(w).await {
                same(&c, &rotated);
                break;
            }
        }
    }
    // And the other ConfigMaps changing reach no one: the next event is the next change of
    // linkerd-config, not theirs.
    put(
        &store,
        config_map("linkerd", "linkerd-identity-trust-roots", "y"),
    );
    put(&store, config_map("prod", "linkerd-config", "still-not"));
    put(
        &store,
        config_map("linkerd", "linkerd-config", "anchor-three"),
    );
    let third = loop {
        if let Event::Apply(c) = next(&mut listed).await {
            break c;
        }
    };
    assert!(
        (third.data.as_ref()).is_some_and(|d| d["values"].contains("anchor-three")),
        "{third:?}"
    );

    let last = remote.get("linkerd-config").await.expect("the remote's");
    kubectl(&stack, &last).await;
}

/// kubectl through the link: the table of ConfigMaps, and the object as JSON.
async fn kubectl(stack: &Stack, want: &ConfigMap) {
    let kubeconfig = stack.dir().join("east-consumer.kubeconfig");
    std::fs::write(
        &kubeconfig,
        stack.floodgate.kubeconfig("east").expect("link east"),
    )
    .expect("kubeconfig");
    let run = async |args: &[&str]| {
        let out = tokio::process::Command::new("kubectl")
            .env("KUBECONFIG", &kubeconfig)
            .arg("--request-timeout=10s")
            .args(args)
            .kill_on_drop(true)
            .output()
            .await
            .expect("kubectl runs (install it: .ci/run does)");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = run(&["get", "configmaps", "-n", "linkerd"]).await;
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAME", "DATA", "AGE"], "{table}");
    assert_eq!(rows.len(), 2, "{table}");
    assert_eq!(rows[1][..2], ["linkerd-config", "1"], "{table}");
    let json = run(&[
        "get",
        "configmap",
        "linkerd-config",
        "-n",
        "linkerd",
        "-o",
        "json",
    ])
    .await;
    let got: ConfigMap = serde_json::from_str(&json).expect("a ConfigMap");
    same(&got, want);
}
