//! What goes in and out of the engine: the upstream changes it takes ([`Change`], a pod's
//! answer to a [`Fetch`]), the effects it asks of its caller ([`Effect`]), and its running
//! totals ([`Counters`]).

use serde::Serialize;

use super::quarantine::Transition;
use crate::model::{Kind, NsName, ObjKey, Object};

/// One upstream change, as the watchers report it.
#[derive(Clone, Debug)]
pub enum Change {
    /// An object was created or updated (or listed during a relist).
    Apply(Object),
    /// An object was deleted.
    Delete(ObjKey),
    /// A relist of a kind begins: objects not listed before [`Change::InitDone`] are gone.
    InitStart(Kind),
    /// The relist of a kind is complete.
    InitDone(Kind),
    /// One pod's answer to a [`Fetch`] the engine asked for ([`Effect::FetchPods`]): state,
    /// not churn. Ignored when a watch event for the pod came first (that one is newer).
    Fetched(Fetched),
    /// `events` watch events of pods the pod watcher did not decode (no published endpoint
    /// names them) whose controller is ReplicaSet `replicaset`: churn of the services that
    /// serve its pods all the same, counted against their rates, never held.
    Skipped {
        /// The pods' ReplicaSet.
        replicaset: NsName,
        /// How many events.
        events: u64,
    },
}

/// Pods to fetch ([`Effect::FetchPods`]); each answer carries the ticket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetch {
    /// Told back with each answer: only the answer to a pod's last ask counts.
    pub ticket: u32,
    /// The pods.
    pub pods: Vec<NsName>,
}

/// One pod's answer to a [`Fetch`].
#[derive(Clone, Debug)]
pub struct Fetched {
    /// The fetch's ticket.
    pub ticket: u32,
    /// The pod asked for.
    pub pod: NsName,
    /// What the remote said.
    pub answer: Answer,
}

/// What the remote said of a pod asked for.
#[derive(Clone, Debug)]
pub enum Answer {
    /// The pod, admitted as the pod watcher admits pods.
    Found(Object),
    /// No such pod, one the pod watcher refuses too, or one the remote refuses to GET (the
    /// pod watcher lists and watches it all the same): the watcher sends it if it comes (or
    /// changes), so it is not asked for again.
    Absent,
    /// The remote did not answer (a connection or a timeout failed): asked for again at a
    /// publication that still lacks it, unless an event brings it first.
    Failed,
}

/// Something the caller must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Stop the upstream watches (quarantine); the engine has dropped its cache.
    StopUpstream,
    /// Start the upstream watches again, from a fresh list.
    StartUpstream,
    /// Fetch these pods and hand each answer back as [`Change::Fetched`]: kept endpoints point
    /// at them but their last event came before the endpoints did.
    FetchPods(Fetch),
    /// The link's quarantine or a service's containment changed: log it, record an event,
    /// update status, save it.
    Transition(Transition),
}

/// Running totals of one link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    /// Upstream changes received.
    pub upstream_events: u64,
    /// Changes that concerned a selected service.
    pub relevant_events: u64,
    /// Changes that concerned nothing the link serves.
    pub irrelevant_events: u64,
    /// Changes of contained services, held back until they are released.
    pub contained_events: u64,
    /// Changes absorbed into a publication already pending.
    pub coalesced: u64,
    /// Publications made.
    pub downstream_updates: u64,
    /// Times a publication had to wait for a token.
    pub throttled: u64,
    /// Selected services published.
    pub services: u64,
    /// Services withheld by `caps.maxServices`.
    pub services_withheld: u64,
    /// Endpoints published, across services.
    pub endpoints_published: u64,
    /// Endpoints withheld by `caps.maxEndpointsPerService`.
    pub endpoints_truncated: u64,
    /// Pods asked for with [`Effect::FetchPods`].
    pub pods_fetched: u64,
    /// Watch events of pods the pod watcher skipped, counted against the rates of the
    /// services that serve their ReplicaSet's pods ([`Change::Skipped`]).
    pub skipped_events: u64,
}
