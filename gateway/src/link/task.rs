//! The task of one link: connect to the remote (retried with backoff), run the upstream
//! watchers, feed the engine, sleep until its next deadline, carry out its effects, save and
//! clear its quarantine on disk, and publish its state.
//!
//! A link restored quarantined (from disk, or in cluster mode from a peer's view) serves its saved view at once, before the remote
//! answers (which it may never do while the flood lasts), and starts its watchers only when
//! released. Operators' requests are answered while the link is still connecting. New
//! credentials ([`Command::Reconnect`]) replace the connection, not the view: the new upstream's
//! first lists are relists to the engine.

use std::sync::Arc;
use std::time::Duration;

use floodgate_link_crd::{LinkSpec, Phase};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::{BATCH, CONNECT_BACKOFF, Command, Connect, LinkState, UPSTREAM_QUEUE, link_state};
use crate::churn::quarantine::{State, Transition};
use crate::churn::{Change, Effect, Engine};
use crate::model::Kind;
use crate::model::wanted::WantedPods;
use crate::persist::LinkDir;
use crate::persist::contained::ContainedSnapshot;
use crate::upstream::{self, Message, Remote, Upstream, UpstreamCounters};
use crate::view::View;
use backon::BackoffBuilder as _;

/// Where a link's state goes.
pub(super) struct Outputs {
    pub state: watch::Sender<LinkState>,
    /// Every service containment transition, as it happens (for Events).
    pub transitions: broadcast::Sender<Transition>,
    pub version: watch::Sender<Option<Value>>,
    pub has_servers: watch::Sender<bool>,
}

/// Saving and clearing a quarantine and the containments, in order, off the link's task (a view
/// can be megabytes).
enum Persist {
    Save(crate::churn::quarantine::Quarantine, Instant),
    Clear,
    Contained(Vec<ContainedSnapshot>, Instant),
}

/// Persistence requests waiting; transitions are rare, 8 is plenty, and a full queue makes the
/// link wait rather than lose the order of save and clear.
const PERSIST_QUEUE: usize = 8;

#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    spec: LinkSpec,
    connect: Connect,
    view: View,
    (dir, seed): (Option<LinkDir>, Option<crate::churn::restore::Saved>),
    out: Outputs,
    mut commands: mpsc::Receiver<Command>,
    mut shutdown: watch::Receiver<bool>,
) {
    let now = Instant::now();
    // Until discovery says whether the remote serves Linkerd's Servers, expect every kind.
    let mut engine = Engine::new(&spec, &Kind::ALL, view.clone(), now);
    if let Some(saved) = seed {
        engine.restore_quarantined(now, saved);
    }
    if let Some(d) = &dir {
        match d.load(now) {
            Ok(Some(saved)) => {
                tracing::warn!(
                    objects = saved.objects.len(),
                    reason = %saved.trigger.reason,
                    "restored a quarantine from disk: serving its view until released"
                );
                engine.restore_quarantined(now, saved);
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "ignoring the saved quarantine"),
        }
        match d.load_contained(now) {
            Ok(saved) if !saved.is_empty() => {
                tracing::warn!(
                    services = saved.len(),
                    "restored contained services from disk: serving their saved state until released"
                );
                engine.restore_contained(now, saved);
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "ignoring the saved containments"),
        }
    }
    let persist = dir.map(|d| spawn_persister(d, view));

    let counters = Arc::new(UpstreamCounters::default());
    // Wakes the loop to publish the link's state when the remote stops or starts answering.
    let mut unreachable = counters.health.subscribe();
    // The pods the engine wants: the pod watcher decodes only those.
    let wanted = WantedPods::everything();
    engine.mirror_wanted(wanted.clone());
    let (tx, mut rx) = mpsc::channel::<Message>(UPSTREAM_QUEUE);
    let mut remote: Option<Remote> = None;
    let mut connecting = std::pin::pin!(connect_with_backoff(
        connect,
        spec.select.services.clone(),
        &out,
    ));
    let mut generation = 1;
    let mut upstream: Option<Upstream> = None;
    // Pod fetches the engine asked for; aborted with the link.
    let mut fetches = JoinSet::new();
    let mut next_wake: Option<Instant> = None;
    let mut transitions = Tally::default();
    // When the link began, until its first sync is logged.
    let mut first_sync = Some(now);
    // An operator's answer waits until its transition's effects are carried out and the new
    // state is published: whoever reads the link after a 200 sees what the 200 said.
    let mut answer = None;
    loop {
        publish_state(&engine, &counters, remote.is_some(), &transitions, &out);
        let far = Instant::now() + Duration::from_secs(3600);
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            Some(cmd) = commands.recv() => {
                let now = Instant::now();
                let (result, reply) = match cmd {
                    Command::Release(by, reply) => (engine.release(&by), reply),
                    Command::ReleaseService(svc, by, reply) => {
                        (engine.release_service(&svc, now, &by), reply)
                    }
                    // Both are carried out by the engine's next poll: now.
                    Command::FollowContainment(svc, trigger) => {
                        engine.follow_containment(&svc, now, trigger);
                        next_wake = Some(now);
                        continue;
                    }
                    Command::SetDeciding(deciding) => {
                        engine.set_deciding(deciding);
                        next_wake = Some(now);
                        continue;
                    }
                    Command::Quarantine(msg, reply) => (engine.quarantine(now, &msg), reply),
                    Command::Reconnect(super::Reconnect(c)) => {
                        // Messages of the old upstream are told apart by their generation.
                        tracing::info!("new credentials: reconnecting; the view keeps serving");
                        upstream = None;
                        fetches.abort_all();
                        remote = None;
                        generation += 1;
                        connecting.set(connect_with_backoff(
                            c,
                            spec.select.services.clone(),
                            &out,
                        ));
                        continue;
                    }
                };
                // The transition's effects are carried out below with the engine's others.
                answer = Some((reply, result));
            }
            r = &mut connecting, if remote.is_none() => {
                tracing::info!(servers = r.has_servers, "connected to the remote");
                engine.set_kinds(&r.kinds());
                if !matches!(engine.state(), State::Quarantined(_)) {
                    upstream = Some(upstream::start(&r, generation, tx.clone(), counters.clone(), wanted.clone()));
                }
                remote = Some(r);
            }
            Some(msg) = rx.recv() => {
                let now = Instant::now();
                if msg.generation == generation {
                    take(&mut engine, upstream.as_ref(), msg.change, now);
                }
                for _ in 0..BATCH {
                    match rx.try_recv() {
                        Ok(m) if m.generation == generation => {
                            take(&mut engine, upstream.as_ref(), m.change, now);
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            }
            () = sleep_until(next_wake.unwrap_or(far)) => {}
            Some(_) = fetches.join_next(), if !fetches.is_empty() => {}
            Ok(()) = unreachable.changed() => {}
        }
        let now = Instant::now();
        next_wake = engine.poll(now);
        if let Some(began) = first_sync.filter(|_| engine.synced_once()) {
            first_sync = None;
            let held = engine
                .objects_by_kind()
                .map(|(k, n)| format!("{}={n}", k.name()));
            tracing::info!(
                took = ?now.duration_since(began),
                objects = %held.join(" "),
                services = engine.counters().services,
                contained = engine.contained_count(),
                "first sync complete: serving the view"
            );
        }
        for effect in engine.take_effects() {
            match effect {
                Effect::StopUpstream => {
                    upstream = None;
                    fetches.abort_all();
                    tracing::warn!("upstream stopped: the link is quarantined");
                }
                Effect::StartUpstream => {
                    generation += 1;
                    if let Some(r) = &remote {
                        upstream = Some(upstream::start(
                            r,
                            generation,
                            tx.clone(),
                            counters.clone(),
                            wanted.clone(),
                        ));
                        tracing::info!(generation, "upstream restarted");
                    }
                }
                Effect::FetchPods(pods) => {
                    if let Some(r) = &remote {
                        tracing::debug!(pods = pods.len(), "fetching pods kept endpoints point at");
                        fetches.spawn(tracing::Instrument::in_current_span(upstream::fetch_pods(
                            r.client.clone(),
                            pods,
                            generation,
                            tx.clone(),
                            counters.clone(),
                        )));
                    }
                }
                Effect::Transition(t) if t.service.is_some() => {
                    let svc = t.service.as_ref().map(ToString::to_string);
                    tracing::warn!(service = svc.as_deref().unwrap_or_default(), from = t.from.as_str(), to = t.to.as_str(), reason = %t.reason, message = %t.message, "service containment changed");
                    *transitions.services.entry(t.reason.as_str()).or_default() += 1;
                    if let Some(p) = &persist {
                        let _ = p
                            .send(Persist::Contained(contained_snapshot(&engine), now))
                            .await;
                    }
                    // No receiver (standalone mode) is fine.
                    let _ = out.transitions.send(t);
                }
                Effect::Transition(t) => {
                    transitions.link += 1;
                    tracing::warn!(from = t.from.as_str(), to = t.to.as_str(), reason = %t.reason, message = %t.message, "quarantine state changed");
                    if let Some(p) = &persist {
                        let op = match engine.state() {
                            State::Quarantined(q) => Some(Persist::Save(q.clone(), now)),
                            State::Active => Some(Persist::Clear),
                            State::Rechecking { .. } => None,
                        };
                        if let Some(op) = op {
                            let _ = p.send(op).await;
                        }
                    }
                }
            }
        }
        if let Some((reply, result)) = answer.take() {
            publish_state(&engine, &counters, remote.is_some(), &transitions, &out);
            let _ = reply.send(result);
        }
    }
    drop(upstream);
    fetches.abort_all();
    tracing::info!("link stopped");
}

/// Ingests one upstream change; a first list's end, once taken in, may open the pod watcher.
fn take(engine: &mut Engine, upstream: Option<&Upstream>, change: Change, now: Instant) {
    let done = match &change {
        Change::InitDone(kind) => Some(*kind),
        _ => None,
    };
    engine.ingest(change, now);
    if let (Some(kind), Some(u)) = (done, upstream) {
        u.listed(kind);
    }
}

/// The transitions a link has made since it started.
#[derive(Debug, Default)]
struct Tally {
    /// Of the link's quarantine.
    link: u64,
    /// Of its services' containment, by cause.
    services: std::collections::BTreeMap<&'static str, u64>,
}

/// Connects until the remote answers `/version` and discovery. Errors are reported in the
/// link's state as they happen (a quarantined link keeps its quarantine message); the future
/// only ends with a remote.
async fn connect_with_backoff(
    connect: Connect,
    selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    out: &Outputs,
) -> Remote {
    let mut backoffs = CONNECT_BACKOFF.build();
    // The first failure is logged at WARN, the retries at DEBUG, and once more at WARN if the
    // remote stays away past a minute.
    let mut failing: Option<(Instant, bool)> = None;
    loop {
        let attempt = async {
            let client = connect().await?;
            let version = client.apiserver_version().await?;
            let remote = Remote::discover(client, &selector).await?;
            anyhow::Ok((remote, version))
        };
        match attempt.await {
            Ok((remote, version)) => {
                if let Some((since, _)) = failing {
                    tracing::info!(away = ?since.elapsed(), "the remote answers again");
                }
                out.version.send_replace(serde_json::to_value(version).ok());
                out.has_servers.send_replace(remote.has_servers);
                return remote;
            }
            Err(e) => {
                match &mut failing {
                    None => {
                        tracing::warn!(error = %e, "cannot reach the remote; retrying with backoff");
                        failing = Some((Instant::now(), false));
                    }
                    Some((since, noted @ false))
                        if since.elapsed() >= upstream::health::LONG_OUTAGE =>
                    {
                        tracing::warn!(error = %e, away = ?since.elapsed(), "the remote is still unreachable");
                        *noted = true;
                    }
                    Some(_) => tracing::debug!(error = %e, "cannot reach the remote"),
                }
                let message = format!("cannot reach the remote: {e}");
                out.state.send_modify(|s| {
                    if s.phase != Phase::Quarantined {
                        s.phase = Phase::Degraded;
                        s.message.clone_from(&message);
                    }
                });
            }
        }
        // Without a limit on attempts, the builder never runs out.
        tokio::time::sleep(backoffs.next().unwrap_or(Duration::from_secs(3))).await;
    }
}

/// Publishes the link's state. Until the remote answers, the link is Degraded (unless it is
/// quarantined) and keeps the message the connect loop wrote; once connected, it is Degraded
/// while its watchers cannot reach the remote (the view is served all the same).
fn publish_state(
    engine: &Engine,
    counters: &UpstreamCounters,
    connected: bool,
    transitions: &Tally,
    out: &Outputs,
) {
    let mut state = link_state(engine, counters);
    state.connected = connected;
    state.upstream_reachable = connected && counters.health.unreachable().is_none();
    state.quarantine_transitions = transitions.link;
    state
        .containment_transitions
        .clone_from(&transitions.services);
    let quarantined = state.phase == Phase::Quarantined;
    if let (Some(u), true, false) = (counters.health.unreachable(), connected, quarantined) {
        state.phase = Phase::Degraded;
        state.message = u.to_string();
    }
    out.state.send_if_modified(|s| {
        if !connected && !quarantined {
            state.phase = Phase::Degraded;
            state.message.clone_from(&s.message);
        }
        let changed = s.phase != state.phase
            || s.synced != state.synced
            || s.counters != state.counters
            || s.upstream_list_strategies != state.upstream_list_strategies
            || s.message != state.message
            || s.connected != state.connected
            || s.upstream_reachable != state.upstream_reachable
            || s.upstream_outages != state.upstream_outages
            || s.pending != state.pending
            || s.quarantine_transitions != state.quarantine_transitions
            || s.containment_transitions != state.containment_transitions
            || s.contained != state.contained
            || s.objects_by_kind != state.objects_by_kind;
        *s = state;
        changed
    });
}

/// The contained services with the state each published, as served, to save.
fn contained_snapshot(engine: &Engine) -> Vec<ContainedSnapshot> {
    engine
        .contained()
        .into_iter()
        .map(|c| ContainedSnapshot {
            objects: engine
                .published_keys(&c.service)
                .iter()
                .filter_map(|k| engine.view().get(k))
                .filter_map(|s| serde_json::from_slice(&s.json()).ok())
                .collect(),
            service: c.service,
            trigger: c.quarantine.trigger,
            since: c.quarantine.since,
            cooldown: c.quarantine.cooldown,
        })
        .collect()
}

fn spawn_persister(dir: LinkDir, view: View) -> mpsc::Sender<Persist> {
    let (tx, mut rx) = mpsc::channel::<Persist>(PERSIST_QUEUE);
    tokio::spawn(async move {
        while let Some(op) = rx.recv().await {
            let (d, view) = (dir.clone(), view.clone());
            let (what, result) = match op {
                // The view is frozen while quarantined: what it holds now is what is served.
                Persist::Save(q, now) => (
                    "saving the quarantine",
                    tokio::task::spawn_blocking(move || d.save(&q, now, &view)).await,
                ),
                Persist::Clear => (
                    "clearing the quarantine",
                    tokio::task::spawn_blocking(move || d.clear()).await,
                ),
                Persist::Contained(services, now) => (
                    "saving the contained services",
                    tokio::task::spawn_blocking(move || d.save_contained(services, now)).await,
                ),
            };
            match result {
                Ok(Ok(())) => tracing::info!("{what} on disk: done"),
                Ok(Err(e)) => tracing::error!(error = %e, "{what} on disk failed"),
                Err(e) => tracing::error!(error = %e, "the quarantine writer panicked"),
            }
        }
    });
    tx
}
