//! Status from link states: conditions and their transition times, quarantine, counters, and
//! the merge patches that carry only what changed.

use serde_json::json;

use super::*;

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

#[test]
fn a_quarantine_reports_reason_since_and_figures() {
    let mut st = mk_state(Phase::Quarantined, true);
    st.quarantine_reason = Some("EventRate".into());
    st.message = "4100 events/s for 10s".into();
    st.events_last_second = 4100;
    st.objects_held = 12;
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
