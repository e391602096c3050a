//! One stream's index of a link's view: the published Services and EndpointSlices of the
//! watched services, kept in step with the view's change feed, so a snapshot of one service is
//! built without scanning the whole view. It holds pointers into the view's objects (`Arc`s),
//! not copies.
//!
//! [`Index::resync`] takes a consistent starting point from the view (the two kinds' feeds and
//! lists at one version, so no change falls between them); [`Index::apply`] folds in one
//! change and names the service it touched.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use floodgate_link_crd::Phase;
use floodgate_proto::v1::EndpointSnapshot;
use k8s_openapi::api::core::v1::Service;
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};

use super::snapshot;
use crate::model::{HeldSlice, Kind, NsName, Object};
use crate::view::{Event, EventType, View};

/// The view's Service and EndpointSlice feeds, followed together (the other kinds' changes
/// never wake a stream).
#[derive(Debug)]
pub struct Feeds {
    services: broadcast::Receiver<Event>,
    slices: broadcast::Receiver<Event>,
}

impl Feeds {
    /// The next change of either kind; a Service change first when both have one. Cancel-safe,
    /// as each receiver's `recv` is.
    pub async fn recv(&mut self) -> Result<Event, RecvError> {
        tokio::select! {
            biased;
            r = self.services.recv() => r,
            r = self.slices.recv() => r,
        }
    }

    /// A change already queued on either feed.
    pub fn try_recv(&mut self) -> Result<Event, TryRecvError> {
        match self.services.try_recv() {
            Err(TryRecvError::Empty) => self.slices.try_recv(),
            r => r,
        }
    }
}

/// The watched part of a view.
#[derive(Debug, Default)]
pub struct Index {
    /// Only this service, or every service.
    only: Option<NsName>,
    services: BTreeMap<NsName, Arc<Service>>,
    /// Slices by their service, then by their name (the order snapshots list them in).
    slices: HashMap<NsName, BTreeMap<Arc<str>, HeldSlice>>,
    /// Each indexed slice's service, to move or remove it when it changes.
    owner: HashMap<NsName, NsName>,
    /// Changes at or below these versions are already in the lists taken by `resync`.
    services_floor: u64,
    slices_floor: u64,
    /// The newest view version folded in.
    version: u64,
}

impl Index {
    /// An empty index of one service, or of every service.
    pub fn new(only: Option<NsName>) -> Self {
        Self {
            only,
            ..Self::default()
        }
    }

    /// True when the stream sends `svc`'s snapshots (it watches every service, or this one).
    pub fn covers(&self, svc: &NsName) -> bool {
        self.only.as_ref().is_none_or(|o| o == svc)
    }

    /// Every service a full resend covers: the indexed ones, and the watched one even when it
    /// does not exist.
    pub fn keys(&self) -> BTreeSet<NsName> {
        let mut keys: BTreeSet<NsName> = self.services.keys().cloned().collect();
        keys.extend(self.only.iter().cloned());
        keys
    }

    /// The newest view version folded in.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Starts over from the view's current state: subscribes, then lists. Returns the new
    /// receiver and every service whose snapshot must be (re)sent: those indexed before and
    /// those indexed now, so a service that vanished meanwhile gets `exists = false`.
    pub fn resync(&mut self, view: &View) -> (Feeds, BTreeSet<NsName>) {
        let mut dirty = self.keys();
        let [(services, services_rx), (slices, slices_rx)] =
            view.list_and_watch_each([Kind::Service, Kind::EndpointSlice]);
        let rx = Feeds {
            services: services_rx,
            slices: slices_rx,
        };
        self.services.clear();
        self.slices.clear();
        self.owner.clear();
        self.services_floor = services.resource_version;
        self.slices_floor = slices.resource_version;
        self.version = slices.resource_version.max(services.resource_version);
        for s in &services.items {
            if let Object::Service(svc) = &s.object {
                let id = NsName::of(&svc.metadata);
                if self.covers(&id) {
                    self.services.insert(id, svc.clone());
                }
            }
        }
        for s in &slices.items {
            if let Object::EndpointSlice(slice) = &s.object {
                self.insert_slice(slice);
            }
        }
        dirty.extend(self.keys());
        (rx, dirty)
    }

    fn insert_slice(&mut self, slice: &HeldSlice) -> Option<NsName> {
        let svc = slice.service().filter(|s| self.covers(s))?;
        let id = slice.id().clone();
        self.slices
            .entry(svc.clone())
            .or_default()
            .insert(id.name.clone(), slice.clone());
        self.owner.insert(id, svc.clone());
        Some(svc)
    }

    fn remove_slice(&mut self, id: &NsName) -> Option<NsName> {
        let svc = self.owner.remove(id)?;
        if let Some(m) = self.slices.get_mut(&svc) {
            m.remove(&id.name);
            if m.is_empty() {
                self.slices.remove(&svc);
            }
        }
        Some(svc)
    }

    /// Folds one change in. Returns the services whose snapshot it changed (a slice that moved
    /// between services changes two).
    pub fn apply(&mut self, event: &Event) -> Vec<NsName> {
        let rv = event.resource_version;
        self.version = self.version.max(rv);
        let mut touched = Vec::new();
        match &event.object.object {
            Object::Service(svc) if rv > self.services_floor => {
                let id = NsName::of(&svc.metadata);
                if !self.covers(&id) {
                    return touched;
                }
                if event.kind == EventType::Deleted {
                    self.services.remove(&id);
                } else {
                    self.services.insert(id.clone(), svc.clone());
                }
                touched.push(id);
            }
            Object::EndpointSlice(slice) if rv > self.slices_floor => {
                let id = slice.id().clone();
                touched.extend(self.remove_slice(&id));
                if event.kind != EventType::Deleted {
                    touched.extend(self.insert_slice(slice));
                }
                touched.dedup();
            }
            _ => {}
        }
        touched
    }

    /// The snapshot of one service as indexed now.
    pub fn snapshot(&self, id: &NsName, phase: Phase) -> EndpointSnapshot {
        let slices = self.slices.get(id);
        snapshot::build(
            id,
            self.services.get(id).map(|s| &**s),
            slices.into_iter().flat_map(|m| m.values()),
            self.version,
            phase,
        )
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;
    use crate::grpc::snapshot::tests::{mk_endpoint, mk_service, mk_slice};
    use crate::view::Change;

    fn svc(name: &str) -> Object {
        Object::Service(Arc::new(mk_service("prod", name, &[])))
    }

    fn slice(name: &str, service: &str, ips: &[&str]) -> Object {
        let eps = ips.iter().map(|ip| mk_endpoint(ip, "p", true)).collect();
        Object::EndpointSlice(mk_slice("prod", name, service, eps).into())
    }

    fn id(name: &str) -> NsName {
        NsName::new("prod", name)
    }

    #[test]
    fn resync_indexes_each_service_with_its_slices() {
        let view = View::new(1, 100);
        view.apply(
            [
                Change::Upsert(svc("web")),
                Change::Upsert(svc("db")),
                Change::Upsert(slice("web-a", "web", &["10.0.0.1"])),
                Change::Upsert(slice("web-b", "web", &["10.0.0.2"])),
                Change::Upsert(slice("db-a", "db", &["10.0.1.1"])),
            ],
            Instant::now(),
        );
        let mut index = Index::new(None);
        let (_rx, dirty) = index.resync(&view);
        assert_eq!(dirty, BTreeSet::from([id("db"), id("web")]));
        assert_eq!(index.version(), view.resource_version());
        let web = index.snapshot(&id("web"), Phase::Healthy);
        assert_eq!(web.endpoints.len(), 2);
        assert_eq!(index.snapshot(&id("db"), Phase::Healthy).endpoints.len(), 1);
    }

    #[tokio::test]
    async fn changes_touch_their_service_and_deletions_say_it_is_gone() {
        let view = View::new(1, 100);
        view.apply(
            [Change::Upsert(svc("web")), Change::Upsert(svc("db"))],
            Instant::now(),
        );
        let mut index = Index::new(None);
        let (mut rx, _) = index.resync(&view);
        view.apply(
            [Change::Upsert(slice(
                "web-a",
                "web",
                &["10.0.0.1", "10.0.0.2"],
            ))],
            Instant::now(),
        );
        let e = rx.recv().await.expect("event");
        assert_eq!(index.apply(&e), vec![id("web")]);
        assert_eq!(
            index.snapshot(&id("web"), Phase::Healthy).endpoints.len(),
            2
        );
        assert_eq!(index.version(), e.resource_version);

        view.apply([Change::Delete(svc("web").key())], Instant::now());
        let e = rx.recv().await.expect("event");
        assert_eq!(index.apply(&e), vec![id("web")]);
        assert!(!index.snapshot(&id("web"), Phase::Healthy).exists);
        assert_eq!(index.keys(), BTreeSet::from([id("db")]));
    }

    #[tokio::test]
    async fn a_single_service_index_ignores_the_others_but_always_covers_its_own() {
        let view = View::new(1, 100);
        let mut index = Index::new(Some(id("web")));
        let (mut rx, dirty) = index.resync(&view);
        assert_eq!(
            dirty,
            BTreeSet::from([id("web")]),
            "sent even before it exists"
        );
        view.apply(
            [
                Change::Upsert(svc("db")),
                Change::Upsert(slice("db-a", "db", &["10.0.1.1"])),
            ],
            Instant::now(),
        );
        for _ in 0..2 {
            let e = rx.recv().await.expect("event");
            assert!(index.apply(&e).is_empty());
        }
        view.apply([Change::Upsert(svc("web"))], Instant::now());
        let e = rx.recv().await.expect("event");
        assert_eq!(index.apply(&e), vec![id("web")]);
        assert!(index.snapshot(&id("web"), Phase::Healthy).exists);
    }

    #[test]
    fn a_resync_resends_services_that_vanished() {
        let view = View::new(1, 100);
        view.apply(
            [Change::Upsert(svc("web")), Change::Upsert(svc("db"))],
            Instant::now(),
        );
        let mut index = Index::new(None);
        let _ = index.resync(&view);
        view.apply([Change::Delete(svc("db").key())], Instant::now());
        let (_rx, dirty) = index.resync(&view);
        assert_eq!(dirty, BTreeSet::from([id("db"), id("web")]));
        assert!(!index.snapshot(&id("db"), Phase::Healthy).exists);
    }

    #[tokio::test]
    async fn changes_already_in_the_lists_are_not_applied_twice() {
        let view = View::new(1, 100);
        view.apply([Change::Upsert(svc("web"))], Instant::now());
        let mut index = Index::new(None);
        let (mut rx, _) = index.resync(&view);
        // A change the receiver sees whose version is at or below the slices' list version
        // (as when it lands between subscribing and listing) is skipped.
        view.apply(
            [Change::Upsert(slice("web-a", "web", &["10.0.0.1"]))],
            Instant::now(),
        );
        let e = rx.recv().await.expect("event");
        index.slices_floor = e.resource_version;
        assert!(index.apply(&e).is_empty());
    }
}
