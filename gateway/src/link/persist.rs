//! A link's quarantine and containments on disk: restored when the link starts, saved and
//! cleared off its task as they change (a view can be megabytes), in order.

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::churn::Engine;
use crate::churn::restore::Saved;
use crate::persist::LinkDir;
use crate::persist::contained::ContainedSnapshot;
use crate::view::View;

/// Saving and clearing a quarantine and the containments, in order, off the link's task (a view
/// can be megabytes).
pub(super) enum Persist {
    Save(crate::churn::quarantine::Quarantine, Instant),
    Clear,
    Contained(Vec<ContainedSnapshot>, Instant),
}

/// Persistence requests waiting; transitions are rare, 8 is plenty, and a full queue makes the
/// link wait rather than lose the order of save and clear.
const PERSIST_QUEUE: usize = 8;

/// Hands `op` to the persister, if the link has a state directory; waits while its queue is
/// full rather than lose the order of save and clear.
pub(super) async fn save(persist: Option<&mpsc::Sender<Persist>>, op: Persist) {
    if let Some(p) = persist {
        let _ = p.send(op).await;
    }
}

/// Restores a quarantine and containments: `seed`'s (a peer's view), then the state
/// directory's.
pub(super) fn restore(
    engine: &mut Engine,
    dir: Option<&LinkDir>,
    seed: Option<Saved>,
    now: Instant,
) {
    if let Some(saved) = seed {
        engine.restore_quarantined(now, saved);
    }
    let Some(d) = dir else { return };
    match d.load(now) {
        Ok(Some(saved)) => {
            tracing::warn!(
                objects = saved.objects.len(),
                reason = %saved.trigger.reason,
                "restored a quarantine from disk: serving its view until released"
            );
            engine.restore_quarantined(now, saved);
        }
        Ok(None) => {}
        Err(e) => tracing::error!(error = %e, "ignoring the saved quarantine"),
    }
    match d.load_contained(now) {
        Ok(saved) if !saved.is_empty() => {
            tracing::warn!(
                services = saved.len(),
                "restored contained services from disk: serving their saved state until released"
            );
            engine.restore_contained(now, saved);
        }
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "ignoring the saved containments"),
    }
}

/// The contained services with the state each published, as served, to save.
pub(super) fn contained_snapshot(engine: &Engine) -> Vec<ContainedSnapshot> {
    engine
        .contained()
        .into_iter()
        .map(|c| ContainedSnapshot {
            objects: engine
                .published_keys(&c.service)
                .iter()
                .filter_map(|k| engine.view().get(k))
                .filter_map(|s| serde_json::from_slice(&s.json()).ok())
                .collect(),
            service: c.service,
            trigger: c.quarantine.trigger,
            since: c.quarantine.since,
            cooldown: c.quarantine.cooldown,
        })
        .collect()
}

pub(super) fn spawn_persister(dir: LinkDir, view: View) -> mpsc::Sender<Persist> {
    let (tx, mut rx) = mpsc::channel::<Persist>(PERSIST_QUEUE);
    tokio::spawn(async move {
        while let Some(op) = rx.recv().await {
            let (d, view) = (dir.clone(), view.clone());
            let (what, result) = match op {
                // The view is frozen while quarantined: what it holds now is what is served.
                Persist::Save(q, now) => (
                    "saving the quarantine",
                    tokio::task::spawn_blocking(move || d.save(&q, now, &view)).await,
                ),
                Persist::Clear => (
                    "clearing the quarantine",
                    tokio::task::spawn_blocking(move || d.clear()).await,
                ),
                Persist::Contained(services, now) => (
                    "saving the contained services",
                    tokio::task::spawn_blocking(move || d.save_contained(services, now)).await,
                ),
            };
            match result {
                Ok(Ok(())) => tracing::info!("{what} on disk: done"),
                Ok(Err(e)) => tracing::error!(error = %e, "{what} on disk failed"),
                Err(e) => tracing::error!(error = %e, "the quarantine writer panicked"),
            }
        }
    });
    tx
}
