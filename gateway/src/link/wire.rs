//! What a link's task does over the network, behind a trait: [`Network`] reaches a real remote
//! with a kube client; the task's tests give it a fake that needs no socket.

use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder as _;
use floodgate_link_crd::Phase;
use futures_util::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::state::Outputs;
use super::{CONNECT_BACKOFF, Connect};
use crate::churn::Fetch;
use crate::model::Kind;
use crate::model::wanted::WantedPods;
use crate::upstream::{self, Message, Remote, Upstream, UpstreamCounters};
use crate::view::View;

/// A link's remote, as its task uses it.
pub(crate) trait Wire: Send + Sync + 'static {
    /// A remote that answered.
    type Remote: Send + Sync + 'static;
    /// The watchers of one upstream run; dropping them stops them.
    type Watchers: Watchers;

    /// Connects once with `connect`'s credentials: the remote, what it serves and its version,
    /// or why it cannot be reached.
    fn dial(&self, connect: &Connect) -> BoxFuture<'static, anyhow::Result<Dialed<Self::Remote>>>;

    /// Starts the watchers of one upstream run: they send what they see to `tx`, tagged with
    /// `generation`, and decode only the pods `wanted` names.
    fn watch(
        &self,
        remote: &Self::Remote,
        generation: u64,
        tx: mpsc::Sender<Message>,
        counters: Arc<UpstreamCounters>,
        wanted: WantedPods,
    ) -> Self::Watchers;

    /// Fetches the pods and sends each answer as [`crate::churn::Change::Fetched`].
    fn fetch_pods(
        &self,
        remote: &Self::Remote,
        fetch: Fetch,
        generation: u64,
        tx: mpsc::Sender<Message>,
        counters: Arc<UpstreamCounters>,
    ) -> BoxFuture<'static, ()>;

    /// Follows the view of the Lease holder whose facade `remote` is into `view`, version for
    /// version, until dropped; `synced` becomes true once `view` holds the holder's whole view.
    fn follow(
        &self,
        remote: &Self::Remote,
        view: View,
        counters: Arc<UpstreamCounters>,
        synced: watch::Sender<bool>,
    ) -> BoxFuture<'static, ()>;
}

/// The running watchers of one upstream run.
pub(crate) trait Watchers: Send + 'static {
    /// The engine has taken in `kind`'s first list ([`Upstream::listed`]): true when that
    /// opened the pod watcher.
    fn listed(&self, kind: Kind) -> bool;
}

/// A remote that answered.
pub(crate) struct Dialed<R> {
    /// The remote.
    pub remote: R,
    /// The kinds it serves.
    pub kinds: Vec<Kind>,
    /// Its `/version`.
    pub version: Option<Value>,
}

/// The remote's API server, over the network.
pub(crate) struct Network {
    /// The link's service selector.
    pub selector: LabelSelector,
    /// The remote's Linkerd namespace (`targetClusterLinkerdNamespace`).
    pub linkerd_namespace: String,
}

impl Wire for Network {
    type Remote = Remote;
    type Watchers = Upstream;

    fn dial(&self, connect: &Connect) -> BoxFuture<'static, anyhow::Result<Dialed<Remote>>> {
        let (connect, selector) = (connect.clone(), self.selector.clone());
        let linkerd_namespace = self.linkerd_namespace.clone();
        Box::pin(async move {
            let client = connect().await?;
            let version = client.apiserver_version().await?;
            let remote = Remote::discover(client, &selector, &linkerd_namespace).await?;
            Ok(Dialed {
                kinds: remote.kinds(),
                version: serde_json::to_value(version).ok(),
                remote,
            })
        })
    }

    fn watch(
        &self,
        remote: &Remote,
        generation: u64,
        tx: mpsc::Sender<Message>,
        counters: Arc<UpstreamCounters>,
        wanted: WantedPods,
    ) -> Upstream {
        upstream::start(remote, generation, tx, counters, wanted)
    }

    fn fetch_pods(
        &self,
        remote: &Remote,
        fetch: Fetch,
        generation: u64,
        tx: mpsc::Sender<Message>,
        counters: Arc<UpstreamCounters>,
    ) -> BoxFuture<'static, ()> {
        Box::pin(upstream::fetch_pods(
            remote.client.clone(),
            fetch,
            generation,
            tx,
            counters,
        ))
    }

    fn follow(
        &self,
        remote: &Remote,
        view: View,
        counters: Arc<UpstreamCounters>,
        synced: watch::Sender<bool>,
    ) -> BoxFuture<'static, ()> {
        Box::pin(super::mirror::follow(
            remote.client.clone(),
            view,
            counters,
            synced,
        ))
    }
}

impl Watchers for Upstream {
    fn listed(&self, kind: Kind) -> bool {
        Upstream::listed(self, kind)
    }
}

/// Connects until the remote answers (`/version` and discovery, over the network). Errors are reported in the
/// link's state as they happen (a quarantined link keeps its quarantine message); the future
/// only ends with a remote.
pub(super) async fn connect_with_backoff<W: Wire>(
    wire: Arc<W>,
    connect: Connect,
    out: Arc<Outputs>,
) -> Dialed<W::Remote> {
    let mut backoffs = CONNECT_BACKOFF.build();
    // The first failure is logged at WARN, the retries at DEBUG, and once more at WARN if the
    // remote stays away past a minute.
    let mut failing: Option<(Instant, bool)> = None;
    loop {
        match wire.dial(&connect).await {
            Ok(dialed) => {
                if let Some((since, _)) = failing {
                    tracing::info!(away = ?since.elapsed(), "the remote answers again");
                }
                return dialed;
            }
            Err(e) => {
                match &mut failing {
                    None => {
                        tracing::warn!(error = %e, "cannot reach the remote; retrying with backoff");
                        failing = Some((Instant::now(), false));
                    }
                    Some((since, noted @ false))
                        if since.elapsed() >= crate::upstream::health::LONG_OUTAGE =>
                    {
                        tracing::warn!(error = %e, away = ?since.elapsed(), "the remote is still unreachable");
                        *noted = true;
                    }
                    Some(_) => tracing::debug!(error = %e, "cannot reach the remote"),
                }
                let message = format!("cannot reach the remote: {e}");
                out.state.send_modify(|s| {
                    if s.phase != Phase::Quarantined {
                        s.phase = Phase::Degraded;
                        s.message.clone_from(&message);
                    }
                });
            }
        }
        // Without a limit on attempts, the builder never runs out.
        tokio::time::sleep(backoffs.next().unwrap_or(Duration::from_secs(3))).await;
    }
}
