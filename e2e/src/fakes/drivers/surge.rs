//! Floods and surges: one step of a flood of a given [`FloodShape`], and a surge written in a
//! real cluster's order (pods Ready and quiet first, then the Service, then the EndpointSlice
//! controller naming them), which is when a gateway that skipped the pods nobody wanted yet
//! must go back for them. Scaling and rolling with a real cluster's lag between a pod and the
//! slice that names it ([`Cluster::scale_in_order`], [`Cluster::replace_pod_in_order`]).

use std::collections::BTreeSet;
use std::time::Duration;

use floodgate::model::{Kind, NsName, ObjKey, Object};

use super::pod::PodModel;
use super::{Cluster, FloodShape, SLICE_SIZE, pod};

/// How long a real cluster's EndpointSlice controller takes to name a new pod after the pod is
/// written (Running, Ready, its IP), and to drop an endpoint before the pod is deleted: 9 to
/// 30 ms, measured on a real kube-apiserver 1.32 on these machines.
pub const CONTROLLER_LAG: Duration = Duration::from_millis(20);

impl Cluster {
    /// One step of a flood of `shape`: `count` pods of the service change (see
    /// [`FloodShape`]), and the controllers follow.
    pub fn flood_step(&mut self, name: &str, shape: FloodShape, count: usize) {
        let FloodShape::CrashLoop { ready_share } = shape else {
            self.crash_loop_step(name, count);
            return;
        };
        let Some(mut svc) = self.services.remove(name) else {
            return;
        };
        let flipped = pod::crash_loop(&mut svc.pods, ready_share, count, &mut svc.cursors);
        let changed: BTreeSet<usize> = flipped.iter().map(|i| i / SLICE_SIZE).collect();
        let pods: Vec<Object> = flipped
            .iter()
            .map(|&i| self.pod(name, &svc.pods[i]))
            .collect();
        self.store.apply(pods);
        self.sync(name, &mut svc, &changed);
        self.services.insert(name.to_owned(), svc);
    }

    /// The first step of a surge in a real cluster's order: `replicas` pods of `name`'s
    /// Deployment start and turn Ready, and nothing names them yet (no Service is written if
    /// there was none, no slice). Follow with [`Self::create_service`] and [`Self::name_pods`].
    pub fn start_pods(&mut self, name: &str, exported: bool, replicas: usize) {
        self.model(name, exported);
        let Some(mut svc) = self.services.remove(name) else {
            return;
        };
        let start = svc.pods.len();
        self.grow(&mut svc, replicas, true);
        let pods: Vec<Object> = svc.pods[start..]
            .iter()
            .map(|p| self.pod(name, p))
            .collect();
        self.store.apply(pods);
        self.services.insert(name.to_owned(), svc);
    }

    /// The EndpointSlice (and Endpoints) controller catches up with `name`'s pods: every slice
    /// is written, `per_write` slices a write, then the Endpoints object.
    pub fn name_pods(&mut self, name: &str, per_write: usize) {
        let Some(mut svc) = self.services.remove(name) else {
            return;
        };
        let wanted = svc.pods.len().div_ceil(SLICE_SIZE);
        let all: Vec<usize> = (0..wanted).collect();
        for chunk in all.chunks(per_write.max(1)) {
            let changed: BTreeSet<usize> = chunk.iter().copied().collect();
            self.sync(name, &mut svc, &changed);
        }
        self.services.insert(name.to_owned(), svc);
    }

    /// Scales `name`'s Deployment to `replicas` in a real cluster's order: new pods are
    /// written Running and Ready with their IP, and `lag` later the slices and Endpoints naming
    /// them; on the way down the endpoints go first, and `lag` later the pods.
    pub async fn scale_in_order(&mut self, name: &str, replicas: usize, lag: Duration) {
        let Some(mut svc) = self.services.remove(name) else {
            return;
        };
        if replicas >= svc.pods.len() {
            let start = svc.pods.len();
            let changed = self.grow(&mut svc, replicas, true);
            let pods: Vec<Object> = (svc.pods[start..].iter())
                .map(|p| self.pod(name, p))
                .collect();
            self.store.apply(pods);
            tokio::time::sleep(lag).await;
            self.sync(name, &mut svc, &changed);
        } else {
            let (changed, removed) = self.shrink(name, &mut svc, replicas);
            self.sync(name, &mut svc, &changed);
            tokio::time::sleep(lag).await;
            self.store.delete(removed);
        }
        self.services.insert(name.to_owned(), svc);
    }

    /// One step of a rolling update in a real cluster's order: a new pod (a new name and
    /// address, of the next ReplicaSet after pod `i`'s, as a Deployment's rollout makes) is
    /// written Ready, `lag` later the slice names it in place of pod `i`, and `lag` after that
    /// pod `i` is deleted.
    pub async fn replace_pod_in_order(&mut self, name: &str, i: usize, lag: Duration) {
        let Some(mut svc) = self.services.remove(name) else {
            return;
        };
        if i < svc.pods.len() {
            let mut new = PodModel::new(svc.next_index, self.next_address(), true);
            new.revision = svc.pods[i].revision + 1;
            svc.next_index += 1;
            // The Deployment writes its new ReplicaSet before the first pod of it.
            self.write_replica_set(name, new.revision);
            self.store.apply([self.pod(name, &new)]);
            tokio::time::sleep(lag).await;
            let old = std::mem::replace(&mut svc.pods[i], new);
            self.sync(name, &mut svc, &BTreeSet::from([i / SLICE_SIZE]));
            tokio::time::sleep(lag).await;
            self.store.delete([self.pod_key(name, &old)]);
        }
        self.services.insert(name.to_owned(), svc);
    }

    /// A rollout step in a real cluster's order: pod `i` gets a new address, written first;
    /// `lag` later `before_slice` runs (a test stamps the slice there) and the slice naming the
    /// new address is written.
    pub async fn roll_pod_in_order(
        &mut self,
        name: &str,
        i: usize,
        lag: Duration,
        before_slice: impl FnOnce(&mut Self),
    ) {
        let Some(mut svc) = self.services.remove(name) else {
            return;
        };
        if i < svc.pods.len() {
            svc.pods[i].ip = self.next_address();
            self.store.apply([self.pod(name, &svc.pods[i])]);
            // The service's model goes back for `before_slice`, which may annotate it.
            self.services.insert(name.to_owned(), svc);
            tokio::time::sleep(lag).await;
            before_slice(self);
            let Some(mut svc) = self.services.remove(name) else {
                return;
            };
            self.sync(name, &mut svc, &BTreeSet::from([i / SLICE_SIZE]));
            self.services.insert(name.to_owned(), svc);
            return;
        }
        self.services.insert(name.to_owned(), svc);
    }

    /// The key of pod `p` of service `name`.
    pub(super) fn pod_key(&self, name: &str, p: &PodModel) -> ObjKey {
        ObjKey {
            kind: Kind::Pod,
            id: NsName::new(&self.namespace, &format!("{name}-{}", p.index)),
        }
    }
}
