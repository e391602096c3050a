//! A remote of 200,000 pods, listed by the real `floodgate` process through a fault-injecting
//! proxy: kube-sim serves the lists in pages of the size kube-rs asks for (500), as an API
//! server does from etcd. Floodgate keeps only the pods behind exported services, so its memory
//! stays bounded while the whole remote streams past it, on the first list and on a relist
//! after the remote lost its history. Figures are printed; the bound is asserted.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use floodgate_e2e::chaos::{Chaos, PlainSim, REMOTE_TOKEN};
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::procs::{Floodgate, memory_kib};
use floodgate_e2e::sim::{SimStore, kubeconfig};
use floodgate_e2e::until;
use floodgate_link_crd::{LinkSpec, RemoteSpec};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams};
use serde_json::Value;

const PODS: usize = 200_000;

/// Floodgate's peak resident memory may not pass this while 200,000 pods stream past it. It
/// holds the 3 pods it serves; what it needs beyond its idle size is a page being decoded.
const PEAK_LIMIT_MIB: u64 = 256;

/// The same bound when the remote sends all 200,000 pods in one body (about 300 MB of JSON).
const WHOLE_PEAK_LIMIT_MIB: u64 = 2048;

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The pods the link's consumers are served, and the services.
async fn served(fg: &Floodgate) -> (usize, Vec<String>) {
    let yaml = fg.consumer_kubeconfig().expect("consumer kubeconfig");
    let client = floodgate_e2e::gateway::client_from(&yaml)
        .await
        .expect("client");
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("LIST pods");
    let services = Api::<Service>::all(client)
        .list(&ListParams::default())
        .await
        .expect("LIST services");
    (
        pods.items.len(),
        services
            .items
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect(),
    )
}

/// Pods received from the remote so far (lists included), as the admin API counts them.
fn pods_seen(state: &Value) -> u64 {
    state["upstreamEventsByResource"]["Pod"]
        .as_u64()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_of_200000_pods_is_listed_in_pages_and_memory_stays_bounded() {
    let built = Instant::now();
    let store = Arc::new(SimStore::new(201, 10_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 3, true);
    cluster.add_service("batch", false);
    cluster.scale("batch", PODS - 3, false);
    eprintln!("remote of {PODS} pods built in {:?}", built.elapsed());

    let sim = PlainSim::start(store.clone(), REMOTE_TOKEN)
        .await
        .expect("kube-sim");
    let chaos = Chaos::start(&sim.url()).await.expect("proxy");
    let dir = tempfile::tempdir().expect("tempdir");
    let remote = kubeconfig(&chaos.url(), REMOTE_TOKEN, None, "big");
    let lists_before = sim.api.counters.lists.load(Ordering::Relaxed);
    let started = Instant::now();
    let fg = Floodgate::start(
        dir.path(),
        "east",
        &remote,
        LinkSpec::with_remote(RemoteSpec::default()),
    )
    .await
    .expect("floodgate");
    let pid = fg.pid().expect("pid");
    until(
        120,
        "the first list of every pod went through",
        async || pods_seen(&fg.link_state().await) >= PODS as u64,
    )
    .await;
    let first = started.elapsed();
    let (rss, peak) = memory_kib(pid).expect("memory");
    let pages = sim.api.counters.lists.load(Ordering::Relaxed) - lists_before;
    eprintln!(
        "first sync: {PODS} pods in {first:?}, {pages} list requests; floodgate RSS {:.1} MiB, peak {:.1} MiB",
        mib(rss),
        mib(peak)
    );
    assert!(
        pages >= (PODS / 500) as u64,
        "the pods came in pages of 500: {pages} lists"
    );
    let state = fg.link_state().await;
    assert_eq!(state["phase"], "Healthy", "{state}");
    assert!(
        state["counters"]["objectsHeld"]
            .as_u64()
            .unwrap_or(u64::MAX)
            < 100,
        "only what exported services need is held: {state}"
    );
    let (pods, services) = served(&fg).await;
    assert_eq!((pods, services), (3, vec!["web".to_owned()]));

    // The remote goes away, moves on and forgets its history: every kind relists, the pods'
    // 200,000 again.
    chaos.kill();
    cluster.scale("web", 4, true);
    store.expire_all_watches();
    chaos.restart().await.expect("restart");
    let relisted = Instant::now();
    until(120, "the relist of every pod went through", async || {
        pods_seen(&fg.link_state().await) >= 2 * PODS as u64
    })
    .await;
    until(30, "the view converged", async || served(&fg).await.0 == 4).await;
    let (rss, peak) = memory_kib(pid).expect("memory");
    eprintln!(
        "relist: {PODS} pods in {:?}; floodgate RSS {:.1} MiB, peak {:.1} MiB",
        relisted.elapsed(),
        mib(rss),
        mib(peak)
    );
    let state = fg.link_state().await;
    assert_eq!(state["phase"], "Healthy", "{state}");
    assert!(
        mib(peak) < PEAK_LIMIT_MIB as f64,
        "floodgate's peak {:.1} MiB is under {PEAK_LIMIT_MIB} MiB",
        mib(peak)
    );

    // The same again from a remote that ignores `limit`: 200,000 pods in one body, which
    // kube-rs reads whole before decoding it. Floodgate's memory follows the body's size for
    // that moment, and comes back; the link stays healthy and converges.
    chaos.faults.strip_limit.store(true, Ordering::Relaxed);
    chaos.kill();
    cluster.scale("web", 5, true);
    store.expire_all_watches();
    chaos.restart().await.expect("restart");
    let whole = Instant::now();
    until(120, "the whole-body relist went through", async || {
        pods_seen(&fg.link_state().await) >= 3 * PODS as u64
    })
    .await;
    until(30, "the view converged", async || served(&fg).await.0 == 5).await;
    let (rss, peak) = memory_kib(pid).expect("memory");
    eprintln!(
        "relist in one body: {PODS} pods in {:?}; floodgate RSS {:.1} MiB, peak {:.1} MiB",
        whole.elapsed(),
        mib(rss),
        mib(peak)
    );
    let state = fg.link_state().await;
    assert_eq!(state["phase"], "Healthy", "{state}");
    assert!(
        mib(peak) < WHOLE_PEAK_LIMIT_MIB as f64,
        "floodgate's peak {:.1} MiB is under {WHOLE_PEAK_LIMIT_MIB} MiB",
        mib(peak)
    );
    fg.stop().await.expect("stop");
}
