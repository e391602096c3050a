//! The watch clients of the fan-out runs: kube-rs's (HTTP/1.1, one connection per watch) and
//! a bare hyper HTTP/2 connection carrying several watches, as client-go makes them.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::StreamExt;
use http_body_util::BodyExt;
use kube::Client;

pub type Chunks = Pin<Box<dyn futures_util::Stream<Item = bytes::Bytes> + Send>>;
pub type H2Sender = hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>;

/// An HTTP/2 connection to the server in `kubeconfig`, with its bearer token.
pub async fn h2_connection(kubeconfig: &std::path::Path) -> (H2Sender, String) {
    let yaml = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).expect("parses");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let mut roots = rustls::RootCertStore::empty();
    for der in cfg.root_cert.iter().flatten() {
        roots
            .add(rustls::pki_types::CertificateDer::from(der.clone()))
            .expect("the kubeconfig's CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let host = cfg.cluster_url.host().expect("a host").to_owned();
    let port = cfg.cluster_url.port_u16().expect("a port");
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from(host).expect("a server name");
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .expect("TLS");
    assert_eq!(
        stream.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "the server speaks HTTP/2"
    );
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    let url = cfg.cluster_url.to_string();
    (send, url.trim_end_matches('/').to_owned())
}

/// Starts one watch of `path` and returns its content type and body.
pub async fn start_watch(
    conn: &WatchConn,
    path: &str,
    accept: &str,
) -> (Option<http::HeaderValue>, Chunks) {
    match conn {
        WatchConn::Kube(c) => {
            let resp = floodgate_e2e::gateway::raw_get(c, path, accept)
                .await
                .expect("watch");
            watch_body(resp)
        }
        WatchConn::H2(send, base) => {
            let req = http::Request::get(format!("{base}{path}"))
                .header("accept", accept)
                .header("authorization", "Bearer bench-token")
                .body(http_body_util::Empty::new())
                .expect("request");
            let resp = send.clone().send_request(req).await.expect("watch");
            assert_eq!(resp.status(), 200, "the watch starts");
            watch_body(resp)
        }
    }
}

/// A watch response's content type and its body's chunks.
fn watch_body<B>(resp: http::Response<B>) -> (Option<http::HeaderValue>, Chunks)
where
    B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Send,
{
    let ct = resp.headers().get("content-type").cloned();
    let body = resp
        .into_body()
        .into_data_stream()
        .filter_map(|c| async { c.ok() });
    (ct, Box::pin(body))
}

/// Where a watch is started.
pub enum WatchConn {
    /// A kube-rs client: a connection of its own per watch.
    Kube(Client),
    /// An HTTP/2 connection and the server's base URL.
    H2(H2Sender, String),
}
