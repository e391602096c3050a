//! A quarantined link after a restart: the last good view comes back from disk, the link stays
//! quarantined, and on release it converges to upstream as any released link does.
//!
//! Converging needs to know what each group published, so that objects gone upstream are
//! deleted downstream: the groups are rebuilt from the restored objects by the same rules a
//! publication follows (a service, the slices labelled with its name, its Endpoints, the pods
//! those point at, the pods' ReplicaSets; the Servers of a namespace).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use super::cap::slice_endpoint_key;
use super::flood::Trigger;
use super::{Engine, GroupState};
use crate::model::{
    Group, Kind, NsName, ObjKey, Object, TRUNCATED_ANNOTATION, endpoints_pods, pod_replicasets,
    slice_pods, slice_service,
};
use crate::view::Change as ViewChange;

/// A quarantine as saved on disk, in the engine's terms.
#[derive(Clone, Debug)]
pub struct Saved {
    /// What tripped it.
    pub trigger: Trigger,
    /// When it began (on this run's clock).
    pub since: Instant,
    /// True when it began before the link's first complete sync.
    pub before_first_sync: bool,
    /// The auto-release cool-down in force, if any.
    pub cooldown: Option<Duration>,
    /// The view consumers had.
    pub objects: Vec<Object>,
}

impl Engine {
    /// Restores a saved quarantine into a new engine: its view, its groups, and the frozen
    /// state. Upstream must not be started until the link is released.
    pub fn restore_quarantined(&mut self, now: Instant, saved: Saved) {
        let by_key: BTreeMap<ObjKey, Object> = saved
            .objects
            .into_iter()
            .map(|o| (o.key(), o.into_sanitized()))
            .collect();
        self.view
            .apply(by_key.values().cloned().map(ViewChange::Upsert));
        for (group, members) in groups_of(&by_key) {
            let mut st = GroupState::new(&self.budget);
            st.objects = members;
            for key in &st.objects {
                *self.obj_refs.entry(key.clone()).or_default() += 1;
                match by_key.get(key) {
                    Some(Object::EndpointSlice(s)) => st
                        .endpoints
                        .extend(s.endpoints.iter().flatten().map(slice_endpoint_key)),
                    Some(Object::Service(s)) => {
                        st.truncated = s
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(TRUNCATED_ANNOTATION))
                            .and_then(|n| n.parse().ok())
                            .unwrap_or_default();
                    }
                    _ => {}
                }
            }
            let c = &mut self.counters;
            if matches!(group, Group::Service(_)) {
                c.services += 1;
            }
            c.endpoints_published += st.endpoints.len() as u64;
            c.endpoints_truncated += st.truncated as u64;
            self.groups.insert(group, st);
        }
        self.synced_once = true;
        self.machine.restore(
            now,
            saved.since,
            saved.trigger,
            saved.before_first_sync,
            saved.cooldown,
        );
    }
}

/// The groups a set of published objects belongs to, with their members.
fn groups_of(objects: &BTreeMap<ObjKey, Object>) -> BTreeMap<Group, BTreeSet<ObjKey>> {
    let key = |kind, id: NsName| ObjKey { kind, id };
    let mut out: BTreeMap<Group, BTreeSet<ObjKey>> = BTreeMap::new();
    let mut slices_by_service: BTreeMap<NsName, Vec<&Object>> = BTreeMap::new();
    for obj in objects.values() {
        match obj {
            Object::EndpointSlice(s) => {
                if let Some(svc) = slice_service(s) {
                    slices_by_service.entry(svc).or_default().push(obj);
                }
            }
            Object::Server(s) => {
                let ns: std::sync::Arc<str> =
                    s.metadata.namespace.as_deref().unwrap_or_default().into();
                out.entry(Group::Servers(ns)).or_default().insert(obj.key());
            }
            _ => {}
        }
    }
    for (k, obj) in objects {
        if k.kind != Kind::Service {
            continue;
        }
        let svc = k.id.clone();
        let mut members = BTreeSet::from([obj.key()]);
        let mut pods: HashSet<NsName> = HashSet::new();
        for slice in slices_by_service.get(&svc).into_iter().flatten() {
            members.insert(slice.key());
            if let Object::EndpointSlice(s) = slice {
                pods.extend(slice_pods(s));
            }
        }
        if let Some(ep @ Object::Endpoints(e)) = objects.get(&key(Kind::Endpoints, svc.clone())) {
            members.insert(ep.key());
            pods.extend(endpoints_pods(e));
        }
        for pod in pods {
            let pk = key(Kind::Pod, pod);
            if let Some(Object::Pod(p)) = objects.get(&pk) {
                for rs in pod_replicasets(p) {
                    let rk = key(Kind::ReplicaSet, rs);
                    if objects.contains_key(&rk) {
                        members.insert(rk);
                    }
                }
                members.insert(pk);
            }
        }
        out.insert(Group::Service(svc), members);
    }
    out
}
