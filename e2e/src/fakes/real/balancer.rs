//! A TCP balancer in front of API servers, as a managed control plane puts one (a cloud load
//! balancer, an HAProxy): one address, each connection passed whole to a backend. TLS goes
//! through untouched (the servers share one serving certificate, which names 127.0.0.1).
//!
//! It routes by preference, not round-robin: each new connection goes to the first backend, in
//! the order given, that accepts it; a backend that refuses (stopped, or stopped listening as
//! a kube-apiserver does at SIGTERM) is skipped. So while the first backend listens every
//! connection lands on it, and a test knows which server its client's watches are on. Counts
//! per backend say where connections went and how many are open now.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A running balancer; its connections end when it is dropped.
#[derive(Debug)]
pub struct Balancer {
    /// Where it listens (loopback).
    pub addr: SocketAddr,
    backends: Arc<[Backend]>,
    task: JoinHandle<()>,
}

/// One backend and its connections.
#[derive(Debug)]
struct Backend {
    addr: SocketAddr,
    /// Connections passed to it so far.
    opened: AtomicU64,
    /// Connections to it open now.
    open: AtomicU64,
}

impl Balancer {
    /// Listens on a free loopback port and passes connections to `backends`, the first that
    /// accepts in this order.
    pub async fn start(backends: &[SocketAddr]) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(crate::process::free_addr())
            .await
            .context("binding the balancer")?;
        let addr = listener.local_addr()?;
        let backends: Arc<[Backend]> = (backends.iter())
            .map(|&addr| Backend {
                addr,
                opened: AtomicU64::new(0),
                open: AtomicU64::new(0),
            })
            .collect();
        let task = tokio::spawn(accept(listener, backends.clone()));
        Ok(Self {
            addr,
            backends,
            task,
        })
    }

    /// `https://ADDR`, for a kubeconfig.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Connections passed to backend `i` so far.
    pub fn opened(&self, i: usize) -> u64 {
        self.backends[i].opened.load(Ordering::Relaxed)
    }

    /// Connections to backend `i` open now.
    pub fn open(&self, i: usize) -> u64 {
        self.backends[i].open.load(Ordering::Relaxed)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        // The accept task owns the connections' JoinSet: aborting it drops them all.
        self.task.abort();
    }
}

/// Accepts until aborted, one task a connection.
async fn accept(listener: TcpListener, backends: Arc<[Backend]>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                connections.spawn(pass(client, backends.clone()));
            }
            // Reaps finished connections so the set does not grow with them.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Connects `client` to the first backend that accepts and copies both ways until either side
/// closes; a client no backend accepts is closed.
async fn pass(mut client: TcpStream, backends: Arc<[Backend]>) {
    for b in backends.iter() {
        let Ok(mut server) = TcpStream::connect(b.addr).await else {
            continue;
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        b.opened.fetch_add(1, Ordering::Relaxed);
        b.open.fetch_add(1, Ordering::Relaxed);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        b.open.fetch_sub(1, Ordering::Relaxed);
        return;
    }
}
