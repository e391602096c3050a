//! What a group wants held in the store: the pods its kept endpoints name, and, for a service
//! under its cap, the new pods of their ReplicaSets before anything names them. The pod
//! watcher is told both ([`crate::model::wanted::WantedPods`]) and decodes nothing else.

use std::collections::BTreeSet;

use super::Publisher;
use crate::churn::store::Store;
use crate::model::wanted::{PodHash, PodSet};
use crate::model::{Group, Kind, NsName, PodObject};

impl Publisher {
    /// Whether a new pod of ReplicaSet `rs` is held as it comes, before any endpoint names
    /// it: `rs` controls pods a service under its cap serves. Its next scale-up step names
    /// the new pod a few milliseconds after the pod is written; held, the pod goes out ahead
    /// of its slice without a fetch (guarantee 9).
    pub fn owner_wanted(&self, rs: &NsName) -> bool {
        self.owners.contains_key(rs)
    }

    /// The group's wanted pods become `pods`: new ones are wanted, the others released, and a
    /// pod no group wants any more leaves the store.
    pub(super) fn set_pods(&mut self, g: &Group, pods: BTreeSet<NsName>, store: &mut Store) {
        self.set_pod_hashes(g, pods.iter().map(PodHash::of_id).collect(), store);
    }

    /// [`Self::set_pods`], by hash.
    pub(super) fn set_pod_hashes(&mut self, g: &Group, pods: PodSet, store: &mut Store) {
        let Group::Service(svc) = g else {
            return;
        };
        let st = self.groups.entry(g.clone()).or_default();
        for gone in st.pods.without(&pods) {
            if self.wanted.release(gone, svc) {
                store.drop_pods(gone);
                if let Some(m) = &self.mirror {
                    m.remove(gone);
                }
            }
        }
        for new in pods.without(&st.pods) {
            if self.wanted.add(new, svc)
                && let Some(m) = &self.mirror
            {
                // Before any fetch of it is asked: a skipped event is covered by the fetch.
                m.insert(new);
            }
        }
        st.pods = pods;
    }

    /// The ReplicaSets of `pod` whose new pods are held ahead ([`Self::owner_wanted`]): the
    /// services they serve count its events.
    pub fn followed_owners(&self, pod: &PodObject) -> Vec<NsName> {
        (pod.replicasets())
            .filter(|rs| self.owner_wanted(rs))
            .collect()
    }

    /// The group's [`Published::owners`] become `owners`: a ReplicaSet no group wants any
    /// more stops being followed, and its pods held before any endpoint named them, named by
    /// none since, leave the store.
    pub(in crate::churn) fn set_owners(
        &mut self,
        g: &Group,
        owners: Vec<NsName>,
        store: &mut Store,
    ) {
        if owners.is_empty() && !self.groups.contains_key(g) {
            // Nothing followed, nothing to follow: no state for the group.
            return;
        }
        let st = self.groups.entry(g.clone()).or_default();
        if st.owners == owners {
            return;
        }
        let old = std::mem::replace(&mut st.owners, owners.clone());
        for gone in old.iter().filter(|rs| !owners.contains(rs)) {
            let Some(n) = self.owners.get_mut(gone) else {
                continue;
            };
            *n -= 1;
            if *n > 0 {
                continue;
            }
            self.owners.remove(gone);
            if let Some(m) = &self.mirror {
                m.want_owner(gone, false);
            }
            let unnamed: Vec<PodHash> = (store.pods_of_replicaset(gone))
                .filter(|p| !self.wanted.contains(p))
                .map(PodHash::of_id)
                .collect();
            for pod in unnamed {
                store.drop_pods(pod);
            }
        }
        for new in owners.iter().filter(|rs| !old.contains(rs)) {
            self.own(new);
        }
    }

    /// One more group wants ReplicaSet `rs`'s new pods held ahead; the pod watcher is told at
    /// the first.
    pub(super) fn own(&mut self, rs: &NsName) {
        let n = self.owners.entry(rs.clone()).or_default();
        *n += 1;
        if *n == 1
            && let Some(m) = &self.mirror
        {
            m.want_owner(rs, true);
        }
    }

    /// Drops from the store the pods no group wants and no followed ReplicaSet holds ahead:
    /// what a [`Self::reset`] left there (it forgets the groups, not the store) once the groups
    /// it takes over are installed.
    pub(in crate::churn) fn drop_unwanted_pods(&self, store: &mut Store) {
        let stale: Vec<NsName> = (store.keys(Kind::Pod).into_iter())
            .filter(|id| !self.wanted.contains(id))
            .filter(|id| (store.pod(id)).is_none_or(|p| self.followed_owners(p).is_empty()))
            .collect();
        for id in stale {
            store.drop_pod(&id);
        }
    }
}
