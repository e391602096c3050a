//! The controller's Kubernetes side against a small fake API server (kube-sim serves only the
//! facade's kinds today): two replicas' lease loops share one link's Lease, the second takes
//! over when the holder stops, and the status writer patches the status subresource with a
//! merge patch.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::to_bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use floodgate::controller::lease::{self, LeaseTiming};
use floodgate::controller::writer::{self, StatusApi as _};
use floodgate_link_crd::Link;
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Value, json};
use tokio::sync::watch;

/// Leases by name, each with its resourceVersion; and every status patch received.
#[derive(Default)]
struct Fake {
    leases: HashMap<String, Value>,
    version: u64,
    patches: Vec<(String, String, Value)>,
    links: Vec<Value>,
    secrets: HashMap<String, Value>,
    events: Vec<Value>,
}

type Shared = Arc<Mutex<Fake>>;

fn status(code: StatusCode, reason: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "reason": reason, "code": code.as_u16(), "message": reason});
    (
        code,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn ok(v: &Value) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}

async fn handle(State(fake): State<Shared>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let ctype = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = to_bytes(req.into_body(), 1 << 20).await.unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut f = fake.lock().expect("lock");
    let leases = "/apis/coordination.k8s.io/v1/namespaces/floodgate/leases";
    let query = query.unwrap_or_default();
    if path == "/apis/floodgate.dev/v1alpha1/namespaces/floodgate/links" {
        if query.contains("watch=") {
            // A watch that stays open and quiet: the controller's periodic pass does the rest.
            let body = axum::body::Body::from_stream(futures_util::stream::pending::<
                Result<axum::body::Bytes, std::convert::Infallible>,
            >());
            return (StatusCode::OK, [("content-type", "application/json")], body).into_response();
        }
        let list = json!({"apiVersion": "floodgate.dev/v1alpha1", "kind": "LinkList",
            "metadata": {"resourceVersion": "1"}, "items": f.links});
        return ok(&list);
    }
    if let Some(name) = path.strip_prefix("/api/v1/namespaces/floodgate/secrets/") {
        return match f.secrets.get(name) {
            Some(s) => ok(s),
            None => status(StatusCode::NOT_FOUND, "NotFound"),
        };
    }
    if path.starts_with("/apis/events.k8s.io/v1/namespaces/floodgate/events") {
        f.events.push(body.clone());
        return (
            StatusCode::CREATED,
            [("content-type", "application/json")],
            body.to_string(),
        )
            .into_response();
    }
    if let Some(rest) =
        path.strip_prefix("/apis/floodgate.dev/v1alpha1/namespaces/floodgate/links/")
    {
        let link = rest.trim_end_matches("/status").to_owned();
        f.patches.push((link.clone(), ctype, body.clone()));
        let obj = json!({"apiVersion": "floodgate.dev/v1alpha1", "kind": "Link",
            "metadata": {"name": link, "namespace": "floodgate", "resourceVersion": "1"},
            "spec": {"remote": {"kubeconfigPath": "/x"}}, "status": body["status"]});
        return ok(&obj);
    }
    match (method.as_str(), path.strip_prefix(leases)) {
        ("POST", Some("")) => {
            let name = body["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if f.leases.contains_key(&name) {
                return status(StatusCode::CONFLICT, "AlreadyExists");
            }
            f.version += 1;
            let mut obj = body;
            obj["metadata"]["resourceVersion"] = f.version.to_string().into();
            f.leases.insert(name, obj.clone());
            (
                StatusCode::CREATED,
                [("content-type", "application/json")],
                obj.to_string(),
            )
                .into_response()
        }
        ("GET", Some(name)) => match f.leases.get(name.trim_start_matches('/')) {
            Some(obj) => ok(obj),
            None => status(StatusCode::NOT_FOUND, "NotFound"),
        },
        ("PUT", Some(name)) => {
            let name = name.trim_start_matches('/').to_owned();
            let current = f
                .leases
                .get(&name)
                .map(|o| o["metadata"]["resourceVersion"].clone());
            if current.as_ref() != Some(&body["metadata"]["resourceVersion"]) {
                return status(StatusCode::CONFLICT, "Conflict");
            }
            f.version += 1;
            let mut obj = body;
            obj["metadata"]["resourceVersion"] = f.version.to_string().into();
            f.leases.insert(name, obj.clone());
            ok(&obj)
        }
        _ => status(StatusCode::NOT_FOUND, "NotFound"),
    }
}

async fn fake_cluster() -> (kube::Client, Shared) {
    let fake: Shared = Arc::default();
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app.into_make_service()).await;
    });
    let url = format!("http://{addr}").parse().expect("url");
    let mut cfg = kube::Config::new(url);
    cfg.default_namespace = "floodgate".into();
    let client = kube::Client::try_from(cfg).expect("client");
    (client, fake)
}

/// Polls `f` until it holds, for at most `secs` seconds.
async fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Replica a holds the link; b waits; when a stops, a's set empties at once and b takes
/// the expired Lease over.
#[tokio::test]
async fn a_second_replica_takes_over_when_the_holder_stops() {
    let (client, fake) = fake_cluster().await;
    let api: kube::Api<Lease> = kube::Api::namespaced(client, "floodgate");
    let timing = LeaseTiming {
        duration: Duration::from_secs(1),
        renew: Duration::from_millis(100),
    };
    let (_links_tx, links) = watch::channel(BTreeSet::from(["east".to_owned()]));
    let (a_held_tx, a_held) = watch::channel(BTreeSet::new());
    let (a_stop, a_shutdown) = watch::channel(false);
    let a = tokio::spawn(lease::run(
        api.clone(),
        "replica-a".into(),
        timing,
        links.clone(),
        a_held_tx,
        a_shutdown,
    ));
    eventually(5, "a holds east", || a_held.borrow().contains("east")).await;

    let (b_held_tx, b_held) = watch::channel(BTreeSet::new());
    let (_b_stop, b_shutdown) = watch::channel(false);
    let _b = tokio::spawn(lease::run(
        api.clone(),
        "replica-b".into(),
        timing,
        links,
        b_held_tx,
        b_shutdown,
    ));
    // Several of b's renewal rounds pass without it taking a live lease.
    let round = fake.lock().expect("lock").version;
    eventually(5, "a renews a few times", || {
        fake.lock().expect("lock").version >= round + 5
    })
    .await;
    assert!(
        b_held.borrow().is_empty(),
        "b never holds a live lease of a"
    );

    a_stop.send(true).expect("stop a");
    a.await.expect("a ends");
    assert!(a_held.borrow().is_empty(), "a stops holding at once");
    eventually(5, "b takes over", || b_held.borrow().contains("east")).await;
    let f = fake.lock().expect("lock");
    let spec = &f.leases[&lease::lease_name("east")]["spec"];
    assert_eq!(spec["holderIdentity"], "replica-b");
    assert_eq!(spec["leaseTransitions"], 1);
}

#[tokio::test]
async fn status_goes_to_the_status_subresource_as_a_merge_patch() {
    let (client, fake) = fake_cluster().await;
    let api = writer::KubeStatusApi(kube::Api::<Link>::namespaced(client, "floodgate"));
    api.patch("east", json!({"status": {"phase": "Quarantined"}}))
        .await
        .expect("patched");
    let f = fake.lock().expect("lock");
    let (link, ctype, body) = &f.patches[0];
    assert_eq!(link, "east");
    assert_eq!(ctype, "application/merge-patch+json");
    assert_eq!(body["status"]["phase"], "Quarantined");
}

fn mk_link(name: &str, generation: i64, spec: Value) -> Value {
    json!({"apiVersion": "floodgate.dev/v1alpha1", "kind": "Link",
        "metadata": {"name": name, "namespace": "floodgate", "generation": generation,
            "resourceVersion": "1", "uid": format!("uid-{name}")},
        "spec": spec})
}

fn mk_secret(name: &str, key: &str, value: &str) -> Value {
    use base64::Engine as _;
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "floodgate"},
        "data": {key: base64::engine::general_purpose::STANDARD.encode(value)}})
}

/// The whole controller against the fake cluster: a Link whose remote cannot be reached yet
/// and an invalid Link. The holder writes both statuses with observedGeneration and says why
/// each is not ready; the invalid one is refused without touching the other.
#[tokio::test]
async fn the_controller_writes_status_for_a_good_and_an_invalid_link() {
    let (client, fake) = fake_cluster().await;
    {
        let mut f = fake.lock().expect("lock");
        // A remote on a port nothing listens on: the link stays Degraded, retrying.
        let kubeconfig = "apiVersion: v1\nkind: Config\nclusters:\n- name: r\n  cluster: {server: 'http://127.0.0.1:9'}\ncontexts:\n- name: r\n  context: {cluster: r, user: u}\ncurrent-context: r\nusers:\n- name: u\n  user: {token: t}\n";
        let remote = json!({"kubeconfigSecret": {"name": "east-upstream", "key": "kubeconfig"}});
        f.links.push(mk_link("east", 4, json!({"remote": remote})));
        f.links.push(mk_link(
            "bad",
            2,
            json!({"remote": remote, "coalesce": {"quiet": "5s", "max": "2s"}}),
        ));
        f.secrets.insert(
            "east-upstream".into(),
            mk_secret("east-upstream", "kubeconfig", kubeconfig),
        );
        f.secrets.insert(
            "floodgate-token-east".into(),
            mk_secret("floodgate-token-east", "token", "tok"),
        );
    }
    let state = std::env::temp_dir().join(format!("floodgate-controller-{}", std::process::id()));
    let args = floodgate::controller::ControllerArgs {
        namespace: "floodgate".into(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        state_dir: state.clone(),
        tls_hosts: vec![],
        identity: "replica-a".into(),
    };
    let (stop, shutdown) = watch::channel(false);
    let task = tokio::spawn(floodgate::controller::run(client, args, shutdown));
    let patched = |link: &str| {
        fake.lock()
            .expect("lock")
            .patches
            .iter()
            .filter(|(l, _, _)| l == link)
            .map(|(_, _, b)| b.clone())
            .collect::<Vec<_>>()
    };
    eventually(20, "both statuses written", || {
        !patched("east").is_empty() && !patched("bad").is_empty()
    })
    .await;
    let cond = |status: &Value, ty: &str| {
        status["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == ty).cloned())
            .unwrap_or_else(|| panic!("no {ty} condition in {status}"))
    };
    let east = patched("east")[0].clone();
    assert_eq!(east["status"]["observedGeneration"], 4);
    assert_eq!(cond(&east, "SpecValid")["status"], "True");
    assert_eq!(cond(&east, "Ready")["status"], "False");
    assert_eq!(cond(&east, "Ready")["observedGeneration"], 4);
    let bad = patched("bad")[0].clone();
    assert_eq!(cond(&bad, "SpecValid")["status"], "False");
    assert_eq!(cond(&bad, "SpecValid")["reason"], "InvalidSpec");
    assert!(
        cond(&bad, "SpecValid")["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.coalesce.quiet")),
        "{bad}"
    );
    stop.send(true).expect("stop");
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    std::fs::remove_dir_all(&state).ok();
}
