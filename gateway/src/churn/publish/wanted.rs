//! The pods the groups' selections point at (their *wanted* pods), by the services that want
//! each, and how each is being brought in: the store holds a wanted pod once a watch event or
//! a fetch brings it, and a wanted pod it lacks is fetched once, not again while what the
//! engine knows of it stands.
//!
//! How a wanted pod the store lacks is known, by [`Bringing`]:
//! - Asked for and answered absent: the pod watcher sends the pod if it comes, since it is
//!   wanted ([`crate::model::wanted::WantedPods`] holds it from the moment it is wanted). Such
//!   a pod is not asked for again, and never holds one of the [`MAX_FETCHING`] places of the
//!   fetches in flight: a link whose kept endpoints name thousands of pods that do not exist
//!   still fetches the one pod that does.
//! - Wanted before the pod watcher's first list began ([`Wanted::listing`]): the list brings it
//!   or proves it absent, so a start-up asks for no pod the list answers.
//! - Asked for under a ticket: only the answer of that ticket counts. A pod released and
//!   wanted again while a fetch was in flight is asked again, and the older answer, read
//!   before the pod was wanted anew, is dropped.

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::churn::{Answer, Fetch};
use crate::model::{NsName, Object};

/// Pod fetches in flight at most. A fetch is asked only for a pod a *kept* endpoint points
/// at, so this is bounded by the cap anyway; 4096 keeps a start-up against thousands of
/// services from queueing more GETs than the remote should see at once.
pub(super) const MAX_FETCHING: usize = 4096;

/// The wanted pods.
#[derive(Debug, Default)]
pub(super) struct Wanted {
    pods: HashMap<NsName, Wanting>,
    /// Pods [`Bringing::Asked`], not answered yet.
    in_flight: usize,
    /// The next fetch's ticket.
    next_ticket: u32,
}

/// One wanted pod.
#[derive(Debug, Default)]
struct Wanting {
    /// The services whose selection points at it: one, held inline, but for a pod behind
    /// several services.
    by: SmallVec<[NsName; 1]>,
    bringing: Bringing,
}

/// How a wanted pod is being brought in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Bringing {
    /// Nothing known of it since it was wanted: a publication that lacks it asks for it.
    #[default]
    Unknown,
    /// Wanted before the pod watcher's list began: the list brings it or its absence.
    Listing,
    /// Asked for under this ticket; no answer and no event yet.
    Asked(u32),
    /// The pod watcher brings it: an event came for it, or a fetch or a list found it absent.
    Watched,
}

impl Wanted {
    /// How many pods are wanted.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// True when some service wants the pod.
    pub fn contains(&self, pod: &NsName) -> bool {
        self.pods.contains_key(pod)
    }

    /// The name a wanted pod is held under (one allocation, shared).
    pub fn held_name(&self, pod: &NsName) -> Option<&NsName> {
        self.pods.get_key_value(pod).map(|(name, _)| name)
    }

    /// The services that want the pod.
    pub fn by(&self, pod: &NsName) -> &[NsName] {
        self.pods.get(pod).map_or(&[], |w| w.by.as_slice())
    }

    /// The wanted pods' names.
    pub fn names(&self) -> impl Iterator<Item = &NsName> {
        self.pods.keys()
    }

    /// Forgets every wanted pod.
    pub fn clear(&mut self) {
        self.pods.clear();
        self.in_flight = 0;
    }

    /// `svc` wants `pod`: true when no service wanted it before.
    pub fn add(&mut self, pod: NsName, svc: &NsName) -> bool {
        let w = self.pods.entry(pod).or_default();
        w.by.push(svc.clone());
        w.by.len() == 1
    }

    /// `svc` no longer wants `pod`: true when no service wants it any more.
    pub fn release(&mut self, pod: &NsName, svc: &NsName) -> bool {
        let Some(w) = self.pods.get_mut(pod) else {
            return false;
        };
        w.by.retain(|s| s != svc);
        if !w.by.is_empty() {
            return false;
        }
        self.in_flight -= usize::from(matches!(w.bringing, Bringing::Asked(_)));
        self.pods.remove(pod);
        true
    }

    /// A watch event for the pod came: the watcher brings it from now on, and a fetch in
    /// flight is answered by it.
    pub fn seen(&mut self, pod: &NsName) {
        if let Some(w) = self.pods.get_mut(pod) {
            self.in_flight -= usize::from(matches!(w.bringing, Bringing::Asked(_)));
            w.bringing = Bringing::Watched;
        }
    }

    /// A fetch answered for `pod`: the pod found, when it is still wanted, this is the answer
    /// of its last ask, and no event came first (that one is newer).
    pub fn answered(&mut self, pod: &NsName, ticket: u32, answer: Answer) -> Option<Object> {
        let w = self.pods.get_mut(pod)?;
        if w.bringing != Bringing::Asked(ticket) {
            return None;
        }
        self.in_flight -= 1;
        match answer {
            Answer::Found(obj) => {
                w.bringing = Bringing::Watched;
                Some(obj)
            }
            Answer::Absent => {
                w.bringing = Bringing::Watched;
                None
            }
            Answer::Failed => {
                w.bringing = Bringing::Unknown;
                None
            }
        }
    }

    /// Asks for the `missing` pods nothing is known of, while fewer than [`MAX_FETCHING`] are
    /// in flight; `None` when there is none to ask.
    pub fn ask(&mut self, missing: impl IntoIterator<Item = NsName>) -> Option<Fetch> {
        let ticket = self.next_ticket;
        let mut pods = Vec::new();
        for pod in missing {
            if self.in_flight >= MAX_FETCHING {
                break;
            }
            if let Some(w) = self.pods.get_mut(&pod)
                && w.bringing == Bringing::Unknown
            {
                w.bringing = Bringing::Asked(ticket);
                self.in_flight += 1;
                pods.push(pod);
            }
        }
        if pods.is_empty() {
            return None;
        }
        self.next_ticket = self.next_ticket.wrapping_add(1);
        Some(Fetch { ticket, pods })
    }

    /// The pod watcher's first list begins, with every pod wanted now in the set it decodes:
    /// the list brings each of them, or proves it absent.
    pub fn listing(&mut self) {
        for w in self.pods.values_mut() {
            if w.bringing == Bringing::Unknown {
                w.bringing = Bringing::Listing;
            }
        }
    }

    /// A pod list is complete: what it was to bring, it brought, or it is absent and the
    /// watcher sends it if it comes.
    pub fn listed(&mut self) {
        for w in self.pods.values_mut() {
            if w.bringing == Bringing::Listing {
                w.bringing = Bringing::Watched;
            }
        }
    }

    /// A new run of watchers starts (or upstream stopped): nothing is known of any wanted
    /// pod, and the fetches in flight are dropped with the run's messages.
    pub fn new_upstream(&mut self) {
        for w in self.pods.values_mut() {
            w.bringing = Bringing::Unknown;
        }
        self.in_flight = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::churn::tests::mk_pod;

    fn pod(name: &str) -> NsName {
        NsName::new("ns", name)
    }

    fn wanted(names: impl IntoIterator<Item = String>) -> Wanted {
        let mut w = Wanted::default();
        for n in names {
            w.add(pod(&n), &pod("web"));
        }
        w
    }

    fn asked(w: &mut Wanted, names: &[&str]) -> Fetch {
        w.ask(names.iter().map(|n| pod(n))).expect("asked")
    }

    #[test]
    fn a_pod_answered_absent_is_not_asked_again_and_frees_its_place() {
        let n = MAX_FETCHING + 1;
        let mut w = wanted((0..n).map(|i| format!("p{i}")));
        let all = || (0..n).map(|i| pod(&format!("p{i}")));
        let first = w.ask(all()).expect("asked");
        assert_eq!(
            first.pods.len(),
            MAX_FETCHING,
            "no more in flight than the bound"
        );
        assert!(w.ask(all()).is_none(), "the bound is full");
        for p in &first.pods {
            assert!(w.answered(p, first.ticket, Answer::Absent).is_none());
        }
        let second = w.ask(all()).expect("the one left is asked");
        assert_eq!(second.pods, [pod(&format!("p{MAX_FETCHING}"))]);
        assert_ne!(second.ticket, first.ticket);
        assert!(w.ask(all()).is_none(), "absent pods are not asked again");
    }

    #[test]
    fn only_the_last_asks_answer_counts() {
        let mut w = wanted(["a".to_owned()]);
        let old = asked(&mut w, &["a"]);
        assert!(w.release(&pod("a"), &pod("web")));
        w.add(pod("a"), &pod("web"));
        let new = asked(&mut w, &["a"]);
        assert!(
            w.answered(&pod("a"), old.ticket, Answer::Absent).is_none(),
            "read before the pod was wanted anew"
        );
        let found = w.answered(&pod("a"), new.ticket, Answer::Found(mk_pod("a", "Running")));
        assert!(found.is_some(), "the answer to the last ask");
        assert_eq!(w.in_flight, 0);
    }

    #[test]
    fn an_event_answers_the_fetch_and_a_later_answer_is_dropped() {
        let mut w = wanted(["a".to_owned()]);
        let f = asked(&mut w, &["a"]);
        w.seen(&pod("a"));
        assert_eq!(w.in_flight, 0);
        let late = w.answered(&pod("a"), f.ticket, Answer::Found(mk_pod("a", "Running")));
        assert!(late.is_none(), "the event is newer");
        assert!(w.ask([pod("a")]).is_none(), "the watcher brings it");
    }

    #[test]
    fn a_failed_fetch_is_asked_again() {
        let mut w = wanted(["a".to_owned()]);
        let f = asked(&mut w, &["a"]);
        assert!(w.answered(&pod("a"), f.ticket, Answer::Failed).is_none());
        assert_eq!(w.in_flight, 0);
        assert_eq!(asked(&mut w, &["a"]).pods, [pod("a")]);
    }

    #[test]
    fn pods_wanted_before_the_list_began_are_answered_by_it() {
        let mut w = wanted(["before".to_owned()]);
        w.listing();
        assert!(w.ask([pod("before")]).is_none(), "the list brings it");
        w.add(pod("during"), &pod("web"));
        w.listed();
        assert!(w.ask([pod("before")]).is_none(), "absent from the list");
        assert_eq!(
            asked(&mut w, &["before", "during"]).pods,
            [pod("during")],
            "wanted once the list had begun: it may have passed the pod"
        );
    }

    #[test]
    fn a_new_upstream_forgets_what_the_old_one_knew() {
        let mut w = wanted(["a".to_owned(), "b".to_owned()]);
        asked(&mut w, &["a"]);
        w.seen(&pod("b"));
        w.new_upstream();
        assert_eq!(w.in_flight, 0);
        let mut again = asked(&mut w, &["a", "b"]).pods;
        again.sort();
        assert_eq!(again, [pod("a"), pod("b")]);
    }

    #[test]
    fn releasing_a_pod_in_flight_frees_its_place() {
        let mut w = wanted(["a".to_owned()]);
        w.add(pod("a"), &pod("api"));
        asked(&mut w, &["a"]);
        assert!(!w.release(&pod("a"), &pod("web")), "api still wants it");
        assert_eq!(w.in_flight, 1);
        assert!(w.release(&pod("a"), &pod("api")));
        assert_eq!(w.in_flight, 0);
        assert!(!w.contains(&pod("a")));
    }
}
