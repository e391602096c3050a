//! The published view of one link: what consumers see.
//!
//! The churn engine writes publications ([`View::apply`]); the facade and gRPC read snapshots
//! and follow changes. Each object is stored with Floodgate's own resource version and its JSON
//! encoded once, at publish time, as the watch frame of its event: the stored JSON is a slice
//! of that frame, so a LIST, a fan-out to many watchers and the history write and hold bytes
//! that already exist. Its protobuf and metadata-only forms are encoded once too, the first
//! time a client asks for them, and kept with it ([`crate::protobuf`], [`metadata`]). Each kind has its own shelf: objects, a history of changes (bounded by
//! count over every kind, and by age) that lets a watcher resume from a version it saw, and a
//! broadcast feed with a bounded backlog per receiver, so a watcher wakes only for its kind.
//! The view reads no clock: the history's instants are those its writer publishes at, so
//! paused-time tests drive them.
//!
//! Resource versions are `base | counter`, the base an incarnation's `<< 40`: monotonic within
//! one term, never 0, and recognisably foreign when they come from another run or replica
//! ([`ResumeError::Expired`]). A view that follows another replica's ([`replica`]) serves that
//! replica's versions, and one that goes on from a view it followed starts a term of its own:
//! it keeps resuming the earlier terms' versions it holds, up to the last it followed in each.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::model::{Kind, NsName, ObjKey, Object};

pub mod pages;
mod publish;
pub mod replica;
mod stored;
mod terms;

use publish::encode;
pub use stored::{Event, EventType, Stored, frame, metadata, stored_frame};

const COUNTER_BITS: u32 = 40;
const COUNTER_MASK: u64 = (1 << COUNTER_BITS) - 1;

/// Changes of one kind a receiver may fall behind before it is told it lagged (and the facade
/// closes its stream so the client resumes from the history or relists). 2048 events of one
/// kind is seconds of a link's full default budget (50 publications/s of a few objects each);
/// each kind's feed allocates its ring at once, 88 bytes a slot (180 KB a kind, 1.1 MB for the
/// six), so a kind's feed is made by its first watcher and let go with its last ([`Shelf`]).
pub const FANOUT_BACKLOG: usize = 2048;

/// Changes kept for resumption. At the default budget this is minutes of history.
pub const DEFAULT_HISTORY: usize = 10_000;

/// The oldest change kept for resumption. A watcher away for longer relists, from Floodgate's
/// cache, at no cost to the remote; holding old states longer would only hold their memory.
pub const DEFAULT_HISTORY_AGE: std::time::Duration = std::time::Duration::from_secs(600);

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

/// The part of a kind a list or a watch starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Every object of the kind.
    Kind,
    /// The objects of one namespace.
    Namespace(&'a str),
    /// One object (namespace, name): a `metadata.name` field selector in a namespace.
    Object(&'a str, &'a str),
}

/// A consistent snapshot of one kind.
#[derive(Debug)]
pub struct Snapshot {
    /// The view's version when it was taken.
    pub resource_version: u64,
    /// The objects, by namespace and name.
    pub items: Vec<Arc<Stored>>,
}

/// What the view holds of one kind: its objects, its changes for resumption and its feed. A
/// watcher of one kind wakes only for that kind's changes, so a burst of pod events neither
/// wakes nor lags a Service watcher.
#[derive(Debug)]
struct Shelf {
    objects: BTreeMap<NsName, Arc<Stored>>,
    /// Changes for resumption, each with the instant it was published, oldest first.
    history: VecDeque<(Instant, Event)>,
    /// The newest version of this kind that left `history`: a watch of this kind resumes
    /// from any version at least this (every later change is still held).
    evicted: u64,
    /// Under the view's lock, so that subscribing and snapshotting are one step, and so that
    /// [`View::disconnect`] can replace it. Made by the first watcher of the kind (under the
    /// read lock, hence the cell) and dropped by a publication that finds no watcher left: a
    /// kind nobody watches holds no ring (a hub of 100 links held 110 MB of them).
    tx: OnceLock<broadcast::Sender<Event>>,
}

impl Shelf {
    fn new() -> Self {
        Self {
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            evicted: 0,
            tx: OnceLock::new(),
        }
    }

    /// A receiver of every later change of this kind.
    fn subscribe(&self) -> broadcast::Receiver<Event> {
        (self.tx)
            .get_or_init(|| broadcast::channel(FANOUT_BACKLOG).0)
            .subscribe()
    }

    /// Sends `e` to the kind's watchers, and lets the feed go when none is left.
    fn send(&mut self, e: &Event) {
        if let Some(tx) = self.tx.get() {
            if tx.receiver_count() == 0 {
                self.tx = OnceLock::new();
            } else {
                // A receiver dropped since the count is fine: it wanted nothing more.
                let _ = tx.send(e.clone());
            }
        }
    }

    fn evict_front(&mut self) {
        if let Some((_, e)) = self.history.pop_front() {
            self.evicted = self.evicted.max(e.resource_version);
        }
    }
}

#[derive(Debug)]
struct State {
    base: u64,
    counter: u64,
    /// Earlier terms of this view, oldest first: each one's base and the last counter this view
    /// holds of it ([`terms`]).
    earlier: VecDeque<(u64, u64)>,
    /// Every publication, whole and in order, for the replicas that follow this view: made by
    /// the first of them, let go by a publication that finds none ([`replica`]).
    all: OnceLock<broadcast::Sender<Arc<[Event]>>>,
    shelves: [Shelf; Kind::ALL.len()],
    /// The JSON bytes of the objects held (what a full LIST of every kind serves).
    json_bytes: usize,
    /// Changes held for resumption, over every kind.
    history_len: usize,
    history_cap: usize,
}

impl State {
    fn shelf(&self, kind: Kind) -> &Shelf {
        &self.shelves[kind.index()]
    }

    fn shelf_mut(&mut self, kind: Kind) -> &mut Shelf {
        &mut self.shelves[kind.index()]
    }

    fn snapshot(&self, kind: Kind) -> Snapshot {
        self.snapshot_of(kind, Scope::Kind)
    }

    /// The objects of `scope` only: the others are not copied (they are held by namespace and
    /// name).
    fn snapshot_of(&self, kind: Kind, scope: Scope<'_>) -> Snapshot {
        let objects = &self.shelf(kind).objects;
        let items = match scope {
            Scope::Kind => objects.values().cloned().collect(),
            Scope::Namespace(namespace) => objects
                .range(NsName::new(namespace, "")..)
                .take_while(|(k, _)| &*k.namespace == namespace)
                .map(|(_, v)| v.clone())
                .collect(),
            Scope::Object(namespace, name) => objects
                .get(&NsName::new(namespace, name))
                .cloned()
                .into_iter()
                .collect(),
        };
        Snapshot {
            resource_version: self.base | self.counter,
            items,
        }
    }

    /// Drops the oldest change held, whatever its kind (the history's count bound is shared).
    fn evict_oldest(&mut self) {
        let oldest = self
            .shelves
            .iter_mut()
            .filter_map(|s| Some((s.history.front()?.1.resource_version, s)))
            .min_by_key(|(rv, _)| *rv);
        if let Some((_, shelf)) = oldest {
            shelf.evict_front();
            self.history_len -= 1;
        }
    }
}

/// The view of one link. Clones share it.
#[derive(Clone, Debug)]
pub struct View {
    state: Arc<RwLock<State>>,
    /// Held for a whole publication: publications go in one at a time, in order.
    writer: Arc<Mutex<()>>,
    /// The snapshots paginated lists continue from.
    pages: Arc<pages::Pages>,
    /// Woken after every publication, for requests waiting for a version not issued yet.
    advanced: Arc<tokio::sync::Notify>,
}

impl View {
    /// An empty view for one incarnation (a number that differs between runs and replicas; the
    /// low 23 bits are used).
    pub fn new(incarnation: u32, history_cap: usize) -> Self {
        let base = terms::base_of(incarnation);
        Self {
            state: Arc::new(RwLock::new(State {
                base,
                counter: 0,
                earlier: VecDeque::new(),
                all: OnceLock::new(),
                shelves: std::array::from_fn(|_| Shelf::new()),
                json_bytes: 0,
                history_len: 0,
                history_cap: history_cap.max(1),
            })),
            writer: Arc::default(),
            pages: Arc::default(),
            advanced: Arc::default(),
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

    /// The base of the versions the view issues now (its term's): every version it issues is
    /// above it, and every version of an earlier term below.
    pub fn term_base(&self) -> u64 {
        self.read().base
    }

    /// Applies one publication. Changes that change nothing are skipped. Returns the events.
    ///
    /// Readers are held up only while the encoded objects go in: what each change replaces is
    /// read under the read lock, the objects are encoded (with the versions they will have)
    /// under no lock, and the write lock is taken for the inserts, the history and the feed.
    /// A writer mutex keeps publications in order, so the versions read stay the next ones.
    /// `now` is when the publication happens: its changes leave the history by that instant
    /// ([`View::expire_history`]).
    pub fn apply(&self, changes: impl IntoIterator<Item = Change>, now: Instant) -> Vec<Event> {
        let _writing = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (next, planned) = self.plan(changes);
        let events = encode(next, planned);
        debug_assert!(
            events.first().is_none_or(|e| e.resource_version == next),
            "publications are serialised by the writer mutex"
        );
        self.commit(&events, now);
        events
    }

    /// True while some consumer follows the view's changes: a watcher of any kind (the
    /// facade's, a gRPC stream's) or a replica. A publication nobody follows needs no order
    /// at the consumers: one that lists later reads it whole.
    pub fn watched(&self) -> bool {
        let s = self.read();
        (s.shelves.iter()).any(|sh| sh.tx.get().is_some_and(|tx| tx.receiver_count() > 0))
            || s.all.get().is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// One object.
    pub fn get(&self, key: &ObjKey) -> Option<Arc<Stored>> {
        self.read().shelf(key.kind).objects.get(&key.id).cloned()
    }

    /// Ready endpoints served whose pod is not (a consumer resolving them finds no pod): 0
    /// when the view is whole. Read at scrape time, one pass over the served slices.
    pub fn ready_endpoints_without_pod(&self) -> u64 {
        let slices = self.list(Kind::EndpointSlice);
        let mut missing = 0;
        for stored in &slices.items {
            let Object::EndpointSlice(slice) = &stored.object else {
                continue;
            };
            for (pod, ready) in slice.pod_refs_ready() {
                let key = ObjKey {
                    kind: Kind::Pod,
                    id: pod,
                };
                if ready && self.get(&key).is_none() {
                    missing += 1;
                }
            }
        }
        missing
    }

    /// The JSON bytes of every object served (each object's own encoding; the view holds it
    /// once, shared by lists, watch frames and history).
    pub fn json_bytes(&self) -> usize {
        self.read().json_bytes
    }

    /// Number of objects of a kind.
    pub fn len(&self, kind: Kind) -> usize {
        self.read().shelf(kind).objects.len()
    }

    /// True when the view holds nothing.
    pub fn is_empty(&self) -> bool {
        self.read().shelves.iter().all(|s| s.objects.is_empty())
    }

    /// Every object of a kind, consistent with the returned version.
    pub fn list(&self, kind: Kind) -> Snapshot {
        self.read().snapshot(kind)
    }

    /// The objects of a kind in one namespace, consistent with the returned version: only
    /// those are copied.
    pub fn list_namespace(&self, kind: Kind, namespace: &str) -> Snapshot {
        self.read().snapshot_of(kind, Scope::Namespace(namespace))
    }

    /// [`View::list_and_watch`] of `scope` only: a watch of one namespace or one object copies
    /// nothing else.
    pub fn list_and_watch_scope(
        &self,
        kind: Kind,
        scope: Scope<'_>,
    ) -> (Snapshot, broadcast::Receiver<Event>) {
        let s = self.read();
        // Subscribing under the read lock: no publication can slip between snapshot and receiver.
        (s.snapshot_of(kind, scope), s.shelf(kind).subscribe())
    }

    /// A snapshot of a kind and a receiver of every later change of that kind, with no gap
    /// between them.
    pub fn list_and_watch(&self, kind: Kind) -> (Snapshot, broadcast::Receiver<Event>) {
        self.list_and_watch_scope(kind, Scope::Kind)
    }

    /// [`View::list_and_watch`] for several kinds at one version: the snapshots and receivers
    /// are taken together, so no change of any of them falls between.
    pub fn list_and_watch_each<const N: usize>(
        &self,
        kinds: [Kind; N],
    ) -> [(Snapshot, broadcast::Receiver<Event>); N] {
        let s = self.read();
        // Subscribing under the read lock: no publication can slip between snapshot and receiver.
        kinds.map(|k| (s.snapshot(k), s.shelf(k).subscribe()))
    }

    /// Ends every watch: their streams close and clients resume (a stopped server does this).
    pub fn disconnect(&self) {
        // Dropping a feed closes every receiver of it; the next watcher makes a new one.
        self.write().end_watches();
    }

    /// Forgets the change history, so every resume from an older version gets 410 Expired
    /// (an API server whose watch cache was reset, or etcd compaction).
    pub fn compact_history(&self) {
        let mut s = self.write();
        let now = s.base | s.counter;
        for shelf in &mut s.shelves {
            shelf.history.clear();
            shelf.evicted = now;
        }
        s.history_len = 0;
    }

    /// Forgets changes published at or before `cutoff` (the history's age bound; the engine
    /// calls this as time passes). A resume from before them gets 410 Expired.
    pub fn expire_history(&self, cutoff: Instant) {
        let old = |s: &Shelf| s.history.front().is_some_and(|(t, _)| *t <= cutoff);
        if !self.read().shelves.iter().any(old) {
            return;
        }
        let mut s = self.write();
        let mut dropped = 0;
        for shelf in &mut s.shelves {
            while old(shelf) {
                shelf.evict_front();
                dropped += 1;
            }
        }
        s.history_len -= dropped;
    }

    /// When the oldest change the history holds was published: the engine wakes to expire it
    /// when nothing else wakes it.
    pub fn oldest_change(&self) -> Option<Instant> {
        (self.read().shelves.iter())
            .filter_map(|s| s.history.front().map(|(t, _)| *t))
            .min()
    }

    /// Checks that this view issued or followed `resource_version` (it may be older than the
    /// history): `Expired` for another run's version or one of an earlier term this view never
    /// followed, `TooLarge` for one not issued yet.
    pub fn check_issued(&self, resource_version: u64) -> Result<(), ResumeError> {
        self.read().issued(resource_version).map(|_| ())
    }

    /// [`View::check_issued`], waiting up to `wait` for a version not issued yet, as the API
    /// server waits for its cache before it answers `ResourceVersionTooLarge`: a consumer
    /// that moves from one replica to another a moment ahead of the second resumes there. A
    /// version of a term above this view's, in a view that follows terms, is waited for too
    /// (a new holder's, which this replica is about to follow); after the wait the answer is
    /// what [`View::check_issued`] says then.
    pub async fn wait_issued(
        &self,
        resource_version: u64,
        wait: Duration,
    ) -> Result<(), ResumeError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let advanced = self.advanced.notified();
            tokio::pin!(advanced);
            // Registered before the check: a publication between the two still wakes it.
            advanced.as_mut().enable();
            {
                let s = self.read();
                match s.issued(resource_version) {
                    Err(ResumeError::TooLarge) => {}
                    Err(ResumeError::Expired) if s.may_begin(resource_version) => {}
                    checked => return checked.map(|_| ()),
                }
            }
            if tokio::time::timeout_at(deadline, advanced).await.is_err() {
                return self.check_issued(resource_version);
            }
        }
    }

    /// The changes of `kind` after `resource_version` and a receiver of every later one.
    /// Only this kind's history counts: a flood of pods that pushed older changes out does
    /// not expire a Service watcher's version unless a Service change went with them.
    pub fn watch_from(
        &self,
        kind: Kind,
        resource_version: u64,
    ) -> Result<(Vec<Event>, broadcast::Receiver<Event>), ResumeError> {
        let s = self.read();
        let from = s.issued(resource_version)?;
        let shelf = s.shelf(kind);
        // Resuming needs every change after the version: none of them may have left.
        if from < s.position(shelf.evicted) {
            return Err(ResumeError::Expired);
        }
        let rx = shelf.subscribe();
        let events = shelf
            .history
            .iter()
            .filter(|(_, e)| s.position(e.resource_version) > from)
            .map(|(_, e)| e.clone())
            .collect();
        Ok((events, rx))
    }
}

#[cfg(test)]
mod tests;
