//! The real `floodgate` binary as a child process, for tests that measure it from outside: its
//! peak memory (`VmHWM`), its open file descriptors, what it prints; and raw HTTP/1.1 requests
//! that no well-behaved client would send.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use floodgate_link_crd::{LinkSpec, LinksFile, NamedLink, RemoteSpec};
use tokio::process::Command;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The `floodgate` binary cargo built beside the running test (`cargo build -p floodgate`,
/// which `make test` does first).
pub fn floodgate_bin() -> PathBuf {
    crate::procs::sibling_bin("floodgate").expect("the floodgate binary")
}

/// A loopback address nothing listens on right now.
pub fn free_addr() -> SocketAddr {
    crate::procs::free_addr().expect("a free port")
}

/// Writes `dir/links.yaml`: one link per `(name, kubeconfig path)`, each with the default spec.
/// Returns the file's path.
pub fn write_links_file(dir: &Path, links: &[(&str, &Path)]) -> PathBuf {
    write_links_file_with(dir, links, |_| {})
}

/// [`write_links_file`], each link's spec changed by `tune` first.
pub fn write_links_file_with(
    dir: &Path,
    links: &[(&str, &Path)],
    tune: impl Fn(&mut LinkSpec),
) -> PathBuf {
    let file = LinksFile {
        links: links
            .iter()
            .map(|(name, kubeconfig)| {
                let mut spec = LinkSpec::with_remote(RemoteSpec {
                    kubeconfig_path: Some(kubeconfig.display().to_string()),
                    ..RemoteSpec::default()
                });
                tune(&mut spec);
                NamedLink {
                    name: (*name).to_owned(),
                    spec,
                }
            })
            .collect(),
    };
    let path = dir.join("links.yaml");
    let yaml = serde_yaml::to_string(&file).expect("a links file encodes");
    std::fs::write(&path, yaml).expect("the links file is written");
    path
}

/// `floodgate run` with its links file, state directory, facade and admin addresses (gRPC on a
/// free port), killed when dropped. The caller adds flags, environment and stdio, then spawns.
pub fn run_command(config: &Path, state: &Path, facade: SocketAddr, admin: SocketAddr) -> Command {
    let mut c = Command::new(floodgate_bin());
    c.arg("run")
        .arg("--config")
        .arg(config)
        .arg("--state-dir")
        .arg(state)
        .args(["--listen", &facade.to_string()])
        .args(["--admin-listen", &admin.to_string()])
        .args(["--grpc-listen", &free_addr().to_string()])
        .kill_on_drop(true);
    // A profiler for Floodgate alone, not for the harness around it (heaptrack's preload
    // library: the README's "Profiling memory"). Each child gets its own heaptrack output,
    // numbered in start order, so a run of several keeps them all.
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
    c
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
