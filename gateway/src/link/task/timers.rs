//! The instants a link's task keeps ([`Timers`]): when the engine is to be polled next, until
//! when counts do not wake the task, and since when the link has waited for its first sync.

use std::time::Duration;

use tokio::time::Instant;

/// How often, at most, a link publishes its state again for what its watchers and its
/// follower count; an idle link is not woken at all.
pub(super) const STATE_REFRESH: Duration = Duration::from_secs(1);

/// When the task wakes on its own, and when the link began.
pub(super) struct Timers {
    /// When the engine is to be polled next ([`crate::churn::Engine::poll`]); `None`: only
    /// when something happens.
    pub next_wake: Option<Instant>,
    /// Until when counts do not wake the task ([`super::Happened::Counted`]); `None`: they do.
    pub counts_wake_at: Option<Instant>,
    /// When the link began, until its first sync is logged.
    first_sync: Option<Instant>,
}

impl Timers {
    /// For a link that begins `now`.
    pub(super) fn new(now: Instant) -> Self {
        Self {
            next_wake: None,
            counts_wake_at: None,
            first_sync: Some(now),
        }
    }

    /// The state was published for what was counted: counts wake the task again only after
    /// [`STATE_REFRESH`].
    pub(super) fn counted(&mut self, now: Instant) {
        self.counts_wake_at = Some(now + STATE_REFRESH);
    }

    /// [`STATE_REFRESH`] has passed: counts wake the task again.
    pub(super) fn rearm(&mut self) {
        self.counts_wake_at = None;
    }

    /// When the link began, once: the first time it is asked for after `synced`.
    pub(super) fn first_sync(&mut self, synced: bool) -> Option<Instant> {
        self.first_sync.take_if(|_| synced)
    }
}
