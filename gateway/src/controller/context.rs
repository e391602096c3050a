//! The replica's context, which every link it runs shares ([`Shared`]: the Links API and
//! cache, the Leases cache, its identity, its peers, its pacer), and where each of those links
//! reads its remote's objects from ([`Upstream`]). A leaf: [`super::runs`] and
//! [`super::commands`] take these from here, and it takes nothing from them.

use floodgate_link_crd::Link;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::reflector::Store;

use super::peers::Peers;
use crate::link::Pacer;

/// What every link of this replica shares: the Links (their API and this replica's cache of
/// them), the Leases it watches, its identity, its peers and its pacer.
#[derive(Clone, Debug)]
pub(super) struct Shared {
    pub(super) api: Api<Link>,
    /// The controller's cache of the Links, where a relay looks for the holder's answer.
    pub(super) links: Store<Link>,
    /// The Leases as the lease loop watches them: who holds each link's.
    pub(super) holders: Store<Lease>,
    pub(super) namespace: String,
    pub(super) identity: String,
    pub(super) peers: Option<Peers>,
    /// Every attempt to reach a remote or a holder waits its turn here.
    pub(super) pacer: Pacer,
}

/// Where a running link reads its remote's objects from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Upstream {
    /// The remote's API server: this replica holds the link's Lease, or nobody does.
    Remote,
    /// The facade of the replica holding the link's Lease (`host:port`): the remote keeps one
    /// watch per resource per link however many replicas serve it.
    Holder {
        /// The holder's identity.
        identity: String,
        /// Its facade.
        facade: String,
    },
    /// Nothing: this replica is giving the link's Lease back (it holds more than its share),
    /// and stops reading the remote before it does, so that the next holder is the only one.
    HandingOver,
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Remote => f.write_str("the remote"),
            Self::Holder { identity, facade } => {
                write!(f, "the facade of Lease holder {identity} at {facade}")
            }
            Self::HandingOver => {
                f.write_str("nothing: handing the link's Lease to another replica")
            }
        }
    }
}
