//! The Kubernetes API facade: enough of the list/watch protocol for unmodified client-go
//! informers (Linkerd), kube-rs watchers, kubectl and the Python client, served from a
//! [`View`]. The same code serves Floodgate's links (read-only, one per `/links/<link>/` prefix)
//! and the remote-cluster simulator of our tests (writable, at the root): the difference is the
//! [`ApiStore`] behind it.
//!
//! Requests flow: authentication (bearer token, constant-time) -> path routing -> query parsing
//! and content negotiation -> discovery, access review, event sink, or GET/LIST/WATCH against the
//! view; writes go to the store, which refuses them (405) unless it is the simulator.

pub mod list;
pub mod query;
pub mod replica;
pub mod resource;
pub mod review;
mod route;
pub mod selector;
pub mod serve;
pub mod status;
pub mod watch;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;

use self::route::{not_found_path, serve};
use self::status::{Reason, StatusError};
use crate::model::{KINDS, KindDef};
use crate::view::View;

/// Request bodies larger than this are refused with 413: nothing a consumer sends (an access
/// review, an Event) comes near it.
pub const MAX_BODY: usize = 1024 * 1024;

/// How long a request to a link that has not synced yet waits before a 503.
pub const COLD_WAIT: Duration = Duration::from_secs(5);

/// Open watches one API serves at most; one more gets 429 with `retryAfterSeconds`. A watcher
/// costs a task, a broadcast receiver and its connection: 10,000 of them is a few hundred MiB
/// at worst, far past what a link's consumers need (a handful of informers per controller).
pub const DEFAULT_MAX_WATCHES: usize = 10_000;

/// The bounds an API enforces.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How long a request waits for a cold store before a 503.
    pub cold_wait: Duration,
    /// Open watches at most.
    pub max_watches: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            cold_wait: COLD_WAIT,
            max_watches: DEFAULT_MAX_WATCHES,
        }
    }
}

/// A write the facade passes on to its store.
#[derive(Debug)]
pub struct Write<'a> {
    /// POST, PUT, PATCH or DELETE.
    pub method: &'a Method,
    /// The resource.
    pub def: &'static KindDef,
    /// The namespace in the path.
    pub namespace: Option<&'a str>,
    /// The object's name, for PUT, PATCH and DELETE.
    pub name: Option<&'a str>,
    /// The request's Content-Type.
    pub content_type: &'a str,
    /// The body.
    pub body: &'a [u8],
}

/// What the facade serves from.
pub trait ApiStore: Send + Sync + 'static {
    /// The objects.
    fn view(&self) -> &View;

    /// The resources served (a remote without Linkerd's policy API serves no servers).
    fn served(&self) -> Vec<&'static KindDef> {
        KINDS.iter().collect()
    }

    /// `GET /version`: the upstream's version.
    fn version(&self) -> Value {
        resource::default_version()
    }

    /// Whether objects can be served yet (a link before its first sync cannot).
    fn ready(&self) -> Result<(), StatusError> {
        Ok(())
    }

    /// Resolves when [`ApiStore::ready`] may have changed: a request that came before the
    /// first sync waits on this (bounded by the caller). By default, 100 ms pass.
    fn ready_changed(&self) -> futures_util::future::BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(std::time::Duration::from_millis(100)))
    }

    /// The simulated API server behind this store, if it is one (kube-sim's remote):
    /// production stores have none, and serve read-only.
    fn simulation(&self) -> Option<&dyn Simulation> {
        None
    }
}

/// What only a simulated API server does: inject faults, behave like servers that refuse
/// streaming lists or ignore `limit`, and take writes. kube-sim implements it; Floodgate's own
/// stores do not, so none of it is reachable in production.
pub trait Simulation: Send + Sync {
    /// An error every request gets instead of an answer.
    fn fault(&self) -> Option<StatusError> {
        None
    }

    /// Whether watches may ask for a streaming list (`sendInitialEvents`). A server that says
    /// no refuses them with 422 Invalid, as an API server with the `WatchList` feature off does.
    fn serves_streaming_lists(&self) -> bool {
        true
    }

    /// Whether lists honour `limit`. A server that says no serves every list whole, as an API
    /// server does from its watch cache.
    fn honours_limit(&self) -> bool {
        true
    }

    /// Creates, updates, patches or deletes.
    fn write(&self, w: Write<'_>) -> Result<(StatusCode, Value), StatusError>;
}

/// A view on its own serves read-only, with every resource and a default version.
impl ApiStore for View {
    fn view(&self) -> &View {
        self
    }
}

/// A shared store serves as the store itself (the simulator's drivers write into the store the
/// server reads).
impl<T: ApiStore> ApiStore for Arc<T> {
    fn view(&self) -> &View {
        T::view(self)
    }
    fn served(&self) -> Vec<&'static KindDef> {
        T::served(self)
    }
    fn version(&self) -> Value {
        T::version(self)
    }
    fn ready(&self) -> Result<(), StatusError> {
        T::ready(self)
    }
    fn ready_changed(&self) -> futures_util::future::BoxFuture<'static, ()> {
        T::ready_changed(self)
    }
    fn simulation(&self) -> Option<&dyn Simulation> {
        T::simulation(self)
    }
}

/// Request counters (the simulator's tests assert upstream load with them).
#[derive(Debug, Default)]
pub struct ApiCounters {
    /// LIST requests.
    pub lists: AtomicU64,
    /// WATCH requests.
    pub watches: AtomicU64,
    /// GETs of one object.
    pub gets: AtomicU64,
    /// Writes (creates, updates, patches, deletes) accepted by the store.
    pub writes: AtomicU64,
    /// Events posted and discarded.
    pub events_discarded: AtomicU64,
    /// Requests refused for authentication.
    pub unauthorized: AtomicU64,
    /// Watches open now, by resource.
    pub open_watches: Arc<OpenWatches>,
    /// Authenticated requests by verb, resource, response code and encoding served (a
    /// handful of each: the resources are the served ones, `events` and `other`).
    pub requests: std::sync::Mutex<BTreeMap<RequestKey, u64>>,
}

impl ApiCounters {
    /// Authenticated requests so far, by verb, resource, response code and encoding.
    pub fn requests(&self) -> BTreeMap<RequestKey, u64> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Watches open on a facade, by resource (in [`KINDS`]' order).
#[derive(Debug, Default)]
pub struct OpenWatches([AtomicU64; KINDS.len()]);

impl OpenWatches {
    /// Open watches of each served resource, by plural.
    pub fn by_resource(&self) -> Vec<(&'static str, u64)> {
        (KINDS.iter().zip(&self.0))
            .map(|(def, n)| (def.plural, n.load(Ordering::Relaxed)))
            .collect()
    }
}

/// One open watch, counted in its resource's [`OpenWatches`] while it lives.
#[derive(Debug)]
pub struct OpenWatch {
    all: Arc<OpenWatches>,
    index: usize,
}

impl OpenWatch {
    /// Counts a watch of `def` from now until it is dropped.
    pub fn of(all: &Arc<OpenWatches>, def: &KindDef) -> Self {
        let index = def.kind.index();
        all.0[index].fetch_add(1, Ordering::Relaxed);
        Self {
            all: all.clone(),
            index,
        }
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.all.0[self.index].fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a facade request is counted by: verb, resource, response code, encoding (`json` or
/// `protobuf`).
pub type RequestKey = (&'static str, &'static str, u16, &'static str);

/// A snapshot of [`ApiCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CountersSnapshot {
    /// LIST requests.
    pub lists: u64,
    /// WATCH requests.
    pub watches: u64,
    /// GET requests.
    pub gets: u64,
    /// Writes accepted.
    pub writes: u64,
    /// Events discarded.
    pub events_discarded: u64,
    /// Requests refused for authentication.
    pub unauthorized: u64,
}

impl ApiCounters {
    /// The current figures.
    pub fn snapshot(&self) -> CountersSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CountersSnapshot {
            lists: g(&self.lists),
            watches: g(&self.watches),
            gets: g(&self.gets),
            writes: g(&self.writes),
            events_discarded: g(&self.events_discarded),
            unauthorized: g(&self.unauthorized),
        }
    }
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// One API: a store and the token that opens it.
#[derive(Debug)]
pub struct Api<S> {
    store: S,
    token: crate::auth::Token,
    limits: Limits,
    watch_slots: Arc<tokio::sync::Semaphore>,
    /// Request counters.
    pub counters: ApiCounters,
}

impl<S: ApiStore> Api<S> {
    /// An API over `store`, opened by `token`, with the default limits.
    pub fn new(store: S, token: impl Into<String>) -> Self {
        Self::with_limits(store, token, Limits::default())
    }

    /// An API with explicit limits.
    pub fn with_limits(store: S, token: impl Into<String>, limits: Limits) -> Self {
        Self {
            store,
            token: crate::auth::Token::new(token),
            limits,
            watch_slots: Arc::new(tokio::sync::Semaphore::new(limits.max_watches)),
            counters: ApiCounters::default(),
        }
    }

    /// Watches this link's facade serves at most at once.
    pub fn max_watches(&self) -> usize {
        self.limits.max_watches
    }

    /// Watches open now.
    pub fn open_watches(&self) -> usize {
        self.limits
            .max_watches
            .saturating_sub(self.watch_slots.available_permits())
    }

    /// Starts draining: new watches are refused (429) and watches that end because the view
    /// let them go end with a last BOOKMARK. For shutdown; there is no way back.
    pub fn drain_watches(&self) {
        self.watch_slots.close();
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Constant-time token check.
    pub fn opens(&self, presented: &str) -> bool {
        self.token.opens(presented)
    }
}

/// The bearer token of a request, if any.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    crate::auth::bearer(headers.get(header::AUTHORIZATION)?.to_str().ok()?)
}

fn unauthorized() -> StatusError {
    StatusError::new(
        Reason::Unauthorized,
        "Unauthorized: a bearer token for this link is required",
    )
}

/// A router serving one API at the root (the simulator).
pub fn router<S: ApiStore>(api: Arc<Api<S>>) -> Router {
    Router::new()
        .fallback(root_handler::<S>)
        .with_state(api)
        .layer(list::compression())
}

async fn root_handler<S: ApiStore>(State(api): State<Arc<Api<S>>>, req: Request) -> Response {
    if !bearer(req.headers()).is_some_and(|t| api.opens(t)) {
        bump(&api.counters.unauthorized);
        return unauthorized().into_response();
    }
    let path = req.uri().path().to_owned();
    serve(&api, &path, req).await
}

/// Links served under `/links/<name>/`, each with its own token. Links can be added and removed
/// while serving (the controller does, as Link resources change); a request holds its link's
/// `Api` for its whole life, so removing a link never cuts a response short.
#[derive(Debug)]
pub struct Links<S> {
    apis: std::sync::RwLock<HashMap<String, Arc<Api<S>>>>,
}

impl<S: ApiStore> Links<S> {
    /// The links, by name.
    pub fn new(apis: HashMap<String, Arc<Api<S>>>) -> Self {
        Self {
            apis: std::sync::RwLock::new(apis),
        }
    }

    /// Serves `api` as link `name` from now on; returns the link it replaces.
    pub fn insert(&self, name: &str, api: Arc<Api<S>>) -> Option<Arc<Api<S>>> {
        self.write().insert(name.to_owned(), api)
    }

    /// Stops serving link `name`; returns it.
    pub fn remove(&self, name: &str) -> Option<Arc<Api<S>>> {
        self.write().remove(name)
    }

    /// The names of the links served.
    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    // A panic while holding the lock cannot leave the map half-changed (every change is one
    // HashMap call), so a poisoned lock is still good.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Api<S>>>> {
        self.apis
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<Api<S>>>> {
        self.apis
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Where the facade finds the link a request names: [`Links`], or the process's
/// [`crate::registry::Registry`].
pub trait Directory: Send + Sync + 'static {
    /// The store behind each link.
    type Store: ApiStore;
    /// Link `name`'s API.
    fn api(&self, name: &str) -> Option<Arc<Api<Self::Store>>>;
    /// Whether `token` opens any link (a wrong link's token gets 403, no token 401).
    fn any_opens(&self, token: &str) -> bool;
}

impl<S: ApiStore> Directory for Links<S> {
    type Store = S;

    fn api(&self, name: &str) -> Option<Arc<Api<S>>> {
        self.read().get(name).cloned()
    }

    fn any_opens(&self, token: &str) -> bool {
        self.read().values().any(|other| other.opens(token))
    }
}

/// A router serving every link of `links` under `/links/<name>/`.
pub fn links_router<D: Directory>(links: Arc<D>) -> Router {
    Router::new()
        .fallback(links_handler::<D>)
        .with_state(links)
        .layer(list::compression())
}

async fn links_handler<D: Directory>(State(links): State<Arc<D>>, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    let Some(rest) = path.strip_prefix("/links/") else {
        return not_found_path().into_response();
    };
    let (name, sub) = rest.split_once('/').map_or((rest, "/"), |(n, s)| (n, s));
    let Some(api) = links.api(name) else {
        return StatusError::new(Reason::NotFound, format!("no link named {name:?}"))
            .into_response();
    };
    match bearer(req.headers()) {
        Some(t) if api.opens(t) => {}
        Some(t) if links.any_opens(t) => {
            bump(&api.counters.unauthorized);
            return StatusError::new(
                Reason::Forbidden,
                format!("this token does not open link {name:?}"),
            )
            .into_response();
        }
        _ => {
            bump(&api.counters.unauthorized);
            return unauthorized().into_response();
        }
    }
    let sub = format!("/{}", sub.trim_start_matches('/'));
    serve(&api, &sub, req).await
}

/// Serves `router` on `listener` over plain HTTP until `shutdown` completes. (TLS serving
/// arrives with the gateway's listener.)
pub async fn serve_plain(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests;
