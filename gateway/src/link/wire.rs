//! What a link's task does over the network, behind a trait: [`Network`] reaches a real remote
//! with a kube client; the task's tests give it a fake that needs no socket.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;
use tokio::sync::mpsc;

use super::Connect;
use crate::model::wanted::WantedPods;
use crate::model::{Kind, NsName};
use crate::upstream::{self, Message, Remote, Upstream, UpstreamCounters};

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

    /// Fetches `pods` and sends each as [`crate::churn::Change::Fetched`].
    fn fetch_pods(
        &self,
        remote: &Self::Remote,
        pods: Vec<NsName>,
        generation: u64,
        tx: mpsc::Sender<Message>,
        counters: Arc<UpstreamCounters>,
    ) -> BoxFuture<'static, ()>;
}

/// The running watchers of one upstream run.
pub(crate) trait Watchers: Send + 'static {
    /// The engine has taken in `kind`'s first list ([`Upstream::listed`]).
    fn listed(&self, kind: Kind);
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
}

impl Wire for Network {
    type Remote = Remote;
    type Watchers = Upstream;

    fn dial(&self, connect: &Connect) -> BoxFuture<'static, anyhow::Result<Dialed<Remote>>> {
        let (connect, selector) = (connect.clone(), self.selector.clone());
        Box::pin(async move {
            let client = connect().await?;
            let version = client.apiserver_version().await?;
            let remote = Remote::discover(client, &selector).await?;
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
        pods: Vec<NsName>,
        generation: u64,
        tx: mpsc::Sender<Message>,
        counters: Arc<UpstreamCounters>,
    ) -> BoxFuture<'static, ()> {
        Box::pin(upstream::fetch_pods(
            remote.client.clone(),
            pods,
            generation,
            tx,
            counters,
        ))
    }
}

impl Watchers for Upstream {
    fn listed(&self, kind: Kind) {
        Upstream::listed(self, kind);
    }
}
