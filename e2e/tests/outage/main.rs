//! Remotes that fail, in-process: S3 (an outage, then a 410 storm, under a consumer's watch)
//! and a link whose remote cannot be reached at all beside one that works; how soon a remote
//! that dies or goes away quietly is seen, and how the binary logs it ([`degraded`]). Reduced
//! scale for `make test`.

mod degraded;

use std::sync::Arc;
use std::time::Duration;

use floodgate::kubeapi::ApiStore as _;
use floodgate::model::{Kind, NsName, ObjKey};
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::gateway::Stack;
use floodgate_e2e::sim::SimStore;
use floodgate_link_crd::Phase;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher;

/// The next slice event `events` gets within `secs`, or a panic naming `what`.
pub(crate) async fn next_slice_event(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    secs: u64,
    what: &str,
) -> String {
    tokio::time::timeout(Duration::from_secs(secs), events.recv())
        .await
        .unwrap_or_else(|_| panic!("{what} within {secs} s"))
        .expect("the watcher goes on")
}

/// Watches `slices` through its initial sync, then reports each later event as
/// `apply NAME`, `delete NAME`, `init`, `initapply NAME` or `initdone`.
pub(crate) async fn slice_events(
    slices: Api<EndpointSlice>,
) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let mut w = watcher::watcher(slices, watcher::Config::default()).boxed();
    loop {
        if let Some(Ok(watcher::Event::InitDone)) = w.next().await {
            break;
        }
    }
    let (tx, events) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(ev)) = w.next().await {
            let name = |s: EndpointSlice| s.metadata.name.unwrap_or_default();
            let what = match ev {
                watcher::Event::Apply(s) => format!("apply {}", name(s)),
                watcher::Event::Delete(s) => format!("delete {}", name(s)),
                watcher::Event::Init => "init".to_owned(),
                watcher::Event::InitApply(s) => format!("initapply {}", name(s)),
                watcher::Event::InitDone => "initdone".to_owned(),
            };
            if tx.send(what).is_err() {
                return;
            }
        }
    });
    events
}

/// The `status.podIP` of pod `prod/<name>` in `view`.
fn pod_ip(view: &floodgate::view::View, name: &str) -> Option<String> {
    let s = view.get(&ObjKey {
        kind: Kind::Pod,
        id: NsName::new("prod", name),
    })?;
    let v: serde_json::Value = serde_json::from_slice(&s.json()).ok()?;
    v["status"]["podIP"].as_str().map(str::to_owned)
}

fn contains(json: &[u8], needle: &str) -> bool {
    json.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// S3: the remote fails (every request a 500, watches cut), changes while down, recovers, then
/// forces every watch to relist (410). Consumers keep the last view, see no spurious DELETE or
/// ADD, and converge after recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_an_upstream_outage_and_a_410_storm_leave_consumers_calm() {
    use floodgate::kubeapi::status::{Reason, StatusError};
    let store = Arc::new(SimStore::new(45, 10_000));
    let mut cluster = Cluster::exported(store.clone(), &["web", "api"], 3);
    let stack = Stack::start(store.clone(), Stack::default_spec())
        .await
        .expect("stack");
    let through = stack.consumer().await.expect("client");
    let mut events = slice_events(Api::<EndpointSlice>::all(through)).await;
    let view = stack.floodgate.links[0].view.clone();

    // The outage: every request fails, open watches are cut.
    let rv = view.resource_version();
    store.set_failing(Some(StatusError::new(
        Reason::InternalError,
        "etcdserver: request timed out",
    )));
    cluster.roll_pod("web", 0);
    floodgate_e2e::until(10, "the link sees the outage", async || {
        let link = stack.link();
        link.upstream.errors > 0 && link.phase == Phase::Degraded
    })
    .await;
    assert_eq!(view.resource_version(), rv, "the last view is kept");
    assert!(
        events.try_recv().is_err(),
        "consumers saw nothing during the outage"
    );
    assert!(
        stack.link().upstream.errors > 0,
        "the link saw the failures"
    );

    // Recovery: the change made while down arrives, and nothing else.
    store.set_failing(None);
    let got = next_slice_event(&mut events, 30, "converges").await;
    assert_eq!(got, "apply web-00000");
    // The slice's watcher may be back before the Pod and Endpoints watchers, which back off on
    // their own clocks: the roll is in only when the pod's new address is in all three.
    let ip = pod_ip(store.view(), "web-0").expect("the remote's pod");
    let web = NsName::new("prod", "web");
    let caught_up = || {
        pod_ip(&view, "web-0").as_deref() == Some(ip.as_str())
            && view
                .get(&ObjKey {
                    kind: Kind::Endpoints,
                    id: web.clone(),
                })
                .is_some_and(|s| contains(&s.json(), &ip))
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !caught_up() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod and Endpoints caught up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A change after the recovery, once consumers have it, proves the recovery was taken in:
    // it is the first slice event since.
    cluster.roll_pod("api", 0);
    let got = next_slice_event(&mut events, 10, "converges").await;
    assert_eq!(got, "apply api-00000", "no spurious event after recovery");

    // A 410 storm: every watcher relists; nothing changed, so nothing is published.
    let relists = stack.link().upstream.relists;
    let rv = view.resource_version();
    store.expire_all_watches();
    floodgate_e2e::until(30, "the link relisted", async || {
        stack.link().upstream.relists >= relists + 5
    })
    .await;
    // The same proof after the relists: api's roll is the first slice event, and api's
    // objects alone were published since.
    cluster.roll_pod("api", 1);
    let got = next_slice_event(&mut events, 10, "converges").await;
    assert_eq!(
        got, "apply api-00000",
        "consumers saw no spurious DELETE/ADD"
    );
    let since = floodgate_e2e::published_since(&view, rv);
    assert!(
        !since.is_empty() && since.iter().all(|(_, name)| name.starts_with("api")),
        "a relist without changes publishes nothing: {since:?}"
    );
}

/// A link whose remote cannot be reached reports Degraded and answers 503 with
/// retryAfterSeconds; /readyz waits for it; the other link serves as if nothing happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_link_harms_no_other_and_holds_readiness() {
    use floodgate_link_crd::{LinkSpec, LinksFile, NamedLink, RemoteSpec};
    let store = Arc::new(SimStore::new(46, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    let sim = floodgate_e2e::RunningSim::start(store, "remote")
        .await
        .expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let good = dir.path().join("good.kubeconfig");
    std::fs::write(&good, sim.kubeconfig()).expect("write");
    let spec = |path: &str| {
        LinkSpec::with_remote(RemoteSpec {
            kubeconfig_path: Some(path.to_owned()),
            ..Default::default()
        })
    };
    let cfg = floodgate::run::RunConfig {
        links: LinksFile {
            links: vec![
                NamedLink {
                    name: "good".into(),
                    spec: spec(&good.display().to_string()),
                },
                NamedLink {
                    name: "broken".into(),
                    spec: spec("/nonexistent/kubeconfig"),
                },
            ],
        },
        serving: floodgate::serving::ServeConfig {
            listen: "127.0.0.1:0".parse().expect("addr"),
            admin_listen: "127.0.0.1:0".parse().expect("addr"),
            grpc_listen: "127.0.0.1:0".parse().expect("addr"),
            state_dir: dir.path().join("state"),
            tls: floodgate::credentials::TlsSource::SelfSigned,
            hosts: vec![],
            admin_token_file: None,
            limits: Default::default(),
            shutdown_timeout: floodgate::server::DEFAULT_SHUTDOWN_TIMEOUT,
            link_starts_per_second: floodgate::link::DEFAULT_LINK_STARTS_PER_SECOND,
        },
    };
    let running = floodgate::run::start(cfg).await.expect("floodgate");
    let good_client =
        floodgate_e2e::gateway::client_from(&running.kubeconfig("good").expect("good"))
            .await
            .expect("client");
    let services: Api<Service> = Api::all(good_client);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(list) = services.list(&ListParams::default()).await {
            assert_eq!(list.items.len(), 1);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the good link serves"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let broken = running
        .links
        .iter()
        .find(|l| l.name == "broken")
        .expect("broken link");
    // The link says "connecting to the remote" until its first attempt fails: wait for that.
    let mut state = broken.state.clone();
    // The guard `wait_for` returns is dropped at once: holding it while borrowing again could
    // deadlock against the link's next update.
    let failed = tokio::time::timeout(
        Duration::from_secs(10),
        state.wait_for(|s| s.message.contains("kubeconfig")),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    assert!(
        failed,
        "the broken link names its kubeconfig: {}",
        broken.state.borrow().message
    );
    assert_eq!(broken.state.borrow().phase, Phase::Degraded);
    // kube-rs retries 503s by itself; ask once, by hand.
    let token = std::fs::read_to_string(dir.path().join("state/tokens/broken")).expect("token");
    let answer = https_get(
        running.facade_addr,
        running.ca_pem.as_deref().expect("tls"),
        "/links/broken/api/v1/services",
        token.trim(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(
        answer.contains("\"retryAfterSeconds\":1") && answer.contains("ServiceUnavailable"),
        "{answer}"
    );
    let readyz = reqwest_lite(running.admin_addr, "/readyz").await;
    assert!(
        readyz.starts_with("HTTP/1.1 503") && readyz.contains("broken"),
        "{readyz}"
    );
    let livez = reqwest_lite(running.admin_addr, "/livez").await;
    assert!(livez.starts_with("HTTP/1.1 200"), "{livez}");
    running.stop().await;
}

/// One HTTPS/1.1 GET with a bearer token, the whole response as text.
async fn https_get(addr: std::net::SocketAddr, ca_pem: &str, path: &str, token: &str) -> String {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("ca")).expect("add ca");
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let mut s = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("tls");
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A plain HTTP/1.1 GET on loopback, the whole response as text.
async fn reqwest_lite(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}
