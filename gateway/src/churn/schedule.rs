//! When groups publish. A change to a group that has been quiet for `coalesce.quiet` gets in
//! line at once (the leading edge: a calm service's change costs no window); so does the first
//! change of each other kind in the same window, because one rollout touches a Pod and its
//! EndpointSlice, which arrive on two watches within milliseconds of each other, and counting
//! the second as a burst would delay every calm rollout by `quiet`. A further change of a kind
//! already seen within `quiet` is a burst: it coalesces until the group is quiet again, never
//! longer than `coalesce.max` after its first change. So a window publishes at most once per
//! kind at its leading edge, plus once per `max`. The line is served round robin while the
//! link's and the group's GCRA buckets have tokens; a group whose own bucket is empty is parked
//! until its token is due.
//!
//! Each group is in at most one of the due, ready and parked queues. A group's slot and bucket
//! go when the engine forgets the group (its service left upstream); a stale queue entry of a
//! forgotten group is skipped when it comes up.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use floodgate_link_crd::LinkSpec;
use tokio::time::Instant;

use super::limit::{Budget, FedClock, Limiter};
use crate::model::{Group, Kind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Idle,
    Pending { first: Instant, last: Instant },
    Ready,
    Parked,
}

/// Upper bounds, in seconds, of the publication-delay histogram's buckets: 1 ms to 60 s.
pub const DELAY_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// How long published changes waited: from a group's first change not yet published (its
/// arrival from upstream) to the publication that carried it. Changes dropped unpublished
/// (a quarantine freezes the view) are not counted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Delays {
    /// Publications per bucket of [`DELAY_BUCKETS`] (not cumulative); longer ones are only in
    /// `count`.
    pub buckets: [u64; DELAY_BUCKETS.len()],
    /// Publications measured.
    pub count: u64,
    /// Their delays, summed, in seconds.
    pub sum: f64,
}

impl Delays {
    fn record(&mut self, waited: Duration) {
        let secs = waited.as_secs_f64();
        if let Some(i) = DELAY_BUCKETS.iter().position(|le| secs <= *le) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum += secs;
    }

    /// `(le, publications in that bucket)` for every bucket, each counting those over the
    /// previous bound (the encoder accumulates them), and `+Inf` for those over 60 s.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        let within: u64 = self.buckets.iter().sum();
        (DELAY_BUCKETS.iter().copied().zip(self.buckets))
            .chain([(f64::INFINITY, self.count - within)])
            .collect()
    }
}

#[derive(Debug)]
struct Sched {
    slot: Slot,
    /// The group's first change not yet published.
    waiting_since: Option<Instant>,
    bucket: Limiter<FedClock>,
    /// The group's last change: a change after `quiet` of silence publishes at once.
    last_change: Option<Instant>,
    /// The kinds that changed since the group was last quiet (bits of `kind_bit`).
    kinds: u8,
    /// Its tokens were taken for a publication that waited for what its consumers look up
    /// ([`Scheduler::prepay`]): the next one is paid for.
    prepaid: bool,
}

// `Kind`'s discriminants are 0..ALL.len(): one bit each in a u8, and bit 7 for `None`.
const _: () = assert!(Kind::ALL.len() < 8);

/// A change's bit in `Sched::kinds`; changes that are no object's (a release, a republish
/// after a quarantine) have their own, the last.
fn kind_bit(kind: Option<Kind>) -> u8 {
    match kind {
        Some(k) => 1 << (k as u8),
        None => 1 << 7,
    }
}

/// The publication schedule of one link.
#[derive(Debug)]
pub struct Scheduler {
    quiet: Duration,
    max_delay: Duration,
    origin: Instant,
    clock: FedClock,
    budget: Budget<FedClock>,
    groups: HashMap<Group, Sched>,
    due: BinaryHeap<Reverse<(Instant, Group)>>,
    ready: VecDeque<Group>,
    parked: BinaryHeap<Reverse<(Instant, Group)>>,
    link_wait: Option<Instant>,
    /// Groups whose slot is not Idle.
    queued: usize,
    /// Publications that had to wait for a token.
    pub throttled: u64,
    /// How long published changes waited.
    pub delays: Delays,
}

impl Scheduler {
    /// An empty schedule with the spec's windows and buckets; `now` is the clock's origin.
    pub fn new(spec: &LinkSpec, now: Instant) -> Self {
        let clock = FedClock::default();
        Self {
            quiet: spec.coalesce.quiet.get(),
            max_delay: spec.coalesce.max.get(),
            origin: now,
            budget: Budget::new(
                &spec.rate_limit.per_link,
                &spec.rate_limit.per_service,
                clock.clone(),
            ),
            clock,
            groups: HashMap::new(),
            due: BinaryHeap::new(),
            ready: VecDeque::new(),
            parked: BinaryHeap::new(),
            link_wait: None,
            queued: 0,
            throttled: 0,
            delays: Delays::default(),
        }
    }

    /// Groups waiting to be published: coalescing, in line, or waiting for a token.
    pub fn pending(&self) -> usize {
        self.queued
    }

    /// True while groups wait for tokens.
    pub fn throttled_now(&self) -> bool {
        !self.parked.is_empty() || self.link_wait.is_some()
    }

    /// Groups with a slot (a bucket) held.
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// A change to `g` at `now`, of an object of `kind` (`None`: no object's, such as a
    /// release). Returns true when it was absorbed into a publication already pending
    /// (coalesced).
    pub fn mark(&mut self, g: &Group, kind: Option<Kind>, now: Instant) -> bool {
        let budget = &self.budget;
        let st = self.groups.entry(g.clone()).or_insert_with(|| Sched {
            slot: Slot::Idle,
            waiting_since: None,
            bucket: budget.service_bucket(),
            last_change: None,
            kinds: 0,
            prepaid: false,
        });
        if st.last_change.is_none_or(|t| now >= t + self.quiet) {
            st.kinds = 0;
        }
        st.waiting_since.get_or_insert(now);
        let bit = kind_bit(kind);
        let leading = st.kinds & bit == 0;
        st.kinds |= bit;
        st.last_change = Some(now);
        match &mut st.slot {
            Slot::Idle if leading => {
                st.slot = Slot::Ready;
                self.ready.push_back(g.clone());
                self.queued += 1;
                false
            }
            Slot::Idle => {
                st.slot = Slot::Pending {
                    first: now,
                    last: now,
                };
                self.due.push(Reverse((now + self.quiet, g.clone())));
                self.queued += 1;
                false
            }
            Slot::Pending { .. } if leading => {
                // A burst of one kind is coalescing and another kind's first change arrives:
                // it goes at once and takes the burst so far with it (the stale due entry is
                // skipped when it comes up).
                st.slot = Slot::Ready;
                self.ready.push_back(g.clone());
                true
            }
            Slot::Pending { last, .. } => {
                *last = now;
                true
            }
            Slot::Ready | Slot::Parked => true,
        }
    }

    /// A group whose publication waited (for pods, for its Endpoints) goes on: in line at once.
    /// What it waited for is no churn: it opens no coalescing window and closes none.
    pub fn resume(&mut self, g: &Group) {
        let Some(st) = self.groups.get_mut(g) else {
            return;
        };
        match st.slot {
            Slot::Idle => {
                self.queued += 1;
                st.slot = Slot::Ready;
                self.ready.push_back(g.clone());
            }
            // Its stale due entry is skipped when it comes up.
            Slot::Pending { .. } => {
                st.slot = Slot::Ready;
                self.ready.push_back(g.clone());
            }
            Slot::Ready | Slot::Parked => {}
        }
    }

    /// The group's publication reaches consumers `within` from `now` (its later stages): the
    /// changes it carries waited from their first until then (one that waited for what its
    /// consumers look up, [`Self::prepay`], is recorded when it goes out).
    pub fn published(&mut self, g: &Group, now: Instant, within: Duration) {
        if let Some(st) = self.groups.get_mut(g)
            && let Some(since) = st.waiting_since.take()
        {
            self.delays
                .record(now.saturating_duration_since(since) + within);
        }
    }

    /// The group's last publication, its tokens taken, waited and published nothing: its next
    /// one takes no tokens, so a wait costs the budget nothing.
    pub fn prepay(&mut self, g: &Group) {
        if let Some(st) = self.groups.get_mut(g) {
            st.prepaid = true;
        }
    }

    /// Drops a group's slot and bucket (its service left upstream).
    pub fn forget(&mut self, g: &Group) {
        if let Some(st) = self.groups.remove(g)
            && st.slot != Slot::Idle
        {
            self.queued -= 1;
        }
    }

    /// Drops every pending publication (quarantine: the view is frozen).
    pub fn clear(&mut self) {
        self.due.clear();
        self.ready.clear();
        self.parked.clear();
        self.link_wait = None;
        for st in self.groups.values_mut() {
            st.slot = Slot::Idle;
            st.waiting_since = None;
        }
        self.queued = 0;
    }

    /// Moves the buckets' clock to `now`, and gets in line the pending groups whose window
    /// closed and the parked groups whose token is there.
    pub fn promote(&mut self, now: Instant) {
        self.clock.set(now.saturating_duration_since(self.origin));
        while let Some(Reverse((t, _))) = self.due.peek() {
            if *t > now {
                break;
            }
            let Some(Reverse((_, g))) = self.due.pop() else {
                break;
            };
            let Some(st) = self.groups.get_mut(&g) else {
                continue;
            };
            if let Slot::Pending { first, last } = st.slot {
                let at = (last + self.quiet).min(first + self.max_delay);
                if at <= now {
                    st.slot = Slot::Ready;
                    self.ready.push_back(g);
                } else {
                    self.due.push(Reverse((at, g)));
                }
            }
        }
        while let Some(Reverse((t, _))) = self.parked.peek() {
            if *t > now {
                break;
            }
            let Some(Reverse((_, g))) = self.parked.pop() else {
                break;
            };
            if let Some(st) = self.groups.get_mut(&g)
                && st.slot == Slot::Parked
            {
                st.slot = Slot::Ready;
                self.ready.push_back(g);
            }
        }
    }

    /// The next group to publish now, round robin, its tokens taken; `None` when the line is
    /// empty or the link's bucket is. A link token taken for a group whose own bucket is empty
    /// passes to the next group in the same instant, so no token is spent on a publication
    /// that did not happen. A group `busy` until a later instant (its last publication's
    /// stages still go out) is parked until then, its own token untouched.
    pub fn next(
        &mut self,
        now: Instant,
        link_token: &mut bool,
        busy: impl Fn(&Group) -> Option<Instant>,
    ) -> Option<Group> {
        self.link_wait = None;
        while let Some(g) = self.ready.pop_front() {
            let Some(st) = self.groups.get_mut(&g) else {
                continue;
            };
            if st.slot != Slot::Ready {
                continue;
            }
            if let Some(until) = busy(&g).filter(|t| *t > now) {
                st.slot = Slot::Parked;
                self.parked.push(Reverse((until, g)));
                continue;
            }
            // Paid for already, it takes no token (a link token taken stays for the next).
            if !std::mem::take(&mut st.prepaid) {
                if !*link_token {
                    if let Err(wait) = self.budget.take_link() {
                        self.throttled += 1;
                        self.link_wait = Some(now + wait);
                        self.ready.push_front(g);
                        return None;
                    }
                    *link_token = true;
                }
                if let Err(wait) = self.budget.take_service(&st.bucket) {
                    self.throttled += 1;
                    st.slot = Slot::Parked;
                    self.parked.push(Reverse((now + wait, g)));
                    continue;
                }
                *link_token = false;
            }
            st.slot = Slot::Idle;
            self.queued -= 1;
            return Some(g);
        }
        None
    }

    /// When the schedule has something to do.
    pub fn next_wake(&self) -> Option<Instant> {
        [
            self.due.peek().map(|Reverse((t, _))| *t),
            self.parked.peek().map(|Reverse((t, _))| *t),
            self.link_wait,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}
