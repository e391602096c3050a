//! Flood detection: sustained event rates (of the link, and of each service), endpoints of one
//! service, objects held by the link, services contained at once.
//!
//! A [`Rate`] counts events in one-second buckets. A bucket over its threshold starts (or
//! extends) a run; a bucket at or under it ends the run. The rate floods when a run has lasted
//! `sustainedFor`. The link's rate counts only the events of services that are not flooding on
//! their own (see [`super::contain`]), so one flooding service is contained without
//! quarantining the link it belongs to.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use floodgate_link_crd::LinkSpec;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::model::NsName;

const BUCKET: Duration = Duration::from_secs(1);

/// Why a link was quarantined or a service contained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reason {
    /// Relevant upstream events per second of the link stayed over the threshold.
    EventRate,
    /// One service had more upstream endpoints than the threshold (contains the service).
    EndpointsPerService,
    /// One service's own events per second stayed over the threshold (contains the service).
    ServiceEventRate,
    /// The link held more objects than `caps.maxObjects`.
    ObjectCount,
    /// More services were contained at once than `quarantine.when.containedServices`.
    ContainedServices,
    /// The remote removed over `quarantine.when.removedShare` of what the link serves at once.
    MassRemoval,
    /// An operator asked for it.
    Manual,
}

impl Reason {
    /// The CamelCase name, as status and metrics show it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::EventRate => "EventRate",
            Reason::EndpointsPerService => "EndpointsPerService",
            Reason::ServiceEventRate => "ServiceEventRate",
            Reason::ObjectCount => "ObjectCount",
            Reason::ContainedServices => "ContainedServices",
            Reason::MassRemoval => "MassRemoval",
            Reason::Manual => "Manual",
        }
    }
}

impl std::str::FromStr for Reason {
    type Err = String;

    /// The reason named by [`Reason::as_str`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            Reason::EventRate,
            Reason::EndpointsPerService,
            Reason::ServiceEventRate,
            Reason::ObjectCount,
            Reason::ContainedServices,
            Reason::MassRemoval,
            Reason::Manual,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
        .ok_or_else(|| format!("unknown reason {s:?}"))
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What tripped a quarantine or a containment: the reason, a sentence, and the figures with
/// their thresholds.
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

    /// A decision another replica (the Lease holder) recorded, followed here.
    pub fn recorded(reason: Reason, message: String, figures: BTreeMap<String, i64>) -> Self {
        Self {
            reason,
            message,
            figures,
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

    /// A link-wide removal ([`super::removal`]).
    pub fn removal(message: String, figures: &[(&str, u64)]) -> Self {
        Self::new(Reason::MassRemoval, message, figures)
    }

    /// More services contained at once than the link allows.
    pub fn contained_services(count: usize, threshold: u32) -> Self {
        Self::new(
            Reason::ContainedServices,
            format!(
                "{count} services contained at once, over quarantine.when.containedServices {threshold}"
            ),
            &[
                ("containedServices", count as u64),
                ("thresholdContainedServices", threshold.into()),
            ],
        )
    }
}

/// Seconds a run is judged on once it has begun: one under the threshold goes on with it while
/// these last seconds average over the threshold.
const WINDOW: usize = 3;

/// A sustained-rate detector: events in one-second buckets, a run of buckets over a threshold
/// (a bucket under it goes on with the run while the last [`WINDOW`] average over it).
#[derive(Clone, Debug)]
pub struct Rate {
    threshold: u64,
    sustained_for: Duration,
    bucket_start: Option<Instant>,
    in_bucket: u64,
    /// The last complete buckets, the newest first.
    previous: [u64; WINDOW - 1],
    run_since: Option<Instant>,
}

/// A rate over its threshold for long enough: the rate seen and how long it lasted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Over {
    /// Events in the fullest of the last complete and the open bucket.
    pub rate: u64,
    /// How long the run has lasted.
    pub lasted: Duration,
}

impl Rate {
    /// A detector that floods past `threshold` events/s sustained for `sustained_for`.
    pub fn new(threshold: u64, sustained_for: Duration) -> Self {
        Self {
            threshold,
            sustained_for,
            bucket_start: None,
            in_bucket: 0,
            previous: [0; WINDOW - 1],
            run_since: None,
        }
    }

    /// Events in the last complete second.
    pub fn last_second(&self) -> u64 {
        self.previous[0]
    }

    /// True while the open bucket is over the threshold: this source floods right now.
    pub fn over_now(&self) -> bool {
        self.in_bucket > self.threshold
    }

    /// Forgets the current run.
    pub fn reset(&mut self) {
        *self = Self::new(self.threshold, self.sustained_for);
    }

    /// Counts one event at `now`; says whether the rate floods.
    pub fn record(&mut self, now: Instant) -> Option<Over> {
        self.record_n(now, 1)
    }

    /// Counts `n` events at `now` (a slice change that changed `n` endpoints).
    pub fn record_n(&mut self, now: Instant, n: u64) -> Option<Over> {
        self.roll(now);
        self.in_bucket += n;
        self.check(now)
    }

    /// Closes elapsed buckets without an event; says whether the rate floods.
    pub fn tick(&mut self, now: Instant) -> Option<Over> {
        self.roll(now);
        self.check(now)
    }

    /// When the open bucket closes, if closing it changes anything: it counted events, or
    /// the last one did, or a run is on. An idle detector asks for no wake-up (the next event
    /// closes the buckets it skipped, to the same state), so an idle link sleeps.
    pub fn next_boundary(&self) -> Option<Instant> {
        let idle = self.in_bucket == 0 && self.previous[0] == 0 && self.run_since.is_none();
        self.bucket_start.filter(|_| !idle).map(|s| s + BUCKET)
    }

    fn roll(&mut self, now: Instant) {
        let Some(start) = self.bucket_start else {
            self.bucket_start = Some(now);
            return;
        };
        if now < start + BUCKET {
            return;
        }
        let closed = self.in_bucket;
        let window = self
            .previous
            .iter()
            .fold(closed, |sum, n| sum.saturating_add(*n));
        // A second under the threshold goes on with a run while the last WINDOW seconds
        // average over it: a remote's watch delivers events in lumps (its watch cache, the
        // connection, a busy reader), and a steady flood near its threshold counted second by
        // second crossed it down and up again (real server, 2026-12-07: 123, 80, 122, 64, 41,
        // 118 for a flood of about 97 a second). A second without an event breaks it.
        let goes_on = self.run_since.is_some()
            && closed > 0
            && window > self.threshold.saturating_mul(WINDOW as u64);
        self.previous.rotate_right(1);
        self.previous[0] = closed;
        if closed > self.threshold || goes_on {
            self.run_since.get_or_insert(start);
        } else {
            self.run_since = None;
        }
        self.in_bucket = 0;
        let whole = u32::try_from(now.duration_since(start).as_secs()).unwrap_or(u32::MAX);
        if whole >= 2 {
            // At least one empty bucket passed: the run is broken.
            self.previous = [0; WINDOW - 1];
            self.run_since = None;
        }
        self.bucket_start = Some(start + BUCKET * whole);
    }

    fn check(&self, now: Instant) -> Option<Over> {
        let start = self.bucket_start?;
        // A run is the complete buckets over the threshold since `run_since`, extended through
        // the open bucket once that one is over the threshold by itself.
        let lasted = match (self.run_since, self.over_now()) {
            (Some(since), true) => now.duration_since(since),
            (Some(since), false) => start.duration_since(since),
            (None, true) => now.duration_since(start),
            (None, false) => return None,
        };
        (lasted >= self.sustained_for).then(|| Over {
            rate: self.previous[0].max(self.in_bucket),
            lasted,
        })
    }
}

/// The thresholds of one link, and its link-wide event rate.
#[derive(Debug)]
pub struct FloodDetector {
    /// The link-wide rate of relevant events of services that do not flood on their own.
    pub link: Rate,
    events_per_second: u64,
    service_events_per_second: u64,
    sustained_for: Duration,
    endpoints_per_service: u64,
    max_objects: u64,
}

impl FloodDetector {
    /// A detector with the spec's thresholds.
    pub fn new(spec: &LinkSpec) -> Self {
        let when = &spec.quarantine.when;
        let sustained_for = when.sustained_for.get();
        Self {
            link: Rate::new(when.events_per_second.into(), sustained_for),
            events_per_second: when.events_per_second.into(),
            service_events_per_second: when.service_events_per_second.into(),
            sustained_for,
            endpoints_per_service: when.endpoints_per_service.into(),
            max_objects: spec.caps.max_objects.into(),
        }
    }

    /// A fresh rate for one service.
    pub fn service_rate(&self) -> Rate {
        Rate::new(self.service_events_per_second, self.sustained_for)
    }

    /// The trigger of a link-wide rate that floods.
    pub fn link_trigger(&self, over: Over) -> Trigger {
        Trigger::new(
            Reason::EventRate,
            format!(
                "{} relevant upstream events/s, over {} for {}s",
                over.rate,
                self.events_per_second,
                over.lasted.as_secs()
            ),
            &[
                ("eventsPerSecond", over.rate),
                ("thresholdEventsPerSecond", self.events_per_second),
                ("sustainedSeconds", over.lasted.as_secs()),
            ],
        )
    }

    /// The trigger of one service's rate that floods.
    pub fn service_trigger(&self, service: &NsName, over: Over) -> Trigger {
        Trigger::new(
            Reason::ServiceEventRate,
            format!(
                "service {service}: {} upstream events/s, over {} for {}s",
                over.rate,
                self.service_events_per_second,
                over.lasted.as_secs()
            ),
            &[
                ("eventsPerSecond", over.rate),
                (
                    "thresholdServiceEventsPerSecond",
                    self.service_events_per_second,
                ),
                ("sustainedSeconds", over.lasted.as_secs()),
            ],
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_rate_floods_only_when_sustained() {
        let mut r = Rate::new(10, Duration::from_secs(3));
        let start = Instant::now();
        let mut flooded = None;
        // 20 events a second: over the threshold in every bucket.
        for i in 0..100u32 {
            let now = start + Duration::from_millis(50) * i;
            if let Some(over) = r.record(now) {
                flooded = Some((now - start, over));
                break;
            }
        }
        let (at, over) = flooded.expect("a sustained run floods");
        assert!(
            at >= Duration::from_secs(3),
            "not before sustainedFor: {at:?}"
        );
        assert!(over.rate > 10);
        // A gap of two seconds breaks the run.
        let later = start + Duration::from_secs(20);
        assert_eq!(r.tick(later), None);
        assert!(r.record(later).is_none());
    }

    /// A steady flood whose events come in lumps, its seconds straddling the threshold (its
    /// seconds 120, 80, 50 against 75) is one run; seconds that average under it, or one
    /// without an event, break it.
    #[tokio::test(start_paused = true)]
    async fn a_lumpy_flood_is_one_run_and_quiet_seconds_break_it() {
        let sustained = Duration::from_secs(6);
        let run = |seconds: &[u64]| {
            let mut r = Rate::new(75, sustained);
            let start = Instant::now();
            let (mut flooded, mut end) = (None, start);
            for (i, &n) in (0u32..).zip(seconds) {
                let at = start + BUCKET * i;
                flooded = flooded.or(r.record_n(at, n).map(|o| (at - start, o)));
                end = at + BUCKET;
            }
            flooded.or(r.tick(end).map(|o| (sustained, o)))
        };
        let lumpy = [120, 80, 50, 120, 80, 50, 120, 80, 50];
        let (at, over) = run(&lumpy).expect("one run");
        assert!(at >= sustained, "not before sustainedFor: {at:?}");
        assert_eq!(over.rate, 120);
        let under = [120, 80, 50, 40, 120, 80, 50, 120];
        assert_eq!(run(&under), None, "three seconds under 75 on average");
        let empty = [120, 80, 120, 0, 120, 80, 50, 120];
        assert_eq!(run(&empty), None, "a second without an event");
        let thin = [120, 30, 30, 120, 30, 30, 120, 30, 30];
        assert_eq!(run(&thin), None, "60 a second");
    }

    /// The detector asks to be woken while closing a bucket changes what it says (the bucket
    /// that counted events, then the empty one after it), and not while idle; the next event
    /// after a long sleep finds the same state as a detector woken every second.
    #[tokio::test(start_paused = true)]
    async fn an_idle_rate_asks_for_no_wake_up_and_says_the_same() {
        let mut r = Rate::new(10, Duration::from_secs(3));
        let start = Instant::now();
        assert_eq!(r.next_boundary(), None, "never counted");
        r.record_n(start, 5);
        assert_eq!(r.next_boundary(), Some(start + BUCKET));
        r.tick(start + BUCKET);
        assert_eq!(r.last_second(), 5);
        assert_eq!(r.next_boundary(), Some(start + 2 * BUCKET));
        r.tick(start + 2 * BUCKET);
        assert_eq!(r.last_second(), 0);
        assert_eq!(r.next_boundary(), None, "idle");
        let mut woken = r.clone();
        for s in 3..60 {
            woken.tick(start + BUCKET * s);
        }
        let later = start + Duration::from_millis(60_500);
        assert_eq!(r.record(later), woken.record(later));
        assert_eq!(
            (r.last_second(), r.next_boundary()),
            (woken.last_second(), woken.next_boundary())
        );
    }
}
