//! `floodgate controller`: links from `Link` resources in one namespace of the local cluster.
//!
//! Tasks: a watcher on Links (kube-rs reflector) feeding the reconcile loop; one task per
//! running link ([`crate::link`]); the lease loop ([`lease`]); the status writer
//! ([`writer`]); the [`crate::server`] both modes share (facade, gRPC, admin API). Each reconcile pass reads the Secrets every
//! Link names, computes what should run ([`reconcile`]), starts, restarts or stops links, adds
//! or removes them from the facade, and sends each link's status ([`status`]) to the writer,
//! which writes only the links whose Lease this replica holds. Every replica serves every
//! link; quarantine decisions and status are the holder's, and the other replicas follow the
//! quarantine the holder recorded in status (which also carries it across restarts).
//! Operators' commands reach the holder through the Link ([`crate::command`], [`commands`]):
//! a replica's admin API passes a command it does not decide on to the holder this way.

pub mod commands;
mod follow;
pub mod lease;
pub mod peers;
pub mod reconcile;
pub mod status;
pub mod writer;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use floodgate_link_crd::Link;
use futures_util::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Api, Resource as _, ResourceExt as _};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::link::{self, Connect, LinkHandle};
use crate::registry::Registry;
use crate::server::{self, Listeners, ServerConfig, Signals};
use commands::{LinkRelay, Shared};
use follow::{
    decide_if_held, follow_containment, follow_quarantine, forward_deciding, record_containment,
};
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
    /// Where the admin API (links, release, quarantine, metrics, the status page, /livez,
    /// /readyz) listens.
    #[arg(long, env = "FLOODGATE_ADMIN_LISTEN", default_value = "0.0.0.0:9990")]
    pub admin_listen: SocketAddr,
    /// Where gRPC (`floodgate.v1.Mirror`, `grpc.health.v1`) listens.
    #[arg(long, env = "FLOODGATE_GRPC_LISTEN", default_value = "0.0.0.0:8090")]
    pub grpc_listen: SocketAddr,
    /// A file holding the admin API's bearer token (a mounted Secret); without it the
    /// mutating admin routes answer 403.
    #[arg(long, env = "FLOODGATE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
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
    /// `host:port` resolving to every replica's facade (the headless Service
    /// `floodgate-peers`): a replica that starts while a link is quarantined takes the last
    /// good view from a peer. Without it such a link starts from its remote.
    #[arg(long, env = "FLOODGATE_PEERS")]
    pub peers: Option<String>,
    /// The name peers' certificates are checked against (the generated certificate carries
    /// `localhost`; peers are reached by address).
    #[arg(long, env = "FLOODGATE_PEER_SERVER_NAME", default_value = "localhost")]
    pub peer_server_name: String,
}

/// A running link and what it was started from.
struct Running {
    desired: DesiredLink,
    handle: Arc<LinkHandle>,
    stop: watch::Sender<bool>,
    /// What this replica last asked the link to follow: `Some(true)` quarantine, `Some(false)`
    /// release, `None` nothing yet.
    followed: Option<bool>,
    /// Whether the link's engine decides (this replica holds its Lease); a forwarder task
    /// passes each change to the link, in order.
    deciding: watch::Sender<bool>,
    /// Whether this run has followed the recorded containments once (a holder does only that).
    followed_containment: bool,
    /// The link's service containment transitions not yet recorded as Events.
    transitions: tokio::sync::broadcast::Receiver<crate::churn::quarantine::Transition>,
    /// When this run started.
    started: tokio::time::Instant,
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
    let listeners = Listeners {
        facade: TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding the facade to {}", args.listen))?,
        admin: TcpListener::bind(args.admin_listen)
            .await
            .with_context(|| format!("binding the admin listener to {}", args.admin_listen))?,
        grpc: TcpListener::bind(args.grpc_listen)
            .await
            .with_context(|| format!("binding gRPC to {}", args.grpc_listen))?,
    };
    serve(client, args, listeners, Timing::default(), shutdown).await
}

/// Runs the controller until `shutdown` on listeners bound by the caller (tests bind
/// `127.0.0.1:0`); the addresses in `args` are not used.
pub async fn serve(
    client: kube::Client,
    args: ControllerArgs,
    listeners: Listeners,
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
    let (reader, store_writer) = reflector::store::<Link>();
    let shared = Shared {
        api: links_api.clone(),
        links: reader.clone(),
        namespace: ns.clone(),
        identity: args.identity.clone(),
        peers: args.peers.clone().map(|address| peers::Peers {
            address,
            server_name: args.peer_server_name.clone(),
            ca_pem: tls.ca_pem.clone(),
        }),
    };
    let admin_token = args
        .admin_token_file
        .as_deref()
        .map(crate::admin::read_token)
        .transpose()?
        .map(crate::auth::Token::new);
    let registry = Arc::new(Registry::new());
    let (listed_tx, listed) = watch::channel(false);
    server::start(
        registry.clone(),
        listeners,
        ServerConfig {
            tls: Some(tls),
            limits: crate::kubeapi::serve::ServeLimits::default(),
            admin_token,
            config: serde_json::json!({
                "mode": "controller",
                "namespace": ns,
                "identity": args.identity,
            }),
        },
        Signals {
            gate: listed,
            unready: shutdown.clone(),
            shutdown: shutdown.clone(),
            admin_stop: shutdown.clone(),
        },
    )?;

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

    let commands =
        commands::Commands::new(links_api.clone(), recorder.clone(), args.identity.clone());
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
                &registry,
                &shared,
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
            commands.poll(&link, holder, || match &run {
                Some(r) => commands::Target::Running(r.handle.clone()),
                None => commands::Target::Blocked(blocked.get(&name).map_or_else(
                    || "it has not started yet".to_owned(),
                    |b| b.message.clone(),
                )),
            });
            let mut deferred = false;
            if let (Some(r), Some(state)) = (run, &state) {
                decide_if_held(&name, r, holder);
                deferred = follow_quarantine(&link, r, state, holder);
                follow_containment(&link, r, state, holder);
                record_containment(&recorder, &link, r, holder);
            }
            if deferred {
                // The recorded quarantine is still to be followed: writing this link's state
                // now would erase it from status.
                continue;
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

async fn reconcile_all(
    links: &[Arc<Link>],
    secrets: &Api<Secret>,
    running: &mut HashMap<String, Running>,
    blocked: &mut HashMap<String, Blocked>,
    facade: &Registry,
    shared: &Shared,
    shutdown: &watch::Receiver<bool>,
) {
    let mut seen = BTreeSet::new();
    let mut starts: Vec<(DesiredLink, &Arc<Link>)> = Vec::new();
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
                starts.push((d, link));
            }
        }
    }
    // A link that starts under a recorded quarantine takes its last good view from a peer.
    // The lookups run together, so a pass waits one PEER_TIMEOUT at most, however many
    // quarantined links start in it.
    let seeds = futures_util::future::join_all(starts.iter().map(|(d, link)| async move {
        let recorded = link.status.as_ref().and_then(|s| s.quarantine.as_ref());
        match (&shared.peers, recorded) {
            (Some(p), Some(q)) => peers::last_good_view(p, &d.name, &d.token, q).await,
            _ => None,
        }
    }))
    .await;
    for ((d, link), seed) in starts.into_iter().zip(seeds) {
        start(d, link, seed, running, facade, shared, shutdown);
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

#[allow(clippy::too_many_arguments)]
fn start(
    d: DesiredLink,
    link: &Link,
    seed: Option<crate::churn::restore::Saved>,
    running: &mut HashMap<String, Running>,
    facade: &Registry,
    shared: &Shared,
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
    let handle = Arc::new(link::spawn_restored(
        &d.name,
        d.spec.clone(),
        connect,
        crate::run::incarnation(),
        // In cluster mode a quarantine is kept in the Link's status, which every replica
        // reads; a replica-local file would disagree with it. Its view comes from a peer.
        None,
        seed,
        stop_rx,
    ));
    // A link starts measuring only: the lease loop's held set makes the holder decide (at the
    // next status tick), so no replica acts on a flood before it knows it holds the Lease.
    let (deciding, deciding_rx) = watch::channel(false);
    tokio::spawn(forward_deciding(handle.clone(), deciding_rx));
    let transitions = handle.transitions();
    let relay = Arc::new(LinkRelay {
        base: shared.clone(),
        link: d.name.clone(),
        deciding: deciding.subscribe(),
    });
    facade.insert_relayed(handle.clone(), &d.token, Some(relay));
    tracing::info!(link = %d.name, generation = ?link.meta().generation, "link started");
    running.insert(
        d.name.clone(),
        Running {
            desired: d,
            handle,
            stop: stop_tx,
            followed: None,
            deciding,
            followed_containment: false,
            transitions,
            started: tokio::time::Instant::now(),
        },
    );
}

fn stop(name: &str, running: &mut HashMap<String, Running>, facade: &Registry) {
    if let Some(r) = running.remove(name) {
        facade.remove(name);
        let _ = r.stop.send(true);
        tracing::info!(link = %name, "link stopped");
    }
}
