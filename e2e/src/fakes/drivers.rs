//! Drivers that make kube-sim behave like a cluster: Services, Deployments whose pods crash-loop,
//! and the EndpointSlice and Endpoints controllers.
//!
//! The EndpointSlice controller's behaviour that consumers see is modelled: at most 100 endpoints
//! per slice, the service's labels copied onto its slices with `kubernetes.io/service-name`,
//! ready/serving/terminating conditions, a `targetRef` to each pod; the Endpoints controller's
//! object kept in step (truncated at 1000 addresses with the `over-capacity` annotation, as the
//! real one does). Only slices holding a changed pod are rewritten, as the real controller does.
//!
//! Pods carry what the kubelet reports (conditions, container state, restart counts: see
//! [`pod`]); a flood takes one of the [`FloodShape`]s. A surge can also be written in a real
//! cluster's order ([`Cluster::start_pods`], [`Cluster::create_service`],
//! [`Cluster::name_pods`]): pods Ready first and quiet afterwards, then the Service, then the
//! slices naming them; and scaled or rolled with a real cluster's lag between a pod and the
//! slice naming it ([`Cluster::scale_in_order`], [`Cluster::replace_pod_in_order`]).

mod pod;
mod surge;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use floodgate::kubeapi::ApiStore;
use floodgate::model::{
    EndpointsObject, Kind, NsName, ObjKey, Object, SERVICE_NAME_LABEL, SliceObject,
};
use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
    ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{self as discovery, EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

use crate::sim::SimStore;

pub use pod::FloodShape;
use pod::PodModel;
pub use surge::CONTROLLER_LAG;

/// Endpoints per slice, as the EndpointSlice controller does by default.
pub const SLICE_SIZE: usize = 100;
/// Addresses per core/v1 Endpoints before the controller truncates it.
pub const ENDPOINTS_MAX: usize = 1000;
/// The label Linkerd exports services with.
pub const EXPORTED: &str = "mirror.linkerd.io/exported";

#[derive(Clone, Debug)]
struct ServiceModel {
    labels: BTreeMap<String, String>,
    pods: Vec<PodModel>,
    next_index: u32,
    slices: usize,
    /// Annotations the EndpointSlice controller's slices of this service carry.
    slice_annotations: BTreeMap<String, String>,
    /// Where a crash loop's next crash and next recovery start looking.
    cursors: (usize, usize),
}

/// A simulated namespace of services and their deployments, writing into a [`SimStore`].
#[derive(Debug)]
pub struct Cluster {
    store: Arc<SimStore>,
    namespace: String,
    services: BTreeMap<String, ServiceModel>,
    next_ip: u32,
    flip_cursor: usize,
    /// Every object's creationTimestamp: the cluster's start (stable, so rewrites of an object
    /// that change nothing else publish nothing).
    born: Time,
}

impl Cluster {
    /// A cluster writing objects of `namespace` into `store`.
    pub fn new(store: Arc<SimStore>, namespace: &str) -> Self {
        Self {
            store,
            namespace: namespace.to_owned(),
            services: BTreeMap::new(),
            next_ip: 1,
            flip_cursor: 0,
            born: Time(jiff::Timestamp::now()),
        }
    }

    /// A cluster of namespace `prod` in `store` with exported `services`, `pods` ready pods
    /// each (the common remote of the scenario tests).
    pub fn exported(store: Arc<SimStore>, services: &[&str], pods: usize) -> Self {
        let mut cluster = Self::new(store, "prod");
        for svc in services {
            cluster.add_service(svc, true);
            cluster.scale(svc, pods, true);
        }
        cluster
    }

    /// The store.
    pub fn store(&self) -> &Arc<SimStore> {
        &self.store
    }

    fn meta(&self, name: &str, labels: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            uid: Some(format!("uid-{}-{name}", self.namespace)),
            creation_timestamp: Some(self.born.clone()),
            ..Default::default()
        }
    }

    /// Creates a service (exported with `remote-discovery` when `exported`) and its
    /// Deployment's ReplicaSet, with no pods.
    pub fn add_service(&mut self, name: &str, exported: bool) {
        self.model(name, exported);
        self.create_service(name);
    }

    /// The service's model and its Deployment's ReplicaSet, written once; no Service yet.
    fn model(&mut self, name: &str, exported: bool) {
        if self.services.contains_key(name) {
            return;
        }
        let mut labels: BTreeMap<String, String> = [("app".to_owned(), name.to_owned())].into();
        if exported {
            labels.insert(EXPORTED.to_owned(), "remote-discovery".to_owned());
        }
        self.write_replica_set(name, 0);
        self.services.insert(
            name.to_owned(),
            ServiceModel {
                labels,
                pods: Vec::new(),
                next_index: 0,
                slices: 0,
                slice_annotations: BTreeMap::new(),
                cursors: (0, 0),
            },
        );
    }

    /// Writes the Service object of a service known to the cluster (created by
    /// [`Self::add_service`], or by [`Self::start_pods`] without one).
    pub fn create_service(&mut self, name: &str) {
        let Some(labels) = self.services.get(name).map(|s| s.labels.clone()) else {
            return;
        };
        let svc = Service {
            metadata: self.meta(name, labels),
            spec: Some(ServiceSpec {
                selector: Some([("app".to_owned(), name.to_owned())].into()),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: 8080,
                    ..Default::default()
                }]),
                type_: Some("ClusterIP".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.store.apply([Object::Service(Arc::new(svc))]);
    }

    /// The next pod address, 10.x.y.z, never given before.
    fn next_address(&mut self) -> String {
        let ip = self.next_ip;
        self.next_ip += 1;
        format!("10.{}.{}.{}", (ip >> 16) & 255, (ip >> 8) & 255, ip & 255)
    }

    /// Adds pods to `svc` up to `replicas` (`ready` or not); returns the slices they land in.
    fn grow(&mut self, svc: &mut ServiceModel, replicas: usize, ready: bool) -> BTreeSet<usize> {
        let mut changed = BTreeSet::new();
        while svc.pods.len() < replicas {
            let ip = self.next_address();
            svc.pods.push(PodModel::new(svc.next_index, ip, ready));
            svc.next_index += 1;
            changed.insert((svc.pods.len() - 1) / SLICE_SIZE);
        }
        changed
    }

    /// Scales a service's Deployment to `replicas` pods; new pods start `ready` or not.
    pub fn scale(&mut self, name: &str, replicas: usize, ready: bool) {
        let Some(mut svc) = self.services.remove(name) else {
            return;
        };
        let (mut changed, removed) = self.shrink(name, &mut svc, replicas);
        let start = svc.pods.len();
        changed.extend(self.grow(&mut svc, replicas, ready));
        // Only the new pods are written: the others did not change.
        let new_pods: Vec<Object> = svc.pods[start.min(svc.pods.len())..]
            .iter()
            .map(|p| self.pod(name, p))
            .collect();
        // A real cluster's order: new pods before the slices naming them, and an endpoint
        // dropped before its pod is deleted.
        self.store.apply(new_pods);
        self.sync(name, &mut svc, &changed);
        self.store.delete(removed);
        self.services.insert(name.to_owned(), svc);
    }

    /// One step of a crash loop: `count` pods of the service flip between ready and crashed
    /// (round robin), and the controllers follow.
    pub fn crash_loop_step(&mut self, name: &str, count: usize) {
        let Some(mut svc) = self.services.remove(name) else {
            return;
        };
        let n = svc.pods.len();
        let mut changed = BTreeSet::new();
        let mut pods = Vec::new();
        for _ in 0..count.min(n) {
            let i = self.flip_cursor % n;
            self.flip_cursor += 1;
            let p = &mut svc.pods[i];
            if p.ready {
                p.crash();
            } else {
                p.recover();
            }
            changed.insert(i / SLICE_SIZE);
            pods.push(self.pod(name, &svc.pods[i]));
        }
        self.store.apply(pods);
        self.sync(name, &mut svc, &changed);
        self.services.insert(name.to_owned(), svc);
    }

    /// Replaces pod `i` of a service by a new one with a new address (a rollout step).
    pub fn roll_pod(&mut self, name: &str, i: usize) {
        let Some(mut svc) = self.services.remove(name) else {
            return;
        };
        if i < svc.pods.len() {
            svc.pods[i].ip = self.next_address();
            let pod = self.pod(name, &svc.pods[i]);
            self.store.apply([pod]);
            self.sync(name, &mut svc, &BTreeSet::from([i / SLICE_SIZE]));
        }
        self.services.insert(name.to_owned(), svc);
    }

    /// Sets (or with `None` removes) an annotation on the service's slices from their next
    /// rewrite on (scenarios stamp changes with it to measure how long they take to arrive).
    pub fn annotate_slices(&mut self, name: &str, key: &str, value: Option<&str>) {
        if let Some(svc) = self.services.get_mut(name) {
            match value {
                Some(v) => svc.slice_annotations.insert(key.to_owned(), v.to_owned()),
                None => svc.slice_annotations.remove(key),
            };
        }
    }

    /// Changes a service's labels (moving it in or out of a selector); its slices follow.
    pub fn relabel(&mut self, name: &str, key: &str, value: Option<&str>) {
        let Some(mut svc) = self.services.remove(name) else {
            return;
        };
        match value {
            Some(v) => svc.labels.insert(key.to_owned(), v.to_owned()),
            None => svc.labels.remove(key),
        };
        let current = self.store.view().get(&ObjKey {
            kind: Kind::Service,
            id: NsName::new(&self.namespace, name),
        });
        if let Some(Object::Service(s)) = current.map(|c| c.object.clone()) {
            let mut s = Service::clone(&s);
            s.metadata.labels = Some(svc.labels.clone());
            self.store.apply([Object::Service(Arc::new(s))]);
        }
        let all: BTreeSet<usize> = (0..svc.slices).collect();
        self.sync(name, &mut svc, &all);
        self.services.insert(name.to_owned(), svc);
    }

    /// Deletes a service as its namespace's deletion does: the Service, then its slices and
    /// Endpoints, its pods and its ReplicaSet.
    pub fn delete_service(&mut self, name: &str) {
        let Some(svc) = self.services.remove(name) else {
            return;
        };
        let key = |kind, name: &str| ObjKey {
            kind,
            id: NsName::new(&self.namespace, name),
        };
        let mut keys = vec![key(Kind::Service, name)];
        keys.extend((0..svc.slices).map(|n| key(Kind::EndpointSlice, &format!("{name}-{n:05}"))));
        keys.push(key(Kind::Endpoints, name));
        keys.extend((svc.pods.iter()).map(|p| key(Kind::Pod, &format!("{name}-{}", p.index))));
        let revisions = svc.pods.iter().map(|p| p.revision).max().unwrap_or(0);
        keys.extend((0..=revisions).map(|n| key(Kind::ReplicaSet, &replica_set(name, n))));
        self.store.delete(keys);
    }

    /// A service with `count` slices of `per_slice` endpoints and no pods behind them (the
    /// fixture of the LIST and fan-out benchmarks).
    pub fn static_slices(&mut self, name: &str, count: usize, per_slice: usize) {
        self.add_service(name, true);
        let mut labels = self
            .services
            .get(name)
            .map(|s| s.labels.clone())
            .unwrap_or_default();
        labels.insert(SERVICE_NAME_LABEL.to_owned(), name.to_owned());
        let slices = (0..count).map(|n| {
            let endpoints = (0..per_slice)
                .map(|i| {
                    let ip = n * per_slice + i;
                    discovery::Endpoint {
                        addresses: vec![format!(
                            "10.{}.{}.{}",
                            (ip >> 16) & 255,
                            (ip >> 8) & 255,
                            ip & 255
                        )],
                        conditions: Some(EndpointConditions {
                            ready: Some(true),
                            serving: Some(true),
                            terminating: Some(false),
                        }),
                        node_name: Some(format!("node-{}", ip % 50)),
                        zone: Some(format!("zone-{}", ip % 3)),
                        target_ref: Some(ObjectReference {
                            kind: Some("Pod".into()),
                            name: Some(format!("{name}-{ip}")),
                            namespace: Some(self.namespace.clone()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }
                })
                .collect();
            http_slice(
                self.meta(&format!("{name}-{n:05}"), labels.clone()),
                endpoints,
            )
        });
        self.store.apply(slices.collect::<Vec<_>>());
    }

    /// Drops `svc`'s last pods down to `replicas` from its model: the slices they were in, and
    /// their keys (the pods to delete once the slices no longer name them).
    fn shrink(
        &self,
        name: &str,
        svc: &mut ServiceModel,
        replicas: usize,
    ) -> (BTreeSet<usize>, Vec<ObjKey>) {
        let mut changed = BTreeSet::new();
        let mut removed = Vec::new();
        for p in svc.pods.split_off(replicas.min(svc.pods.len())) {
            removed.push(self.pod_key(name, &p));
        }
        let start = svc.pods.len();
        changed.extend((start..start + removed.len()).map(|i| i / SLICE_SIZE));
        (changed, removed)
    }

    /// Writes revision `n` of service `name`'s Deployment's ReplicaSet.
    fn write_replica_set(&self, name: &str, n: u32) {
        let rs = self.meta(
            &replica_set(name, n),
            [("app".to_owned(), name.to_owned())].into(),
        );
        self.store.apply([Object::ReplicaSet(Arc::new(rs))]);
    }

    fn pod(&self, svc: &str, p: &PodModel) -> Object {
        let mut meta = self.meta(
            &format!("{svc}-{}", p.index),
            [("app".to_owned(), svc.to_owned())].into(),
        );
        let rs = replica_set(svc, p.revision);
        meta.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            uid: format!("rs-{rs}"),
            name: rs,
            controller: Some(true),
            ..Default::default()
        }]);
        let status = p.status(&format!("{svc}-{}_{}", p.index, self.namespace));
        let pod = Pod {
            metadata: meta,
            spec: None,
            status: Some(status),
        };
        Object::Pod(Arc::new(pod.into()))
    }

    /// The EndpointSlice and Endpoints controllers: rewrites the slices in `changed` (and drops
    /// slices past the end), and the Endpoints object.
    fn sync(&self, name: &str, svc: &mut ServiceModel, changed: &BTreeSet<usize>) {
        let mut labels = svc.labels.clone();
        labels.insert(SERVICE_NAME_LABEL.to_owned(), name.to_owned());
        labels.insert(
            "endpointslice.kubernetes.io/managed-by".to_owned(),
            "endpointslice-controller.k8s.io".to_owned(),
        );
        let wanted = svc.pods.len().div_ceil(SLICE_SIZE);
        let mut objects = Vec::new();
        for n in changed.iter().copied().filter(|n| *n < wanted) {
            let chunk = &svc.pods[n * SLICE_SIZE..((n + 1) * SLICE_SIZE).min(svc.pods.len())];
            let endpoints = chunk
                .iter()
                .map(|p| discovery::Endpoint {
                    addresses: vec![p.ip.clone()],
                    conditions: Some(EndpointConditions {
                        ready: Some(p.ready),
                        serving: Some(p.ready),
                        terminating: Some(false),
                    }),
                    target_ref: Some(ObjectReference {
                        kind: Some("Pod".into()),
                        name: Some(format!("{name}-{}", p.index)),
                        namespace: Some(self.namespace.clone()),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect();
            let mut metadata = self.meta(&format!("{name}-{n:05}"), labels.clone());
            if !svc.slice_annotations.is_empty() {
                metadata.annotations = Some(svc.slice_annotations.clone());
            }
            objects.push(http_slice(metadata, endpoints));
        }
        let stale: Vec<ObjKey> = (wanted..svc.slices)
            .map(|n| ObjKey {
                kind: Kind::EndpointSlice,
                id: NsName::new(&self.namespace, &format!("{name}-{n:05}")),
            })
            .collect();
        svc.slices = wanted;

        let addr = |p: &PodModel| EndpointAddress {
            ip: p.ip.clone(),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some(format!("{name}-{}", p.index)),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let shown = &svc.pods[..svc.pods.len().min(ENDPOINTS_MAX)];
        let ready: Vec<_> = shown.iter().filter(|p| p.ready).map(addr).collect();
        let not_ready: Vec<_> = shown.iter().filter(|p| !p.ready).map(addr).collect();
        let mut meta = self.meta(name, svc.labels.clone());
        if svc.pods.len() > ENDPOINTS_MAX {
            meta.annotations = Some(
                [(
                    "endpoints.kubernetes.io/over-capacity".to_owned(),
                    "truncated".to_owned(),
                )]
                .into(),
            );
        }
        objects.push(Object::Endpoints(Arc::new(EndpointsObject::from(
            Endpoints {
                metadata: meta,
                subsets: (!svc.pods.is_empty()).then(|| {
                    vec![EndpointSubset {
                        addresses: (!ready.is_empty()).then_some(ready),
                        not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
                        ports: Some(vec![EndpointPort {
                            name: Some("http".into()),
                            port: 8080,
                            protocol: Some("TCP".into()),
                            ..Default::default()
                        }]),
                    }]
                }),
            },
        ))));
        self.store.apply(objects);
        self.store.delete(stale);
    }
}

/// An IPv4 EndpointSlice of `endpoints` on port `http` (8080/TCP).
fn http_slice(metadata: ObjectMeta, endpoints: Vec<discovery::Endpoint>) -> Object {
    Object::EndpointSlice(
        SliceObject::from(EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(endpoints),
            metadata,
            ports: Some(vec![discovery::EndpointPort {
                name: Some("http".into()),
                port: Some(8080),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
        })
        .into(),
    )
}

/// The name of revision `n` of service `svc`'s Deployment's ReplicaSet (0: the first).
fn replica_set(svc: &str, n: u32) -> String {
    match n {
        0 => format!("{svc}-rs"),
        n => format!("{svc}-rs-{n}"),
    }
}
