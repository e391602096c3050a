//! The order a consumer receives the view in (DESIGN guarantee 9), judged as the consumers that
//! matter judge it: at each event, not once the view settles.
//!
//! - Linkerd's destination resolves each ready endpoint's pod in its pod cache when it handles
//!   the EndpointSlice event, and drops an address whose pod it does not hold until that slice
//!   changes again ([`EventResolver`]). kube-sim writes pods before the slices naming them, and
//!   drops an endpoint before its pod, with a real cluster's lag ([`CONTROLLER_LAG`]); the
//!   consumer through Floodgate must lose no address a direct one keeps, in a scale-up one pod
//!   at a time, a burst, a scale-down and a rolling update.
//! - Linkerd's service mirror reads a Service's Endpoints from its cache when it handles the
//!   Service's `ADDED`, and ignores an Endpoints `ADDED` that comes after: a service exported
//!   or re-exported must reach it after its Endpoints, every time.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use floodgate_e2e::drivers::{CONTROLLER_LAG, Cluster, EXPORTED};
use floodgate_e2e::gateway::{Stack, client_from};
use floodgate_e2e::replicas::Fleet;
use floodgate_e2e::resolve::EventResolver;
use floodgate_e2e::sim::SimStore;
use floodgate_e2e::until;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::runtime::watcher;
use kube::{Api, Client};

/// The pods `web` has now, as the resolvers name them.
fn pods(names: impl IntoIterator<Item = u32>) -> BTreeSet<String> {
    names.into_iter().map(|i| format!("prod/web-{i}")).collect()
}

/// How long a step may take to reach a consumer here (a loaded 2-core machine); the figures
/// printed are what the comparison is about.
const WITHIN: Duration = Duration::from_secs(10);

/// Waits until both consumers hold `want`, and returns how long each took from `written`.
async fn step(
    via: &EventResolver,
    direct: &EventResolver,
    want: &BTreeSet<String>,
    written: Instant,
) -> (Duration, Duration) {
    direct
        .wait_for("prod/web", want, WITHIN)
        .await
        .expect("direct");
    let d = written.elapsed();
    via.wait_for("prod/web", want, WITHIN)
        .await
        .expect("through Floodgate");
    (written.elapsed(), d)
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

/// A scale-up one pod at a time (3 -> 10), a burst (10 -> 200), a scale-down (200 -> 5) and a
/// rolling update of the 5, each written in a real cluster's order: the consumer that resolves
/// at the event through Floodgate loses no address, as the direct one loses none, and each
/// step reaches it shortly after it reaches the direct one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_address_of_a_scale_up_reaches_a_consumer_that_resolves_at_the_event() {
    let store = Arc::new(SimStore::new(21, 10_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 3, true);
    let stack = Stack::start(store, Stack::default_spec())
        .await
        .expect("stack");
    let via = EventResolver::start(stack.consumer().await.expect("consumer"));
    let direct = EventResolver::start(stack.direct().await.expect("direct"));
    shapes(&mut cluster, &via, &direct, "floodgate run").await;
}

/// The same shapes through a follower replica of `floodgate controller`: the follower
/// republishes its holder's view, and the order holds there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_address_of_a_scale_up_reaches_a_consumer_of_a_follower_replica() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fleet = Fleet::start(dir.path(), &["east"]).await.expect("fleet");
    fleet.add_replica("floodgate-0").await.expect("floodgate-0");
    until(30, "floodgate-0 holds the Lease", async || fleet.held_by(1)).await;
    fleet.add_replica("floodgate-1").await.expect("floodgate-1");
    fleet.all_serve(&["web"]).await.expect("both serve web");
    fleet.cluster.scale_in_order("web", 3, CONTROLLER_LAG).await;
    let holder = fleet.holders()[0].clone().expect("a holder");
    let follower = if holder == "floodgate-0" {
        "floodgate-1"
    } else {
        "floodgate-0"
    };
    let via = EventResolver::start(fleet.consumer(follower, "east").await.expect("consumer"));
    let direct = EventResolver::start(client_from(&fleet.sim.kubeconfig()).await.expect("direct"));
    shapes(&mut fleet.cluster, &via, &direct, "a follower replica").await;
}

/// Drives `web` (3 ready pods, or about to be) through the shapes, each step waited for on
/// both consumers, and asserts what `via` lost and how late it was.
async fn shapes(cluster: &mut Cluster, via: &EventResolver, direct: &EventResolver, path: &str) {
    for r in [via, direct] {
        r.synced(WITHIN).await.expect("synced");
        r.wait_for("prod/web", &pods(0..3), WITHIN)
            .await
            .expect("first sync");
    }

    let (mut through, mut straight) = (Vec::new(), Vec::new());
    for n in 4..=10 {
        // A step after the last one's coalescing window closed: this measures the order's
        // cost, not `coalesce.quiet` (a burst of slice changes waits for it by design).
        tokio::time::sleep(Duration::from_millis(250)).await;
        cluster.scale_in_order("web", n, CONTROLLER_LAG).await;
        let (t, d) = step(via, direct, &pods(0..n as u32), Instant::now()).await;
        through.push(t);
        straight.push(d);
    }
    let scale_up = (p99(through), p99(straight));
    println!(
        "{path}: scale-up 3 -> 10 one pod at a time: p99 {:?} through Floodgate, {:?} direct, from the slice's write",
        scale_up.0, scale_up.1
    );
    cluster.scale_in_order("web", 200, CONTROLLER_LAG).await;
    let (t, d) = step(via, direct, &pods(0..200), Instant::now()).await;
    println!("{path}: burst 10 -> 200: {t:?} through Floodgate, {d:?} direct");
    cluster.scale_in_order("web", 5, CONTROLLER_LAG).await;
    let (t, d) = step(via, direct, &pods(0..5), Instant::now()).await;
    println!("{path}: scale-down 200 -> 5: {t:?} through Floodgate, {d:?} direct");
    // A rolling update: pods 0..5 replaced one by one by pods 200.. (the driver's next names)
    // of a new ReplicaSet, which no endpoint names before the first of them.
    let mut now = pods(0..5);
    let (mut through, mut straight) = (Vec::new(), Vec::new());
    for i in 0..5u32 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        cluster
            .replace_pod_in_order("web", i as usize, CONTROLLER_LAG)
            .await;
        now.remove(&format!("prod/web-{i}"));
        now.insert(format!("prod/web-{}", 200 + i));
        let (t, d) = step(via, direct, &now, Instant::now()).await;
        through.push(t);
        straight.push(d);
    }
    println!(
        "{path}: rolling update of 5 to a new ReplicaSet: p99 {:?} through Floodgate, {:?} direct",
        p99(through),
        p99(straight)
    );

    assert_eq!(direct.lost(), 0, "direct: {:?}", direct.lost_by_service());
    assert_eq!(
        via.lost(),
        0,
        "through {path}, addresses lost at the slice event: {:?}",
        via.lost_by_service()
    );
    assert!(
        via.slice_events() > 10,
        "{} slice events",
        via.slice_events()
    );
    // Each step within direct's time + 50 ms at p99 (a fetch of the new pod and the lead it
    // is given), with room for a loaded 2-core machine.
    let (t, d) = scale_up;
    assert!(
        t <= d + Duration::from_millis(50) + Duration::from_millis(100),
        "a scale-up step took {t:?} through {path}, {d:?} direct"
    );
}

/// What a consumer that handles Services as Linkerd's service mirror does saw: for each
/// Service `ADDED`, whether its Endpoints were in the cache then with an address.
#[derive(Default)]
struct MirrorSeen {
    services: HashSet<String>,
    endpoints: HashMap<String, usize>,
    /// (service, addresses of its Endpoints held at its ADDED).
    added: Vec<(String, usize)>,
}

/// Two watchers, Services and Endpoints, each in a task (two informers); at a Service's
/// `ADDED` its Endpoints are read from the cache.
fn mirror(client: Client) -> (Arc<Mutex<MirrorSeen>>, Vec<tokio::task::JoinHandle<()>>) {
    let seen = Arc::new(Mutex::new(MirrorSeen::default()));
    let key = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        format!(
            "{}/{}",
            m.namespace.as_deref().unwrap_or_default(),
            m.name.as_deref().unwrap_or_default()
        )
    };
    let eps = {
        let seen = seen.clone();
        let api: Api<Endpoints> = Api::all(client.clone());
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(Ok(ev)) = events.next().await {
                let mut s = seen.lock().unwrap_or_else(PoisonError::into_inner);
                match ev {
                    watcher::Event::Apply(e) | watcher::Event::InitApply(e) => {
                        let n = (e.subsets.iter().flatten())
                            .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
                            .sum();
                        s.endpoints.insert(key(&e.metadata), n);
                    }
                    watcher::Event::Delete(e) => {
                        s.endpoints.remove(&key(&e.metadata));
                    }
                    _ => {}
                }
            }
        })
    };
    let svcs = {
        let seen = seen.clone();
        let api: Api<Service> = Api::all(client);
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(Ok(ev)) = events.next().await {
                let mut s = seen.lock().unwrap_or_else(PoisonError::into_inner);
                match ev {
                    watcher::Event::Apply(svc) => {
                        let k = key(&svc.metadata);
                        if s.services.insert(k.clone()) {
                            let held = s.endpoints.get(&k).copied().unwrap_or(0);
                            s.added.push((k, held));
                        }
                    }
                    watcher::Event::InitApply(svc) => {
                        s.services.insert(key(&svc.metadata));
                    }
                    watcher::Event::Delete(svc) => {
                        s.services.remove(&key(&svc.metadata));
                    }
                    _ => {}
                }
            }
        })
    };
    (seen, vec![eps, svcs])
}

/// A service unexported and exported again, 20 times: at each `ADDED` of its Service, the
/// consumer already holds its Endpoints with every address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reexported_service_reaches_the_mirror_after_its_endpoints() {
    let store = Arc::new(SimStore::new(22, 10_000));
    let mut cluster = Cluster::exported(store.clone(), &["web", "api"], 3);
    let stack = Stack::start(store, Stack::default_spec())
        .await
        .expect("stack");
    let (seen, tasks) = mirror(stack.consumer().await.expect("consumer"));
    let count = |svc: &str| {
        let s = seen.lock().unwrap_or_else(PoisonError::into_inner);
        (s.services.contains(svc), s.added.len())
    };
    let wait = |want: bool, added: usize| {
        let count = &count;
        async move {
            let end = Instant::now() + WITHIN;
            loop {
                let (held, n) = count("prod/web");
                if held == want && n >= added {
                    return;
                }
                assert!(Instant::now() < end, "web held {held}, {n} ADDED seen");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    wait(true, 0).await;
    for run in 1..=20 {
        cluster.relabel("web", EXPORTED, None);
        wait(false, run - 1).await;
        cluster.relabel("web", EXPORTED, Some("remote-discovery"));
        wait(true, run).await;
    }
    let s = seen.lock().unwrap_or_else(PoisonError::into_inner);
    let empty: Vec<_> = s.added.iter().filter(|(_, n)| *n != 3).collect();
    assert!(
        empty.is_empty(),
        "ADDED with its Endpoints not held (or not whole): {empty:?} of {}",
        s.added.len()
    );
    assert_eq!(s.added.len(), 20);
    tasks.iter().for_each(tokio::task::JoinHandle::abort);
}
