//! The controller in-process for tests: replicas of `floodgate controller` against a
//! [`crate::local`] cluster, kube-sim remotes behind their Links, and the helpers the
//! controller scenarios (`tests/controller*.rs`) share.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use floodgate::controller::lease::{self, LeaseTiming};
use floodgate::controller::{ControllerArgs, Timing};
use floodgate_link_crd::{Link, LinkSpec, LinkStatus, RemoteSpec, SecretKeyRef};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, PostParams};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::drivers::Cluster;
use crate::gateway::client_from;
use crate::local::RunningLocal;
use crate::sim::SimStore;
use crate::{RunningSim, until};

/// The namespace of the Links.
pub const NS: &str = "floodgate";

/// The namespace of the Secrets the Links name (the controller's default, as the shipped
/// manifests set it).
pub const CREDENTIALS_NS: &str = "floodgate-credentials";

/// The user every in-process replica authenticates as to the local cluster: the shipped
/// manifests' ServiceAccount.
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:floodgate:floodgate";

/// The admin API's bearer token every in-process replica reads from its token file.
pub const ADMIN_TOKEN: &str = "cluster-admin-token";

/// Timings for tests: 2 s leases renewed every 200 ms, fast ticks.
pub fn fast() -> Timing {
    Timing {
        lease: LeaseTiming {
            duration: Duration::from_secs(2),
            renew: Duration::from_millis(200),
        },
        status_tick: Duration::from_millis(100),
        status_interval: Duration::from_millis(500),
    }
}

/// One controller replica, in-process.
#[derive(Debug)]
pub struct Replica {
    /// The facade's address.
    pub facade: SocketAddr,
    /// The admin API (links, release, quarantine, metrics, status page, health).
    pub admin: SocketAddr,
    /// gRPC (`floodgate.v1.Mirror`).
    pub grpc: SocketAddr,
    state: tempfile::TempDir,
    stop: watch::Sender<bool>,
    /// The controller's task.
    pub task: JoinHandle<anyhow::Result<()>>,
    /// The relay its advertised address leads through, when started
    /// [`Self::start_behind_relay`].
    pub relay: Option<crate::relay::TcpRelay>,
}

impl Replica {
    /// Starts a replica named `identity` against `local`, on `127.0.0.1:0`.
    pub async fn start(local: &RunningLocal, identity: &str) -> Self {
        Self::start_with(local, identity, None, fast()).await
    }

    /// Starts a replica with the production timings (15 s Leases renewed every 5 s).
    pub async fn start_slow(local: &RunningLocal, identity: &str) -> Self {
        Self::start_with(local, identity, None, Timing::default()).await
    }

    /// Starts a replica whose peer is `peer`: it shares the peer's CA and certificate (as the
    /// `floodgate-tls` Secret makes every replica do) and finds it at `--peers`.
    pub async fn start_beside(local: &RunningLocal, identity: &str, peer: &Replica) -> Self {
        Self::start_with(local, identity, Some(peer), fast()).await
    }

    /// Starts the first of replicas that follow each other: its `--peers` is its own facade
    /// (as the headless Service lists every replica, this one too), so it follows the holder
    /// of a link it does not hold. Start the others [`Self::start_beside`] it.
    pub async fn start_first(local: &RunningLocal, identity: &str) -> Self {
        Self::start_with_peers(local, identity, None, fast(), true, false).await
    }

    /// Starts the first of replicas (as [`Self::start_first`]) whose advertised facade address
    /// (the one followers read it at) leads through a [`crate::relay::TcpRelay`]: cutting the
    /// relay partitions its followers from it while it keeps its Leases.
    pub async fn start_behind_relay(local: &RunningLocal, identity: &str) -> Self {
        Self::start_with_peers(local, identity, None, fast(), true, true).await
    }

    async fn start_with(
        local: &RunningLocal,
        identity: &str,
        peer: Option<&Replica>,
        timing: Timing,
    ) -> Self {
        Self::start_with_peers(local, identity, peer, timing, false, false).await
    }

    async fn start_with_peers(
        local: &RunningLocal,
        identity: &str,
        peer: Option<&Replica>,
        timing: Timing,
        self_peer: bool,
        behind_relay: bool,
    ) -> Self {
        let bind = async || TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let listeners = floodgate::server::Listeners {
            facade: bind().await,
            admin: bind().await,
            grpc: bind().await,
        };
        let addr = listeners.facade.local_addr().expect("addr");
        let admin = listeners.admin.local_addr().expect("addr");
        let grpc = listeners.grpc.local_addr().expect("addr");
        let relay = if behind_relay {
            Some(crate::relay::TcpRelay::start(addr).await.expect("relay"))
        } else {
            None
        };
        let advertised = relay.as_ref().map_or(addr, |r| r.addr);
        let state = tempfile::tempdir().expect("tempdir");
        if let Some(p) = peer {
            p.ca_pem().await;
            let tls = state.path().join("tls");
            std::fs::create_dir_all(&tls).expect("tls dir");
            for f in ["tls.crt", "tls.key", "ca.crt"] {
                std::fs::copy(p.state.path().join("tls").join(f), tls.join(f)).expect("shared TLS");
            }
        }
        let token_file = state.path().join("admin-token");
        std::fs::write(&token_file, ADMIN_TOKEN).expect("admin token");
        let args = ControllerArgs {
            namespace: NS.into(),
            credentials_namespace: CREDENTIALS_NS.into(),
            serve: floodgate::serving::ServeArgs {
                listen: addr,
                admin_listen: admin,
                grpc_listen: grpc,
                admin_token_file: Some(token_file),
                state_dir: state.path().to_owned(),
                // Stopping a replica drains its watchers like a real one, in 0.5 s of
                // readiness off.
                shutdown_timeout: 1,
                ..Default::default()
            },
            identity: identity.into(),
            peers: peer
                .map(|p| p.facade)
                .or(self_peer.then_some(addr))
                .map(|a| a.to_string()),
            peer_server_name: "localhost".into(),
            advertise_address: Some(advertised.to_string()),
            lease_duration: floodgate_link_crd::KubeDuration(timing.lease.duration),
            lease_renew: floodgate_link_crd::KubeDuration(timing.lease.renew),
        };
        let (stop, shutdown) = watch::channel(false);
        let client = local.client_as(NS, SERVICE_ACCOUNT).expect("client");
        let task = tokio::spawn(floodgate::controller::serve(
            client, args, listeners, timing, shutdown,
        ));
        Self {
            facade: addr,
            admin,
            grpc,
            state,
            stop,
            task,
            relay,
        }
    }

    /// A consumer of link `name` through this replica's facade.
    pub async fn consumer(&self, name: &str, token: &str) -> kube::Client {
        let ca = self.ca_pem().await;
        let url = format!("https://{}/links/{name}", self.facade);
        let yaml = crate::sim::kubeconfig(&url, token, Some(&ca), name);
        client_from(&yaml).await.expect("consumer client")
    }

    /// Stops it and waits for it to end.
    /// The CA of the replica's facade and gRPC certificate, once written.
    pub async fn ca_pem(&self) -> String {
        let ca_path: PathBuf = self.state.path().join("tls/ca.crt");
        until(10, "the facade's CA is written", async || ca_path.exists()).await;
        std::fs::read_to_string(&ca_path).expect("CA")
    }

    pub async fn stop(self) {
        self.stop.send(true).expect("stop");
        let ended = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        assert!(ended.is_ok(), "the replica stops within 10 s");
    }
}

/// A remote with exported services `names`, two ready pods each.
pub async fn remote(names: &[&str]) -> (RunningSim, Cluster) {
    let store = Arc::new(SimStore::new(7, 10_000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for n in names {
        cluster.add_service(n, true);
        cluster.scale(n, 2, true);
    }
    let sim = RunningSim::start(store, "remote-token").await.expect("sim");
    (sim, cluster)
}

/// A Secret with one key.
pub fn mk_secret(name: &str, key: &str, value: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            key.to_owned(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}

/// A Link whose credentials are in Secret `<name>-credentials`.
pub fn mk_link(name: &str) -> Link {
    Link::new(
        name,
        LinkSpec::with_remote(RemoteSpec {
            kubeconfig_secret: Some(SecretKeyRef {
                name: format!("{name}-credentials"),
                key: "kubeconfig".into(),
            }),
            ..RemoteSpec::default()
        }),
    )
}

/// Creates link `name`'s Secrets (remote credentials, consumers' token) and the Link.
pub async fn add_link(local: &RunningLocal, name: &str, sim: &RunningSim, link: Link) {
    put_link(local, name, &sim.kubeconfig(), link).await;
}

/// [`add_link`] with the remote's kubeconfig (YAML).
pub async fn put_link(local: &RunningLocal, name: &str, kubeconfig: &str, link: Link) {
    add_credentials(local, name, kubeconfig).await;
    add_token(local, name).await;
    let links: Api<Link> = Api::namespaced(local.client(NS).expect("client"), NS);
    links
        .create(&PostParams::default(), &link)
        .await
        .expect("link");
}

/// Creates Secret `<name>-credentials` holding `kubeconfig`, as [`mk_link`] names it.
pub async fn add_credentials(local: &RunningLocal, name: &str, kubeconfig: &str) {
    let secret = mk_secret(&format!("{name}-credentials"), "kubeconfig", kubeconfig);
    create_secret(local, &secret).await;
}

/// Creates Secret `floodgate-token-<name>`, the consumers' token of link `name`.
pub async fn add_token(local: &RunningLocal, name: &str) {
    let secret = mk_secret(&format!("floodgate-token-{name}"), "token", &token(name));
    create_secret(local, &secret).await;
}

async fn create_secret(local: &RunningLocal, secret: &Secret) {
    let secrets: Api<Secret> = Api::namespaced(
        local.client(CREDENTIALS_NS).expect("client"),
        CREDENTIALS_NS,
    );
    secrets
        .create(&PostParams::default(), secret)
        .await
        .expect("secret");
}

/// The consumers' token of link `name`.
pub fn token(name: &str) -> String {
    format!("{name}-consumer-token")
}

/// The Link's status as the cluster has it.
pub async fn status(local: &RunningLocal, name: &str) -> Option<LinkStatus> {
    let links: Api<Link> = Api::namespaced(local.client(NS).expect("client"), NS);
    links
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.status)
}

/// A condition of a status.
pub fn condition<'a>(
    s: &'a LinkStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    s.conditions.iter().find(|c| c.type_ == type_)
}

/// True when `name`'s status is Ready for generation `generation`.
pub async fn ready_at(local: &RunningLocal, name: &str, generation: i64) -> bool {
    status(local, name).await.is_some_and(|s| {
        s.observed_generation == Some(generation)
            && condition(&s, "Ready")
                .is_some_and(|c| c.status == "True" && c.observed_generation == Some(generation))
    })
}

/// The services a client lists (`None`: the list failed).
pub async fn service_names(c: &kube::Client) -> Option<BTreeSet<String>> {
    let api: Api<Service> = Api::all(c.clone());
    let list = api.list(&ListParams::default()).await.ok()?;
    Some(
        list.items
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect(),
    )
}

/// The base of the view's versions link `link`'s Lease records for its holder
/// (`floodgate.dev/view-base`).
pub fn lease_view_base(local: &RunningLocal, link: &str) -> Option<u64> {
    local
        .store
        .objects("leases")
        .into_iter()
        .find(|l| l["metadata"]["name"] == lease::lease_name(link).as_str())
        .and_then(|l| {
            l["metadata"]["annotations"][lease::VIEW_BASE_ANNOTATION]
                .as_str()?
                .parse()
                .ok()
        })
}

/// Who holds link `link`'s Lease.
pub fn lease_holder(local: &RunningLocal, link: &str) -> Option<String> {
    local
        .store
        .objects("leases")
        .into_iter()
        .find(|l| l["metadata"]["name"] == lease::lease_name(link).as_str())
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
}
