//! What a link shows the rest of Floodgate (the admin API, metrics, status, readiness), and
//! how its task makes it from the engine and the upstream's counters.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use floodgate_link_crd::Phase;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::churn::flood::Reason;
use crate::churn::quarantine::{State, StateName, Transition};
use crate::churn::{Counters, Engine};
use crate::model::NsName;
use crate::upstream::UpstreamCounters;

/// What a link shows the rest of Floodgate, in its parts. Its JSON (the parts flattened into
/// one object) is what the admin API and status read.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkState {
    /// Healthy, Throttled, Quarantined or Degraded.
    pub phase: Phase,
    /// True once the first complete upstream sync was published.
    pub synced: bool,
    /// Why the link is Degraded or Quarantined, for people.
    pub message: String,
    /// True once the link has reached its remote.
    pub connected: bool,
    /// The engine's totals.
    pub counters: Counters,
    /// What the engine holds and has waiting.
    #[serde(flatten)]
    pub engine: EngineStatus,
    /// What the upstream watchers saw.
    #[serde(flatten)]
    pub upstream: UpstreamStatus,
    /// The link's quarantine.
    #[serde(flatten)]
    pub quarantine: QuarantineStatus,
    /// Its services' containment.
    #[serde(flatten)]
    pub containment: ContainmentStatus,
}

/// What a link's engine holds and has waiting.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineStatus {
    /// Relevant upstream events in the last complete second.
    pub events_last_second: u64,
    /// Upstream objects held.
    pub objects_held: usize,
    /// Upstream objects held, by kind: what the link costs in memory.
    pub objects_by_kind: BTreeMap<&'static str, usize>,
    /// Of the EndpointSlices held, those held deflated: the slices of services with more
    /// endpoints upstream than `caps.maxEndpointsPerService`, kept for the cap to choose
    /// from at about a fifth of their JSON's size.
    pub slices_deflated: usize,
    /// Groups waiting to be published: coalescing, in line, or waiting for tokens.
    pub pending: usize,
    /// How long published changes waited, from their arrival to their publication. For
    /// `/metrics`.
    #[serde(skip)]
    pub publication_delays: crate::churn::Delays,
}

/// What a link's upstream watchers saw since the link started.
#[derive(Clone, Debug, Default, Serialize)]
pub struct UpstreamStatus {
    /// Watch errors (each followed by a backoff and a retry).
    #[serde(rename = "upstreamErrors")]
    pub errors: u64,
    /// Relists (initial lists included).
    #[serde(rename = "upstreamRelists")]
    pub relists: u64,
    /// Watch errors that were undecodable JSON.
    #[serde(rename = "upstreamDecodeErrors")]
    pub decode_errors: u64,
    /// Relists Floodgate forced: a watch that could not resume or lost a frame.
    #[serde(rename = "upstreamForcedRelists")]
    pub forced_relists: u64,
    /// Requests and watches the remote refused our credentials for (401, 403).
    #[serde(rename = "upstreamRefusals")]
    pub refusals: u64,
    /// Objects refused for being over the size limit.
    #[serde(rename = "upstreamOversized")]
    pub oversized: u64,
    /// Pod events not decoded because no published endpoint names the pod.
    #[serde(rename = "upstreamPodsSkipped")]
    pub pods_skipped: u64,
    /// Resource watchers running against the remote now: one per resource on the replica
    /// that reads it, 0 on one that follows a Lease holder.
    #[serde(rename = "upstreamWatchers")]
    pub watchers: u64,
    /// On a replica that follows the Lease holder: snapshots of the holder's view it took.
    #[serde(rename = "followedSnapshots")]
    pub followed_snapshots: u64,
    /// On a replica that follows the Lease holder: the holder's changes it took one by one.
    #[serde(rename = "followedChanges")]
    pub followed_changes: u64,
    /// Objects applied or deleted, per resource kind (initial lists included).
    #[serde(rename = "upstreamEventsByKind")]
    pub events_by_kind: BTreeMap<&'static str, u64>,
    /// How each watcher takes its lists (`streaming` or `paged`), per resource kind.
    #[serde(rename = "upstreamListStrategies")]
    pub list_strategies: BTreeMap<&'static str, &'static str>,
    /// True while the remote answers: connected, and no watcher failing (the link's health).
    /// For `/metrics`.
    #[serde(skip)]
    pub reachable: bool,
    /// Outages of the remote (each begins with a watcher's failure and ends when the remote
    /// answers again). For `/metrics`.
    #[serde(skip)]
    pub outages: u64,
}

/// A link's quarantine.
#[derive(Clone, Debug, Default, Serialize)]
pub struct QuarantineStatus {
    /// The quarantine machine's state: `Active`, `Quarantined` or `Rechecking`.
    #[serde(rename = "quarantineState")]
    pub state: StateName,
    /// The reason, when quarantined.
    #[serde(rename = "quarantineReason")]
    pub reason: Option<String>,
    /// When the quarantine in force began (the engine's clock: convert at the edges).
    #[serde(skip)]
    pub since: Option<Instant>,
    /// The figures (measurements and thresholds) that tripped the quarantine in force.
    #[serde(rename = "quarantineFigures")]
    pub figures: BTreeMap<String, i64>,
    /// State changes since the link started.
    #[serde(rename = "quarantineTransitions")]
    pub transitions: u64,
}

/// A link's contained services.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ContainmentStatus {
    /// The services contained now (at most `quarantine.when.containedServices` + 1: past that
    /// the link is quarantined and contains no more), by name.
    pub contained: Vec<ContainedService>,
    /// Containment transitions since the link started, by cause (`ServiceEventRate`,
    /// `Released`, `RecheckPassed`..).
    #[serde(rename = "containmentTransitions")]
    pub transitions: BTreeMap<&'static str, u64>,
}

/// A contained service, as the link shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainedService {
    /// The service.
    pub service: NsName,
    /// `Contained` or `Rechecking`.
    pub state: StateName,
    /// What contained it.
    pub reason: Reason,
    /// For people.
    pub message: String,
    /// The measurements and thresholds that contained it.
    pub figures: BTreeMap<String, i64>,
    /// When it was contained (the engine's clock: convert at the edges).
    #[serde(skip)]
    pub since: Instant,
    /// When its auto-release re-check starts, if it has one (the engine's clock).
    #[serde(skip)]
    pub next_check: Option<Instant>,
}

pub(super) fn link_state(engine: &Engine, counters: &UpstreamCounters) -> LinkState {
    let (message, quarantine) = match engine.state() {
        State::Active => (String::new(), None),
        State::Quarantined(q) | State::Rechecking { quarantine: q, .. } => {
            (q.trigger.message.clone(), Some(q))
        }
    };
    LinkState {
        phase: engine.phase(),
        synced: engine.synced_once(),
        message,
        connected: true,
        counters: engine.counters(),
        engine: EngineStatus {
            events_last_second: engine.events_last_second(),
            objects_held: engine.objects_held(),
            objects_by_kind: (engine.objects_by_kind().into_iter())
                .map(|(k, n)| (k.name(), n))
                .collect(),
            slices_deflated: engine.slices_deflated(),
            pending: engine.pending(),
            publication_delays: engine.publication_delays().clone(),
        },
        upstream: upstream_status(counters),
        quarantine: QuarantineStatus {
            state: engine.state_name(),
            reason: quarantine.map(|q| q.trigger.reason.to_string()),
            since: quarantine.map(|q| q.since),
            figures: quarantine
                .map(|q| q.trigger.figures.clone())
                .unwrap_or_default(),
            transitions: 0,
        },
        containment: ContainmentStatus {
            contained: (engine.contained().into_iter())
                .map(|c| ContainedService {
                    service: c.service,
                    state: c.state,
                    reason: c.quarantine.trigger.reason,
                    message: c.quarantine.trigger.message,
                    figures: c.quarantine.trigger.figures,
                    since: c.quarantine.since,
                    next_check: c.quarantine.next_check,
                })
                .collect(),
            transitions: BTreeMap::new(),
        },
    }
}

/// The upstream's counters, read now; `reachable` is the caller's to say.
fn upstream_status(counters: &UpstreamCounters) -> UpstreamStatus {
    let kinds = crate::model::Kind::ALL;
    UpstreamStatus {
        errors: counters.errors.load(Ordering::Relaxed),
        relists: counters.relists.load(Ordering::Relaxed),
        decode_errors: counters.decode_errors.load(Ordering::Relaxed),
        forced_relists: counters.forced_relists.load(Ordering::Relaxed),
        refusals: counters.refusals.load(Ordering::Relaxed),
        oversized: counters.oversized.load(Ordering::Relaxed),
        pods_skipped: counters.pods_skipped.load(Ordering::Relaxed),
        watchers: counters.watchers.load(Ordering::Relaxed),
        followed_snapshots: counters.followed_snapshots.load(Ordering::Relaxed),
        followed_changes: counters.followed_changes.load(Ordering::Relaxed),
        events_by_kind: (kinds.iter())
            .map(|k| (k.name(), counters.events_of(*k)))
            .collect(),
        list_strategies: (kinds.iter())
            .map(|k| (k.name(), counters.strategy_of(*k)))
            .filter(|(_, s)| *s != crate::upstream::strategy::ListStrategy::Unknown)
            .map(|(k, s)| (k, s.name()))
            .collect(),
        reachable: false,
        outages: counters.health.outages(),
    }
}

/// Where a link's state goes.
pub(super) struct Outputs {
    pub state: watch::Sender<LinkState>,
    /// Every service containment transition, as it happens (for Events).
    pub transitions: broadcast::Sender<Transition>,
    pub version: watch::Sender<Option<Value>>,
    pub has_servers: watch::Sender<bool>,
}

/// Publishes the link's state. Until the remote answers, the link is Degraded (unless it is
/// quarantined) and keeps the message the connect loop wrote; once connected, it is Degraded
/// while its watchers cannot reach the remote (the view is served all the same).
pub(super) fn publish_state(
    engine: &Engine,
    counters: &UpstreamCounters,
    connected: bool,
    mirrored: bool,
    transitions: &Tally,
    out: &Outputs,
) {
    let mut state = link_state(engine, counters);
    state.connected = connected;
    // A view that held the holder's whole view is served, whoever publishes into it next.
    state.synced |= mirrored;
    state.upstream.reachable = connected && counters.health.unreachable().is_none();
    state.quarantine.transitions = transitions.link;
    (state.containment.transitions).clone_from(&transitions.services);
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
            || s.upstream.list_strategies != state.upstream.list_strategies
            || s.message != state.message
            || s.connected != state.connected
            || s.upstream.reachable != state.upstream.reachable
            || s.upstream.outages != state.upstream.outages
            || s.engine.pending != state.engine.pending
            || s.quarantine.transitions != state.quarantine.transitions
            || s.containment.transitions != state.containment.transitions
            || s.containment.contained != state.containment.contained
            || s.engine.objects_by_kind != state.engine.objects_by_kind
            || s.engine.slices_deflated != state.engine.slices_deflated;
        *s = state;
        changed
    });
}

/// The transitions a link has made since it started.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Of the link's quarantine.
    pub link: u64,
    /// Of its services' containment, by cause.
    pub services: std::collections::BTreeMap<&'static str, u64>,
}
