//! Floodgate and its consumers as real processes, for tests and benchmarks that measure them
//! from outside: memory from each process's `/proc/<pid>/status` (`VmHWM`, `VmRSS`), never
//! estimated; open file descriptors; what they print; and raw HTTP/1.1 requests that no
//! well-behaved client would send. [`Floodgate`] starts the binary in either mode with any
//! flags ([`Launch`]); [`Consumer`] is a kube-rs consumer process. Every child is started with
//! `kill_on_drop`, so a run leaves no process behind.

mod consumer;
mod floodgate;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;

pub use consumer::{Consumer, ConsumerStats, restart_herd};
pub use floodgate::{Floodgate, Launch};

/// A binary built beside the running one (`target/<profile>/`), or beside a test's parent
/// directory (`target/<profile>/deps/..`).
pub fn sibling_bin(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("the executable's directory")?;
    if dir.ends_with("deps") {
        dir = dir.parent().context("target/<profile>")?;
    }
    let bin = dir.join(name);
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: build it first (`cargo build -p floodgate -p floodgate-e2e --bins`; \
         the Makefile does)",
        bin.display()
    );
    Ok(bin)
}

/// Resident and peak resident memory of a process, in KiB (`VmRSS`, `VmHWM`).
pub fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    Some((
        proc_status_kib(pid, "VmRSS")?,
        proc_status_kib(pid, "VmHWM")?,
    ))
}

/// The `floodgate` binary cargo built beside the running test (`make test` builds it first).
pub fn floodgate_bin() -> anyhow::Result<PathBuf> {
    sibling_bin("floodgate")
}

/// A loopback address nothing listens on right now, for a child to listen on: bound and
/// released here, then bound by the child.
///
/// The port is taken below the kernel's ephemeral range (`ip_local_port_range`), never from it:
/// a port of that range released here could be handed to another test's outgoing connection
/// before the child binds it, and the child then failed to start (`binding gRPC to
/// 127.0.0.1:37521`, in a CI run). Each test process walks the ports below the range from a
/// start of its own, so two processes rarely try one port at the same moment, and one never
/// hands out a port twice.
pub fn free_addr() -> SocketAddr {
    use std::hash::BuildHasher as _;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    // Above the ports services usually take; the whole range when the ephemeral one starts low.
    let (low, high) = (10_000, ephemeral_low.min(65_536));
    if high <= low + 1_000 {
        return bind_any();
    }
    let next = NEXT.get_or_init(|| {
        let seed = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        AtomicU32::new((seed % u64::from(high - low)) as u32)
    });
    for _ in 0..1_000 {
        let port = low + next.fetch_add(1, Ordering::Relaxed) % (high - low);
        let addr = SocketAddr::from(([127, 0, 0, 1], port as u16));
        if std::net::TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    bind_any()
}

/// A port the kernel chooses, from its ephemeral range.
fn bind_any() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// Preloads [`PRELOAD_ENV`]'s library into `c` (heaptrack for Floodgate alone, not for the
/// harness around it: docs/development.md's "Profiling memory"). Each child gets its own heaptrack
/// output, numbered in start order, so a run of several keeps them all.
pub(crate) fn preload(c: &mut Command) {
    if let Some(preload) = std::env::var_os(PRELOAD_ENV) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        c.env("LD_PRELOAD", preload);
        if let Some(out) = std::env::var_os("DUMP_HEAPTRACK_OUTPUT") {
            let mut out = out;
            out.push(format!(".{}", STARTED.fetch_add(1, Ordering::Relaxed)));
            c.env("DUMP_HEAPTRACK_OUTPUT", out);
        }
    }
}

/// Set to a library path, it is preloaded into every `floodgate` child of the e2e harness.
pub const PRELOAD_ENV: &str = "FLOODGATE_E2E_LD_PRELOAD";

/// A field of `/proc/<pid>/status` in KiB (`VmHWM`: peak resident memory; `VmRSS`: now).
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// File descriptors the process holds open (its sockets among them).
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// A response read off a raw socket.
#[derive(Debug)]
pub struct RawResponse {
    /// The status code (0 when the server closed without answering).
    pub code: u16,
    /// The body (after the head), as text.
    pub body: String,
}

impl RawResponse {
    /// The body as JSON (`Null` when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Writes `request` as is on a fresh connection and reads until the server closes (at most
/// `secs`). The server may answer before the whole request is written.
pub async fn raw(addr: SocketAddr, request: &[u8], secs: u64) -> anyhow::Result<RawResponse> {
    let mut s = TcpStream::connect(addr).await?;
    let _ = s.write_all(request).await;
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(secs), async {
        let mut buf = [0u8; 16384];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
            // A whole response is enough: hyper may keep reading what is left of a refused
            // request before it closes.
            if complete(&out) {
                return;
            }
        }
    })
    .await;
    anyhow::ensure!(read.is_ok(), "no end of the response within {secs} s");
    let text = String::from_utf8_lossy(&out);
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok(RawResponse { code, body })
}

/// Whether `out` holds a response head and the `content-length` bytes of body it announces.
fn complete(out: &[u8]) -> bool {
    let text = String::from_utf8_lossy(out);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let len = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    len.is_some_and(|n| body.len() >= n)
}
