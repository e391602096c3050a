//! The published view of one link: what consumers see.
//!
//! The churn engine writes publications ([`View::apply`]); the facade and gRPC read snapshots
//! and follow changes. Each object is stored with Floodgate's own resource version and its JSON
//! encoded once, at publish time, so a LIST or a fan-out to many watchers writes bytes that
//! already exist. A history of changes, bounded by count and by age, lets a watcher resume from
//! a version it saw (the instants it keeps come from tokio's clock, so paused-time tests drive
//! them); a
//! broadcast channel fans changes out, with a bounded backlog per receiver.
//!
//! Resource versions are `incarnation << 40 | counter`: monotonic within one run, never 0, and
//! recognisably foreign when they come from another run or replica ([`ResumeError::Expired`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::model::{Kind, NsName, ObjKey, Object};

pub mod pages;

const COUNTER_BITS: u32 = 40;
const COUNTER_MASK: u64 = (1 << COUNTER_BITS) - 1;

/// Changes a receiver may fall behind before it is told it lagged (and the facade closes its
/// stream so the client resumes or relists). 4096 events is several seconds of a link's full
/// default budget (50 publications/s of a few objects each) while costing a few pointers each.
pub const FANOUT_BACKLOG: usize = 4096;

/// Changes kept for resumption. At the default budget this is minutes of history.
pub const DEFAULT_HISTORY: usize = 10_000;

/// The oldest change kept for resumption. A watcher away for longer relists, from Floodgate's
/// cache, at no cost to the remote; holding old states longer would only hold their memory.
pub const DEFAULT_HISTORY_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// One stored object.
#[derive(Debug)]
pub struct Stored {
    /// Floodgate's resource version of this state.
    pub resource_version: u64,
    /// The object, as served.
    pub object: Object,
    /// Its JSON, with `kind`, `apiVersion` and `metadata.resourceVersion`.
    pub json: Bytes,
}

impl Stored {
    /// Stamps `object` with a version and encodes it.
    pub fn new(object: Object, resource_version: u64) -> Self {
        let json = serde_json::to_vec(&object.to_json(&resource_version.to_string()))
            .unwrap_or_default()
            .into();
        Self {
            resource_version,
            object,
            json,
        }
    }
}

/// One watch frame: `{"type":..,"object":..}` and a newline.
pub fn frame(kind: &str, object_json: &[u8]) -> Bytes {
    let mut b = Vec::with_capacity(object_json.len() + 32);
    b.extend_from_slice(b"{\"type\":\"");
    b.extend_from_slice(kind.as_bytes());
    b.extend_from_slice(b"\",\"object\":");
    b.extend_from_slice(object_json);
    b.extend_from_slice(b"}\n");
    b.into()
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// It appeared.
    Added,
    /// It changed.
    Modified,
    /// It went away; the event carries its last state.
    Deleted,
}

/// One change, as watchers receive it.
#[derive(Clone, Debug)]
pub struct Event {
    /// The version of the change (for a deletion, a new version carried by the last state).
    pub resource_version: u64,
    /// The change.
    pub kind: EventType,
    /// The object after the change (before it, for a deletion).
    pub object: Arc<Stored>,
    /// The state before a modification: watchers with a selector need it to turn a change
    /// that leaves (enters) their selection into DELETED (ADDED).
    pub previous: Option<Arc<Stored>>,
    /// The watch frame of this event, encoded once for every watcher.
    pub frame: Bytes,
}

impl EventType {
    /// The watch event type as the API names it.
    pub const fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// A change a publication makes.
#[derive(Clone, Debug)]
pub enum Change {
    /// Create or replace.
    Upsert(Object),
    /// Remove.
    Delete(ObjKey),
}

/// Why a watch cannot resume from a version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    /// Older than the retained history, or from another incarnation: relist (HTTP 410).
    #[error("too old resource version")]
    Expired,
    /// Newer than anything this incarnation issued (HTTP 504 ResourceVersionTooLarge).
    #[error("resource version is ahead of this server")]
    TooLarge,
}

/// A consistent snapshot of one kind.
#[derive(Debug)]
pub struct Snapshot {
    /// The view's version when it was taken.
    pub resource_version: u64,
    /// The objects, by namespace and name.
    pub items: Vec<Arc<Stored>>,
}

#[derive(Debug)]
struct State {
    base: u64,
    counter: u64,
    objects: HashMap<Kind, BTreeMap<NsName, Arc<Stored>>>,
    /// The JSON bytes of the objects in `objects` (what a full LIST of every kind serves).
    json_bytes: usize,
    /// Changes for resumption, each with the instant it was published.
    history: VecDeque<(Instant, Event)>,
    history_cap: usize,
    /// Under the lock, so that subscribing and snapshotting are one step, and so that
    /// [`View::disconnect`] can replace it.
    tx: broadcast::Sender<Event>,
}

impl State {
    fn snapshot(&self, kind: Kind) -> Snapshot {
        Snapshot {
            resource_version: self.base | self.counter,
            items: self
                .objects
                .get(&kind)
                .map(|m| m.values().cloned().collect())
                .unwrap_or_default(),
        }
    }
}

/// The view of one link. Clones share it.
#[derive(Clone, Debug)]
pub struct View {
    state: Arc<RwLock<State>>,
    /// The snapshots paginated lists continue from.
    pages: Arc<pages::Pages>,
}

impl View {
    /// An empty view for one incarnation (a number that differs between runs and replicas; the
    /// low 23 bits are used).
    pub fn new(incarnation: u32, history_cap: usize) -> Self {
        let (tx, _) = broadcast::channel(FANOUT_BACKLOG);
        let base = u64::from(incarnation & 0x7f_ffff).max(1) << COUNTER_BITS;
        Self {
            state: Arc::new(RwLock::new(State {
                base,
                counter: 0,
                objects: HashMap::new(),
                json_bytes: 0,
                history: VecDeque::new(),
                history_cap: history_cap.max(1),
                tx,
            })),
            pages: Arc::default(),
        }
    }

    /// The snapshots paginated lists continue from.
    pub fn pages(&self) -> &pages::Pages {
        &self.pages
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        // A panic while holding the lock leaves consistent data behind (every write below is
        // completed before the guard drops), so a poisoned lock is still usable.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The latest version issued (the base version while empty: never 0).
    pub fn resource_version(&self) -> u64 {
        let s = self.read();
        s.base | s.counter
    }

    /// Applies one publication. Changes that change nothing are skipped. Returns the events.
    pub fn apply(&self, changes: impl IntoIterator<Item = Change>) -> Vec<Event> {
        let mut s = self.write();
        let mut events = Vec::new();
        for change in changes {
            let (key, new) = match change {
                Change::Upsert(o) => (o.key(), Some(o)),
                Change::Delete(k) => (k, None),
            };
            let slot = s.objects.entry(key.kind).or_default();
            let old = slot.get(&key.id).cloned();
            let kind = match (&old, &new) {
                (Some(old), Some(new)) if old.object == *new => continue,
                (None, None) => continue,
                (None, Some(_)) => EventType::Added,
                (Some(_), Some(_)) => EventType::Modified,
                (Some(_), None) => EventType::Deleted,
            };
            s.counter += 1;
            let rv = s.base | (s.counter & COUNTER_MASK);
            s.json_bytes -= old.as_ref().map_or(0, |o| o.json.len());
            let stored = match new {
                Some(o) => {
                    let stored = Arc::new(Stored::new(o, rv));
                    s.json_bytes += stored.json.len();
                    s.objects
                        .entry(key.kind)
                        .or_default()
                        .insert(key.id, stored.clone());
                    stored
                }
                None => {
                    s.objects.entry(key.kind).or_default().remove(&key.id);
                    // The last state, re-versioned so the deletion has a version of its own.
                    let Some(last) = &old else { continue };
                    Arc::new(Stored::new(last.object.clone(), rv))
                }
            };
            let previous = if kind == EventType::Modified {
                old
            } else {
                None
            };
            events.push(Event {
                resource_version: rv,
                kind,
                frame: frame(kind.as_str(), &stored.json),
                object: stored,
                previous,
            });
        }
        let now = Instant::now();
        for e in &events {
            if s.history.len() == s.history_cap {
                s.history.pop_front();
            }
            s.history.push_back((now, e.clone()));
            // No receivers is fine: nobody watches yet.
            let _ = s.tx.send(e.clone());
        }
        events
    }

    /// One object.
    pub fn get(&self, key: &ObjKey) -> Option<Arc<Stored>> {
        self.read().objects.get(&key.kind)?.get(&key.id).cloned()
    }

    /// The JSON bytes of every object served (each object's own encoding; the view holds it
    /// once, shared by lists, watch frames and history).
    pub fn json_bytes(&self) -> usize {
        self.read().json_bytes
    }

    /// Number of objects of a kind.
    pub fn len(&self, kind: Kind) -> usize {
        self.read().objects.get(&kind).map_or(0, BTreeMap::len)
    }

    /// True when the view holds nothing.
    pub fn is_empty(&self) -> bool {
        self.read().objects.values().all(BTreeMap::is_empty)
    }

    /// Every object of a kind, consistent with the returned version.
    pub fn list(&self, kind: Kind) -> Snapshot {
        self.read().snapshot(kind)
    }

    /// A snapshot of a kind and a receiver of every change after it, with no gap between them.
    pub fn list_and_watch(&self, kind: Kind) -> (Snapshot, broadcast::Receiver<Event>) {
        let s = self.read();
        // Subscribing under the read lock: no publication can slip between snapshot and receiver.
        let rx = s.tx.subscribe();
        (s.snapshot(kind), rx)
    }

    /// Ends every watch: their streams close and clients resume (a stopped server does this).
    pub fn disconnect(&self) {
        let mut s = self.write();
        s.tx = broadcast::channel(FANOUT_BACKLOG).0;
    }

    /// Forgets the change history, so every resume from an older version gets 410 Expired
    /// (an API server whose watch cache was reset, or etcd compaction).
    pub fn compact_history(&self) {
        let mut s = self.write();
        s.history.clear();
    }

    /// Forgets changes published before `cutoff` (the history's age bound; the engine calls
    /// this as time passes). A resume from before them gets 410 Expired.
    pub fn expire_history(&self, cutoff: Instant) {
        if self
            .read()
            .history
            .front()
            .is_none_or(|(t, _)| *t >= cutoff)
        {
            return;
        }
        let mut s = self.write();
        while s.history.front().is_some_and(|(t, _)| *t < cutoff) {
            s.history.pop_front();
        }
    }

    /// Checks that this incarnation issued `resource_version` (it may be older than the history):
    /// `Expired` for another run's version, `TooLarge` for one not issued yet.
    pub fn check_issued(&self, resource_version: u64) -> Result<(), ResumeError> {
        let s = self.read();
        if resource_version & !COUNTER_MASK != s.base {
            Err(ResumeError::Expired)
        } else if resource_version & COUNTER_MASK > s.counter {
            Err(ResumeError::TooLarge)
        } else {
            Ok(())
        }
    }

    /// The changes after `resource_version` and a receiver of every later one.
    pub fn watch_from(
        &self,
        resource_version: u64,
    ) -> Result<(Vec<Event>, broadcast::Receiver<Event>), ResumeError> {
        let s = self.read();
        if resource_version & !COUNTER_MASK != s.base {
            return Err(ResumeError::Expired);
        }
        let counter = resource_version & COUNTER_MASK;
        if counter > s.counter {
            return Err(ResumeError::TooLarge);
        }
        let oldest = s
            .history
            .front()
            .map_or(s.counter + 1, |(_, e)| e.resource_version & COUNTER_MASK);
        // Resuming needs every change after `counter`: the first of them must still be held.
        if counter + 1 < oldest && counter < s.counter {
            return Err(ResumeError::Expired);
        }
        let rx = s.tx.subscribe();
        let events = s
            .history
            .iter()
            .filter(|(_, e)| e.resource_version > resource_version)
            .map(|(_, e)| e.clone())
            .collect();
        Ok((events, rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn mk_service(name: &str, label: &str) -> Object {
        Object::Service(Arc::new(Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                labels: Some([("v".to_owned(), label.to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        }))
    }

    #[test]
    fn versions_are_monotonic_never_zero_and_stamped_in_the_json() {
        let view = View::new(7, 100);
        assert_ne!(view.resource_version(), 0);
        let e1 = view.apply([Change::Upsert(mk_service("a", "1"))]);
        let e2 = view.apply([Change::Upsert(mk_service("a", "2"))]);
        assert_eq!(e1[0].kind, EventType::Added);
        assert_eq!(e2[0].kind, EventType::Modified);
        assert!(e2[0].resource_version > e1[0].resource_version);
        let json: serde_json::Value = serde_json::from_slice(&e2[0].object.json).expect("json");
        assert_eq!(json["kind"], "Service");
        assert_eq!(json["apiVersion"], "v1");
        assert_eq!(
            json["metadata"]["resourceVersion"],
            e2[0].resource_version.to_string()
        );
    }

    #[test]
    fn json_bytes_follow_what_is_served() {
        let view = View::new(7, 100);
        assert_eq!(view.json_bytes(), 0);
        view.apply([
            Change::Upsert(mk_service("a", "1")),
            Change::Upsert(mk_service("b", "1")),
        ]);
        let sum = |v: &View| -> usize {
            v.list(Kind::Service)
                .items
                .iter()
                .map(|s| s.json.len())
                .sum()
        };
        assert_eq!(view.json_bytes(), sum(&view));
        view.apply([Change::Upsert(mk_service("a", "a longer label"))]);
        assert_eq!(view.json_bytes(), sum(&view));
        view.apply([
            Change::Delete(mk_service("a", "").key()),
            Change::Delete(mk_service("b", "").key()),
        ]);
        assert_eq!(view.json_bytes(), 0);
    }

    #[test]
    fn an_unchanged_object_publishes_nothing() {
        let view = View::new(1, 100);
        view.apply([Change::Upsert(mk_service("a", "1"))]);
        let rv = view.resource_version();
        assert!(
            view.apply([Change::Upsert(mk_service("a", "1"))])
                .is_empty()
        );
        assert!(
            view.apply([Change::Delete(mk_service("b", "1").key())])
                .is_empty()
        );
        assert_eq!(view.resource_version(), rv);
    }

    #[test]
    fn a_deletion_carries_the_last_state_with_a_new_version() {
        let view = View::new(1, 100);
        view.apply([Change::Upsert(mk_service("a", "1"))]);
        let e = view.apply([Change::Delete(mk_service("a", "1").key())]);
        assert_eq!(e[0].kind, EventType::Deleted);
        assert_eq!(e[0].object.object, mk_service("a", "1"));
        assert_eq!(e[0].object.resource_version, e[0].resource_version);
        assert_eq!(view.len(Kind::Service), 0);
    }

    #[test]
    fn resume_gives_exactly_the_later_changes_or_says_why_not() {
        let view = View::new(3, 2);
        let first = view.apply([Change::Upsert(mk_service("a", "1"))])[0].resource_version;
        let second = view.apply([Change::Upsert(mk_service("a", "2"))])[0].resource_version;
        let (events, _rx) = view.watch_from(first).expect("in history");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].resource_version, second);
        view.apply([Change::Upsert(mk_service("a", "3"))]);
        view.apply([Change::Upsert(mk_service("a", "4"))]);
        assert_eq!(
            view.watch_from(first).err(),
            Some(ResumeError::Expired),
            "history holds 2"
        );
        assert_eq!(
            view.watch_from(view.resource_version() + 1).err(),
            Some(ResumeError::TooLarge)
        );
        let other_run = View::new(4, 2).resource_version();
        assert_eq!(view.watch_from(other_run).err(), Some(ResumeError::Expired));
        let (events, _rx) = view.watch_from(view.resource_version()).expect("now");
        assert!(events.is_empty());
    }

    #[tokio::test]
    async fn subscribers_see_every_change_after_their_snapshot() {
        let view = View::new(1, 100);
        view.apply([Change::Upsert(mk_service("a", "1"))]);
        let (snap, mut rx) = view.list_and_watch(Kind::Service);
        assert_eq!(snap.items.len(), 1);
        view.apply([Change::Upsert(mk_service("b", "1"))]);
        let e = rx.recv().await.expect("event");
        assert_eq!(e.kind, EventType::Added);
        assert!(e.resource_version > snap.resource_version);
    }

    #[tokio::test(start_paused = true)]
    async fn history_older_than_the_cutoff_is_forgotten() {
        let view = View::new(5, 100);
        let start = view.resource_version();
        let old = view.apply([Change::Upsert(mk_service("a", "1"))])[0].resource_version;
        tokio::time::advance(std::time::Duration::from_secs(60)).await;
        view.apply([Change::Upsert(mk_service("a", "2"))]);
        view.expire_history(Instant::now() - std::time::Duration::from_secs(30));
        assert_eq!(
            view.watch_from(start).err(),
            Some(ResumeError::Expired),
            "the change after `start` is older than the cutoff"
        );
        let (events, _rx) = view
            .watch_from(old)
            .expect("the change after `old` is kept");
        assert_eq!(events.len(), 1);
    }
}
