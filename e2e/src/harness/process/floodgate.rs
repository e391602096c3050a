//! The real `floodgate` binary as a child process, in either mode, with any flags.
//!
//! [`Launch`] describes the run: the mode, the links (each a remote's kubeconfig and a spec),
//! extra flags and environment, the log filter, where its output goes. `floodgate run` gets a
//! links file; `floodgate controller` gets a local cluster (kube-sim's, served by the test
//! process) holding each link's Secrets and its `Link`, and reaches it through `KUBECONFIG`.
//! Either way the child listens on free loopback ports and its state is in `<dir>/state`.
//! [`Floodgate`] is the running child: the addresses, each link's token, consumer clients, the
//! admin API, signals, a SIGKILL and a restart with the same command line.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context as _;
use floodgate_link_crd::{LinkSpec, LinksFile, NamedLink, RemoteSpec};
use serde_json::Value;
use tokio::process::{Child, Command};

use crate::cluster::{self, NS};
use crate::local::RunningLocal;
use crate::modes::Mode;
use crate::{admin, process};

/// What to start.
#[derive(Debug)]
pub struct Launch {
    mode: Mode,
    dir: PathBuf,
    links: Vec<(String, String, LinkSpec)>,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    admin_token: Option<String>,
    log: String,
    piped: bool,
    cluster: Option<PathBuf>,
    identity: String,
    peer: Peer,
}

/// Whom a controller replica follows for the links it does not hold.
#[derive(Debug, Clone)]
enum Peer {
    /// Nobody: it watches every remote itself.
    None,
    /// The first of replicas that follow each other: `--peers` is its own facade.
    First,
    /// Beside a running replica: its CA and certificate, and `--peers` at its facade.
    Beside { facade: SocketAddr, tls: PathBuf },
}

impl Launch {
    /// Floodgate in `mode`, its files in `dir`: no links yet, log level `info` into
    /// `<dir>/floodgate.log`.
    pub fn new(mode: Mode, dir: &Path) -> Self {
        Self {
            mode,
            dir: dir.to_owned(),
            links: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            admin_token: None,
            log: "info".into(),
            piped: false,
            cluster: None,
            identity: "floodgate-0".into(),
            peer: Peer::None,
        }
    }

    /// In controller mode, the first of replicas that follow each other (as the manifests'
    /// headless Service lists every replica, this one too): it says where its facade is on
    /// the Leases it holds, and reads the links it does not hold from their holder.
    pub fn first_of_peers(mut self) -> Self {
        self.peer = Peer::First;
        self
    }

    /// In controller mode, a replica beside `peer` (started with [`Self::first_of_peers`]):
    /// the same CA and certificate (as the `floodgate-tls` Secret makes every replica share),
    /// `--peers` at its facade, and it follows the holder of each link it does not hold.
    pub fn beside(mut self, peer: &Floodgate) -> Self {
        self.peer = Peer::Beside {
            facade: peer.facade,
            tls: peer.state.join("tls"),
        };
        self
    }

    /// In controller mode, the replica's identity in Leases (`--identity`; `floodgate-0`
    /// unless set), so that two replicas of one cluster can run side by side.
    pub fn identity(mut self, identity: &str) -> Self {
        self.identity = identity.to_owned();
        self
    }

    /// In controller mode, follows the cluster of the kubeconfig file `path` (a real API
    /// server, say) instead of a local kube-sim one; the test puts the Links and Secrets there.
    pub fn cluster(mut self, path: &Path) -> Self {
        self.cluster = Some(path.to_owned());
        self
    }

    /// Adds link `name` following the remote of `kubeconfig` (YAML) under `spec` (its
    /// `remote` is replaced by what the mode needs).
    pub fn link(mut self, name: &str, kubeconfig: &str, spec: LinkSpec) -> Self {
        self.links
            .push((name.to_owned(), kubeconfig.to_owned(), spec));
        self
    }

    /// Adds command-line flags.
    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable of the child.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The admin API's bearer token (without one its mutating routes answer 403).
    pub fn admin_token(mut self, token: &str) -> Self {
        self.admin_token = Some(token.to_owned());
        self
    }

    /// The log filter (`FLOODGATE_LOG`); empty: none, the binary's default.
    pub fn log(mut self, filter: &str) -> Self {
        self.log = filter.to_owned();
        self
    }

    /// Pipes stdout and stderr to the test (see [`Floodgate::child`]) instead of a file.
    pub fn piped(mut self) -> Self {
        self.piped = true;
        self
    }

    /// Prepares the links (a file, or the local cluster's objects) and starts the child.
    pub async fn spawn(self) -> anyhow::Result<Floodgate> {
        std::fs::create_dir_all(&self.dir)?;
        let (facade, admin, grpc) = (
            process::free_addr(),
            process::free_addr(),
            process::free_addr(),
        );
        let state = self.dir.join("state");
        let mut argv: Vec<OsString> = Vec::new();
        let mut env = self.env.clone();
        let mut local = None;
        match self.mode {
            Mode::Standalone => {
                let links = self.links_file()?;
                argv.extend(["run".into(), "--config".into(), links.into()]);
            }
            Mode::Controller => {
                let kubeconfig = match &self.cluster {
                    Some(path) => path.clone(),
                    None => {
                        let cluster = RunningLocal::start().await?;
                        self.put_links(&cluster).await;
                        let path = self.dir.join("local.kubeconfig");
                        std::fs::write(&path, cluster.kubeconfig(NS))?;
                        local = Some(cluster);
                        path
                    }
                };
                env.push(("KUBECONFIG".into(), kubeconfig.into()));
                argv.extend(["controller".into(), "--namespace".into(), NS.into()]);
                argv.extend(["--identity".into(), self.identity.clone().into()]);
                let peers = match &self.peer {
                    Peer::None => None,
                    Peer::First => Some(facade),
                    Peer::Beside { facade, tls } => {
                        let ours = state.join("tls");
                        std::fs::create_dir_all(&ours)?;
                        for f in ["tls.crt", "tls.key", "ca.crt"] {
                            std::fs::copy(tls.join(f), ours.join(f))?;
                        }
                        Some(*facade)
                    }
                };
                if let Some(peers) = peers {
                    argv.extend(["--peers".into(), peers.to_string().into()]);
                    argv.extend(["--advertise-address".into(), facade.to_string().into()]);
                }
            }
        }
        argv.extend([
            "--state-dir".into(),
            state.clone().into(),
            "--listen".into(),
            facade.to_string().into(),
            "--admin-listen".into(),
            admin.to_string().into(),
            "--grpc-listen".into(),
            grpc.to_string().into(),
        ]);
        if let Some(token) = &self.admin_token {
            let file = self.dir.join("admin-token");
            std::fs::write(&file, token)?;
            argv.extend(["--admin-token-file".into(), file.into()]);
        }
        argv.extend(self.args.iter().cloned());
        if !self.log.is_empty() {
            env.push(("FLOODGATE_LOG".into(), self.log.clone().into()));
        }
        let mut fg = Floodgate {
            child: None,
            mode: self.mode,
            links: self.links.iter().map(|(n, _, _)| n.clone()).collect(),
            facade,
            admin,
            grpc,
            admin_token: self.admin_token.clone(),
            state,
            log: self.dir.join("floodgate.log"),
            piped: self.piped,
            argv,
            env,
            local,
        };
        fg.respawn()?;
        Ok(fg)
    }

    /// [`Self::spawn`], then waits up to 60 s for `/readyz` to answer 200.
    pub async fn start(self) -> anyhow::Result<Floodgate> {
        let mut fg = self.spawn().await?;
        fg.wait_ready(60).await?;
        Ok(fg)
    }

    /// `<dir>/links.yaml` for `floodgate run`, each remote's kubeconfig beside it.
    fn links_file(&self) -> anyhow::Result<PathBuf> {
        let mut links = Vec::new();
        for (name, kubeconfig, spec) in &self.links {
            let path = self.dir.join(format!("{name}.remote.kubeconfig"));
            std::fs::write(&path, kubeconfig)?;
            let mut spec = spec.clone();
            spec.remote = RemoteSpec {
                kubeconfig_path: Some(path.display().to_string()),
                ..RemoteSpec::default()
            };
            links.push(NamedLink {
                name: name.clone(),
                spec,
            });
        }
        let path = self.dir.join("links.yaml");
        std::fs::write(&path, serde_yaml::to_string(&LinksFile { links })?)?;
        Ok(path)
    }

    /// Each link's credentials and token Secrets and its Link, in the local cluster.
    async fn put_links(&self, local: &RunningLocal) {
        for (name, kubeconfig, spec) in &self.links {
            let mut link = cluster::mk_link(name);
            link.spec = LinkSpec {
                remote: link.spec.remote.clone(),
                ..spec.clone()
            };
            cluster::put_link(local, name, kubeconfig, link).await;
        }
    }
}

/// A running `floodgate` child, killed when dropped.
#[derive(Debug)]
pub struct Floodgate {
    child: Option<Child>,
    /// The mode it runs in.
    pub mode: Mode,
    /// Its links, in the order given.
    pub links: Vec<String>,
    /// The Kubernetes facade (TLS unless `--insecure-http` in standalone mode).
    pub facade: SocketAddr,
    /// The admin API (plain HTTP).
    pub admin: SocketAddr,
    /// gRPC.
    pub grpc: SocketAddr,
    /// The admin API's bearer token, when one was given.
    pub admin_token: Option<String>,
    state: PathBuf,
    log: PathBuf,
    piped: bool,
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    /// The local cluster a controller-mode child follows (served by this process).
    pub local: Option<RunningLocal>,
}

impl Floodgate {
    /// `floodgate run` with one link, `link`, following the remote of `kubeconfig` (YAML) under
    /// `spec`, with admin token `demo-admin-token`, ready.
    pub async fn start(
        dir: &Path,
        link: &str,
        kubeconfig: &str,
        spec: LinkSpec,
    ) -> anyhow::Result<Self> {
        Launch::new(Mode::Standalone, dir)
            .link(link, kubeconfig, spec)
            .admin_token("demo-admin-token")
            .start()
            .await
    }

    /// Starts the child again with the same command line (after [`Self::kill`]).
    pub fn respawn(&mut self) -> anyhow::Result<()> {
        let mut c = Command::new(process::floodgate_bin()?);
        c.args(&self.argv)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        process::preload(&mut c);
        if self.piped {
            c.stdout(Stdio::piped()).stderr(Stdio::piped());
        } else {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)?;
            c.stdout(Stdio::null()).stderr(log);
        }
        self.child = Some(c.spawn().context("starting floodgate")?);
        Ok(())
    }

    /// Waits up to `secs` for `/readyz` to answer 200; fails early if the child exits.
    pub async fn wait_ready(&mut self, secs: u64) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
        while self.readyz().await != Some(200) {
            if let Some(status) = self.child().try_wait()? {
                anyhow::bail!(
                    "floodgate exited before it was ready: {status}; {}",
                    self.log_tail()
                );
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "floodgate was not ready within {secs} s; {}",
                self.log_tail()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// What it has logged so far (its stderr, written to a file unless piped).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        format!("its log ends: {}", &text[start..])
    }

    /// `/readyz`'s status code (`None` when the admin API does not answer).
    pub async fn readyz(&self) -> Option<u16> {
        admin::call_text(self.admin, "GET", "/readyz", None, "")
            .await
            .ok()
            .map(|(code, _)| code)
    }

    /// Whether `/readyz` answers 200.
    pub async fn ready(&self) -> bool {
        self.readyz().await == Some(200)
    }

    /// The consumers' token of `link`.
    pub fn token_of(&self, link: &str) -> String {
        match self.mode {
            Mode::Standalone => std::fs::read_to_string(self.state.join("tokens").join(link))
                .expect("the link's token")
                .trim()
                .to_owned(),
            Mode::Controller => cluster::token(link),
        }
    }

    /// The consumers' token of the first link.
    pub fn token(&self) -> String {
        self.token_of(&self.links[0])
    }

    /// The state directory (`tokens/`, `tls/`, `links/`).
    pub fn state(&self) -> &Path {
        &self.state
    }

    /// The kubeconfig a consumer of `link` uses (its token and Floodgate's CA).
    pub fn consumer_kubeconfig_of(&self, link: &str) -> anyhow::Result<String> {
        let ca = std::fs::read_to_string(self.state.join("tls/ca.crt"))?;
        let server = format!("https://{}/links/{link}", self.facade);
        Ok(floodgate::credentials::consumer_kubeconfig(
            &server,
            &self.token_of(link),
            Some(&ca),
            link,
        ))
    }

    /// [`Self::consumer_kubeconfig_of`] the first link.
    pub fn consumer_kubeconfig(&self) -> anyhow::Result<String> {
        self.consumer_kubeconfig_of(&self.links[0])
    }

    /// A kube client of the first link's consumers.
    pub async fn consumer(&self) -> anyhow::Result<kube::Client> {
        crate::gateway::client_from(&self.consumer_kubeconfig()?).await
    }

    /// The first link as the admin API shows it (`Null` when it does not answer).
    pub async fn link_state(&self) -> Value {
        let path = format!("/links/{}", self.links[0]);
        match admin::call(self.admin, "GET", &path, None, "").await {
            Ok((200, v)) => v,
            _ => Value::Null,
        }
    }

    /// `POST /links/<first link>/<action>` with the admin token.
    pub async fn admin_post(&self, action: &str) -> anyhow::Result<(u16, Value)> {
        let path = format!("/links/{}/{action}", self.links[0]);
        admin::call(self.admin, "POST", &path, self.admin_token.as_deref(), "").await
    }

    /// The child process.
    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("floodgate was started")
    }

    /// Takes the child out (to wait for its piped output); the harness no longer owns it.
    pub fn into_child(mut self) -> Child {
        self.child.take().expect("floodgate was started")
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// Sends signal `name` (`TERM`, `STOP`, `CONT`, ...).
    pub fn signal(&self, name: &str) {
        let pid = self.pid().expect("still running");
        let ok = std::process::Command::new("kill")
            .args([&format!("-{name}"), &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "SIG{name} sent to {pid}");
    }

    /// Kills (SIGKILL) and reaps the process.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child().kill().await?;
        Ok(())
    }

    /// Kills and reaps the process.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.kill().await
    }
}
