//! One publication of one group: the group's desired downstream state, computed from the latest
//! upstream state when its turn comes, diffed against what the group published before and
//! applied to the view in one step.
//!
//! For a service the desired state is the Service, its capped EndpointSlices and Endpoints,
//! the pods the kept endpoints point at and those pods' ReplicaSets. A kept endpoint whose pod
//! the store does not hold (its last event came before the slice that points at it, or before
//! the link started) is asked for with [`Effect::FetchPods`]; the pod is published when the
//! fetch answers, through the same budget as any change.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;

use super::cap::{self, EndpointKey};
use super::store::Store;
use super::{Effect, Engine, GroupState, MAX_FETCHING};
use crate::model::{
    self, Group, NsName, ObjKey, Object, TOTAL_ANNOTATION, TRUNCATED_ANNOTATION, pod_replicasets,
};
use crate::view::Change as ViewChange;

/// Publications between two scans of the pods being fetched, once that set is full.
const PRUNE_EVERY: u64 = 512;

/// What a service's publication holds.
struct Desired {
    objects: Vec<Object>,
    endpoints: HashSet<EndpointKey>,
    truncated: usize,
    missing_pods: Vec<NsName>,
}

impl Desired {
    fn empty() -> Self {
        Self {
            objects: Vec::new(),
            endpoints: HashSet::new(),
            truncated: 0,
            missing_pods: Vec::new(),
        }
    }
}

impl Engine {
    /// Publishes a group's current state: what the cap keeps of it, diffed against what it
    /// published before.
    pub(super) fn publish(&mut self, g: &Group) {
        let budget = &self.budget;
        let st = self
            .groups
            .entry(g.clone())
            .or_insert_with(|| GroupState::new(budget));
        let was_published = !st.objects.is_empty();
        let desired = match g {
            Group::Service(svc) => match self.store.service(svc) {
                None => Desired::empty(),
                Some(_) if !was_published && self.counters.services >= self.max_services => {
                    self.counters.services_withheld += 1;
                    Desired::empty()
                }
                Some(service) => {
                    desired_service(&self.store, service, svc, &st.endpoints, self.max_endpoints)
                }
            },
            Group::Servers(ns) => Desired {
                objects: self
                    .store
                    .servers_in(ns)
                    .into_iter()
                    .map(Object::Server)
                    .collect(),
                ..Desired::empty()
            },
        };

        let keys: BTreeSet<ObjKey> = desired.objects.iter().map(Object::key).collect();
        let mut changes: Vec<ViewChange> = Vec::with_capacity(desired.objects.len());
        for gone in st.objects.difference(&keys) {
            let n = self.obj_refs.entry(gone.clone()).or_default();
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.obj_refs.remove(gone);
                changes.push(ViewChange::Delete(gone.clone()));
            }
        }
        for new in keys.difference(&st.objects) {
            *self.obj_refs.entry(new.clone()).or_default() += 1;
        }
        changes.extend(desired.objects.into_iter().map(ViewChange::Upsert));

        let c = &mut self.counters;
        if matches!(g, Group::Service(_)) {
            c.services = c.services + u64::from(!keys.is_empty()) - u64::from(was_published);
        }
        c.endpoints_published =
            c.endpoints_published + desired.endpoints.len() as u64 - st.endpoints.len() as u64;
        c.endpoints_truncated =
            c.endpoints_truncated + desired.truncated as u64 - st.truncated as u64;
        st.objects = keys;
        st.endpoints = desired.endpoints;
        st.truncated = desired.truncated;
        if !self.view.apply(changes).is_empty() {
            c.downstream_updates += 1;
        }
        self.request_pods(desired.missing_pods);
    }

    /// Asks the caller for pods that kept endpoints point at, once each while they stay
    /// missing, and never more than [`MAX_FETCHING`] at a time.
    fn request_pods(&mut self, missing: Vec<NsName>) {
        if missing.is_empty() {
            return;
        }
        if self.fetching.len() + missing.len() > MAX_FETCHING
            && self.counters.downstream_updates >= self.fetch_prune_at
        {
            // Forget pods whose fetch found nothing or that nothing points at any more. At most
            // once every PRUNE_EVERY publications: a full set of pods that stay missing must not
            // cost a scan of the set on every publication.
            let store = &self.store;
            self.fetching
                .retain(|p| store.wants_pod(p) && store.pod(p).is_none());
            self.fetch_prune_at = self.counters.downstream_updates + PRUNE_EVERY;
        }
        let mut ask = Vec::new();
        for pod in missing {
            if self.fetching.len() >= MAX_FETCHING {
                break;
            }
            if self.fetching.insert(pod.clone()) {
                ask.push(pod);
            }
        }
        if !ask.is_empty() {
            self.counters.pods_fetched += ask.len() as u64;
            self.effects.push(Effect::FetchPods(ask));
        }
    }
}

/// A service's publication: the service (annotated when the cap truncates it), its capped
/// slices and Endpoints, the pods the kept endpoints point at and those pods' ReplicaSets.
fn desired_service(
    store: &Store,
    service: &Arc<Service>,
    svc: &NsName,
    previous: &HashSet<EndpointKey>,
    max: usize,
) -> Desired {
    let slices = store.slices_of(svc);
    let capped = cap::cap(&slices, store.endpoints_of(svc), previous, max);
    let mut objects = vec![Object::Service(annotated(service, &capped))];
    let mut pods: BTreeSet<NsName> = BTreeSet::new();
    for s in &capped.slices {
        pods.extend(model::slice_pods(s));
        objects.push(Object::EndpointSlice(s.clone()));
    }
    if let Some(ep) = &capped.endpoints {
        pods.extend(model::endpoints_pods(ep));
        objects.push(Object::Endpoints(ep.clone()));
    }
    let mut replicasets = BTreeSet::new();
    let mut missing_pods = Vec::new();
    for id in pods {
        match store.pod(&id) {
            Some(p) => {
                replicasets.extend(pod_replicasets(p));
                objects.push(Object::Pod(p.clone()));
            }
            None => missing_pods.push(id),
        }
    }
    for id in &replicasets {
        if let Some(rs) = store.replicaset(id) {
            objects.push(Object::ReplicaSet(rs.clone()));
        }
    }
    Desired {
        objects,
        endpoints: capped.published,
        truncated: capped.truncated,
        missing_pods,
    }
}

/// The service as published: when the cap withholds endpoints, annotated with how many of how
/// many, so the truncation is visible to every consumer.
fn annotated(service: &Arc<Service>, capped: &cap::Capped) -> Arc<Service> {
    if capped.truncated == 0 {
        return service.clone();
    }
    let mut s = Service::clone(service);
    let notes = s.metadata.annotations.get_or_insert_with(Default::default);
    notes.insert(TRUNCATED_ANNOTATION.into(), capped.truncated.to_string());
    notes.insert(TOTAL_ANNOTATION.into(), capped.total.to_string());
    Arc::new(s)
}
