//! When groups publish: a group whose coalescing window closed gets in line, and the line is
//! served round robin while the link's and the group's GCRA buckets have tokens. A group whose
//! own bucket is empty is parked until its token is due.

use std::cmp::Reverse;

use tokio::time::Instant;

use super::{Engine, Slot};

impl Engine {
    /// Pending groups whose window closed, and parked groups whose token is there, get in line.
    pub(super) fn promote(&mut self, now: Instant) {
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
            if let Some(st) = self.groups.get_mut(&g) {
                st.slot = Slot::Ready;
                self.ready.push_back(g);
            }
        }
    }

    /// Round robin over ready groups while the link has tokens. A link token taken for a group
    /// whose own bucket is empty passes to the next group in the same instant, so no token is
    /// spent on a publication that did not happen.
    pub(super) fn publish_ready(&mut self, now: Instant) {
        self.link_wait = None;
        let mut link_token = false;
        while !self.ready.is_empty() {
            if !link_token {
                match self.budget.take_link() {
                    Ok(()) => link_token = true,
                    Err(wait) => {
                        self.counters.throttled += 1;
                        self.link_wait = Some(now + wait);
                        break;
                    }
                }
            }
            let Some(g) = self.ready.pop_front() else {
                break;
            };
            let Some(st) = self.groups.get_mut(&g) else {
                continue;
            };
            if let Err(wait) = self.budget.take_service(&st.bucket) {
                self.counters.throttled += 1;
                st.slot = Slot::Parked;
                self.parked.push(Reverse((now + wait, g)));
                continue;
            }
            link_token = false;
            st.slot = Slot::Idle;
            self.publish(&g);
        }
    }
}
