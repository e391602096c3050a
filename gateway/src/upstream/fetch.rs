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
use crate::churn::{Answer, Change, Fetch, Fetched};
use crate::model::{Kind, Object};

/// Pod GETs in flight at once for one link: enough to fill a start-up's gaps in a few round
/// trips, few enough that the remote never sees a burst from us.
const FETCH_CONCURRENCY: usize = 8;

/// Whether the remote answered a GET with a refusal that asking again would not change (401,
/// 403, 400, ...), rather than a failure to answer it now: a 429 or a 5xx (an API server
/// overloaded or restarting, as in the incidents) is asked again, since the pod may well be
/// there and no event of it may come.
pub(super) fn refusal(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 408 && s.code != 429)
}

/// Fetches the pods the engine asked for ([`crate::churn::Effect::FetchPods`]) and sends each
/// answer as [`Change::Fetched`]: the pod, or its absence, or the remote's failure to answer.
/// A pod refused as the watcher refuses it is absent (the watcher refuses its events too), and
/// so is one the remote refuses to GET (403, say: the pod watcher, which lists and watches,
/// still brings it), so neither is asked for again. A remote that did not answer, or answered
/// that it cannot now (429, 5xx), fails, and the engine asks again.
pub async fn fetch_pods(
    client: Client,
    fetch: Fetch,
    generation: u64,
    tx: mpsc::Sender<Message>,
    counters: Arc<UpstreamCounters>,
) {
    let ticket = fetch.ticket;
    let mut results = futures_util::stream::iter(fetch.pods)
        .map(|id| {
            let api = Api::<Wire<Pod>>::namespaced(client.clone(), &id.namespace);
            async move { (api.get_opt(&id.name).await, id) }
        })
        .buffer_unordered(FETCH_CONCURRENCY);
    // One line a batch, not one a pod. A refusal is a WARN: it is not asked again. A remote
    // that did not answer is asked again, and the link reports its outage itself: DEBUG.
    let mut refused: Option<(usize, String)> = None;
    while let Some((result, pod)) = results.next().await {
        let answer = match result {
            // Admitted as the pod watcher admits pods.
            Ok(Some(w)) => match wired(w, |p| Object::Pod(Arc::new(super::trim::pod(p).into()))) {
                Ok(found) => Answer::Found(found),
                Err(why) => {
                    refuse(Kind::Pod, why, &counters);
                    Answer::Absent
                }
            },
            Ok(None) => Answer::Absent,
            Err(e @ kube::Error::Api(_)) if refusal(&e) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                let (n, _) = refused.get_or_insert_with(|| (0, format!("{pod}: {e}")));
                *n += 1;
                Answer::Absent
            }
            Err(e) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%pod, error = %e, "fetching a pod failed; asked again later");
                Answer::Failed
            }
        };
        let change = Change::Fetched(Fetched {
            ticket,
            pod,
            answer,
        });
        if !Message::send(&tx, generation, change, tokio::time::Instant::now()).await {
            return;
        }
    }
    if let Some((pods, first)) = refused {
        tracing::warn!(
            pods,
            first = %first,
            "the remote refused fetching pods; each is served from its next event"
        );
    }
}
