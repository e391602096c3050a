//! A TCP relay to put between two processes (a follower and its Lease holder's facade): bytes
//! pass through unchanged, TLS included, until [`TcpRelay::cut`] drops every connection and
//! refuses new ones, as a network partition would; [`TcpRelay::mend`] lets them through again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A relay listening on `127.0.0.1:0` in front of one address.
#[derive(Debug)]
pub struct TcpRelay {
    /// Where it listens.
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped by every cut: each connection ends when it changes.
    cuts: watch::Sender<u64>,
    accept: JoinHandle<()>,
}

impl TcpRelay {
    /// Relays connections to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let (cuts, _) = watch::channel(0);
        let accept = tokio::spawn(accept(listener, target, cut.clone(), cuts.clone()));
        Ok(Self {
            addr,
            cut,
            cuts,
            accept,
        })
    }

    /// Drops every connection and refuses new ones (closed as soon as accepted).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Lets connections through again.
    pub fn mend(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

async fn accept(
    listener: TcpListener,
    target: SocketAddr,
    cut: Arc<AtomicBool>,
    cuts: watch::Sender<u64>,
) {
    while let Ok((mut inbound, _)) = listener.accept().await {
        if cut.load(Ordering::SeqCst) {
            continue;
        }
        let mut ended = cuts.subscribe();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(target).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                _ = ended.changed() => {}
            }
        });
    }
}
