//! A contained service is served whole: a surge written in a real cluster's order (issue 32).
//!
//! The pods of a surge start and turn Ready first, and are quiet from then on; then the
//! exported Service is written; then the EndpointSlice controller names the pods, slice by
//! slice. A gateway that skipped the pods while nobody wanted them must go back for them once
//! an endpoint names them, contained service or not, or a consumer that resolves as Linkerd's
//! destination does (each ready endpoint looked up by its `targetRef` pod) drops every address.
//!
//! kube-sim runs in this process; `floodgate run` follows it with `endpointsPerService: 2000`;
//! 3,000 Ready pods, then the Service, then 30 slices of 100 naming them: the service is
//! contained. The `consumer` process behind Floodgate must settle to no ready endpoint without
//! its pod (waiting at most 2 s) and hold at least one ready endpoint of the service; the calm
//! service beside it stays whole. Twice: with Floodgate following the surge as it is written,
//! and with Floodgate started after the slices exist (a cold start during the flood).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate_e2e::RunningSim;
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::flood::contained_services;
use floodgate_e2e::process::{Consumer, ConsumerStats, Floodgate};
use floodgate_e2e::sim::SimStore;
use floodgate_link_crd::{LinkSpec, RemoteSpec};

const SURGE: &str = "surge";
const SURGE_KEY: &str = "prod/surge";
const PODS: usize = 3_000;

fn spec() -> LinkSpec {
    let mut spec = LinkSpec::with_remote(RemoteSpec::default());
    spec.quarantine.when.endpoints_per_service = 2_000;
    spec
}

/// A remote with one calm exported service of 3 ready pods.
async fn remote() -> (Cluster, RunningSim) {
    let store = Arc::new(SimStore::new(1, 100_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 3, true);
    let sim = RunningSim::start(store, "remote-token")
        .await
        .expect("kube-sim");
    (cluster, sim)
}

/// The surge in a real cluster's order, with the pauses a real one leaves between its steps
/// (pacing the writer, not waiting for an outcome).
async fn surge(cluster: &mut Cluster) {
    cluster.start_pods(SURGE, true, PODS);
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.create_service(SURGE);
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.name_pods(SURGE, 1);
}

async fn synced_consumer(dir: &Path, floodgate: &Floodgate) -> Consumer {
    let consumer = Consumer::start(
        dir,
        "via-floodgate",
        &floodgate.consumer_kubeconfig().expect("kubeconfig"),
    )
    .expect("consumer");
    poll(60, "the consumer synced", || async {
        consumer.stats().synced.then_some(())
    })
    .await;
    consumer
}

/// Polls `check` every 200 ms until it gives a value, for at most `secs`.
async fn poll<T, F: Future<Output = Option<T>>>(
    secs: u64,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what} within {secs} s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn figures(s: &ConsumerStats) -> String {
    format!(
        "surge: {} ready, {} without their pod ({} for > 2 s); web: {} ready, {} without \
         their pod; the consumer holds {} slices, {} pods",
        s.ready_of(SURGE_KEY),
        s.ready_without_pod.of(SURGE_KEY),
        s.ready_without_pod_settled.of(SURGE_KEY),
        s.ready_of("prod/web"),
        s.ready_without_pod.of("prod/web"),
        s.slices,
        s.pods
    )
}

/// The service is contained; then the consumer behind Floodgate holds at least one ready
/// endpoint of it and none without its pod, and the calm service whole.
async fn served_whole(floodgate: &Floodgate, consumer: &Consumer) {
    poll(30, "the surge contained", || async {
        let link = floodgate.link_state().await;
        contained_services(&link)
            .iter()
            .any(|c| c == SURGE_KEY)
            .then_some(())
    })
    .await;
    // The service's frozen view reaches the consumer (its ready endpoints), and the pods
    // they name follow within the 2 s an endpoint may wait: allow 20 s for both, then say
    // what the consumer held.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = consumer.stats();
        let whole = s.ready_of(SURGE_KEY) > 0
            && s.ready_without_pod.of(SURGE_KEY) == 0
            && s.ready_of("prod/web") == 3
            && s.ready_without_pod.of("prod/web") == 0;
        if whole {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the contained service served whole within 20 s of its containment: {}",
            figures(&s)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Settled, it stays so: no endpoint lacks its pod for more than 2 s over the next 3 s.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let s = consumer.stats();
        assert_eq!(
            s.ready_without_pod_settled.total,
            0,
            "after settling: {}",
            figures(&s)
        );
        assert!(s.ready_of(SURGE_KEY) > 0, "after settling: {}", figures(&s));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surge_in_a_real_clusters_order_is_contained_and_served_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut cluster, sim) = remote().await;
    let floodgate = Floodgate::start(dir.path(), "east", &sim.kubeconfig(), spec())
        .await
        .expect("floodgate");
    let consumer = synced_consumer(dir.path(), &floodgate).await;
    surge(&mut cluster).await;
    served_whole(&floodgate, &consumer).await;
    consumer.stop().await.expect("consumer stops");
    floodgate.stop().await.expect("floodgate stops");
    sim.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_after_the_surge_serves_the_contained_service_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut cluster, sim) = remote().await;
    surge(&mut cluster).await;
    let floodgate = Floodgate::start(dir.path(), "east", &sim.kubeconfig(), spec())
        .await
        .expect("floodgate");
    let consumer = synced_consumer(dir.path(), &floodgate).await;
    served_whole(&floodgate, &consumer).await;
    consumer.stop().await.expect("consumer stops");
    floodgate.stop().await.expect("floodgate stops");
    sim.stop();
}
