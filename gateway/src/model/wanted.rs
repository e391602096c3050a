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
//! - The set holds a 64-bit hash of each name, counted, not the name: a link wanting 100,000
//!   pods held 4.3 MB of names here beside the engine's own. Two names with one hash are both
//!   wanted while either is (the count), so a collision can only let a pod nobody wants be
//!   decoded and sent on, which the engine drops ([`crate::churn`] checks every pod it is
//!   given); never can it skip a wanted one. A lookup hashes the event's strings as they are,
//!   with no allocation.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use super::NsName;

/// A shared set of wanted pods (cheap to clone: clones share it).
#[derive(Clone, Debug, Default)]
pub struct WantedPods {
    set: Arc<RwLock<Hashes>>,
    /// True until the set is first filled: every pod is wanted.
    everything: Arc<AtomicBool>,
}

/// Each wanted name's hash, with how many wanted names have it.
#[derive(Debug, Default)]
struct Hashes {
    counts: HashMap<u64, u32>,
    hasher: RandomState,
}

impl Hashes {
    fn hash(&self, namespace: &str, name: &str) -> u64 {
        self.hasher.hash_one((namespace, name))
    }

    fn insert(&mut self, pod: &NsName) {
        let h = self.hash(&pod.namespace, &pod.name);
        *self.counts.entry(h).or_default() += 1;
    }

    fn remove(&mut self, pod: &NsName) {
        let h = self.hash(&pod.namespace, &pod.name);
        if let Some(n) = self.counts.get_mut(&h) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&h);
            }
        }
    }
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
        !set.counts.is_empty() && set.counts.contains_key(&set.hash(namespace, name))
    }

    /// Wants `pod` (call before asking for it to be fetched; once for each time it is
    /// wanted anew, as the engine does).
    pub fn insert(&self, pod: &NsName) {
        let mut set = self.set.write().unwrap_or_else(|e| e.into_inner());
        set.insert(pod);
        self.everything.store(false, Ordering::Relaxed);
    }

    /// No longer wants `pod`.
    pub fn remove(&self, pod: &NsName) {
        self.set
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(pod);
    }

    /// Wants exactly `pods` (each once) from now on.
    pub fn replace<'a>(&self, pods: impl IntoIterator<Item = &'a NsName>) {
        let mut set = self.set.write().unwrap_or_else(|e| e.into_inner());
        set.counts.clear();
        pods.into_iter().for_each(|p| set.insert(p));
        set.counts.shrink_to_fit();
        self.everything.store(false, Ordering::Relaxed);
    }

    /// How many pods are wanted (0 while it wants every pod). It walks the counts: the
    /// engine keeps its own count (`Publisher::wanted_pods`).
    #[cfg(test)]
    fn len(&self) -> usize {
        let set = self.set.read().unwrap_or_else(|e| e.into_inner());
        set.counts.values().map(|&n| n as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_is_wanted_until_the_set_is_filled() {
        let w = WantedPods::everything();
        assert!(w.contains("prod", "web-0"));
        let shared = w.clone();
        shared.insert(&NsName::new("prod", "web-1"));
        assert!(!w.contains("prod", "web-0"), "filled: only what it names");
        assert!(w.contains("prod", "web-1"));
        assert!(!w.contains("prod/web", "-1"), "namespace and name apart");
        w.remove(&NsName::new("prod", "web-1"));
        assert!(!w.contains("prod", "web-1"));
        w.replace(&[NsName::new("dev", "a")]);
        assert!(w.contains("dev", "a") && w.len() == 1);
        assert!(
            !WantedPods::default().contains("dev", "a"),
            "a default set wants nothing"
        );
    }
}
