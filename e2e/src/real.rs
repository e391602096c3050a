//! A real control plane for the real-server lane (`make test-real`): etcd and kube-apiserver of
//! the pinned release, built from Go modules by `e2e/realkube/build.sh`, started as processes on
//! free loopback ports, with RBAC on, bearer tokens from a token file (an admin in
//! `system:masters`), service-account tokens signed by a key of our own (so the TokenRequest API
//! works) and a serving certificate from a CA of our own. [`RealKube`] hands tests a kubeconfig
//! as [`crate::RunningSim`] does, and can SIGKILL and restart the API server against the same
//! etcd. Beside it, the Go programs the tests drive: the client-go resolver consumer
//! ([`Resolver`]) and the crash-loop driver ([`Crashloop`]). Every child is killed on drop.
//!
//! The server runs no controller-manager, scheduler or kubelet: the crash-loop driver writes
//! what those would, and nothing else moves. Its `ServiceAccount` admission plugin is off, as no
//! token controller creates a namespace's `default` account.

mod crashloop;
mod resolver;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::{Child, Command};

pub use crashloop::Crashloop;
pub use resolver::{Resolver, ResolverMode, ResolverReport};

/// The environment variable naming a directory that holds the Go binaries (instead of
/// `<target>/realkube/bin`).
pub const BIN_ENV: &str = "FLOODGATE_REALKUBE_BIN";

/// The admin's bearer token (user `admin`, group `system:masters`).
pub const ADMIN_TOKEN: &str = "realkube-admin-token";

/// How long the API server may take to answer `/readyz` (about 2.5 s on an idle 2-core machine).
const READY_SECS: u64 = 90;

/// One of the lane's Go binaries: under `$FLOODGATE_REALKUBE_BIN`, else `<target>/realkube/bin`
/// beside the running test's target directory. Missing, it names the command that builds it.
pub fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os(BIN_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let exe = std::env::current_exe()?;
            // target/<profile>/deps/<test> or target/<profile>/<bin>
            let mut dir = exe.parent().context("the executable's directory")?;
            if dir.ends_with("deps") {
                dir = dir.parent().context("target/<profile>")?;
            }
            dir.parent()
                .context("the target directory")?
                .join("realkube/bin")
        }
    };
    let bin = dir.join(name);
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: build the real-server lane's Go binaries with `e2e/realkube/build.sh` \
         (`make test-real` does), or point {BIN_ENV} at a directory holding them",
        bin.display()
    );
    Ok(bin)
}

/// etcd and kube-apiserver on loopback, killed when dropped.
#[derive(Debug)]
pub struct RealKube {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The CA the serving certificate chains to (PEM).
    pub ca_pem: String,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    etcd: Child,
    apiserver: Option<Child>,
    apiserver_args: Vec<OsString>,
    /// Every (re)start of the API server appends to this log.
    apiserver_log: PathBuf,
}

impl RealKube {
    /// Starts etcd, then the API server, and waits until `/readyz` answers `ok`.
    pub async fn start() -> anyhow::Result<Self> {
        let (etcd_bin, apiserver_bin) = (bin("etcd")?, bin("kube-apiserver")?);
        let dir = tempfile::Builder::new().prefix("realkube-").tempdir()?;
        let path = dir.path();
        let client = crate::process::free_addr();
        let peer = crate::process::free_addr();
        let mut etcd = Command::new(etcd_bin)
            .arg("--data-dir")
            .arg(path.join("etcd"))
            .args(["--listen-client", &client.to_string()])
            .args(["--listen-peer", &peer.to_string()])
            .stdout(Stdio::piped())
            .stderr(log_file(&path.join("etcd.log"))?)
            .kill_on_drop(true)
            .spawn()
            .context("starting etcd")?;
        wait_etcd(&mut etcd, &path.join("etcd.log")).await?;

        let tls = floodgate::tls::self_signed(&["127.0.0.1".into(), "localhost".into()])?;
        let write = |name: &str, text: &str| -> anyhow::Result<PathBuf> {
            let file = path.join(name);
            std::fs::write(&file, text)?;
            Ok(file)
        };
        let cert = write("apiserver.crt", &tls.cert_pem)?;
        let key = write("apiserver.key", &tls.key_pem)?;
        // The service-account signing key, and its public half the server verifies tokens with.
        let sa = rcgen::KeyPair::generate()?;
        let sa_key = write("sa.key", &sa.serialize_pem())?;
        let sa_pub = write("sa.pub", &sa.public_key_pem())?;
        let tokens = write(
            "tokens.csv",
            &format!("{ADMIN_TOKEN},admin,admin,\"system:masters\"\n"),
        )?;
        let port = crate::process::free_addr().port();
        let url = format!("https://127.0.0.1:{port}");
        let mut args: Vec<OsString> = Vec::new();
        let mut flag = |k: &str, v: &dyn AsRef<std::ffi::OsStr>| {
            let mut f = OsString::from(format!("--{k}="));
            f.push(v.as_ref());
            args.push(f);
        };
        flag("etcd-servers", &format!("http://{client}"));
        flag("bind-address", &"127.0.0.1");
        flag("advertise-address", &"127.0.0.1");
        flag("secure-port", &port.to_string());
        flag("tls-cert-file", &cert);
        flag("tls-private-key-file", &key);
        flag("cert-dir", &path.join("certs"));
        flag("token-auth-file", &tokens);
        flag("authorization-mode", &"RBAC");
        flag("service-cluster-ip-range", &"10.96.0.0/16");
        flag(
            "service-account-issuer",
            &"https://kubernetes.default.svc.cluster.local",
        );
        flag("service-account-key-file", &sa_pub);
        flag("service-account-signing-key-file", &sa_key);
        // No token controller creates each namespace's `default` ServiceAccount, which this
        // plugin requires of every pod.
        flag("disable-admission-plugins", &"ServiceAccount");
        // 1.32 ships WatchList (streaming lists) beta, on by default; said here so a change of
        // default shows. ConsistentListFromCache is beta and on as well.
        flag(
            "feature-gates",
            &"WatchList=true,ConsistentListFromCache=true",
        );
        // The lane's writers are its own: no fairness queues to wait in at start.
        flag("enable-priority-and-fairness", &"false");
        flag("v", &"1");
        let kubeconfig = write(
            "admin.kubeconfig",
            &crate::sim::kubeconfig(&url, ADMIN_TOKEN, Some(&tls.ca_pem), "realkube"),
        )?;
        let apiserver_log = path.join("apiserver.log");
        let mut kube = Self {
            url,
            ca_pem: tls.ca_pem,
            kubeconfig,
            etcd,
            apiserver: None,
            apiserver_args: args,
            apiserver_log,
            dir,
        };
        kube.apiserver_args.insert(0, apiserver_bin.into());
        kube.start_apiserver().await?;
        Ok(kube)
    }

    /// Starts the API server (again, after [`Self::kill_apiserver`]) with the same flags, port
    /// and etcd, and waits until it is ready.
    pub async fn start_apiserver(&mut self) -> anyhow::Result<()> {
        let (bin, args) = self
            .apiserver_args
            .split_first()
            .context("the API server's command line")?;
        let child = Command::new(bin)
            .args(args)
            .stdout(Stdio::null())
            .stderr(log_file(&self.apiserver_log)?)
            .kill_on_drop(true)
            .spawn()
            .context("starting kube-apiserver")?;
        self.apiserver = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(READY_SECS);
        while !self.ready().await {
            if let Some(status) = self.apiserver.as_mut().and_then(|c| c.try_wait().ok()?) {
                anyhow::bail!(
                    "kube-apiserver exited before it was ready: {status}; {}",
                    tail(&self.apiserver_log)
                );
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "kube-apiserver was not ready within {READY_SECS} s; {}",
                tail(&self.apiserver_log)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// SIGKILLs the API server and reaps it (etcd stays).
    pub async fn kill_apiserver(&mut self) -> anyhow::Result<()> {
        let mut child = self
            .apiserver
            .take()
            .context("the API server is not running")?;
        child.kill().await?;
        Ok(())
    }

    /// Sends the API server SIGTERM (a rolling upgrade, a drained control-plane node): it stops
    /// listening at once, keeps its open watches silent, and exits about a minute later.
    pub fn terminate_apiserver(&self) -> anyhow::Result<()> {
        let pid = self
            .apiserver_pid()
            .context("the API server is not running")?;
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        anyhow::ensure!(ok, "SIGTERM to kube-apiserver {pid}");
        Ok(())
    }

    /// Waits up to `within` for the API server to exit (after [`Self::terminate_apiserver`]),
    /// and reaps it.
    pub async fn wait_apiserver_exit(&mut self, within: Duration) -> anyhow::Result<()> {
        let mut child = self
            .apiserver
            .take()
            .context("the API server is not running")?;
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

    /// The admin's kubeconfig (YAML).
    pub fn kubeconfig(&self) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(&self.kubeconfig)?)
    }

    /// The admin's kubeconfig file.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A directory for the test's own files, removed with the server.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A kube client as the admin.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        crate::gateway::client_from(&self.kubeconfig()?).await
    }

    /// `kubectl --kubeconfig <admin> ARGS`, its stdout (fails with its stderr).
    pub async fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        kubectl(&self.kubeconfig, args).await
    }

    /// The API server's process id.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref().and_then(Child::id)
    }

    /// The end of the API server's log (for failure messages).
    pub fn apiserver_log_tail(&self) -> String {
        tail(&self.apiserver_log)
    }

    /// etcd's process id.
    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd.id()
    }
}

/// `kubectl --kubeconfig FILE ARGS`: its stdout, or an error with its stderr.
pub async fn kubectl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .context("running kubectl")?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl {}: {}: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// Waits for etcd's `ready <url>` line.
async fn wait_etcd(etcd: &mut Child, log: &Path) -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt as _;
    let out = etcd.stdout.take().context("etcd's stdout")?;
    let mut lines = tokio::io::BufReader::new(out).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .with_context(|| format!("etcd was not ready within 60 s; {}", tail(log)))??;
    anyhow::ensure!(
        line.as_deref().is_some_and(|l| l.starts_with("ready ")),
        "etcd did not start: {}",
        tail(log)
    );
    // etcd prints nothing more on stdout; the reader is dropped with its pipe.
    Ok(())
}

fn log_file(path: &Path) -> anyhow::Result<std::fs::File> {
    Ok(std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?)
}

/// The last 2,000 bytes of a log.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(2000);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    format!("{} ends: {}", path.display(), &text[start..])
}
