//! Whether a following link's view has held a whole view of the holder's ([`HolderSynced`]):
//! the follower says so, and the task publishes it in the link's state.

use tokio::sync::watch;

/// Whether the view has held a whole view of the Lease holder's (then it is served, as a
/// synced link's is, whoever publishes into it next). The task keeps the sender, so each
/// follower it starts gets one, and wakes when the value changes.
pub(super) struct HolderSynced {
    tx: watch::Sender<bool>,
    rx: watch::Receiver<bool>,
}

impl HolderSynced {
    /// Not yet.
    pub(super) fn new() -> Self {
        let (tx, rx) = watch::channel(false);
        Self { tx, rx }
    }

    /// For a follower, to say so once its view has held the holder's whole view.
    pub(super) fn sender(&self) -> watch::Sender<bool> {
        self.tx.clone()
    }

    /// Whether the view has held the holder's whole view.
    pub(super) fn get(&self) -> bool {
        *self.rx.borrow()
    }

    /// Waits until the value changes.
    pub(super) async fn changed(&mut self) -> Result<(), watch::error::RecvError> {
        self.rx.changed().await
    }
}
