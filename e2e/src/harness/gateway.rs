//! Floodgate in-process in front of a kube-sim, for scenario tests: the remote, the gateway,
//! and helpers for consumers of a link.

use std::sync::Arc;
use std::time::Duration;

use floodgate::credentials::TlsSource;
use floodgate::run::{RunConfig, Running};
use floodgate::serving::ServeConfig;
use floodgate_link_crd::{LinkSpec, LinksFile, NamedLink, RemoteSpec};

use crate::RunningSim;
use crate::sim::SimStore;

/// A kube-sim and a Floodgate with one link, `east`, in front of it.
#[derive(Debug)]
pub struct Stack {
    /// The remote.
    pub sim: RunningSim,
    /// The gateway.
    pub floodgate: Running,
    /// The admin API's bearer token (in a file the gateway was started with).
    pub admin_token: String,
    dir: tempfile::TempDir,
}

impl Stack {
    /// Starts kube-sim over `store`, then Floodgate with `spec` (its remote is filled in) and
    /// waits until the link has synced.
    pub async fn start(store: Arc<SimStore>, spec: LinkSpec) -> anyhow::Result<Self> {
        let sim = RunningSim::start(store, "remote-token").await?;
        let dir = tempfile::tempdir()?;
        let (floodgate, admin_token) = start_floodgate(&sim.kubeconfig(), spec, dir.path()).await?;
        Ok(Self {
            sim,
            floodgate,
            admin_token,
            dir,
        })
    }

    /// A spec with every default (the remote is set by [`Stack::start`]).
    pub fn default_spec() -> LinkSpec {
        LinkSpec::with_remote(RemoteSpec::default())
    }

    /// A kube client of link `east`'s consumers.
    pub async fn consumer(&self) -> anyhow::Result<kube::Client> {
        let yaml = self
            .floodgate
            .kubeconfig("east")
            .ok_or_else(|| anyhow::anyhow!("no link east"))?;
        client_from(&yaml).await
    }

    /// A kube client straight to the remote (the "direct" consumer of the comparisons).
    pub async fn direct(&self) -> anyhow::Result<kube::Client> {
        client_from(&self.sim.kubeconfig()).await
    }

    /// The state of link `east`.
    pub fn link(&self) -> floodgate::link::LinkState {
        self.floodgate.links[0].state.borrow().clone()
    }

    /// Waits (up to `within`) until link `east`'s state satisfies `ok`; returns that state, or
    /// an error naming `what` with the last state seen.
    pub async fn wait_link(
        &self,
        what: &str,
        within: Duration,
        ok: impl Fn(&floodgate::link::LinkState) -> bool,
    ) -> anyhow::Result<floodgate::link::LinkState> {
        let mut rx = self.floodgate.links[0].state.clone();
        let wait = rx.wait_for(|s| ok(s));
        match tokio::time::timeout(within, wait).await {
            Ok(Ok(s)) => Ok(s.clone()),
            Ok(Err(_)) => anyhow::bail!("{what}: the link stopped"),
            Err(_) => anyhow::bail!("{what}: not within {within:?}; last {:?}", self.link()),
        }
    }

    /// Waits until link `east` has published what it holds: the pods its published endpoints
    /// name are fetched and nothing is pending.
    pub async fn settled(&self) -> anyhow::Result<floodgate::link::LinkState> {
        self.wait_link("settled", Duration::from_secs(10), |s| {
            s.engine.pending == 0 && s.counters.pods_fetched as usize <= pods_held(s)
        })
        .await
    }

    /// The gRPC endpoint of Floodgate (`https://127.0.0.1:PORT`; its certificate is valid for
    /// `localhost` and signed by [`Stack::ca_pem`]).
    pub fn grpc_url(&self) -> String {
        format!("https://{}", self.floodgate.grpc_addr)
    }

    /// The CA Floodgate's listeners (facade and gRPC) present certificates from.
    pub fn ca_pem(&self) -> &str {
        self.floodgate.ca_pem.as_deref().unwrap_or_default()
    }

    /// The bearer token of link `east`.
    pub fn token(&self) -> &str {
        self.floodgate.token("east").unwrap_or_default()
    }

    /// The admin API's address (plain HTTP on loopback).
    pub fn admin_addr(&self) -> std::net::SocketAddr {
        self.floodgate.admin_addr
    }

    /// The temporary directory (kubeconfigs, state).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

fn pods_held(s: &floodgate::link::LinkState) -> usize {
    s.engine.objects_by_kind.get("Pod").copied().unwrap_or(0)
}

/// Starts Floodgate with one link, `east`, whose remote is reached with `remote_kubeconfig`
/// (`spec`'s remote is replaced), keeping its files in `dir`, and waits until the link has
/// synced. Returns it and the admin API's token.
pub async fn start_floodgate(
    remote_kubeconfig: &str,
    mut spec: LinkSpec,
    dir: &std::path::Path,
) -> anyhow::Result<(Running, String)> {
    let remote = dir.join("remote.kubeconfig");
    std::fs::write(&remote, remote_kubeconfig)?;
    spec.remote = RemoteSpec {
        kubeconfig_path: Some(remote.display().to_string()),
        ..RemoteSpec::default()
    };
    let admin_token = "admin-token".to_owned();
    let token_file = dir.join("admin-token");
    std::fs::write(&token_file, format!("{admin_token}\n"))?;
    let cfg = RunConfig {
        links: LinksFile {
            links: vec![NamedLink {
                name: "east".into(),
                spec,
            }],
        },
        serving: ServeConfig {
            listen: "127.0.0.1:0".parse()?,
            admin_listen: "127.0.0.1:0".parse()?,
            grpc_listen: "127.0.0.1:0".parse()?,
            state_dir: dir.join("state"),
            tls: TlsSource::SelfSigned,
            hosts: vec![],
            admin_token_file: Some(token_file),
            limits: Default::default(),
            shutdown_timeout: floodgate::server::DEFAULT_SHUTDOWN_TIMEOUT,
            link_starts_per_second: floodgate::link::DEFAULT_LINK_STARTS_PER_SECOND,
        },
    };
    let floodgate = floodgate::run::start(cfg).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !floodgate.ready() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the link did not sync within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((floodgate, admin_token))
}

/// A kube client from kubeconfig YAML.
pub async fn client_from(yaml: &str) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::from_yaml(yaml)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await?;
    Ok(kube::Client::try_from(cfg)?)
}

/// A GET of `path` through `client`, accepting `accept`, as the raw response: for a watch's
/// frames and content types, which kube-rs's typed calls do not show.
pub async fn raw_get(
    client: &kube::Client,
    path: &str,
    accept: &str,
) -> anyhow::Result<hyper::Response<kube::client::Body>> {
    let req = hyper::Request::get(path)
        .header("accept", accept)
        .body(kube::client::Body::from(Vec::new()))?;
    Ok(client.send(req).await?)
}
