//! Floods and surges: one step of a flood of a given [`FloodShape`], and a surge written in a
//! real cluster's order (pods Ready and quiet first, then the Service, then the EndpointSlice
//! controller naming them), which is when a gateway that skipped the pods nobody wanted yet
//! must go back for them.

use std::collections::BTreeSet;

use floodgate::model::Object;

use super::{Cluster, FloodShape, SLICE_SIZE, pod};

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
}
