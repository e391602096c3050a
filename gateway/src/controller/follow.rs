//! How each replica follows the holder of a link's Lease: only the holder's engine decides
//! ([`decide_if_held`]); the others follow the quarantine and the containments the holder
//! recorded in the Link's status, and the holder follows its own record once, when its run
//! starts (a restart or a Lease move keeps them).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use floodgate_link_crd::{Link, Phase};
use kube::ResourceExt as _;
use kube::runtime::events::Recorder;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use super::writer;
use crate::churn::quarantine::Transition;
use crate::link::{self, LinkHandle};

/// How long a link that starts with no view of its own (no peer gave one) reads its remote
/// before it follows a recorded quarantine: long enough for a first sync (about a second
/// against a remote that floods), so it freezes the remote's capped view, not an empty one.
pub(super) const FOLLOW_GRACE: Duration = Duration::from_secs(10);

/// What one run of a link has followed of the holder's record, and what tells the link whether
/// it decides.
pub(super) struct Following {
    /// Whether the link's engine decides (this replica holds its Lease); a forwarder task
    /// passes each change to the link, in order.
    deciding: watch::Sender<bool>,
    /// What this replica last asked the link to follow: `Some(true)` quarantine, `Some(false)`
    /// release, `None` nothing yet.
    followed: Option<bool>,
    /// Whether this run has followed the recorded containments once (a holder does only that).
    followed_containment: bool,
    /// The link's service containment transitions not yet recorded as Events.
    transitions: broadcast::Receiver<Transition>,
    /// When this run started.
    started: Instant,
}

impl Following {
    /// A run of `handle`'s link, starting now. It starts measuring only: the lease loop's held
    /// set makes the holder decide (at the next status tick), so no replica acts on a flood
    /// before it knows it holds the Lease.
    pub(super) fn start(handle: &Arc<LinkHandle>) -> Self {
        let (deciding, deciding_rx) = watch::channel(false);
        tokio::spawn(forward_deciding(handle.clone(), deciding_rx));
        Self {
            deciding,
            followed: None,
            followed_containment: false,
            transitions: handle.transitions(),
            started: Instant::now(),
        }
    }
}

/// Only the Lease holder's engine acts on the floods it measures; every other replica's
/// engine measures and follows the holder's record ([`follow_quarantine`]).
pub(super) fn decide_if_held(name: &str, run: &Following, holder: bool) {
    if run
        .deciding
        .send_if_modified(|d| std::mem::replace(d, holder) != holder)
    {
        tracing::info!(link = %name, deciding = holder, "this replica's hold on the Lease changed");
    }
}

/// Records the link's service containment transitions as Events on the Link; only the holder
/// records them (the others' engines do not decide, so they have none to record).
pub(super) fn record_containment(
    recorder: &Recorder,
    link: &Link,
    run: &mut Following,
    holder: bool,
) {
    use tokio::sync::broadcast::error::TryRecvError;
    loop {
        match run.transitions.try_recv() {
            Ok(t) if holder => writer::record_service_event(recorder, link, &t),
            Ok(_) => {}
            Err(TryRecvError::Lagged(n)) => {
                tracing::warn!(link = %link.name_any(), missed = n, "service containment Events were dropped; the status still counts them");
            }
            Err(TryRecvError::Empty | TryRecvError::Closed) => return,
        }
    }
}

/// Passes `deciding`'s changes to the link in order, starting with its current value.
async fn forward_deciding(handle: Arc<LinkHandle>, mut deciding: watch::Receiver<bool>) {
    loop {
        let now = *deciding.borrow_and_update();
        if handle.set_deciding(now).await.is_err() || deciding.changed().await.is_err() {
            return;
        }
    }
}

/// Non-holders follow the quarantine the holder recorded in status: quarantine when it says
/// quarantined, release when the holder released it. The holder follows the record once, when
/// its run starts (a restart honours a persisted quarantine); after that its own engine
/// decides and the record follows it.
///
/// Returns true while following is put off: a link with nothing to freeze yet (no view of
/// its own) first serves its remote's first sync, capped, for up to [`FOLLOW_GRACE`].
pub(super) fn follow_quarantine(
    link: &Link,
    run: &mut Following,
    handle: &Arc<LinkHandle>,
    state: &link::LinkState,
    holder: bool,
) -> bool {
    let recorded = link.status.as_ref().and_then(|s| s.quarantine.as_ref());
    let local = state.phase == Phase::Quarantined;
    let want = match (recorded, local) {
        (Some(_), false) => true,
        (None, true) => false,
        _ => return false,
    };
    if (holder && run.followed.is_some()) || run.followed == Some(want) || (holder && !want) {
        run.followed.get_or_insert(want);
        return false;
    }
    if want && !state.synced && run.started.elapsed() < FOLLOW_GRACE {
        return true;
    }
    run.followed = Some(want);
    let handle = handle.clone();
    let message = recorded.map(|q| format!("recorded in status: {} ({})", q.reason, q.message));
    tokio::spawn(async move {
        let result = match message {
            Some(msg) => handle.quarantine(msg).await,
            None => {
                handle
                    .release("the Lease holder, as recorded in status")
                    .await
            }
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "following the recorded quarantine");
        }
    });
    false
}

/// Replicas follow the containments the holder recorded in status, as they follow its
/// quarantine: a non-holder contains what the record names and releases what it no longer
/// names (when the record names every contained service: status names the first
/// [`floodgate_link_crd::ContainedServicesStatus::FIRST`]); the holder, whose engine decides, follows the record
/// once when its run starts (a restart or a Lease move keeps the containments).
pub(super) fn follow_containment(
    link: &Link,
    run: &mut Following,
    handle: &Arc<LinkHandle>,
    state: &link::LinkState,
    holder: bool,
) {
    let Some(status) = link.status.as_ref() else {
        return;
    };
    if holder && run.followed_containment {
        return;
    }
    run.followed_containment = true;
    let recorded = status.contained_services.as_ref();
    let named = recorded.map_or(&[][..], |c| &c.first[..]);
    let complete = recorded.is_none_or(|c| usize::try_from(c.count) == Ok(c.first.len()));
    let local: BTreeSet<String> = state
        .containment
        .contained
        .iter()
        .map(|c| c.service.to_string())
        .collect();
    let mut contain = Vec::new();
    for c in named.iter().filter(|c| !local.contains(&c.service)) {
        let (Some((ns, name)), Ok(reason)) = (c.service.split_once('/'), c.reason.parse()) else {
            tracing::debug!(link = %link.name_any(), service = %c.service, reason = %c.reason, "a recorded containment this replica cannot read");
            continue;
        };
        let message = format!("recorded in status by the Lease holder: {}", c.message);
        let trigger = crate::churn::flood::Trigger::recorded(reason, message, c.figures.clone());
        contain.push((crate::model::NsName::new(ns, name), trigger));
    }
    let release: Vec<crate::model::NsName> = if holder || !complete {
        Vec::new()
    } else {
        state
            .containment
            .contained
            .iter()
            .filter(|c| !named.iter().any(|n| n.service == c.service.to_string()))
            .map(|c| c.service.clone())
            .collect()
    };
    if contain.is_empty() && release.is_empty() {
        return;
    }
    let handle = handle.clone();
    tokio::spawn(async move {
        for (svc, trigger) in contain {
            let _ = handle.follow_containment(svc, trigger).await;
        }
        for svc in release {
            if let Err(e) = handle
                .release_service(svc, "the Lease holder, as recorded in status")
                .await
            {
                tracing::debug!(error = %e, "following the recorded containments");
            }
        }
    });
}
