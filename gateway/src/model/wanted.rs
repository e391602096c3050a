//! The pods the engine wants: how the engine announces them (it fills the set) to the pod
//! watcher (which decodes, and sends on, only the pods in it). A type of the model both share,
//! so the engine depends on no upstream code and the upstream on the engine only for its
//! `Change`. A pod nobody wants costs its JSON and two
//! string reads (its name and namespace), not its typed decoding nor a message to the engine.
//!
//! How it stays correct:
//! - The engine inserts a pod into the set *before* it asks for that pod to be fetched
//!   ([`crate::churn::Effect::FetchPods`]). A pod event the watcher skipped just before the pod
//!   became wanted is therefore covered by that fetch, which reads the pod's current state;
//!   any later event finds the pod in the set. A race costs one fetch, never a lost pod.
//! - Deletions are never skipped: a DELETED event carries only the pod's identity to the
//!   engine, so a held pod that goes away always leaves the engine's store.
//! - The engine removes a pod from the set only once it no longer holds it; a relist's
//!   `InitDone` then rightly drops what it did not see.
//! - Until the engine fills the set, [`WantedPods::everything`] wants every pod, so a link
//!   whose engine does not use the set behaves as before; the first [`WantedPods::insert`] or
//!   [`WantedPods::replace`] ends that.
//! - The set holds each wanted pod's [`PodHash`], not its name, as the engine wants it: two
//!   pods with one hash are both wanted while either is, so a collision can only let a pod
//!   nobody wants be decoded and sent on, which the engine drops ([`crate::churn`] checks
//!   every pod it is given); never can it skip a wanted one. A lookup hashes the event's
//!   strings as they are, with no allocation.

use std::collections::HashSet;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, RwLock};

use super::NsName;

/// A pod's identity as the engine and the pod watcher keep a pod they want: a 64-bit hash of
/// its namespace and name, under keys drawn once per process (so nobody outside can choose
/// names that collide). The engine may want tens of thousands of pods that do not exist (the
/// endpoints of a selectorless service can name any pod): kept by name, a wanted pod cost about
/// 200 bytes across the engine's maps and this filter, kept by hash about 56 (ARCHITECTURE.md,
/// "What a link holds, per object").
///
/// Two pods with one hash are one wanted pod to whoever keeps hashes (about one pair in 10^10
/// at 100,000 pods): each keeper says what that costs it, never a pod lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodHash(u64);

/// The process's hash keys.
static KEYS: LazyLock<RandomState> = LazyLock::new(RandomState::new);

impl PodHash {
    /// The hash of pod `namespace/name`.
    pub fn of(namespace: &str, name: &str) -> Self {
        Self(KEYS.hash_one((namespace, name)))
    }

    /// The hash of `pod`.
    pub fn of_id(pod: &NsName) -> Self {
        Self::of(&pod.namespace, &pod.name)
    }
}

/// A set of pods by [`PodHash`], sorted: 8 bytes a pod (a service's wanted pods).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSet(Box<[PodHash]>);

impl FromIterator<PodHash> for PodSet {
    fn from_iter<I: IntoIterator<Item = PodHash>>(pods: I) -> Self {
        let mut pods: Vec<PodHash> = pods.into_iter().collect();
        pods.sort_unstable();
        pods.dedup();
        Self(pods.into_boxed_slice())
    }
}

impl PodSet {
    /// Its pods, in hash order.
    pub fn iter(&self) -> impl Iterator<Item = PodHash> + '_ {
        self.0.iter().copied()
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when it holds `pod`.
    pub fn contains(&self, pod: PodHash) -> bool {
        self.0.binary_search(&pod).is_ok()
    }

    /// Its pods that `other` does not hold.
    pub fn without<'a>(&'a self, other: &'a PodSet) -> impl Iterator<Item = PodHash> + 'a {
        self.iter().filter(|&p| !other.contains(p))
    }
}

/// A shared set of wanted pods (cheap to clone: clones share it), and of the ReplicaSets
/// whose new pods are wanted before any endpoint names them: those of a calm service under its
/// cap, whose next scale-up step names a pod a few milliseconds after the pod is written
/// ([`crate::churn::publish`]). Held then, the pod is in the engine when its slice comes, and
/// goes out ahead of it without a fetch.
#[derive(Clone, Debug, Default)]
pub struct WantedPods {
    set: Arc<RwLock<HashSet<PodHash>>>,
    /// ReplicaSets by the [`PodHash`] of their namespace and name.
    owners: Arc<RwLock<HashSet<PodHash>>>,
    /// True until the set is first filled: every pod is wanted.
    everything: Arc<AtomicBool>,
}

impl WantedPods {
    /// A set that wants every pod until it is first filled.
    pub fn everything() -> Self {
        let w = Self::default();
        w.everything.store(true, Ordering::Relaxed);
        w
    }

    /// Whether pod `namespace/name` is wanted.
    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        if self.everything.load(Ordering::Relaxed) {
            return true;
        }
        let set = self.set.read().unwrap_or_else(|e| e.into_inner());
        !set.is_empty() && set.contains(&PodHash::of(namespace, name))
    }

    /// Whether pod `namespace/name`, controlled by ReplicaSet `owner` if any, is wanted: by
    /// its name, or as a new pod of a wanted ReplicaSet.
    pub fn admits(&self, namespace: &str, name: &str, owner: Option<&str>) -> bool {
        self.contains(namespace, name)
            || owner.is_some_and(|rs| {
                let owners = self.owners.read().unwrap_or_else(|e| e.into_inner());
                !owners.is_empty() && owners.contains(&PodHash::of(namespace, rs))
            })
    }

    /// Wants the new pods of ReplicaSet `rs` (`true`) or no longer (`false`).
    pub fn want_owner(&self, rs: &NsName, wanted: bool) {
        let mut owners = self.owners.write().unwrap_or_else(|e| e.into_inner());
        let h = PodHash::of_id(rs);
        if wanted {
            owners.insert(h);
        } else {
            owners.remove(&h);
        }
    }

    /// Wants `pod` (call before asking for it to be fetched).
    pub fn insert(&self, pod: PodHash) {
        let mut set = self.set.write().unwrap_or_else(|e| e.into_inner());
        set.insert(pod);
        self.everything.store(false, Ordering::Relaxed);
    }

    /// No longer wants `pod`.
    pub fn remove(&self, pod: PodHash) {
        self.set
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pod);
    }

    /// Wants exactly `pods` (each once) from now on.
    pub fn replace(&self, pods: impl IntoIterator<Item = PodHash>) {
        let mut set = self.set.write().unwrap_or_else(|e| e.into_inner());
        set.clear();
        set.extend(pods);
        set.shrink_to_fit();
        self.everything.store(false, Ordering::Relaxed);
    }

    /// How many pods are wanted (0 while it wants every pod).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.set.read().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_set_holds_each_pod_once_and_tells_what_another_lacks() {
        let h = |name: &str| PodHash::of("prod", name);
        let old: PodSet = [h("a"), h("b"), h("a")].into_iter().collect();
        let new: PodSet = [h("b"), h("c")].into_iter().collect();
        assert_eq!(old.iter().count(), 2, "a pod named twice is held once");
        assert!(old.contains(h("a")) && !old.contains(h("c")));
        assert_eq!(old.without(&new).collect::<Vec<_>>(), [h("a")]);
        assert_eq!(new.without(&old).collect::<Vec<_>>(), [h("c")]);
        assert_ne!(h("a"), PodHash::of("dev", "a"), "the namespace counts");
        assert!(PodSet::default().is_empty());
    }

    #[test]
    fn everything_is_wanted_until_the_set_is_filled() {
        let w = WantedPods::everything();
        assert!(w.contains("prod", "web-0"));
        let shared = w.clone();
        shared.insert(PodHash::of("prod", "web-1"));
        assert!(!w.contains("prod", "web-0"), "filled: only what it names");
        assert!(w.contains("prod", "web-1"));
        assert!(!w.contains("prod/web", "-1"), "namespace and name apart");
        w.remove(PodHash::of("prod", "web-1"));
        assert!(!w.contains("prod", "web-1"));
        w.replace([PodHash::of_id(&NsName::new("dev", "a"))]);
        assert!(w.contains("dev", "a") && w.len() == 1);
        assert!(
            !WantedPods::default().contains("dev", "a"),
            "a default set wants nothing"
        );
    }

    #[test]
    fn a_wanted_replicaset_admits_its_new_pods() {
        let w = WantedPods::default();
        w.insert(PodHash::of("prod", "web-0"));
        assert!(w.admits("prod", "web-0", Some("web-rs")), "by its name");
        assert!(!w.admits("prod", "web-1", Some("web-rs")));
        w.want_owner(&NsName::new("prod", "web-rs"), true);
        assert!(w.admits("prod", "web-1", Some("web-rs")), "by its owner");
        assert!(
            !w.admits("dev", "web-1", Some("web-rs")),
            "in its namespace"
        );
        assert!(
            !w.admits("prod", "web-1", None),
            "an unowned pod by name only"
        );
        w.want_owner(&NsName::new("prod", "web-rs"), false);
        assert!(!w.admits("prod", "web-1", Some("web-rs")));
    }
}
