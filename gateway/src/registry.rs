//! The links one process serves, by name: what every listener reads. `floodgate run` fills it
//! from the links file at start; `floodgate controller` inserts and removes links as Link
//! resources come and go. Each entry holds the link's handle, its token, its facade API and its
//! gRPC feed, so a link joins or leaves every listener at once ([`crate::server`]).
//!
//! A request holds its entry (an `Arc`) for its whole life, so removing a link never cuts a
//! response short; it only stops new requests from finding it.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use futures_util::future::BoxFuture;

use crate::auth::Token;
use crate::command::{Order, Outcome, SendError};
use crate::grpc::MirrorLink;
use crate::kubeapi::{self, Api};
use crate::link::{LinkHandle, LinkStore};

/// One served link.
#[derive(Debug)]
pub struct Entry {
    /// The running link.
    pub handle: Arc<LinkHandle>,
    /// The token that opens it (facade and gRPC).
    pub token: Token,
    /// Its Kubernetes facade (watchers, request counters).
    pub api: Arc<Api<LinkStore>>,
    /// Its gRPC feed.
    pub mirror: Arc<MirrorLink>,
    /// How operators' commands reach the replica that decides for it: `None` when this
    /// process always does (`floodgate run`).
    pub relay: Option<Arc<dyn Relay>>,
}

/// How an operator's command reaches the replica that decides for a link (in cluster mode,
/// the holder of its Lease; see [`crate::command`]).
pub trait Relay: Send + Sync + std::fmt::Debug + 'static {
    /// The replica that decides for the link (its Lease holder), as last seen; `None` while
    /// nobody does.
    fn holder(&self) -> Option<String>;
    /// True when this replica holds the link's Lease.
    fn holds(&self) -> bool;
    /// The replica whose facade this replica reads the link from (the Lease holder), `None`
    /// while it reads the remote itself.
    fn follows(&self) -> Option<String>;
    /// Where this replica reads the link from, for people: "the remote", or "the facade of
    /// Lease holder <identity> at <address>".
    fn reads_from(&self) -> String;
    /// Sends `order` to the replica that decides and waits a while for its answer
    /// (`Ok(None)`: sent, not answered yet).
    fn forward(&self, order: Order) -> BoxFuture<'static, Result<Option<Outcome>, SendError>>;
}

impl Entry {
    /// The link's name.
    pub fn name(&self) -> &str {
        &self.handle.name
    }

    /// Whether the link serves: it has synced, or it serves a last good view (a quarantined
    /// link counts as synced).
    pub fn serving(&self) -> bool {
        self.handle.state.borrow().synced
    }
}

/// The links served, by name.
#[derive(Debug, Default)]
pub struct Registry {
    links: RwLock<BTreeMap<String, Arc<Entry>>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `handle`, opened by `token`, from now on; returns the entry it replaces.
    pub fn insert(&self, handle: Arc<LinkHandle>, token: &str) -> Option<Arc<Entry>> {
        self.insert_relayed(handle, token, None)
    }

    /// [`Registry::insert`] for a link whose commands `relay` carries to the replica that
    /// decides for it.
    pub fn insert_relayed(
        &self,
        handle: Arc<LinkHandle>,
        token: &str,
        relay: Option<Arc<dyn Relay>>,
    ) -> Option<Arc<Entry>> {
        let entry = Arc::new(Entry {
            relay,
            api: Arc::new(Api::new(LinkStore::new(&handle), token)),
            mirror: Arc::new(MirrorLink::of(&handle, token)),
            token: Token::new(token),
            handle,
        });
        self.write().insert(entry.name().to_owned(), entry)
    }

    /// Stops serving link `name`; returns it.
    pub fn remove(&self, name: &str) -> Option<Arc<Entry>> {
        self.write().remove(name)
    }

    /// Link `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Entry>> {
        self.read().get(name).cloned()
    }

    /// Every link, by name.
    pub fn all(&self) -> Vec<Arc<Entry>> {
        self.read().values().cloned().collect()
    }

    /// The links that do not serve yet (neither synced nor holding a last good view); empty
    /// when the process is ready.
    pub fn not_serving(&self) -> Vec<String> {
        self.read()
            .values()
            .filter(|e| !e.serving())
            .map(|e| e.name().to_owned())
            .collect()
    }

    // Every change is one map call, so a panic while holding the lock cannot leave the map
    // half-changed: a poisoned lock is still good.
    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<String, Arc<Entry>>> {
        self.links
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<String, Arc<Entry>>> {
        self.links
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl kubeapi::Directory for Registry {
    type Store = LinkStore;

    fn api(&self, name: &str) -> Option<Arc<Api<LinkStore>>> {
        self.read().get(name).map(|e| e.api.clone())
    }

    fn any_opens(&self, token: &str) -> bool {
        // Compare with every link, without stopping at the first match.
        self.read()
            .values()
            .fold(false, |found, e| e.token.opens(token) | found)
    }
}

impl crate::grpc::Directory for Registry {
    fn link(&self, name: &str) -> Option<Arc<MirrorLink>> {
        self.read().get(name).map(|e| e.mirror.clone())
    }

    fn links(&self) -> Vec<Arc<MirrorLink>> {
        self.read().values().map(|e| e.mirror.clone()).collect()
    }
}
