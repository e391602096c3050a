//! Pods fetched one by one: those the engine asks for ([`crate::churn::Effect::FetchPods`]),
//! a few GETs at a time, admitted as the pod watcher admits pods.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use tokio::sync::mpsc;

use super::admit::{refuse, wired};
use super::wire::Wire;
use super::{Message, UpstreamCounters};
use crate::churn::Change;
use crate::model::{Kind, NsName, Object};

/// Pod GETs in flight at once for one link: enough to fill a start-up's gaps in a few round
/// trips, few enough that the remote never sees a burst from us.
const FETCH_CONCURRENCY: usize = 8;

/// Fetches pods the engine asked for ([`crate::churn::Effect::FetchPods`]) and sends each one
/// found as [`Change::Fetched`]. A pod that is gone is skipped: its absence is the answer.
pub async fn fetch_pods(
    client: Client,
    pods: Vec<NsName>,
    generation: u64,
    tx: mpsc::Sender<Message>,
    counters: Arc<UpstreamCounters>,
) {
    let mut results = futures_util::stream::iter(pods)
        .map(|id| {
            let api = Api::<Wire<Pod>>::namespaced(client.clone(), &id.namespace);
            async move { (api.get_opt(&id.name).await, id) }
        })
        .buffer_unordered(FETCH_CONCURRENCY);
    // One line a batch, not one a pod: a batch fails whole when the remote is down.
    let mut failed: Option<(usize, String)> = None;
    while let Some((result, id)) = results.next().await {
        let change = match result {
            // Admitted as the pod watcher admits pods.
            Ok(Some(w)) => match wired(w, |p| Object::Pod(Arc::new(super::trim::pod(p).into()))) {
                Ok(pod) => Change::Fetched(pod),
                Err(why) => {
                    refuse(Kind::Pod, why, &counters);
                    continue;
                }
            },
            Ok(None) => continue,
            Err(e) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(pod = %id, error = %e, "fetching a pod failed");
                let (n, _) = failed.get_or_insert_with(|| (0, format!("{id}: {e}")));
                *n += 1;
                continue;
            }
        };
        if tx.send(Message { generation, change }).await.is_err() {
            return;
        }
    }
    if let Some((pods, first)) = failed {
        tracing::warn!(pods, first = %first, "fetching pods failed; each is served from its next event");
    }
}
