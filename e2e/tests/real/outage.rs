//! The outage: the real API server SIGKILLed (it resets its connections and refuses new ones),
//! down for 15 s, then started again against the same etcd; and the same server sent SIGTERM,
//! which stops listening at once but keeps its open watches silent until it exits.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate_e2e::admin;
use floodgate_e2e::process::Floodgate;
use floodgate_e2e::real::{RealKube, Resolver, ResolverReport};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::PostParams;

use super::{CALM, calm_services, calm_whole, floodgate, resolver_whole, spec, warns_since};

/// The link's phases, each with the seconds since the timeline began.
pub(super) type Timeline = Arc<Mutex<Vec<(f64, String)>>>;

/// The link's phase every 250 ms from the admin API, with the time since `since`.
pub(super) fn phase_timeline(
    fg: &Floodgate,
    since: Instant,
) -> (Timeline, tokio::task::JoinHandle<()>) {
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

/// The first time at or after `from` (seconds) the timeline shows `phase`.
pub(super) fn first(timeline: &Timeline, phase: &str, from: f64) -> Option<f64> {
    let t = timeline.lock().expect("timeline");
    t.iter()
        .find(|(at, p)| p == phase && *at >= from)
        .map(|(at, _)| *at)
}

/// The real server with the calm services, Floodgate in front of it, a resolver through it
/// once they are whole (and its report then), and a consumer's Services.
async fn serving() -> (RealKube, Floodgate, Resolver, ResolverReport, Api<Service>) {
    let kube = RealKube::start().await.expect("the real API server");
    calm_services(&kube).await;
    let fg = floodgate(&kube, spec()).await;
    let (through, report) = resolver_whole(&kube, &fg, "through", 60).await;
    let served: Api<Service> = Api::all(fg.consumer().await.expect("consumer client"));
    (kube, fg, through, report, served)
}

/// Floodgate serves its view throughout; the link is `Degraded` within 10 s of the kill and
/// `Healthy` within 10 s of the server's return (guarantee 8); a service created after the
/// restart reaches a consumer through Floodgate within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn outage_api_server_killed_and_restarted_against_the_same_etcd() {
    let (mut kube, fg, mut through, before, served) = serving().await;

    let t0 = Instant::now();
    let (timeline, task) = phase_timeline(&fg, t0);
    let from = fg.log_text().len();
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
    let (restart, restarted) = (Instant::now(), t0.elapsed().as_secs_f64());
    kube.start_apiserver().await.expect("the API server again");
    let back = restart.elapsed();
    let returned = t0.elapsed().as_secs_f64();
    floodgate_e2e::until(
        10,
        "the link Healthy after the server's return",
        async || first(&timeline, "Healthy", restarted).is_some(),
    )
    .await;

    let reached = change_after_the_restart(&kube, &served, &mut through).await;
    task.abort();
    let after = through.latest().unwrap_or_default();
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
    println!("  Degraded at {degraded:?} s, the server back at {returned:.1} s");
    let warns = warns_since(&fg, from);
    println!("  WARN lines since the kill: {warns:#?}");
    assert!(
        degraded.is_some_and(|t| t <= 10.0),
        "Degraded within 10 s: {timeline:?}"
    );
    assert!(warns.len() <= 2, "at most two WARN lines: {warns:#?}");
}

/// SIGTERM, as a rolling upgrade sends it: the server stops listening but keeps every open
/// watch, silent, for about a minute before it exits. The link is `Degraded` within 10 s of
/// the SIGTERM (the liveness probe, not the watches, sees it), its view served throughout;
/// `Healthy` within 10 s of the server's return, and a change made after it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn outage_api_server_stopped_gracefully_is_seen_within_seconds() {
    let (mut kube, fg, mut through, _, served) = serving().await;

    let t0 = Instant::now();
    let (timeline, task) = phase_timeline(&fg, t0);
    let from = fg.log_text().len();
    kube.terminate_apiserver().expect("SIGTERM");
    floodgate_e2e::until(10, "the link Degraded after the SIGTERM", async || {
        first(&timeline, "Degraded", 0.0).is_some()
    })
    .await;
    let list = served.list(&Default::default()).await.expect("served");
    assert_eq!(list.items.len(), CALM, "the view is served while Degraded");
    kube.wait_apiserver_exit(Duration::from_secs(120))
        .await
        .expect("the API server exits");
    let restarted = t0.elapsed().as_secs_f64();
    kube.start_apiserver().await.expect("the API server again");
    let ready = t0.elapsed().as_secs_f64();
    floodgate_e2e::until(
        10,
        "the link Healthy after the server's return",
        async || first(&timeline, "Healthy", restarted).is_some(),
    )
    .await;
    let reached = change_after_the_restart(&kube, &served, &mut through).await;
    task.abort();
    let degraded = first(&timeline, "Degraded", 0.0);
    let healthy = first(&timeline, "Healthy", restarted);
    let timeline = timeline.lock().expect("timeline").clone();
    println!(
        "graceful stop: SIGTERM at 0 s, Degraded at {degraded:?} s; the server exited at {restarted:.1} s, ready again at {ready:.1} s, Healthy at {healthy:?} s"
    );
    println!(
        "  a service created after the restart served through Floodgate in {:.2} s",
        reached.as_secs_f64()
    );
    println!("  link phase timeline (s since the SIGTERM): {timeline:?}");
    let warns = warns_since(&fg, from);
    println!("  WARN lines since the SIGTERM: {warns:#?}");
    assert!(degraded.is_some_and(|t| t <= 10.0), "{timeline:?}");
    assert!(healthy.is_some_and(|t| t - ready <= 10.0), "{timeline:?}");
    assert!(warns.len() <= 2, "at most two WARN lines: {warns:#?}");
}

/// A service created on the remote after its return: how long until Floodgate lists it, once
/// the resolver through Floodgate has it too.
async fn change_after_the_restart(
    kube: &RealKube,
    served: &Api<Service>,
    through: &mut Resolver,
) -> Duration {
    let direct: Api<Service> = Api::namespaced(kube.client().await.expect("client"), "calm");
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "after-outage", "namespace": "calm",
                     "labels": {"mirror.linkerd.io/exported": "true"}},
        "spec": {"ports": [{"port": 80}]}
    }))
    .expect("service");
    let svc = direct
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
    reached
}
