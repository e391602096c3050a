//! A remote whose exported service is already over `endpointsPerService` when Floodgate starts
//! (`floodgate run`), nothing changing there: the service is contained from the state Floodgate
//! lists, within 5 s of the start, and served whole: every endpoint served as ready has its pod
//! served (guarantee 7), as a consumer resolving pods by `targetRef` would check.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::gateway::Stack;
use floodgate_e2e::sim::SimStore;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_over_its_threshold_at_the_start_is_contained_and_served_whole() {
    let store = Arc::new(SimStore::new(7, 10_000));
    let mut cluster = Cluster::exported(store.clone(), &["web"], 3);
    cluster.add_service("injector", true);
    cluster.scale("injector", 250, true);
    let mut spec = Stack::default_spec();
    spec.quarantine.when.endpoints_per_service = 200;
    spec.caps.max_endpoints_per_service = 100;
    let started = tokio::time::Instant::now();
    let stack = Stack::start(store, spec).await.expect("stack");
    floodgate_e2e::until(5, "the injector is contained", async || {
        stack
            .link()
            .containment
            .contained
            .iter()
            .any(|c| c.service.to_string() == "prod/injector")
    })
    .await;
    eprintln!("contained {:?} after the start", started.elapsed());

    let consumer = stack.consumer().await.expect("client");
    let slices: Api<EndpointSlice> = Api::all(consumer.clone());
    let pods: Api<Pod> = Api::all(consumer);
    let mut last = (0, 0);
    let mut resolved = async || {
        let (Ok(s), Ok(p)) = (
            slices.list(&ListParams::default()).await,
            pods.list(&ListParams::default()).await,
        ) else {
            return false;
        };
        let held: BTreeSet<String> = p
            .items
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let ready: Vec<String> = s
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
            .filter_map(|e| e.target_ref.as_ref().and_then(|r| r.name.clone()))
            .collect();
        let missing = ready.iter().filter(|n| !held.contains(*n)).count();
        last = (ready.len(), missing);
        !ready.is_empty() && missing == 0
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !resolved().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {} ready endpoints served without their pod",
            last.1,
            last.0
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
