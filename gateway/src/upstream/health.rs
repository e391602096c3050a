//! Whether the remote answers: the link's watchers report their failures here, and a probe
//! clears the mark once the remote answers again, so the link can say `Degraded` (with a
//! reason and since when) within seconds of the remote going away, while it keeps serving its
//! view, and `Healthy` again once the remote is back.
//!
//! A watcher cannot say by itself that the remote is back: a resumed watch on a quiet remote
//! yields nothing until something changes. So while the remote is marked unreachable,
//! [`probe`] asks it for `/version` every [`PROBE_EVERY`], and clears the mark once it answers
//! and no watcher has failed for [`QUIET`] (a watcher that keeps failing, say on a resource
//! the credentials may not read, keeps the link Degraded instead of flapping).
//!
//! Nor can an open watch say that the remote is gone: a kube-apiserver stopped gracefully (a
//! rolling upgrade, a drained node) stops listening at once but keeps its open watches about
//! 60 s, sending nothing on them (58 s measured); nor does a remote that revokes our RBAC end
//! the watches it allowed. So while the remote counts as reachable, [`probe`] lists one
//! selected Service (metadata only, `limit=1`) every [`LIVENESS_EVERY`], on a connection of
//! the client's pool (an idle one the server keeps, or a new one: a stopping server closes its
//! idle ones), and marks the remote unreachable when it refuses (our credentials, or the
//! connection) or does not answer within [`LIVENESS_TIMEOUT`]: `Degraded` within about 6 s,
//! whatever the open watches do. Behind a balancer, another server answers and the link stays
//! `Healthy`.
//!
//! A watcher whose connection breaks with no answer from the remote ([`Health::suspect`]) does
//! not mark it unreachable by itself: a server that exits closes the connections it kept (the
//! pool may hand a watcher's resume one of them), and behind a balancer another server answers.
//! The probe asks at once, twice if its first try breaks on such a connection, and only if the
//! remote does not answer does it count as unreachable, with the watcher's reason. The same
//! watcher breaking again within [`QUIET`] is a failure: a remote that answers probes but breaks
//! a watch each time is not a healthy one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::Client;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How often an unreachable remote is asked whether it is back.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How often a remote that counts as reachable is asked whether it still answers new requests
/// and still lets us read.
pub const LIVENESS_EVERY: Duration = Duration::from_secs(3);

/// How long a liveness probe waits for its answer: a remote that answers takes milliseconds,
/// one under load a second or two.
pub const LIVENESS_TIMEOUT: Duration = Duration::from_secs(3);

/// How long no watcher may have failed before the remote counts as back: longer than the
/// watchers' longest backoff ([`super::WATCH_BACKOFF`]), so a watcher that keeps failing fails
/// again within it.
pub const QUIET: Duration = Duration::from_secs(7);

/// An outage this long is logged a second time, at WARN (the first line comes when it
/// begins): one that lasts is worth a second look, one line per retry is not.
pub const LONG_OUTAGE: Duration = Duration::from_secs(60);

/// Why and since when the remote does not answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreachable {
    /// When the first failure of this outage happened (wall clock, for people).
    pub since: jiff::Timestamp,
    /// The first failure of this outage.
    pub reason: String,
}

/// What a link's message says while its remote does not answer, before the time it stopped
/// (`floodgate status` reads it back).
pub const UNREACHABLE_SINCE: &str = "unreachable since ";

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the remote is {UNREACHABLE_SINCE}{}: {}",
            self.since.round(jiff::Unit::Second).unwrap_or(self.since),
            self.reason
        )
    }
}

/// The remote's health as the watchers see it.
#[derive(Debug)]
pub struct Health {
    state: watch::Sender<Option<Unreachable>>,
    last_failure: Mutex<Option<Instant>>,
    /// When the outage began, and whether its length was logged.
    down_since: Mutex<Option<(Instant, bool)>>,
    /// Outages so far.
    outages: std::sync::atomic::AtomicU64,
    /// When each watcher last broke on its connection ([`Health::suspect`]).
    suspects: Mutex<HashMap<&'static str, Instant>>,
    /// The reason of the suspicion the probe is asked to check, and its wake-up.
    suspicion: Mutex<Option<String>>,
    check: Notify,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            state: watch::channel(None).0,
            last_failure: Mutex::new(None),
            down_since: Mutex::new(None),
            outages: std::sync::atomic::AtomicU64::new(0),
            suspects: Mutex::new(HashMap::new()),
            suspicion: Mutex::new(None),
            check: Notify::new(),
        }
    }
}

impl Health {
    /// A watcher failed to reach or read the remote. The first failure of an outage is logged
    /// at WARN (one line an outage, however often the watchers retry); the next ones at DEBUG.
    /// Returns true for the first.
    pub fn failed(&self, reason: impl std::fmt::Display) -> bool {
        let now = Instant::now();
        *self.last_failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        let first = self.state.send_if_modified(|s| {
            if s.is_some() {
                return false;
            }
            tracing::warn!(%reason, "the remote is unreachable; the link keeps serving its view");
            *s = Some(Unreachable {
                since: jiff::Timestamp::now(),
                reason: reason.to_string(),
            });
            true
        });
        if first {
            self.outages
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *self.down_since.lock().unwrap_or_else(|e| e.into_inner()) = Some((now, false));
        } else {
            tracing::debug!(%reason, "the remote is still unreachable");
        }
        first
    }

    /// Watcher `who`'s connection broke with no answer from the remote: the probe checks the
    /// remote at once and marks it unreachable, with `reason`, only if it does not answer. A
    /// failure at once if the remote is marked already, or `who` broke within [`QUIET`] before.
    pub fn suspect(&self, who: &'static str, reason: impl std::fmt::Display) {
        let now = Instant::now();
        let again = {
            let mut suspects = self.suspects.lock().unwrap_or_else(|e| e.into_inner());
            let before = suspects.insert(who, now);
            before.is_some_and(|t| now.duration_since(t) < QUIET)
        };
        if again || self.state.borrow().is_some() {
            self.failed(reason);
            return;
        }
        (self.suspicion.lock().unwrap_or_else(|e| e.into_inner()))
            .get_or_insert_with(|| reason.to_string());
        self.check.notify_one();
    }

    /// The suspicion to check, if any (taken).
    fn take_suspicion(&self) -> Option<String> {
        self.suspicion
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Logs once, at WARN, an outage that has lasted past [`LONG_OUTAGE`].
    fn note_long_outage(&self) {
        let mut down = self.down_since.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((since, noted @ false)) = down.as_mut()
            && since.elapsed() >= LONG_OUTAGE
        {
            *noted = true;
            let reason = self
                .state
                .borrow()
                .as_ref()
                .map(|u| u.reason.clone())
                .unwrap_or_default();
            tracing::warn!(
                away = ?since.elapsed(),
                %reason,
                "the remote is still unreachable; the link keeps serving its view"
            );
        }
    }

    /// Outages so far: each begins with the first failure after the remote answered.
    pub fn outages(&self) -> u64 {
        self.outages.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Why the remote is unreachable, if it is.
    pub fn unreachable(&self) -> Option<Unreachable> {
        self.state.borrow().clone()
    }

    /// Changes of [`Health::unreachable`].
    pub fn subscribe(&self) -> watch::Receiver<Option<Unreachable>> {
        self.state.subscribe()
    }

    /// The remote answered a stream that failed before (a follower's one stream of its
    /// holder's view, [`crate::link`]): the mark is cleared at once.
    pub fn answered(&self) {
        if self.state.borrow().is_some() {
            *self.last_failure.lock().unwrap_or_else(|e| e.into_inner()) = None;
            self.clear_if_quiet();
        }
    }

    /// Clears the mark if no watcher failed for [`QUIET`]; true if it is clear.
    fn clear_if_quiet(&self) -> bool {
        let quiet = self
            .last_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none_or(|t| t.elapsed() >= QUIET);
        if quiet && self.state.borrow().is_some() {
            let down = self
                .down_since
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            let away = down.map(|(since, _)| since.elapsed()).unwrap_or_default();
            tracing::info!(away = ?away, "the remote answers again");
            self.state.send_replace(None);
        }
        quiet
    }
}

/// Runs for the life of an upstream: while the remote is marked unreachable, asks it for
/// `/version` every [`PROBE_EVERY`] and clears the mark once it answers and the watchers are
/// quiet; while it counts as reachable, lists one Service of `selector` every
/// [`LIVENESS_EVERY`] and marks it unreachable when it refuses or does not answer (see the
/// module's docs).
pub(super) async fn probe(
    client: Client,
    selector: String,
    health: std::sync::Arc<super::UpstreamCounters>,
) {
    let services: kube::Api<k8s_openapi::api::core::v1::Service> = kube::Api::all(client.clone());
    let one = kube::api::ListParams::default().labels(&selector).limit(1);
    let mut changes = health.health.subscribe();
    loop {
        if changes.borrow_and_update().is_none() {
            let timer = tokio::time::sleep(LIVENESS_EVERY);
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    continue;
                }
                () = health.health.check.notified() => {}
                () = timer => {}
            }
            let suspicion = health.health.take_suspicion();
            // A suspicion is tried twice: its first try may break on a connection the
            // stopping server closed too.
            let tries = if suspicion.is_some() { 2 } else { 1 };
            let mut failure = None;
            for _ in 0..tries {
                let asked =
                    tokio::time::timeout(LIVENESS_TIMEOUT, services.list_metadata(&one)).await;
                failure = match asked {
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => Some(match super::fault::refusal(&e) {
                        Some(s) => {
                            health.refusals.fetch_add(1, Ordering::Relaxed);
                            super::fault::refused(s, "listing services")
                        }
                        None => format!("listing services: {e}"),
                    }),
                    Err(_) => Some(format!(
                        "listing services: no answer within {LIVENESS_TIMEOUT:?}"
                    )),
                };
                if failure.is_none() {
                    break;
                }
            }
            if let Some(failure) = failure {
                health.health.failed(suspicion.unwrap_or(failure));
            }
            continue;
        }
        tokio::time::sleep(PROBE_EVERY).await;
        health.health.note_long_outage();
        let answered = tokio::time::timeout(PROBE_EVERY * 5, client.apiserver_version()).await;
        if let Ok(Ok(_)) = answered {
            health.health.clear_if_quiet();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_first_failure_of_an_outage_is_kept_and_only_quiet_clears_it() {
        let h = Health::default();
        assert_eq!(h.unreachable(), None);
        assert!(h.failed("connection refused"), "the outage's first failure");
        let first = h.unreachable().expect("unreachable");
        assert!(!h.failed("timed out"), "a retry is no new outage");
        assert_eq!(
            h.unreachable(),
            Some(first.clone()),
            "since and reason of the first"
        );
        assert!(first.to_string().contains("connection refused"), "{first}");
        assert!(!h.clear_if_quiet(), "a failure just now");
        tokio::time::advance(QUIET).await;
        assert!(h.clear_if_quiet());
        assert_eq!(h.unreachable(), None);
    }

    /// A watcher's broken connection is a suspicion for the probe to check, not an outage; the
    /// same watcher breaking again within `QUIET` is one, with its reason.
    #[tokio::test(start_paused = true)]
    async fn a_broken_watch_is_checked_before_it_counts_and_a_second_counts() {
        let h = Health::default();
        h.suspect("Service", "watching Service: connection closed");
        h.suspect("Pod", "watching Pod: connection closed");
        assert_eq!(h.unreachable(), None, "suspected, not marked");
        assert_eq!(
            h.take_suspicion().as_deref(),
            Some("watching Service: connection closed"),
            "the first suspicion is checked"
        );
        tokio::time::timeout(Duration::from_secs(1), h.check.notified())
            .await
            .expect("the probe is woken");
        tokio::time::advance(QUIET).await;
        h.suspect("Service", "watching Service: connection closed");
        assert_eq!(h.unreachable(), None, "a QUIET later: a new suspicion");
        h.suspect("Service", "watching Service: connection refused");
        let u = h
            .unreachable()
            .expect("the same watcher again: unreachable");
        assert!(u.reason.contains("connection refused"), "{u}");
    }
}
