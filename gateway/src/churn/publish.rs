//! Publishing one group: its desired downstream state, computed from the latest upstream state
//! when its turn comes, diffed against what the group published before and applied to the
//! view in one step.
//!
//! For a service the desired state is the Service, its capped EndpointSlices and Endpoints,
//! the pods consumers resolve behind the kept endpoints (ready ones, see `desired.rs`)
//! and those pods' ReplicaSets. The pods a group's
//! selection points at are its *wanted* pods: the store holds a pod only while some group
//! wants it, so memory follows what is published, not the remote. A wanted pod the store does
//! not hold (its event came before the selection wanted it) is asked for with
//! [`super::Effect::FetchPods`] and published when the fetch answers, through the same budget as
//! any change; a publication whose new ready endpoints name pods being fetched waits for them
//! (at most [`AWAIT`]), so no consumer is served an endpoint before its pod.
//!
//! A publication reaches the view in stages (`stages.rs`): pods before the endpoints that name
//! them, endpoints before a Service that enters, and the reverse on the way out, each stage
//! [`stages::LEAD`] after the one before it. A group is not published again while stages of
//! its last publication wait ([`Publisher::busy_until`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::store::Store;
use super::{Answer, Fetch};
use crate::model::wanted::{PodSet, WantedPods};
use crate::model::{EndpointsObject, Group, HeldSlice, Kind, NsName, ObjKey, Object};
use crate::view::{Change as ViewChange, View};

mod desired;
mod held;
mod pending;
pub mod stages;
mod wanted;

use desired::{Desired, desired_service, referred, resolved};
use stages::Tail;
use wanted::Wanted;

/// How long a publication waits for what its consumers will look up when they handle it: the
/// pods its new ready endpoints name while they are fetched or listed, a new Service's
/// Endpoints while the remote's Endpoints controller writes them. A remote that answers takes
/// milliseconds; one that has not in 2 s is failing, and the publication goes out without
/// them, which follow when they come (as they would have without the wait).
pub const AWAIT: Duration = Duration::from_secs(2);

/// What publishing has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishCounters {
    /// Publications made.
    pub downstream_updates: u64,
    /// Selected services published.
    pub services: u64,
    /// Services withheld by `caps.maxServices`.
    pub services_withheld: u64,
    /// Endpoints published, across services.
    pub endpoints_published: u64,
    /// Endpoints withheld by `caps.maxEndpointsPerService`.
    pub endpoints_truncated: u64,
    /// Pods asked for with [`super::Effect::FetchPods`].
    pub pods_fetched: u64,
}

/// What one group has published, and the pods its selection wants.
#[derive(Debug, Default)]
pub struct Published {
    /// The objects it published.
    pub objects: BTreeSet<ObjKey>,
    /// The slices it published (shared with the view): the cap sticks to their endpoints
    /// ([`cap::keys`]).
    pub slices: Vec<HeldSlice>,
    /// The core/v1 Endpoints it published, if any (the same).
    pub endpoints_object: Option<Arc<EndpointsObject>>,
    /// Endpoints published, across both.
    pub endpoints: usize,
    /// Endpoints the cap withheld.
    pub truncated: usize,
    /// The pods its kept endpoints point at (their names are read again from those
    /// endpoints where needed).
    pub pods: PodSet,
    /// The ReplicaSets of those pods, while it is a service under its cap: their new pods
    /// are held as they come, before an endpoint names them ([`Publisher::owner_wanted`]).
    pub owners: Vec<NsName>,
}

impl Published {
    /// Whether it serves `pod`.
    fn serves_pod(&self, pod: &NsName) -> bool {
        !self.objects.is_empty()
            && self.objects.contains(&ObjKey {
                kind: Kind::Pod,
                id: pod.clone(),
            })
    }
}

/// The published side of one link.
#[derive(Debug)]
pub struct Publisher {
    view: View,
    max_endpoints: usize,
    max_services: u64,
    groups: HashMap<Group, Published>,
    /// Published objects shared by several groups (a pod behind two services), by count.
    obj_refs: HashMap<ObjKey, u32>,
    /// The pods the services' selections point at, and how each is being brought in.
    wanted: Wanted,
    counters: PublishCounters,
    /// `wanted`'s keys, shared with the upstream pod watcher so it skips decoding the rest.
    mirror: Option<WantedPods>,
    /// The stages of a group's publication still to apply ([`stages`]).
    tails: HashMap<Group, Tail>,
    /// Groups whose publication waits for what its consumers look up, since when, and whether
    /// the wait is over (the group is in line to publish what it has).
    awaiting: HashMap<Group, (Instant, bool)>,
    /// Whether the link follows the remote's Endpoints: a new Service waits for its own.
    endpoints_followed: bool,
    /// The groups' [`Published::owners`], by how many groups want each.
    owners: HashMap<NsName, u32>,
}

impl Publisher {
    /// Publishes into `view`, capping services at `max_endpoints` and the link at
    /// `max_services` services.
    pub fn new(view: View, max_endpoints: usize, max_services: u64) -> Self {
        Self {
            view,
            max_endpoints,
            max_services,
            groups: HashMap::new(),
            obj_refs: HashMap::new(),
            wanted: Wanted::default(),
            counters: PublishCounters::default(),
            mirror: None,
            tails: HashMap::new(),
            awaiting: HashMap::new(),
            endpoints_followed: false,
            owners: HashMap::new(),
        }
    }

    /// Whether the link follows the remote's Endpoints (a new Service then waits for its own
    /// before it is published: [`Self::publish`]).
    pub fn follow_endpoints(&mut self, followed: bool) {
        self.endpoints_followed = followed;
    }

    /// Shares the wanted pods with the upstream pod watcher from now on.
    pub fn mirror_wanted(&mut self, mirror: WantedPods) {
        mirror.replace(self.wanted.hashes());
        self.mirror = Some(mirror);
    }

    /// The view.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// What publishing has done so far.
    pub fn counters(&self) -> PublishCounters {
        self.counters
    }

    /// What a group published, if anything.
    pub fn published(&self, g: &Group) -> Option<&Published> {
        self.groups.get(g)
    }

    /// True when the group has published something.
    pub fn has_published(&self, g: &Group) -> bool {
        self.groups.get(g).is_some_and(|p| !p.objects.is_empty())
    }

    /// Groups that published something.
    pub fn published_groups(&self) -> impl Iterator<Item = &Group> {
        self.groups
            .iter()
            .filter(|(_, p)| !p.objects.is_empty())
            .map(|(g, _)| g)
    }

    /// Groups with state held (published, or wanting pods).
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// True when some group's selection points at the pod.
    pub fn wants(&self, pod: &NsName) -> bool {
        self.wanted.contains(pod)
    }

    /// The services whose selection points at the pod.
    pub fn wanting(&self, pod: &NsName) -> &[NsName] {
        self.wanted.by(pod)
    }

    /// Pods wanted by some group.
    pub fn wanted_pods(&self) -> usize {
        self.wanted.len()
    }

    /// A watch event for the pod came: a fetch asked before is answered by it, and the pod
    /// watcher brings the pod from now on.
    pub fn seen(&mut self, pod: &NsName) {
        self.wanted.seen(pod);
    }

    /// A fetch answered: the pod found, when it is still wanted, the answer is to its last
    /// ask, and no watch event came first.
    pub fn fetched(&mut self, pod: &NsName, ticket: u32, answer: Answer) -> Option<Object> {
        self.wanted.answered(pod, ticket, answer)
    }

    /// The pod watcher's first list begins with every pod wanted now in its set: none of them
    /// is fetched, the list brings it or its absence.
    pub fn pods_listing(&mut self) {
        self.wanted.listing();
    }

    /// A pod list is complete.
    pub fn pods_listed(&mut self) {
        self.wanted.listed();
    }

    /// A new run of watchers starts, or upstream stopped (quarantine: its cache is dropped;
    /// what is published, and the pods it wants, stay): the fetches in flight are forgotten,
    /// and what the old run knew of the wanted pods with them.
    pub fn new_upstream(&mut self) {
        self.wanted.new_upstream();
    }

    /// Computes a service's selection without publishing it, so the pods it points at are
    /// kept when they are listed (the first sync: slices are listed before pods).
    pub fn preselect(&mut self, g: &Group, store: &mut Store) {
        if let Group::Service(svc) = g
            && let Some(service) = store.service(svc)
        {
            let empty = Published::default();
            let previous = self.groups.get(g).unwrap_or(&empty);
            let desired = desired_service(store, service, svc, previous, self.max_endpoints);
            self.set_pods(g, desired.pods, store);
        }
    }

    /// Publishes a group's current state: what the cap keeps of it, diffed against what it
    /// published before. Returns the wanted pods to fetch, if any ([`Wanted::ask`]). A
    /// service whose state is gone upstream is published empty and forgotten. `now` is when
    /// the view publishes it. `wait`: when new ready endpoints name pods being fetched or
    /// listed, nothing is published yet ([`Self::awaits`]); the group is published again when
    /// they come ([`Self::awaiting`] says which groups wait), or at [`AWAIT`] at the latest.
    pub fn publish(
        &mut self,
        g: &Group,
        store: &mut Store,
        now: Instant,
        wait: bool,
    ) -> Option<Fetch> {
        if let Group::Service(svc) = g {
            store.freeze(svc);
        }
        let was_published = self.has_published(g);
        let desired = match g {
            Group::Service(svc) => match store.service(svc) {
                None => Desired::empty(),
                Some(_) if !was_published && self.counters.services >= self.max_services => {
                    self.counters.services_withheld += 1;
                    Desired::empty()
                }
                Some(service) => {
                    let empty = Published::default();
                    let previous = self.groups.get(g).unwrap_or(&empty);
                    desired_service(store, service, svc, previous, self.max_endpoints)
                }
            },
            Group::Servers(ns) => Desired {
                objects: store
                    .servers_in(ns)
                    .into_iter()
                    .map(Object::Server)
                    .collect(),
                ..Desired::empty()
            },
            Group::LinkerdConfig => Desired {
                objects: (store.config_maps().into_iter())
                    .map(Object::ConfigMap)
                    .collect(),
                ..Desired::empty()
            },
        };
        if wait && let Some(fetch) = self.awaits(g, &desired, store, now) {
            return fetch;
        }
        self.commit(g, desired, store, now)
    }

    /// Publishes a contained service's pods behind its frozen endpoints: the service, its
    /// slices and its Endpoints stay as it published them, and the pods their kept endpoints
    /// name are completed by the rules of any publication ([`desired_service`]), so a consumer
    /// resolves every ready endpoint it is served, and kept current in all but their status
    /// ([`crate::model::PodObject::same_but_status`]): a pod deleted or replaced upstream, or
    /// relabelled, is published; a readiness flip is not. The flood's cost stays what
    /// containment makes it: the endpoints do not move, no pod is served but one a kept
    /// endpoint names, and the crash loop's status churn waits with the endpoints' until the
    /// service is released. Returns the wanted pods to fetch, if any. `wait`: as
    /// [`Self::publish`]'s, for a service that has not published yet.
    pub fn publish_frozen(
        &mut self,
        g: &Group,
        store: &mut Store,
        now: Instant,
        wait: bool,
    ) -> Option<Fetch> {
        let Some(previous) = self.groups.get(g).filter(|p| !p.objects.is_empty()) else {
            return self.publish(g, store, now, wait);
        };
        let mut pods: BTreeMap<NsName, bool> = BTreeMap::new();
        referred(
            &previous.slices,
            previous.endpoints_object.as_ref(),
            &mut pods,
        );
        let mut frozen: Vec<ObjKey> = previous
            .objects
            .iter()
            .filter(|k| !matches!(k.kind, Kind::Pod | Kind::ReplicaSet))
            .cloned()
            .collect();
        let mut objects = resolved(store, &pods, previous, false);
        // A pod served already stays as served while only its status moves: its readiness
        // flips and restarts are the flood itself, held back with the endpoints (whose
        // readiness is frozen too). What identifies and addresses it is kept current.
        objects.retain(|o| {
            let Object::Pod(now) = o else { return true };
            let key = o.key();
            let unchanged = previous.serves_pod(now.id())
                && self.view.get(&key).is_some_and(
                    |s| matches!(&s.object, Object::Pod(served) if served.same_but_status(now)),
                );
            if unchanged {
                frozen.push(key);
            }
            !unchanged
        });
        let desired = Desired {
            objects,
            frozen,
            slices: previous.slices.clone(),
            endpoints_object: previous.endpoints_object.clone(),
            endpoints: previous.endpoints,
            truncated: previous.truncated,
            pods: pods.into_keys().collect(),
            unresolved: Vec::new(),
        };
        self.commit(g, desired, store, now)
    }

    /// Applies a group's desired state: the diff against what it published before goes to the
    /// view (from `now`, in stages while anyone follows the view: [`stages`]), the wanted pods
    /// are updated, and the missing ones asked for.
    fn commit(
        &mut self,
        g: &Group,
        mut desired: Desired,
        store: &mut Store,
        now: Instant,
    ) -> Option<Fetch> {
        let was_published = self.has_published(g);
        let missing: Vec<NsName> = desired
            .pods
            .iter()
            .filter(|p| store.pod(p).is_none())
            .cloned()
            .collect();
        // A service under its cap, published as it is (not frozen by its containment).
        let grows =
            matches!(g, Group::Service(_)) && desired.frozen.is_empty() && desired.truncated == 0;
        let owners: BTreeSet<NsName> = (desired.pods.iter())
            .filter(|_| grows)
            .filter_map(|p| store.pod(p))
            .flat_map(|p| p.replicasets())
            .collect();
        self.set_pods(g, std::mem::take(&mut desired.pods), store);
        self.set_owners(g, owners.into_iter().collect(), store);

        let st = self.groups.entry(g.clone()).or_default();
        let keys: BTreeSet<ObjKey> = desired
            .objects
            .iter()
            .map(Object::key)
            .chain(desired.frozen)
            .collect();
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
            c.endpoints_published + desired.endpoints as u64 - st.endpoints as u64;
        c.endpoints_truncated =
            c.endpoints_truncated + desired.truncated as u64 - st.truncated as u64;
        st.objects = keys;
        st.slices = desired.slices;
        st.endpoints_object = desired.endpoints_object;
        st.endpoints = desired.endpoints;
        st.truncated = desired.truncated;
        let capped = desired.truncated > 0;
        if st.objects.is_empty() && st.pods.is_empty() && st.owners.is_empty() {
            // Nothing published, nothing wanted: the group's state goes with its service.
            self.groups.remove(g);
        }
        self.awaiting.remove(g);
        let stages = stages::split(changes, &self.view);
        let staged = self.view.watched();
        // A capped service's endpoint the cap has just swapped in names a pod that comes
        // into the view for it: that pod leads it longer ([`stages::CAPPED_LEAD`]).
        let entering = if capped {
            stages::CAPPED_LEAD
        } else {
            stages::LEAD
        };
        if self.apply_stages(g.clone(), stages, now, staged, entering) {
            self.counters.downstream_updates += 1;
        }
        self.request_pods(missing)
    }

    /// Forgets what every group published (the view is taken over as it is: [`Self::install`]
    /// follows with what it holds).
    pub fn reset(&mut self) {
        self.flush();
        for (rs, _) in self.owners.drain() {
            if let Some(m) = &self.mirror {
                m.want_owner(&rs, false);
            }
        }
        self.groups.clear();
        self.obj_refs.clear();
        self.wanted.clear();
        self.counters.services = 0;
        self.counters.endpoints_published = 0;
        self.counters.endpoints_truncated = 0;
    }

    /// Tells the pod watcher which pods are wanted now.
    pub fn refresh_wanted(&mut self) {
        if let Some(m) = &self.mirror {
            m.replace(self.wanted.hashes());
        }
    }

    /// Installs a group's published state taken from a saved view (a restart in quarantine or
    /// with contained services, or a view followed and taken over): the objects are in the
    /// view already.
    pub fn install(&mut self, g: Group, published: Published) {
        let c = &mut self.counters;
        if matches!(g, Group::Service(_)) && !published.objects.is_empty() {
            c.services += 1;
        }
        c.endpoints_published += published.endpoints as u64;
        c.endpoints_truncated += published.truncated as u64;
        for key in &published.objects {
            *self.obj_refs.entry(key.clone()).or_default() += 1;
        }
        if let Group::Service(svc) = &g {
            for pod in published.pods.iter() {
                self.wanted.add(pod, svc);
            }
        }
        for rs in &published.owners {
            self.own(rs);
        }
        self.groups.insert(g, published);
    }

    /// Asks the caller for wanted pods the store lacks and of which nothing is known
    /// ([`Wanted::ask`]).
    pub(super) fn request_pods(&mut self, missing: Vec<NsName>) -> Option<Fetch> {
        let fetch = self.wanted.ask(missing)?;
        self.counters.pods_fetched += fetch.pods.len() as u64;
        Some(fetch)
    }
}
