//! One supervised task per link: it connects to the remote, owns the upstream watchers and the
//! churn engine, feeds the engine, sleeps until the engine's next deadline, carries out its
//! effects (stop or restart upstream) and publishes the link's state for the facade, readiness
//! and the admin API. A link that cannot reach its remote retries with backoff and reports
//! `Degraded`; nothing it does touches another link.

use std::sync::Arc;
use std::time::Duration;

use floodgate_link_crd::{LinkSpec, Phase};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::churn::flood::Trigger;
use crate::churn::quarantine::{RequestError, Transition};
use crate::kubeapi::ApiStore;
use crate::kubeapi::status::StatusError;
use crate::model::NsName;
use crate::model::{KINDS, KindDef};
use crate::persist::LinkDir;
use crate::view::replica::NewTerm;
use crate::view::{DEFAULT_HISTORY, View};

/// Upstream messages waiting for the engine. When the engine falls behind, the watchers wait:
/// the remote's watch streams buffer in the kernel instead of in our memory. 4096 is a few
/// milliseconds of the fastest ingest we measured, enough to batch without holding a flood.
pub const UPSTREAM_QUEUE: usize = 4096;

/// Messages taken from the queue before the engine is polled again.
const BATCH: usize = 1024;

/// The waits between attempts to reach a remote: from 500 ms, doubling to at most 3 s, each
/// with up to as much again of jitter, so links do not retry in step and a remote that is
/// back is reached within about 6 s (consumers are waiting).
const CONNECT_BACKOFF: backon::ExponentialBuilder = backon::ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(500))
    .with_max_delay(Duration::from_secs(3))
    .with_jitter()
    .without_max_times();

mod mirror;
mod pace;
mod persist;
mod state;
mod task;
mod wire;

pub use pace::{DEFAULT_LINK_STARTS_PER_SECOND, Pacer};
pub use state::{
    ContainedService, ContainmentStatus, EngineStatus, LinkState, QuarantineStatus, UpstreamStatus,
};

/// An operator's request to a link.
#[derive(Debug)]
pub enum Command {
    /// Release a quarantined link; the string says who asked.
    Release(String, oneshot::Sender<Result<Transition, RequestError>>),
    /// Contain a service the Lease holder recorded contained.
    FollowContainment(NsName, Trigger),
    /// Release a contained service; the string says who asked.
    ReleaseService(
        NsName,
        String,
        oneshot::Sender<Result<Transition, RequestError>>,
    ),
    /// Act on floods (the Lease holder, or standalone) or only measure them (another replica
    /// holds the link's Lease and decides).
    SetDeciding(bool),
    /// Quarantine the link, with a message.
    Quarantine(String, oneshot::Sender<Result<Transition, RequestError>>),
    /// Reach the remote this new way (rotated credentials): the upstream reconnects and
    /// relists while the view, its versions and its watches carry on. A link that followed
    /// the holder takes it over in the term given.
    Reconnect(Reconnect, NewTerm),
    /// Follow the Lease holder's view, version for version, through its facade (this way):
    /// the upstream stops and the engine publishes nothing until a [`Command::Reconnect`]
    /// takes the link over from the view followed.
    Follow(Reconnect),
    /// Stop reading the remote, and serve the view as it is until told where to read from
    /// ([`Command::Reconnect`]); the string says why.
    Disconnect(String),
}

/// New credentials for a link: how to reach its remote from now on.
pub struct Reconnect(pub Connect);

impl std::fmt::Debug for Reconnect {
    // A connect function holds credentials: nothing of it is printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reconnect(..)")
    }
}

/// A running link.
#[derive(Debug)]
pub struct LinkHandle {
    /// Its name.
    pub name: String,
    /// What it publishes.
    pub view: View,
    /// Its state, updated after every engine step.
    pub state: watch::Receiver<LinkState>,
    /// The remote's `/version`, once known.
    pub version: watch::Receiver<Option<Value>>,
    /// Whether the remote serves Linkerd's Servers, once known.
    pub has_servers: watch::Receiver<bool>,
    transitions: broadcast::Sender<Transition>,
    commands: mpsc::Sender<Command>,
    task: JoinHandle<()>,
}

impl LinkHandle {
    /// Every service containment transition from now on, as it happens.
    pub fn transitions(&self) -> broadcast::Receiver<Transition> {
        self.transitions.subscribe()
    }

    /// Asks the link to release its quarantine; `by` says who asks ("an operator through the
    /// admin API"), for logs, Events and status.
    pub async fn release(&self, by: &str) -> Result<Transition, LinkError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Release(by.to_owned(), tx))
            .await
            .map_err(|_| LinkError::Stopped)?;
        rx.await
            .map_err(|_| LinkError::Stopped)?
            .map_err(LinkError::Refused)
    }

    /// Asks the link to quarantine itself.
    pub async fn quarantine(&self, message: String) -> Result<Transition, LinkError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Quarantine(message, tx))
            .await
            .map_err(|_| LinkError::Stopped)?;
        rx.await
            .map_err(|_| LinkError::Stopped)?
            .map_err(LinkError::Refused)
    }

    /// Asks the link to release one contained service; `by` says who asks.
    pub async fn release_service(&self, svc: NsName, by: &str) -> Result<Transition, LinkError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::ReleaseService(svc, by.to_owned(), tx))
            .await
            .map_err(|_| LinkError::Stopped)?;
        rx.await
            .map_err(|_| LinkError::Stopped)?
            .map_err(LinkError::Refused)
    }

    /// Contains `svc` as the Lease holder recorded it (no answer: following is best effort,
    /// and the next status tick tries again).
    pub async fn follow_containment(&self, svc: NsName, trigger: Trigger) -> Result<(), LinkError> {
        self.commands
            .send(Command::FollowContainment(svc, trigger))
            .await
            .map_err(|_| LinkError::Stopped)
    }

    /// Makes the link act on the floods it measures (`true`: it holds the link's Lease, or runs
    /// standalone) or only measure them and follow the holder's record (`false`).
    pub async fn set_deciding(&self, deciding: bool) -> Result<(), LinkError> {
        self.commands
            .send(Command::SetDeciding(deciding))
            .await
            .map_err(|_| LinkError::Stopped)
    }

    /// Swaps how the link reaches its remote (new credentials): the upstream watchers stop,
    /// the link connects again and relists, and only real differences reach the view, whose
    /// consumers keep their watches and versions.
    /// A link that followed the holder takes it over from its view, in a term of its own
    /// (`term`, which the caller makes from the Lease); any other link leaves `term` unused.
    pub async fn reconnect(&self, connect: Connect, term: NewTerm) -> Result<(), LinkError> {
        self.commands
            .send(Command::Reconnect(Reconnect(connect), term))
            .await
            .map_err(|_| LinkError::Stopped)
    }

    /// Makes the link's view follow the Lease holder's, version for version, through the
    /// holder's facade (`connect` reaches it): consumers of every replica see the same objects
    /// at the same versions. A later [`LinkHandle::reconnect`] takes the link over from there.
    pub async fn follow(&self, connect: Connect) -> Result<(), LinkError> {
        self.commands
            .send(Command::Follow(Reconnect(connect)))
            .await
            .map_err(|_| LinkError::Stopped)
    }

    /// Stops reading the remote (in cluster mode: the link is being handed to another replica,
    /// which must not read it at the same time); the view keeps serving, and a later
    /// [`LinkHandle::reconnect`] reads again. `why` becomes the link's message.
    pub async fn disconnect(&self, why: String) -> Result<(), LinkError> {
        self.commands
            .send(Command::Disconnect(why))
            .await
            .map_err(|_| LinkError::Stopped)
    }

    /// True when the link's task has ended (it only ends on shutdown).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

/// Why an operator's request failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The transition makes no sense in the link's state (HTTP 409).
    #[error("{0}")]
    Refused(RequestError),
    /// The link's task is gone.
    #[error("the link is stopped")]
    Stopped,
}

/// How a link reaches its remote: a function that builds a client (from a kubeconfig file, or
/// a Secret in cluster mode), retried with backoff until it works.
pub type Connect = Arc<
    dyn Fn() -> futures_util::future::BoxFuture<'static, anyhow::Result<kube::Client>>
        + Send
        + Sync,
>;

/// Starts a link's task. With a state directory, the link's quarantine survives restarts.
pub fn spawn(
    name: &str,
    spec: LinkSpec,
    connect: Connect,
    incarnation: u32,
    dir: Option<LinkDir>,
    shutdown: watch::Receiver<bool>,
) -> LinkHandle {
    spawn_restored(name, spec, connect, incarnation, dir, None, shutdown)
}

/// [`spawn`] for a link that starts quarantined with `seed`'s view (in cluster mode, the
/// last good view a peer serves): it serves that view at once and starts its upstream only
/// when released.
pub fn spawn_restored(
    name: &str,
    spec: LinkSpec,
    connect: Connect,
    incarnation: u32,
    dir: Option<LinkDir>,
    seed: Option<crate::churn::restore::Saved>,
    shutdown: watch::Receiver<bool>,
) -> LinkHandle {
    let view = View::new(incarnation, DEFAULT_HISTORY);
    let (state_tx, state) = watch::channel(LinkState {
        phase: Phase::Degraded,
        message: "connecting to the remote".into(),
        ..Default::default()
    });
    let (version_tx, version) = watch::channel(None);
    let (servers_tx, has_servers) = watch::channel(false);
    // Operators' requests are rare; 16 is plenty, and a full queue makes the caller wait.
    let (commands_tx, commands) = mpsc::channel(16);
    // Transitions are rare; a receiver that falls 64 behind misses some (it is told so).
    let (transitions, _) = broadcast::channel(64);
    let out = state::Outputs {
        state: state_tx,
        transitions: transitions.clone(),
        version: version_tx,
        has_servers: servers_tx,
    };
    let wire = wire::Network {
        selector: spec.select.services.clone(),
        linkerd_namespace: spec.target_cluster_linkerd_namespace.clone(),
    };
    let setup = task::Setup {
        spec,
        view: view.clone(),
        connect,
        dir,
        seed,
    };
    let link = task::LinkTask::new(wire, setup, out, commands, shutdown);
    let task = tokio::spawn(
        link.run()
            .instrument(tracing::info_span!("link", link = %name)),
    );
    LinkHandle {
        name: name.to_owned(),
        view,
        state,
        version,
        has_servers,
        transitions,
        commands: commands_tx,
        task,
    }
}

/// What the facade serves for one link: its view, once synced, with the remote's version and
/// resources.
#[derive(Debug)]
pub struct LinkStore {
    name: String,
    view: View,
    state: watch::Receiver<LinkState>,
    version: watch::Receiver<Option<Value>>,
    has_servers: watch::Receiver<bool>,
}

impl LinkStore {
    /// The facade's store for a running link.
    pub fn new(link: &LinkHandle) -> Self {
        Self {
            name: link.name.clone(),
            view: link.view.clone(),
            state: link.state.clone(),
            version: link.version.clone(),
            has_servers: link.has_servers.clone(),
        }
    }
}

impl ApiStore for LinkStore {
    fn view(&self) -> &View {
        &self.view
    }

    fn served(&self) -> Vec<&'static KindDef> {
        let servers = *self.has_servers.borrow();
        KINDS
            .iter()
            .filter(|r| servers || r.kind != crate::model::Kind::Server)
            .collect()
    }

    fn version(&self) -> Value {
        self.version
            .borrow()
            .clone()
            .unwrap_or_else(crate::kubeapi::resource::default_version)
    }

    fn ready_changed(&self) -> futures_util::future::BoxFuture<'static, ()> {
        let mut state = self.state.clone();
        Box::pin(async move {
            if state.wait_for(|s| s.synced).await.is_err() {
                // The link is gone: it never syncs; the caller's deadline ends the wait.
                std::future::pending::<()>().await;
            }
        })
    }

    fn ready(&self) -> Result<(), StatusError> {
        let s = self.state.borrow();
        if s.synced {
            Ok(())
        } else {
            let why = if s.message.is_empty() {
                "it is still listing the remote".to_owned()
            } else {
                s.message.clone()
            };
            Err(StatusError::unavailable(
                format!("link {} has not completed its first sync: {why}", self.name),
                1,
            ))
        }
    }
}

#[cfg(test)]
mod tests;
