//! 10,000 connections at once, half of them slowloris heads, 200 watchers that never read and
//! a client dribbling its head a byte at a time: Floodgate closes them all within its
//! timeouts, its peak memory stays bounded, and a well-behaved consumer's LISTs keep their
//! latency. Runs in `make e2e` (about 35 s).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use floodgate_e2e::admin;
use floodgate_e2e::process::{open_fds, proc_status_kib};
use floodgate_e2e::until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::start;

/// A well-behaved consumer's LIST must stay under this at p99 while 10,000 hostile connections
/// are open (a LIST of this link takes a few milliseconds when nothing else happens).
const LATENCY_BOUND: Duration = Duration::from_secs(1);

/// The median and the 99th percentile of `times`.
fn percentiles(mut times: Vec<Duration>) -> (Duration, Duration) {
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// Opens `n` connections to `addr`, a few hundred at a time; every other one sends half a
/// request head and then nothing.
async fn open_many(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut all = Vec::with_capacity(n);
    while all.len() < n {
        let batch = (n - all.len()).min(250);
        let opened = futures_util::future::join_all((0..batch).map(|i| async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            if i % 2 == 0 {
                s.write_all(b"GET /links/east/api/v1/services HTTP/1.1\r\nhost: x\r\n")
                    .await
                    .expect("half a head");
            }
            s
        }))
        .await;
        all.extend(opened);
    }
    all
}

/// True once the server has closed `s` (a read returns end of file or an error).
async fn closed_by_server(mut s: TcpStream, secs: u64) -> bool {
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(secs), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    read.await.is_ok()
}

/// A watch on pods from scratch whose client never reads: its socket's receive buffer is 4 KiB.
async fn stuck_watcher(addr: SocketAddr, token: &str) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.set_recv_buffer_size(4096).expect("a small buffer");
    let mut s = sock.connect(addr).await.expect("connect");
    s.write_all(
        format!("GET /links/east/api/v1/pods?watch=true HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .expect("request");
    s
}

async fn watchers(admin: SocketAddr) -> Option<u64> {
    let (_, text) = admin::call_text(admin, "GET", "/metrics", None, "")
        .await
        .ok()?;
    text.lines()
        .filter(|l| l.starts_with("floodgate_watchers{"))
        .map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// 10,000 connections at once (half of them slowloris heads, half silent), 200 watchers that
/// never read a byte of 10,000 pods, and a dribbling client, while a consumer keeps listing
/// through fresh connections. Floodgate accepts all 10,000, closes every one after the header
/// read timeout (30 s here), drops the stuck watchers after the write timeout,
/// answers the consumer throughout and keeps its peak RSS under a generous bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "about a minute: 10,000 connections (make e2e)"]
async fn ten_thousand_connections_slowloris_and_stuck_watchers_keep_memory_bounded() {
    // The test holds 10,000 sockets and Floodgate (which inherits the limit) as many.
    rlimit::increase_nofile_limit(30_000).expect("raise RLIMIT_NOFILE");
    // A header read timeout long enough that every connection is still open when the last one
    // is (opening 10,000 takes several seconds on two cores).
    let g = start(
        10,
        &[
            "--max-connections",
            "11000",
            "--write-timeout",
            "3s",
            "--header-read-timeout",
            "30s",
        ],
    )
    .await;
    let pid = g.pid();
    let baseline_kib = proc_status_kib(pid, "VmRSS").unwrap_or(0);

    // A well-behaved consumer LISTs every 100 ms, before the abuse and during it; each LIST's
    // time is kept.
    let list_once = {
        let (facade, token) = (g.facade, g.east.clone());
        move || {
            let token = token.clone();
            async move {
                let started = tokio::time::Instant::now();
                let call = admin::call_text(
                    facade,
                    "GET",
                    "/links/east/api/v1/services",
                    Some(&token),
                    "",
                );
                match tokio::time::timeout(Duration::from_secs(30), call).await {
                    Ok(Ok((200, _))) => started.elapsed(),
                    other => panic!("the consumer's LIST failed or took over 30 s: {other:?}"),
                }
            }
        }
    };
    let mut before = Vec::new();
    for _ in 0..30 {
        before.push(list_once().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let consumer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut during = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                during.push(list_once().await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            during
        })
    };

    let mut peak_fds = 0;
    let opening = open_many(g.facade, 10_000);
    tokio::pin!(opening);
    let conns = loop {
        tokio::select! {
            conns = &mut opening => break conns,
            () = tokio::time::sleep(Duration::from_millis(100)) => peak_fds = peak_fds.max(open_fds(pid)),
        }
    };
    until(30, "Floodgate holds the 10,000 connections", async || {
        peak_fds = peak_fds.max(open_fds(pid));
        peak_fds >= 10_000
    })
    .await;
    let mut stuck = Vec::new();
    for _ in 0..200 {
        stuck.push(stuck_watcher(g.facade, &g.east).await);
    }
    let dribbler = tokio::spawn(async move {
        let mut s = TcpStream::connect(g.facade).await.expect("connect");
        for b in b"GET /links/east/api/v1/services HTTP/1.1\r\nx-slow: "
            .iter()
            .chain(std::iter::repeat(&b'a'))
        {
            if s.write_all(&[*b]).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        false
    });

    let closed =
        futures_util::future::join_all(conns.into_iter().map(|s| closed_by_server(s, 120))).await;
    let open = closed.iter().filter(|c| !**c).count();
    assert_eq!(
        open, 0,
        "connections Floodgate did not close after the header read timeout"
    );
    let cut = tokio::time::timeout(Duration::from_secs(60), dribbler).await;
    assert!(
        matches!(cut, Ok(Ok(true))),
        "the dribbling client was cut off"
    );
    let mut left = None;
    let dropped = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            left = watchers(g.admin).await;
            if left == Some(0) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    assert!(
        dropped.await.is_ok(),
        "the watchers that never read were dropped within 60 s: {left:?} still open"
    );

    stop.store(true, Ordering::Relaxed);
    let during = consumer.await.expect("the consumer");
    let answered = during.len();
    assert!(answered > 0, "the consumer got answers during the abuse");
    drop(stuck);
    let peak_kib = proc_status_kib(pid, "VmHWM").expect("VmHWM");
    let (p50_before, p99_before) = percentiles(before);
    let (p50, p99) = percentiles(during);
    println!(
        "floodgate: RSS before the abuse {} MiB, peak {} MiB; {peak_fds} fds at most; the consumer's {answered} LISTs all answered",
        baseline_kib / 1024,
        peak_kib / 1024
    );
    println!(
        "the consumer's LIST latency: before the abuse p50 {p50_before:?}, p99 {p99_before:?}; during it p50 {p50:?}, p99 {p99:?}"
    );
    assert!(
        p99 < LATENCY_BOUND,
        "the consumer's p99 during the abuse, {p99:?}, is under {LATENCY_BOUND:?}"
    );
    assert!(
        peak_kib < 1024 * 1024,
        "peak RSS {} MiB is past the 1 GiB bound",
        peak_kib / 1024
    );
}
