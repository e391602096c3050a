//! One view following another's, version for version: the Lease holder's view is the source
//! ([`View::replicate`]: a snapshot or a resume, then every publication whole and in order), and
//! a follower's view takes it in with the holder's own resource versions ([`View::resync`],
//! [`View::mirror`]). A consumer whose connection moves between replicas resumes with the
//! version it has, with no relist.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::{COUNTER_MASK, Event, EventType, State, Stored, View};
use crate::model::{ObjKey, Object};

/// Publications a follower may fall behind before its stream ends (it resumes from the
/// history, or takes a snapshot): a publication is a batch of changes, so this is seconds of
/// a link's full budget.
pub const REPLICA_BACKLOG: usize = 1024;

/// Where a follower starts from.
#[derive(Debug)]
pub enum Start {
    /// Every change after the version it asked for, in order.
    Resumed(Vec<Event>),
    /// Every object, at this version (it could not resume).
    Snapshot {
        /// The view's version when the snapshot was taken.
        resource_version: u64,
        /// Every object of every kind.
        items: Vec<Arc<Stored>>,
    },
}

/// One change as the holder served it, for a follower's view.
#[derive(Debug)]
pub struct Mirrored {
    /// What happened.
    pub kind: EventType,
    /// The object after the change (its last state, for a deletion), as served.
    pub object: Object,
    /// The holder's version of the change.
    pub resource_version: u64,
}

/// How a view begins a term of its own when its replica takes the link over
/// ([`View::begin_own_term`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewTerm {
    /// Steps the base: the Lease's `leaseTransitions`, which differ between two replicas that
    /// take the link in turn (random without a Lease).
    pub step: u32,
    /// A version the new term's versions go above: the base the link's last holder recorded
    /// on its Lease, so that a replica whose view never followed that holder's (it started,
    /// or took the link, before it synced) still serves versions above every one the other
    /// replicas' consumers saw. 0: none recorded.
    pub above: u64,
}

/// Why a followed change could not go in.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MirrorError {
    /// It is not the next of the term this view follows: the follower takes a snapshot.
    #[error("version {got} does not follow {at}")]
    OutOfOrder {
        /// The view's version.
        at: u64,
        /// The change's.
        got: u64,
    },
}

impl State {
    /// Ends every watch and follower stream (their feeds are dropped; the next ones make new).
    pub(super) fn end_watches(&mut self) {
        for shelf in &mut self.shelves {
            shelf.tx = OnceLock::new();
        }
        self.all = OnceLock::new();
    }

    /// Sends a publication to the replicas that follow this view, and lets the feed go when
    /// none is left.
    pub(super) fn send_all(&mut self, events: &[Event]) {
        if let Some(tx) = self.all.get() {
            if tx.receiver_count() == 0 {
                self.all = OnceLock::new();
            } else {
                let _ = tx.send(events.into());
            }
        }
    }
}

impl View {
    /// What a follower starts from, and a receiver of every later publication, with no gap:
    /// the changes after `from` when this view issued or followed it (in any term it holds)
    /// and still holds every change after it, a snapshot of every kind otherwise.
    pub fn replicate(&self, from: Option<u64>) -> (Start, broadcast::Receiver<Arc<[Event]>>) {
        let s = self.read();
        let rx = (s.all)
            .get_or_init(|| broadcast::channel(REPLICA_BACKLOG).0)
            .subscribe();
        // A version of an earlier term resumes too: a follower of the holder this view took
        // over from, or the replica that handed the link to this one.
        let resumable = from
            .and_then(|rv| s.issued(rv).ok())
            .filter(|&at| (s.shelves.iter()).all(|sh| at >= s.position(sh.evicted)));
        let start = match resumable {
            Some(at) => {
                let mut events: Vec<Event> = (s.shelves.iter())
                    .flat_map(|sh| sh.history.iter().map(|(_, e)| e))
                    .filter(|e| s.position(e.resource_version) > at)
                    .cloned()
                    .collect();
                events.sort_by_key(|e| s.position(e.resource_version));
                Start::Resumed(events)
            }
            None => Start::Snapshot {
                resource_version: s.base | s.counter,
                items: (s.shelves.iter())
                    .flat_map(|sh| sh.objects.values().cloned())
                    .collect(),
            },
        };
        (start, rx)
    }

    /// Takes in changes its holder published after the version this view is at, with their
    /// versions: consumers see them as the holder's did. A change under a base above the
    /// view's is the first of a term the holder began when it took over: the term followed
    /// ends where the view is (the holder resumed this view from it, so it ended there too).
    pub fn mirror(&self, changes: Vec<Mirrored>, now: Instant) -> Result<(), MirrorError> {
        let _writing = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut last = self.resource_version();
        let mut events = Vec::with_capacity(changes.len());
        for m in changes {
            let rv = m.resource_version;
            let base = rv & !COUNTER_MASK;
            if base > last & !COUNTER_MASK {
                self.commit(&std::mem::take(&mut events), now);
                self.write().begin_term(base, 0);
                last = base;
            }
            if base != last & !COUNTER_MASK || rv <= last {
                return Err(MirrorError::OutOfOrder { at: last, got: rv });
            }
            last = rv;
            let key = m.object.key();
            let previous = (m.kind == EventType::Modified)
                .then(|| self.get_batch(&key, &events))
                .flatten();
            events.push(event(m.kind, m.object, rv, previous));
        }
        self.commit(&events, now);
        Ok(())
    }

    /// Makes this view its holder's snapshot at `resource_version`: each object whose content
    /// differs goes in with the version it has (`objects`), each one the snapshot lacks is
    /// deleted at `resource_version`, and a consumer of this view resumes from that version
    /// on (every earlier one is `Expired`). A snapshot under another base begins a term.
    /// Returns the changes consumers saw.
    pub fn resync(
        &self,
        resource_version: u64,
        objects: Vec<(Object, u64)>,
        now: Instant,
    ) -> usize {
        let _writing = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let base = resource_version & !COUNTER_MASK;
        let mut events = Vec::new();
        {
            let s = self.read();
            let mut seen: HashSet<ObjKey> = HashSet::with_capacity(objects.len());
            for (object, rv) in objects {
                let key = object.key();
                let old = s.shelf(key.kind).objects.get(&key.id).cloned();
                seen.insert(key);
                if old.as_ref().is_some_and(|o| o.object == object) {
                    continue;
                }
                // A version of the snapshot's term at most the snapshot's, or the snapshot's.
                let rv = if rv & !COUNTER_MASK == base && rv <= resource_version {
                    rv
                } else {
                    resource_version
                };
                let kind = if old.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                events.push(event(kind, object, rv, old));
            }
            events.sort_by_key(|e| e.resource_version);
            for shelf in &s.shelves {
                for (id, stored) in &shelf.objects {
                    let key = ObjKey {
                        kind: stored.object.kind(),
                        id: id.clone(),
                    };
                    if !seen.contains(&key) {
                        let last = stored.object.clone();
                        events.push(event(EventType::Deleted, last, resource_version, None));
                    }
                }
            }
        }
        let n = events.len();
        let mut s = self.write();
        if base < s.base {
            // Versions would go down (the view's own first term was above its holder's): the
            // watches end first; they resume from the snapshot's version on, or relist.
            s.end_watches();
        }
        s.begin_term(base, resource_version & COUNTER_MASK);
        for shelf in &mut s.shelves {
            shelf.history.clear();
            shelf.evicted = resource_version;
        }
        s.history_len = 0;
        drop(s);
        // The view stays at the snapshot's version, whatever its changes' versions.
        self.commit(&events, now);
        n
    }

    /// Starts a term of this view's own after following a holder's (or as the link's first
    /// holder on this replica), its base above the view's and above `term.above` by a step
    /// chosen with `term.step`: the versions it followed keep resuming, up to the last it
    /// followed, and the holder's later ones (which it never followed) are `Expired`.
    pub fn begin_own_term(&self, term: NewTerm) {
        let _writing = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut s = self.write();
        let above = s.base.max(term.above & !COUNTER_MASK);
        let base = match super::terms::next_base(above, term.step) {
            Some(base) => base,
            None => {
                // No base left above: the watches end first, so none sees versions go down.
                s.end_watches();
                super::terms::base_of(term.step)
            }
        };
        s.begin_term(base, 0);
    }

    /// The state an earlier change of `events` gave `key`, or the view's.
    fn get_batch(&self, key: &ObjKey, events: &[Event]) -> Option<Arc<Stored>> {
        match events.iter().rev().find(|e| e.object.object.key() == *key) {
            Some(e) if e.kind == EventType::Deleted => None,
            Some(e) => Some(e.object.clone()),
            None => self.get(key),
        }
    }
}

/// The event of a followed change.
fn event(kind: EventType, object: Object, rv: u64, previous: Option<Arc<Stored>>) -> Event {
    let (stored, frame) = Stored::framed(object, rv, kind);
    Event {
        resource_version: rv,
        kind,
        frame,
        object: Arc::new(stored),
        previous: previous.filter(|_| kind == EventType::Modified),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NsName;
    use crate::view::{Change, ResumeError};

    fn service(name: &str, app: &str) -> Object {
        Object::Service(Arc::new(k8s_openapi::api::core::v1::Service {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                labels: Some([("app".to_owned(), app.to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        }))
    }

    fn key(name: &str) -> ObjKey {
        ObjKey {
            kind: crate::model::Kind::Service,
            id: NsName::new("default", name),
        }
    }

    /// Follows `holder` once: its snapshot, then its publications so far.
    fn snapshot_of(holder: &View) -> (u64, Vec<(Object, u64)>) {
        let (
            Start::Snapshot {
                resource_version,
                items,
            },
            _,
        ) = holder.replicate(None)
        else {
            panic!("a snapshot");
        };
        let items = items
            .iter()
            .map(|s| (s.object.clone(), s.resource_version))
            .collect();
        (resource_version, items)
    }

    #[test]
    fn a_resync_keeps_what_is_unchanged_and_a_change_out_of_turn_is_refused() {
        let now = Instant::now();
        let holder = View::new(9, 100);
        holder.apply(
            [
                Change::Upsert(service("a", "1")),
                Change::Upsert(service("b", "1")),
            ],
            now,
        );
        let follower = View::new(8, 100);
        follower.apply(
            [
                Change::Upsert(service("b", "1")),
                Change::Upsert(service("c", "1")),
            ],
            now,
        );
        let (_, mut feed) = follower.list_and_watch(crate::model::Kind::Service);

        let (at, items) = snapshot_of(&holder);
        assert_eq!(
            follower.resync(at, items, now),
            2,
            "a added, c deleted; b unchanged"
        );
        assert_eq!(follower.resource_version(), at);
        let seen: Vec<_> = std::iter::from_fn(|| feed.try_recv().ok())
            .map(|e| (e.kind, e.object.object.key().id.name.to_string()))
            .collect();
        assert_eq!(
            seen,
            [
                (EventType::Added, "a".to_owned()),
                (EventType::Deleted, "c".to_owned())
            ]
        );
        assert_eq!(
            follower.get(&key("a")).map(|s| s.resource_version),
            holder.get(&key("a")).map(|s| s.resource_version),
            "a at the holder's version"
        );
        // Resuming from before the snapshot is Expired; from it, nothing is missed.
        assert_eq!(
            follower
                .watch_from(crate::model::Kind::Service, at - 1)
                .err(),
            Some(ResumeError::Expired)
        );
        assert!(follower.watch_from(crate::model::Kind::Service, at).is_ok());

        // The holder's next change goes in with its version; one that skips back is refused.
        let events = holder.apply([Change::Upsert(service("a", "2"))], now);
        (follower.mirror(mirrored(&events), now)).expect("the next change");
        assert_eq!(follower.resource_version(), holder.resource_version());
        let stale = Mirrored {
            kind: EventType::Modified,
            object: service("a", "0"),
            resource_version: at,
        };
        assert!(matches!(
            follower.mirror(vec![stale], now),
            Err(MirrorError::OutOfOrder { .. })
        ));
    }

    /// A holder serving `a`, and two views that took its snapshot.
    fn holder_and_two_followers(now: Instant) -> (View, View, View) {
        let old = View::new(9, 100);
        old.apply([Change::Upsert(service("a", "1"))], now);
        let (f, g) = (View::new(8, 100), View::new(7, 100));
        for v in [&f, &g] {
            let (at, items) = snapshot_of(&old);
            v.resync(at, items, now);
        }
        (old, f, g)
    }

    fn mirrored(events: &[Event]) -> Vec<Mirrored> {
        (events.iter())
            .map(|e| Mirrored {
                kind: e.kind,
                object: e.object.object.clone(),
                resource_version: e.resource_version,
            })
            .collect()
    }

    /// Two followers of one holder; the holder goes and one follower takes over under a term
    /// of its own. The other, asking the new holder from the version it is at (one of the old
    /// term), resumes: it gets the rest of the old term and the new term's changes, takes the
    /// new term in, and its consumers resume from versions of either term.
    #[test]
    fn a_follower_resumes_from_the_holder_that_took_over_across_its_new_term() {
        let now = Instant::now();
        let (old, f, g) = holder_and_two_followers(now);
        let followed = old.apply([Change::Upsert(service("b", "1"))], now);
        for v in [&f, &g] {
            v.mirror(mirrored(&followed), now).expect("followed");
        }
        let old_term = g.resource_version();

        f.begin_own_term(NewTerm { step: 3, above: 0 });
        let own = f.apply([Change::Upsert(service("c", "1"))], now);
        assert!(
            own[0].resource_version > old_term,
            "versions grow across the term"
        );
        let (Start::Resumed(rest), _) = f.replicate(Some(old_term)) else {
            panic!("a version of the term the new holder followed resumes");
        };
        assert_eq!(rest.len(), 1, "only the new term's change: {rest:?}");
        g.mirror(mirrored(&rest), now)
            .expect("the new term goes in");
        assert_eq!(g.resource_version(), f.resource_version());
        let (events, _) = (g.watch_from(crate::model::Kind::Service, old_term))
            .expect("a version of the old term resumes on g");
        assert_eq!(events.len(), 1);
        let (events, _) = (g.watch_from(crate::model::Kind::Service, own[0].resource_version))
            .expect("and one of the new term");
        assert!(events.is_empty());

        // A version of the old term the new holder never followed is no resume.
        let ahead = old.apply([Change::Upsert(service("d", "1"))], now);
        assert!(matches!(
            f.replicate(Some(ahead[0].resource_version)).0,
            Start::Snapshot { .. }
        ));
    }

    /// A replica that takes the link over before its view followed the last holder's (it
    /// started while the Lease was free) begins with a base of its own, which may be below
    /// the one the other replicas followed: their consumers' watches would end (versions may
    /// not go down). Begun above the base the last holder recorded on the Lease, it is above
    /// theirs, and a follower's consumer keeps its watch through the snapshot.
    #[test]
    fn a_holder_that_never_followed_goes_on_above_the_recorded_base() {
        use tokio::sync::broadcast::error::TryRecvError;
        let now = Instant::now();
        let old = View::new(900, 100);
        old.apply([Change::Upsert(service("a", "1"))], now);
        let recorded = old.term_base();
        let follower = View::new(8, 100);
        let (at, items) = snapshot_of(&old);
        follower.resync(at, items, now);
        let took_over = |above| {
            let new = View::new(3, 100);
            new.begin_own_term(NewTerm { step: 1, above });
            new.apply([Change::Upsert(service("a", "1"))], now);
            new.apply([Change::Upsert(service("b", "1"))], now);
            new
        };

        let (_, mut feed) = follower.list_and_watch(crate::model::Kind::Service);
        let below = took_over(0);
        assert!(below.term_base() < recorded, "its own base is below");
        let (at, items) = snapshot_of(&below);
        follower.resync(at, items, now);
        assert_eq!(
            feed.try_recv().map(|_| ()),
            Err(TryRecvError::Closed),
            "versions would go down: the follower's watches end"
        );

        let follower = View::new(8, 100);
        let (at, items) = snapshot_of(&old);
        follower.resync(at, items, now);
        let (_, mut feed) = follower.list_and_watch(crate::model::Kind::Service);
        let above = took_over(recorded);
        assert!(above.term_base() > recorded);
        let (at, items) = snapshot_of(&above);
        assert_eq!(follower.resync(at, items, now), 1, "b added; a unchanged");
        let e = feed.try_recv().expect("the watch goes on");
        assert_eq!(e.kind, EventType::Added);
        assert_eq!(e.object.object.key(), key("b"));
        assert!(e.resource_version > at - 1 && e.resource_version > recorded);
    }

    /// A consumer that moves from the replica that took over to one that still follows the
    /// old holder carries a version of the new term: the second waits for it (as it begins to
    /// follow the new holder) rather than answering 410 at once. A view of one term answers a
    /// higher base it never issued with `Expired` at once.
    #[tokio::test(start_paused = true)]
    async fn a_version_of_a_term_not_followed_yet_is_waited_for() {
        let now = Instant::now();
        let (_holder, f, g) = holder_and_two_followers(now);
        let from = g.resource_version();
        f.begin_own_term(NewTerm { step: 5, above: 0 });
        let own = f.apply([Change::Upsert(service("b", "1"))], now);
        let moved = own[0].resource_version;
        assert_eq!(g.check_issued(moved), Err(ResumeError::Expired));

        let waiting = {
            let g = g.clone();
            tokio::spawn(async move {
                g.wait_issued(moved, std::time::Duration::from_secs(3))
                    .await
            })
        };
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "g waits for the new term");
        let (Start::Resumed(rest), _) = f.replicate(Some(from)) else {
            panic!("g resumes from f");
        };
        g.mirror(mirrored(&rest), now).expect("the new term");
        assert_eq!(waiting.await.expect("joined"), Ok(()));

        let alone = View::new(3, 100);
        alone.apply([Change::Upsert(service("a", "1"))], now);
        let started = tokio::time::Instant::now();
        let foreign = alone
            .wait_issued(moved, std::time::Duration::from_secs(3))
            .await;
        assert_eq!(foreign, Err(ResumeError::Expired));
        assert_eq!(started.elapsed(), std::time::Duration::ZERO, "no wait");
    }
}
