//! The upstream cache of one link: the latest state of every object the link may publish, with
//! the indexes that tie objects to publication groups.
//!
//! What it keeps: every Service, EndpointSlice, Endpoints, ReplicaSet (metadata) and Server it is
//! given, and only the pods that some stored slice or Endpoints points at. A pod nothing points at
//! costs its decoding and a hash lookup, nothing more: that is what keeps a flood of pods behind
//! an unselected service away from the consumers and out of memory.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::core::{Selector, SelectorExt};

use crate::model::{
    Group, Kind, NsName, ObjKey, Object, Server, endpoints_pods, pod_replicasets, slice_pod_refs,
    slice_pods, slice_service,
};

/// What a change touched.
#[derive(Debug, Default)]
pub struct Touched {
    /// Groups to publish again.
    pub groups: Vec<Group>,
    /// False when the change concerns no selected service (a flood of unrelated pods).
    pub relevant: bool,
}

/// The cache.
#[derive(Debug)]
pub struct Store {
    /// The Link's service selector; `None` when it does not parse (validation refuses such a
    /// spec, so this is a last defence): then nothing is selected rather than everything.
    selector: Option<Selector>,
    services: HashMap<NsName, Arc<Service>>,
    slices: HashMap<NsName, Arc<EndpointSlice>>,
    slices_by_service: HashMap<NsName, BTreeSet<NsName>>,
    endpoints: HashMap<NsName, Arc<Endpoints>>,
    pods: HashMap<NsName, Arc<Pod>>,
    /// pod -> service -> number of slices/Endpoints of that service pointing at it.
    pod_refs: HashMap<NsName, HashMap<NsName, u32>>,
    replicasets: HashMap<NsName, Arc<ObjectMeta>>,
    rs_pods: HashMap<NsName, HashSet<NsName>>,
    servers: HashMap<NsName, Arc<Server>>,
    /// Upstream endpoints per service, across its slices (for flood detection).
    slice_endpoints: HashMap<NsName, usize>,
}

impl Store {
    /// An empty cache selecting services with `selector`.
    pub fn new(selector: &LabelSelector) -> Self {
        Self {
            selector: Selector::try_from(selector.clone()).ok(),
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_by_service: HashMap::new(),
            endpoints: HashMap::new(),
            pods: HashMap::new(),
            pod_refs: HashMap::new(),
            replicasets: HashMap::new(),
            rs_pods: HashMap::new(),
            servers: HashMap::new(),
            slice_endpoints: HashMap::new(),
        }
    }

    /// Upstream endpoints of a service across its slices.
    pub fn endpoint_count(&self, svc: &NsName) -> usize {
        self.slice_endpoints.get(svc).copied().unwrap_or_default()
    }

    /// Objects held.
    pub fn len(&self) -> usize {
        self.services.len()
            + self.slices.len()
            + self.endpoints.len()
            + self.pods.len()
            + self.replicasets.len()
            + self.servers.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops everything (quarantine: memory falls).
    pub fn clear(&mut self) {
        *self = Self {
            selector: std::mem::take(&mut self.selector),
            ..Self::new(&LabelSelector::default())
        };
    }

    /// True when the service exists upstream and the link selects it.
    pub fn is_selected(&self, svc: &NsName) -> bool {
        self.services
            .get(svc)
            .is_some_and(|s| selects(self.selector.as_ref(), s.metadata.labels.as_ref()))
    }

    /// Keys of every held object of a kind (for relist reconciliation).
    pub fn keys(&self, kind: Kind) -> Vec<NsName> {
        match kind {
            Kind::Service => self.services.keys().cloned().collect(),
            Kind::EndpointSlice => self.slices.keys().cloned().collect(),
            Kind::Endpoints => self.endpoints.keys().cloned().collect(),
            Kind::Pod => self.pods.keys().cloned().collect(),
            Kind::ReplicaSet => self.replicasets.keys().cloned().collect(),
            Kind::Server => self.servers.keys().cloned().collect(),
        }
    }

    /// Every group the cache could publish: selected services and the Servers of their
    /// namespaces.
    pub fn groups(&self) -> Vec<Group> {
        let mut namespaces = BTreeSet::new();
        let mut out: Vec<Group> = Vec::new();
        for svc in self.services.keys().filter(|s| self.is_selected(s)) {
            namespaces.insert(svc.namespace.clone());
            out.push(Group::Service(svc.clone()));
        }
        out.extend(namespaces.into_iter().map(Group::Servers));
        out
    }

    /// Applies or deletes an object. `obj` is `None` for a deletion of `key`.
    pub fn change(&mut self, key: &ObjKey, obj: Option<Object>) -> Touched {
        let mut t = Touched::default();
        let id = &key.id;
        match (key.kind, obj) {
            (Kind::Service, o) => {
                let was = self.is_selected(id);
                match o {
                    Some(Object::Service(s)) => self.services.insert(id.clone(), s),
                    _ => self.services.remove(id),
                };
                let is = self.is_selected(id);
                t.relevant = was || is;
                if t.relevant {
                    t.groups.push(Group::Service(id.clone()));
                }
                if was != is {
                    t.groups.push(Group::Servers(id.namespace.clone()));
                }
            }
            (Kind::EndpointSlice, o) => {
                let old = self.slices.remove(id);
                let new = match o {
                    Some(Object::EndpointSlice(s)) => Some(s),
                    _ => None,
                };
                let old_svc = old.as_deref().and_then(slice_service);
                let new_svc = new.as_deref().and_then(slice_service);
                let count = |s: &EndpointSlice| s.endpoints.as_ref().map_or(0, Vec::len);
                // The common churn, a ready flag flipping, leaves the service and the pods a
                // slice points at as they were: then no reference needs counting again.
                let same_refs = new_svc.is_some()
                    && old_svc == new_svc
                    && match (&old, &new) {
                        (Some(o), Some(n)) => slice_pod_refs(o).eq(slice_pod_refs(n)),
                        _ => false,
                    };
                if same_refs {
                    if let (Some(o), Some(n), Some(svc)) = (&old, &new, &new_svc) {
                        let e = self.slice_endpoints.entry(svc.clone()).or_default();
                        *e = (*e + count(n)).saturating_sub(count(o));
                    }
                    if let Some(n) = &new {
                        self.slices.insert(id.clone(), n.clone());
                    }
                } else {
                    // Reference the new state before releasing the old one, so pods both point
                    // at stay held.
                    if let (Some(n), Some(svc)) = (&new, &new_svc) {
                        *self.slice_endpoints.entry(svc.clone()).or_default() += count(n);
                        self.reference(svc, slice_pods(n));
                        self.slices_by_service
                            .entry(svc.clone())
                            .or_default()
                            .insert(id.clone());
                        self.slices.insert(id.clone(), n.clone());
                    }
                    if let (Some(o), Some(svc)) = (&old, &old_svc) {
                        if let Some(n) = self.slice_endpoints.get_mut(svc) {
                            *n = n.saturating_sub(count(o));
                            if *n == 0 {
                                self.slice_endpoints.remove(svc);
                            }
                        }
                        self.unref(svc, slice_pods(o));
                        if new_svc.as_ref() != Some(svc)
                            && let Some(set) = self.slices_by_service.get_mut(svc)
                        {
                            set.remove(id);
                            if set.is_empty() {
                                self.slices_by_service.remove(svc);
                            }
                        }
                    }
                }
                for svc in [old_svc, new_svc].into_iter().flatten() {
                    if self.is_selected(&svc) {
                        t.relevant = true;
                        if !t.groups.contains(&Group::Service(svc.clone())) {
                            t.groups.push(Group::Service(svc));
                        }
                    }
                }
            }
            (Kind::Endpoints, o) => {
                let old = self.endpoints.remove(id);
                if let Some(Object::Endpoints(n)) = o {
                    self.reference(id, endpoints_pods(&n));
                    self.endpoints.insert(id.clone(), n);
                }
                if let Some(old) = old {
                    self.unref(id, endpoints_pods(&old));
                }
                if self.is_selected(id) {
                    t.relevant = true;
                    t.groups.push(Group::Service(id.clone()));
                }
            }
            (Kind::Pod, o) => {
                let wanted = self.pod_refs.contains_key(id);
                let old = self.pods.remove(id);
                if let Some(old) = &old {
                    for rs in pod_replicasets(old) {
                        if let Some(set) = self.rs_pods.get_mut(&rs) {
                            set.remove(id);
                        }
                    }
                }
                if let (true, Some(Object::Pod(p))) = (wanted, o) {
                    for rs in pod_replicasets(&p) {
                        self.rs_pods.entry(rs).or_default().insert(id.clone());
                    }
                    self.pods.insert(id.clone(), p);
                }
                if wanted || old.is_some() {
                    self.pod_groups(id, &mut t);
                }
            }
            (Kind::ReplicaSet, o) => {
                match o {
                    Some(Object::ReplicaSet(m)) => self.replicasets.insert(id.clone(), m),
                    _ => self.replicasets.remove(id),
                };
                let pods: Vec<NsName> = self
                    .rs_pods
                    .get(id)
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect();
                for pod in pods {
                    self.pod_groups(&pod, &mut t);
                }
            }
            (Kind::Server, o) => {
                match o {
                    Some(Object::Server(s)) => self.servers.insert(id.clone(), s),
                    _ => self.servers.remove(id),
                };
                let ns = id.namespace.clone();
                if self
                    .services
                    .keys()
                    .any(|s| s.namespace == ns && self.is_selected(s))
                {
                    t.relevant = true;
                    t.groups.push(Group::Servers(ns));
                }
            }
        }
        t
    }

    fn pod_groups(&self, pod: &NsName, t: &mut Touched) {
        for svc in self.pod_refs.get(pod).into_iter().flat_map(HashMap::keys) {
            if self.is_selected(svc) {
                t.relevant = true;
                let g = Group::Service(svc.clone());
                if !t.groups.contains(&g) {
                    t.groups.push(g);
                }
            }
        }
    }

    fn reference(&mut self, svc: &NsName, pods: impl Iterator<Item = NsName>) {
        for pod in pods {
            *self
                .pod_refs
                .entry(pod)
                .or_default()
                .entry(svc.clone())
                .or_default() += 1;
        }
    }

    fn unref(&mut self, svc: &NsName, pods: impl Iterator<Item = NsName>) {
        for pod in pods {
            let Some(by_svc) = self.pod_refs.get_mut(&pod) else {
                continue;
            };
            if let Some(n) = by_svc.get_mut(svc) {
                *n -= 1;
                if *n == 0 {
                    by_svc.remove(svc);
                }
            }
            if by_svc.is_empty() {
                self.pod_refs.remove(&pod);
                // Nothing points at it any more: forget it.
                if let Some(p) = self.pods.remove(&pod) {
                    for rs in pod_replicasets(&p) {
                        if let Some(set) = self.rs_pods.get_mut(&rs) {
                            set.remove(&pod);
                        }
                    }
                }
            }
        }
    }

    /// A service, if selected.
    pub fn service(&self, svc: &NsName) -> Option<&Arc<Service>> {
        self.is_selected(svc)
            .then(|| self.services.get(svc))
            .flatten()
    }

    /// A service's slices, in name order.
    pub fn slices_of(&self, svc: &NsName) -> Vec<Arc<EndpointSlice>> {
        self.slices_by_service
            .get(svc)
            .into_iter()
            .flatten()
            .filter_map(|k| self.slices.get(k).cloned())
            .collect()
    }

    /// A service's Endpoints.
    pub fn endpoints_of(&self, svc: &NsName) -> Option<&Arc<Endpoints>> {
        self.endpoints.get(svc)
    }

    /// True when a stored slice or Endpoints of a selected service points at the pod.
    pub fn wants_pod(&self, id: &NsName) -> bool {
        self.pod_refs
            .get(id)
            .is_some_and(|by_svc| by_svc.keys().any(|svc| self.is_selected(svc)))
    }

    /// A pod, if held.
    pub fn pod(&self, id: &NsName) -> Option<&Arc<Pod>> {
        self.pods.get(id)
    }

    /// A ReplicaSet's metadata, if held.
    pub fn replicaset(&self, id: &NsName) -> Option<&Arc<ObjectMeta>> {
        self.replicasets.get(id)
    }

    /// The Servers of a namespace, when it holds a selected service.
    pub fn servers_in(&self, ns: &str) -> Vec<Arc<Server>> {
        if !self
            .services
            .keys()
            .any(|s| &*s.namespace == ns && self.is_selected(s))
        {
            return Vec::new();
        }
        let mut v: Vec<_> = self
            .servers
            .iter()
            .filter(|(k, _)| &*k.namespace == ns)
            .map(|(_, s)| s.clone())
            .collect();
        v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        v
    }
}

/// True when `selector` selects an object with `labels`: the empty selector selects everything,
/// an invalid one (`None`) nothing.
fn selects(selector: Option<&Selector>, labels: Option<&BTreeMap<String, String>>) -> bool {
    static NONE: BTreeMap<String, String> = BTreeMap::new();
    selector.is_some_and(|s| s.matches(labels.unwrap_or(&NONE)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    fn compile(sel: &LabelSelector) -> Option<Selector> {
        Selector::try_from(sel.clone()).ok()
    }

    #[test]
    fn the_default_link_selector_takes_both_linkerd_export_modes() {
        let sel = compile(&floodgate_link_crd::SelectSpec::default().services);
        let sel = sel.as_ref();
        assert!(selects(
            sel,
            Some(&labels(&[("mirror.linkerd.io/exported", "true")]))
        ));
        assert!(selects(
            sel,
            Some(&labels(&[(
                "mirror.linkerd.io/exported",
                "remote-discovery"
            )]))
        ));
        assert!(!selects(
            sel,
            Some(&labels(&[("mirror.linkerd.io/exported", "false")]))
        ));
        assert!(!selects(sel, None));
    }

    #[test]
    fn every_operator() {
        let sel = compile(&LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![
                req("tier", "NotIn", &["db"]),
                req("team", "Exists", &[]),
                req("legacy", "DoesNotExist", &[]),
            ]),
        });
        let sel = sel.as_ref();
        assert!(selects(
            sel,
            Some(&labels(&[("app", "web"), ("team", "a")]))
        ));
        assert!(!selects(
            sel,
            Some(&labels(&[("app", "web"), ("team", "a"), ("tier", "db")]))
        ));
        assert!(
            !selects(sel, Some(&labels(&[("app", "web")]))),
            "team must exist"
        );
        assert!(!selects(
            sel,
            Some(&labels(&[("app", "web"), ("team", "a"), ("legacy", "")]))
        ));
        let all = compile(&LabelSelector::default());
        assert!(
            selects(all.as_ref(), None),
            "the empty selector selects everything"
        );
        let bad = compile(&LabelSelector {
            match_expressions: Some(vec![req("a", "Like", &["x"])]),
            match_labels: None,
        });
        assert!(bad.is_none(), "an unknown operator does not compile");
        assert!(
            !selects(bad.as_ref(), Some(&labels(&[("a", "x")]))),
            "and selects nothing"
        );
    }
}
