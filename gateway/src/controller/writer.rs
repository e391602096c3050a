//! The status writer: one task that receives the status each link should have through a
//! bounded channel and patches the status subresource, linkerd policy-controller style.
//!
//! - Only links whose Lease this replica holds are written; the check is made right before
//!   each patch, so losing a lease stops writing at once.
//! - Patches are merge diffs against what was last written (or, first, what the cluster has).
//! - Transitions (phase, conditions, quarantine) are written at once; counter changes wait
//!   for the link's next slot, one write per `interval`.
//! - Each write that changes the recorded phase is reported ([`PhaseChange`]), so Events follow
//!   exactly the transitions the status records, written by the holder.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use floodgate_link_crd::{Link, LinkStatus, Phase};
use futures_util::future::BoxFuture;
use kube::Resource as _;
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::status::{is_transition, status_patch};
use crate::churn::quarantine::{StateName, Transition};

/// Status updates waiting for the writer. The controller sends one per link per tick and
/// skips a tick when the queue is full (the next tick carries the latest state), so 256 is
/// room for every link of a large Floodgate at once without holding stale states.
pub const STATUS_QUEUE: usize = 256;

/// The status a link should have, with what the cluster showed last.
#[derive(Debug, Clone)]
pub struct StatusUpdate {
    /// The link.
    pub link: String,
    /// Its status as the controller's cache last saw it.
    pub observed: Option<LinkStatus>,
    /// The status it should have.
    pub status: LinkStatus,
}

/// Where patches go: the status subresource in production, a recorder in tests.
pub trait StatusApi: Send + Sync + 'static {
    /// Applies a JSON merge patch to `link`'s status.
    fn patch(&self, link: &str, patch: Value) -> BoxFuture<'static, Result<(), kube::Error>>;
}

/// The status subresource of Links in one namespace.
#[derive(Clone, Debug)]
pub struct KubeStatusApi(pub kube::Api<floodgate_link_crd::Link>);

impl StatusApi for KubeStatusApi {
    fn patch(&self, link: &str, patch: Value) -> BoxFuture<'static, Result<(), kube::Error>> {
        let api = self.0.clone();
        let link = link.to_owned();
        Box::pin(async move {
            api.patch_status(
                &link,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(patch),
            )
            .await
            .map(|_| ())
        })
    }
}

/// A status write that changed the link's recorded phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseChange {
    /// The link.
    pub link: String,
    /// The phase recorded before (`None`: no status yet).
    pub from: Option<Phase>,
    /// The phase now recorded.
    pub to: Phase,
}

/// Phase changes waiting for the controller to record Events: phases change a few times a
/// minute at most; when the queue is full the Event is dropped (the status still says it).
pub const PHASE_CHANGES: usize = 64;

#[derive(Debug)]
struct Pending {
    observed: Option<LinkStatus>,
    status: LinkStatus,
}

/// Runs the writer until `updates` closes.
pub async fn run(
    updates: mpsc::Receiver<StatusUpdate>,
    api: impl StatusApi,
    held: watch::Receiver<BTreeSet<String>>,
    interval: Duration,
) {
    run_reporting(updates, api, held, interval, None).await;
}

/// [`run`], reporting each write that changes a link's recorded phase on `changes`.
pub async fn run_reporting(
    mut updates: mpsc::Receiver<StatusUpdate>,
    api: impl StatusApi,
    held: watch::Receiver<BTreeSet<String>>,
    interval: Duration,
    changes: Option<mpsc::Sender<PhaseChange>>,
) {
    let mut pending: HashMap<String, Pending> = HashMap::new();
    let mut written: HashMap<String, (LinkStatus, Instant)> = HashMap::new();
    // Slots are checked at a tenth of the interval: a counter update waits at most that long
    // past its slot.
    let mut tick = tokio::time::interval((interval / 10).max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            u = updates.recv() => match u {
                Some(u) => {
                    pending.insert(u.link, Pending { observed: u.observed, status: u.status });
                }
                None => break,
            },
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let links: Vec<String> = pending.keys().cloned().collect();
        for link in links {
            if !held.borrow().contains(&link) {
                // Not ours (or not yet): forget what we wrote, so a later holding starts from
                // the cluster's status, not from what we wrote before another replica did; keep
                // the latest status (one per link), so it is written as soon as the lease is
                // ours: a status computed once (an invalid spec) must not be lost to a race
                // with the first lease acquisition.
                written.remove(&link);
                continue;
            }
            let Some(p) = pending.get(&link) else {
                continue;
            };
            let last = written.get(&link);
            let base = last.map(|(s, _)| s).or(p.observed.as_ref());
            let due = last.is_none_or(|(_, at)| now.duration_since(*at) >= interval);
            if !due && !is_transition(base, &p.status) {
                continue;
            }
            let Some(patch) = status_patch(base, &p.status) else {
                pending.remove(&link);
                continue;
            };
            // The lease is checked again right before writing.
            if !held.borrow().contains(&link) {
                continue;
            }
            let from = base.and_then(|b| b.phase);
            match api.patch(&link, patch).await {
                Ok(()) => {
                    if let (Some(tx), Some(to)) = (&changes, p.status.phase)
                        && from != Some(to)
                    {
                        let _ = tx.try_send(PhaseChange {
                            link: link.clone(),
                            from,
                            to,
                        });
                    }
                    if let Some(p) = pending.remove(&link) {
                        written.insert(link, (p.status, now));
                    }
                }
                Err(e) => tracing::warn!(%link, error = %e, "cannot write the link's status"),
            }
        }
    }
}

/// Records a phase change as an Event on the Link (off the loop: the API call may be slow).
pub fn record_event(recorder: &Recorder, link: &Link, change: &PhaseChange, note: Option<String>) {
    let ev = Event {
        type_: if change.to == Phase::Healthy {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason: change.to.as_str().to_owned(),
        note: Some(
            note.filter(|n| !n.is_empty())
                .unwrap_or_else(|| phase_note(change)),
        ),
        action: "PhaseChange".into(),
        secondary: None,
    };
    let reference = link.object_ref(&());
    let recorder = recorder.clone();
    tokio::spawn(async move {
        if let Err(e) = recorder.publish(&ev, &reference).await {
            tracing::warn!(error = %e, "cannot record an Event");
        }
    });
}

/// What a phase change means, for an Event whose link has no message of its own to give.
fn phase_note(change: &PhaseChange) -> String {
    let from = change.from.map_or_else(
        || "no status yet".to_owned(),
        |p| format!("was {}", p.as_str()),
    );
    let what = match change.to {
        Phase::Healthy => "the link follows its remote and publishes within its budget",
        Phase::Throttled => {
            "publications wait for tokens: the link's or a service's rate limit is spent; \
             changes are coalesced, none is lost"
        }
        Phase::Quarantined => "the link serves its last good view until it is released",
        Phase::Degraded => "the link cannot follow its remote; it serves its view",
    };
    format!("{} ({from}): {what}", change.to.as_str())
}

/// The Event of a service's containment transition: a Warning when it is contained, Normal
/// when its re-check starts or it is released. The reason is the transition's cause
/// (`ServiceEventRate`, `Released`..); the note names the service.
pub fn service_event(t: &Transition) -> Event {
    let contained = t.to == StateName::Contained;
    let service = t
        .service
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    Event {
        type_: if contained {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: t.reason.as_str().to_owned(),
        note: Some(format!("service {service}: {}", t.message)),
        action: if contained {
            "ContainService".into()
        } else {
            "ReleaseService".into()
        },
        secondary: None,
    }
}

/// Records a service's containment transition as an Event on the Link (off the loop).
pub fn record_service_event(recorder: &Recorder, link: &Link, t: &Transition) {
    let ev = service_event(t);
    let reference = link.object_ref(&());
    let recorder = recorder.clone();
    tokio::spawn(async move {
        if let Err(e) = recorder.publish(&ev, &reference).await {
            tracing::warn!(error = %e, "cannot record an Event");
        }
    });
}

#[cfg(test)]
mod tests;
