//! The snapshots paginated lists continue from.
//!
//! A LIST with `limit` is served in pages, and every page must come from the state the first
//! one saw, as the API server serves them from one etcd revision. The view keeps no old states,
//! so the first page of a paginated list keeps its snapshot here (pointers to the stored
//! objects, not copies) and its continue token names that snapshot by kind and version. A
//! namespaced list keeps only its namespace, under its own key, so a cluster-wide list at the
//! same version never continues from it. A snapshot lives for [`SNAPSHOT_TTL`] after its last use and at most [`SNAPSHOTS`] are kept per
//! view, the oldest evicted first; a token whose snapshot is gone gets 410 Expired, as a token
//! older than etcd's compaction does, and the client lists again from the start.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::Stored;
use crate::model::Kind;

/// How long a snapshot outlives its last page (the API server's etcd compacts every 5 minutes).
pub const SNAPSHOT_TTL: Duration = Duration::from_secs(300);

/// Snapshots kept per view. Each is one pointer per object of its kind and keeps the versions
/// it points to alive, so a flood of paginated lists costs at most this many copies of a
/// kind's pointers.
pub const SNAPSHOTS: usize = 16;

/// The objects of one kind at one version, by namespace and name.
pub type Items = Arc<[Arc<Stored>]>;

struct Entry {
    kind: Kind,
    /// The namespace a namespaced list kept (its snapshot holds that namespace alone).
    namespace: Option<Arc<str>>,
    resource_version: u64,
    used: Instant,
    items: Items,
}

/// The snapshots of one view.
#[derive(Default)]
pub struct Pages(Mutex<VecDeque<Entry>>);

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages")
            .field("snapshots", &self.lock().len())
            .finish()
    }
}

impl Pages {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        // Every change below completes before the guard drops.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops the snapshots past their TTL at `now`, then finds the one of `kind` in
    /// `namespace` (all of them: `None`) at `resource_version` and marks it used at `now`.
    fn find(
        e: &mut VecDeque<Entry>,
        kind: Kind,
        namespace: Option<&str>,
        resource_version: u64,
        now: Instant,
    ) -> Option<Items> {
        e.retain(|s| now.duration_since(s.used) < SNAPSHOT_TTL);
        let s = e.iter_mut().find(|s| {
            s.kind == kind
                && s.namespace.as_deref() == namespace
                && s.resource_version == resource_version
        })?;
        s.used = now;
        Some(s.items.clone())
    }

    /// Keeps `items`, the state of `kind` (in `namespace`, or all of them) at
    /// `resource_version`, for the pages after the first; a snapshot of the same kind,
    /// namespace and version already kept is shared instead. `now` is when the first page is
    /// served: the snapshot's TTL runs from it.
    pub fn keep(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        resource_version: u64,
        items: Items,
        now: Instant,
    ) -> Items {
        let mut e = self.lock();
        if let Some(kept) = Self::find(&mut e, kind, namespace, resource_version, now) {
            return kept;
        }
        if e.len() >= SNAPSHOTS {
            e.pop_front();
        }
        e.push_back(Entry {
            kind,
            namespace: namespace.map(Arc::from),
            resource_version,
            used: now,
            items: items.clone(),
        });
        items
    }

    /// The snapshot of `kind` in `namespace` (all of them: `None`) at `resource_version`, if
    /// it is still kept at `now` (which counts as its use).
    pub fn get(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        resource_version: u64,
        now: Instant,
    ) -> Option<Items> {
        Self::find(&mut self.lock(), kind, namespace, resource_version, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(n: usize) -> Items {
        (0..n)
            .map(|i| {
                let o =
                    crate::model::Object::Service(Arc::new(k8s_openapi::api::core::v1::Service {
                        metadata: kube::api::ObjectMeta {
                            name: Some(format!("s{i}")),
                            namespace: Some("ns".into()),
                            ..Default::default()
                        },
                        ..Default::default()
                    }));
                Arc::new(Stored::new(o, 1))
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_snapshot_is_shared_found_and_expires() {
        let pages = Pages::default();
        let first = pages.keep(Kind::Service, None, 7, items(3), Instant::now());
        let again = pages.keep(Kind::Service, None, 7, items(5), Instant::now());
        assert_eq!(
            again.len(),
            3,
            "the same kind and version share one snapshot"
        );
        assert!(Arc::ptr_eq(&first, &again));
        assert!(
            pages.get(Kind::Pod, None, 7, Instant::now()).is_none(),
            "another kind's version is not it"
        );
        tokio::time::advance(SNAPSHOT_TTL - Duration::from_secs(1)).await;
        assert!(
            pages.get(Kind::Service, None, 7, Instant::now()).is_some(),
            "a use keeps it"
        );
        tokio::time::advance(SNAPSHOT_TTL - Duration::from_secs(1)).await;
        assert!(pages.get(Kind::Service, None, 7, Instant::now()).is_some());
        tokio::time::advance(SNAPSHOT_TTL).await;
        assert!(
            pages.get(Kind::Service, None, 7, Instant::now()).is_none(),
            "unused past the TTL, it is gone"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_oldest_snapshot_is_evicted_past_the_cap() {
        let pages = Pages::default();
        for rv in 0..=SNAPSHOTS as u64 {
            pages.keep(Kind::Pod, None, rv, items(1), Instant::now());
        }
        assert!(
            pages.get(Kind::Pod, None, 0, Instant::now()).is_none(),
            "the oldest went"
        );
        assert!(pages.get(Kind::Pod, None, 1, Instant::now()).is_some());
        assert!(
            pages
                .get(Kind::Pod, None, SNAPSHOTS as u64, Instant::now())
                .is_some()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_namespaced_snapshot_is_not_the_cluster_wide_one() {
        let pages = Pages::default();
        pages.keep(Kind::Service, Some("ns"), 7, items(2), Instant::now());
        assert!(pages.get(Kind::Service, None, 7, Instant::now()).is_none());
        assert!(
            pages
                .get(Kind::Service, Some("other"), 7, Instant::now())
                .is_none()
        );
        let all = pages.keep(Kind::Service, None, 7, items(5), Instant::now());
        assert_eq!(all.len(), 5, "a cluster-wide list keeps its own");
        assert_eq!(
            pages
                .get(Kind::Service, Some("ns"), 7, Instant::now())
                .map(|i| i.len()),
            Some(2)
        );
    }
}
