//! `make demo`: the discovery-flood incident, replayed through one link's churn engine.
//!
//! A remote cluster has three calm exported services and one exported Deployment that is scaled
//! to N crash-looping pods (20,000 by default). Two consumers follow it: one wired straight to the
//! remote API (it receives every pod and slice event), one through Floodgate (it receives the
//! engine's publications). Simulated time runs in 100 ms steps; a table is printed every second.
//! The flood quarantines the link; the remote is fixed; an operator releases the link and the
//! consumer converges. This runs the real engine in-process; the network path (kube-sim, the
//! Kubernetes facade, real clients) is exercised by the scenario tests as it lands.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use floodgate::churn::object::{Kind, Object, SERVICE_NAME_LABEL};
use floodgate::churn::{Change, Effect, Engine};
use floodgate::view::View;
use floodgate_link_crd::{KubeDuration, LinkSpec, Phase, RemoteSpec};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, PodStatus, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::time::Instant;

/// Replays the discovery-flood incident through Floodgate's churn engine.
#[derive(Debug, Parser)]
struct Args {
    /// Pods the bad Deployment scales to.
    #[arg(long, default_value_t = 20_000)]
    pods: u32,
    /// Small and fast: 2,000 pods, no pauses (CI's smoke test).
    #[arg(long)]
    smoke: bool,
    /// Wall-clock pause per simulated second, in milliseconds.
    #[arg(long, default_value_t = 150)]
    pace_ms: u64,
}

const STEP: Duration = Duration::from_millis(100);
const CALM: [&str; 3] = ["web", "api", "billing"];
const BAD: &str = "injector";

fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("prod".into()),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn service(name: &str) -> Object {
    Object::Service(Arc::new(Service {
        metadata: meta(name, &[("mirror.linkerd.io/exported", "remote-discovery")]),
        ..Default::default()
    }))
}

fn pod(name: &str, ready: bool) -> Object {
    Object::Pod(Arc::new(Pod {
        metadata: meta(name, &[]),
        status: Some(PodStatus {
            phase: Some(if ready { "Running" } else { "CrashLoopBackOff" }.into()),
            ..Default::default()
        }),
        ..Default::default()
    }))
}

/// The EndpointSlice controller's view of `svc`: at most 100 endpoints per slice.
fn slices(svc: &str, pods: &[(u32, bool)], generation: u64) -> Vec<Object> {
    pods.chunks(100)
        .enumerate()
        .map(|(n, chunk)| {
            let eps = chunk
                .iter()
                .map(|(i, ready)| Endpoint {
                    addresses: vec![format!("10.{}.{}.{}", generation % 200, i / 256, i % 256)],
                    conditions: Some(EndpointConditions {
                        ready: Some(*ready),
                        ..Default::default()
                    }),
                    target_ref: Some(ObjectReference {
                        kind: Some("Pod".into()),
                        name: Some(format!("{svc}-{i}")),
                        namespace: Some("prod".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect();
            Object::EndpointSlice(Arc::new(EndpointSlice {
                address_type: "IPv4".into(),
                endpoints: Some(eps),
                metadata: meta(&format!("{svc}-{n}"), &[(SERVICE_NAME_LABEL, svc)]),
                ports: None,
            }))
        })
        .collect()
}

/// The simulated remote cluster.
struct Remote {
    bad_pods: Vec<(u32, bool)>,
    calm_gen: HashMap<&'static str, u64>,
    flip_cursor: usize,
}

impl Remote {
    fn all_objects(&self) -> Vec<Object> {
        let mut out = vec![service(BAD)];
        for svc in CALM {
            out.push(service(svc));
            let pods: Vec<(u32, bool)> = (0..3).map(|i| (i, true)).collect();
            out.extend(slices(svc, &pods, self.calm_gen[svc]));
            out.extend((0..3).map(|i| pod(&format!("{svc}-{i}"), true)));
        }
        out.extend(slices(BAD, &self.bad_pods, 0));
        out.extend(
            self.bad_pods
                .iter()
                .map(|(i, r)| pod(&format!("{BAD}-{i}"), *r)),
        );
        out
    }
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.pods = 2_000;
        args.pace_ms = 0;
    }
    let mut spec = LinkSpec::with_remote(RemoteSpec {
        kubeconfig_path: Some("/demo/remote.kubeconfig".into()),
        ..RemoteSpec::default()
    });
    spec.quarantine.when.events_per_second = 500;
    spec.quarantine.when.sustained_for = KubeDuration::from_secs(5);
    spec.quarantine.when.endpoints_per_service = 50_000;

    println!(
        "Floodgate demo: incident 2 (discovery flood), {} crash-looping pods",
        args.pods
    );
    println!(
        "link: quiet {} max {}, budget {}/s burst {} per link, {}/s burst {} per service, cap {} endpoints/service",
        spec.coalesce.quiet,
        spec.coalesce.max,
        spec.rate_limit.per_link.updates_per_second,
        spec.rate_limit.per_link.burst,
        spec.rate_limit.per_service.updates_per_second,
        spec.rate_limit.per_service.burst,
        spec.caps.max_endpoints_per_service
    );
    println!(
        "quarantine when > {} relevant events/s for {}\n",
        spec.quarantine.when.events_per_second, spec.quarantine.when.sustained_for
    );

    let start = Instant::now();
    let kinds = [Kind::Service, Kind::EndpointSlice, Kind::Pod];
    let view = View::new(std::process::id(), 100_000);
    let mut engine = Engine::new(&spec, &kinds, view.clone(), start);
    let mut remote = Remote {
        bad_pods: Vec::new(),
        calm_gen: CALM.iter().map(|s| (*s, 0)).collect(),
        flip_cursor: 0,
    };
    let relist = |engine: &mut Engine, remote: &Remote, now| {
        for k in kinds {
            engine.ingest(Change::InitStart(k), now);
        }
        for o in remote.all_objects() {
            engine.ingest(Change::Apply(o), now);
        }
        for k in kinds {
            engine.ingest(Change::InitDone(k), now);
        }
    };
    relist(&mut engine, &remote, start);
    engine.poll(start);
    let mut rx = view.list_and_watch(Kind::Service).1;

    let (mut direct_total, mut via_total, mut upstream_this_second) = (0u64, 0u64, 0u64);
    let mut calm_changed: HashMap<String, Instant> = HashMap::new();
    let mut staleness: Vec<Duration> = Vec::new();
    let mut upstream_running = true;
    let mut quarantined_at = None;
    let mut released_at = None;
    println!(
        "{:>4}  {:>13}  {:>15}  {:>15}  {:>11}  {:>12}  {:>14}",
        "t(s)",
        "upstream ev/s",
        "direct consumer",
        "via Floodgate",
        "phase",
        "objects held",
        "served objects"
    );
    let steps = 45 * 10;
    for step in 1..=steps {
        let now = start + STEP * step;
        let second = step / 10;
        let mut events: Vec<Change> = Vec::new();
        // t=2s: the bad rollout scales the Deployment up over 3 s.
        if (20..50).contains(&step) {
            let per_step = args.pods / 30;
            let first = remote.bad_pods.len() as u32;
            for i in first..first + per_step {
                remote.bad_pods.push((i, false));
                events.push(Change::Apply(pod(&format!("{BAD}-{i}"), false)));
            }
            events.extend(
                slices(BAD, &remote.bad_pods, 0)
                    .into_iter()
                    .map(Change::Apply),
            );
        }
        // The crash loop: every pod flips about every 2 s; the slices follow.
        if step >= 50 && !remote.bad_pods.is_empty() {
            let n = remote.bad_pods.len();
            for _ in 0..n / 20 {
                let c = remote.flip_cursor % n;
                remote.bad_pods[c].1 = !remote.bad_pods[c].1;
                let (i, r) = remote.bad_pods[c];
                events.push(Change::Apply(pod(&format!("{BAD}-{i}"), r)));
                remote.flip_cursor += 1;
            }
            events.extend(
                slices(BAD, &remote.bad_pods, 0)
                    .into_iter()
                    .map(Change::Apply),
            );
        }
        // t=32s: the remote's owners roll back the bad config.
        if step == 320 {
            remote.bad_pods.truncate(3);
            remote.bad_pods.iter_mut().for_each(|p| p.1 = true);
        }
        // Calm services roll a pod every 4 s.
        if step % 40 == 15 {
            let svc = CALM[(step / 40) as usize % CALM.len()];
            let g = remote.calm_gen.entry(svc).or_default();
            *g += 1;
            let pods: Vec<(u32, bool)> = (0..3).map(|i| (i, true)).collect();
            events.extend(slices(svc, &pods, *g).into_iter().map(Change::Apply));
            // Staleness is measured while the link follows its remote; changes made during a
            // quarantine arrive at release, by design.
            if engine.phase() != Phase::Quarantined {
                calm_changed.insert(format!("{svc}-0"), now);
            }
        }
        direct_total += events.len() as u64;
        upstream_this_second += events.len() as u64;
        if upstream_running {
            for e in events {
                engine.ingest(e, now);
            }
        }
        // t=36s: an operator releases the link through the admin API.
        if step == 360 && engine.phase() == Phase::Quarantined {
            engine
                .release()
                .map_err(|e| anyhow::anyhow!("release: {e}"))?;
            released_at = Some(second);
        }
        engine.poll(now);
        for effect in engine.take_effects() {
            match effect {
                Effect::StopUpstream => upstream_running = false,
                // The simulated remote lists pods after their slices: nothing to fetch.
                Effect::FetchPods(_) => {}
                Effect::StartUpstream => {
                    upstream_running = true;
                    relist(&mut engine, &remote, now);
                    engine.poll(now);
                }
                Effect::Transition(t) => {
                    if t.to == "Quarantined" {
                        quarantined_at = Some(second);
                    }
                    println!(
                        "      >> {} -> {}: {} ({})",
                        t.from, t.to, t.reason, t.message
                    );
                }
            }
        }
        while let Ok(ev) = rx.try_recv() {
            via_total += 1;
            if let Some(changed) = ev
                .object
                .object
                .meta()
                .name
                .as_ref()
                .and_then(|n| calm_changed.remove(n))
            {
                staleness.push(now - changed);
            }
        }
        if step % 10 == 0 {
            let served: usize = Kind::ALL.iter().map(|k| view.len(*k)).sum();
            println!(
                "{:>4}  {:>13}  {:>15}  {:>15}  {:>11}  {:>12}  {:>14}",
                second,
                upstream_this_second,
                direct_total,
                via_total,
                engine.phase().as_str(),
                engine.objects_held(),
                served
            );
            upstream_this_second = 0;
            if args.pace_ms > 0 {
                std::thread::sleep(Duration::from_millis(args.pace_ms));
            }
        }
    }

    let c = engine.counters();
    staleness.sort();
    let p99 = staleness
        .get(staleness.len().saturating_sub(1) * 99 / 100)
        .copied()
        .unwrap_or_default();
    println!("\nSummary (simulated {} s):", steps / 10);
    println!("  events a direct consumer received      {direct_total:>10}");
    println!("  events the Floodgate consumer received {via_total:>10}");
    println!(
        "  ratio                                  {:>10.0}x fewer",
        direct_total as f64 / via_total.max(1) as f64
    );
    println!(
        "  publications (budgeted updates)        {:>10}",
        c.downstream_updates
    );
    println!(
        "  endpoints truncated by the cap (now)   {:>10}",
        c.endpoints_truncated
    );
    println!(
        "  calm-service changes seen, p99 delay   {:>10?} over {} changes",
        p99,
        staleness.len()
    );
    println!(
        "  quarantined at t={}s, released at t={}s, phase now {}",
        quarantined_at.map_or("-".into(), |s| s.to_string()),
        released_at.map_or("-".into(), |s| s.to_string()),
        engine.phase().as_str()
    );
    anyhow::ensure!(
        quarantined_at.is_some(),
        "the flood should have quarantined the link"
    );
    anyhow::ensure!(
        engine.phase() == Phase::Healthy,
        "the link should be healthy after release"
    );
    anyhow::ensure!(
        view.len(Kind::Pod) <= 3 + 9,
        "after release only the calm pods and 3 injector pods are served"
    );
    println!("  the status page arrives with the admin API (see README, Status)");
    Ok(())
}
