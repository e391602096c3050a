//! What makes a Link reconciled: kube-runtime's [`Controller`] over the Links of the
//! namespace, with the Secrets they name as watched objects. A Link is reconciled when its
//! spec changes (its generation: status writes and command annotations are not reconciles) and
//! when a Secret it names appears, changes or goes, so a credentials rotation takes effect as
//! soon as the watch delivers it. Both kinds are read from reflector caches: a reconcile does
//! no I/O.
//!
//! The reconciler computes what should run ([`reconcile::desired`]) and hands it to the loop
//! that owns the running links ([`super::serve`]), which starts, restarts or stops them. A
//! deleted Link is not reconciled (the Controller drops what its cache no longer holds); the
//! loop stops the runs of Links its cache no longer has.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use floodgate_link_crd::Link;
use futures_util::{Stream, StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, predicates, reflector, watcher};
use kube::{Api, ResourceExt as _};
use tokio::sync::{mpsc, watch};

use super::reconcile::{self, Blocked, DesiredLink};

/// What the reconciler found for one Link.
#[derive(Debug)]
pub struct Reconciled {
    /// The Link as the cache held it.
    pub link: Arc<Link>,
    /// How it should run, or why it cannot.
    pub desired: Result<DesiredLink, Blocked>,
}

/// The loop that owns the links has stopped: the process is shutting down.
#[derive(Debug, thiserror::Error)]
#[error("the controller's loop has stopped")]
pub struct LoopStopped;

struct Context {
    /// Where the Secrets are (the credentials namespace).
    secrets_namespace: String,
    secrets: Store<Secret>,
    /// Why the Secrets' watch last failed, for a Link blocked until they are listed.
    secrets_error: Arc<Mutex<Option<String>>>,
    found: mpsc::Sender<Reconciled>,
}

/// How long a reconcile waits for the Secrets' first list before it reports the Link
/// blocked on them (and tries again as long later).
const SECRETS_LISTED: Duration = Duration::from_secs(10);

/// Reconciles waiting for the loop that owns the links; a full queue holds the next reconcile
/// back (the Controller keeps scheduling and deduplicating meanwhile).
const FOUND_QUEUE: usize = 64;

/// Starts the Controller on the Links of `links`' namespace and the Secrets of `secrets`'
/// (the credentials namespace), until `shutdown`. Returns
/// the Links' cache (every change, status included, as the watch delivers it), what each
/// reconcile finds, and the Controller's task (the caller watches it: it ends only at
/// shutdown).
pub fn start(
    links: Api<Link>,
    secrets: Api<Secret>,
    mut shutdown: watch::Receiver<bool>,
) -> (
    Store<Link>,
    mpsc::Receiver<Reconciled>,
    tokio::task::JoinHandle<()>,
) {
    let (links_cache, links_writer) = reflector::store::<Link>();
    let link_changes = reflector(links_writer, watcher(links, watcher::Config::default()))
        .default_backoff()
        .touched_objects()
        .predicate_filter(predicates::generation, Default::default());
    let secrets_namespace = secrets.namespace().unwrap_or_default().to_owned();
    let (secrets_cache, secrets_writer) = reflector::store::<Secret>();
    let secrets_error = Arc::new(Mutex::new(None));
    let noted = secrets_error.clone();
    let secret_changes = reflector(secrets_writer, watcher(secrets, watcher::Config::default()))
        .inspect_err(move |e| {
            *noted.lock().unwrap_or_else(|e| e.into_inner()) = Some(why(e));
        })
        .default_backoff()
        .touched_objects();
    let (found, found_rx) = mpsc::channel(FOUND_QUEUE);
    let ctx = Arc::new(Context {
        secrets_namespace,
        secrets: secrets_cache,
        secrets_error,
        found,
    });
    let naming = links_cache.clone();
    let run = Controller::for_stream(link_changes, links_cache.clone())
        .watches_stream(secret_changes, move |secret: Secret| {
            links_naming(&naming, &secret.name_any())
        })
        .graceful_shutdown_on(async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .run(reconcile_link, error_policy, ctx);
    let task = tokio::spawn(log_errors(run));
    (links_cache, found_rx, task)
}

/// Why the Secrets' watch failed, in the API server's words where it answered (its Status
/// message and code) rather than the client's whole error.
fn why(e: &watcher::Error) -> String {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => s,
        other => return other.to_string(),
    };
    format!("{} (HTTP {})", status.message, status.code)
}

/// The Links that name Secret `secret` (their credentials or their consumers' token).
fn links_naming(links: &Store<Link>, secret: &str) -> Vec<ObjectRef<Link>> {
    links
        .state()
        .iter()
        .filter(|l| reconcile::referenced_secrets(l).iter().any(|n| n == secret))
        .map(|l| ObjectRef::from_obj(l.as_ref()))
        .collect()
}

async fn reconcile_link(link: Arc<Link>, ctx: Arc<Context>) -> Result<Action, LoopStopped> {
    // A Link reconciled before the Secrets are listed would be blocked on a Secret that
    // exists. The Controller polls the Secrets' stream while this waits; a list that keeps
    // failing (the Role does not grant it, say) blocks the Link with the reason.
    match tokio::time::timeout(SECRETS_LISTED, ctx.secrets.wait_until_ready()).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return Err(LoopStopped),
        Err(_) => {
            let why = (ctx.secrets_error.lock().unwrap_or_else(|e| e.into_inner()))
                .clone()
                .unwrap_or_else(|| "no answer yet".into());
            let desired = Err(Blocked {
                reason: "SecretsUnreadable",
                message: format!(
                    "the Secrets of namespace {:?} could not be listed: {why}",
                    ctx.secrets_namespace
                ),
            });
            ctx.found
                .send(Reconciled { link, desired })
                .await
                .map_err(|_| LoopStopped)?;
            return Ok(Action::requeue(SECRETS_LISTED));
        }
    }
    let secret = |name: &str| {
        ctx.secrets
            .get(&ObjectRef::new(name).within(&ctx.secrets_namespace))
    };
    let credentials = (link.spec.remote.kubeconfig_secret.as_ref()).and_then(|s| secret(&s.name));
    let token = secret(&crate::credentials::token_secret_name(&link.name_any()));
    let desired = reconcile::desired(
        &link,
        &ctx.secrets_namespace,
        credentials.as_deref(),
        token.as_deref(),
    );
    ctx.found
        .send(Reconciled { link, desired })
        .await
        .map_err(|_| LoopStopped)?;
    // Nothing outside the two caches decides what runs: the next change triggers the next
    // reconcile.
    Ok(Action::await_change())
}

fn error_policy(_: Arc<Link>, _: &LoopStopped, _: Arc<Context>) -> Action {
    Action::await_change()
}

/// Drives the Controller, logging what fails (a watch that breaks is retried with backoff).
async fn log_errors<T, Q: std::error::Error + 'static>(
    run: impl Stream<Item = Result<T, controller::Error<LoopStopped, Q>>>,
) {
    run.for_each(|r| async move {
        match r {
            Ok(_) => {}
            // A Secret changed for a Link deleted meanwhile: nothing to reconcile.
            Err(controller::Error::ObjectNotFound(link)) => {
                tracing::debug!(%link, "a Link to reconcile is gone");
            }
            Err(e) => tracing::warn!(error = %e, "reconciling Links"),
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused list reads as the API server said it, not as the client's debug dump.
    #[test]
    fn a_refused_list_is_told_in_the_servers_words() {
        let status = kube::core::Status {
            code: 403,
            message: "secrets is forbidden: User \"system:serviceaccount:floodgate:floodgate\" cannot list resource \"secrets\"".into(),
            ..Default::default()
        };
        let e = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)));
        assert_eq!(
            why(&e),
            "secrets is forbidden: User \"system:serviceaccount:floodgate:floodgate\" cannot list resource \"secrets\" (HTTP 403)"
        );
        assert_eq!(
            why(&watcher::Error::NoResourceVersion),
            watcher::Error::NoResourceVersion.to_string()
        );
    }
}
