//! What wakes a link's task from outside ([`Inputs`]): the upstream's changes, commands, the
//! process stopping, and the remote's health.

use tokio::sync::{mpsc, watch};

use crate::link::{Command, UPSTREAM_QUEUE};
use crate::upstream::Message;
use crate::upstream::health::Unreachable;

/// The channels the task reads from (and the sender of the upstream's queue, for the watchers
/// and the pod fetches it starts).
pub(super) struct Inputs {
    /// The upstream's queue; each run of watchers gets a sender.
    pub tx: mpsc::Sender<Message>,
    pub rx: mpsc::Receiver<Message>,
    pub commands: mpsc::Receiver<Command>,
    pub shutdown: watch::Receiver<bool>,
    /// Wakes the task when the remote stops or starts answering.
    pub health: watch::Receiver<Option<Unreachable>>,
}

impl Inputs {
    /// A new upstream queue, with the task's other inputs.
    pub(super) fn new(
        commands: mpsc::Receiver<Command>,
        shutdown: watch::Receiver<bool>,
        health: watch::Receiver<Option<Unreachable>>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(UPSTREAM_QUEUE);
        Self {
            tx,
            rx,
            commands,
            shutdown,
            health,
        }
    }
}
