//! The HTTP/1.1 GETs `h1` answers, on real sockets, read byte for byte as a client sees them:
//! keep-alive, pipelining, `Connection: close`, a watch's chunks, a client that goes away, the
//! hand-over to hyper, and a graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::kubeapi::serve::{ServeLimits, serve};
use crate::kubeapi::{Api, router};
use crate::model::Object;
use crate::view::{Change, View};

const TOKEN: &str = "t0k3n";

fn service(name: &str) -> Object {
    Object::Service(Arc::new(k8s_openapi::api::core::v1::Service {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("prod".into()),
            ..Default::default()
        },
        ..Default::default()
    }))
}

/// Serves a view holding the service `a` on loopback until `shutdown`; its address, the API
/// and the view, and the server's task.
async fn start(
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (
    std::net::SocketAddr,
    Arc<Api<View>>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let view = View::new(1, 10);
    view.apply([Change::Upsert(service("a"))], Instant::now());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let api = Arc::new(Api::new(view, TOKEN));
    let limits = ServeLimits {
        max_connections: 100,
        header_read_timeout: Duration::from_secs(10),
        write_timeout: Duration::from_secs(10),
        ..ServeLimits::default()
    };
    let task = tokio::spawn(serve(listener, None, router(api.clone()), limits, shutdown));
    (addr, api, task)
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n{extra}\r\n")
}

/// A client's end of one connection: what it has read and not yet consumed.
struct Client {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr) -> Self {
        let s = TcpStream::connect(addr).await.expect("connect");
        Self { s, buf: Vec::new() }
    }

    async fn send(&mut self, req: &str) {
        self.s.write_all(req.as_bytes()).await.expect("send");
    }

    /// Reads more; panics when the server closed or sent nothing for 10 s.
    async fn fill(&mut self) {
        let mut b = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), self.s.read(&mut b))
            .await
            .expect("the server answered within 10 s")
            .expect("read");
        assert!(n > 0, "the server closed the connection");
        self.buf.extend_from_slice(&b[..n]);
    }

    /// The next response's status and headers (names lowercased).
    async fn head(&mut self) -> (u16, Vec<(String, String)>) {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut resp = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(len) = resp.parse(&self.buf).expect("a response") {
                assert_eq!(resp.version, Some(1), "an HTTP/1.1 response");
                let code = resp.code.expect("a status");
                let headers = resp
                    .headers
                    .iter()
                    .map(|h| {
                        let v = String::from_utf8_lossy(h.value).into_owned();
                        (h.name.to_ascii_lowercase(), v)
                    })
                    .collect();
                self.buf.drain(..len);
                return (code, headers);
            }
            self.fill().await;
        }
    }

    /// The next chunk of a chunked body; empty for the last.
    async fn chunk(&mut self) -> Vec<u8> {
        loop {
            if let Some(at) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let size = std::str::from_utf8(&self.buf[..at]).expect("a chunk size");
                let size = usize::from_str_radix(size, 16).expect("a hex chunk size");
                if self.buf.len() >= at + 2 + size + 2 {
                    let data = self.buf[at + 2..at + 2 + size].to_vec();
                    assert_eq!(&self.buf[at + 2 + size..at + 4 + size], b"\r\n");
                    self.buf.drain(..at + 4 + size);
                    return data;
                }
            }
            self.fill().await;
        }
    }

    /// The next whole response: status, headers and body.
    async fn response(&mut self) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let (code, headers) = self.head().await;
        let length = header(&headers, "content-length").map(|v| v.parse().expect("a length"));
        let body = if let Some(n) = length {
            while self.buf.len() < n {
                self.fill().await;
            }
            self.buf.drain(..n).collect()
        } else {
            assert_eq!(header(&headers, "transfer-encoding"), Some("chunked"));
            let mut body = Vec::new();
            loop {
                let c = self.chunk().await;
                if c.is_empty() {
                    break body;
                }
                body.extend(c);
            }
        };
        (code, headers, body)
    }

    /// Whether the server closes the connection within 10 s.
    async fn closed(&mut self) -> bool {
        let mut b = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(10), self.s.read(&mut b));
        matches!(read.await, Ok(Ok(0) | Err(_)))
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn names(body: &[u8]) -> Vec<String> {
    let list: serde_json::Value = serde_json::from_slice(body).expect("JSON");
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            i["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// A connection serves GETs one after another, two sent at once (pipelined) are answered in
/// order, a POST after them goes to hyper with its bytes intact, and the connection closes
/// after the request that says `Connection: close`.
#[tokio::test]
async fn gets_keep_a_connection_alive_pipelined_or_not_and_hyper_takes_the_rest() {
    let (addr, _, _) = start(std::future::pending()).await;
    let mut c = Client::connect(addr).await;
    let list = "/api/v1/namespaces/prod/services";
    c.send(&get(list, "")).await;
    let (code, headers, body) = c.response().await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(names(&body), ["a"]);
    assert!(
        header(&headers, "date").is_some(),
        "a Date header: {headers:?}"
    );
    assert_eq!(header(&headers, "content-type"), Some("application/json"));

    c.send(&format!(
        "{}{}",
        get(list, ""),
        get(&format!("{list}/a"), "")
    ))
    .await;
    let (code, _, body) = c.response().await;
    assert_eq!((code, names(&body)), (200, vec!["a".to_owned()]));
    let (code, _, body) = c.response().await;
    let one: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(
        (code, &one["metadata"]["name"]),
        (200, &serde_json::json!("a"))
    );

    // A body: hyper's to answer, from the request's first byte.
    c.send(&format!(
        "POST {list} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}"
    ))
    .await;
    let (code, _, body) = c.response().await;
    let status: serde_json::Value = serde_json::from_slice(&body).expect("a Status");
    assert_eq!(status["kind"], "Status", "a Status: {status}");
    assert!(code >= 400, "a write is refused: {code}");
    // hyper keeps serving the connection's GETs.
    c.send(&get(list, "connection: close\r\n")).await;
    let (code, headers, _) = c.response().await;
    assert_eq!(code, 200);
    assert_eq!(header(&headers, "connection"), Some("close"));
    assert!(c.closed().await, "closed after `Connection: close`");

    // Answered here, `Connection: close` closes too.
    let mut c = Client::connect(addr).await;
    c.send(&get(list, "connection: close\r\n")).await;
    let (code, headers, _) = c.response().await;
    assert_eq!((code, header(&headers, "connection")), (200, Some("close")));
    assert!(c.closed().await, "closed after `Connection: close`");
}

/// A watch is written chunk by chunk as its events come, each event whole in one chunk; when
/// the client goes away while the watch waits, the watch is dropped (its slot freed).
#[tokio::test]
async fn a_watch_streams_its_events_in_chunks_and_ends_when_the_client_goes() {
    let (addr, api, _) = start(std::future::pending()).await;
    let mut c = Client::connect(addr).await;
    c.send(&get("/api/v1/namespaces/prod/services?watch=true", ""))
        .await;
    let (code, headers) = c.head().await;
    assert_eq!(code, 200);
    assert_eq!(header(&headers, "transfer-encoding"), Some("chunked"));
    let event = |chunk: Vec<u8>| -> serde_json::Value {
        serde_json::from_slice(&chunk).expect("one whole event in a chunk")
    };
    let first = event(c.chunk().await);
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["metadata"]["name"], "a");
    assert_eq!(api.open_watches(), 1);

    api.store()
        .apply([Change::Upsert(service("b"))], Instant::now());
    let next = event(c.chunk().await);
    assert_eq!(next["type"], "ADDED");
    assert_eq!(next["object"]["metadata"]["name"], "b");

    drop(c);
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.open_watches() > 0 {
        assert!(
            Instant::now() < deadline,
            "the watch of a closed connection was dropped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An event larger than `COPY_FRAME_BYTES` is written uncopied between its chunk's framing, and
/// arrives as one chunk, whole.
#[tokio::test]
async fn a_large_event_arrives_whole_in_one_chunk() {
    let (addr, api, _) = start(std::future::pending()).await;
    let mut c = Client::connect(addr).await;
    c.send(&get("/api/v1/namespaces/prod/services?watch=true", ""))
        .await;
    assert_eq!(c.head().await.0, 200);
    assert!(!c.chunk().await.is_empty(), "the initial ADDED");
    let mut big = k8s_openapi::api::core::v1::Service::default();
    big.metadata.name = Some("big".into());
    big.metadata.namespace = Some("prod".into());
    big.metadata.annotations = Some([("pad".to_owned(), "x".repeat(40_000))].into());
    api.store().apply(
        [Change::Upsert(Object::Service(Arc::new(big)))],
        Instant::now(),
    );
    let chunk = c.chunk().await;
    assert!(
        chunk.len() > super::COPY_FRAME_BYTES,
        "{} bytes",
        chunk.len()
    );
    let event: serde_json::Value = serde_json::from_slice(&chunk).expect("one whole event");
    assert_eq!(event["object"]["metadata"]["name"], "big");
    assert_eq!(
        event["object"]["metadata"]["annotations"]["pad"]
            .as_str()
            .map(str::len),
        Some(40_000)
    );
}

/// An HTTP/1.0 request is hyper's, answered as HTTP/1.0 expects.
#[tokio::test]
async fn an_http_1_0_request_is_answered_by_hyper() {
    let (addr, _, _) = start(std::future::pending()).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "GET /api/v1/namespaces/prod/services HTTP/1.0\r\nauthorization: Bearer {TOKEN}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("send");
    let mut resp = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut resp));
    read.await.expect("answered and closed").expect("read");
    let text = String::from_utf8_lossy(&resp);
    assert!(text.starts_with("HTTP/1.0 200"), "{text}");
    assert!(text.contains("\"name\":\"a\""), "{text}");
}

/// At a graceful shutdown a connection waiting for its next request is closed and the server
/// returns.
#[tokio::test]
async fn a_graceful_shutdown_closes_an_idle_connection() {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, _, task) = start(async {
        let _ = stopped.await;
    })
    .await;
    let mut c = Client::connect(addr).await;
    c.send(&get("/api/v1/namespaces/prod/services", "")).await;
    assert_eq!(c.response().await.0, 200);
    let _ = stop.send(());
    assert!(c.closed().await, "the idle connection was closed");
    let served = tokio::time::timeout(Duration::from_secs(10), task).await;
    assert!(
        matches!(served, Ok(Ok(Ok(())))),
        "the server returned: {served:?}"
    );
}
