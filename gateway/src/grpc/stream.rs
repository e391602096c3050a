//! One `WatchEndpoints` stream: a task that follows a link's view and sends snapshots.
//!
//! Flow: wait for the link's first sync; [`Index::resync`] (one snapshot per current service);
//! then fold every view change into the index and mark its service dirty. A snapshot is built
//! only when the stream's bounded channel has room, from the index as it is then, so a slow
//! consumer gets the latest state of each changed service once, never a queue of stale ones:
//! what waits for a slow consumer is a set of service names, at most one entry per service.
//! When the view's feed reports this stream lagged (it fell [`crate::view::FANOUT_BACKLOG`]
//! changes behind), it resyncs and resends every service rather than guess what it missed.

use std::collections::BTreeSet;
use std::sync::Arc;

use floodgate_link_crd::Phase;
use floodgate_proto::v1::EndpointSnapshot;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};
use tonic::Status;

use super::MirrorLink;
use super::index::Index;
use crate::link::LinkState;
use crate::model::NsName;

/// Snapshots built and waiting for the consumer, per stream. Snapshots are only built when
/// there is room, so this bounds the stream's memory to this many snapshots of at most
/// `maxEndpointsPerService` endpoints (about 100 KB each at the default 1000): 16 keeps
/// HTTP/2's send window busy without holding more than a couple of MB for a stuck consumer.
pub const STREAM_BUFFER: usize = 16;

/// Messages of one stream.
pub type Sender = mpsc::Sender<Result<EndpointSnapshot, Status>>;

/// Whether a phase change resends every snapshot: only into or out of Quarantined or Degraded
/// (what a consumer may act on); Healthy and Throttled alternate often under load and ride on
/// the next snapshot.
pub fn resend_on(from: Phase, to: Phase) -> bool {
    let notable = |p| matches!(p, Phase::Quarantined | Phase::Degraded);
    from != to && (notable(from) || notable(to))
}

/// The services a link contains now.
fn contained(s: &LinkState) -> BTreeSet<NsName> {
    s.containment
        .contained
        .iter()
        .map(|c| c.service.clone())
        .collect()
}

/// Runs one stream until the consumer goes away, the link stops or Floodgate shuts down.
pub async fn run(
    link: Arc<MirrorLink>,
    only: Option<NsName>,
    tx: Sender,
    mut shutdown: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    let mut state = link.state.clone();
    tokio::select! {
        r = state.wait_for(|s| s.synced) => if r.is_err() { return },
        _ = shutdown.wait_for(|s| *s) => return,
        () = tx.closed() => return,
    }
    let mut index = Index::new(only);
    let (mut rx, mut dirty) = index.resync(&link.view);
    let (mut phase, mut held) = {
        let s = state.borrow_and_update();
        (s.phase, contained(&s))
    };
    loop {
        tokio::select! {
            biased;
            _ = shutdown.wait_for(|s| *s) => return,
            () = tx.closed() => return,
            r = rx.recv() => {
                let mut next = r;
                // Take what is queued before building anything: more coalescing.
                loop {
                    match next {
                        Ok(event) => dirty.extend(index.apply(&event)),
                        Err(RecvError::Lagged(missed)) => {
                            tracing::debug!(link = %link.name, missed, "stream lagged: resending every snapshot");
                            let (new_rx, all) = index.resync(&link.view);
                            rx = new_rx;
                            dirty.extend(all);
                        }
                        // The view replaced its feed (a disconnect): start over from it.
                        Err(RecvError::Closed) => {
                            let (new_rx, all) = index.resync(&link.view);
                            rx = new_rx;
                            dirty.extend(all);
                            break;
                        }
                    }
                    next = match rx.try_recv() {
                        Ok(e) => Ok(e),
                        Err(TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
                        Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                    };
                }
            }
            r = state.changed() => {
                if r.is_err() {
                    return;
                }
                let (now, now_held) = {
                    let s = state.borrow_and_update();
                    (s.phase, contained(&s))
                };
                if resend_on(phase, now) {
                    dirty.extend(index.keys());
                }
                if now_held != held {
                    let changed = now_held.symmetric_difference(&held);
                    dirty.extend(changed.filter(|id| index.covers(id)).cloned());
                    held = now_held;
                }
                phase = now;
            }
            permit = tx.reserve(), if !dirty.is_empty() => {
                let Ok(permit) = permit else { return };
                if let Some(id) = dirty.pop_first() {
                    let now = state.borrow().phase;
                    let mut snap = index.snapshot(&id, now);
                    snap.contained = held.contains(&id);
                    permit.send(Ok(snap));
                }
            }
        }
    }
}
