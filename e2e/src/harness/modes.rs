//! Floodgate in either mode behind one shape, so a scenario runs against both: `floodgate run`
//! from a links file ([`crate::gateway::Stack`]) or `floodgate controller` from a Link in
//! kube-sim's local cluster ([`crate::cluster::Replica`]). Each serves link `east` over a
//! kube-sim remote with the exported services asked for, in namespace `prod`.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::cluster::{self, Replica};
use crate::drivers::Cluster;
use crate::gateway::Stack;
use crate::local::RunningLocal;
use crate::sim::SimStore;
use crate::{RunningSim, until};

/// Which command serves the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `floodgate run --config links.yaml`.
    Standalone,
    /// `floodgate controller`, one replica.
    Controller,
}

/// Both modes, for `for mode in Mode::BOTH`.
impl Mode {
    /// Every mode.
    pub const BOTH: [Mode; 2] = [Mode::Standalone, Mode::Controller];
}

/// What keeps the served link alive.
#[derive(Debug)]
enum Keep {
    Standalone(Box<Stack>),
    Controller(Box<InCluster>),
}

/// A controller replica and the clusters it needs.
#[derive(Debug)]
struct InCluster {
    replica: Replica,
    _local: RunningLocal,
    _sim: RunningSim,
}

/// Link `east`, served, and how to reach it.
#[derive(Debug)]
pub struct Served {
    /// The mode.
    pub mode: Mode,
    /// The admin API (plain HTTP).
    pub admin: SocketAddr,
    /// gRPC (TLS, certificate for `localhost`).
    pub grpc: SocketAddr,
    /// The link's consumer token.
    pub token: String,
    /// The admin API's token.
    pub admin_token: String,
    /// The CA of the facade's and gRPC's certificate.
    pub ca_pem: String,
    /// The remote's driver (scale services, flip pods).
    pub cluster: Cluster,
    keep: Keep,
}

impl Served {
    /// Serves `east` in `mode` over a remote with `services` (two ready pods each) and waits
    /// until the link has synced.
    pub async fn start(mode: Mode, services: &[&str]) -> Self {
        match mode {
            Mode::Standalone => {
                let store = Arc::new(SimStore::new(7, 10_000));
                let mut cluster = Cluster::new(store.clone(), "prod");
                for s in services {
                    cluster.add_service(s, true);
                    cluster.scale(s, 2, true);
                }
                let stack = Stack::start(store, Stack::default_spec())
                    .await
                    .expect("floodgate run");
                Self {
                    mode,
                    admin: stack.admin_addr(),
                    grpc: stack.floodgate.grpc_addr,
                    token: stack.token().to_owned(),
                    admin_token: stack.admin_token.clone(),
                    ca_pem: stack.ca_pem().to_owned(),
                    cluster,
                    keep: Keep::Standalone(Box::new(stack)),
                }
            }
            Mode::Controller => {
                let local = RunningLocal::start().await.expect("local cluster");
                let (sim, cluster) = cluster::remote(services).await;
                cluster::add_link(&local, "east", &sim, cluster::mk_link("east")).await;
                let replica = Replica::start(&local, "replica-a").await;
                until(30, "east is Ready", async || {
                    cluster::ready_at(&local, "east", 1).await
                })
                .await;
                let ca_pem = replica.ca_pem().await;
                Self {
                    mode,
                    admin: replica.admin,
                    grpc: replica.grpc,
                    token: cluster::token("east"),
                    admin_token: cluster::ADMIN_TOKEN.to_owned(),
                    ca_pem,
                    cluster,
                    keep: Keep::Controller(Box::new(InCluster {
                        replica,
                        _local: local,
                        _sim: sim,
                    })),
                }
            }
        }
    }

    /// Stops Floodgate.
    pub async fn stop(self) {
        match self.keep {
            Keep::Standalone(stack) => stack.floodgate.stop().await,
            Keep::Controller(c) => c.replica.stop().await,
        }
    }
}
