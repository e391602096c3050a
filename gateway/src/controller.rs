//! `floodgate controller`: links from `Link` resources in one namespace of the local cluster.
//!
//! Tasks: a watcher on Links (kube-rs reflector) feeding the reconcile loop; one task per
//! running link ([`crate::link`]); the lease loop ([`lease`]); the status writer
//! ([`writer`]); the facade and health listeners. Each reconcile pass reads the Secrets every
//! Link names, computes what should run ([`reconcile`]), starts, restarts or stops links, adds
//! or removes them from the facade, and sends each link's status ([`status`]) to the writer,
//! which writes only the links whose Lease this replica holds. Every replica serves every
//! link; quarantine decisions and status are the holder's, and the other replicas follow the
//! quarantine the holder recorded in status (which also carries it across restarts).

pub mod lease;
pub mod reconcile;
pub mod status;
pub mod writer;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use floodgate_link_crd::{Link, Phase};
use futures_util::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Api, Resource as _, ResourceExt as _};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::kubeapi::{self, Api as FacadeApi, Links};
use crate::link::{self, Connect, LinkHandle, LinkStore};
use reconcile::{Action, Blocked, DesiredLink};

/// How often every Link is reconciled even without a change (Secrets are re-read: this is
/// how a credentials rotation is noticed).
const RESYNC: Duration = Duration::from_secs(30);
/// How often statuses are computed and sent to the writer.
const STATUS_TICK: Duration = Duration::from_secs(1);
/// At most one status write per link per this long, transitions excepted.
const STATUS_INTERVAL: Duration = Duration::from_secs(10);

/// `floodgate controller`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerArgs {
    /// The namespace whose Links (and their Secrets and Leases) this controller serves.
    #[arg(long, env = "FLOODGATE_NAMESPACE", default_value = "floodgate")]
    pub namespace: String,
    /// Where the Kubernetes facade listens (links under /links/<name>/).
    #[arg(long, env = "FLOODGATE_LISTEN", default_value = "0.0.0.0:6443")]
    pub listen: SocketAddr,
    /// Where /livez and /readyz listen.
    #[arg(long, env = "FLOODGATE_ADMIN_LISTEN", default_value = "0.0.0.0:9990")]
    pub admin_listen: SocketAddr,
    /// The state directory; `tls/` holds the CA and certificate every replica shares.
    #[arg(
        long,
        env = "FLOODGATE_STATE_DIR",
        default_value = "/var/lib/floodgate"
    )]
    pub state_dir: PathBuf,
    /// Extra names for a generated certificate; repeatable.
    #[arg(long = "tls-host", env = "FLOODGATE_TLS_HOSTS", value_delimiter = ',')]
    pub tls_hosts: Vec<String>,
    /// This replica's identity in Leases (the pod's name).
    #[arg(long, env = "FLOODGATE_POD_NAME", default_value = "floodgate")]
    pub identity: String,
}

/// A running link and what it was started from.
struct Running {
    desired: DesiredLink,
    handle: Arc<LinkHandle>,
    stop: watch::Sender<bool>,
    /// What this replica last asked the link to follow: `Some(true)` quarantine, `Some(false)`
    /// release, `None` nothing yet.
    followed: Option<bool>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("desired", &self.desired)
            .finish_non_exhaustive()
    }
}

/// How a link reaches its remote: the kubeconfig from its Secret.
fn connect_from_kubeconfig(yaml: String, context: Option<String>) -> Connect {
    Arc::new(move || {
        let yaml = yaml.clone();
        let context = context.clone();
        Box::pin(async move {
            let kc = kube::config::Kubeconfig::from_yaml(&yaml)?;
            let opts = kube::config::KubeConfigOptions {
                context,
                ..Default::default()
            };
            let cfg = kube::Config::from_custom_kubeconfig(kc, &opts).await?;
            Ok(crate::upstream::client(cfg)?)
        })
    })
}

/// The controller's clocks; tests shorten them.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Lease duration and renewal.
    pub lease: lease::LeaseTiming,
    /// Every Link is reconciled (its Secrets re-read) at least this often.
    pub resync: Duration,
    /// Statuses are computed this often.
    pub status_tick: Duration,
    /// At most one status write per link per this long, transitions excepted.
    pub status_interval: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease: lease::LeaseTiming::default(),
            resync: RESYNC,
            status_tick: STATUS_TICK,
            status_interval: STATUS_INTERVAL,
        }
    }
}

/// Runs the controller until `shutdown`, on the addresses of `args`.
pub async fn run(
    client: kube::Client,
    args: ControllerArgs,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let facade = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding the facade to {}", args.listen))?;
    let admin = TcpListener::bind(args.admin_listen)
        .await
        .with_context(|| format!("binding the admin listener to {}", args.admin_listen))?;
    serve(client, args, facade, admin, Timing::default(), shutdown).await
}

/// Runs the controller until `shutdown` on listeners bound by the caller (tests bind
/// `127.0.0.1:0`); `args.listen` and `args.admin_listen` are not used.
pub async fn serve(
    client: kube::Client,
    args: ControllerArgs,
    facade: TcpListener,
    admin: TcpListener,
    timing: Timing,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let ns = args.namespace.clone();
    let links_api: Api<Link> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "floodgate".into(),
            instance: Some(args.identity.clone()),
        },
    );

    let tls = crate::run::tls_material(
        &crate::run::TlsSource::SelfSigned,
        &args.state_dir,
        &args.tls_hosts,
    )?
    .context("the facade needs TLS")?;
    let facade_links: Arc<Links<LinkStore>> = Arc::new(Links::new(HashMap::new()));
    let router = kubeapi::links_router(facade_links.clone());
    let config = crate::tls::server_config(&tls)?;
    let stop = wait_for(shutdown.clone());
    tokio::spawn(async move {
        if let Err(e) = crate::tls::serve_tls(facade, config, router, stop).await {
            tracing::error!(error = %e, "the facade stopped");
        }
    });
    let (listed_tx, listed) = watch::channel(false);
    let admin_router = health_router(listed, shutdown.clone());
    let stop = wait_for(shutdown.clone());
    tokio::spawn(async move {
        if let Err(e) = kubeapi::serve_plain(admin, admin_router, stop).await {
            tracing::error!(error = %e, "the admin listener stopped");
        }
    });

    let (wanted_tx, wanted) = watch::channel(BTreeSet::new());
    let (held_tx, held) = watch::channel(BTreeSet::new());
    tokio::spawn(lease::run(
        leases,
        args.identity.clone(),
        timing.lease,
        wanted,
        held_tx,
        shutdown.clone(),
    ));
    let (status_tx, status_rx) = mpsc::channel(writer::STATUS_QUEUE);
    let (phase_tx, mut phase_rx) = mpsc::channel(writer::PHASE_CHANGES);
    tokio::spawn(writer::run_reporting(
        status_rx,
        writer::KubeStatusApi(links_api.clone()),
        held.clone(),
        timing.status_interval,
        Some(phase_tx),
    ));

    let (reader, store_writer) = reflector::store::<Link>();
    let mut changes = reflector(store_writer, watcher(links_api, watcher::Config::default()))
        .default_backoff()
        .touched_objects()
        .boxed();
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut blocked: HashMap<String, Blocked> = HashMap::new();
    let mut resync = tokio::time::interval(timing.resync);
    let mut status_tick = tokio::time::interval(timing.status_tick);
    let mut shutdown_rx = shutdown.clone();
    // Link changes (our own status writes among them) mark the links dirty; they are
    // reconciled at the next status tick, so a burst of changes costs one pass of Secret reads.
    let mut dirty = false;
    loop {
        tokio::select! {
            _ = shutdown_rx.changed() => break,
            ev = changes.next() => {
                match ev {
                    Some(Ok(_)) => dirty = true,
                    Some(Err(e)) => tracing::warn!(error = %e, "watching Links"),
                    None => break,
                }
                continue;
            }
            Some(change) = phase_rx.recv() => {
                // The holder wrote a new phase: record it as an Event on the Link.
                let key = reflector::ObjectRef::new(&change.link).within(&ns);
                if let Some(link) = reader.get(&key) {
                    let note = running
                        .get(&change.link)
                        .map(|r| r.handle.state.borrow().message.clone())
                        .or_else(|| blocked.get(&change.link).map(|b| b.message.clone()));
                    writer::record_event(&recorder, &link, &change, note);
                }
                continue;
            }
            _ = resync.tick() => dirty = true,
            _ = status_tick.tick() => {}
        }
        // Never wait for the store here: only polling `changes` fills it, and this loop is what
        // polls it (waiting deadlocked when a resync came before the first list).
        let listed = futures_util::FutureExt::now_or_never(reader.wait_until_ready())
            .is_some_and(|r| r.is_ok());
        if dirty && listed {
            dirty = false;
            listed_tx.send_replace(true);
            let links = reader.state();
            wanted_tx.send_replace(links.iter().map(|l| l.name_any()).collect());
            reconcile_all(
                &links,
                &secrets,
                &mut running,
                &mut blocked,
                &facade_links,
                &shutdown,
            )
            .await;
        }
        // Statuses, events on transitions, and following the holder's quarantine decisions.
        let held_now = held.borrow().clone();
        let now = Time(jiff::Timestamp::now());
        for link in reader.state() {
            let name = link.name_any();
            let run = running.get_mut(&name);
            let state = run.as_ref().map(|r| r.handle.state.borrow().clone());
            let obs = status::Observation {
                generation: link.metadata.generation,
                blocked: blocked.get(&name),
                state: state.as_ref(),
            };
            let next = status::next_status(link.status.as_ref(), &obs, &now);
            let holder = held_now.contains(&name);
            if let (Some(r), Some(state)) = (run, &state) {
                follow_quarantine(&link, r, state, holder);
            }
            // A full queue skips this tick: the next carries the latest state.
            let _ = status_tx.try_send(writer::StatusUpdate {
                link: name,
                observed: link.status.clone(),
                status: next,
            });
        }
    }
    for (_, r) in running {
        let _ = r.stop.send(true);
    }
    Ok(())
}

/// Non-holders follow the quarantine the holder recorded in status: quarantine when it says
/// quarantined, release when the holder released it. The holder follows the record once, when
/// its run starts (a restart honours a persisted quarantine); after that its own engine
/// decides and the record follows it.
fn follow_quarantine(link: &Link, r: &mut Running, state: &link::LinkState, holder: bool) {
    let recorded = link.status.as_ref().and_then(|s| s.quarantine.as_ref());
    let local = state.phase == Phase::Quarantined;
    let want = match (recorded, local) {
        (Some(_), false) => true,
        (None, true) => false,
        _ => return,
    };
    if (holder && r.followed.is_some()) || r.followed == Some(want) || (holder && !want) {
        r.followed.get_or_insert(want);
        return;
    }
    r.followed = Some(want);
    let handle = r.handle.clone();
    let message = recorded.map(|q| format!("recorded in status: {} ({})", q.reason, q.message));
    tokio::spawn(async move {
        let result = match message {
            Some(msg) => handle.quarantine(msg).await,
            None => {
                handle
                    .release("the Lease holder, as recorded in status")
                    .await
            }
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "following the recorded quarantine");
        }
    });
}

async fn reconcile_all(
    links: &[Arc<Link>],
    secrets: &Api<Secret>,
    running: &mut HashMap<String, Running>,
    blocked: &mut HashMap<String, Blocked>,
    facade: &Links<LinkStore>,
    shutdown: &watch::Receiver<bool>,
) {
    let mut seen = BTreeSet::new();
    for link in links {
        let name = link.name_any();
        seen.insert(name.clone());
        let get = |n: Option<String>| {
            let secrets = secrets.clone();
            async move {
                match n {
                    Some(n) => secrets.get_opt(&n).await.unwrap_or_else(|e| {
                        tracing::warn!(secret = %n, error = %e, "cannot read a Secret");
                        None
                    }),
                    None => None,
                }
            }
        };
        let creds = get(link
            .spec
            .remote
            .kubeconfig_secret
            .as_ref()
            .map(|s| s.name.clone()))
        .await;
        let token = get(Some(crate::wrap::token_secret_name(&name))).await;
        let desired = reconcile::desired(link, creds.as_ref(), token.as_ref());
        match &desired {
            Err(b) => {
                if blocked.get(&name) != Some(b) {
                    tracing::warn!(link = %name, reason = b.reason, message = %b.message, "link blocked");
                }
                blocked.insert(name.clone(), b.clone());
            }
            Ok(_) => {
                blocked.remove(&name);
            }
        }
        match reconcile::plan(running.get(&name).map(|r| &r.desired), Some(&desired)) {
            Action::Keep => {}
            Action::Stop => stop(&name, running, facade),
            Action::Reconnect(d) => {
                if let Some(r) = running.get_mut(&name) {
                    let connect = connect_from_kubeconfig(
                        d.kubeconfig.clone(),
                        d.spec.remote.context.clone(),
                    );
                    let handle = r.handle.clone();
                    r.desired = d;
                    tracing::info!(link = %name, "new credentials: reconnecting the upstream");
                    tokio::spawn(async move {
                        if let Err(e) = handle.reconnect(connect).await {
                            tracing::warn!(error = %e, "cannot reconnect the link");
                        }
                    });
                }
            }
            Action::Start(d) | Action::Restart(d) => {
                stop(&name, running, facade);
                start(d, link, running, facade, shutdown);
            }
        }
    }
    let gone: Vec<String> = running
        .keys()
        .filter(|n| !seen.contains(*n))
        .cloned()
        .collect();
    for name in gone {
        stop(&name, running, facade);
        blocked.remove(&name);
    }
}

fn start(
    d: DesiredLink,
    link: &Link,
    running: &mut HashMap<String, Running>,
    facade: &Links<LinkStore>,
    shutdown: &watch::Receiver<bool>,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    // The link stops on its own signal or on the process's.
    let mut all = shutdown.clone();
    let forward = stop_tx.clone();
    tokio::spawn(async move {
        let _ = all.wait_for(|s| *s).await;
        let _ = forward.send(true);
    });
    let connect = connect_from_kubeconfig(d.kubeconfig.clone(), d.spec.remote.context.clone());
    let handle = Arc::new(link::spawn(
        &d.name,
        d.spec.clone(),
        connect,
        crate::run::incarnation(),
        // In cluster mode a quarantine is kept in the Link's status, which every replica
        // reads; a replica-local file would disagree with it.
        None,
        stop_rx,
    ));
    facade.insert(
        &d.name,
        Arc::new(FacadeApi::new(LinkStore::new(&handle), d.token.clone())),
    );
    tracing::info!(link = %d.name, generation = ?link.meta().generation, "link started");
    running.insert(
        d.name.clone(),
        Running {
            desired: d,
            handle,
            stop: stop_tx,
            followed: None,
        },
    );
}

fn stop(name: &str, running: &mut HashMap<String, Running>, facade: &Links<LinkStore>) {
    if let Some(r) = running.remove(name) {
        facade.remove(name);
        let _ = r.stop.send(true);
        tracing::info!(link = %name, "link stopped");
    }
}

async fn wait_for(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// `/livez`, and `/readyz`: ready once the Links are listed (a link whose remote is down never
/// makes the replica unready: that would take every other link's view away with it).
fn health_router(listed: watch::Receiver<bool>, shutdown: watch::Receiver<bool>) -> axum::Router {
    use axum::http::StatusCode;
    axum::Router::new()
        .route("/livez", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let ready = *listed.borrow() && !*shutdown.borrow();
                async move {
                    if ready {
                        (StatusCode::OK, "ok\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                }
            }),
        )
}
