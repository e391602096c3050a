//! The gRPC server (`floodgate.v1`, see `proto/floodgate/v1/mirror.proto`): endpoint snapshots
//! of each link's published view for native consumers, the list of links, and the standard
//! `grpc.health.v1` service.
//!
//! Requests flow: bearer token (constant-time, per link) -> `WatchEndpoints` spawns one task per
//! stream ([`stream`]) that follows the link's [`crate::view::View`] through its own index
//! ([`index`]) and builds snapshots ([`snapshot`]) into a bounded channel; `ListLinks` reads
//! the links' state. Streams end on shutdown (the same watch as the other listeners), the
//! health service says NOT_SERVING first.
//!
//! Authorization is least privilege, like the facade's: a token opens exactly its own link.
//! `ListLinks` lists only the link the presented token opens; an unauthenticated caller learns
//! nothing, not even which links exist.

pub mod index;
pub mod snapshot;
pub mod stream;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use floodgate_proto::v1::mirror_server::{Mirror, MirrorServer};
use floodgate_proto::v1::{
    EndpointSnapshot, LinkSummary, ListLinksRequest, ListLinksResponse, WatchEndpointsRequest,
};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;

use crate::link::{LinkHandle, LinkState};
use crate::model::NsName;
use crate::view::View;

/// Streams open at once per link before new ones get RESOURCE_EXHAUSTED: the facade's watch
/// limit. Each costs a task, an index of pointers and [`stream::STREAM_BUFFER`] snapshots.
pub const MAX_STREAMS_PER_LINK: usize = 10_000;

/// How long streams and connections get to finish after shutdown is signalled, before the
/// server is dropped (a health `Watch` never ends by itself).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// What the gRPC server needs of one link. Its `Debug` leaves the token out.
pub struct MirrorLink {
    /// Its name.
    pub name: String,
    /// The token that opens it.
    token: crate::auth::Token,
    /// What it publishes.
    pub view: View,
    /// Its state (phase, sync, counters).
    pub state: watch::Receiver<LinkState>,
    streams: Arc<Semaphore>,
}

impl std::fmt::Debug for MirrorLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorLink")
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field(
                "streams_open",
                &(MAX_STREAMS_PER_LINK - self.streams.available_permits()),
            )
            .finish_non_exhaustive()
    }
}

impl MirrorLink {
    /// A link served over gRPC, opened by `token`.
    pub fn new(name: &str, token: &str, view: View, state: watch::Receiver<LinkState>) -> Self {
        Self {
            name: name.to_owned(),
            token: crate::auth::Token::new(token),
            view,
            state,
            streams: Arc::new(Semaphore::new(MAX_STREAMS_PER_LINK)),
        }
    }

    /// The gRPC view of a running link.
    pub fn of(link: &LinkHandle, token: &str) -> Self {
        Self::new(&link.name, token, link.view.clone(), link.state.clone())
    }

    fn opens(&self, presented: &str) -> bool {
        self.token.opens(presented)
    }
}

/// Where the gRPC service finds its links: a fixed set, or the process's
/// [`crate::registry::Registry`], which links join and leave while it serves.
pub trait Directory: Send + Sync + std::fmt::Debug + 'static {
    /// Link `name`.
    fn link(&self, name: &str) -> Option<Arc<MirrorLink>>;
    /// Every link.
    fn links(&self) -> Vec<Arc<MirrorLink>>;
}

impl Directory for HashMap<String, Arc<MirrorLink>> {
    fn link(&self, name: &str) -> Option<Arc<MirrorLink>> {
        self.get(name).cloned()
    }
    fn links(&self) -> Vec<Arc<MirrorLink>> {
        self.values().cloned().collect()
    }
}

/// How often the health service looks at whether every link has synced (links come and go
/// in cluster mode, so there is no fixed set of states to wait on).
const HEALTH_POLL: Duration = Duration::from_millis(250);

/// The `floodgate.v1.Mirror` service.
#[derive(Clone, Debug)]
pub struct MirrorService {
    links: Arc<dyn Directory>,
    shutdown: watch::Receiver<bool>,
}

/// The bearer token of a call, if any.
fn bearer(meta: &MetadataMap) -> Option<&str> {
    crate::auth::bearer(meta.get("authorization")?.to_str().ok()?)
}

/// A watched service: "namespace/name", both non-empty; empty for every service.
pub fn parse_service(s: &str) -> Result<Option<NsName>, Status> {
    if s.is_empty() {
        return Ok(None);
    }
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(Some(NsName::new(ns, name)))
        }
        _ => Err(Status::invalid_argument(format!(
            "service {s:?} is not \"namespace/name\" (leave it empty for every service)"
        ))),
    }
}

impl MirrorService {
    /// The service over these links, ending its streams when `shutdown` turns true.
    pub fn new(
        links: impl IntoIterator<Item = MirrorLink>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let links: HashMap<String, Arc<MirrorLink>> = links
            .into_iter()
            .map(|l| (l.name.clone(), Arc::new(l)))
            .collect();
        Self::over(Arc::new(links), shutdown)
    }

    /// The service over a directory of links that may change while it serves.
    pub fn over(links: Arc<dyn Directory>, shutdown: watch::Receiver<bool>) -> Self {
        Self { links, shutdown }
    }

    /// The link the call's token opens, or UNAUTHENTICATED.
    fn caller(&self, meta: &MetadataMap) -> Result<Arc<MirrorLink>, Status> {
        let unauthenticated = || {
            Status::unauthenticated(
                "a link's bearer token is required (authorization: Bearer <token>)",
            )
        };
        let token = bearer(meta).ok_or_else(unauthenticated)?;
        // Compare with every link, without stopping at the first match.
        let mut found = None;
        for l in self.links.links() {
            if l.opens(token) {
                found = Some(l);
            }
        }
        found.ok_or_else(unauthenticated)
    }

    /// Link `name`, if the call's token opens it.
    fn authorize(&self, meta: &MetadataMap, name: &str) -> Result<Arc<MirrorLink>, Status> {
        let caller = self.caller(meta)?;
        let Some(link) = self.links.link(name) else {
            return Err(Status::not_found(format!("no link named {name:?}")));
        };
        if !Arc::ptr_eq(&caller, &link) {
            return Err(Status::permission_denied(format!(
                "this token does not open link {name:?}"
            )));
        }
        Ok(link)
    }
}

fn summary(link: &MirrorLink) -> LinkSummary {
    let s = link.state.borrow();
    let c = &s.counters;
    LinkSummary {
        name: link.name.clone(),
        phase: s.phase.as_str().to_owned(),
        reason: s
            .quarantine
            .reason
            .clone()
            .unwrap_or_else(|| s.message.clone()),
        services: c.services,
        endpoints_published: c.endpoints_published,
        endpoints_truncated: c.endpoints_truncated,
        synced: s.synced,
        message: s.message.clone(),
        upstream_events: c.upstream_events,
        downstream_updates: c.downstream_updates,
        throttled: c.throttled,
        coalesced: c.coalesced,
    }
}

type SnapshotStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<EndpointSnapshot, Status>> + Send>>;

#[tonic::async_trait]
impl Mirror for MirrorService {
    type WatchEndpointsStream = SnapshotStream;

    async fn watch_endpoints(
        &self,
        request: Request<WatchEndpointsRequest>,
    ) -> Result<Response<Self::WatchEndpointsStream>, Status> {
        let link = self.authorize(request.metadata(), &request.get_ref().link)?;
        let only = parse_service(&request.get_ref().service)?;
        let slot = link.streams.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "link {:?} has {MAX_STREAMS_PER_LINK} streams open",
                link.name
            ))
        })?;
        let (tx, rx) = mpsc::channel(stream::STREAM_BUFFER);
        let span = tracing::info_span!(
            "grpc_watch",
            link = %link.name,
            service = %request.get_ref().service,
            peer = ?request.remote_addr(),
        );
        tokio::spawn(tracing::Instrument::instrument(
            stream::run(link, only, tx, self.shutdown.clone(), slot),
            span,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn list_links(
        &self,
        request: Request<ListLinksRequest>,
    ) -> Result<Response<ListLinksResponse>, Status> {
        let link = self.caller(request.metadata())?;
        Ok(Response::new(ListLinksResponse {
            links: vec![summary(&link)],
        }))
    }
}

/// Why the gRPC server stopped.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    /// The server's transport failed (not retryable in this process: the listener is gone).
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// TLS for the gRPC listener: the facade's certificate and key (PEM).
pub fn tls_config(cert_pem: &str, key_pem: &str) -> tonic::transport::ServerTlsConfig {
    tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(cert_pem, key_pem))
}

/// Sets the health of the whole server (`""`) and of `floodgate.v1.Mirror` together.
async fn set_health(reporter: &tonic_health::server::HealthReporter, status: ServingStatus) {
    reporter
        .set_service_status(
            <MirrorServer<MirrorService> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
    reporter.set_service_status("", status).await;
}

/// Serves `floodgate.v1.Mirror` and `grpc.health.v1.Health` on `listener` until `shutdown`
/// turns true. Health is NOT_SERVING until every link has synced, SERVING then, and
/// NOT_SERVING again as soon as shutdown begins; streams and connections then get
/// [`SHUTDOWN_GRACE`] to finish.
pub async fn serve(
    listener: TcpListener,
    service: MirrorService,
    tls: Option<tonic::transport::ServerTlsConfig>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), GrpcError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    set_health(&reporter, ServingStatus::NotServing).await;
    let links = service.links.clone();
    let mut stop = shutdown.clone();
    let signal = async move {
        let all_synced = async {
            let mut serving = false;
            loop {
                let mut states: Vec<_> = links.links().iter().map(|l| l.state.clone()).collect();
                let now = states.iter_mut().all(|s| s.borrow_and_update().synced);
                if now != serving {
                    serving = now;
                    let status = if now {
                        ServingStatus::Serving
                    } else {
                        ServingStatus::NotServing
                    };
                    set_health(&reporter, status).await;
                }
                // Wake on any link's change at once, and now and then for links that joined.
                if states.is_empty() {
                    tokio::time::sleep(HEALTH_POLL).await;
                    continue;
                }
                let any = futures_util::future::select_all(
                    states.iter_mut().map(|s| Box::pin(s.changed())),
                );
                tokio::select! {
                    (changed, _, _) = any => {
                        // A link that ended (shutdown) changes no more: do not spin on it.
                        if changed.is_err() {
                            tokio::time::sleep(HEALTH_POLL).await;
                        }
                    }
                    () = tokio::time::sleep(HEALTH_POLL) => {}
                }
            }
        };
        tokio::select! {
            _ = stop.wait_for(|s| *s) => {}
            () = all_synced => {}
        }
        set_health(&reporter, ServingStatus::NotServing).await;
    };
    let mut builder = tonic::transport::Server::builder()
        // Find consumers that vanished without closing (their streams hold a task each).
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    let server = builder
        .add_service(health)
        .add_service(MirrorServer::new(service))
        // Each streamed update is a small write: without TCP_NODELAY it would wait for the
        // consumer's delayed ACK (about 40 ms).
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            signal,
        );
    let mut stop = shutdown;
    let forced = async move {
        let _ = stop.wait_for(|s| *s).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        r = server => r?,
        () = forced => tracing::debug!("gRPC connections still open after the grace period: dropped"),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
