//! The last ten minutes of each link's rates, kept by the server so that a status page opened
//! during an incident shows how it began (`GET /history`). Every second the server samples
//! each link's upstream-event and downstream-update totals; the page turns consecutive
//! samples into rates exactly as it does for its own polls.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::registry::Registry;

/// How often links are sampled.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Samples kept per link: ten minutes of rates (a rate needs two samples).
pub const KEEP: usize = 601;

/// One sample: the wall clock in Unix milliseconds, then the upstream-event and
/// downstream-update totals.
pub type Sample = (u64, u64, u64);

/// Each link's recent samples, oldest first.
#[derive(Debug, Default)]
pub struct History {
    links: Mutex<BTreeMap<String, VecDeque<Sample>>>,
}

impl History {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, VecDeque<Sample>>> {
        // Every change is one map call: a poisoned lock still holds consistent samples.
        self.links
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records one sample per link at `at_ms`: `(name, upstream total, downstream total)`.
    /// Links not named are gone and forgotten; each keeps at most [`KEEP`] samples.
    pub fn record(&self, at_ms: u64, totals: impl IntoIterator<Item = (String, u64, u64)>) {
        let mut links = self.lock();
        let mut seen = BTreeMap::new();
        for (name, up, down) in totals {
            let mut samples = links.remove(&name).unwrap_or_default();
            if samples.len() == KEEP {
                samples.pop_front();
            }
            samples.push_back((at_ms, up, down));
            seen.insert(name, samples);
        }
        *links = seen;
    }

    /// `GET /history`'s body: `{"intervalSeconds": 1, "links": {"east": [[ms, up, down], ..]}}`.
    pub fn to_json(&self) -> Value {
        let links: serde_json::Map<String, Value> = self
            .lock()
            .iter()
            .map(|(name, s)| (name.clone(), json!(s)))
            .collect();
        json!({ "intervalSeconds": INTERVAL.as_secs(), "links": links })
    }
}

/// Samples every link of `links` into `history` each [`INTERVAL`] until `stop` resolves.
pub async fn run(
    history: Arc<History>,
    links: Arc<Registry>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = tick.tick() => {}
        }
        let at_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        history.record(
            at_ms,
            links.all().iter().map(|e| {
                let c = &e.handle.state.borrow().counters;
                (e.name().to_owned(), c.upstream_events, c.downstream_updates)
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_ten_minutes_per_link_and_forgets_links_that_left() {
        let h = History::default();
        for i in 0..(KEEP as u64 + 50) {
            let mut totals = vec![("east".to_owned(), i * 10, i)];
            if i < 5 {
                totals.push(("west".to_owned(), i, 0));
            }
            h.record(1_000 * i, totals);
        }
        let v = h.to_json();
        let east = v["links"]["east"].as_array().expect("east");
        assert_eq!(east.len(), KEEP);
        // The oldest kept is 50 samples in; the newest is the last recorded.
        assert_eq!(east[0], json!([50_000, 500, 50]));
        assert_eq!(
            east[KEEP - 1],
            json!([
                1_000 * (KEEP as u64 + 49),
                10 * (KEEP as u64 + 49),
                KEEP as u64 + 49
            ])
        );
        assert!(v["links"].get("west").is_none(), "west left: {v}");
        assert_eq!(v["intervalSeconds"], 1);
    }
}
