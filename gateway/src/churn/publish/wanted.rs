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
use std::sync::Arc;

use crate::churn::{Answer, Fetch};
use crate::model::wanted::PodHash;
use crate::model::{NsName, Object};

/// Pod fetches in flight at most. A fetch is asked only for a pod a *kept* endpoint points
/// at, so this is bounded by the cap anyway; 4096 keeps a start-up against thousands of
/// services from queueing more GETs than the remote should see at once.
pub(super) const MAX_FETCHING: usize = 4096;

/// The wanted pods, by [`PodHash`]: a wanted pod costs 24 bytes, its hash and its entry, and
/// not its name (the engine reads names again from the endpoints that name them). Two wanted
/// pods with one hash are one entry, wanted by the services of both: the store then keeps
/// either while one is wanted, and an event of either republishes the services of both, which
/// publish what they did. Both are extra work, never a pod lost.
#[derive(Debug, Default)]
pub(super) struct Wanted {
    pods: HashMap<PodHash, Wanting>,
    /// The sets of services the entries name.
    sets: ServiceSets,
    /// Pods [`Bringing::Asked`], not answered yet.
    in_flight: usize,
    /// The next fetch's ticket.
    next_ticket: u32,
}

/// One wanted pod.
#[derive(Debug)]
struct Wanting {
    /// The services whose selection points at it, as a set of [`ServiceSets`].
    by: SetId,
    bringing: Bringing,
}

/// A set of [`ServiceSets`].
type SetId = u32;

/// Sets of services, each held once and named by a number, with how many pods name it: the
/// 100,000 pods behind 1,000 services name 1,000 sets (or a few more, for pods behind several
/// services), 4 bytes a pod.
#[derive(Debug, Default)]
struct ServiceSets {
    /// By [`SetId`]: the services, sorted, and how many pods name the set; `None` once no pod
    /// does (its number is given to the next new set).
    sets: Vec<Option<(Arc<[NsName]>, u32)>>,
    ids: HashMap<Arc<[NsName]>, SetId>,
    free: Vec<SetId>,
}

impl ServiceSets {
    /// The services of set `id`.
    fn get(&self, id: SetId) -> &[NsName] {
        self.sets[id as usize].as_ref().map_or(&[], |(set, _)| set)
    }

    /// One more pod names the set of `services` (sorted): its number.
    fn take(&mut self, services: Vec<NsName>) -> SetId {
        if let Some(&id) = self.ids.get(services.as_slice()) {
            if let Some((_, uses)) = &mut self.sets[id as usize] {
                *uses += 1;
            }
            return id;
        }
        let set: Arc<[NsName]> = services.into();
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.sets.push(None);
                (self.sets.len() - 1) as SetId
            }
        };
        self.sets[id as usize] = Some((set.clone(), 1));
        self.ids.insert(set, id);
        id
    }

    /// One pod less names set `id`.
    fn give_back(&mut self, id: SetId) {
        let slot = &mut self.sets[id as usize];
        if let Some((set, uses)) = slot {
            *uses -= 1;
            if *uses == 0 {
                self.ids.remove(set);
                *slot = None;
                self.free.push(id);
            }
        }
    }

    /// A pod that names set `id` (or none) is wanted by `svc` too: the set it names now.
    fn with(&mut self, id: Option<SetId>, svc: &NsName) -> SetId {
        let mut services = id.map_or_else(Vec::new, |id| self.get(id).to_vec());
        if let Err(at) = services.binary_search(svc) {
            services.insert(at, svc.clone());
        }
        let new = self.take(services);
        id.into_iter().for_each(|old| self.give_back(old));
        new
    }

    /// A pod that names set `id` is no longer wanted by `svc`: the set it names now, `None`
    /// when no service wants it.
    fn without(&mut self, id: SetId, svc: &NsName) -> Option<SetId> {
        let services: Vec<NsName> = self.get(id).iter().filter(|s| *s != svc).cloned().collect();
        let new = (!services.is_empty()).then(|| self.take(services));
        self.give_back(id);
        new
    }
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
        self.pods.contains_key(&PodHash::of_id(pod))
    }

    /// The services that want the pod.
    pub fn by(&self, pod: &NsName) -> &[NsName] {
        (self.pods.get(&PodHash::of_id(pod))).map_or(&[], |w| self.sets.get(w.by))
    }

    /// The wanted pods.
    pub fn hashes(&self) -> impl Iterator<Item = PodHash> {
        self.pods.keys().copied()
    }

    /// Forgets every wanted pod.
    pub fn clear(&mut self) {
        self.pods.clear();
        self.sets = ServiceSets::default();
        self.in_flight = 0;
    }

    /// `svc` wants `pod`: true when no service wanted it before.
    pub fn add(&mut self, pod: PodHash, svc: &NsName) -> bool {
        match self.pods.get_mut(&pod) {
            Some(w) => {
                w.by = self.sets.with(Some(w.by), svc);
                false
            }
            None => {
                let by = self.sets.with(None, svc);
                let bringing = Bringing::Unknown;
                self.pods.insert(pod, Wanting { by, bringing });
                true
            }
        }
    }

    /// `svc` no longer wants `pod`: true when no service wants it any more.
    pub fn release(&mut self, pod: PodHash, svc: &NsName) -> bool {
        let Some(w) = self.pods.get_mut(&pod) else {
            return false;
        };
        if let Some(by) = self.sets.without(w.by, svc) {
            w.by = by;
            return false;
        }
        self.in_flight -= usize::from(matches!(w.bringing, Bringing::Asked(_)));
        self.pods.remove(&pod);
        true
    }

    /// True while the pod is being brought in: to be asked for, asked for, or to come with
    /// the pod watcher's list; false once it came or is known absent, or when it is not wanted.
    pub fn coming(&self, pod: &NsName) -> bool {
        (self.pods.get(&PodHash::of_id(pod))).is_some_and(|w| w.bringing != Bringing::Watched)
    }

    /// A watch event for the pod came: the watcher brings it from now on, and a fetch in
    /// flight is answered by it.
    pub fn seen(&mut self, pod: &NsName) {
        if let Some(w) = self.pods.get_mut(&PodHash::of_id(pod)) {
            self.in_flight -= usize::from(matches!(w.bringing, Bringing::Asked(_)));
            w.bringing = Bringing::Watched;
        }
    }

    /// A fetch answered for `pod`: the pod found, when it is still wanted, this is the answer
    /// of its last ask, and no event came first (that one is newer).
    pub fn answered(&mut self, pod: &NsName, ticket: u32, answer: Answer) -> Option<Object> {
        let w = self.pods.get_mut(&PodHash::of_id(pod))?;
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
            if let Some(w) = self.pods.get_mut(&PodHash::of_id(&pod))
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

    fn hash(name: &str) -> PodHash {
        PodHash::of_id(&pod(name))
    }

    fn wanted(names: impl IntoIterator<Item = String>) -> Wanted {
        let mut w = Wanted::default();
        for n in names {
            w.add(hash(&n), &pod("web"));
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
        assert!(w.release(hash("a"), &pod("web")));
        w.add(hash("a"), &pod("web"));
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
        w.add(hash("during"), &pod("web"));
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
        w.add(hash("a"), &pod("api"));
        asked(&mut w, &["a"]);
        assert!(!w.release(hash("a"), &pod("web")), "api still wants it");
        assert_eq!(w.in_flight, 1);
        assert_eq!(w.by(&pod("a")), [pod("api")]);
        assert!(w.release(hash("a"), &pod("api")));
        assert_eq!(w.in_flight, 0);
        assert!(!w.contains(&pod("a")));
        assert!(w.sets.ids.is_empty(), "no pod is wanted: no set is held");
    }

    #[test]
    fn pods_behind_the_same_services_name_one_set() {
        let mut w = Wanted::default();
        for name in ["a", "b"] {
            assert!(w.add(hash(name), &pod("web")));
        }
        assert!(!w.add(hash("b"), &pod("api")), "b was wanted already");
        assert!(!w.add(hash("b"), &pod("api")), "twice is once");
        assert_eq!(w.by(&pod("a")), [pod("web")]);
        assert_eq!(
            w.by(&pod("b")),
            [pod("api"), pod("web")],
            "sorted, each once"
        );
        assert_eq!(w.sets.ids.len(), 2, "{{web}} and {{api, web}}");
        assert!(!w.release(hash("b"), &pod("web")));
        assert_eq!(w.by(&pod("b")), [pod("api")]);
        assert!(w.release(hash("a"), &pod("web")));
        assert_eq!(
            w.sets.ids.len(),
            1,
            "{{web}} and {{api, web}} are named by no pod"
        );
        assert!(w.add(hash("c"), &pod("db")));
        assert_eq!(w.sets.sets.len(), 3, "a new set takes a number given back");
        assert_eq!(w.by(&pod("c")), [pod("db")]);
        assert_eq!(w.by(&pod("b")), [pod("api")]);
    }
}
