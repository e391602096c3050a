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
mod context;
mod control;
mod follow;
pub mod lease;
pub mod peers;
pub mod reconcile;
mod runs;
pub mod status;
mod trigger;
pub mod writer;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use floodgate_link_crd::{KubeDuration, Link};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use tokio::sync::{mpsc, watch};

use crate::registry::Registry;
use crate::server::{self, Listeners};
use crate::serving::{self, Bootstrap, ServeArgs};
use crate::tls::TlsMaterial;
use context::Shared;
use control::{Control, Wanted};
use runs::Runs;

/// How often statuses are computed and sent to the writer.
const STATUS_TICK: Duration = Duration::from_secs(1);
/// At most one status write per link per this long, transitions excepted.
const STATUS_INTERVAL: Duration = Duration::from_secs(10);
/// How long the end of a drain waits for the Leases to be given back (a GET and a PUT each to
/// the local API server).
const LEASE_GIVE_BACK: Duration = Duration::from_secs(5);
/// The lease task's name among the critical tasks.
const LEASE_LOOP: &str = "the lease loop";

/// `floodgate controller`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerArgs {
    /// The namespace whose Links (and their Leases) this controller serves.
    #[arg(long, env = "FLOODGATE_NAMESPACE", default_value = "floodgate")]
    pub namespace: String,
    /// The namespace of the Secrets the Links name (each remote's kubeconfig, each link's
    /// consumers' token), and of nothing else: the shipped Role lets the gateway list and
    /// watch Secrets there only, so its own admin token and TLS key (mounted files in
    /// `--namespace`) are out of its reach through the API.
    #[arg(
        long,
        env = "FLOODGATE_CREDENTIALS_NAMESPACE",
        default_value = "floodgate-credentials"
    )]
    pub credentials_namespace: String,
    /// What both modes serve with: listeners, TLS, admin token, limits, state directory
    /// (whose `tls/` holds the CA and certificate every replica shares).
    #[command(flatten)]
    pub serve: ServeArgs,
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
    /// `host:port` where the other replicas reach this replica's facade (the pod's IP and the
    /// facade's port). Written on the Leases it holds, so the replicas that do not hold a link
    /// follow this one's view of it instead of watching its remote: one upstream watch per
    /// resource per link however many replicas run. Without it (or without `--peers`) every
    /// replica watches every remote.
    #[arg(long, env = "FLOODGATE_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,
    /// How long a link's Lease lasts without renewal (its `leaseDurationSeconds`, so whole
    /// seconds): how long a link waits for a new holder when its holder dies unannounced
    /// (a drained replica hands its links over at once).
    #[arg(long, env = "FLOODGATE_LEASE_DURATION", default_value = "15s")]
    pub lease_duration: KubeDuration,
    /// How often a replica renews its Leases, and looks for free ones to take; under
    /// `--lease-duration` (a third of it lets two renewals in a row fail harmlessly).
    #[arg(long, env = "FLOODGATE_LEASE_RENEW", default_value = "5s")]
    pub lease_renew: KubeDuration,
}

impl ControllerArgs {
    /// The Lease timing of `--lease-duration` and `--lease-renew`, checked.
    pub fn lease_timing(&self) -> anyhow::Result<lease::LeaseTiming> {
        let (duration, renew) = (self.lease_duration.0, self.lease_renew.0);
        anyhow::ensure!(
            duration.as_secs() >= 1 && duration.subsec_nanos() == 0,
            "--lease-duration must be whole seconds, at least 1s (a Lease's \
             leaseDurationSeconds), not {duration:?}"
        );
        anyhow::ensure!(
            !renew.is_zero() && renew < duration,
            "--lease-renew ({renew:?}) must be above zero and under --lease-duration \
             ({duration:?}): a Lease renewed no sooner than it expires is lost between renewals"
        );
        Ok(lease::LeaseTiming { duration, renew })
    }
}

/// The tasks the controller cannot serve without, watched from its loop. A panic in one (or
/// an end before the shutdown) ends the process with an ERROR line naming it, rather than
/// restarting it: the lease loop's held set, the writer's queue and the Controller's caches
/// live in their tasks, and a replica that restarted one would serve on half a state; ended,
/// the process is restarted whole by its Deployment, and the other replicas take its Leases.
struct Critical {
    tasks: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
}

impl Critical {
    fn new(tasks: impl IntoIterator<Item = (&'static str, tokio::task::JoinHandle<()>)>) -> Self {
        Self {
            tasks: tasks.into_iter().collect(),
        }
    }

    /// Takes a task out, to wait for it at shutdown.
    fn take(&mut self, name: &str) -> Option<tokio::task::JoinHandle<()>> {
        let i = self.tasks.iter().position(|(n, _)| *n == name)?;
        Some(self.tasks.swap_remove(i).1)
    }

    /// Waits for the first task to end, logs it at ERROR and says which it was.
    async fn ended(&mut self) -> anyhow::Error {
        if self.tasks.is_empty() {
            return std::future::pending().await;
        }
        let (r, i, _) =
            futures_util::future::select_all(self.tasks.iter_mut().map(|(_, t)| t)).await;
        let (name, _) = self.tasks.swap_remove(i);
        let why = match r {
            Ok(()) => "ended".to_owned(),
            Err(e) if e.is_panic() => "panicked".to_owned(),
            Err(e) => format!("failed: {e}"),
        };
        tracing::error!(
            task = name,
            "{name} {why}: the controller cannot go on without it"
        );
        anyhow::anyhow!("{name} {why}")
    }
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
    let timing = Timing {
        lease: args.lease_timing()?,
        ..Timing::default()
    };
    let listeners = serving::bind(&args.serve.to_config()?).await?;
    serve(client, args, listeners, timing, shutdown).await
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
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &args.credentials_namespace);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let recorder = recorder(&client, &args.identity);

    let boot = Bootstrap::load(args.serve.to_config()?)?;
    let peers = peers_of(&args, boot.tls.as_ref())?;
    let (reader, mut found, trigger_task) =
        trigger::start(links_api.clone(), secrets, shutdown.clone());
    // Who holds each link's Lease, as the lease loop's watch sees them (the admin API's
    // `leaseHolder`).
    let (holders, leases_seen) = kube::runtime::reflector::store::<Lease>();
    let shared = Shared {
        api: links_api.clone(),
        links: reader.clone(),
        holders: holders.clone(),
        namespace: ns.clone(),
        identity: args.identity.clone(),
        peers,
        pacer: boot.pacer.clone(),
    };
    let registry = Arc::new(Registry::new());
    let (listed_tx, listed) = watch::channel(false);
    let (switches, signals) = server::Switches::new(listed);
    // The links stop with the facade, after readiness has dropped; the Controller, the Leases
    // and the status writer with the process's signal.
    let links_stop = signals.shutdown.clone();
    let deadline = boot.cfg.shutdown_timeout;
    let server = boot.start(registry.clone(), listeners, mode_json(&args), signals)?;

    // Watched below; on shutdown it gives the held Leases back, which the drain waits for.
    let (lease_task, wanted, held) =
        spawn_lease_loop(leases, &args, timing.lease, leases_seen, shutdown.clone());
    let (status_tx, status_rx) = mpsc::channel(writer::STATUS_QUEUE);
    let (phase_tx, mut phase_rx) = mpsc::channel(writer::PHASE_CHANGES);
    let writer_task = tokio::spawn(writer::run_reporting(
        status_rx,
        writer::KubeStatusApi(links_api.clone()),
        held.clone(),
        timing.status_interval,
        Some(phase_tx),
    ));

    let (runs, mut seeded) = Runs::new(registry.clone(), shared, links_stop);
    let mut control = Control {
        commands: commands::Commands::new(links_api.clone(), args.identity.clone()),
        runs,
        identity: args.identity.clone(),
        reader,
        recorder,
        wanted,
        listed_tx,
        held,
        status_tx,
    };
    let mut status_tick = tokio::time::interval(timing.status_tick);
    // A Lease taken or given back is acted on at once, not at the next tick: a take-over
    // starts reading the remote as soon as the Lease is this replica's.
    let mut held_changes = control.held.clone();
    let mut shutdown_rx = shutdown.clone();
    let mut leases_listed = false;
    let mut critical = Critical::new([
        ("the Links' Controller", trigger_task),
        (LEASE_LOOP, lease_task),
        ("the status writer", writer_task),
    ]);
    loop {
        tokio::select! {
            _ = shutdown_rx.changed() => break,
            ended = critical.ended() => {
                // At shutdown they end on their own (a dropped sender is a shutdown too).
                if *shutdown_rx.borrow() || shutdown_rx.has_changed().is_err() {
                    break;
                }
                return Err(ended);
            }
            // Until the lease loop has listed the Leases, a link would not know its holder and
            // would start on its remote beside the holder: the Links wait for them.
            Ok(()) = holders.wait_until_ready(), if !leases_listed => leases_listed = true,
            Some(found) = found.recv(), if leases_listed => control.runs.apply(found),
            Some(seeded) = seeded.recv() => control.runs.seeded(seeded),
            Some(change) = phase_rx.recv() => control.record_phase(&ns, &change),
            _ = status_tick.tick() => control.tick(),
            Ok(()) = held_changes.changed() => control.tick(),
        }
    }
    // The same ordered shutdown as `floodgate run`: readiness, then the facade's watchers
    // get their last BOOKMARK, then the admin listener.
    // The links stop reading their remotes before their Leases go back (the lease loop waits
    // for it), and serve their views to the end of the drain.
    control.stop_reading().await;
    tracing::info!(?deadline, "shutting down: readiness off, draining watchers");
    let drained = server.shutdown(&registry, switches, deadline).await;
    control.runs.stop_all();
    give_back_leases(critical.take(LEASE_LOOP)).await;
    Ok(drained?)
}

/// Starts the lease loop: it takes the Leases of the links wanted (the sender it returns),
/// says which it holds (the receiver), and gives them back at shutdown.
fn spawn_lease_loop(
    leases: Api<Lease>,
    args: &ControllerArgs,
    timing: lease::LeaseTiming,
    seen: reflector::store::Writer<Lease>,
    shutdown: watch::Receiver<bool>,
) -> (
    tokio::task::JoinHandle<()>,
    Wanted,
    watch::Receiver<BTreeSet<String>>,
) {
    let (wanted_tx, links) = watch::channel(BTreeSet::new());
    let (reading_tx, reading) = watch::channel(BTreeSet::new());
    let (synced_tx, synced) = watch::channel(BTreeSet::new());
    let (view_bases_tx, view_bases) = watch::channel(Default::default());
    let (held_tx, held) = watch::channel(BTreeSet::new());
    let claimant = lease::Claimant {
        identity: args.identity.clone(),
        facade: args.advertise_address.clone(),
    };
    let links = lease::Links {
        links,
        reading,
        synced,
        view_bases,
    };
    let task = tokio::spawn(lease::run(
        leases, claimant, timing, links, held_tx, seen, shutdown,
    ));
    let wanted = Wanted {
        links: wanted_tx,
        reading: reading_tx,
        synced: synced_tx,
        view_bases: view_bases_tx,
    };
    (task, wanted, held)
}

/// Waits, at shutdown, for the lease loop to give the held Leases back (it began when the
/// signal came).
async fn give_back_leases(lease_task: Option<tokio::task::JoinHandle<()>>) {
    let Some(lease_task) = lease_task else { return };
    match tokio::time::timeout(LEASE_GIVE_BACK, lease_task).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "the lease task failed"),
        Err(_) => {
            tracing::warn!("the Leases were not all given back in time; they expire by themselves");
        }
    }
}

/// What records this replica's Events.
fn recorder(client: &kube::Client, identity: &str) -> Recorder {
    let reporter = Reporter {
        controller: "floodgate".into(),
        instance: Some(identity.to_owned()),
    };
    Recorder::new(client.clone(), reporter)
}

/// What the controller's fields of `GET /config` say (where its links come from).
fn mode_json(args: &ControllerArgs) -> serde_json::Map<String, serde_json::Value> {
    let mut mode = serde_json::Map::new();
    mode.insert("mode".into(), "controller".into());
    mode.insert("namespace".into(), args.namespace.clone().into());
    mode.insert(
        "credentialsNamespace".into(),
        args.credentials_namespace.clone().into(),
    );
    mode.insert("identity".into(), args.identity.clone().into());
    mode.insert("peers".into(), args.peers.clone().into());
    mode.insert(
        "advertiseAddress".into(),
        args.advertise_address.clone().into(),
    );
    mode
}

/// Where peers are, and the CA their facades are checked against (the replicas share one).
fn peers_of(
    args: &ControllerArgs,
    tls: Option<&TlsMaterial>,
) -> anyhow::Result<Option<peers::Peers>> {
    match (&args.peers, tls) {
        (None, _) => Ok(None),
        (Some(address), Some(tls)) => Ok(Some(peers::Peers {
            address: address.clone(),
            server_name: args.peer_server_name.clone(),
            ca_pem: tls.ca_pem.clone(),
        })),
        (Some(_), None) => anyhow::bail!("--peers needs the facade on TLS, not --insecure-http"),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use crate::cli::{Cli, Command};

    fn lease_timing(flags: &[&str]) -> anyhow::Result<super::lease::LeaseTiming> {
        let argv = ["floodgate", "controller"].iter().chain(flags);
        match Cli::try_parse_from(argv)?.command {
            Command::Controller(args) => args.lease_timing(),
            other => panic!("{other:?}"),
        }
    }

    /// The defaults are the Lease timing the controller always had; shorter ones are taken
    /// as given; a duration that is not whole seconds or a renewal not under the duration is
    /// refused with the flag's name.
    #[test]
    fn lease_flags_are_checked() {
        let default = lease_timing(&[]).expect("the defaults");
        let expected = super::lease::LeaseTiming::default();
        assert_eq!(
            (default.duration, default.renew),
            (expected.duration, expected.renew)
        );
        let fast = lease_timing(&["--lease-duration=2s", "--lease-renew=200ms"]).expect("fast");
        assert_eq!(fast.duration.as_millis(), 2000);
        assert_eq!(fast.renew.as_millis(), 200);
        for (flags, named) in [
            (&["--lease-duration=1500ms"][..], "--lease-duration"),
            (&["--lease-duration=0s"], "--lease-duration"),
            (
                &["--lease-duration=5s", "--lease-renew=5s"],
                "--lease-renew",
            ),
            (&["--lease-renew=0s"], "--lease-renew"),
        ] {
            let e = lease_timing(flags).expect_err("refused").to_string();
            assert!(e.contains(named), "{flags:?}: {e}");
        }
    }
}
