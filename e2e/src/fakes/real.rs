//! A real control plane for the real-server lane (`make test-real`): etcd and kube-apiserver of
//! the pinned release, built from Go modules by `e2e/realkube/build.sh`, started as processes on
//! free loopback ports, with RBAC on, bearer tokens from a token file (an admin in
//! `system:masters`), service-account tokens signed by a key of our own (so the TokenRequest API
//! works) and a serving certificate from a CA of our own. [`RealKube`] hands tests a kubeconfig
//! as [`crate::RunningSim`] does, and can SIGKILL and restart the API server against the same
//! etcd, start a second one on that etcd ([`RealKube::second_apiserver`]) and put a TCP
//! balancer in front of both ([`Balancer`]), as managed control planes run. Beside it, the Go programs the tests drive: the client-go resolver consumer
//! ([`Resolver`]) and the crash-loop driver ([`Crashloop`]). Every child is killed on drop.
//!
//! The server runs no controller-manager, scheduler or kubelet: the crash-loop driver writes
//! what those would, and nothing else moves. Its `ServiceAccount` admission plugin is off, as no
//! token controller creates a namespace's `default` account.

mod apiserver;
mod balancer;
mod crashloop;
mod resolver;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::{Child, Command};

pub use apiserver::ApiServer;
pub use balancer::Balancer;
pub use crashloop::Crashloop;
pub use resolver::{Resolver, ResolverMode, ResolverReport};

/// The environment variable naming a directory that holds the Go binaries (instead of
/// `<target>/realkube/bin`).
pub const BIN_ENV: &str = "FLOODGATE_REALKUBE_BIN";

/// The admin's bearer token (user `admin`, group `system:masters`).
pub const ADMIN_TOKEN: &str = "realkube-admin-token";

/// One of the lane's Go binaries: under `$FLOODGATE_REALKUBE_BIN`, else `<target>/realkube/bin`
/// beside the running test's target directory. Missing, it names the command that builds it.
pub fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os(BIN_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => target_dir()?.join("realkube/bin"),
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
    apiserver: ApiServer,
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
        let addr = crate::process::free_addr();
        let (port, url) = (addr.port(), format!("https://{addr}"));
        let mut args: Vec<OsString> = vec![apiserver_bin.into()];
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
        let admin = crate::sim::kubeconfig(&url, ADMIN_TOKEN, Some(&tls.ca_pem), "realkube");
        let kubeconfig = write("admin.kubeconfig", &admin)?;
        let apiserver = ApiServer::new(addr, args, admin, path.join("apiserver.log"));
        let mut kube = Self {
            url,
            ca_pem: tls.ca_pem,
            kubeconfig,
            etcd,
            apiserver,
            dir,
        };
        kube.start_apiserver().await?;
        Ok(kube)
    }

    /// A second API server on the same etcd, started and ready: the same flags, certificates
    /// and service-account keys, its own port, log (`apiserver-NAME.log`) and cert directory.
    /// The serving certificate names 127.0.0.1, so it serves any port there, a balancer's too.
    pub async fn second_apiserver(&self, name: &str) -> anyhow::Result<ApiServer> {
        let addr = crate::process::free_addr();
        let port = addr.port().to_string().into();
        let argv = self.apiserver.argv_with(&[
            ("secure-port", port),
            ("cert-dir", self.dir().join(format!("certs-{name}")).into()),
        ]);
        let url = format!("https://{addr}");
        let log = self.dir().join(format!("apiserver-{name}.log"));
        let mut peer = ApiServer::new(addr, argv, self.kubeconfig_at(&url), log);
        peer.start().await?;
        Ok(peer)
    }

    /// The admin's kubeconfig (YAML) for the API at `url` (a balancer in front of the servers,
    /// say), trusting the servers' CA.
    pub fn kubeconfig_at(&self, url: &str) -> String {
        crate::sim::kubeconfig(url, ADMIN_TOKEN, Some(&self.ca_pem), "realkube")
    }

    /// The first API server.
    pub fn apiserver(&mut self) -> &mut ApiServer {
        &mut self.apiserver
    }

    /// Starts the API server (again, after [`Self::kill_apiserver`]) with the same flags, port
    /// and etcd, and waits until it is ready.
    pub async fn start_apiserver(&mut self) -> anyhow::Result<()> {
        self.apiserver.start().await
    }

    /// SIGKILLs the API server and reaps it (etcd stays).
    pub async fn kill_apiserver(&mut self) -> anyhow::Result<()> {
        self.apiserver.kill().await
    }

    /// Sends the API server SIGTERM (a rolling upgrade, a drained control-plane node): it stops
    /// listening at once, keeps its open watches silent, and exits about a minute later.
    pub fn terminate_apiserver(&self) -> anyhow::Result<()> {
        self.apiserver.terminate()
    }

    /// Waits up to `within` for the API server to exit (after [`Self::terminate_apiserver`]),
    /// and reaps it.
    pub async fn wait_apiserver_exit(&mut self, within: Duration) -> anyhow::Result<()> {
        self.apiserver.wait_exit(within).await
    }

    /// Whether `/readyz` answers `ok`.
    pub async fn ready(&self) -> bool {
        self.apiserver.ready().await
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
        self.apiserver.pid()
    }

    /// The end of the API server's log (for failure messages).
    pub fn apiserver_log_tail(&self) -> String {
        self.apiserver.log_tail()
    }

    /// etcd's process id.
    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd.id()
    }
}

/// The target directory the running test or binary was built into.
fn target_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test> or target/<profile>/<bin>
    let mut dir = exe.parent().context("the executable's directory")?;
    if dir.ends_with("deps") {
        dir = dir.parent().context("target/<profile>")?;
    }
    Ok(dir.parent().context("the target directory")?.to_owned())
}

/// `FLOODGATE_HELM`, else the helm `make helm` builds into the running test's target directory
/// (`<target>/helm/bin/helm`). Missing, it names the command that builds it.
pub fn helm() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("FLOODGATE_HELM") {
        Some(p) => PathBuf::from(p),
        None => target_dir()?.join("helm/bin/helm"),
    };
    anyhow::ensure!(
        path.is_file(),
        "no helm at {}: build it with `make helm` (charts/helm/build.sh, from Go modules)",
        path.display()
    );
    Ok(path)
}

/// `helm --kubeconfig FILE ARGS`: its stdout, or an error with its stderr.
pub async fn helm_run(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    with_kubeconfig(&helm()?, kubeconfig, args).await
}

/// `kubectl --kubeconfig FILE ARGS`: its stdout, or an error with its stderr.
pub async fn kubectl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    with_kubeconfig(Path::new("kubectl"), kubeconfig, args).await
}

/// `TOOL --kubeconfig FILE ARGS`: its stdout, or an error naming the tool with its stderr.
async fn with_kubeconfig(tool: &Path, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let name = tool.file_name().unwrap_or_default().to_string_lossy();
    let out = Command::new(tool)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {name}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{name} {}: {}: {}",
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
