//! A hub of links in one `floodgate run` process ([`floodgate_e2e::hub`], the many-links row of
//! `make bench` at a tenth of its size): links that start together reach their remote in turn
//! (`--link-starts-per-second`), and every one of them serves. And the many-small-services row
//! whole: what a served object costs beside its JSON.

use floodgate_e2e::hub::{self, HubPlan};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_links_at_four_starts_a_second_list_their_remote_in_turn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = HubPlan {
        links: 12,
        services: 1,
        slices: 110,
        starts_per_second: 4,
        idle_secs: 0,
    };
    let o = hub::run(dir.path(), &plan).await.expect("the hub");
    // Each link opens its watches (a streaming list each against kube-sim) once it has dialled.
    assert!(
        o.lists >= 3 * 12,
        "the remote served {} lists and watches",
        o.lists
    );
    // Two links dial at once, the other ten a quarter of a second apart: the last link dials
    // 2.5 s after the first (a slow machine only spreads them more), and lists once it has
    // dialled; 2 s leaves the first link half a second to dial more slowly than the last.
    assert!(
        o.lists_spread_s >= 2.0,
        "12 links at 4 a second reached the remote within {:.2} s",
        o.lists_spread_s
    );
    // The ten that waited are counted (a retried dial would wait again: at least ten).
    assert!(
        o.dials_paced >= 10,
        "floodgate_link_dials_paced_total is {}",
        o.dials_paced
    );
    // Every link holds its service's 110 slices, and serves 100 of them: the 1,000 endpoints
    // of `caps.maxEndpointsPerService` of its 1,100.
    assert!(
        o.upstream_objects >= 12 * 110,
        "{} objects held",
        o.upstream_objects
    );
    assert!(o.view_bytes > 0, "nothing served");
    // The service is over the cap: each link holds its slices deflated, for the cap to
    // choose from (`floodgate_upstream_slices_deflated`).
    assert_eq!(o.slices_deflated, 12 * 110, "slices held deflated");
}

/// The many-small-services row of `make bench` (1,000 exported services of 10 EndpointSlices of
/// 10 endpoints, naming 100,000 pods that are not there): every slice is served, no pod is
/// fetched (the pod list, begun once the slices were in, answered every named pod: it fetched
/// 4,096 of them one by one, and no other pod while those stayed absent), and Floodgate's
/// resident memory stays within 3x the JSON it serves. It held 6.2x until the history stopped
/// keeping a second copy of the slices' JSON, 3.9x (this dev build) until the engine kept a
/// named pod by its hash, not its name, and 3.0x until a served slice was held deflated (2.2x
/// since); the bench reports the figure against the 2x target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_small_services_are_served_within_three_times_their_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = HubPlan {
        links: 1,
        services: 1000,
        slices: 10,
        starts_per_second: 0,
        idle_secs: 0,
    };
    let o = hub::run(dir.path(), &plan).await.expect("the hub");
    // 1,000 services and their 10,000 slices, held upstream.
    assert!(
        o.upstream_objects >= 11_000,
        "{} objects held",
        o.upstream_objects
    );
    // Every slice served: 10,000 of about 2.4 KB.
    let json_mib = o.view_bytes as f64 / (1024.0 * 1024.0);
    assert!(json_mib > 20.0, "{json_mib:.1} MiB of JSON served");
    let ratio = o.steady_kib as f64 / 1024.0 / json_mib;
    println!(
        "RSS {:.1} MiB beside {json_mib:.1} MiB of JSON served: {ratio:.1}x",
        o.steady_kib as f64 / 1024.0
    );
    assert!(ratio <= 3.0, "RSS {ratio:.1}x the JSON served");
    assert_eq!(o.pods_fetched, 0, "pods fetched one by one");
    assert_eq!(o.slices_deflated, 0, "no service is over the cap");
}
