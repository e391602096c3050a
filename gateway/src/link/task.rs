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
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::persist::{Persist, contained_snapshot, restore, save, spawn_persister};
use super::state::{Outputs, Tally, publish_state};
use super::wire::{Dialed, Watchers as _, Wire, connect_with_backoff};
use super::{BATCH, Command, Connect};
use crate::churn::quarantine::{RequestError, State, Transition};
use crate::churn::restore::Saved;
use crate::churn::{Change, Effect, Engine};
use crate::model::Kind;
use crate::model::wanted::WantedPods;
use crate::persist::LinkDir;
use crate::upstream::{Message, UpstreamCounters};
use crate::view::View;
use crate::view::replica::NewTerm;
use holder_synced::HolderSynced;
use inputs::Inputs;
use mode::{Mode, Progress, Source};
use timers::Timers;

/// What a link task is set up with: its spec, the view it serves, how it reaches the remote,
/// and where what it saved before (a quarantine, contained services) is restored from.
pub(super) struct Setup {
    pub spec: LinkSpec,
    pub view: View,
    pub connect: Connect,
    /// Its state directory: the quarantine and containments are saved there and restored from
    /// it. `None`: nothing is saved.
    pub dir: Option<LinkDir>,
    /// A quarantine a peer saved (cluster mode), restored before the directory's.
    pub seed: Option<Saved>,
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
    /// is published, and counts wake the task again only after [`timers::STATE_REFRESH`].
    Counted,
    /// [`timers::STATE_REFRESH`] has passed since the last [`Happened::Counted`].
    Rearmed,
}

/// A running link.
pub(super) struct LinkTask<W: Wire> {
    wire: Arc<W>,
    engine: Engine,
    out: Arc<Outputs>,
    /// Saves and clears the quarantine and containments, with a state directory.
    persist: Option<mpsc::Sender<Persist>>,
    counters: Arc<UpstreamCounters>,
    /// The pods the engine wants: the pod watcher decodes only those.
    wanted: WantedPods,
    inputs: Inputs,
    /// What it reads, and which run of it is current.
    source: Source<W>,
    holder_synced: HolderSynced,
    timers: Timers,
    transitions: Tally,
    answer: Option<Answer>,
}

impl<W: Wire> LinkTask<W> {
    /// A link serving `setup.view` that will connect with `setup.connect`, restored from its
    /// state directory or from `setup.seed` when it was quarantined; it runs until `shutdown`
    /// changes.
    pub(super) fn new(
        wire: W,
        setup: Setup,
        out: Outputs,
        commands: mpsc::Receiver<Command>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let Setup {
            spec,
            view,
            connect,
            dir,
            seed,
        } = setup;
        let now = Instant::now();
        // Until discovery says whether the remote serves Linkerd's Servers, expect every kind.
        let mut engine = Engine::new(&spec, &Kind::ALL, view.clone(), now);
        restore(&mut engine, dir.as_ref(), seed, now);
        let counters = Arc::new(UpstreamCounters::default());
        let wanted = WantedPods::everything();
        engine.mirror_wanted(wanted.clone());
        let inputs = Inputs::new(commands, shutdown, counters.health.subscribe());
        let mut task = Self {
            wire: Arc::new(wire),
            engine,
            out: Arc::new(out),
            persist: dir.map(|d| spawn_persister(d, view)),
            counters,
            wanted,
            inputs,
            source: Source::new(),
            holder_synced: HolderSynced::new(),
            timers: Timers::new(now),
            transitions: Tally::default(),
            answer: None,
        };
        task.connect(connect, false);
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
        self.source.mode = Mode::Off { holder: false };
        tracing::info!("link stopped");
    }

    /// Waits for what happens next.
    async fn next(&mut self) -> Happened<W::Remote> {
        let far = Instant::now() + Duration::from_secs(3600);
        tokio::select! {
            biased;
            _ = self.inputs.shutdown.changed() => Happened::Shutdown,
            Some(cmd) = self.inputs.commands.recv() => Happened::Command(cmd),
            progress = self.source.mode.progress() => match progress {
                Progress::Connected(dialed) => Happened::Connected(dialed),
                Progress::Fetched => Happened::Woken,
            },
            Some(msg) = self.inputs.rx.recv() => Happened::Changed(msg),
            () = sleep_until(self.timers.next_wake.unwrap_or(far)) => Happened::Woken,
            Ok(()) = self.inputs.health.changed() => Happened::Woken,
            Ok(()) = self.holder_synced.changed() => Happened::Woken,
            () = self.counters.touched.notified(), if self.timers.counts_wake_at.is_none() => {
                Happened::Counted
            }
            () = sleep_until(self.timers.counts_wake_at.unwrap_or(far)),
                if self.timers.counts_wake_at.is_some() => Happened::Rearmed,
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
            Happened::Counted => self.timers.counted(Instant::now()),
            Happened::Rearmed => self.timers.rearm(),
        }
        let now = Instant::now();
        self.timers.next_wake = self.engine.poll(now);
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
                self.timers.next_wake = Some(now);
                return false;
            }
            Command::SetDeciding(deciding) => {
                self.engine.set_deciding(deciding);
                self.timers.next_wake = Some(now);
                return false;
            }
            Command::Quarantine(msg, reply) => (self.engine.quarantine(now, &msg), reply),
            Command::Follow(super::Reconnect(connect)) => {
                tracing::info!("following the Lease holder's view; the view keeps serving");
                self.engine.set_following();
                self.connect(connect, true);
                return false;
            }
            Command::Reconnect(super::Reconnect(connect), term) => {
                if self.source.mode.follows_holder() {
                    self.take_over(term);
                } else {
                    tracing::info!("new credentials: reconnecting; the view keeps serving");
                }
                self.connect(connect, false);
                return false;
            }
            Command::Disconnect(why) => {
                tracing::info!(%why, "the upstream stops; the view keeps serving");
                self.source.switch(Mode::Off {
                    holder: self.source.mode.follows_holder(),
                });
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
        self.source.switch(Mode::Off { holder: false });
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

    /// Reaches the remote (or, with `holder`, the Lease holder's facade) with `connect`,
    /// retrying with backoff until it answers; what the link read before is let go.
    fn connect(&mut self, connect: Connect, holder: bool) {
        let dialing = Box::pin(connect_with_backoff(
            self.wire.clone(),
            connect,
            self.out.clone(),
        ));
        self.source.switch(Mode::Connecting { dialing, holder });
    }

    /// The remote answered: the watchers start, unless the link is quarantined.
    fn connected(&mut self, dialed: Dialed<W::Remote>) {
        tracing::info!(
            servers = dialed.kinds.contains(&Kind::Server),
            "connected to the remote"
        );
        self.out.version.send_replace(dialed.version);
        (self.out.has_servers).send_replace(dialed.kinds.contains(&Kind::Server));
        self.engine.set_kinds(&dialed.kinds);
        let remote = dialed.remote;
        if self.source.mode.follows_holder() {
            let follow = self.wire.follow(
                &remote,
                self.engine.view().clone(),
                self.counters.clone(),
                self.holder_synced.sender(),
            );
            let mut follower = JoinSet::new();
            follower.spawn(tracing::Instrument::in_current_span(follow));
            self.source.mode = Mode::Following { remote, follower };
        } else {
            self.source.mode = Mode::Reading {
                remote,
                watchers: None,
                fetches: JoinSet::new(),
            };
            if !matches!(self.engine.state(), State::Quarantined(_)) {
                self.start_upstream();
            }
        }
    }

    /// Takes in `first` and the changes queued behind it, up to a batch; those of an earlier
    /// upstream run are dropped.
    fn changed(&mut self, first: Message) {
        self.take(first);
        for _ in 0..BATCH {
            match self.inputs.rx.try_recv() {
                Ok(m) => self.take(m),
                Err(_) => break,
            }
        }
    }

    /// Ingests one upstream change, as of when it was read ([`Message::at`]); a first list's
    /// end, once taken in, may open the pod watcher.
    fn take(&mut self, msg: Message) {
        if msg.generation != self.source.generation {
            return;
        }
        let listed = match &msg.change {
            Change::InitDone(kind) => Some(*kind),
            _ => None,
        };
        self.engine.ingest(msg.change, msg.at);
        if let (
            Some(kind),
            Mode::Reading {
                watchers: Some(u), ..
            },
        ) = (listed, &self.source.mode)
            && u.listed(kind)
        {
            self.engine.pods_listing();
        }
    }

    /// Carries out one of the engine's effects.
    async fn effect(&mut self, effect: Effect, now: Instant) {
        match effect {
            Effect::StopUpstream => {
                self.source.mode.stop_watchers();
                tracing::warn!("upstream stopped: the link is quarantined");
            }
            Effect::StartUpstream => {
                self.source.new_run();
                if self.source.mode.reading().is_some() {
                    self.start_upstream();
                    tracing::info!(generation = self.source.generation, "upstream restarted");
                }
            }
            Effect::FetchPods(fetch) => {
                if let Mode::Reading {
                    remote, fetches, ..
                } = &mut self.source.mode
                {
                    tracing::debug!(
                        pods = fetch.pods.len(),
                        "fetching pods kept endpoints point at"
                    );
                    let fetch = self.wire.fetch_pods(
                        remote,
                        fetch,
                        self.source.generation,
                        self.inputs.tx.clone(),
                        self.counters.clone(),
                    );
                    fetches.spawn(tracing::Instrument::in_current_span(fetch));
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

    /// Starts a run of watchers on the remote it reads (not on a holder's facade).
    fn start_upstream(&mut self) {
        if let Mode::Reading {
            remote, watchers, ..
        } = &mut self.source.mode
        {
            self.engine.upstream_starts();
            *watchers = Some(self.wire.watch(
                remote,
                self.source.generation,
                self.inputs.tx.clone(),
                self.counters.clone(),
                self.wanted.clone(),
            ));
        }
    }

    /// Logs the first sync once, with what it took.
    fn log_first_sync(&mut self, now: Instant) {
        let Some(began) = self.timers.first_sync(self.engine.synced_once()) else {
            return;
        };
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
            self.source.mode.connected(),
            self.holder_synced.get(),
            &self.transitions,
            &self.out,
        );
    }
}

mod holder_synced;
mod inputs;
mod mode;
#[cfg(test)]
mod tests;
mod timers;
