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

use crate::link::{self, Connect, LinkHandle};
use crate::registry::Registry;
use crate::server::{self, Listeners, ServerConfig, Signals};
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

/// How long a link that starts with no view of its own (no peer gave one) reads its remote
/// before it follows a recorded quarantine: long enough for a first sync (about a second
/// against a remote that floods), so it freezes the remote's capped view, not an empty one.
const FOLLOW_GRACE: Duration = Duration::from_secs(10);

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
    let shared = Shared {
        api: links_api.clone(),
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

/// Only the Lease holder's engine acts on the floods it measures; every other replica's
/// engine measures and follows the holder's record ([`follow_quarantine`]).
fn decide_if_held(name: &str, r: &Running, holder: bool) {
    if r.deciding
        .send_if_modified(|d| std::mem::replace(d, holder) != holder)
    {
        tracing::info!(link = %name, deciding = holder, "this replica's hold on the Lease changed");
    }
}

/// Records the link's service containment transitions as Events on the Link; only the holder
/// records them (the others' engines do not decide, so they have none to record).
fn record_containment(recorder: &Recorder, link: &Link, r: &mut Running, holder: bool) {
    use tokio::sync::broadcast::error::TryRecvError;
    loop {
        match r.transitions.try_recv() {
            Ok(t) if holder => writer::record_service_event(recorder, link, &t),
            Ok(_) => {}
            Err(TryRecvError::Lagged(n)) => {
                tracing::warn!(link = %link.name_any(), missed = n, "service containment Events were dropped; the status still counts them");
            }
            Err(TryRecvError::Empty | TryRecvError::Closed) => return,
        }
    }
}

/// Passes `deciding`'s changes to the link in order, starting with its current value.
async fn forward_deciding(handle: Arc<LinkHandle>, mut deciding: watch::Receiver<bool>) {
    loop {
        let now = *deciding.borrow_and_update();
        if handle.set_deciding(now).await.is_err() || deciding.changed().await.is_err() {
            return;
        }
    }
}

/// Non-holders follow the quarantine the holder recorded in status: quarantine when it says
/// quarantined, release when the holder released it. The holder follows the record once, when
/// its run starts (a restart honours a persisted quarantine); after that its own engine
/// decides and the record follows it.
///
/// Returns true while following is put off: a link with nothing to freeze yet (no view of
/// its own) first serves its remote's first sync, capped, for up to [`FOLLOW_GRACE`].
fn follow_quarantine(link: &Link, r: &mut Running, state: &link::LinkState, holder: bool) -> bool {
    let recorded = link.status.as_ref().and_then(|s| s.quarantine.as_ref());
    let local = state.phase == Phase::Quarantined;
    let want = match (recorded, local) {
        (Some(_), false) => true,
        (None, true) => false,
        _ => return false,
    };
    if (holder && r.followed.is_some()) || r.followed == Some(want) || (holder && !want) {
        r.followed.get_or_insert(want);
        return false;
    }
    if want && !state.synced && r.started.elapsed() < FOLLOW_GRACE {
        return true;
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
    false
}

/// Replicas follow the containments the holder recorded in status, as they follow its
/// quarantine: a non-holder contains what the record names and releases what it no longer
/// names (when the record names every contained service: status names the first
/// [`floodgate_link_crd::ContainedServicesStatus::FIRST`]); the holder, whose engine decides, follows the record
/// once when its run starts (a restart or a Lease move keeps the containments).
fn follow_containment(link: &Link, r: &mut Running, state: &link::LinkState, holder: bool) {
    let Some(status) = link.status.as_ref() else {
        return;
    };
    if holder && r.followed_containment {
        return;
    }
    r.followed_containment = true;
    let recorded = status.contained_services.as_ref();
    let named = recorded.map_or(&[][..], |c| &c.first[..]);
    let complete = recorded.is_none_or(|c| usize::try_from(c.count) == Ok(c.first.len()));
    let local: BTreeSet<String> = state
        .contained
        .iter()
        .map(|c| c.service.to_string())
        .collect();
    let mut contain = Vec::new();
    for c in named.iter().filter(|c| !local.contains(&c.service)) {
        let (Some((ns, name)), Ok(reason)) = (c.service.split_once('/'), c.reason.parse()) else {
            tracing::debug!(link = %link.name_any(), service = %c.service, reason = %c.reason, "a recorded containment this replica cannot read");
            continue;
        };
        let message = format!("recorded in status by the Lease holder: {}", c.message);
        let trigger = crate::churn::flood::Trigger::recorded(reason, message, c.figures.clone());
        contain.push((crate::model::NsName::new(ns, name), trigger));
    }
    let release: Vec<crate::model::NsName> = if holder || !complete {
        Vec::new()
    } else {
        state
            .contained
            .iter()
            .filter(|c| !named.iter().any(|n| n.service == c.service.to_string()))
            .map(|c| c.service.clone())
            .collect()
    };
    if contain.is_empty() && release.is_empty() {
        return;
    }
    let handle = r.handle.clone();
    tokio::spawn(async move {
        for (svc, trigger) in contain {
            let _ = handle.follow_containment(svc, trigger).await;
        }
        for svc in release {
            if let Err(e) = handle
                .release_service(svc, "the Lease holder, as recorded in status")
                .await
            {
                tracing::debug!(error = %e, "following the recorded containments");
            }
        }
    });
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
                let recorded = link.status.as_ref().and_then(|s| s.quarantine.as_ref());
                let seed = match (&shared.peers, recorded) {
                    (Some(p), Some(q)) => peers::last_good_view(p, &name, &d.token, q).await,
                    _ => None,
                };
                start(d, link, seed, running, facade, shared, shutdown);
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

/// What every link of this replica shares: the Links, this replica's identity, its peers.
#[derive(Clone, Debug)]
struct Shared {
    api: Api<Link>,
    identity: String,
    peers: Option<peers::Peers>,
}

/// Carries a command sent to this replica's admin API to the link's Lease holder, unless this
/// replica holds it.
#[derive(Debug)]
struct LinkRelay {
    base: Shared,
    link: String,
    deciding: watch::Receiver<bool>,
}

impl crate::registry::Relay for LinkRelay {
    fn decides(&self) -> bool {
        *self.deciding.borrow()
    }

    fn forward(
        &self,
        order: crate::command::Order,
    ) -> futures_util::future::BoxFuture<
        'static,
        Result<Option<crate::command::Outcome>, crate::command::SendError>,
    > {
        let (api, link) = (self.base.api.clone(), self.link.clone());
        let from = crate::command::unique_from(&format!(
            "the admin API of replica {}",
            self.base.identity
        ));
        tracing::info!(link = %link, command = %order, %from, "passing a command to the link's Lease holder");
        Box::pin(async move {
            crate::command::send(&api, &link, &order, &from, crate::admin::RELAY_WAIT).await
        })
    }
}

fn stop(name: &str, running: &mut HashMap<String, Running>, facade: &Registry) {
    if let Some(r) = running.remove(name) {
        facade.remove(name);
        let _ = r.stop.send(true);
        tracing::info!(link = %name, "link stopped");
    }
}
