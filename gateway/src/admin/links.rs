//! A link as the admin API shows it: the [`LinkState`] a link publishes, its facade's figures,
//! and the engine's monotonic instants turned into wall-clock RFC 3339 times at this edge.

use std::time::SystemTime;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::kubeapi::Api;
use crate::link::{LinkState, LinkStore};
use crate::registry::Entry;

/// The wall-clock time of an engine instant, in RFC 3339 (UTC, milliseconds).
pub fn wall_clock(at: Instant, now: Instant, wall_now: SystemTime) -> Option<String> {
    let ago = now.saturating_duration_since(at);
    let wall = wall_now.checked_sub(ago)?;
    let ts = jiff::Timestamp::try_from(wall).ok()?;
    let ts = ts
        .round(jiff::TimestampRound::new().smallest(jiff::Unit::Millisecond))
        .ok()?;
    Some(ts.to_string())
}

/// `GET /links/{name}`'s body.
pub fn describe(link: &Entry) -> Value {
    let state = link.handle.state.borrow().clone();
    let mut v = describe_state(link.name(), &state, Some(&link.api));
    v["counters"]["viewBytes"] = link.handle.view.json_bytes().into();
    // In a cluster, the replica that decides for the link (null while none does).
    // Where this process reads the link from: the remote, or (a replica without the Lease)
    // the holder's facade.
    v["readsFrom"] = "the remote".into();
    if let Some(relay) = &link.relay {
        v["leaseHolder"] = relay.holder().into();
        v["readsFrom"] = relay.reads_from().into();
    }
    v
}

/// The body for a link's state (apart from the handle, for tests).
pub fn describe_state(name: &str, s: &LinkState, api: Option<&Api<LinkStore>>) -> Value {
    let (now, wall_now) = (Instant::now(), SystemTime::now());
    let since = s
        .quarantine
        .since
        .and_then(|at| wall_clock(at, now, wall_now));
    let quarantined = s.quarantine.since.is_some();
    let c = &s.counters;
    let facade = api.map(|a| a.counters.snapshot()).unwrap_or_default();
    json!({
        "name": name,
        "phase": s.phase.as_str(),
        "synced": s.synced,
        "message": s.message,
        "quarantine": if quarantined {
            json!({
                "state": s.quarantine.state,
                "reason": s.quarantine.reason,
                "message": s.message,
                "since": since,
                "figures": s.quarantine.figures,
            })
        } else {
            Value::Null
        },
        "counters": {
            "services": c.services,
            "servicesWithheld": c.services_withheld,
            "endpointsPublished": c.endpoints_published,
            "endpointsTruncated": c.endpoints_truncated,
            "upstreamEvents": c.upstream_events,
            "relevantEvents": c.relevant_events,
            "irrelevantEvents": c.irrelevant_events,
            "coalesced": c.coalesced,
            "downstreamUpdates": c.downstream_updates,
            "throttled": c.throttled,
            "objectsHeld": s.engine.objects_held,
            "eventsLastSecond": s.engine.events_last_second,
            "upstreamErrors": s.upstream.errors,
            "upstreamRelists": s.upstream.relists,
            "upstreamDecodeErrors": s.upstream.decode_errors,
            "upstreamForcedRelists": s.upstream.forced_relists,
            "upstreamRefusals": s.upstream.refusals,
            "upstreamOversized": s.upstream.oversized,
            "upstreamPodsSkipped": s.upstream.pods_skipped,
            "upstreamWatchers": s.upstream.watchers,
            "followedSnapshots": s.upstream.followed_snapshots,
            "followedChanges": s.upstream.followed_changes,
            "quarantineTransitions": s.quarantine.transitions,
            "watchers": api.map_or(0, Api::open_watches),
            "discardedWrites": facade.events_discarded,
        },
        "contained": contained(s, now, wall_now),
        "objectsHeldByResource": s.engine.objects_by_kind,
        "slicesHeldDeflated": s.engine.slices_deflated,
        "upstreamEventsByResource": s.upstream.events_by_kind,
    })
}

/// The contained services: each one's state, reason, since when, its figures, and when its
/// auto-release re-check starts (`null`: only an operator releases it).
fn contained(s: &LinkState, now: Instant, wall_now: SystemTime) -> Vec<Value> {
    s.containment
        .contained
        .iter()
        .map(|c| {
            json!({
                "service": c.service,
                "state": c.state,
                "reason": c.reason,
                "message": c.message,
                "since": wall_clock(c.since, now, wall_now),
                "nextCheck": c.next_check.and_then(|at| wall_clock_ahead(at, now, wall_now)),
                "figures": c.figures,
            })
        })
        .collect()
}

/// The wall-clock time of an engine instant that may be ahead of now.
fn wall_clock_ahead(at: Instant, now: Instant, wall_now: SystemTime) -> Option<String> {
    if at <= now {
        return wall_clock(at, now, wall_now);
    }
    let wall = wall_now.checked_add(at.duration_since(now))?;
    wall_clock(now, now, wall)
}
