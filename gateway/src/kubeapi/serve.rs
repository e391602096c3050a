//! The facade's listener: accepts connections (TLS or, for loopback tests, plain HTTP) and serves
//! a router on each, HTTP/1.1 and HTTP/2, within bounds a hostile client cannot push past.
//!
//! Flow: a connection permit (at most [`ServeLimits::max_connections`] connections are open; the
//! next waits in the kernel's backlog until one closes) -> accept -> the socket wrapped with a
//! write timeout -> TLS handshake with a deadline -> HTTP/1.1 GETs to [`h1`] (lists and watches
//! written straight to the socket: an idle watch holds no hyper buffers), everything else
//! (HTTP/2, bodies, other methods, HTTP/1.0, malformed or oversized heads) to hyper-util's auto
//! builder (header read timeout, header size and count limits) -> the router. Each connection
//! is its own task; a failure ends only that connection.
//!
//! What each bound defends against:
//! - slowloris (headers dribbled byte by byte): the header read timeout (hyper's, and `h1`'s
//!   own) closes the connection when a request head has not arrived in time (an idle keep-alive
//!   connection too; a plain connection that sends nothing at all is cut off after as long).
//!   Known gap: a TLS client that negotiates HTTP/2 and then stays silent is held until it
//!   closes (hyper's HTTP/2 handshake has no deadline); the connection limit bounds what that
//!   costs;
//! - a watcher that never reads its socket: once the kernel's buffers are full a write stays
//!   pending, and after [`ServeLimits::write_timeout`] the connection is closed, its watch slot
//!   freed (the view's fan-out never queues for it: it only lags on the shared ring);
//! - oversized request lines and headers: 414 and 431 from hyper (`h1` hands such a head to
//!   hyper); bodies: 413 in the facade.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use serde::Serialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Connections the facade keeps open at most by default. An idle TLS connection cost about
/// 40 KiB when last measured that way, before the facade's own HTTP/1.1 path; an HTTP/1.1 watch
/// now costs about 12 KiB (docs/figures.md). 10,000 of them stay under 400 MiB; a link's
/// consumers need a handful of connections each.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// How long a client has to send a request head (the API server's Go default has none; 10 s is
/// what nginx and Envoy give a client on a fresh connection).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one write may stay pending before the connection is closed: a client that has not
/// read a byte for this long is stuck, not slow.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a client has to complete the TLS handshake, so one that connects and says nothing
/// holds nothing.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest request head (request line and headers). A little over hyper's URI limit
/// (65,534 bytes), so an overlong URI gets 414 and overlong headers 431; client-go's heads are
/// a few hundred bytes.
pub const MAX_HEADER_BYTES: usize = 80 * 1024;

/// Headers per request at most (hyper's default; client-go sends about ten).
pub const MAX_HEADERS: usize = 100;

/// The bounds of one listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServeLimits {
    /// Connections open at most; more wait in the listen backlog.
    pub max_connections: usize,
    /// How long a client has to send a request head.
    #[serde(with = "secs")]
    pub header_read_timeout: Duration,
    /// How long one write may stay pending.
    #[serde(with = "secs")]
    pub write_timeout: Duration,
    /// How long a client has to complete the TLS handshake. Not in `/config`, which shows what
    /// the flags set: no flag sets it.
    #[serde(skip)]
    pub handshake_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

/// Durations as seconds with a fraction, as the rest of `/config` writes them.
mod secs {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}s", d.as_secs_f64()))
    }
}

/// The listen backlog: connections the kernel completes before Floodgate accepts them. Linux
/// caps it at `net.core.somaxconn` (4096 by default); a restart herd of consumers reconnecting
/// at once fits, where tokio's default of 1024 drops handshakes.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds the facade's listener with [`LISTEN_BACKLOG`].
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `router` on `listener` until `shutdown` completes, over TLS when `tls` is given; then
/// stops accepting, asks every open connection to finish (HTTP/1: after its response in flight;
/// HTTP/2: GOAWAY) and returns once they all have (watches end when their view lets them go).
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: Router,
    limits: ServeLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let acceptor = tls.map(TlsAcceptor::from);
    // Permits are never closed, so acquiring one only fails if that changes.
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    // HTTP/1 connections served by `h1` close once their response in flight ends.
    let (closing, closing_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => {
                closing.send_replace(true);
                graceful.shutdown().await;
                return Ok(());
            }
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return Ok(()),
            },
        };
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => {
                closing.send_replace(true);
                graceful.shutdown().await;
                return Ok(());
            }
            r = listener.accept() => match r {
                Ok(c) => c,
                // Out of file descriptors and the like: wait a little rather than spin.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // A watch event is a small write, often right after another (HTTP/2 writes each
        // stream's frame): with Nagle's algorithm it would wait for the client's delayed ACK,
        // about 40 ms. The API server (Go) sets TCP_NODELAY on every connection too.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
        }
        let accepted = Accepted {
            tcp,
            peer,
            acceptor: acceptor.clone(),
            router: router.clone(),
            shutdown: Shutdown {
                watcher: graceful.watcher(),
                closing: closing_rx.clone(),
            },
            limits,
        };
        tokio::spawn(connection(accepted, permit));
    }
}

/// An accepted connection and what serves it.
struct Accepted {
    tcp: TcpStream,
    peer: SocketAddr,
    /// TLS, when the listener has it.
    acceptor: Option<TlsAcceptor>,
    router: Router,
    shutdown: Shutdown,
    limits: ServeLimits,
}

/// How a connection learns of a graceful shutdown: hyper's `watcher` for the connections hyper
/// serves; `closing` turns true for those `h1` serves.
struct Shutdown {
    watcher: Watcher,
    closing: watch::Receiver<bool>,
}

/// Serves one accepted connection, over TLS when there is an `acceptor`, until it ends or a
/// graceful shutdown ends it; `_permit` is its connection slot, freed when it ends. HTTP/1.1
/// GETs are answered by [`h1`] (an idle watch then holds no hyper buffers), the rest by hyper.
async fn connection(accepted: Accepted, _permit: OwnedSemaphorePermit) {
    let peer = accepted.peer;
    // Each state's future is boxed and awaited on its own: a task holds only the state its
    // connection is in (a watch waiting), not the largest (hyper's connection, the TLS
    // handshake), as one inline future would.
    let starting = Box::pin(start(accepted));
    let Some(serving) = starting.await else {
        return;
    };
    if let Err(e) = serving.await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Waits for a plain connection's first byte or a TLS connection's handshake, then says what
/// serves it; `None` when the client sent nothing in time or the handshake failed.
async fn start(accepted: Accepted) -> Option<Serving> {
    let Accepted {
        tcp,
        peer,
        acceptor,
        router,
        shutdown: Shutdown { watcher, closing },
        limits,
    } = accepted;
    Some(match acceptor {
        None => {
            let first = first_byte(&tcp, peer, &limits).await?;
            let io = with_write_timeout(tcp, &limits);
            // A GET starts with `G`; anything else (HTTP/2's preface, another method) is
            // hyper's from the start, and hyper's auto builder tells the versions apart.
            if first == b'G' {
                Box::pin(h1::serve(
                    io,
                    router,
                    limits,
                    closing,
                    watcher,
                    Handoff::Auto,
                ))
            } else {
                Box::pin(hyper_serves(io, router, limits, watcher, Handoff::Auto))
            }
        }
        Some(acceptor) => {
            let io = with_write_timeout(tcp, &limits);
            let tls = handshake(&acceptor, io, peer, &limits).await?;
            // ALPN says which protocol follows, so hyper's HTTP/1 header timer runs
            // from the start instead of waiting on version detection.
            if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                Box::pin(hyper_serves(tls, router, limits, watcher, Handoff::Http2))
            } else {
                Box::pin(h1::serve(
                    tls,
                    router,
                    limits,
                    closing,
                    watcher,
                    Handoff::Http1,
                ))
            }
        }
    })
}

/// What serves a connection once it is accepted (and its TLS handshake done).
type Serving = Pin<Box<dyn std::future::Future<Output = Result<(), BoxError>> + Send>>;

/// How a connection's serving ends in error (hyper's and `h1`'s alike).
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The protocol hyper serves a connection with.
#[derive(Clone, Copy, Debug)]
enum Handoff {
    /// HTTP/1 or HTTP/2, as the first bytes say (a plain connection).
    Auto,
    /// HTTP/1 only (TLS without `h2` in ALPN).
    Http1,
    /// HTTP/2 only (`h2` in ALPN).
    Http2,
}

/// hyper serves `io` (the rest of the connection) with `router`, until it ends or a graceful
/// shutdown ends it.
async fn hyper_serves<IO>(
    io: IO,
    router: Router,
    limits: ServeLimits,
    watcher: Watcher,
    handoff: Handoff,
) -> Result<(), BoxError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let b = builder(&limits);
    let b = match handoff {
        Handoff::Auto => b,
        Handoff::Http1 => b.http1_only(),
        Handoff::Http2 => b.http2_only(),
    };
    let conn = b.serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(router));
    watcher.watch(conn.into_owned()).await
}

/// The first byte a plain connection sends (peeked, not read), if it sends one within the
/// header read timeout. hyper-util reads the first bytes to tell HTTP/1 from HTTP/2 before
/// hyper's header timer runs: a client that sends nothing is cut off here.
async fn first_byte(tcp: &TcpStream, peer: SocketAddr, limits: &ServeLimits) -> Option<u8> {
    let mut byte = [0u8; 1];
    let first = tokio::time::timeout(limits.header_read_timeout, tcp.peek(&mut byte));
    let sent = matches!(first.await, Ok(Ok(n)) if n > 0);
    if !sent {
        tracing::debug!(%peer, "no request within the header read timeout");
    }
    sent.then_some(byte[0])
}

/// The TLS handshake, within [`ServeLimits::handshake_timeout`]; `None` (logged) when it
/// fails or times out.
async fn handshake(
    acceptor: &TlsAcceptor,
    io: Pin<Box<TimeoutStream<TcpStream>>>,
    peer: SocketAddr,
    limits: &ServeLimits,
) -> Option<TlsStream<Pin<Box<TimeoutStream<TcpStream>>>>> {
    match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(io)).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

fn with_write_timeout(tcp: TcpStream, limits: &ServeLimits) -> Pin<Box<TimeoutStream<TcpStream>>> {
    let mut io = TimeoutStream::new(tcp);
    io.set_write_timeout(Some(limits.write_timeout));
    Box::pin(io)
}

fn builder(limits: &ServeLimits) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_headers(MAX_HEADERS)
        .max_buf_size(MAX_HEADER_BYTES + 8 * 1024);
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    b
}

mod h1;

#[cfg(test)]
mod tests;
