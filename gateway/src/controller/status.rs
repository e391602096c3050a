//! Pure status computation: what a link reports (phase, conditions with observedGeneration,
//! counters, quarantine) from its running state, and the merge patch that takes the status the
//! cluster has to the one it should have. No client, no clock: `now` is passed in.

use floodgate_link_crd::{
    ContainedServiceStatus, ContainedServicesStatus, Counters, LinkStatus, Phase, QuarantineStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Map, Value};

use super::reconcile::Blocked;
use crate::link::LinkState;

/// What the controller knows of one link at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// The Link's `metadata.generation`.
    pub generation: Option<i64>,
    /// Why the current spec cannot run, if it cannot.
    pub blocked: Option<&'a Blocked>,
    /// The running link's state, if a run exists (possibly of an earlier, good spec).
    pub state: Option<&'a LinkState>,
    /// The replica that computes this status: the holder of the link's Lease.
    pub holder: &'a str,
}

/// The status `obs` should produce, keeping `lastTransitionTime`s (and the quarantine's
/// `since`) from `prev` where nothing changed.
pub fn next_status(prev: Option<&LinkStatus>, obs: &Observation<'_>, now: &Time) -> LinkStatus {
    let prev_conditions: &[Condition] = prev.map_or(&[], |p| &p.conditions);
    let mut conditions = Vec::new();
    let mut set = |type_: &str, ok: bool, reason: &str, message: String| {
        let status = if ok { "True" } else { "False" };
        let since = prev_conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
        conditions.push(Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: obs.generation,
            last_transition_time: since,
        });
    };

    let spec_error = obs.blocked.filter(|b| b.is_spec_error());
    match spec_error {
        Some(b) => set("SpecValid", false, b.reason, b.message.clone()),
        None => set("SpecValid", true, "Valid", String::new()),
    }
    let phase = obs.state.map_or(Phase::Degraded, |s| s.phase);
    let synced = obs.state.is_some_and(|s| s.synced);
    set(
        "Synced",
        synced,
        if synced { "Synced" } else { "NotSynced" },
        String::new(),
    );
    match (obs.blocked, obs.state) {
        (Some(b), None) => set("Ready", false, b.reason, b.message.clone()),
        (Some(b), Some(_)) => set(
            "Ready",
            synced,
            b.reason,
            format!("serving the last good spec; {}", b.message),
        ),
        (None, None) => set("Ready", false, "Starting", String::new()),
        (None, Some(s)) => {
            let ready = s.synced && phase != Phase::Degraded;
            let reason = if ready { "Serving" } else { phase.as_str() };
            set("Ready", ready, reason, s.message.clone());
        }
    }
    set(
        "Throttled",
        phase == Phase::Throttled,
        if phase == Phase::Throttled {
            "WaitingForTokens"
        } else {
            "WithinBudget"
        },
        String::new(),
    );
    let quarantine = obs.state.filter(|_| phase == Phase::Quarantined);
    let quarantine = quarantine.map(|s| quarantine_status(prev, s, now));
    match &quarantine {
        Some(q) => set("Quarantined", true, &q.reason.clone(), q.message.clone()),
        None => set("Quarantined", false, "Following", String::new()),
    }
    LinkStatus {
        phase: Some(phase),
        observed_generation: obs.generation,
        lease_holder: Some(obs.holder.to_owned()),
        conditions,
        quarantine,
        contained_services: obs.state.and_then(|s| contained_services(prev, s, now)),
        counters: obs.state.map(|s| Counters {
            services: clamp(s.counters.services),
            endpoints_published: clamp(s.counters.endpoints_published),
            endpoints_truncated: clamp(s.counters.endpoints_truncated),
            upstream_events: clamp(s.counters.upstream_events),
            downstream_updates: clamp(s.counters.downstream_updates),
        }),
    }
}

/// A quarantined link's quarantine as status shows it; `since` is kept from `prev` while the
/// reason is the same.
fn quarantine_status(prev: Option<&LinkStatus>, s: &LinkState, now: &Time) -> QuarantineStatus {
    let reason = (s.quarantine.reason.clone()).unwrap_or_else(|| "Manual".into());
    let since = prev
        .and_then(|p| p.quarantine.as_ref())
        .filter(|q| q.reason == reason)
        .map_or_else(|| now.clone(), |q| q.since.clone());
    let figures = [
        ("eventsLastSecond", s.engine.events_last_second),
        ("objectsHeld", s.engine.objects_held as u64),
    ];
    QuarantineStatus {
        since,
        reason,
        message: s.message.clone(),
        figures: (figures.into_iter())
            .map(|(k, v)| (k.to_owned(), clamp(v)))
            .collect(),
    }
}

/// The contained services as status shows them: how many, and the first few by name. A
/// service keeps its recorded `since` while it stays contained for the same reason.
fn contained_services(
    prev: Option<&LinkStatus>,
    s: &LinkState,
    now: &Time,
) -> Option<ContainedServicesStatus> {
    if s.containment.contained.is_empty() {
        return None;
    }
    let before: &[ContainedServiceStatus] = prev
        .and_then(|p| p.contained_services.as_ref())
        .map_or(&[], |c| &c.first);
    let first = s
        .containment
        .contained
        .iter()
        .take(ContainedServicesStatus::FIRST)
        .map(|c| {
            let service = c.service.to_string();
            let reason = c.reason.to_string();
            let since = before
                .iter()
                .find(|b| b.service == service && b.reason == reason)
                .map_or_else(|| now.clone(), |b| b.since.clone());
            ContainedServiceStatus {
                service,
                reason,
                since,
                message: c.message.clone(),
                figures: c.figures.clone(),
            }
        })
        .collect();
    Some(ContainedServicesStatus {
        count: clamp(s.containment.contained.len() as u64),
        first,
    })
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// True when `next` differs from `prev` in more than counters and figures: a phase, a
/// condition, a quarantine or a containment change, or a new Lease holder. Transitions are written at once; counters wait for the
/// next write slot.
pub fn is_transition(prev: Option<&LinkStatus>, next: &LinkStatus) -> bool {
    let Some(prev) = prev else { return true };
    let key = |s: &LinkStatus| {
        (
            s.phase,
            s.observed_generation,
            s.lease_holder.clone(),
            s.conditions
                .iter()
                .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
                .collect::<Vec<_>>(),
            s.quarantine.as_ref().map(|q| q.reason.clone()),
            s.contained_services.as_ref().map(|c| {
                let names = c.first.iter().map(|f| f.service.clone());
                (c.count, names.collect::<Vec<_>>())
            }),
        )
    };
    key(prev) != key(next)
}

/// The JSON merge patch (RFC 7386) for the status subresource that takes `prev` to `next`, or
/// `None` when they are equal.
pub fn status_patch(prev: Option<&LinkStatus>, next: &LinkStatus) -> Option<Value> {
    let old = prev.map_or(Value::Null, |p| {
        serde_json::to_value(p).unwrap_or(Value::Null)
    });
    let new = serde_json::to_value(next).unwrap_or(Value::Null);
    let diff = merge_diff(&old, &new)?;
    Some(serde_json::json!({ "status": diff }))
}

/// The merge patch from `old` to `new`: changed keys, `null` for removed ones, arrays whole.
pub fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = Map::new();
            for (k, v) in n {
                match o.get(k) {
                    Some(ov) => {
                        if let Some(d) = merge_diff(ov, v) {
                            out.insert(k.clone(), d);
                        }
                    }
                    None => {
                        out.insert(k.clone(), v.clone());
                    }
                }
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        _ if old == new => None,
        _ => Some(new.clone()),
    }
}

#[cfg(test)]
mod tests;
