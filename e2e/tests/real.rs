//! The real-server lane (`make test-real`): Floodgate in front of a real kube-apiserver 1.32 and
//! etcd built from Go modules (`e2e/realkube/`), with client-go consumers and a driver that plays
//! the remote's controllers. Every test is ignored by `make test` (it needs the Go binaries);
//! `make test-real` runs them with `--run-ignored only -E 'binary(real)'`.
//!
//! - drop-in: kubectl and client-go informers in all four modes through Floodgate;
//! - S1 at lane scale: 10,000 crash-looping pods behind one exported service, the resolver direct
//!   and through Floodgate side by side;
//! - the outage: the API server SIGKILLed and restarted against the same etcd;
//! - cluster mode: the shipped manifests applied under real RBAC, `floodgate controller` as its
//!   ServiceAccount; and the same with a verb it needs taken out of its Role.
//!
//! Guarantees 7 and 8 are asserted here against the real server: a contained service is served
//! whole (no ready endpoint without its pod, in the resolver's cache), and the link is
//! `Degraded` within 10 s of the outage.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate_e2e::modes::Mode;
use floodgate_e2e::process::{Floodgate, Launch, proc_status_kib};
use floodgate_e2e::real::{Crashloop, RealKube, Resolver, ResolverMode, ResolverReport, kubectl};
use floodgate_e2e::{admin, cluster, sim};
use floodgate_link_crd::{LinkSpec, RemoteSpec};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::PostParams;

/// The calm services the driver creates (namespace `calm`, 3 pods each).
const CALM: usize = 3;

fn is_calm(service: &str) -> bool {
    service.starts_with("calm/")
}

/// Ready endpoints of the calm services in a report.
fn calm_ready(r: &ResolverReport) -> u64 {
    r.ready_by_service
        .iter()
        .filter(|(s, _)| is_calm(s))
        .map(|(_, n)| n)
        .sum()
}

/// The calm services whole in `r`: every one of their 3 pods ready, none without its pod.
fn calm_whole(r: &ResolverReport) -> bool {
    r.synced && calm_ready(r) == (CALM * 3) as u64 && r.without_pod_where(is_calm) == 0
}

fn spec() -> LinkSpec {
    LinkSpec::with_remote(RemoteSpec::default())
}

/// Creates the calm services and exits.
async fn calm_services(kube: &RealKube) -> serde_json::Value {
    Crashloop::setup(
        kube.kubeconfig_path(),
        &["--calm-services", &CALM.to_string()],
        kube.dir(),
        60,
    )
    .await
    .expect("the driver creates the calm services")
}

/// Floodgate (`floodgate run`) with link `east` in front of `kube`.
async fn floodgate(kube: &RealKube, spec: LinkSpec) -> Floodgate {
    Floodgate::start(
        &kube.dir().join("floodgate"),
        "east",
        &kube.kubeconfig().expect("kubeconfig"),
        spec,
    )
    .await
    .expect("floodgate starts and is ready")
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

/// Names in `kubectl get ... -o name` output.
fn names(out: &str) -> BTreeSet<String> {
    out.lines().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn drop_in_kubectl_and_client_go_in_four_modes_through_floodgate() {
    let kube = RealKube::start().await.expect("the real API server");
    calm_services(&kube).await;
    let fg = floodgate(&kube, spec()).await;
    let through = write(
        kube.dir(),
        "through.kubeconfig",
        &fg.consumer_kubeconfig().expect("consumer kubeconfig"),
    );

    // kubectl: the exported services as the real server lists them, through Floodgate.
    let direct = names(
        &kube
            .kubectl(&[
                "get",
                "services",
                "-A",
                "-l",
                "mirror.linkerd.io/exported=true",
                "-o",
                "name",
            ])
            .await
            .expect("kubectl direct"),
    );
    assert_eq!(direct.len(), CALM, "{direct:?}");
    let mut served = BTreeSet::new();
    floodgate_e2e::until(
        30,
        "kubectl lists the exported services through Floodgate",
        async || {
            served = kubectl(&through, &["get", "services", "-A", "-o", "name"])
                .await
                .map(|o| names(&o))
                .unwrap_or_default();
            served == direct
        },
    )
    .await;
    let table = kubectl(&through, &["get", "endpointslices", "-n", "calm"])
        .await
        .expect("kubectl get endpointslices through Floodgate");
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"],
        "{table}"
    );
    let pods = kubectl(&through, &["get", "pods", "-n", "calm", "-o", "name"])
        .await
        .expect("kubectl get pods through Floodgate");
    assert_eq!(pods.lines().count(), CALM * 3, "{pods}");
    let refused = kubectl(&through, &["delete", "service", "-n", "calm", "calm-0"]).await;
    assert!(refused.is_err(), "a delete through Floodgate is refused");

    // client-go informers, direct once and through Floodgate in all four modes.
    let consumer = fg.consumer_kubeconfig().expect("consumer kubeconfig");
    let mut direct = Resolver::start(
        &kube.kubeconfig().expect("kubeconfig"),
        ResolverMode::new(true, true),
        kube.dir(),
        "direct",
    )
    .expect("resolver direct");
    let mut resolvers: Vec<Resolver> = ResolverMode::ALL
        .iter()
        .enumerate()
        .map(|(i, mode)| {
            Resolver::start(&consumer, *mode, kube.dir(), &format!("through-{i}"))
                .expect("resolver through Floodgate")
        })
        .collect();
    let d = direct
        .wait_for(60, "the calm services whole", calm_whole)
        .await
        .expect("direct");
    println!("direct ({}): synced in {} ms", direct.mode, d.sync_ms);
    for r in &mut resolvers {
        let report = r
            .wait_for(60, "the calm services whole", calm_whole)
            .await
            .expect("through Floodgate");
        println!(
            "through Floodgate ({}): synced in {} ms, {} ready endpoints, {} without their pod, {} watch errors",
            r.mode,
            report.sync_ms,
            report.ready_endpoints,
            report.ready_without_pod,
            report.watch_errors
        );
        assert_eq!(report.watch_errors, 0, "{}: {report:?}", r.mode);
        assert_eq!(
            report.cached.get("services"),
            Some(&(CALM as u64)),
            "{}: only the exported services: {report:?}",
            r.mode
        );
        assert!(
            report
                .cached
                .get("replicasets")
                .is_some_and(|n| *n >= CALM as u64),
            "{}: the pods' owners, metadata only: {report:?}",
            r.mode
        );
    }
}

/// The Python `kubernetes` client (`tests/python/list_and_watch.py`, which reads namespace
/// `prod`) through Floodgate in front of the real server: a list, then a watch that sees a service
/// created on the remote and one relabelled there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn drop_in_python_client_lists_and_watches_through_floodgate() {
    use tokio::io::AsyncBufReadExt as _;
    let kube = RealKube::start().await.expect("the real API server");
    Crashloop::setup(
        kube.kubeconfig_path(),
        &["--calm-services", "2", "--calm-namespace", "prod"],
        kube.dir(),
        60,
    )
    .await
    .expect("the driver creates the services");
    let fg = floodgate(&kube, spec()).await;
    let config = write(
        kube.dir(),
        "python.kubeconfig",
        &fg.consumer_kubeconfig().expect("consumer kubeconfig"),
    );
    let python = std::env::var("FLOODGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/list_and_watch.py"
    );
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .arg(&config)
        .arg("2")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python runs (make test-real sets FLOODGATE_PYTHON to its virtualenv)");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("a line within 30 s")
            .expect("read")
            .expect("the script is still running (is the kubernetes module installed?)")
    };
    assert_eq!(next().await, "LISTED calm-0,calm-1");
    assert_eq!(next().await, "WATCHING");
    let services: Api<Service> = Api::namespaced(kube.client().await.expect("client"), "prod");
    let cache: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cache", "labels": {"mirror.linkerd.io/exported": "true"}},
        "spec": {"ports": [{"port": 80}]}
    }))
    .expect("service");
    services
        .create(&PostParams::default(), &cache)
        .await
        .expect("create");
    assert_eq!(next().await, "EVENT ADDED cache");
    let patch = serde_json::json!({"metadata": {"labels": {"tier": "front"}}});
    services
        .patch(
            "calm-0",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("relabel");
    assert_eq!(next().await, "EVENT MODIFIED calm-0");
    assert_eq!(next().await, "DONE");
}

/// Pods behind the flooding service (`FLOODGATE_REAL_S1_PODS` overrides).
fn s1_pods() -> usize {
    std::env::var("FLOODGATE_REAL_S1_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// S1 at the lane's scale. The driver creates one exported service of 10,000 pods, about 2/3
/// Ready and named by 100 slices, and three calm services; Floodgate starts in front of it (the
/// flooding service over `endpointsPerService`, so contained from the first look), then the
/// resolver, direct and through Floodgate, syncs; then pods flip between Ready and
/// CrashLoopBackOff for a minute while the calm services roll a pod every 10 s. Events counted from
/// the sync on. Once the churn is under way, a second Floodgate starts cold and must be ready and
/// serve the calm services whole within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn s1_flood_of_crash_looping_pods_at_lane_scale() {
    let pods = s1_pods();
    let kube = RealKube::start().await.expect("the real API server");
    let started = Instant::now();
    let mut driver = Crashloop::start(
        kube.kubeconfig_path(),
        &[
            "--pods",
            &pods.to_string(),
            "--calm-services",
            &CALM.to_string(),
            "--rate",
            "300",
            "--duration",
            "60s",
            "--calm-roll-every",
            "10s",
            "--wait-stdin",
        ],
        kube.dir(),
    )
    .expect("the driver");
    let ready = driver.wait_ready(600).await.expect("the driver's objects");
    println!("setup: {ready} ({:.1} s)", started.elapsed().as_secs_f64());

    let mut s1 = spec();
    // The flooding service is contained from the first look; the calm ones never are.
    s1.quarantine.when.endpoints_per_service = 5_000;
    let cold = Instant::now();
    let fg = floodgate(&kube, s1.clone()).await;
    println!(
        "Floodgate ready {:.1} s after its start, {} pods on the remote",
        cold.elapsed().as_secs_f64(),
        pods
    );
    let mut direct = Resolver::start(
        &kube.kubeconfig().expect("kubeconfig"),
        ResolverMode::new(true, true),
        kube.dir(),
        "direct",
    )
    .expect("resolver direct");
    let mut through = Resolver::start(
        &fg.consumer_kubeconfig().expect("consumer kubeconfig"),
        ResolverMode::new(true, true),
        kube.dir(),
        "through",
    )
    .expect("resolver through Floodgate");
    let d0 = direct
        .wait_for(120, "the calm services whole", calm_whole)
        .await
        .expect("direct");
    let t0 = through
        .wait_for(120, "the calm services whole", calm_whole)
        .await
        .expect("through");
    println!(
        "synced: direct in {} ms, through Floodgate in {} ms",
        d0.sync_ms, t0.sync_ms
    );
    let (d0, t0) = (
        direct.latest().unwrap_or_default(),
        through.latest().unwrap_or_default(),
    );

    driver.go().await.expect("the churn begins");

    // A cold start during the flood: a second Floodgate, started once the churn is under way,
    // ready and serving the calm services whole to a fresh resolver within 10 s.
    floodgate_e2e::until(30, "the churn under way", async || {
        driver
            .last_line()
            .is_some_and(|l| l["phase"] == "churn" && l["flips"].as_u64() >= Some(300))
    })
    .await;
    let cold = Instant::now();
    let cold_fg = Floodgate::start(
        &kube.dir().join("floodgate-cold"),
        "east",
        &kube.kubeconfig().expect("kubeconfig"),
        s1,
    )
    .await
    .expect("a cold Floodgate during the flood is ready");
    let cold_ready = cold.elapsed();
    let mut cold_resolver = Resolver::start(
        &cold_fg.consumer_kubeconfig().expect("consumer kubeconfig"),
        ResolverMode::new(true, true),
        kube.dir(),
        "cold",
    )
    .expect("resolver through the cold Floodgate");
    cold_resolver
        .wait_for(30, "the calm services whole", calm_whole)
        .await
        .expect("the cold Floodgate serves the calm services");
    let cold_served = cold.elapsed();
    println!(
        "cold start during the flood: ready in {:.1} s, the calm services whole in a resolver in {:.1} s",
        cold_ready.as_secs_f64(),
        cold_served.as_secs_f64()
    );
    drop(cold_resolver);
    drop(cold_fg);
    assert!(
        cold_served <= Duration::from_secs(10),
        "a cold start during the flood serves the calm services within 10 s: {cold_served:?}"
    );

    let done = driver.wait_exit(180).await.expect("the churn ends");
    let churn = 60.0;
    println!(
        "churn: {done}, about {:.0} writes/s reached",
        (done["writes"].as_f64().unwrap_or(0.0) - ready["writes"].as_f64().unwrap_or(0.0)) / churn
    );
    // The remote is calm again: both take in what is left and converge, the calm services whole.
    let quiet = Duration::from_secs(3);
    direct.settled(60, quiet).await.expect("direct settles");
    through.settled(60, quiet).await.expect("through settles");
    let d1 = direct
        .wait_for(30, "the calm services whole", calm_whole)
        .await
        .expect("direct");
    let t1 = through
        .wait_for(30, "the calm services whole", calm_whole)
        .await
        .expect("through");

    let (events_direct, events_through) = (
        d1.events_total() - d0.events_total(),
        t1.events_total() - t0.events_total(),
    );
    let kib = |pid: Option<u32>| pid.and_then(|p| proc_status_kib(p, "VmHWM")).unwrap_or(0);
    let contained = t1.without_pod_where(|s| s == "flood/flood");
    println!("S1 on the real server, {pods} pods, a minute of churn:");
    println!(
        "  events: direct {events_direct}, through Floodgate {events_through} ({:.0}x fewer)",
        events_direct as f64 / events_through.max(1) as f64
    );
    println!(
        "  resolver peak memory: direct {} KiB, through Floodgate {} KiB",
        kib(direct.pid()),
        kib(through.pid())
    );
    println!("  Floodgate peak RSS: {} KiB", kib(fg.pid()));
    println!(
        "  calm services' most ready endpoints without their pod, any second: direct {:?}, through {:?}",
        direct
            .max_without_pod()
            .into_iter()
            .filter(|(s, _)| is_calm(s))
            .collect::<Vec<_>>(),
        through
            .max_without_pod()
            .into_iter()
            .filter(|(s, _)| is_calm(s))
            .collect::<Vec<_>>()
    );
    println!(
        "  contained service flood/flood through Floodgate: {} ready endpoints served, {contained} without their pod",
        t1.ready_by_service.get("flood/flood").copied().unwrap_or(0)
    );
    println!("  link: {}", fg.link_state().await);

    assert!(
        events_direct > 1000,
        "the flood reached the direct consumer: {d1:?}"
    );
    assert!(
        events_direct >= 100 * events_through.max(1),
        "at least 100x fewer events through Floodgate: {events_direct} / {events_through}"
    );
    assert_eq!(t1.without_pod_where(is_calm), 0, "{t1:?}");
    assert_eq!(
        contained, 0,
        "the contained service is served whole: {t1:?}"
    );
}

/// The link's phases, each with the seconds since the timeline began.
type Timeline = Arc<Mutex<Vec<(f64, String)>>>;

/// The link's phase every 250 ms from the admin API, with the time since `since`.
fn phase_timeline(fg: &Floodgate, since: Instant) -> (Timeline, tokio::task::JoinHandle<()>) {
    let timeline = Timeline::default();
    let (keep, addr) = (timeline.clone(), fg.admin);
    let task = tokio::spawn(async move {
        loop {
            let phase = match admin::call(addr, "GET", "/links/east", None, "").await {
                Ok((200, v)) => v["phase"].as_str().unwrap_or("?").to_owned(),
                _ => "no answer".to_owned(),
            };
            {
                let mut t = keep.lock().expect("timeline");
                if t.last().is_none_or(|(_, p)| *p != phase) {
                    t.push((since.elapsed().as_secs_f64(), phase));
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    (timeline, task)
}

/// The outage: the API server SIGKILLed (it resets its connections and refuses new ones), down
/// for 15 s, then started again against the same etcd. Floodgate serves its view throughout; a
/// service created after the restart reaches a consumer through Floodgate within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn outage_api_server_killed_and_restarted_against_the_same_etcd() {
    let mut kube = RealKube::start().await.expect("the real API server");
    calm_services(&kube).await;
    let fg = floodgate(&kube, spec()).await;
    let mut through = Resolver::start(
        &fg.consumer_kubeconfig().expect("consumer kubeconfig"),
        ResolverMode::new(true, true),
        kube.dir(),
        "through",
    )
    .expect("resolver through Floodgate");
    through
        .wait_for(60, "the calm services whole", calm_whole)
        .await
        .expect("synced");
    let consumer = fg.consumer().await.expect("consumer client");
    let served: Api<Service> = Api::all(consumer);
    let before = through.latest().unwrap_or_default();

    let t0 = Instant::now();
    let (timeline, task) = phase_timeline(&fg, t0);
    kube.kill_apiserver().await.expect("SIGKILL");
    // Floodgate keeps serving its view while the remote is gone.
    for at in [2, 8, 14] {
        tokio::time::sleep_until((t0 + Duration::from_secs(at)).into()).await;
        let list = served
            .list(&Default::default())
            .await
            .expect("Floodgate serves while the remote is down");
        assert_eq!(list.items.len(), CALM, "{at} s into the outage");
        let r = through.latest().unwrap_or_default();
        assert!(calm_whole(&r), "{at} s into the outage: {r:?}");
    }
    tokio::time::sleep_until((t0 + Duration::from_secs(15)).into()).await;
    let restart = Instant::now();
    kube.start_apiserver().await.expect("the API server again");
    let back = restart.elapsed();

    // A change on the remote after its return.
    let direct: Api<Service> = Api::namespaced(kube.client().await.expect("client"), "calm");
    let mut svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "after-outage", "namespace": "calm",
                     "labels": {"mirror.linkerd.io/exported": "true"}},
        "spec": {"ports": [{"port": 80}]}
    }))
    .expect("service");
    svc = direct
        .create(&PostParams::default(), &svc)
        .await
        .expect("create after the restart");
    let changed = Instant::now();
    floodgate_e2e::until(10, "the new service through Floodgate", async || {
        served
            .list(&Default::default())
            .await
            .is_ok_and(|l| l.items.iter().any(|s| s.metadata.uid == svc.metadata.uid))
    })
    .await;
    let reached = changed.elapsed();
    through
        .wait_for(10, "the new service in the resolver's cache", |r| {
            r.cached.get("services") == Some(&(CALM as u64 + 1))
        })
        .await
        .expect("the resolver through Floodgate sees it");
    let after = through.latest().unwrap_or_default();
    // Give the phase a moment to settle before the timeline is printed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    task.abort();
    let timeline = timeline.lock().expect("timeline").clone();
    println!(
        "outage: SIGKILL at 0 s, restarted at 15 s, ready after {:.1} s",
        back.as_secs_f64()
    );
    println!(
        "  a service created after the restart served through Floodgate in {:.2} s",
        reached.as_secs_f64()
    );
    println!("  link phase timeline (s since the kill): {timeline:?}");
    println!(
        "  resolver through Floodgate: watch errors {} before, {} after; events {} before, {} after",
        before.watch_errors,
        after.watch_errors,
        before.events_total(),
        after.events_total()
    );
    let degraded = timeline
        .iter()
        .find(|(_, p)| p == "Degraded")
        .map(|(t, _)| *t);
    println!("  Degraded at {degraded:?} s");
    assert!(
        degraded.is_some_and(|t| t <= 10.0),
        "Degraded within 10 s: {timeline:?}"
    );
}

/// The shipped manifests applied to the real server (RBAC on), link `east` whose remote is the
/// same server (its credentials and consumers' token as Secrets, its Link), and `floodgate
/// controller` started as the `floodgate` ServiceAccount with a token from the TokenRequest API.
/// `role` may rewrite the rendered manifests before they are applied. Returns the controller, not
/// yet waited for.
async fn controller_under_rbac(kube: &RealKube, role: impl Fn(&str) -> String) -> Floodgate {
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
    let rendered = kube
        .kubectl(&["kustomize", &manifests.display().to_string()])
        .await
        .expect("kubectl kustomize manifests/");
    let file = write(kube.dir(), "manifests.yaml", &role(&rendered));
    kube.kubectl(&["apply", "-f", &file.display().to_string()])
        .await
        .expect("kubectl apply of the shipped manifests");
    kube.kubectl(&[
        "wait",
        "--for=condition=established",
        "crd/links.floodgate.dev",
        "--timeout=30s",
    ])
    .await
    .expect("the Link CRD established");
    calm_services(kube).await;

    let client = kube.client().await.expect("client");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), cluster::CREDENTIALS_NS);
    let pp = PostParams::default();
    let remote = kube.kubeconfig().expect("kubeconfig");
    for secret in [
        cluster::mk_secret("east-credentials", "kubeconfig", &remote),
        cluster::mk_secret("floodgate-token-east", "token", &cluster::token("east")),
    ] {
        secrets.create(&pp, &secret).await.expect("secret");
    }
    let links: Api<floodgate_link_crd::Link> = Api::namespaced(client, cluster::NS);
    links
        .create(&pp, &cluster::mk_link("east"))
        .await
        .expect("the Link");

    let token = kube
        .kubectl(&[
            "create",
            "token",
            "floodgate",
            "-n",
            cluster::NS,
            "--duration=1h",
        ])
        .await
        .expect("a token for the floodgate ServiceAccount (TokenRequest)");
    let sa = write(
        kube.dir(),
        "floodgate-sa.kubeconfig",
        &sim::kubeconfig(&kube.url, token.trim(), Some(&kube.ca_pem), "floodgate-sa"),
    );
    Launch::new(Mode::Controller, &kube.dir().join("controller"))
        .cluster(&sa)
        .link("east", &remote, spec())
        .spawn()
        .await
        .expect("floodgate controller")
}

/// The services link `east` serves (`None` while it does not answer).
async fn served_services(fg: &Floodgate) -> Option<usize> {
    let client = fg.consumer().await.ok()?;
    let api: Api<Service> = Api::all(client);
    api.list(&Default::default())
        .await
        .ok()
        .map(|l| l.items.len())
}

/// The link's status phase as the cluster has it.
async fn link_phase(kube: &RealKube) -> Option<String> {
    let links: Api<floodgate_link_crd::Link> =
        Api::namespaced(kube.client().await.ok()?, cluster::NS);
    let link = links.get_opt("east").await.ok()??;
    link.status?.phase.map(|p| format!("{p:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn cluster_mode_under_real_rbac_with_the_shipped_role() {
    let kube = RealKube::start().await.expect("the real API server");
    let mut fg = controller_under_rbac(&kube, str::to_owned).await;
    fg.wait_ready(60).await.expect("the controller is ready");
    let started = Instant::now();
    floodgate_e2e::until(60, "link east serves the calm services", async || {
        served_services(&fg).await == Some(CALM)
    })
    .await;
    println!(
        "cluster mode: link east served {:.1} s after ready",
        started.elapsed().as_secs_f64()
    );
    let mut resolver = Resolver::start(
        &fg.consumer_kubeconfig().expect("consumer kubeconfig"),
        ResolverMode::new(true, true),
        kube.dir(),
        "through",
    )
    .expect("resolver");
    let r = resolver
        .wait_for(60, "the calm services whole", calm_whole)
        .await
        .expect("resolved");
    println!(
        "  resolver through the controller's facade synced in {} ms",
        r.sync_ms
    );
    let mut phase = None;
    floodgate_e2e::until(30, "the Link's status written under RBAC", async || {
        phase = link_phase(&kube).await;
        phase.as_deref().is_some_and(|p| p.contains("Healthy"))
    })
    .await;
    println!("  Link status phase: {phase:?}");
}

/// The same with `list` taken from the Role's rule on Secrets: the controller cannot read the
/// link's credentials, and the link never serves. The shipped Role is not generous by accident.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn cluster_mode_fails_without_a_verb_the_controller_needs() {
    let kube = RealKube::start().await.expect("the real API server");
    let rule = "  - secrets\n  verbs:\n  - list\n  - watch\n";
    let fg = controller_under_rbac(&kube, |yaml| {
        assert!(
            yaml.contains(rule),
            "the shipped Role's rule on Secrets: {yaml}"
        );
        yaml.replace(rule, "  - secrets\n  verbs:\n  - watch\n")
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        assert_eq!(
            served_services(&fg).await,
            None,
            "a link served without its credentials"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "  Link status phase without `list secrets`: {:?}",
        link_phase(&kube).await
    );
}
