//! `floodgate controller`: links from `Link` resources in one namespace of the local cluster.
//!
//! Tasks: kube-runtime's Controller on the Links and the Secrets they name ([`trigger`]),
//! whose reconciles say what should run ([`reconcile`]); the loop here, which starts, restarts
//! or stops links, adds or removes them from the facade, and each second sends each link's
//! status ([`status`]) to the writer ([`writer`]), which writes only the links whose Lease this
//! replica holds; one task per running link ([`crate::link`]); the lease loop ([`lease`]); the
//! [`crate::server`] both modes share (facade, gRPC, admin API). Every replica serves every
//! link; quarantine decisions and status are the holder's, and the other replicas follow the
//! quarantine the holder recorded in status (which also carries it across restarts).
//! Operators' commands reach the holder through the Link ([`crate::command`], [`commands`]):
//! a replica's admin API passes a command it does not decide on to the holder this way.

pub mod commands;
mod follow;
pub mod lease;
pub mod peers;
pub mod reconcile;
mod runs;
pub mod status;
mod trigger;
pub mod writer;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use floodgate_link_crd::Link;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::{Api, ResourceExt as _};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::registry::Registry;
use crate::server::{self, Listeners, ServerConfig};
use commands::Shared;
use follow::{decide_if_held, follow_containment, follow_quarantine, record_containment};
use runs::Runs;

/// How often statuses are computed and sent to the writer.
const STATUS_TICK: Duration = Duration::from_secs(1);
/// At most one status write per link per this long, transitions excepted.
const STATUS_INTERVAL: Duration = Duration::from_secs(10);
/// How long the end of a drain waits for the Leases to be given back (a GET and a PUT each to
/// the local API server).
const LEASE_GIVE_BACK: Duration = Duration::from_secs(5);

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
    /// Seconds to drain watchers after SIGTERM before exiting anyway (keep it below the
    /// pod's `terminationGracePeriodSeconds`, 30 s by default).
    #[arg(long, env = "FLOODGATE_SHUTDOWN_TIMEOUT", default_value_t = crate::server::DEFAULT_SHUTDOWN_TIMEOUT.as_secs())]
    pub shutdown_timeout: u64,
}

/// The controller's clocks; tests shorten them.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Lease duration and renewal.
    pub lease: lease::LeaseTiming,
    /// Statuses are computed this often.
    pub status_tick: Duration,
    /// At most one status write per link per this long, transitions excepted.
    pub status_interval: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease: lease::LeaseTiming::default(),
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
    let (reader, mut found) = trigger::start(links_api.clone(), secrets, &ns, shutdown.clone());
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
    let (switches, signals) = server::Switches::new(listed);
    // The links stop with the facade, after readiness has dropped; the Controller, the Leases
    // and the status writer with the process's signal.
    let links_stop = signals.shutdown.clone();
    let server = server::start(
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
        signals,
    )?;

    let (wanted_tx, wanted) = watch::channel(BTreeSet::new());
    let (held_tx, held) = watch::channel(BTreeSet::new());
    // Kept: on shutdown it gives the held Leases back, which the drain waits for.
    let lease_task = tokio::spawn(lease::run(
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

    let commands = commands::Commands::new(links_api.clone(), args.identity.clone());
    let (mut runs, mut seeded) = Runs::new(registry.clone(), shared, links_stop);
    let mut status_tick = tokio::time::interval(timing.status_tick);
    let mut shutdown_rx = shutdown.clone();
    loop {
        tokio::select! {
            _ = shutdown_rx.changed() => break,
            Some(found) = found.recv() => {
                runs.apply(found);
                continue;
            }
            Some(seeded) = seeded.recv() => {
                runs.seeded(seeded);
                continue;
            }
            Some(change) = phase_rx.recv() => {
                // The holder wrote a new phase: record it as an Event on the Link.
                let key = reflector::ObjectRef::new(&change.link).within(&ns);
                if let Some(link) = reader.get(&key) {
                    let note = runs
                        .running
                        .get(&change.link)
                        .map(|r| r.handle.state.borrow().message.clone())
                        .or_else(|| runs.blocked.get(&change.link).map(|b| b.message.clone()));
                    writer::record_event(&recorder, &link, &change, note);
                }
                continue;
            }
            _ = status_tick.tick() => {}
        }
        if futures_util::FutureExt::now_or_never(reader.wait_until_ready())
            .is_none_or(|r| r.is_err())
        {
            continue;
        }
        let links = reader.state();
        let names: BTreeSet<String> = links.iter().map(|l| l.name_any()).collect();
        runs.prune(&names);
        wanted_tx.send_if_modified(|wanted| {
            let changed = *wanted != names;
            *wanted = names;
            changed
        });
        if runs.settled(&links) {
            listed_tx.send_replace(true);
        }
        // Statuses, events on transitions, and following the holder's quarantine decisions.
        let held_now = held.borrow().clone();
        let now = Time(jiff::Timestamp::now());
        for link in links {
            let name = link.name_any();
            if !runs.reconciled(&name) {
                // Nothing to say of it yet: a status written now would erase what the Link
                // records (a quarantine to honour), and a command would find no link.
                continue;
            }
            let run = runs.running.get_mut(&name);
            let blocked = runs.blocked.get(&name);
            let state = run.as_ref().map(|r| r.handle.state.borrow().clone());
            let obs = status::Observation {
                generation: link.metadata.generation,
                blocked,
                state: state.as_ref(),
            };
            let next = status::next_status(link.status.as_ref(), &obs, &now);
            let holder = held_now.contains(&name);
            commands.poll(&link, holder, || match &run {
                Some(r) => commands::Target::Running(r.handle.clone()),
                None => commands::Target::Blocked(blocked.map_or_else(
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
    // The same ordered shutdown as `floodgate run`: readiness, then the facade's watchers
    // get their last BOOKMARK, then the admin listener.
    let deadline = Duration::from_secs(args.shutdown_timeout);
    tracing::info!(?deadline, "shutting down: readiness off, draining watchers");
    let drained = server.shutdown(&registry, switches, deadline).await;
    runs.stop_all();
    // The Leases were given back when the signal came; wait for the requests to finish.
    match tokio::time::timeout(LEASE_GIVE_BACK, lease_task).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "the lease task failed"),
        Err(_) => {
            tracing::warn!("the Leases were not all given back in time; they expire by themselves")
        }
    }
    Ok(drained?)
}
