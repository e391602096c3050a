//! The JSON of a known link state, byte for byte: `GET /links/{name}` and the `LinkState`
//! serialization both stay as they are while `LinkState` changes shape. Written from the code
//! before `LinkState` was grouped into parts.

use std::collections::BTreeMap;

use floodgate_link_crd::Phase;
use serde_json::Value;
use tokio::time::Instant;

use crate::churn::Counters;
use crate::churn::flood::Reason;
use crate::churn::quarantine::StateName;
use crate::link::{
    ContainedService, ContainmentStatus, EngineStatus, LinkState, QuarantineStatus, UpstreamStatus,
};
use crate::model::NsName;

/// A state with every field set to a value of its own.
fn mk_state(now: Instant) -> LinkState {
    LinkState {
        phase: Phase::Quarantined,
        synced: true,
        message: "too many events".into(),
        connected: true,
        counters: Counters {
            upstream_events: 1,
            relevant_events: 2,
            irrelevant_events: 3,
            contained_events: 4,
            coalesced: 5,
            downstream_updates: 6,
            throttled: 7,
            services: 8,
            services_withheld: 9,
            endpoints_published: 10,
            endpoints_truncated: 11,
            pods_fetched: 12,
            skipped_events: 34,
        },
        engine: EngineStatus {
            events_last_second: 13,
            objects_held: 14,
            objects_by_kind: BTreeMap::from([("pods", 19)]),
            slices_deflated: 32,
            pending: 27,
            // Not in the JSON: for `/metrics` only.
            publication_delays: crate::churn::Delays::default(),
        },
        upstream: UpstreamStatus {
            errors: 15,
            relists: 16,
            decode_errors: 22,
            forced_relists: 23,
            refusals: 33,
            oversized: 24,
            pods_skipped: 25,
            watchers: 29,
            followed_snapshots: 30,
            followed_changes: 31,
            events_by_kind: BTreeMap::from([("services", 26)]),
            list_strategies: BTreeMap::from([("pods", "paged")]),
            // Not in the JSON: for `/metrics` only.
            reachable: true,
            outages: 28,
        },
        quarantine: QuarantineStatus {
            state: StateName::Quarantined,
            reason: Some("EventRate".into()),
            since: Some(now),
            figures: BTreeMap::from([("eventsPerSecond".to_owned(), 17)]),
            transitions: 20,
        },
        containment: ContainmentStatus {
            contained: vec![ContainedService {
                service: NsName::new("prod", "web"),
                state: StateName::Contained,
                reason: Reason::ServiceEventRate,
                message: "web floods".into(),
                figures: BTreeMap::from([("serviceEventsPerSecond".to_owned(), 18)]),
                since: now,
                next_check: None,
            }],
            transitions: BTreeMap::from([("ServiceEventRate", 21)]),
        },
    }
}

/// The admin API's JSON of [`mk_state`], its wall-clock times (which depend on when the test
/// runs) replaced by `"T"`.
fn admin_json(s: &LinkState) -> String {
    let mut v = crate::admin::links::describe_state("east", s, None);
    v["quarantine"]["since"] = Value::from("T");
    v["contained"][0]["since"] = Value::from("T");
    v.to_string()
}

const ADMIN_JSON: &str = r#"{"contained":[{"figures":{"serviceEventsPerSecond":18},"message":"web floods","nextCheck":null,"reason":"ServiceEventRate","service":"prod/web","since":"T","state":"Contained"}],"counters":{"coalesced":5,"discardedWrites":0,"downstreamUpdates":6,"endpointsPublished":10,"endpointsTruncated":11,"eventsLastSecond":13,"followedChanges":31,"followedSnapshots":30,"irrelevantEvents":3,"objectsHeld":14,"quarantineTransitions":20,"relevantEvents":2,"services":8,"servicesWithheld":9,"throttled":7,"upstreamDecodeErrors":22,"upstreamErrors":15,"upstreamEvents":1,"upstreamForcedRelists":23,"upstreamOversized":24,"upstreamPodsSkipped":25,"upstreamRefusals":33,"upstreamRelists":16,"upstreamWatchers":29,"watchers":0},"message":"too many events","name":"east","objectsHeldByResource":{"pods":19},"phase":"Quarantined","quarantine":{"figures":{"eventsPerSecond":17},"message":"too many events","reason":"EventRate","since":"T","state":"Quarantined"},"slicesHeldDeflated":32,"synced":true,"upstreamEventsByResource":{"services":26}}"#;

const STATE_JSON: &str = r#"{"connected":true,"contained":[{"figures":{"serviceEventsPerSecond":18},"message":"web floods","reason":"ServiceEventRate","service":"prod/web","state":"Contained"}],"containmentTransitions":{"ServiceEventRate":21},"counters":{"coalesced":5,"containedEvents":4,"downstreamUpdates":6,"endpointsPublished":10,"endpointsTruncated":11,"irrelevantEvents":3,"podsFetched":12,"relevantEvents":2,"services":8,"servicesWithheld":9,"skippedEvents":34,"throttled":7,"upstreamEvents":1},"eventsLastSecond":13,"followedChanges":31,"followedSnapshots":30,"message":"too many events","objectsByKind":{"pods":19},"objectsHeld":14,"pending":27,"phase":"Quarantined","quarantineFigures":{"eventsPerSecond":17},"quarantineReason":"EventRate","quarantineState":"Quarantined","quarantineTransitions":20,"slicesDeflated":32,"synced":true,"upstreamDecodeErrors":22,"upstreamErrors":15,"upstreamEventsByKind":{"services":26},"upstreamForcedRelists":23,"upstreamListStrategies":{"pods":"paged"},"upstreamOversized":24,"upstreamPodsSkipped":25,"upstreamRefusals":33,"upstreamRelists":16,"upstreamWatchers":29}"#;

#[test]
fn a_known_state_serializes_as_before() {
    let s = mk_state(Instant::now());
    assert_eq!(admin_json(&s), ADMIN_JSON);
    // Its own serialization, field order aside (a flattened part writes its fields where
    // it stands).
    let state = serde_json::to_value(&s).expect("serializes");
    assert_eq!(state.to_string(), STATE_JSON);
}
