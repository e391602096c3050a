//! The `Link` status: what Floodgate reports about a link, through the status subresource and the
//! admin API alike.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The link's overall state.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum Phase {
    /// Following the remote; updates flow within budget.
    #[default]
    Healthy,
    /// Following the remote, but updates are waiting for tokens: consumers see coalesced state.
    Throttled,
    /// Not following the remote: consumers keep the last good view until release.
    Quarantined,
    /// Serving, but something is wrong (credentials, upstream unreachable, skipped objects).
    Degraded,
}

impl Phase {
    /// The name Kubernetes shows.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "Healthy",
            Self::Throttled => "Throttled",
            Self::Quarantined => "Quarantined",
            Self::Degraded => "Degraded",
        }
    }
}

/// Observed state of a link.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkStatus {
    /// Healthy, Throttled, Quarantined or Degraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The replica (pod) holding the link's Lease, which decides for the link and wrote this
    /// status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_holder: Option<String>,
    /// Kubernetes-style conditions: `Ready`, `Synced`, `Throttled`, `Quarantined`, `SpecValid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Present while the link is quarantined: since when, why, and the figures that caused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<QuarantineStatus>,
    /// Present while services are contained: how many, and the first few by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contained_services: Option<ContainedServicesStatus>,
    /// Running totals since the link started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Counters>,
}

/// The services a link contains: each stays served at its last published state until
/// released, while the link's other services keep flowing.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainedServicesStatus {
    /// Services contained now.
    pub count: i64,
    /// The first few (at most [`ContainedServicesStatus::FIRST`]), by namespace and name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first: Vec<ContainedServiceStatus>,
}

impl ContainedServicesStatus {
    /// Contained services named in status at most: status stays small however many there are.
    pub const FIRST: usize = 5;
}

/// One contained service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainedServiceStatus {
    /// `namespace/name`.
    pub service: String,
    /// A CamelCase reason: `EndpointsPerService` or `ServiceEventRate`.
    pub reason: String,
    /// When it was contained.
    pub since: Time,
    /// A sentence for people.
    #[serde(default)]
    pub message: String,
    /// The measurements that crossed a threshold, with the thresholds, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub figures: BTreeMap<String, i64>,
}

/// Why and since when a link is quarantined.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuarantineStatus {
    /// When the quarantine began.
    pub since: Time,
    /// A CamelCase reason: `EventRate`, `ObjectCount`, `ContainedServices` or `Manual`.
    pub reason: String,
    /// A sentence for people.
    #[serde(default)]
    pub message: String,
    /// The measurements that crossed a threshold, with the thresholds, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub figures: BTreeMap<String, i64>,
}

/// Running totals.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    /// Selected services served.
    pub services: i64,
    /// Endpoints published to consumers, across services.
    pub endpoints_published: i64,
    /// Endpoints withheld by `caps.maxEndpointsPerService`.
    pub endpoints_truncated: i64,
    /// Upstream watch events received.
    pub upstream_events: i64,
    /// Updates published to consumers.
    pub downstream_updates: i64,
}
