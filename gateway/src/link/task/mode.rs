//! What a link reads, and what it holds for that: one [`Mode`] at a time, with the generation
//! of its current upstream run ([`Source`]). Leaving a mode drops what it held (its watchers
//! stop, its fetches and its follower are aborted with their `JoinSet`s), so a transition is an
//! assignment and no command repeats a teardown.

use futures_util::future::BoxFuture;
use tokio::task::JoinSet;

use crate::link::wire::{Dialed, Wire};

/// Where a link reads from.
pub(super) enum Mode<W: Wire> {
    /// Told to read nothing ([`crate::link::Command::Disconnect`]); `holder` when it followed
    /// the Lease holder before.
    Off { holder: bool },
    /// Reaching the remote (or, with `holder`, the Lease holder's facade), retried with backoff
    /// until it answers.
    Connecting {
        dialing: BoxFuture<'static, Dialed<W::Remote>>,
        holder: bool,
    },
    /// Reading the remote: its watchers (none while the link is quarantined) and the pod
    /// fetches the engine asked for.
    Reading {
        remote: W::Remote,
        watchers: Option<W::Watchers>,
        fetches: JoinSet<()>,
    },
    /// Following the Lease holder's view through its facade: both are only held, and let go
    /// with the mode.
    Following {
        #[expect(dead_code, reason = "held: the connection to the holder's facade")]
        remote: W::Remote,
        #[expect(dead_code, reason = "held: aborted when the mode is left")]
        follower: JoinSet<()>,
    },
}

/// The mode and its upstream run. Each message into the task's queue carries the generation
/// of the run that sent it, and those of earlier runs are dropped. A run begins when the link
/// switches mode ([`Source::switch`]) and when its watchers restart ([`Source::new_run`]); the
/// remote answering carries on the run its dial began.
pub(super) struct Source<W: Wire> {
    /// What it reads, and what it holds for that.
    pub mode: Mode<W>,
    /// The current upstream run.
    pub generation: u64,
}

impl<W: Wire> Source<W> {
    /// Reading nothing yet: the first connection makes the generation 1.
    pub(super) fn new() -> Self {
        Self {
            mode: Mode::Off { holder: false },
            generation: 0,
        }
    }

    /// Goes over to `next`: what the old mode held goes with it (its watchers stop, its
    /// fetches and follower are aborted), and messages of its run, told apart by their
    /// generation, are dropped.
    pub(super) fn switch(&mut self, next: Mode<W>) {
        self.mode = next;
        self.generation += 1;
    }

    /// A new run of watchers in the same mode: messages of the last one are dropped.
    pub(super) fn new_run(&mut self) {
        self.generation += 1;
    }
}

/// What a mode's own work brought: the remote answering, or a fetch ending.
pub(super) enum Progress<R> {
    Connected(Dialed<R>),
    Fetched,
}

impl<W: Wire> Mode<W> {
    /// Whether the link reads the Lease holder's view rather than the remote.
    pub(super) fn follows_holder(&self) -> bool {
        match self {
            Mode::Off { holder } | Mode::Connecting { holder, .. } => *holder,
            Mode::Reading { .. } => false,
            Mode::Following { .. } => true,
        }
    }

    /// Whether it holds a connection (to the remote or the holder).
    pub(super) fn connected(&self) -> bool {
        matches!(self, Mode::Reading { .. } | Mode::Following { .. })
    }

    /// The remote it reads, when it reads the remote.
    pub(super) fn reading(&self) -> Option<&W::Remote> {
        match self {
            Mode::Reading { remote, .. } => Some(remote),
            _ => None,
        }
    }

    /// Stops the watchers and the pod fetches of a mode that reads the remote; the connection
    /// stays (a quarantine).
    pub(super) fn stop_watchers(&mut self) {
        if let Mode::Reading {
            watchers, fetches, ..
        } = self
        {
            *watchers = None;
            fetches.abort_all();
        }
    }

    /// Waits for the mode's own work: the dial's answer, or a fetch's end; never, for a mode
    /// with nothing under way.
    pub(super) async fn progress(&mut self) -> Progress<W::Remote> {
        match self {
            Mode::Connecting { dialing, .. } => Progress::Connected(dialing.await),
            Mode::Reading { fetches, .. } if !fetches.is_empty() => {
                fetches.join_next().await;
                Progress::Fetched
            }
            _ => std::future::pending().await,
        }
    }
}
