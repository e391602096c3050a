//! A fault-injecting HTTP proxy to put between a link and its remote (kube-sim served over plain
//! HTTP by [`PlainSim`]): requests go through unchanged, responses come back as the [`Faults`]
//! say (watch frames malformed or cut mid-line, watches or lists that hang), and the proxy can
//! be killed (listener closed, every open connection dropped) and restarted on the same port,
//! in front of the same remote or another one ([`Chaos::set_target`]: a new incarnation).
//!
//! A hanging response stays hung until the proxy is killed, like a connection to a peer that
//! vanished: clearing the fault only lets new requests through, so the client must notice the
//! hung one by itself.
//!
//! [`Chaos::stop_gracefully`] plays a kube-apiserver sent SIGTERM: it stops listening at once,
//! closes its idle connections, and keeps its open watches, sending nothing on them, until it
//! exits (a real one about 60 s later: [`Chaos::kill`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::sim::{SimApi, SimStore};

type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// What the proxy does to responses. Counters say how often a fault struck.
#[derive(Debug, Default)]
pub struct Faults {
    /// Watch event frames (ADDED, MODIFIED, DELETED) still to replace by one a client cannot
    /// decode: alternately JSON that is no watch event, and no JSON at all.
    pub malformed_frames: AtomicUsize,
    /// Pod watch event frames still to pass on with the pod's `spec` replaced by a string:
    /// valid JSON, of the wrong shape for a pod, in a frame that puts its `object` before its
    /// `type` (JSON keys have no order; the API server writes `type` first).
    pub wrong_shape_pod_frames: AtomicUsize,
    /// Watch streams still to cut in the middle of their next event frame (half the line, then
    /// the end of the response).
    pub truncated_frames: AtomicUsize,
    /// While set, a watch stream hangs before its next frame: open, sending nothing, forever.
    pub hang_watches: AtomicBool,
    /// While set, a list (a GET that is not a watch) sends half its body, then hangs forever.
    pub hang_lists: AtomicBool,
    /// While set, every request but `/version` is refused with 403 Forbidden, as an API server
    /// refuses credentials whose RBAC was taken away (`/version` is anyone's to read); watches
    /// under way go on, as the API server's do.
    pub refuse: AtomicBool,
    /// While set, `limit` is taken off every request, so lists come whole in one body (an API
    /// server may ignore `limit`, and serves lists from its cache that way).
    pub strip_limit: AtomicBool,
    /// Frames malformed so far.
    pub malformed: AtomicU64,
    /// Frames given the wrong shape so far.
    pub wrong_shaped: AtomicU64,
    /// Frames cut so far.
    pub truncated: AtomicU64,
    /// Responses hanging so far.
    pub hung: AtomicU64,
    /// Requests forwarded so far.
    pub requests: AtomicU64,
}

/// The proxy.
#[derive(Debug)]
pub struct Chaos {
    addr: SocketAddr,
    /// The faults in force.
    pub faults: Arc<Faults>,
    target: Arc<Mutex<String>>,
    /// Bumped to end the accept loop and every connection (a kill).
    epoch: watch::Sender<u64>,
    /// Set to shut every connection down gracefully: an idle one closes, one with a response
    /// under way closes when it is done ([`Chaos::stop_gracefully`]).
    graceful: watch::Sender<bool>,
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl Chaos {
    /// A proxy on `127.0.0.1:0` in front of `target` (`http://host:port`).
    pub async fn start(target: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let chaos = Self {
            addr: listener.local_addr()?,
            faults: Arc::default(),
            target: Arc::new(Mutex::new(target.to_owned())),
            epoch: watch::channel(0).0,
            graceful: watch::channel(false).0,
            accept: Mutex::new(None),
        };
        chaos.serve(listener);
        Ok(chaos)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sends requests to `target` from now on (open connections keep their old target).
    pub fn set_target(&self, target: &str) {
        *self.target.lock().unwrap_or_else(|e| e.into_inner()) = target.to_owned();
    }

    /// The remote dies: the listener is closed and every open connection dropped.
    pub fn kill(&self) {
        self.epoch.send_modify(|e| *e += 1);
        if let Some(t) = self.accept.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }

    /// The remote stops as a kube-apiserver sent SIGTERM does: the listener is closed (new
    /// connections are refused), idle connections are closed, and every watch under way stays
    /// open, sending nothing, until [`Self::kill`] (the server's exit). New requests on no
    /// connection can reach it.
    pub fn stop_gracefully(&self) {
        self.faults.hang_watches.store(true, Ordering::Relaxed);
        self.graceful.send_replace(true);
        if let Some(t) = self.accept.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }

    /// The remote comes back on the same port (retried for up to 5 s while the killed listener
    /// is still being dropped), its watches no longer held after a graceful stop.
    pub async fn restart(&self) -> anyhow::Result<()> {
        if self.graceful.send_replace(false) {
            self.faults.hang_watches.store(false, Ordering::Relaxed);
        }
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        };
        self.serve(listener);
        Ok(())
    }

    fn serve(&self, listener: TcpListener) {
        let (faults, target) = (self.faults.clone(), self.target.clone());
        let mut epoch = self.epoch.subscribe();
        let graceful = self.graceful.subscribe();
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let task = tokio::spawn(async move {
            loop {
                let tcp = tokio::select! {
                    _ = epoch.changed() => return,
                    r = listener.accept() => match r {
                        Ok((tcp, _)) => tcp,
                        Err(_) => continue,
                    },
                };
                let (faults, target, client) = (faults.clone(), target.clone(), client.clone());
                let mut conn_epoch = epoch.clone();
                let mut graceful = graceful.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        forward(req, faults.clone(), target.clone(), client.clone())
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service);
                    tokio::pin!(conn);
                    let mut stopping = *graceful.borrow_and_update();
                    if stopping {
                        conn.as_mut().graceful_shutdown();
                    }
                    loop {
                        tokio::select! {
                            _ = conn.as_mut() => return,
                            _ = conn_epoch.changed() => return,
                            r = graceful.changed(), if !stopping => {
                                stopping = r.is_err() || *graceful.borrow_and_update();
                                if stopping {
                                    conn.as_mut().graceful_shutdown();
                                }
                            }
                        }
                    }
                });
            }
        });
        *self.accept.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
    }
}

impl Drop for Chaos {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn forward(
    req: hyper::Request<Incoming>,
    faults: Arc<Faults>,
    target: Arc<Mutex<String>>,
    client: Client<HttpConnector, Full<Bytes>>,
) -> Result<hyper::Response<Body>, Infallible> {
    faults.requests.fetch_add(1, Ordering::Relaxed);
    if faults.refuse.load(Ordering::Relaxed) && req.uri().path() != "/version" {
        return Ok(forbidden());
    }
    let base = target.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let watching = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let (mut parts, body) = req.into_parts();
    let mut path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    if faults.strip_limit.load(Ordering::Relaxed) {
        path = without_limit(&path);
    }
    let uri = match format!("{base}{path}").parse() {
        Ok(u) => u,
        Err(e) => return Ok(bad_gateway(format!("bad target: {e}"))),
    };
    parts.uri = uri;
    parts.headers.remove(hyper::header::HOST);
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let resp = match client
        .request(hyper::Request::from_parts(parts, Full::new(body)))
        .await
    {
        Ok(r) => r,
        Err(e) => return Ok(bad_gateway(format!("the remote did not answer: {e}"))),
    };
    let (mut parts, body) = resp.into_parts();
    let ok = parts.status.is_success();
    let body: Body = if watching && ok {
        parts.headers.remove(hyper::header::CONTENT_LENGTH);
        watch_body(body, faults)
    } else if ok && faults.hang_lists.load(Ordering::Relaxed) {
        let all = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        faults.hung.fetch_add(1, Ordering::Relaxed);
        let half = all.slice(..all.len() / 2);
        let s = futures_util::stream::once(async move { Ok(Frame::data(half)) })
            .chain(futures_util::stream::pending());
        BodyExt::boxed(StreamBody::new(s))
    } else {
        body.map_err(Into::into).boxed()
    };
    Ok(hyper::Response::from_parts(parts, body))
}

/// `path_and_query` with no `limit=` pair.
fn without_limit(path_and_query: &str) -> String {
    let Some((path, query)) = path_and_query.split_once('?') else {
        return path_and_query.to_owned();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.starts_with("limit="))
        .collect();
    format!("{path}?{}", kept.join("&"))
}

/// 403 with the Status an API server sends when RBAC lets the caller do nothing.
fn forbidden() -> hyper::Response<Body> {
    let status = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"forbidden: User \"floodgate\" cannot list resource","reason":"Forbidden","code":403}"#;
    let mut r = hyper::Response::new(Full::new(Bytes::from(status)).map_err(Into::into).boxed());
    *r.status_mut() = hyper::StatusCode::FORBIDDEN;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn bad_gateway(msg: String) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(Full::new(Bytes::from(msg)).map_err(Into::into).boxed());
    *r.status_mut() = hyper::StatusCode::BAD_GATEWAY;
    r
}

/// What becomes of one watch frame.
enum Verdict {
    Pass(Bytes),
    /// Send these bytes, then end the response.
    Cut(Bytes),
    /// Send nothing more, ever.
    Hang,
}

fn judge(line: Bytes, faults: &Faults) -> Verdict {
    if faults.hang_watches.load(Ordering::Relaxed) {
        faults.hung.fetch_add(1, Ordering::Relaxed);
        return Verdict::Hang;
    }
    let event = [b"\"ADDED\"".as_slice(), b"\"MODIFIED\"", b"\"DELETED\""]
        .iter()
        .any(|t| line.windows(t.len()).any(|w| w == *t));
    if !event {
        return Verdict::Pass(line);
    }
    let take = |n: &AtomicUsize| {
        n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1))
            .is_ok()
    };
    if take(&faults.truncated_frames) {
        faults.truncated.fetch_add(1, Ordering::Relaxed);
        return Verdict::Cut(line.slice(..line.len() / 2));
    }
    if take(&faults.malformed_frames) {
        // Alternately JSON that is no watch event, and no JSON at all.
        let n = faults.malformed.fetch_add(1, Ordering::Relaxed);
        let bad: &'static [u8] = if n.is_multiple_of(2) {
            b"{\"type\":\"MODIFIED\",\"object\":\"this is not an object\"}\n"
        } else {
            b"this is not JSON at all\n"
        };
        return Verdict::Pass(Bytes::from_static(bad));
    }
    let pod = line.windows(12).any(|w| w == b"\"kind\":\"Pod\"");
    if pod && take(&faults.wrong_shape_pod_frames) {
        let mut event: serde_json::Value = serde_json::from_slice(&line).unwrap_or_default();
        event["object"]["spec"] = "this is not a spec".into();
        let bad = format!(
            "{{\"object\":{},\"type\":{}}}\n",
            event["object"], event["type"]
        );
        faults.wrong_shaped.fetch_add(1, Ordering::Relaxed);
        return Verdict::Pass(Bytes::from(bad));
    }
    Verdict::Pass(line)
}

/// A watch response, frame by frame through [`judge`].
fn watch_body(body: Incoming, faults: Arc<Faults>) -> Body {
    let chunks = body.into_data_stream();
    let s = futures_util::stream::unfold(
        (chunks, Vec::<u8>::new(), false),
        move |(mut chunks, mut buf, ended)| {
            let faults = faults.clone();
            async move {
                if ended {
                    return None;
                }
                loop {
                    if let Some(i) = buf.iter().position(|b| *b == b'\n') {
                        let line = Bytes::from(buf.drain(..=i).collect::<Vec<u8>>());
                        return match judge(line, &faults) {
                            Verdict::Pass(b) => Some((Ok(Frame::data(b)), (chunks, buf, false))),
                            Verdict::Cut(b) => Some((Ok(Frame::data(b)), (chunks, buf, true))),
                            Verdict::Hang => std::future::pending().await,
                        };
                    }
                    match chunks.next().await {
                        Some(Ok(c)) => buf.extend_from_slice(&c),
                        Some(Err(e)) => return Some((Err(e.into()), (chunks, buf, true))),
                        None if buf.is_empty() => return None,
                        None => {
                            let rest = Bytes::from(std::mem::take(&mut buf));
                            return Some((Ok(Frame::data(rest)), (chunks, buf, true)));
                        }
                    }
                }
            }
        },
    );
    BodyExt::boxed(StreamBody::new(s))
}

/// kube-sim over plain HTTP (the proxy speaks HTTP on both sides), on `127.0.0.1:0`.
#[derive(Debug)]
pub struct PlainSim {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its API (store and request counters).
    pub api: Arc<SimApi>,
    task: JoinHandle<()>,
}

impl PlainSim {
    /// Serves `store`, opened by `token`.
    pub async fn start(store: Arc<SimStore>, token: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let api = Arc::new(SimApi::new(store, token));
        let router = floodgate::kubeapi::router(api.clone());
        let task = tokio::spawn(async move {
            if let Err(e) =
                floodgate::kubeapi::serve_plain(listener, router, std::future::pending()).await
            {
                eprintln!("kube-sim: server stopped: {e}");
            }
        });
        Ok(Self { addr, api, task })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The store.
    pub fn store(&self) -> &Arc<SimStore> {
        self.api.store()
    }
}

impl Drop for PlainSim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// kube-sim behind a [`Chaos`] proxy, and Floodgate (one link, `east`) in front of the proxy.
#[derive(Debug)]
pub struct ChaosStack {
    /// The remote.
    pub sim: PlainSim,
    /// The proxy between the link and the remote.
    pub chaos: Chaos,
    /// The gateway.
    pub floodgate: floodgate::run::Running,
    dir: tempfile::TempDir,
}

/// The token kube-sim is opened with.
pub const REMOTE_TOKEN: &str = "remote-token";

impl ChaosStack {
    /// Starts kube-sim over `store`, the proxy, then Floodgate with `spec`, and waits until the
    /// link has synced.
    pub async fn start(
        store: Arc<SimStore>,
        spec: floodgate_link_crd::LinkSpec,
    ) -> anyhow::Result<Self> {
        let sim = PlainSim::start(store, REMOTE_TOKEN).await?;
        let chaos = Chaos::start(&sim.url()).await?;
        let dir = tempfile::tempdir()?;
        let kubeconfig = crate::sim::kubeconfig(&chaos.url(), REMOTE_TOKEN, None, "chaos");
        let (floodgate, _) = crate::gateway::start_floodgate(&kubeconfig, spec, dir.path()).await?;
        Ok(Self {
            sim,
            chaos,
            floodgate,
            dir,
        })
    }

    /// A kube client of link `east`'s consumers.
    pub async fn consumer(&self) -> anyhow::Result<kube::Client> {
        let yaml = self
            .floodgate
            .kubeconfig("east")
            .ok_or_else(|| anyhow::anyhow!("no link east"))?;
        crate::gateway::client_from(&yaml).await
    }

    /// The state of link `east`.
    pub fn link(&self) -> floodgate::link::LinkState {
        self.floodgate.links[0].state.borrow().clone()
    }

    /// The view link `east` serves.
    pub fn view(&self) -> &floodgate::view::View {
        &self.floodgate.links[0].view
    }

    /// The temporary directory (kubeconfigs, state).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}
