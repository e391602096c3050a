//! Flood detection: relevant upstream events per second sustained over time, endpoints of one
//! service, objects held by the link.
//!
//! Events are counted in one-second buckets. A bucket over `eventsPerSecond` starts (or extends)
//! a run; a bucket at or under it ends the run. The link floods when a run has lasted
//! `sustainedFor`. Events that concern no selected service are counted apart and never trip it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use floodgate_link_crd::LinkSpec;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::model::NsName;

const BUCKET: Duration = Duration::from_secs(1);

/// Why a link was quarantined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reason {
    /// Relevant upstream events per second stayed over the threshold.
    EventRate,
    /// One service had more upstream endpoints than the threshold.
    EndpointsPerService,
    /// The link held more objects than `caps.maxObjects`.
    ObjectCount,
    /// An operator asked for it.
    Manual,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::EventRate => "EventRate",
            Reason::EndpointsPerService => "EndpointsPerService",
            Reason::ObjectCount => "ObjectCount",
            Reason::Manual => "Manual",
        })
    }
}

/// What tripped a quarantine: the reason, a sentence, and the figures with their thresholds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trigger {
    /// The reason.
    pub reason: Reason,
    /// For people.
    pub message: String,
    /// Measurements and thresholds by name.
    pub figures: BTreeMap<String, i64>,
}

impl Trigger {
    fn new(reason: Reason, message: String, figures: &[(&str, u64)]) -> Self {
        Self {
            reason,
            message,
            figures: figures
                .iter()
                .map(|(k, v)| ((*k).to_owned(), i64::try_from(*v).unwrap_or(i64::MAX)))
                .collect(),
        }
    }

    /// An operator's quarantine.
    pub fn manual(message: impl Into<String>) -> Self {
        Self {
            reason: Reason::Manual,
            message: message.into(),
            figures: BTreeMap::new(),
        }
    }
}

/// Sliding-window flood detector of one link.
#[derive(Debug)]
pub struct FloodDetector {
    events_per_second: u64,
    sustained_for: Duration,
    endpoints_per_service: u64,
    max_objects: u64,
    bucket_start: Option<Instant>,
    in_bucket: u64,
    last_bucket: u64,
    run_since: Option<Instant>,
}

impl FloodDetector {
    /// A detector with the spec's thresholds.
    pub fn new(spec: &LinkSpec) -> Self {
        let when = &spec.quarantine.when;
        Self {
            events_per_second: when.events_per_second.into(),
            sustained_for: when.sustained_for.get(),
            endpoints_per_service: when.endpoints_per_service.into(),
            max_objects: spec.caps.max_objects.into(),
            bucket_start: None,
            in_bucket: 0,
            last_bucket: 0,
            run_since: None,
        }
    }

    /// Relevant events in the last complete second.
    pub fn events_last_second(&self) -> u64 {
        self.last_bucket
    }

    /// Forgets the current run (after a quarantine or release).
    pub fn reset(&mut self) {
        self.bucket_start = None;
        self.in_bucket = 0;
        self.last_bucket = 0;
        self.run_since = None;
    }

    /// Counts one relevant event at `now`.
    pub fn record(&mut self, now: Instant) -> Option<Trigger> {
        self.roll(now);
        self.in_bucket += 1;
        self.check_rate(now)
    }

    /// Closes elapsed buckets without an event (call from the engine's poll).
    pub fn tick(&mut self, now: Instant) -> Option<Trigger> {
        self.roll(now);
        self.check_rate(now)
    }

    /// When the current bucket closes, if one is open.
    pub fn next_boundary(&self) -> Option<Instant> {
        self.bucket_start.map(|s| s + BUCKET)
    }

    fn roll(&mut self, now: Instant) {
        let Some(start) = self.bucket_start else {
            self.bucket_start = Some(now);
            return;
        };
        if now < start + BUCKET {
            return;
        }
        // Close the current bucket.
        self.close(start);
        let elapsed = now.duration_since(start);
        let whole = u32::try_from(elapsed.as_secs()).unwrap_or(u32::MAX);
        if whole >= 2 {
            // At least one empty bucket passed: the run is broken.
            self.last_bucket = 0;
            self.run_since = None;
        }
        self.bucket_start = Some(start + BUCKET * whole);
    }

    fn close(&mut self, start: Instant) {
        self.last_bucket = self.in_bucket;
        if self.in_bucket > self.events_per_second {
            self.run_since.get_or_insert(start);
        } else {
            self.run_since = None;
        }
        self.in_bucket = 0;
    }

    fn check_rate(&self, now: Instant) -> Option<Trigger> {
        let start = self.bucket_start?;
        let open_over = self.in_bucket > self.events_per_second;
        // A run is the complete buckets over the threshold since `run_since`, extended through
        // the open bucket once that one is over the threshold by itself.
        let lasted = match (self.run_since, open_over) {
            (Some(since), true) => now.duration_since(since),
            (Some(since), false) => start.duration_since(since),
            (None, true) => now.duration_since(start),
            (None, false) => return None,
        };
        if lasted < self.sustained_for {
            return None;
        }
        let rate = self.last_bucket.max(self.in_bucket);
        Some(Trigger::new(
            Reason::EventRate,
            format!(
                "{rate} relevant upstream events/s, over {} for {}s",
                self.events_per_second,
                lasted.as_secs()
            ),
            &[
                ("eventsPerSecond", rate),
                ("thresholdEventsPerSecond", self.events_per_second),
                ("sustainedSeconds", lasted.as_secs()),
            ],
        ))
    }

    /// Checks one service's upstream endpoint count.
    pub fn check_endpoints(&self, service: &NsName, endpoints: usize) -> Option<Trigger> {
        let n = endpoints as u64;
        (n > self.endpoints_per_service).then(|| {
            Trigger::new(
                Reason::EndpointsPerService,
                format!(
                    "service {service} has {n} upstream endpoints, over {}",
                    self.endpoints_per_service
                ),
                &[
                    ("endpoints", n),
                    ("thresholdEndpointsPerService", self.endpoints_per_service),
                ],
            )
        })
    }

    /// Checks the number of objects the link holds.
    pub fn check_objects(&self, objects: usize) -> Option<Trigger> {
        let n = objects as u64;
        (n > self.max_objects).then(|| {
            Trigger::new(
                Reason::ObjectCount,
                format!(
                    "the link holds {n} upstream objects, over caps.maxObjects {}",
                    self.max_objects
                ),
                &[("objects", n), ("maxObjects", self.max_objects)],
            )
        })
    }
}
