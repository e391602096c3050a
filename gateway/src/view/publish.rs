//! How a publication goes into the view without holding readers up: [`View::plan`] reads
//! what each change replaces under the read lock, [`encode`] encodes the objects with the
//! versions they will have under no lock, and [`View::commit`] takes the write lock for the
//! inserts, the history and the feed. [`View::apply`] runs the three under the writer mutex.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::{COUNTER_MASK, Change, Event, EventType, Stored, View};
use crate::model::{ObjKey, Object};

/// One change of a publication, planned: what it does and what it replaces.
pub(super) struct Planned {
    kind: EventType,
    new: Option<Object>,
    old: Option<Old>,
}

/// The state a change replaces.
pub(super) enum Old {
    /// The view's.
    View(Arc<Stored>),
    /// The one an earlier change of the same batch gives (its index).
    Batch(usize),
}

/// Encodes planned changes with versions from `next` on, in order (no lock is held: this is
/// where a publication spends its time).
pub(super) fn encode(next: u64, planned: Vec<Planned>) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::with_capacity(planned.len());
    for (i, p) in planned.into_iter().enumerate() {
        let rv = next + i as u64;
        let old = match p.old {
            Some(Old::View(o)) => Some(o),
            Some(Old::Batch(j)) => Some(events[j].object.clone()),
            None => None,
        };
        let (stored, frame) = match (p.new, &old) {
            (Some(o), _) => Stored::framed(o, rv, p.kind),
            // The last state, re-versioned so the deletion has a version of its own.
            (None, Some(last)) => Stored::framed(last.object.clone(), rv, p.kind),
            // Planned away (a deletion of nothing); a skipped version would do no harm.
            (None, None) => continue,
        };
        events.push(Event {
            resource_version: rv,
            kind: p.kind,
            frame,
            object: Arc::new(stored),
            previous: old.filter(|_| p.kind == EventType::Modified),
        });
    }
    events
}

impl View {
    /// What each change replaces, under the read lock: the view's state of its object, or the
    /// state an earlier change of the same batch gives it. No-ops are dropped here. Returns the
    /// first version the batch will use.
    pub(super) fn plan(&self, changes: impl IntoIterator<Item = Change>) -> (u64, Vec<Planned>) {
        let s = self.read();
        let mut planned: Vec<Planned> = Vec::new();
        // The latest planned change of each key changed more than once in this batch.
        let mut latest: HashMap<ObjKey, usize> = HashMap::new();
        for change in changes {
            let (key, new) = match change {
                Change::Upsert(o) => (o.key(), Some(o)),
                Change::Delete(k) => (k, None),
            };
            let old = match latest.get(&key) {
                Some(&i) => planned[i].new.as_ref().map(|_| Old::Batch(i)),
                None => s
                    .shelf(key.kind)
                    .objects
                    .get(&key.id)
                    .cloned()
                    .map(Old::View),
            };
            let old_object = match &old {
                Some(Old::View(o)) => Some(&o.object),
                Some(Old::Batch(i)) => planned[*i].new.as_ref(),
                None => None,
            };
            let kind = match (old_object, &new) {
                (Some(old), Some(new)) if old == new => continue,
                (None, None) => continue,
                (None, Some(_)) => EventType::Added,
                (Some(_), Some(_)) => EventType::Modified,
                (Some(_), None) => EventType::Deleted,
            };
            latest.insert(key, planned.len());
            planned.push(Planned { kind, new, old });
        }
        (s.base | ((s.counter + 1) & COUNTER_MASK), planned)
    }

    /// Whether applying `changes` would change anything: an object upserted that the view
    /// does not hold as it is, or one deleted that it holds.
    pub fn would_change(&self, changes: &[Change]) -> bool {
        let s = self.read();
        changes.iter().any(|c| match c {
            Change::Upsert(o) => {
                let key = o.key();
                let held = s.shelf(key.kind).objects.get(&key.id);
                held.is_none_or(|h| &h.object != o)
            }
            Change::Delete(k) => s.shelf(k.kind).objects.contains_key(&k.id),
        })
    }

    /// Puts encoded events in: objects, byte count, history and feed, under the write lock.
    /// The history holds them as published at `now`.
    /// Consumers waiting for a version ([`View::wait_issued`]) look again once it is done.
    pub(super) fn commit(&self, events: &[Event], now: Instant) {
        self.commit_locked(events, now);
        self.advanced.notify_waiters();
    }

    fn commit_locked(&self, events: &[Event], now: Instant) {
        let Some(last) = events.last() else { return };
        let mut s = self.write();
        // Never back: a follower's snapshot sets the version above its changes' own.
        s.counter = s.counter.max(last.resource_version & COUNTER_MASK);
        for e in events {
            let key = e.object.object.key();
            let shelf = s.shelf_mut(key.kind);
            let old = match e.kind {
                EventType::Deleted => shelf.objects.remove(&key.id),
                _ => shelf.objects.insert(key.id, e.object.clone()),
            };
            s.json_bytes -= old.map_or(0, |o| o.json_len());
            if e.kind != EventType::Deleted {
                s.json_bytes += e.object.json_len();
            }
            if s.history_len == s.history_cap {
                s.evict_oldest();
            }
            let shelf = s.shelf_mut(key.kind);
            shelf.history.push_back((now, e.kept()));
            shelf.send(e);
            s.history_len += 1;
        }
        s.send_all(events);
    }
}
