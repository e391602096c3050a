//! What a publication holds: a service's desired downstream state computed from the upstream
//! cache (the capped Service, slices and Endpoints, and the pods a consumer resolves behind
//! them), and the rules that say which pods are served.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;

use super::super::cap;
use super::super::store::Store;
use super::Published;
use crate::model::{
    EndpointsObject, HeldSlice, NsName, ObjKey, Object, TOTAL_ANNOTATION, TRUNCATED_ANNOTATION,
};

/// What a service's publication holds.
pub(super) struct Desired {
    /// Objects to serve as they are now.
    pub(super) objects: Vec<Object>,
    /// Objects that stay served as published before (a contained service's endpoints).
    pub(super) frozen: Vec<ObjKey>,
    pub(super) slices: Vec<HeldSlice>,
    pub(super) endpoints_object: Option<Arc<EndpointsObject>>,
    pub(super) endpoints: usize,
    pub(super) truncated: usize,
    pub(super) pods: BTreeSet<NsName>,
    /// Pods ready kept endpoints name that the store lacks: a consumer could not resolve
    /// those endpoints yet.
    pub(super) unresolved: Vec<NsName>,
}

impl Desired {
    pub(super) fn empty() -> Self {
        Self {
            objects: Vec::new(),
            frozen: Vec::new(),
            slices: Vec::new(),
            endpoints_object: None,
            endpoints: 0,
            truncated: 0,
            pods: BTreeSet::new(),
            unresolved: Vec::new(),
        }
    }
}

/// A service's publication: the service (annotated when the cap truncates it), its capped
/// slices and Endpoints, the pods consumers resolve behind the kept endpoints and those pods'
/// ReplicaSets.
///
/// Every pod a kept endpoint points at is wanted (held, so it is at hand the moment it is
/// needed), but a pod is *served* only when a consumer would look it up: its endpoint is ready
/// (Linkerd's destination skips not-ready endpoints before any pod lookup, and the service
/// mirror reads no pods), or the pod itself is `Ready`, or the group already serves it. The
/// second rule puts a pod in the consumers' caches before its endpoint turns ready, in the
/// order the remote's own controllers produce (the kubelet marks the pod Ready, then the
/// EndpointSlice controller marks its endpoint): a consumer that resolves a ready endpoint
/// whose pod it does not hold drops the address until the slice changes again. The third
/// keeps a served pod served while its endpoint flaps, so readiness flips cost a pod's
/// update, not its removal and return. A crash-looping flood of never-ready pods thus costs
/// consumers none of its pods.
pub(super) fn desired_service(
    store: &Store,
    service: &Arc<Service>,
    svc: &NsName,
    previous: &Published,
    max: usize,
) -> Desired {
    let slices = store.slices_of(svc);
    let kept = cap::keys(&previous.slices, previous.endpoints_object.as_ref());
    let mut capped = cap::cap(&slices, store.endpoints_of(svc), &kept, max);
    // A slice that is as this group published it stays the one published: the view and the
    // group share it, rather than the group hold a copy thawed or cut anew.
    let before: HashMap<&NsName, &HeldSlice> =
        previous.slices.iter().map(|s| (s.id(), s)).collect();
    for s in &mut capped.slices {
        if let Some(&p) = before.get(s.id())
            && p == s
        {
            *s = p.clone();
        }
    }
    let mut objects = vec![Object::Service(annotated(service, &capped))];
    objects.extend(capped.slices.iter().cloned().map(Object::EndpointSlice));
    objects.extend(capped.endpoints.iter().cloned().map(Object::Endpoints));
    let mut pods: BTreeMap<NsName, bool> = BTreeMap::new();
    referred(&capped.slices, capped.endpoints.as_ref(), &mut pods);
    objects.extend(resolved(store, &pods, previous, true));
    let unresolved = (pods.iter())
        .filter(|(id, ready)| **ready && store.pod(id).is_none())
        .map(|(id, _)| id.clone())
        .collect();
    Desired {
        objects,
        frozen: Vec::new(),
        slices: capped.slices,
        endpoints_object: capped.endpoints,
        endpoints: capped.published,
        truncated: capped.truncated,
        pods: pods.into_keys().collect(),
        unresolved,
    }
}

/// Each pod the kept endpoints point at, and whether some kept endpoint pointing at it is
/// ready.
pub(super) fn referred(
    slices: &[HeldSlice],
    endpoints: Option<&Arc<EndpointsObject>>,
    pods: &mut BTreeMap<NsName, bool>,
) {
    let mut refer = |(pod, ready): (NsName, bool)| *pods.entry(pod).or_default() |= ready;
    for s in slices {
        s.pod_refs_ready().into_iter().for_each(&mut refer);
    }
    if let Some(ep) = endpoints {
        ep.pod_refs_ready().for_each(&mut refer);
    }
}

/// The pods served of those `pods` names (see [`desired_service`] for which), held ones only,
/// and their ReplicaSets. `ahead`: a pod `Ready` itself is served before its endpoint turns
/// ready. Not for a contained service: its endpoints are frozen, so a pod behind a not-ready
/// one is never looked up until the service is released (and a never-ready flood whose pods
/// come up would put a thousand of them through).
pub(super) fn resolved(
    store: &Store,
    pods: &BTreeMap<NsName, bool>,
    previous: &Published,
    ahead: bool,
) -> Vec<Object> {
    let mut objects = Vec::new();
    let mut replicasets = BTreeSet::new();
    for (id, &ready) in pods {
        if let Some(p) = store.pod(id)
            && (ready || (ahead && p.is_ready()) || previous.serves_pod(id))
        {
            replicasets.extend(p.replicasets());
            objects.push(Object::Pod(p.clone()));
        }
    }
    for id in &replicasets {
        if let Some(rs) = store.replicaset(id) {
            objects.push(Object::ReplicaSet(rs.clone()));
        }
    }
    objects
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
