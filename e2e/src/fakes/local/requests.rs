//! What the local cluster was asked, and by whom: requests by method and path, and each
//! user's accesses as RBAC judges them ([`Access`]), for tests that check what a client asks.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::LocalStore;

/// A request's authorization attributes, as the API server hands them to RBAC: who, which
/// verb, on what, where.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Access {
    /// The user: the bearer token presented (the local cluster takes it as the user's name),
    /// or `system:anonymous`.
    pub user: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch` or `delete`.
    pub verb: &'static str,
    /// The API group (`""` for the core group).
    pub group: &'static str,
    /// The resource, with its subresource: `links/status`.
    pub resource: String,
    /// The namespace (`""` for a request across namespaces).
    pub namespace: String,
}

/// The requests a [`LocalStore`] served.
#[derive(Debug, Default)]
pub(super) struct Requests {
    total: AtomicU64,
    /// Requests by method and path (no query).
    by_path: Mutex<HashMap<String, u64>>,
    /// What each user asked.
    accesses: Mutex<BTreeSet<Access>>,
}

impl LocalStore {
    /// Counts a request served.
    pub fn count_request(&self, method: &str, path: &str) {
        let r = &self.requests;
        r.total.fetch_add(1, Ordering::Relaxed);
        let mut by_path = r.by_path.lock().unwrap_or_else(|e| e.into_inner());
        *by_path.entry(format!("{method} {path}")).or_default() += 1;
    }

    /// Notes a request's authorization attributes.
    pub fn record_access(&self, access: Access) {
        let accesses = &self.requests.accesses;
        (accesses.lock().unwrap_or_else(|e| e.into_inner())).insert(access);
    }

    /// Every distinct access `user` made so far.
    pub fn accesses_of(&self, user: &str) -> Vec<Access> {
        let accesses = (self.requests.accesses.lock()).unwrap_or_else(|e| e.into_inner());
        accesses
            .iter()
            .filter(|a| a.user == user)
            .cloned()
            .collect()
    }

    /// Requests served so far with `method` on `path` (no query).
    pub fn requests_to(&self, method: &str, path: &str) -> u64 {
        let by_path = (self.requests.by_path.lock()).unwrap_or_else(|e| e.into_inner());
        by_path
            .get(&format!("{method} {path}"))
            .copied()
            .unwrap_or(0)
    }

    /// Requests served so far (tests wait for a client's loops to go round).
    pub fn requests(&self) -> u64 {
        self.requests.total.load(Ordering::Relaxed)
    }
}
