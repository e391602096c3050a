//! The watch events of pods the pod watcher skips (no one wants them), counted by ReplicaSet and
//! sent on in batches ([`Change::Skipped`](crate::churn::Change::Skipped)): still churn of the
//! services that serve that ReplicaSet's pods, but never decoded, held or queued one by one.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::NsName;

/// How long a pod watcher gathers the watch events of pods it skips before it sends their
/// counts on (one message a ReplicaSet): well within the flood detector's one-second buckets,
/// and a flood's thousands of skipped events a second cost the upstream queue a few messages.
pub(super) const SKIPPED_SEND: Duration = Duration::from_millis(100);

/// ReplicaSets whose skipped pod events a pod watcher counts in one batch: a remote with more
/// churning ReplicaSets in [`SKIPPED_SEND`] than this is counted for the first ones only (a map
/// entry is about 60 bytes).
pub(super) const SKIPPED_OWNERS_MAX: usize = 4096;

/// Watch events of skipped pods by ReplicaSet, since the first of them.
#[derive(Debug, Default)]
pub(super) struct SkippedEvents {
    by_owner: HashMap<NsName, u64>,
    since: Option<Instant>,
}

impl SkippedEvents {
    /// One event of a skipped pod of ReplicaSet `owner`, read `at`.
    pub(super) fn count(&mut self, owner: NsName, at: Instant) {
        let full = self.by_owner.len() >= SKIPPED_OWNERS_MAX;
        match self.by_owner.get_mut(&owner) {
            Some(n) => *n += 1,
            None if !full => {
                self.by_owner.insert(owner, 1);
            }
            None => {}
        }
        self.since.get_or_insert(at);
    }

    /// When the counts are due to be sent, if there are any.
    pub(super) fn due(&self) -> Option<Instant> {
        self.since.map(|s| s + SKIPPED_SEND)
    }

    /// The counts and when the first of them was read; none are left.
    pub(super) fn take(&mut self) -> Option<(Instant, HashMap<NsName, u64>)> {
        let since = self.since.take()?;
        Some((since, std::mem::take(&mut self.by_owner)))
    }
}
