//! What a link shows the rest of Floodgate (the admin API, metrics, status, readiness), and
//! how its task makes it from the engine and the upstream's counters.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use floodgate_link_crd::Phase;
use serde::Serialize;
use tokio::time::Instant;

use super::task::Outputs;
use crate::churn::flood::Reason;
use crate::churn::quarantine::{State, StateName};
use crate::churn::{Counters, Engine};
use crate::model::NsName;
use crate::upstream::UpstreamCounters;

/// What a link shows the rest of Floodgate.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkState {
    /// Healthy, Throttled, Quarantined or Degraded.
    pub phase: Phase,
    /// True once the first complete upstream sync was published.
    pub synced: bool,
    /// Why the link is Degraded or Quarantined, for people.
    pub message: String,
    /// The quarantine reason, when quarantined.
    pub quarantine_reason: Option<String>,
    /// The engine's totals.
    pub counters: Counters,
    /// Relevant upstream events in the last complete second.
    pub events_last_second: u64,
    /// Upstream objects held.
    pub objects_held: usize,
    /// Upstream watch errors so far.
    pub upstream_errors: u64,
    /// Upstream relists so far (initial lists included).
    pub upstream_relists: u64,
    /// When the quarantine in force began (the engine's clock: convert at the edges).
    #[serde(skip)]
    pub quarantine_since: Option<Instant>,
    /// The figures (measurements and thresholds) that tripped the quarantine in force.
    pub quarantine_figures: BTreeMap<String, i64>,
    /// The quarantine machine's state: `Active`, `Quarantined` or `Rechecking`.
    pub quarantine_state: StateName,
    /// The services contained now (at most `quarantine.when.containedServices` + 1: past that
    /// the link is quarantined and contains no more), by name.
    pub contained: Vec<ContainedService>,
    /// Upstream objects held, by kind: what the link costs in memory.
    pub objects_by_kind: BTreeMap<&'static str, usize>,
    /// Quarantine state changes so far.
    pub quarantine_transitions: u64,
    /// Service containment transitions since the link started, by cause (`ServiceEventRate`,
    /// `Released`, `RecheckPassed`..).
    pub containment_transitions: BTreeMap<&'static str, u64>,
    /// Upstream watch errors that were undecodable JSON.
    pub upstream_decode_errors: u64,
    /// Relists Floodgate forced: a watch that could not resume or lost a frame.
    pub upstream_forced_relists: u64,
    /// Upstream objects refused for being over the size limit.
    pub upstream_oversized: u64,
    /// Upstream pod events not decoded because no published endpoint names the pod.
    pub upstream_pods_skipped: u64,
    /// Objects applied or deleted upstream, per resource kind (initial lists included).
    pub upstream_events_by_kind: BTreeMap<&'static str, u64>,
    /// How each upstream watcher takes its lists (`streaming` or `paged`), per resource kind.
    pub upstream_list_strategies: BTreeMap<&'static str, &'static str>,
    /// True once the link has reached its remote.
    pub connected: bool,
    /// True while the remote answers: connected, and no watcher failing (the link's health).
    /// For `/metrics`.
    #[serde(skip)]
    pub upstream_reachable: bool,
    /// Outages of the remote since the link started (each begins with a watcher's failure
    /// and ends when the remote answers again). For `/metrics`.
    #[serde(skip)]
    pub upstream_outages: u64,
    /// How long published changes waited, from their arrival to their publication. For
    /// `/metrics`.
    #[serde(skip)]
    pub publication_delays: crate::churn::Delays,
    /// Groups waiting to be published: coalescing, in line, or waiting for tokens.
    pub pending: usize,
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
    let (message, quarantine_reason) = match engine.state() {
        State::Active => (String::new(), None),
        State::Quarantined(q) | State::Rechecking { quarantine: q, .. } => (
            q.trigger.message.clone(),
            Some(q.trigger.reason.to_string()),
        ),
    };
    LinkState {
        phase: engine.phase(),
        synced: engine.synced_once(),
        message,
        quarantine_reason,
        counters: engine.counters(),
        publication_delays: engine.publication_delays().clone(),
        upstream_outages: counters.health.outages(),
        upstream_reachable: false,
        events_last_second: engine.events_last_second(),
        objects_held: engine.objects_held(),
        upstream_errors: counters.errors.load(Ordering::Relaxed),
        upstream_relists: counters.relists.load(Ordering::Relaxed),
        quarantine_since: match engine.state() {
            State::Active => None,
            State::Quarantined(q) | State::Rechecking { quarantine: q, .. } => Some(q.since),
        },
        quarantine_figures: quarantine_figures(engine.state()),
        quarantine_state: engine.state_name(),
        contained: engine
            .contained()
            .into_iter()
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
        objects_by_kind: engine
            .objects_by_kind()
            .into_iter()
            .map(|(k, n)| (k.name(), n))
            .collect(),
        quarantine_transitions: 0,
        containment_transitions: BTreeMap::new(),
        upstream_decode_errors: counters.decode_errors.load(Ordering::Relaxed),
        upstream_forced_relists: counters.forced_relists.load(Ordering::Relaxed),
        upstream_oversized: counters.oversized.load(Ordering::Relaxed),
        upstream_pods_skipped: counters.pods_skipped.load(Ordering::Relaxed),
        upstream_events_by_kind: crate::model::Kind::ALL
            .iter()
            .map(|k| (k.name(), counters.events_of(*k)))
            .collect(),
        upstream_list_strategies: crate::model::Kind::ALL
            .iter()
            .map(|k| (k.name(), counters.strategy_of(*k)))
            .filter(|(_, s)| *s != crate::upstream::strategy::ListStrategy::Unknown)
            .map(|(k, s)| (k, s.name()))
            .collect(),
        connected: true,
        pending: engine.pending(),
    }
}

fn quarantine_figures(state: &State) -> BTreeMap<String, i64> {
    match state {
        State::Active => BTreeMap::new(),
        State::Quarantined(q) | State::Rechecking { quarantine: q, .. } => {
            q.trigger.figures.clone()
        }
    }
}

/// Publishes the link's state. Until the remote answers, the link is Degraded (unless it is
/// quarantined) and keeps the message the connect loop wrote; once connected, it is Degraded
/// while its watchers cannot reach the remote (the view is served all the same).
pub(super) fn publish_state(
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

/// The transitions a link has made since it started.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Of the link's quarantine.
    pub link: u64,
    /// Of its services' containment, by cause.
    pub services: std::collections::BTreeMap<&'static str, u64>,
}
