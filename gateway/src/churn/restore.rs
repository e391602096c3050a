//! A link after a restart: a saved quarantine brings back the last good view and the link stays
//! quarantined; saved containments bring back each contained service's published state and
//! the service stays contained. On release each converges to upstream as any released link or
//! service does.
//!
//! Converging needs to know what each group published, so that objects gone upstream are
//! deleted downstream: the groups are rebuilt from the restored objects by the same rules a
//! publication follows (a service, the slices labelled with its name, its Endpoints, the pods
//! those point at, the pods' ReplicaSets; the Servers of a namespace).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::Engine;
use super::flood::Trigger;
use super::publish::Published;
use crate::model::wanted::PodHash;
use crate::model::{Group, Kind, NsName, ObjKey, Object, TRUNCATED_ANNOTATION};
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

/// A contained service as saved on disk, in the engine's terms.
#[derive(Clone, Debug)]
pub struct SavedContained {
    /// The service.
    pub service: NsName,
    /// What contained it.
    pub trigger: Trigger,
    /// When (on this run's clock).
    pub since: Instant,
    /// The auto-release cool-down in force, if any.
    pub cooldown: Option<Duration>,
    /// What it published: the service and its slices, Endpoints, pods and ReplicaSets.
    pub objects: Vec<Object>,
}

impl Engine {
    /// Restores a saved quarantine into a new engine: its view, its groups, and the frozen
    /// state. Upstream must not be started until the link is released.
    pub fn restore_quarantined(&mut self, now: Instant, saved: Saved) {
        self.install(saved.objects, now);
        self.sync.once = true;
        self.machine.restore(
            now,
            saved.since,
            saved.trigger,
            saved.before_first_sync,
            saved.cooldown,
        );
    }

    /// Restores saved containments into a new engine: each service's published state (unless
    /// a restored quarantine brought it already) and its containment. Its later changes wait
    /// until it is released, as before the restart.
    pub fn restore_contained(&mut self, now: Instant, saved: Vec<SavedContained>) {
        for c in saved {
            let g = Group::Service(c.service.clone());
            if !self.publisher.has_published(&g) {
                self.install(c.objects, now);
            }
            // Contained, it serves what it published: no new pod of its is held ahead.
            self.publisher.set_owners(&g, Vec::new(), &mut self.store);
            self.containment
                .restore(&c.service, now, c.since, c.trigger, c.cooldown);
        }
        // What was saved is judged again once the remote has listed, with the rest.
        self.owed.assess = true;
    }

    /// Takes over the view as it is (one that followed the Lease holder's, version for version)
    /// and publishes into it again: what each group published is read from the view, and once
    /// the remote has listed, every group is published whole and at once, so consumers see
    /// only what changed on the remote meanwhile (unchanged objects are no change), and what
    /// is gone upstream is deleted.
    pub fn adopt_view(&mut self) {
        self.role = self.role.adopted();
        let objects: BTreeMap<ObjKey, Object> = (crate::model::Kind::ALL.iter())
            .flat_map(|k| self.view().list(*k).items)
            .map(|s| (s.object.key(), s.object.clone()))
            .collect();
        self.publisher.reset();
        for (group, published) in groups_of(&objects) {
            self.publisher.install(group, published);
        }
        self.publisher.drop_unwanted_pods(&mut self.store);
        self.publisher.refresh_wanted();
        self.sync.clear();
        self.sync.once = false;
        self.owed.assess = true;
    }

    /// Puts saved objects in the view (published at `now`) and rebuilds the groups that
    /// published them.
    fn install(&mut self, objects: Vec<Object>, now: Instant) {
        let by_key: BTreeMap<ObjKey, Object> = objects
            .into_iter()
            .map(|o| (o.key(), o.into_sanitized()))
            .collect();
        self.view()
            .apply(by_key.values().cloned().map(ViewChange::Upsert), now);
        for (group, published) in groups_of(&by_key) {
            self.publisher.install(group, published);
        }
    }
}

/// The groups a set of published objects belongs to, with what each published.
fn groups_of(objects: &BTreeMap<ObjKey, Object>) -> BTreeMap<Group, Published> {
    let key = |kind, id: NsName| ObjKey { kind, id };
    let mut out: BTreeMap<Group, Published> = BTreeMap::new();
    let mut slices_by_service: BTreeMap<NsName, Vec<&Object>> = BTreeMap::new();
    for obj in objects.values() {
        match obj {
            Object::EndpointSlice(s) => {
                if let Some(svc) = s.service() {
                    slices_by_service.entry(svc).or_default().push(obj);
                }
            }
            Object::Server(s) => {
                let ns: std::sync::Arc<str> =
                    s.metadata.namespace.as_deref().unwrap_or_default().into();
                out.entry(Group::Servers(ns))
                    .or_default()
                    .objects
                    .insert(obj.key());
            }
            Object::ConfigMap(_) => {
                (out.entry(Group::LinkerdConfig).or_default().objects).insert(obj.key());
            }
            // A service's own, gathered with it below.
            Object::Service(_) | Object::Endpoints(_) | Object::Pod(_) | Object::ReplicaSet(_) => {}
        }
    }
    for (k, obj) in objects {
        let Object::Service(service) = obj else {
            continue;
        };
        let svc = k.id.clone();
        let mut p = Published {
            objects: BTreeSet::from([obj.key()]),
            truncated: service
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TRUNCATED_ANNOTATION))
                .and_then(|n| n.parse().ok())
                .unwrap_or_default(),
            ..Published::default()
        };
        let mut pods = BTreeSet::new();
        for slice in slices_by_service.get(&svc).into_iter().flatten() {
            p.objects.insert(slice.key());
            if let Object::EndpointSlice(s) = slice {
                pods.extend(s.pod_refs_ready().into_iter().map(|(pod, _)| pod));
                p.slices.push(s.clone());
            }
        }
        if let Some(ep @ Object::Endpoints(e)) = objects.get(&key(Kind::Endpoints, svc.clone())) {
            p.objects.insert(ep.key());
            pods.extend(e.pod_refs());
            p.endpoints_object = Some(e.clone());
        }
        p.endpoints = super::cap::keys(&p.slices, p.endpoints_object.as_ref()).len();
        p.pods = pods.iter().map(PodHash::of_id).collect();
        // Under its cap, the ReplicaSets of its pods are followed again at once, as
        // `Publisher::commit` follows them: their next scale-up's pods are held ahead.
        let mut owners = BTreeSet::new();
        for pod in pods {
            let pk = key(Kind::Pod, pod);
            if let Some(Object::Pod(pod)) = objects.get(&pk) {
                if p.truncated == 0 {
                    owners.extend(pod.replicasets());
                }
                for rs in pod.replicasets() {
                    let rk = key(Kind::ReplicaSet, rs);
                    if objects.contains_key(&rk) {
                        p.objects.insert(rk);
                    }
                }
                p.objects.insert(pk);
            }
        }
        p.owners = owners.into_iter().collect();
        out.insert(Group::Service(svc), p);
    }
    out
}
