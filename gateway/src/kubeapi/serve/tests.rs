//! The listener's bounds against hostile clients on real sockets: slowloris, a watcher that never
//! reads, too many connections, oversized heads and bodies.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::{ServeLimits, serve};
use crate::kubeapi::{Api, router};
use crate::model::Object;
use crate::view::{Change, View};

const TOKEN: &str = "t0k3n";

fn mk_service(name: &str, pad: usize) -> Object {
    Object::Service(Arc::new(k8s_openapi::api::core::v1::Service {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("prod".into()),
            annotations: Some([("pad".to_owned(), "x".repeat(pad))].into()),
            ..Default::default()
        },
        ..Default::default()
    }))
}

/// Serves an API over `view` on loopback with `limits`; returns its address and the API.
async fn start(view: View, limits: ServeLimits) -> (std::net::SocketAddr, Arc<Api<View>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let api = Arc::new(Api::new(view, TOKEN));
    let r = router(api.clone());
    tokio::spawn(serve(listener, None, r, limits, std::future::pending()));
    (addr, api)
}

fn limits() -> ServeLimits {
    ServeLimits {
        max_connections: 100,
        header_read_timeout: Duration::from_millis(500),
        write_timeout: Duration::from_millis(500),
        ..ServeLimits::default()
    }
}

/// Reads until the server closes; `None` when it has not within `secs`.
async fn read_to_close(s: &mut TcpStream, secs: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(secs), async {
        let mut buf = [0u8; 8192];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok().map(|()| out)
}

/// The status code of a raw HTTP/1.1 response.
fn code(resp: &[u8]) -> u16 {
    let head = String::from_utf8_lossy(resp);
    head.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {head:?}"))
}

fn body(resp: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(resp);
    let (_, b) = text.split_once("\r\n\r\n").expect("a head and a body");
    serde_json::from_str(b).unwrap_or_else(|e| panic!("{e}: {b:?}"))
}

/// Slowloris: a client that sends its request head one byte every 100 ms is cut off by the
/// header read timeout (500 ms here), though it never stops sending.
#[tokio::test]
async fn a_dribbled_request_head_is_cut_off() {
    let (addr, _) = start(View::new(1, 10), limits()).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let head = b"GET /api/v1/services HTTP/1.1\r\nhost: x\r\nx-slow: ";
    let dribble = async {
        for b in head.iter().chain(std::iter::repeat(&b'a')) {
            if s.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let cut = tokio::time::timeout(Duration::from_secs(20), dribble).await;
    assert!(cut.is_ok(), "the server kept a dribbling client for 20 s");
}

/// A connection that never sends a byte is closed too (the timer runs from the first wait
/// for a head), so idle sockets cannot pin connection slots.
#[tokio::test]
async fn a_silent_connection_is_closed() {
    let (addr, _) = start(View::new(1, 10), limits()).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    assert!(read_to_close(&mut s, 20).await.is_some(), "still open");
}

/// A watcher whose client never reads: once its socket buffers fill, the pending write times
/// out and the server closes the connection, freeing its watch slot.
#[tokio::test]
async fn a_watcher_that_never_reads_its_socket_is_dropped() {
    let view = View::new(1, 100);
    // About 8 MB of initial state: more than loopback's socket buffers hold.
    view.apply(
        (0..400).map(|i| Change::Upsert(mk_service(&format!("s{i}"), 20_000))),
        Instant::now(),
    );
    let (addr, api) = start(view, limits()).await;
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.set_recv_buffer_size(4096).expect("small buffer");
    let mut s = sock.connect(addr).await.expect("connect");
    s.write_all(
        format!(
            "GET /api/v1/services?watch=true HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .expect("request");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while api.open_watches() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the watch opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while api.open_watches() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a watcher that never reads was dropped within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(s);
}

/// With two connection slots, a third connection waits until one of the first two closes.
#[tokio::test]
async fn connections_past_the_limit_wait_for_a_slot() {
    let lim = ServeLimits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(30),
        ..limits()
    };
    let (addr, _) = start(View::new(1, 10), lim).await;
    let first = TcpStream::connect(addr).await.expect("connect");
    let _second = TcpStream::connect(addr).await.expect("connect");
    // The kernel completes the handshake; Floodgate does not accept it yet.
    let mut third = TcpStream::connect(addr).await.expect("connect");
    third
        .write_all(b"GET /version HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(300), third.read(&mut buf)).await;
    assert!(early.is_err(), "answered past the connection limit");
    drop(first);
    let resp = read_to_close(&mut third, 20).await.expect("answered");
    assert_eq!(code(&resp), 401, "served once a slot freed");
}

/// Oversized request lines and heads get hyper's 414 and 431; oversized bodies the facade's
/// 413 Status.
#[tokio::test]
async fn oversized_requests_get_414_431_and_413() {
    let (addr, _) = start(View::new(1, 10), limits()).await;
    let send = async |req: Vec<u8>| {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        // The server may answer and close before the whole request is written.
        let _ = s.write_all(&req).await;
        read_to_close(&mut s, 20).await.expect("an answer")
    };
    let long_uri = format!(
        "GET /api/v1/services?x={} HTTP/1.1\r\nhost: x\r\n\r\n",
        "a".repeat(70_000)
    );
    assert_eq!(code(&send(long_uri.into_bytes()).await), 414);
    let big_head = format!(
        "GET /api/v1/services HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(200_000)
    );
    assert_eq!(code(&send(big_head.into_bytes()).await), 431);
    let many: String = (0..200).map(|i| format!("x-{i}: v\r\n")).collect();
    let many = format!("GET /api/v1/services HTTP/1.1\r\nhost: x\r\n{many}\r\n");
    assert_eq!(code(&send(many.into_bytes()).await), 431);
    let n = crate::kubeapi::MAX_BODY + 1;
    let mut big_body = format!(
        "POST /api/v1/namespaces/prod/events HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\ncontent-length: {n}\r\nconnection: close\r\n\r\n"
    )
    .into_bytes();
    big_body.resize(big_body.len() + n, b' ');
    let resp = send(big_body).await;
    assert_eq!(code(&resp), 413);
    assert_eq!(body(&resp)["reason"], "RequestEntityTooLarge");
}

/// A connection's task holds only the state it is in: each state (waiting for the first byte
/// or the handshake, hyper's connection, a request read or answered by `h1`) is boxed apart.
/// Inline, the task was 7,992 bytes, the size of its largest state, for every idle watcher.
#[tokio::test]
async fn a_connections_task_holds_only_the_state_it_is_in() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let client = TcpStream::connect(listener.local_addr().expect("addr"));
    let (client, accepted) = tokio::join!(client, listener.accept());
    let _client = client.expect("connect");
    let (tcp, peer) = accepted.expect("accept");
    let api = Arc::new(Api::new(View::new(1, 10), TOKEN));
    let permit = Arc::new(tokio::sync::Semaphore::new(1))
        .acquire_owned()
        .await
        .expect("a permit");
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let (_closing, closing) = tokio::sync::watch::channel(false);
    let shutdown = super::Shutdown {
        watcher: graceful.watcher(),
        closing,
    };
    let accepted = super::Accepted {
        tcp,
        peer,
        acceptor: None,
        router: router(api),
        shutdown,
        limits: limits(),
    };
    let task = super::connection(accepted, permit);
    let size = std::mem::size_of_val(&task);
    assert!(size <= 512, "a connection's task future is {size} bytes");
}
