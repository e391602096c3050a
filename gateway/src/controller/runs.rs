//! The links one controller replica runs: what each Link's reconcile found becomes a start,
//! a restart, a reconnect or nothing ([`reconcile::plan`]); a quarantined link that starts
//! first looks for its last good view on a peer ([`peers`]), in a task of its own, so no other
//! link waits for it; a Link the cache no longer holds stops.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use floodgate_link_crd::Link;
use kube::{Resource as _, ResourceExt as _};
use tokio::sync::{mpsc, watch};

use super::commands::LinkRelay;
use super::context::{Shared, Upstream};
use super::follow::Following;
use super::reconcile::{self, Action, Blocked, DesiredLink};
use super::{peers, trigger};
use crate::credentials::{self, RemoteKubeconfig};
use crate::link::{self, LinkHandle};
use crate::registry::Registry;
use crate::view::replica::NewTerm;

/// Where a running link is told to read from next.
#[derive(Clone)]
pub(super) enum Switch {
    /// Read the remote with these credentials; after following the holder, take the link
    /// over under this term, made from its Lease (its transitions, its last holder's base).
    Read(crate::link::Connect, NewTerm),
    /// Follow the holder's view through its facade, reached this way.
    Follow(crate::link::Connect),
    /// Read nothing (the string says why); the view keeps serving.
    Stop(String),
}

/// A running link and what it was started from.
pub(super) struct Running {
    pub(super) desired: DesiredLink,
    /// Where its upstream reads from now (its relay shows it to the admin API and metrics).
    pub(super) upstream: watch::Sender<Upstream>,
    pub(super) handle: Arc<LinkHandle>,
    pub(super) stop: watch::Sender<bool>,
    /// Where it reads from next: a forwarder task passes the latest to the link, in order.
    pub(super) switch: watch::Sender<Option<Switch>>,
    /// What this run has followed of the holder's record, and whether its engine decides.
    pub(super) following: Following,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("desired", &self.desired)
            .finish_non_exhaustive()
    }
}

/// Peers' answers waiting for the loop; a lookup task that finds the queue full waits.
const SEEDED_QUEUE: usize = 16;

/// A peer's answer for a link waiting to start.
pub(super) struct Seeded {
    /// Which lookup this answers (a newer reconcile supersedes an older lookup).
    lookup: u64,
    desired: DesiredLink,
    link: Arc<Link>,
    seed: Option<crate::churn::restore::Saved>,
}

/// The links this replica runs, the Links it cannot run, and the ones waiting for a peer.
pub(super) struct Runs {
    pub(super) running: HashMap<String, Running>,
    /// Why a Link cannot run (a blocked Link that ran before keeps its last good run).
    pub(super) blocked: HashMap<String, Blocked>,
    /// Links waiting for a peer's last good view before they start, by lookup.
    seeding: HashMap<String, u64>,
    lookups: u64,
    seeded: mpsc::Sender<Seeded>,
    registry: Arc<Registry>,
    shared: Shared,
    shutdown: watch::Receiver<bool>,
}

impl Runs {
    /// No links yet; what peers answer for starting links comes on the returned channel.
    pub(super) fn new(
        registry: Arc<Registry>,
        shared: Shared,
        shutdown: watch::Receiver<bool>,
    ) -> (Self, mpsc::Receiver<Seeded>) {
        let (seeded, answers) = mpsc::channel(SEEDED_QUEUE);
        let runs = Self {
            running: HashMap::new(),
            blocked: HashMap::new(),
            seeding: HashMap::new(),
            lookups: 0,
            seeded,
            registry,
            shared,
            shutdown,
        };
        (runs, answers)
    }

    /// Stops every link (the process is shutting down).
    pub(super) fn stop_all(self) {
        for (_, r) in self.running {
            let _ = r.stop.send(true);
        }
    }

    /// Takes one Link to what its reconcile found.
    pub(super) fn apply(&mut self, trigger::Reconciled { link, desired }: trigger::Reconciled) {
        let name = link.name_any();
        // A lookup still under way answers for an older reconcile.
        self.seeding.remove(&name);
        match &desired {
            Err(b) => {
                if self.blocked.get(&name) != Some(b) {
                    tracing::warn!(link = %name, reason = b.reason, message = %b.message, "link blocked");
                }
                self.blocked.insert(name.clone(), b.clone());
            }
            Ok(_) => {
                self.blocked.remove(&name);
            }
        }
        match reconcile::plan(self.running.get(&name).map(|r| &r.desired), Some(&desired)) {
            Action::Keep => {}
            Action::Stop => self.stop(&name),
            Action::Reconnect(d) => self.reconnect(d),
            Action::Start(d) | Action::Restart(d) => {
                self.stop(&name);
                self.begin(d, link);
            }
        }
    }

    /// Starts a link; one under a recorded quarantine first looks for its last good view on a
    /// peer, in a task of its own (at most [`peers::PEER_TIMEOUT`]), so other links do not wait.
    fn begin(&mut self, d: DesiredLink, link: Arc<Link>) {
        let recorded = link.status.as_ref().and_then(|s| s.quarantine.clone());
        let (Some(peers), Some(recorded)) = (self.shared.peers.clone(), recorded) else {
            self.start(d, &link, None);
            return;
        };
        self.lookups += 1;
        let lookup = self.lookups;
        self.seeding.insert(d.name.clone(), lookup);
        let seeded = self.seeded.clone();
        tokio::spawn(async move {
            let seed = peers::last_good_view(&peers, &d.name, &d.token, &recorded).await;
            let _ = seeded
                .send(Seeded {
                    lookup,
                    desired: d,
                    link,
                    seed,
                })
                .await;
        });
    }

    /// A peer's answer: the link starts with it, unless a newer reconcile came meanwhile.
    pub(super) fn seeded(&mut self, s: Seeded) {
        if self.seeding.get(&s.desired.name) == Some(&s.lookup) {
            self.seeding.remove(&s.desired.name);
            self.start(s.desired, &s.link, s.seed);
        }
    }

    fn reconnect(&mut self, d: DesiredLink) {
        let Some(r) = self.running.get_mut(&d.name) else {
            return;
        };
        r.desired = d;
        // New credentials matter to a link that reads its remote; one that follows the holder
        // uses them once it reads the remote again.
        if *r.upstream.borrow() == Upstream::Remote {
            tracing::info!(link = %r.desired.name, "new credentials: reconnecting the upstream");
            let connect = connect(&self.shared, &r.desired, &Upstream::Remote);
            let term = new_term(&self.shared, &r.desired.name);
            r.switch.send_replace(Some(Switch::Read(connect, term)));
        }
    }

    /// Where link `name` should read from, if that is known: its remote when this replica
    /// holds its Lease (`held`), the holder's facade when another live replica holds it and
    /// says where (and the replicas share a CA to trust it by), `None` while nobody does.
    fn upstream_for(&self, name: &str, held: bool) -> Option<Upstream> {
        if held {
            return Some(Upstream::Remote);
        }
        // Without peers every replica reads every remote.
        self.shared.peers.as_ref()?;
        let (holders, namespace) = (&self.shared.holders, &self.shared.namespace);
        if super::lease::holder(holders, namespace, name)? == self.shared.identity {
            // The Lease still names this replica, which no longer counts it held: it goes back
            // at the next renewal. Whoever takes it reads the remote; this replica stops now.
            return Some(Upstream::HandingOver);
        }
        let (identity, facade) = super::lease::holder_facade(holders, namespace, name)?;
        Some(Upstream::Holder { identity, facade })
    }

    /// Points link `name`'s upstream at its remote or at the Lease holder's facade, as the
    /// Lease says (`held`: this replica holds it). The view is kept: the relist that follows
    /// publishes only real differences.
    pub(super) fn follow_upstream(&mut self, name: &str, held: bool) {
        let Some(want) = self.upstream_for(name, held) else {
            return;
        };
        let Some(r) = self.running.get_mut(name) else {
            return;
        };
        if *r.upstream.borrow() == want {
            return;
        }
        let from = r.upstream.borrow().to_string();
        tracing::info!(link = %name, %from, to = %want, "the link's upstream follows the Lease");
        let switch = match &want {
            Upstream::HandingOver => Switch::Stop(
                "handing the link over to another replica: reading from it once it holds the Lease"
                    .into(),
            ),
            holder @ Upstream::Holder { .. } => {
                Switch::Follow(connect(&self.shared, &r.desired, holder))
            }
            Upstream::Remote => Switch::Read(
                connect(&self.shared, &r.desired, &want),
                new_term(&self.shared, name),
            ),
        };
        r.upstream.send_replace(want);
        r.switch.send_replace(Some(switch));
    }

    /// The base of the versions each running link's view serves now: what the Leases this
    /// replica holds record ([`super::lease::VIEW_BASE_ANNOTATION`]).
    pub(super) fn view_bases(&self) -> BTreeMap<String, u64> {
        (self.running.iter())
            .map(|(name, r)| (name.clone(), r.handle.view.term_base()))
            .collect()
    }

    /// The links that read their remote now: those that should, and those handed over whose
    /// task has not stopped reading yet.
    pub(super) fn reading_remote(&self) -> BTreeSet<String> {
        (self.running.iter())
            .filter(|(_, r)| match &*r.upstream.borrow() {
                Upstream::Remote => true,
                Upstream::HandingOver => r.handle.state.borrow().connected,
                Upstream::Holder { .. } => false,
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The links whose view this replica could go on from as their holder, with no gap in
    /// what consumers see: those that read their remote (or will: handed over, or nobody
    /// held them), and those whose view holds the whole view of a holder it followed. A view
    /// that has not synced yet would begin its own term below the holder's, and every other
    /// replica following it would end its watches (their consumers relist).
    pub(super) fn synced_views(&self) -> BTreeSet<String> {
        (self.running.iter())
            .filter(|(_, r)| match &*r.upstream.borrow() {
                Upstream::Holder { .. } => r.handle.state.borrow().synced,
                Upstream::Remote | Upstream::HandingOver => true,
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Stops what runs for Links the cache no longer holds (a deleted Link is not reconciled);
    /// `names` are the Links it holds.
    pub(super) fn prune(&mut self, names: &BTreeSet<String>) {
        let gone: Vec<String> = (self.running.keys())
            .filter(|n| !names.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            self.stop(&name);
        }
        self.blocked.retain(|n, _| names.contains(n));
        self.seeding.retain(|n, _| names.contains(n));
    }

    /// True when Link `name` has been reconciled and runs or is blocked (it does not wait for
    /// a peer).
    pub(super) fn reconciled(&self, name: &str) -> bool {
        !self.seeding.contains_key(name)
            && (self.running.contains_key(name) || self.blocked.contains_key(name))
    }

    /// True when every Link is [`Self::reconciled`].
    pub(super) fn settled(&self, links: &[Arc<Link>]) -> bool {
        links.iter().all(|l| self.reconciled(&l.name_any()))
    }

    fn start(&mut self, d: DesiredLink, link: &Link, seed: Option<crate::churn::restore::Saved>) {
        let shared = &self.shared;
        let (stop_tx, stop_rx) = watch::channel(false);
        // The link stops on its own signal or on the process's.
        let mut all = self.shutdown.clone();
        let forward = stop_tx.clone();
        tokio::spawn(async move {
            let _ = all.wait_for(|s| *s).await;
            let _ = forward.send(true);
        });
        // A replica that starts while another holds the Lease reads that replica's facade from
        // the start: a rollout does not list every remote again.
        let upstream = match self.upstream_for(&d.name, false) {
            Some(holder @ Upstream::Holder { .. }) => holder,
            // Nobody holds it, or this replica did before it restarted: it takes it back.
            _ => Upstream::Remote,
        };
        let connect = connect(shared, &d, &upstream);
        let connect_again = connect.clone();
        let handle = Arc::new(link::spawn_restored(
            &d.name,
            d.spec.clone(),
            connect,
            credentials::incarnation(),
            // In cluster mode a quarantine is kept in the Link's status, which every replica
            // reads; a replica-local file would disagree with it. Its view comes from a peer.
            None,
            seed,
            stop_rx,
        ));
        // Reading the remote while another replica's view served the link (it gave the Lease
        // back, or lost it, before this replica's view could follow it): its versions go on
        // above that view's, so no other replica's consumers see them go down.
        if upstream == Upstream::Remote && shared.peers.is_some() {
            let term = new_term(shared, &d.name);
            if term.above >= handle.view.term_base() {
                handle.view.begin_own_term(term);
                tracing::info!(link = %d.name, recorded = term.above, base = handle.view.term_base(), "the link's versions go on above the base its last holder recorded on the Lease");
            }
        }
        // It starts measuring only (see `Following::start`).
        let following = Following::start(&handle);
        let (switch, switch_rx) = watch::channel(None);
        if let Upstream::Holder { .. } = &upstream {
            // Its view follows the holder's from the start, version for version.
            switch.send_replace(Some(Switch::Follow(connect_again)));
        }
        tokio::spawn(forward_switches(handle.clone(), switch_rx));
        tracing::info!(link = %d.name, generation = ?link.meta().generation, %upstream, "link started");
        let (upstream, reads_from) = watch::channel(upstream);
        let relay = Arc::new(LinkRelay {
            base: shared.clone(),
            link: d.name.clone(),
            reads_from,
        });
        self.registry
            .insert_relayed(handle.clone(), &d.token, Some(relay));
        self.running.insert(
            d.name.clone(),
            Running {
                desired: d,
                upstream,
                handle,
                stop: stop_tx,
                switch,
                following,
            },
        );
    }

    fn stop(&mut self, name: &str) {
        if let Some(r) = self.running.remove(name) {
            self.registry.remove(name);
            let _ = r.stop.send(true);
            tracing::info!(link = %name, "link stopped");
        }
    }
}

/// How link `d` reaches `upstream`: the remote with the Link's credentials, or the holder's
/// facade with the link's token and the CA the replicas share.
fn connect(shared: &Shared, d: &DesiredLink, upstream: &Upstream) -> crate::link::Connect {
    let connect = match (upstream, &shared.peers) {
        (Upstream::Holder { facade, .. }, Some(peers)) => {
            let kubeconfig = credentials::peer_kubeconfig(
                &format!("https://{facade}/links/{}", d.name),
                &d.token,
                &peers.ca_pem,
                &peers.server_name,
                &d.name,
            );
            credentials::connect(RemoteKubeconfig::Yaml(kubeconfig), None)
        }
        _ => credentials::connect(
            RemoteKubeconfig::Yaml(d.kubeconfig.clone()),
            d.spec.remote.context.clone(),
        ),
    };
    shared.pacer.pace(connect)
}

/// Passes the latest of `switches` to the link, in order: a reconnect and a disconnect sent
/// from tasks of their own could arrive swapped and leave the link reading from the wrong
/// place. Only the latest matters, so one that is superseded before it is sent is skipped.
async fn forward_switches(handle: Arc<LinkHandle>, mut switches: watch::Receiver<Option<Switch>>) {
    while switches.changed().await.is_ok() {
        let Some(switch) = switches.borrow_and_update().clone() else {
            continue;
        };
        let sent = match switch {
            Switch::Read(connect, term) => handle.reconnect(connect, term).await,
            Switch::Follow(connect) => handle.follow(connect).await,
            Switch::Stop(why) => handle.disconnect(why).await,
        };
        if sent.is_err() {
            return;
        }
    }
}

/// The term link `name`'s view begins when this replica takes it over: stepped by the Lease's
/// transitions (random while the cache does not show the Lease), above the base its last
/// holder recorded.
fn new_term(shared: &Shared, name: &str) -> NewTerm {
    let (holders, ns) = (&shared.holders, &shared.namespace);
    NewTerm {
        step: super::lease::transitions_since_taken(holders, ns, name, &shared.identity)
            .unwrap_or_else(credentials::incarnation),
        above: super::lease::recorded_view_base(holders, ns, name),
    }
}
