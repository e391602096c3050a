//! Status from link states: conditions and their transition times, quarantine, counters, and
//! the merge patches that carry only what changed.

use serde_json::json;

use super::*;
use crate::churn::flood::Reason;

fn t(secs: i64) -> Time {
    Time(jiff::Timestamp::from_second(1_700_000_000 + secs).expect("time"))
}

fn mk_state(phase: Phase, synced: bool) -> LinkState {
    LinkState {
        phase,
        synced,
        ..LinkState::default()
    }
}

fn cond<'a>(s: &'a LinkStatus, type_: &str) -> &'a Condition {
    s.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

fn obs<'a>(state: Option<&'a LinkState>, blocked: Option<&'a Blocked>) -> Observation<'a> {
    Observation {
        generation: Some(3),
        blocked,
        state,
        holder: "replica-a",
    }
}

#[test]
fn a_healthy_synced_link_is_ready_with_its_generation() {
    let mut st = mk_state(Phase::Healthy, true);
    st.counters.services = 3;
    st.counters.endpoints_published = 9;
    let s = next_status(None, &obs(Some(&st), None), &t(0));
    assert_eq!(s.phase, Some(Phase::Healthy));
    assert_eq!(s.observed_generation, Some(3));
    assert_eq!(s.lease_holder.as_deref(), Some("replica-a"));
    for (ty, status) in [
        ("SpecValid", "True"),
        ("Synced", "True"),
        ("Ready", "True"),
        ("Throttled", "False"),
        ("Quarantined", "False"),
    ] {
        let c = cond(&s, ty);
        assert_eq!(c.status, status, "{ty}");
        assert_eq!(c.observed_generation, Some(3));
    }
    let c = s.counters.expect("counters");
    assert_eq!((c.services, c.endpoints_published), (3, 9));
    assert!(s.quarantine.is_none());
}

#[test]
fn transition_times_move_only_when_a_condition_flips() {
    let st = mk_state(Phase::Healthy, true);
    let first = next_status(None, &obs(Some(&st), None), &t(0));
    let same = next_status(Some(&first), &obs(Some(&st), None), &t(60));
    assert_eq!(cond(&same, "Ready").last_transition_time, t(0));
    let throttled = mk_state(Phase::Throttled, true);
    let later = next_status(Some(&same), &obs(Some(&throttled), None), &t(90));
    assert_eq!(cond(&later, "Throttled").status, "True");
    assert_eq!(cond(&later, "Throttled").last_transition_time, t(90));
    assert_eq!(cond(&later, "Ready").last_transition_time, t(0));
    assert!(is_transition(Some(&same), &later));
    assert!(!is_transition(Some(&first), &same));
}

/// A replica that takes the Lease over says so at its first tick, not at the next write slot:
/// `kubectl get links` names who decides.
#[test]
fn a_new_lease_holder_is_written_at_once() {
    let st = mk_state(Phase::Healthy, true);
    let by_a = next_status(None, &obs(Some(&st), None), &t(0));
    let by_b = next_status(
        Some(&by_a),
        &Observation {
            holder: "replica-b",
            ..obs(Some(&st), None)
        },
        &t(5),
    );
    assert_eq!(by_b.lease_holder.as_deref(), Some("replica-b"));
    assert!(is_transition(Some(&by_a), &by_b));
    assert_eq!(cond(&by_b, "Ready").last_transition_time, t(0));
}

#[test]
fn a_quarantine_reports_reason_since_and_figures() {
    let mut st = mk_state(Phase::Quarantined, true);
    st.quarantine.reason = Some("EventRate".into());
    st.message = "4100 events/s for 10s".into();
    st.engine.events_last_second = 4100;
    st.engine.objects_held = 12;
    let s = next_status(None, &obs(Some(&st), None), &t(5));
    let q = s.quarantine.clone().expect("quarantine");
    assert_eq!(q.reason, "EventRate");
    assert_eq!(q.since, t(5));
    assert_eq!(q.figures["eventsLastSecond"], 4100);
    assert_eq!(cond(&s, "Quarantined").reason, "EventRate");
    // Still quarantined later: `since` stays.
    let again = next_status(Some(&s), &obs(Some(&st), None), &t(50));
    assert_eq!(again.quarantine.expect("still").since, t(5));
}

fn contained(name: &str, reason: Reason) -> crate::link::ContainedService {
    crate::link::ContainedService {
        service: crate::model::NsName::new("prod", name),
        state: crate::churn::quarantine::StateName::Contained,
        reason,
        message: format!("{name} floods"),
        figures: std::collections::BTreeMap::from([("serviceEventsLastSecond".to_owned(), 900)]),
        since: tokio::time::Instant::now(),
        next_check: None,
    }
}

#[test]
fn contained_services_are_counted_and_the_first_few_named() {
    let mut st = mk_state(Phase::Healthy, true);
    let none = next_status(None, &obs(Some(&st), None), &t(0));
    assert!(none.contained_services.is_none());
    st.containment.contained = (0..7)
        .map(|i| contained(&format!("svc-{i}"), Reason::ServiceEventRate))
        .collect();
    let s = next_status(Some(&none), &obs(Some(&st), None), &t(10));
    let c = s.contained_services.clone().expect("contained");
    assert_eq!(c.count, 7);
    assert_eq!(c.first.len(), ContainedServicesStatus::FIRST);
    assert_eq!(c.first[0].service, "prod/svc-0");
    assert_eq!(c.first[0].reason, "ServiceEventRate");
    assert_eq!(c.first[0].since, t(10));
    assert_eq!(c.first[0].figures["serviceEventsLastSecond"], 900);
    assert!(
        is_transition(Some(&none), &s),
        "a containment is written at once"
    );
    // Still contained later: `since` stays; a new reason is a new containment.
    let again = next_status(Some(&s), &obs(Some(&st), None), &t(60));
    assert_eq!(
        again.contained_services.as_ref().expect("c").first[0].since,
        t(10)
    );
    assert!(!is_transition(Some(&s), &again));
    st.containment.contained[0] = contained("svc-0", Reason::EndpointsPerService);
    let other = next_status(Some(&again), &obs(Some(&st), None), &t(70));
    assert_eq!(other.contained_services.expect("c").first[0].since, t(70));
    // Released: the field goes (a merge patch writes null).
    st.containment.contained.clear();
    let released = next_status(Some(&again), &obs(Some(&st), None), &t(80));
    assert!(released.contained_services.is_none());
    let patch = status_patch(Some(&again), &released).expect("patch");
    assert_eq!(
        patch["status"]["containedServices"],
        serde_json::Value::Null
    );
    assert!(is_transition(Some(&again), &released));
}

#[test]
fn a_blocked_link_says_why() {
    let invalid = Blocked {
        reason: "InvalidSpec",
        message: "spec.coalesce.quiet: too long".into(),
    };
    let s = next_status(None, &obs(None, Some(&invalid)), &t(0));
    assert_eq!(cond(&s, "SpecValid").status, "False");
    assert_eq!(cond(&s, "SpecValid").reason, "InvalidSpec");
    assert_eq!(cond(&s, "Ready").status, "False");
    assert_eq!(s.phase, Some(Phase::Degraded));

    // A missing Secret is not a spec error; a running link keeps serving its last good spec.
    let missing = Blocked {
        reason: "SecretNotFound",
        message: "Secret \"x\" not found".into(),
    };
    let st = mk_state(Phase::Healthy, true);
    let s = next_status(None, &obs(Some(&st), Some(&missing)), &t(0));
    assert_eq!(cond(&s, "SpecValid").status, "True");
    assert_eq!(cond(&s, "Ready").reason, "SecretNotFound");
    assert!(cond(&s, "Ready").message.contains("last good spec"));
}

#[test]
fn patches_carry_only_what_changed() {
    let mut st = mk_state(Phase::Healthy, true);
    let a = next_status(None, &obs(Some(&st), None), &t(0));
    assert_eq!(status_patch(Some(&a), &a), None);
    st.counters.upstream_events = 7;
    let b = next_status(Some(&a), &obs(Some(&st), None), &t(1));
    assert_eq!(
        status_patch(Some(&a), &b),
        Some(json!({"status": {"counters": {"upstreamEvents": 7}}}))
    );
    assert!(
        !is_transition(Some(&a), &b),
        "counters alone are no transition"
    );
    // The first write carries everything.
    let full = status_patch(None, &a).expect("patch");
    assert_eq!(full["status"]["phase"], "Healthy");
    // A removed field is nulled.
    assert_eq!(
        merge_diff(&json!({"a": 1, "b": 2}), &json!({"a": 1})),
        Some(json!({"b": null}))
    );
    assert_eq!(
        merge_diff(&json!({"l": [1, 2]}), &json!({"l": [1]})),
        Some(json!({"l": [1]}))
    );
}
