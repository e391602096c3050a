//! A follower's link: its view follows the Lease holder's, version for version, over one
//! stream of the holder's whole view ([`crate::kubeapi::replica`]). Consumers of every replica
//! see the same objects at the same versions, so one whose connection moves to another replica
//! resumes its watch there. The follower never reads the remote and decides nothing.
//!
//! Every stream is asked from the version the view is at (a stream that broke, a new holder
//! after a failover, the holder this replica handed the link to): the holder resumes it from
//! its history, or sends a snapshot the view takes whole ([`View::resync`]). A holder
//! that sends nothing for [`SILENCE`] (it heartbeats every
//! [`crate::kubeapi::replica::HEARTBEAT`]) counts as gone: the link says `Degraded` and keeps
//! serving its view.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use backon::BackoffBuilder as _;
use futures_util::{AsyncBufReadExt as _, StreamExt as _};
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use super::CONNECT_BACKOFF;
use crate::model::Object;
use crate::upstream::UpstreamCounters;
use crate::view::replica::Mirrored;
use crate::view::{EventType, View};

/// How long a holder may send nothing before the follower counts it gone: three heartbeats.
pub const SILENCE: Duration = Duration::from_secs(6);

use crate::kubeapi::replica::PATH;

/// Follows the holder `client` reaches, into `view`, until dropped; `synced` becomes true once
/// the view holds the holder's whole view.
pub(super) async fn follow(
    client: kube::Client,
    view: View,
    counters: Arc<UpstreamCounters>,
    synced: watch::Sender<bool>,
) {
    let mut backoffs = CONNECT_BACKOFF.build();
    // Resume from where the view is, whatever it holds: the holder resumes a version it
    // issued or followed (this view followed the last holder, or held the link itself before
    // it handed it over), and sends a snapshot for any other. A snapshot clears the history
    // consumers resume from. After a refused change, ask for a new snapshot.
    let mut resume = true;
    loop {
        let from = resume.then(|| view.resource_version());
        let outcome = follow_once(&client, &view, from, &counters, &synced).await;
        resume = *synced.borrow();
        match outcome {
            Ok(()) => {
                tracing::debug!("the holder ended its stream; asking again");
                backoffs = CONNECT_BACKOFF.build();
                continue;
            }
            Err(Broken::Refused(e)) => {
                tracing::warn!(error = %e, "a change of the holder's view did not follow the last; taking a snapshot");
                resume = false;
            }
            Err(Broken::Failed(e)) => {
                counters
                    .health
                    .failed(format_args!("following the Lease holder: {e:#}"));
                counters.errors.fetch_add(1, Ordering::Relaxed);
                counters.touch();
            }
        }
        tokio::time::sleep(backoffs.next().unwrap_or(Duration::from_secs(3))).await;
    }
}

/// Why a stream ended early.
enum Broken {
    /// It could not be read.
    Failed(anyhow::Error),
    /// Its changes did not follow the view's.
    Refused(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Broken {
    fn from(e: E) -> Self {
        Broken::Failed(e.into())
    }
}

/// One stream, from `from` (a snapshot without), until it ends or breaks. A stream that ends
/// before its first line (a peer that is no Floodgate holder, say) is a failure, retried with
/// backoff rather than at once.
async fn follow_once(
    client: &kube::Client,
    view: &View,
    from: Option<u64>,
    counters: &UpstreamCounters,
    synced: &watch::Sender<bool>,
) -> Result<(), Broken> {
    let path = match from {
        Some(rv) => format!("{PATH}?resourceVersion={rv}"),
        None => PATH.to_owned(),
    };
    tracing::debug!(%path, "asking the holder for its view");
    let request = axum::http::Request::get(&path).body(Vec::new())?;
    let body = tokio::time::timeout(SILENCE, client.request_stream(request))
        .await
        .map_err(|_| anyhow::anyhow!("the holder did not answer {path} within {SILENCE:?}"))??;
    tracing::debug!(%path, "the holder answers");
    let mut lines = Box::pin(body.lines());
    let mut snapshot: Option<Vec<(Object, u64)>> = None;
    let mut heard = false;
    loop {
        let line = tokio::time::timeout(SILENCE, lines.next())
            .await
            .map_err(|_| anyhow::anyhow!("the holder sent nothing for {SILENCE:?}"))?;
        let Some(line) = line else {
            return match heard {
                true => Ok(()),
                false => {
                    Err(anyhow::anyhow!("the holder ended {path} before its first line").into())
                }
            };
        };
        let line = line?;
        heard = true;
        counters.health.answered();
        counters.touch();
        match Frame::parse(&line)? {
            Frame::Sync => snapshot = Some(Vec::new()),
            Frame::Synced(rv) => {
                let objects = snapshot.take().context("SYNCED without SYNC")?;
                let n = objects.len();
                let changes = view.resync(rv, objects, Instant::now());
                counters.followed_snapshots.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    objects = n,
                    changes,
                    resource_version = rv,
                    "the view follows the Lease holder's"
                );
                synced.send_replace(true);
            }
            Frame::Other => {}
            Frame::Change(m) => match &mut snapshot {
                Some(objects) => objects.push((m.object, m.resource_version)),
                None => {
                    view.mirror(vec![m], Instant::now())
                        .map_err(|e| Broken::Refused(e.into()))?;
                    counters.followed_changes.fetch_add(1, Ordering::Relaxed);
                }
            },
        }
    }
}

/// One line of the holder's stream.
enum Frame {
    Sync,
    Synced(u64),
    /// `RESUMED`, `HEARTBEAT`: nothing to do but to know the holder is there.
    Other,
    Change(Mirrored),
}

impl Frame {
    fn parse(line: &str) -> anyhow::Result<Frame> {
        let mut v: Value = serde_json::from_str(line).context("a line of the holder's stream")?;
        let rv = |v: &Value| -> anyhow::Result<u64> {
            let s = v.as_str().context("no resourceVersion")?;
            s.parse().with_context(|| format!("resourceVersion {s:?}"))
        };
        let kind = match v["type"].as_str().unwrap_or_default() {
            "SYNC" => return Ok(Frame::Sync),
            "SYNCED" => return Ok(Frame::Synced(rv(&v["resourceVersion"])?)),
            "RESUMED" | "HEARTBEAT" => return Ok(Frame::Other),
            "ADDED" => EventType::Added,
            "MODIFIED" => EventType::Modified,
            "DELETED" => EventType::Deleted,
            other => anyhow::bail!("a frame of type {other:?}"),
        };
        let object = v["object"].take();
        let resource_version = rv(&object["metadata"]["resourceVersion"])?;
        let object = Object::from_json(object)
            .context("an object of the holder's stream")?
            .into_sanitized();
        Ok(Frame::Change(Mirrored {
            kind,
            object,
            resource_version,
        }))
    }
}
