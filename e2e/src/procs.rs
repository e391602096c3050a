//! Floodgate and the consumers as real processes, for the demo and the side-by-side benchmarks:
//! memory is read from each process's `/proc/<pid>/status`, never estimated.
//!
//! Every child is started with `kill_on_drop`, and [`Floodgate::stop`] / [`Consumer::stop`]
//! kill and reap it, so a run leaves no process behind.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use floodgate_link_crd::{LinkSpec, LinksFile, NamedLink, RemoteSpec};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

use crate::admin;

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
    use crate::process::proc_status_kib;
    Some((
        proc_status_kib(pid, "VmRSS")?,
        proc_status_kib(pid, "VmHWM")?,
    ))
}

/// A free loopback port (bound and released; good enough on a test machine).
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

/// `floodgate run` with one link in front of a remote.
#[derive(Debug)]
pub struct Floodgate {
    child: Child,
    /// The link's name.
    pub link: String,
    /// The admin API.
    pub admin: SocketAddr,
    /// The Kubernetes facade.
    pub facade: SocketAddr,
    /// The admin API's bearer token.
    pub admin_token: String,
    state: PathBuf,
}

impl Floodgate {
    /// Starts Floodgate in `dir` with link `link` following the remote of `remote_kubeconfig`
    /// (YAML) under `spec`, and waits until it is ready.
    pub async fn start(
        dir: &Path,
        link: &str,
        remote_kubeconfig: &str,
        mut spec: LinkSpec,
    ) -> anyhow::Result<Self> {
        let remote = dir.join("remote.kubeconfig");
        std::fs::write(&remote, remote_kubeconfig)?;
        spec.remote = RemoteSpec {
            kubeconfig_path: Some(remote.display().to_string()),
            ..RemoteSpec::default()
        };
        let links = LinksFile {
            links: vec![NamedLink {
                name: link.to_owned(),
                spec,
            }],
        };
        std::fs::write(dir.join("links.yaml"), serde_yaml::to_string(&links)?)?;
        let admin_token = "demo-admin-token".to_owned();
        std::fs::write(dir.join("admin-token"), &admin_token)?;
        let (admin, facade) = (free_addr()?, free_addr()?);
        let state = dir.join("state");
        // Named first so a missing binary is an error here, not a panic in run_command.
        sibling_bin("floodgate")?;
        let child = crate::process::run_command(&dir.join("links.yaml"), &state, facade, admin)
            .arg("--admin-token-file")
            .arg(dir.join("admin-token"))
            .env("FLOODGATE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("floodgate.log"))?)
            .spawn()
            .context("starting floodgate")?;
        let mut fg = Self {
            child,
            link: link.to_owned(),
            admin,
            facade,
            admin_token,
            state,
        };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        while !fg.ready().await {
            if let Some(status) = fg.child.try_wait()? {
                anyhow::bail!("floodgate exited before it was ready: {status}");
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "floodgate was not ready within 60 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Ok(fg)
    }

    /// Whether `/readyz` answers 200.
    pub async fn ready(&self) -> bool {
        matches!(
            admin::call_text(self.admin, "GET", "/readyz", None, "").await,
            Ok((200, _))
        )
    }

    /// The link as the admin API shows it (`Null` when it does not answer).
    pub async fn link_state(&self) -> Value {
        let path = format!("/links/{}", self.link);
        match admin::call(self.admin, "GET", &path, None, "").await {
            Ok((200, v)) => v,
            _ => Value::Null,
        }
    }

    /// `POST /links/<link>/<action>` with the admin token.
    pub async fn admin_post(&self, action: &str) -> anyhow::Result<(u16, Value)> {
        let path = format!("/links/{}/{action}", self.link);
        admin::call(self.admin, "POST", &path, Some(&self.admin_token), "").await
    }

    /// The kubeconfig a consumer of the link uses (its token and Floodgate's CA).
    pub fn consumer_kubeconfig(&self) -> anyhow::Result<String> {
        let token = std::fs::read_to_string(self.state.join("tokens").join(&self.link))?;
        let ca = std::fs::read_to_string(self.state.join("tls/ca.crt"))?;
        let server = format!("https://{}/links/{}", self.facade, self.link);
        Ok(floodgate::run::consumer_kubeconfig(
            &server,
            token.trim(),
            Some(&ca),
            &self.link,
        ))
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills and reaps the process.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}

/// What a consumer has reported so far (see `src/bin/consumer.rs`).
#[derive(Debug, Default, Clone)]
pub struct ConsumerStats {
    /// Objects its watchers delivered.
    pub events: u64,
    /// Objects in its stores.
    pub services: u64,
    /// EndpointSlices in its store.
    pub slices: u64,
    /// Pods in its store.
    pub pods: u64,
    /// Whether all three informers have synced.
    pub synced: bool,
    /// Stamped changes it saw: (stamp, arrival), wall-clock ms.
    pub seen: Vec<(u64, u64)>,
}

/// A `consumer` process following one kubeconfig.
#[derive(Debug)]
pub struct Consumer {
    child: Child,
    stats: Arc<Mutex<ConsumerStats>>,
}

impl Consumer {
    /// Starts a consumer of `kubeconfig` (YAML, written to `dir/<name>.kubeconfig`).
    pub fn start(dir: &Path, name: &str, kubeconfig: &str) -> anyhow::Result<Self> {
        let path = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, kubeconfig)?;
        let mut child = Command::new(sibling_bin("consumer")?)
            .arg("--kubeconfig")
            .arg(&path)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting a consumer")?;
        let stdout = child.stdout.take().context("the consumer's stdout")?;
        let stats = Arc::new(Mutex::new(ConsumerStats::default()));
        let shared = stats.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let mut s = shared.lock().unwrap_or_else(|e| e.into_inner());
                let n = |k: &str| v[k].as_u64().unwrap_or_default();
                s.events = n("events");
                s.services = n("services");
                s.slices = n("slices");
                s.pods = n("pods");
                s.synced = v["synced"].as_bool().unwrap_or_default();
                for pair in v["seen"].as_array().into_iter().flatten() {
                    if let (Some(a), Some(b)) = (pair[0].as_u64(), pair[1].as_u64()) {
                        s.seen.push((a, b));
                    }
                }
            }
        });
        Ok(Self { child, stats })
    }

    /// What it has reported.
    pub fn stats(&self) -> ConsumerStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills and reaps the process.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}

/// Runs `n` restarting consumers of `kubeconfig` at once, each restarting `restarts` times
/// (S2), and waits for all of them.
pub async fn restart_herd(
    dir: &Path,
    kubeconfig: &str,
    n: usize,
    restarts: u32,
) -> anyhow::Result<()> {
    let path = dir.join("herd.kubeconfig");
    std::fs::write(&path, kubeconfig)?;
    let bin = sibling_bin("consumer")?;
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        children.push(
            Command::new(&bin)
                .arg("--kubeconfig")
                .arg(&path)
                .args(["--restarts", &restarts.to_string()])
                .stdout(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("starting a restarting consumer")?,
        );
    }
    for mut c in children {
        let status = c.wait().await?;
        anyhow::ensure!(status.success(), "a restarting consumer failed: {status}");
    }
    Ok(())
}
