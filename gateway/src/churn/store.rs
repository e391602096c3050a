//! The upstream cache of one link: the latest state of every object the link may publish, with
//! the indexes that tie objects to publication groups.
//!
//! What it keeps: every Service, EndpointSlice, Endpoints, ReplicaSet (metadata), Server and
//! ConfigMap (the remote's `linkerd-config` alone is ever given) it is given, and only the pods the engine wants: those behind endpoints the cap publishes (the
//! engine checks before it hands a pod over, see [`super::publish`]). A pod nobody wants costs
//! its decoding and a hash lookup, nothing more: that keeps a flood of pods, behind an
//! unselected service or behind a selected one's withheld endpoints, out of memory. Slices are
//! held deflated ([`HeldSlice`]): those of a service with more endpoints than the cap against
//! their service's dictionary from the change that takes it over (the cap reads their keys as
//! they are and thaws only those it keeps an endpoint of); the others against the
//! [`shared_dictionary`] once their service publishes ([`Store::freeze`]), so that the view
//! and the store share one deflated copy, and a slice that changes many times between two
//! publications (a flood, coalesced) is deflated once, not at every change.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::core::{Selector, SelectorExt};
use smallvec::SmallVec;

use crate::model::wanted::PodHash;
use crate::model::{
    Dictionary, EndpointsObject, Group, HeldSlice, Kind, NsName, ObjKey, Object, PodObject, Server,
};

mod config;
mod slices;

/// What a change touched.
#[derive(Debug, Default)]
pub struct Touched {
    /// Groups to publish again.
    pub groups: Vec<Group>,
    /// Pods whose groups are to publish again (a pod or its ReplicaSet changed): the engine
    /// knows which groups want them.
    pub pods: Vec<NsName>,
    /// False when the change concerns no selected service (a flood of unrelated pods).
    pub relevant: bool,
    /// How many endpoints a slice change changed (added, removed, or with new addresses or
    /// conditions); 0 for other kinds. A service's churn is measured in these.
    pub endpoints_changed: usize,
}

/// The cache.
#[derive(Debug)]
pub struct Store {
    /// The Link's service selector; `None` when it does not parse (validation refuses such a
    /// spec, so this is a last defence): then nothing is selected rather than everything.
    selector: Option<Selector>,
    /// The cap (`caps.maxEndpointsPerService`): the slices of a service with more endpoints
    /// upstream are held deflated (`model::DeflatedSlice`), for the cap to choose from.
    max_endpoints: usize,
    services: HashMap<NsName, Arc<Service>>,
    slices: HashMap<NsName, HeldSlice>,
    slices_by_service: HashMap<NsName, BTreeSet<NsName>>,
    endpoints: HashMap<NsName, Arc<EndpointsObject>>,
    pods: HashMap<NsName, Arc<PodObject>>,
    /// The held pods by [`PodHash`], which is all the engine keeps of a pod it wants: a pod
    /// no service wants any more is dropped by it ([`Store::drop_pods`]).
    pod_hashes: HashMap<PodHash, SmallVec<[NsName; 1]>>,
    replicasets: HashMap<NsName, Arc<ObjectMeta>>,
    rs_pods: HashMap<NsName, HashSet<NsName>>,
    servers: HashMap<NsName, Arc<Server>>,
    /// The remote's `linkerd-config` (its watcher selects that one ConfigMap).
    config_maps: HashMap<NsName, Arc<ConfigMap>>,
    /// Upstream endpoints per service, across its slices (for flood detection).
    slice_endpoints: HashMap<NsName, usize>,
    /// Slices held deflated against their service's dictionary: those of services over the
    /// cap (the others are deflated against the [`shared_dictionary`]).
    deflated: usize,
    /// What the slices of each service over the cap are deflated against: the JSON of the
    /// slice that took it over, or of its first slice then.
    dictionaries: HashMap<NsName, Dictionary>,
}

impl Store {
    /// An empty cache selecting services with `selector`, for a cap of `max_endpoints` a
    /// service.
    pub fn new(selector: &LabelSelector, max_endpoints: usize) -> Self {
        Self {
            selector: Selector::try_from(selector.clone()).ok(),
            max_endpoints,
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_by_service: HashMap::new(),
            endpoints: HashMap::new(),
            pods: HashMap::new(),
            pod_hashes: HashMap::new(),
            replicasets: HashMap::new(),
            rs_pods: HashMap::new(),
            servers: HashMap::new(),
            config_maps: HashMap::new(),
            slice_endpoints: HashMap::new(),
            deflated: 0,
            dictionaries: HashMap::new(),
        }
    }

    /// EndpointSlices held for the cap to choose from: those of services over the cap, each
    /// deflated against its service's dictionary.
    pub fn slices_deflated(&self) -> usize {
        self.deflated
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
            + self.config_maps.len()
    }

    /// Objects held, by kind.
    pub fn counts(&self) -> [(Kind, usize); Kind::ALL.len()] {
        [
            (Kind::Service, self.services.len()),
            (Kind::EndpointSlice, self.slices.len()),
            (Kind::Endpoints, self.endpoints.len()),
            (Kind::Pod, self.pods.len()),
            (Kind::ReplicaSet, self.replicasets.len()),
            (Kind::Server, self.servers.len()),
            (Kind::ConfigMap, self.config_maps.len()),
        ]
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops everything (quarantine: memory falls).
    pub fn clear(&mut self) {
        *self = Self {
            selector: std::mem::take(&mut self.selector),
            ..Self::new(&LabelSelector::default(), self.max_endpoints)
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
            Kind::ConfigMap => self.config_maps.keys().cloned().collect(),
        }
    }

    /// Every group the cache could publish: selected services, the Servers of their
    /// namespaces, and the remote's Linkerd configuration when it has one.
    pub fn groups(&self) -> Vec<Group> {
        let mut namespaces = BTreeSet::new();
        let mut out: Vec<Group> = Vec::new();
        for svc in self.services.keys().filter(|s| self.is_selected(s)) {
            namespaces.insert(svc.namespace.clone());
            out.push(Group::Service(svc.clone()));
        }
        out.extend(namespaces.into_iter().map(Group::Servers));
        if !self.config_maps.is_empty() {
            out.push(Group::LinkerdConfig);
        }
        out
    }

    /// Applies or deletes an object. `obj` is `None` for a deletion of `key`.
    pub fn change(&mut self, key: &ObjKey, obj: Option<Object>) -> Touched {
        let id = &key.id;
        match key.kind {
            Kind::Service => self.change_service(id, obj),
            Kind::EndpointSlice => self.change_slice(id, obj),
            Kind::Endpoints => self.change_endpoints(id, obj),
            Kind::Pod => self.change_pod(id, obj),
            Kind::ReplicaSet => self.change_replica_set(id, obj),
            Kind::Server => self.change_server(id, obj),
            Kind::ConfigMap => self.change_config_map(id, obj),
        }
    }

    /// A service applied or deleted: its group if it is or was selected, and the Servers of
    /// its namespace when it entered or left the selection.
    fn change_service(&mut self, id: &NsName, obj: Option<Object>) -> Touched {
        let mut t = Touched::default();
        let was = self.is_selected(id);
        match obj {
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
        t
    }

    /// An Endpoints applied or deleted: its service's group, if selected.
    fn change_endpoints(&mut self, id: &NsName, obj: Option<Object>) -> Touched {
        let mut t = Touched::default();
        match obj {
            Some(Object::Endpoints(n)) => self.endpoints.insert(id.clone(), n),
            _ => self.endpoints.remove(id),
        };
        if self.is_selected(id) {
            t.relevant = true;
            t.groups.push(Group::Service(id.clone()));
        }
        t
    }

    /// A wanted pod applied, or a pod deleted: the pod, when it was or is held (only wanted
    /// pods are handed over, so this one is held).
    fn change_pod(&mut self, id: &NsName, obj: Option<Object>) -> Touched {
        let mut t = Touched::default();
        let old = self.drop_pod(id);
        if let Some(Object::Pod(p)) = obj {
            for rs in p.replicasets() {
                self.rs_pods.entry(rs).or_default().insert(id.clone());
            }
            self.pods.insert(id.clone(), p);
            (self.pod_hashes.entry(PodHash::of_id(id)).or_default()).push(id.clone());
            t.pods.push(id.clone());
        } else if old.is_some() {
            t.pods.push(id.clone());
        }
        t
    }

    /// A ReplicaSet applied or deleted: the pods it owns that are held.
    fn change_replica_set(&mut self, id: &NsName, obj: Option<Object>) -> Touched {
        let mut t = Touched::default();
        match obj {
            Some(Object::ReplicaSet(m)) => self.replicasets.insert(id.clone(), m),
            _ => self.replicasets.remove(id),
        };
        t.pods
            .extend(self.rs_pods.get(id).into_iter().flatten().cloned());
        t
    }

    /// A Server applied or deleted: the Servers group of its namespace, when a selected
    /// service lives there.
    fn change_server(&mut self, id: &NsName, obj: Option<Object>) -> Touched {
        let mut t = Touched::default();
        match obj {
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
        t
    }

    /// Stops holding a pod (nobody wants it any more, or it was deleted).
    pub fn drop_pod(&mut self, id: &NsName) -> Option<Arc<PodObject>> {
        let old = self.pods.remove(id)?;
        let hash = PodHash::of_id(id);
        if let Some(ids) = self.pod_hashes.get_mut(&hash) {
            ids.retain(|held| held != id);
            if ids.is_empty() {
                self.pod_hashes.remove(&hash);
            }
        }
        for rs in old.replicasets() {
            if let Some(set) = self.rs_pods.get_mut(&rs) {
                set.remove(id);
                if set.is_empty() {
                    self.rs_pods.remove(&rs);
                }
            }
        }
        Some(old)
    }

    /// Stops holding the pods of hash `pod` (no service wants it any more: with two pods of
    /// one hash, both).
    pub fn drop_pods(&mut self, pod: PodHash) {
        for id in self.pod_hashes.remove(&pod).unwrap_or_default() {
            self.drop_pod(&id);
        }
    }

    /// A service, if selected.
    pub fn service(&self, svc: &NsName) -> Option<&Arc<Service>> {
        self.is_selected(svc)
            .then(|| self.services.get(svc))
            .flatten()
    }

    /// A service's slices, in name order.
    pub fn slices_of(&self, svc: &NsName) -> Vec<&HeldSlice> {
        self.slices_by_service
            .get(svc)
            .into_iter()
            .flatten()
            .filter_map(|k| self.slices.get(k))
            .collect()
    }

    /// A service's Endpoints.
    pub fn endpoints_of(&self, svc: &NsName) -> Option<&Arc<EndpointsObject>> {
        self.endpoints.get(svc)
    }

    /// A pod, if held.
    pub fn pod(&self, id: &NsName) -> Option<&Arc<PodObject>> {
        self.pods.get(id)
    }

    /// The pods held that ReplicaSet `rs` controls.
    pub fn pods_of_replicaset(&self, rs: &NsName) -> impl Iterator<Item = &NsName> {
        self.rs_pods.get(rs).into_iter().flatten()
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
    use super::slices::{endpoints_changed, for_cap};
    use super::*;
    use crate::model::{Form, shared_dictionary};
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

    #[test]
    fn a_slice_change_counts_the_endpoints_it_changes() {
        use crate::churn::tests::mk_slice;
        let slice = |eps: &[(u32, bool)]| match mk_slice("web", "web-a", eps) {
            Object::EndpointSlice(s) => s,
            _ => unreachable!("mk_slice makes slices"),
        };
        let a = slice(&[(1, true), (2, true), (3, true)]);
        assert_eq!(endpoints_changed(None, Some(&a)), 3, "all added");
        let mut deflated = a.clone();
        deflated.reform(Form::Deflated(None));
        // Held either way, the old state counts alike.
        for old in [a, deflated] {
            let same = slice(&[(1, true), (2, true), (3, true)]);
            assert_eq!(endpoints_changed(Some(&old), Some(&same)), 0);
            let flipped = slice(&[(1, false), (2, true), (3, false)]);
            assert_eq!(
                endpoints_changed(Some(&old), Some(&flipped)),
                2,
                "two flips"
            );
            let moved = slice(&[(1, true), (2, true), (4, true)]);
            assert_eq!(
                endpoints_changed(Some(&old), Some(&moved)),
                2,
                "one gone, one new"
            );
            assert_eq!(endpoints_changed(Some(&old), None), 3, "all removed");
        }
    }

    /// A service's slices are held deflated against its own dictionary while it has more
    /// endpoints upstream than the cap, all of them from the change that takes it over, and
    /// against the shared one again from the one that brings it back. Within the cap, a new
    /// slice is deflated against the shared one, and a changed one held as given until its
    /// service publishes ([`Store::freeze`]).
    #[test]
    fn a_service_over_the_cap_has_its_slices_held_deflated() {
        use crate::churn::tests::mk_slice;
        let mut store = Store::new(&LabelSelector::default(), 4);
        let key = |name: &str| ObjKey {
            kind: Kind::EndpointSlice,
            id: NsName::new("ns", name),
        };
        // Each slice's name, and whether it is held whole or deflated against the shared
        // dictionary (not against its service's).
        let forms = |store: &Store| -> Vec<(String, bool)> {
            let svc = NsName::new("ns", "web");
            let mut v: Vec<(String, bool)> = (store.slices_by_service.get(&svc).into_iter())
                .flatten()
                .map(|id| (id.name.to_string(), !for_cap(&store.slices[id])))
                .collect();
            v.sort();
            v
        };
        store.change(
            &key("web-a"),
            Some(mk_slice("web", "web-a", &[(1, true), (2, true)])),
        );
        store.change(
            &key("web-b"),
            Some(mk_slice("web", "web-b", &[(3, true), (4, true)])),
        );
        assert_eq!(
            forms(&store),
            [("web-a".into(), true), ("web-b".into(), true)],
            "at the cap, not against the service's dictionary"
        );
        assert_eq!(store.slices_deflated(), 0);
        let shared = |store: &Store| {
            (store.slices.values()).all(|s| {
                s.dictionary()
                    .is_some_and(|d| Arc::ptr_eq(d, shared_dictionary()))
            })
        };
        assert!(
            shared(&store),
            "new, deflated against the shared dictionary"
        );
        store.change(
            &key("web-a"),
            Some(mk_slice("web", "web-a", &[(1, true), (2, false)])),
        );
        assert!(
            matches!(
                store.slices[&NsName::new("ns", "web-a")],
                HeldSlice::Whole(_)
            ),
            "changed, held as given until its service publishes"
        );
        store.freeze(&NsName::new("ns", "web"));
        assert!(
            shared(&store),
            "frozen to publish: deflated against the shared dictionary"
        );
        store.change(&key("web-c"), Some(mk_slice("web", "web-c", &[(5, false)])));
        assert_eq!(
            forms(&store),
            [
                ("web-a".into(), false),
                ("web-b".into(), false),
                ("web-c".into(), false)
            ],
            "over it, every slice deflated against the service's"
        );
        assert_eq!(store.slices_deflated(), 3);
        // Against one dictionary: the JSON of web-c, the slice that took the service over.
        let dictionaries: Vec<&Dictionary> = (store.slices.values())
            .map(|s| {
                s.dictionary()
                    .expect("deflated against the service's dictionary")
            })
            .collect();
        assert!(dictionaries.iter().all(|d| Arc::ptr_eq(d, dictionaries[0])));
        let c = mk_slice("web", "web-c", &[(5, false)]);
        let Object::EndpointSlice(c) = c else {
            unreachable!("mk_slice makes slices")
        };
        assert_eq!(&dictionaries[0][..], c.json().as_bytes());
        let listed = |store: &Store| -> usize {
            let svc = NsName::new("ns", "web");
            store.slices_of(&svc).iter().map(|s| s.len()).sum()
        };
        assert_eq!(listed(&store), 5);
        store.change(
            &key("web-c"),
            Some(mk_slice("web", "web-c", &[(5, false), (6, true)])),
        );
        assert!(matches!(
            store.slices[&NsName::new("ns", "web-c")],
            HeldSlice::Deflated(_)
        ));
        assert_eq!(
            listed(&store),
            6,
            "a deflated slice changed is held as it is now"
        );
        assert_eq!(store.slices_deflated(), 3);
        store.change(&key("web-a"), None);
        assert_eq!(
            forms(&store),
            [("web-b".into(), true), ("web-c".into(), true)],
            "back at the cap, against the shared one again"
        );
        assert_eq!(store.slices_deflated(), 0);
        assert!(store.dictionaries.is_empty(), "no dictionary held for it");
        let c = store.slices[&NsName::new("ns", "web-c")].whole();
        assert_eq!(
            c.endpoints()
                .map(|e| (e.key(), e.is_ready()))
                .collect::<Vec<_>>(),
            [("10.0.0.5", false), ("10.0.0.6", true)],
            "thawed as it was deflated"
        );
    }

    #[test]
    fn a_pod_nobody_wants_is_dropped_by_its_hash_and_leaves_no_index() {
        let mut store = Store::new(&LabelSelector::default(), 100);
        for name in ["a", "b"] {
            let pod = crate::churn::tests::mk_pod(name, "Running");
            store.change(&pod.key(), Some(pod));
        }
        let a = NsName::new("ns", "a");
        store.drop_pods(PodHash::of_id(&a));
        assert!(store.pod(&a).is_none(), "dropped by its hash");
        assert!(
            store.pod(&NsName::new("ns", "b")).is_some(),
            "the other stays"
        );
        store.drop_pods(PodHash::of_id(&a));
        let b = NsName::new("ns", "b");
        store.change(
            &ObjKey {
                kind: Kind::Pod,
                id: b.clone(),
            },
            None,
        );
        assert!(store.pod(&b).is_none(), "deleted upstream");
        assert!(
            store.pod_hashes.is_empty(),
            "no hash is left of pods not held"
        );
    }
}
