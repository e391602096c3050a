//! One kube-apiserver process of the lane: its command line, its log, and the signals a test
//! sends it. [`super::RealKube`] owns the first; [`super::RealKube::second_apiserver`] starts
//! another on the same etcd (a control plane of two servers, as managed ones run).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::{Child, Command};

/// How long the API server may take to answer `/readyz` (about 2.5 s on an idle 2-core machine).
const READY_SECS: u64 = 90;

/// A kube-apiserver: started, signalled and restarted with the same command line; killed when
/// dropped.
#[derive(Debug)]
pub struct ApiServer {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// `127.0.0.1:PORT`.
    pub addr: SocketAddr,
    /// The binary, then its flags.
    argv: Vec<OsString>,
    /// The admin's kubeconfig (YAML) straight at this server.
    kubeconfig: String,
    /// Every (re)start appends to this log.
    log: PathBuf,
    child: Option<Child>,
}

impl ApiServer {
    /// A server not started yet: `argv` (the binary first) serves on `addr`.
    pub(super) fn new(
        addr: SocketAddr,
        argv: Vec<OsString>,
        kubeconfig: String,
        log: PathBuf,
    ) -> Self {
        Self {
            url: format!("https://{addr}"),
            addr,
            argv,
            kubeconfig,
            log,
            child: None,
        }
    }

    /// Its command line with each flag `--NAME` of `flags` set to its value (added if it was
    /// not there).
    pub(super) fn argv_with(&self, flags: &[(&str, OsString)]) -> Vec<OsString> {
        let mut argv = self.argv.clone();
        for (name, value) in flags {
            let prefix = format!("--{name}=");
            let mut flag = OsString::from(&prefix);
            flag.push(value);
            match (argv.iter_mut()).find(|a| a.to_string_lossy().starts_with(&prefix)) {
                Some(a) => *a = flag,
                None => argv.push(flag),
            }
        }
        argv
    }

    /// Starts the server (again, after [`Self::kill`] or [`Self::wait_exit`]) with the same
    /// flags, port and etcd, and waits until it is ready.
    pub async fn start(&mut self) -> anyhow::Result<()> {
        let (bin, args) = self
            .argv
            .split_first()
            .context("the API server's command line")?;
        let child = Command::new(bin)
            .args(args)
            .stdout(Stdio::null())
            .stderr(super::log_file(&self.log)?)
            .kill_on_drop(true)
            .spawn()
            .context("starting kube-apiserver")?;
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(READY_SECS);
        while !self.ready().await {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok()?) {
                anyhow::bail!(
                    "kube-apiserver exited before it was ready: {status}; {}",
                    self.log_tail()
                );
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "kube-apiserver was not ready within {READY_SECS} s; {}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// SIGKILLs the server and reaps it.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        let mut child = self.child.take().context("the API server is not running")?;
        child.kill().await?;
        Ok(())
    }

    /// Sends the server SIGTERM (a rolling upgrade, a drained control-plane node): it stops
    /// listening at once, keeps its open watches, and exits about a minute later.
    pub fn terminate(&self) -> anyhow::Result<()> {
        let pid = self.pid().context("the API server is not running")?;
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        anyhow::ensure!(ok, "SIGTERM to kube-apiserver {pid}");
        Ok(())
    }

    /// Whether the process has exited (it is reaped then; [`Self::wait_exit`] returns at once).
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }

    /// Waits up to `within` for the server to exit (after [`Self::terminate`]), and reaps it.
    pub async fn wait_exit(&mut self, within: Duration) -> anyhow::Result<()> {
        let mut child = self.child.take().context("the API server is not running")?;
        match tokio::time::timeout(within, child.wait()).await {
            Ok(status) => {
                status?;
                Ok(())
            }
            Err(_) => {
                child.kill().await?;
                anyhow::bail!("kube-apiserver did not exit within {within:?}; killed")
            }
        }
    }

    /// Whether `/readyz` answers `ok`.
    pub async fn ready(&self) -> bool {
        let Ok(client) = self.client().await else {
            return false;
        };
        let Ok(req) = http::Request::get("/readyz").body(Vec::new()) else {
            return false;
        };
        tokio::time::timeout(Duration::from_secs(2), client.request_text(req))
            .await
            .is_ok_and(|r| r.is_ok_and(|body| body.trim() == "ok"))
    }

    /// The admin's kubeconfig (YAML) straight at this server.
    pub fn kubeconfig(&self) -> &str {
        &self.kubeconfig
    }

    /// A kube client as the admin, straight at this server.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        crate::gateway::client_from(&self.kubeconfig).await
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// The end of its log (for failure messages).
    pub fn log_tail(&self) -> String {
        super::tail(&self.log)
    }
}
