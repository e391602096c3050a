//! The task of one link: connect to the remote (retried with backoff), run the upstream
//! watchers, feed the engine, sleep until its next deadline, carry out its effects, save and
//! clear its quarantine on disk, and publish its state.
//!
//! A link restored quarantined (from disk, or in cluster mode from a peer's view) serves its
//! saved view at once, before the remote answers (which it may never do while the flood lasts),
//! and starts its watchers only when released. Operators' requests are answered while the link
//! is still connecting. New credentials ([`Command::Reconnect`]) replace the connection, not the
//! view: the new upstream's first lists are relists to the engine.
//!
//! [`LinkTask`] is the task, as a type: [`LinkTask::next`] waits for what happens next
//! ([`Happened`]) and [`LinkTask::handle`] carries it out, one method for each. What it does over
//! the network is behind [`Wire`], so its tests run without sockets.

use std::sync::Arc;
use std::time::Duration;

use floodgate_link_crd::LinkSpec;
use futures_util::future::{BoxFuture, OptionFuture};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::persist::{Persist, contained_snapshot, restore, save, spawn_persister};
use super::state::{Tally, publish_state};
use super::wire::{Dialed, Watchers as _, Wire, connect_with_backoff};
use super::{BATCH, Command, Connect, LinkState, UPSTREAM_QUEUE};
use crate::churn::quarantine::{RequestError, State, Transition};
use crate::churn::restore::Saved;
use crate::churn::{Change, Effect, Engine};
use crate::model::Kind;
use crate::model::wanted::WantedPods;
use crate::persist::LinkDir;
use crate::upstream::{Message, UpstreamCounters};
use crate::view::View;
use crate::view::replica::NewTerm;

/// Where a link's state goes.
pub(super) struct Outputs {
    pub state: watch::Sender<LinkState>,
    /// Every service containment transition, as it happens (for Events).
    pub transitions: broadcast::Sender<Transition>,
    pub version: watch::Sender<Option<Value>>,
    pub has_servers: watch::Sender<bool>,
}

/// An operator's answer, sent once its transition's effects are carried out and the new state
/// is published: whoever reads the link after a 200 sees what the 200 said.
type Answer = (
    tokio::sync::oneshot::Sender<Result<Transition, RequestError>>,
    Result<Transition, RequestError>,
);

/// What woke the link's task.
enum Happened<R> {
    /// The process is stopping.
    Shutdown,
    /// An operator's command, or the controller's.
    Command(Command),
    /// The remote answered.
    Connected(Dialed<R>),
    /// The upstream sent a change (more may be waiting behind it).
    Changed(Message),
    /// A deadline of the engine, a pod fetch ending, or the remote's health changing: the engine
    /// is polled and the state published.
    Woken,
    /// The watchers or the follower counted something ([`UpstreamCounters::touch`]): the state
    /// is published, and counts wake the task again only after [`STATE_REFRESH`].
    Counted,
    /// [`STATE_REFRESH`] has passed since the last [`Happened::Counted`].
    Rearmed,
}

/// How often, at most, a link publishes its state again for what its watchers and its
/// follower count; an idle link is not woken at all.
const STATE_REFRESH: Duration = Duration::from_secs(1);

/// A running link.
pub(super) struct LinkTask<W: Wire> {
    wire: Arc<W>,
    engine: Engine,
    out: Arc<Outputs>,
    /// Saves and clears the quarantine and containments, with a state directory.
    persist: Option<mpsc::Sender<Persist>>,
    counters: Arc<UpstreamCounters>,
    /// Wakes the task when the remote stops or starts answering.
    health: watch::Receiver<Option<crate::upstream::health::Unreachable>>,
    /// The pods the engine wants: the pod watcher decodes only those.
    wanted: WantedPods,
    /// The upstream's queue; each run of watchers gets a sender.
    tx: mpsc::Sender<Message>,
    rx: mpsc::Receiver<Message>,
    commands: mpsc::Receiver<Command>,
    shutdown: watch::Receiver<bool>,
    /// Reaching the remote, until it answers.
    connecting: Option<BoxFuture<'static, Dialed<W::Remote>>>,
    remote: Option<W::Remote>,
    /// The current upstream run: messages of earlier runs are told apart by it and dropped.
    generation: u64,
    upstream: Option<W::Watchers>,
    /// Pod fetches the engine asked for; aborted with the upstream.
    fetches: JoinSet<()>,
    /// True while the view follows the Lease holder's ([`Command::Follow`]): `remote` is the
    /// holder's facade, and `mirror` follows it.
    follows_holder: bool,
    mirror: JoinSet<()>,
    /// Whether the view has held a whole view of the holder's (then it is served, as a synced
    /// link's is, whoever publishes into it next).
    mirrored: watch::Sender<bool>,
    mirrored_rx: watch::Receiver<bool>,
    next_wake: Option<Instant>,
    /// Until when counts do not wake the task ([`Happened::Counted`]); `None`: they do.
    counts_wake_at: Option<Instant>,
    transitions: Tally,
    /// When the link began, until its first sync is logged.
    first_sync: Option<Instant>,
    answer: Option<Answer>,
}

impl<W: Wire> LinkTask<W> {
    /// A link serving `view` that will connect with `connect`, restored from its state
    /// directory or from `seed` when it was quarantined.
    pub(super) fn new(
        wire: W,
        spec: &LinkSpec,
        view: View,
        (dir, seed): (Option<LinkDir>, Option<Saved>),
        out: Outputs,
        (commands, shutdown): (mpsc::Receiver<Command>, watch::Receiver<bool>),
        connect: Connect,
    ) -> Self {
        let now = Instant::now();
        // Until discovery says whether the remote serves Linkerd's Servers, expect every kind.
        let mut engine = Engine::new(spec, &Kind::ALL, view.clone(), now);
        restore(&mut engine, dir.as_ref(), seed, now);
        let counters = Arc::new(UpstreamCounters::default());
        let wanted = WantedPods::everything();
        engine.mirror_wanted(wanted.clone());
        let (tx, rx) = mpsc::channel(UPSTREAM_QUEUE);
        let (mirrored, mirrored_rx) = watch::channel(false);
        let mut task = Self {
            wire: Arc::new(wire),
            engine,
            out: Arc::new(out),
            persist: dir.map(|d| spawn_persister(d, view)),
            health: counters.health.subscribe(),
            counters,
            wanted,
            tx,
            rx,
            commands,
            shutdown,
            connecting: None,
            remote: None,
            generation: 1,
            upstream: None,
            fetches: JoinSet::new(),
            follows_holder: false,
            mirror: JoinSet::new(),
            mirrored,
            mirrored_rx,
            next_wake: None,
            counts_wake_at: None,
            transitions: Tally::default(),
            first_sync: Some(now),
            answer: None,
        };
        task.connect(connect);
        task
    }

    /// Runs the link until shutdown.
    pub(super) async fn run(mut self) {
        loop {
            self.publish_state();
            let happened = self.next().await;
            if matches!(happened, Happened::Shutdown) {
                break;
            }
            self.handle(happened).await;
        }
        self.stop_upstream();
        tracing::info!("link stopped");
    }

    /// Waits for what happens next.
    async fn next(&mut self) -> Happened<W::Remote> {
        let far = Instant::now() + Duration::from_secs(3600);
        let connecting = OptionFuture::from(self.connecting.as_mut());
        tokio::select! {
            biased;
            _ = self.shutdown.changed() => Happened::Shutdown,
            Some(cmd) = self.commands.recv() => Happened::Command(cmd),
            Some(remote) = connecting => Happened::Connected(remote),
            Some(msg) = self.rx.recv() => Happened::Changed(msg),
            () = sleep_until(self.next_wake.unwrap_or(far)) => Happened::Woken,
            Some(_) = self.fetches.join_next(), if !self.fetches.is_empty() => Happened::Woken,
            Ok(()) = self.health.changed() => Happened::Woken,
            Ok(()) = self.mirrored_rx.changed() => Happened::Woken,
            () = self.counters.touched.notified(), if self.counts_wake_at.is_none() => {
                Happened::Counted
            }
            () = sleep_until(self.counts_wake_at.unwrap_or(far)), if self.counts_wake_at.is_some() => {
                Happened::Rearmed
            }
        }
    }

    /// Carries out what happened, then polls the engine and carries out its effects.
    async fn handle(&mut self, happened: Happened<W::Remote>) {
        match happened {
            Happened::Shutdown => return,
            Happened::Command(cmd) => {
                if !self.command(cmd) {
                    return;
                }
            }
            Happened::Connected(dialed) => self.connected(dialed),
            Happened::Changed(first) => self.changed(first),
            Happened::Woken => {}
            Happened::Counted => self.counts_wake_at = Some(Instant::now() + STATE_REFRESH),
            Happened::Rearmed => self.counts_wake_at = None,
        }
        let now = Instant::now();
        for (rs, n) in self.counters.take_skipped() {
            self.engine.skipped(&rs, n, now);
        }
        self.next_wake = self.engine.poll(now);
        self.log_first_sync(now);
        for effect in self.engine.take_effects() {
            self.effect(effect, now).await;
        }
        if let Some((reply, result)) = self.answer.take() {
            self.publish_state();
            let _ = reply.send(result);
        }
    }

    /// Takes a command in; false when there is nothing more to do for it now.
    fn command(&mut self, cmd: Command) -> bool {
        let now = Instant::now();
        let (result, reply) = match cmd {
            Command::Release(by, reply) => (self.engine.release(&by), reply),
            Command::ReleaseService(svc, by, reply) => {
                (self.engine.release_service(&svc, now, &by), reply)
            }
            // Both are carried out by the engine's next poll: now.
            Command::FollowContainment(svc, trigger) => {
                self.engine.follow_containment(&svc, now, trigger);
                self.next_wake = Some(now);
                return false;
            }
            Command::SetDeciding(deciding) => {
                self.engine.set_deciding(deciding);
                self.next_wake = Some(now);
                return false;
            }
            Command::Quarantine(msg, reply) => (self.engine.quarantine(now, &msg), reply),
            Command::Follow(super::Reconnect(connect)) => {
                tracing::info!("following the Lease holder's view; the view keeps serving");
                self.stop_upstream();
                self.mirror.abort_all();
                self.remote = None;
                self.generation += 1;
                self.follows_holder = true;
                self.engine.set_following();
                self.connect(connect);
                return false;
            }
            Command::Reconnect(super::Reconnect(connect), term) => {
                if self.follows_holder {
                    // No Lease read: a random step, above nothing recorded.
                    self.take_over(term.unwrap_or_else(|| NewTerm {
                        step: crate::credentials::incarnation(),
                        above: 0,
                    }));
                } else {
                    tracing::info!("new credentials: reconnecting; the view keeps serving");
                }
                self.stop_upstream();
                self.remote = None;
                // Messages of the old upstream are told apart by their generation.
                self.generation += 1;
                self.connect(connect);
                return false;
            }
            Command::Disconnect(why) => {
                tracing::info!(%why, "the upstream stops; the view keeps serving");
                self.stop_upstream();
                self.mirror.abort_all();
                self.remote = None;
                self.connecting = None;
                self.generation += 1;
                self.out.state.send_modify(|s| s.message = why);
                return false;
            }
        };
        // The transition's effects are carried out with the engine's others.
        self.answer = Some((reply, result));
        true
    }

    /// Reads the remote again after following the holder: the engine takes the view over as
    /// it followed it, and publishes only what changed on the remote meanwhile, in a new term
    /// of the view's own.
    fn take_over(&mut self, term: NewTerm) {
        self.follows_holder = false;
        self.mirror.abort_all();
        let followed = self.engine.view().resource_version();
        (self.engine.view()).begin_own_term(term);
        tracing::info!(
            resource_version = followed,
            recorded = term.above,
            base = self.engine.view().term_base(),
            "taking the link over from the view followed: reading the remote"
        );
        self.engine.adopt_view();
    }

    /// Reaches the remote with `connect`, retrying with backoff until it answers.
    fn connect(&mut self, connect: Connect) {
        self.connecting = Some(Box::pin(connect_with_backoff(
            self.wire.clone(),
            connect,
            self.out.clone(),
        )));
    }

    /// The remote answered: the watchers start, unless the link is quarantined.
    fn connected(&mut self, dialed: Dialed<W::Remote>) {
        self.connecting = None;
        tracing::info!(
            servers = dialed.kinds.contains(&Kind::Server),
            "connected to the remote"
        );
        self.out.version.send_replace(dialed.version);
        (self.out.has_servers).send_replace(dialed.kinds.contains(&Kind::Server));
        self.engine.set_kinds(&dialed.kinds);
        self.remote = Some(dialed.remote);
        if self.follows_holder {
            self.start_following();
        } else if !matches!(self.engine.state(), State::Quarantined(_)) {
            self.start_upstream();
        }
    }

    /// Takes in `first` and the changes queued behind it, up to a batch; those of an earlier
    /// upstream run are dropped.
    fn changed(&mut self, first: Message) {
        let now = Instant::now();
        self.take(first, now);
        for _ in 0..BATCH {
            match self.rx.try_recv() {
                Ok(m) => self.take(m, now),
                Err(_) => break,
            }
        }
    }

    /// Ingests one upstream change; a first list's end, once taken in, may open the pod
    /// watcher.
    fn take(&mut self, msg: Message, now: Instant) {
        if msg.generation != self.generation {
            return;
        }
        let listed = match &msg.change {
            Change::InitDone(kind) => Some(*kind),
            _ => None,
        };
        self.engine.ingest(msg.change, now);
        if let (Some(kind), Some(u)) = (listed, &self.upstream)
            && u.listed(kind)
        {
            self.engine.pods_listing();
        }
    }

    /// Carries out one of the engine's effects.
    async fn effect(&mut self, effect: Effect, now: Instant) {
        match effect {
            Effect::StopUpstream => {
                self.stop_upstream();
                tracing::warn!("upstream stopped: the link is quarantined");
            }
            Effect::StartUpstream => {
                self.generation += 1;
                if self.remote.is_some() && !self.follows_holder {
                    self.start_upstream();
                    tracing::info!(generation = self.generation, "upstream restarted");
                }
            }
            Effect::FetchPods(fetch) => {
                if let Some(r) = self.remote.as_ref().filter(|_| !self.follows_holder) {
                    tracing::debug!(
                        pods = fetch.pods.len(),
                        "fetching pods kept endpoints point at"
                    );
                    let fetch = self.wire.fetch_pods(
                        r,
                        fetch,
                        self.generation,
                        self.tx.clone(),
                        self.counters.clone(),
                    );
                    self.fetches
                        .spawn(tracing::Instrument::in_current_span(fetch));
                }
            }
            Effect::Transition(t) if t.service.is_some() => {
                let svc = t.service.as_ref().map(ToString::to_string);
                tracing::warn!(service = svc.as_deref().unwrap_or_default(), from = t.from.as_str(), to = t.to.as_str(), reason = %t.reason, message = %t.message, "service containment changed");
                *self
                    .transitions
                    .services
                    .entry(t.reason.as_str())
                    .or_default() += 1;
                save(
                    self.persist.as_ref(),
                    Persist::Contained(contained_snapshot(&self.engine), now),
                )
                .await;
                // No receiver (standalone mode) is fine.
                let _ = self.out.transitions.send(t);
            }
            Effect::Transition(t) => {
                self.transitions.link += 1;
                tracing::warn!(from = t.from.as_str(), to = t.to.as_str(), reason = %t.reason, message = %t.message, "quarantine state changed");
                match self.engine.state() {
                    State::Quarantined(q) => {
                        save(self.persist.as_ref(), Persist::Save(q.clone(), now)).await;
                    }
                    State::Active => save(self.persist.as_ref(), Persist::Clear).await,
                    State::Rechecking { .. } => {}
                }
            }
        }
    }

    /// Follows the holder's view through the connected facade.
    fn start_following(&mut self) {
        if let Some(r) = &self.remote {
            self.mirror.abort_all();
            let follow = self.wire.follow(
                r,
                self.engine.view().clone(),
                self.counters.clone(),
                self.mirrored.clone(),
            );
            self.mirror
                .spawn(tracing::Instrument::in_current_span(follow));
        }
    }

    /// Starts a run of watchers on the connected remote (not on a holder's facade).
    fn start_upstream(&mut self) {
        if self.follows_holder {
            return;
        }
        if let Some(r) = &self.remote {
            self.engine.upstream_starts();
            self.upstream = Some(self.wire.watch(
                r,
                self.generation,
                self.tx.clone(),
                self.counters.clone(),
                self.wanted.clone(),
            ));
        }
    }

    /// Stops the watchers and the pod fetches. A view that follows the holder's goes on
    /// following it: a quarantine the holder recorded froze the holder's view already, and
    /// its release shows in that view.
    fn stop_upstream(&mut self) {
        self.upstream = None;
        self.fetches.abort_all();
    }

    /// Logs the first sync once, with what it took.
    fn log_first_sync(&mut self, now: Instant) {
        let Some(began) = self.first_sync.filter(|_| self.engine.synced_once()) else {
            return;
        };
        self.first_sync = None;
        let held = (self.engine.objects_by_kind()).map(|(k, n)| format!("{}={n}", k.name()));
        tracing::info!(
            took = ?now.duration_since(began),
            objects = %held.join(" "),
            services = self.engine.counters().services,
            contained = self.engine.contained_count(),
            "first sync complete: serving the view"
        );
    }

    fn publish_state(&self) {
        publish_state(
            &self.engine,
            &self.counters,
            self.remote.is_some(),
            *self.mirrored_rx.borrow(),
            &self.transitions,
            &self.out,
        );
    }
}

#[cfg(test)]
mod tests;
