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

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use super::NsName;

/// A shared set of wanted pods (cheap to clone: clones share it).
#[derive(Clone, Debug, Default)]
pub struct WantedPods {
    set: Arc<RwLock<HashSet<NsName>>>,
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
        // An allocation per lookup, still far cheaper than the typed decoding it saves.
        !set.is_empty() && set.contains(&NsName::new(namespace, name))
    }

    /// Wants `pod` (call before asking for it to be fetched).
    pub fn insert(&self, pod: NsName) {
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

    /// Wants exactly `pods` from now on.
    pub fn replace(&self, pods: HashSet<NsName>) {
        *self.set.write().unwrap_or_else(|e| e.into_inner()) = pods;
        self.everything.store(false, Ordering::Relaxed);
    }

    /// How many pods are wanted (0 while it wants every pod).
    pub fn len(&self) -> usize {
        self.set.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when no pod is named (it may still want every pod: see [`WantedPods::everything`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        shared.insert(NsName::new("prod", "web-1"));
        assert!(!w.contains("prod", "web-0"), "filled: only what it names");
        assert!(w.contains("prod", "web-1"));
        w.remove(&NsName::new("prod", "web-1"));
        assert!(!w.contains("prod", "web-1"));
        w.replace([NsName::new("dev", "a")].into_iter().collect());
        assert!(w.contains("dev", "a") && w.len() == 1);
        assert!(
            !WantedPods::default().contains("dev", "a"),
            "a default set wants nothing"
        );
    }
}
