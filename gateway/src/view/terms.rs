//! A view's terms: the runs of resource versions it holds, each under one base. A view that
//! only ever publishes has one. A follower's view serves its holder's base ([`super::replica`]),
//! and when it goes on as the holder it starts a base of its own: the versions it followed
//! still resume, up to the last it followed in each term, and a later version of an earlier
//! term (one its holder served after the follower's last event) is `Expired`, never a wrong
//! resume.
//!
//! A view's first base is random (an incarnation). A term that follows another takes a base
//! above it, by a step ([`next_base`]) from the link Lease's `leaseTransitions` (in cluster
//! mode; random elsewhere): versions a watcher sees keep growing across a
//! take-over (the facade's watchers skip a version at or below the last they sent), and two
//! replicas that take over in turn from the same followed term (the second never saw the
//! first's) pick different bases, so a version of the first's is `Expired` at the second,
//! never a wrong resume (with random steps, one time in 1,024 it would be). Where the
//! order is not kept (the bases ran out; a follower's own first view before its holder's), the
//! view ends its watches first ([`super::View::disconnect`]): they resume, or relist.
//! A version's place is its term's place in this view and its counter ([`State::position`]).

use super::{COUNTER_BITS, COUNTER_MASK, ResumeError, State};

/// Earlier terms kept for resumption. A term is one holder change; a consumer that slept
/// through more than this many relists, as it would after any history it outlived.
const EARLIER_TERMS: usize = 8;

/// The most a term's base steps above the last.
const BASE_STEP: u64 = 1 << 10;

/// The largest base.
const MAX_BASE: u64 = 0x7f_ffff;

/// The base of a term that follows `current`, stepped by `step`: above `current`, or `None`
/// when no base is left above it.
pub(super) fn next_base(current: u64, step: u32) -> Option<u64> {
    let next = (current >> COUNTER_BITS) + 1 + u64::from(step) % BASE_STEP;
    (next <= MAX_BASE).then_some(next << COUNTER_BITS)
}

/// Where a version stands in a view: its term (1 the oldest held, 0 none held) and its counter.
pub(super) type Position = (usize, u64);

/// The base of an incarnation (its low 23 bits; never 0).
pub(super) fn base_of(incarnation: u32) -> u64 {
    (u64::from(incarnation) & MAX_BASE).max(1) << COUNTER_BITS
}

impl State {
    /// Where `resource_version` stands in this view: the versions of a term it holds after
    /// every version of the terms before; a version of no held term stands before them all.
    pub(super) fn position(&self, resource_version: u64) -> Position {
        let (base, counter) = (
            resource_version & !COUNTER_MASK,
            resource_version & COUNTER_MASK,
        );
        if base == self.base {
            return (self.earlier.len() + 1, counter);
        }
        match self.earlier.iter().position(|(b, _)| *b == base) {
            Some(i) => (i + 1, counter),
            None => (0, 0),
        }
    }

    /// The position of a version this view issued or followed, or why it cannot resume: one
    /// past the current term's counter is not issued yet, one past an earlier term's was
    /// issued by a holder this view stopped following.
    pub(super) fn issued(&self, resource_version: u64) -> Result<Position, ResumeError> {
        let (term, counter) = self.position(resource_version);
        let current = self.earlier.len() + 1;
        let last = match term {
            0 => return Err(ResumeError::Expired),
            t if t == current => self.counter,
            t => self.earlier[t - 1].1,
        };
        match (counter <= last, term == current) {
            (true, _) => Ok((term, counter)),
            (false, true) => Err(ResumeError::TooLarge),
            (false, false) => Err(ResumeError::Expired),
        }
    }

    /// Whether `resource_version` is of a term this view may yet begin: one above its own, in a
    /// view that follows terms (it holds an earlier one). A new holder's versions reach a
    /// consumer that moves to a replica still following the old holder a moment before that
    /// replica follows the new holder; the consumer waits for them as for a version not issued
    /// yet. A view of one term (standalone) has no term to wait for.
    pub(super) fn may_begin(&self, resource_version: u64) -> bool {
        !self.earlier.is_empty() && resource_version & !COUNTER_MASK > self.base
    }

    /// Starts a term under `base` at `counter` (the version a followed holder's snapshot had,
    /// or 0 for a term of this view's own); the current one becomes an earlier term, resumable
    /// up to where it is now. The same base goes on as it is.
    pub(super) fn begin_term(&mut self, base: u64, counter: u64) {
        if base == self.base {
            self.counter = self.counter.max(counter);
            return;
        }
        self.earlier.retain(|(b, _)| *b != base);
        self.earlier.push_back((self.base, self.counter));
        while self.earlier.len() > EARLIER_TERMS {
            self.earlier.pop_front();
        }
        self.base = base;
        self.counter = counter;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_following_base_is_above_the_last_until_none_is_left() {
        let first = base_of(5);
        let next = next_base(first, 7).expect("a base above");
        assert_eq!(next, (5 + 1 + 7) << COUNTER_BITS);
        assert!(next_base(next, u32::MAX).expect("above") > next);
        assert_eq!(next_base(MAX_BASE << COUNTER_BITS, 0), None);
    }
}
