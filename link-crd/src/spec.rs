//! The `Link` spec: what one link between a remote cluster and its local consumers may do.
//!
//! Every field but `remote` has a default, applied both by serde (standalone YAML files) and by
//! the API server (the defaults are part of the CRD's schema). The doc comments here are the
//! configuration reference: they become the CRD's field descriptions, and the table in
//! docs/configuration.md is checked against them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::KubeDuration;
use crate::status::LinkStatus;

/// The label Linkerd puts on services a cluster exports.
pub const EXPORTED_LABEL: &str = "mirror.linkerd.io/exported";

/// One link: a remote cluster's API, watched once, served to local consumers within a budget.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "floodgate.dev",
    version = "v1alpha1",
    kind = "Link",
    plural = "links",
    shortname = "fgl",
    namespaced,
    status = "LinkStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Services","type":"integer","jsonPath":".status.counters.services"}"#,
    printcolumn = r#"{"name":"Endpoints","type":"integer","jsonPath":".status.counters.endpointsPublished"}"#,
    printcolumn = r#"{"name":"Holder","type":"string","jsonPath":".status.leaseHolder"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LinkSpec {
    /// Where the remote cluster's API server is and which credentials reach it. Required.
    pub remote: RemoteSpec,
    /// Which remote objects consumers see. Default: services labelled
    /// `mirror.linkerd.io/exported` in (`true`, `remote-discovery`).
    #[serde(default)]
    pub select: SelectSpec,
    /// The remote's Linkerd namespace, as Linkerd's Link names it: where the remote's
    /// `linkerd-config` ConfigMap is read and served from (its trust anchors, for `linkerd
    /// multicluster check`), the only ConfigMap a link serves. A DNS-1123 label. Default:
    /// `linkerd`.
    #[serde(default = "default_linkerd_namespace")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub target_cluster_linkerd_namespace: String,
    /// How bursts of changes to one service collapse into one update.
    #[serde(default)]
    pub coalesce: CoalesceSpec,
    /// How many updates consumers may receive, per link and per service.
    #[serde(default)]
    pub rate_limit: RateLimitSpec,
    /// Hard limits on what the link publishes and holds.
    #[serde(default)]
    pub caps: CapsSpec,
    /// When the link stops following its remote, and how it comes back.
    #[serde(default)]
    pub quarantine: QuarantineSpec,
}

/// How to reach the remote API server: exactly one of `kubeconfigSecret` or `kubeconfigPath`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.kubeconfigSecret) != has(self.kubeconfigPath)",
    "message": "set exactly one of kubeconfigSecret or kubeconfigPath"
}]))]
pub struct RemoteSpec {
    /// A Secret in the Link's namespace holding the remote kubeconfig (cluster mode). Linkerd's
    /// `multicluster link` creates one named `cluster-credentials-<cluster>` with key `kubeconfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret: Option<SecretKeyRef>,
    /// A kubeconfig file on Floodgate's own filesystem (standalone mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_path: Option<String>,
    /// The kubeconfig context to use. Default: the kubeconfig's current context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
}

/// A key of a Secret in the Link's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key holding the kubeconfig. Default: `kubeconfig`.
    #[serde(default = "default_secret_key")]
    #[schemars(length(min = 1))]
    pub key: String,
}

/// Linkerd's own namespace, its Link's default `targetClusterLinkerdNamespace`.
pub const DEFAULT_LINKERD_NAMESPACE: &str = "linkerd";

fn default_linkerd_namespace() -> String {
    DEFAULT_LINKERD_NAMESPACE.to_owned()
}

fn default_secret_key() -> String {
    "kubeconfig".to_owned()
}

/// What consumers see of the remote cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SelectSpec {
    /// The services to serve (a Kubernetes label selector). Their EndpointSlices and Endpoints,
    /// the pods those endpoints reference and the pods' ReplicaSets come along; nothing else does.
    /// Default: `mirror.linkerd.io/exported` in (`true`, `remote-discovery`).
    #[serde(default = "default_service_selector")]
    pub services: LabelSelector,
}

impl Default for SelectSpec {
    fn default() -> Self {
        Self {
            services: default_service_selector(),
        }
    }
}

fn default_service_selector() -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: EXPORTED_LABEL.to_owned(),
            operator: "In".to_owned(),
            values: Some(vec!["true".to_owned(), "remote-discovery".to_owned()]),
        }]),
        match_labels: None::<BTreeMap<String, String>>,
    }
}

/// Debounce per service: a change to a service that was quiet for `quiet` is published at once,
/// and so is the first change of each other kind (a rollout's Pod, then its EndpointSlice)
/// within that window; a further change is a burst, published after `quiet` without a further
/// change, never later than `max` after the first unpublished change.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CoalesceSpec {
    /// Quiet time that ends a burst: a service changed again within it publishes this long
    /// after its last change. Default: `100ms`.
    #[serde(default = "default_quiet")]
    pub quiet: KubeDuration,
    /// Longest a pending change waits for quiet. Default: `2s`.
    #[serde(default = "default_max")]
    pub max: KubeDuration,
}

impl Default for CoalesceSpec {
    fn default() -> Self {
        Self {
            quiet: default_quiet(),
            max: default_max(),
        }
    }
}

fn default_quiet() -> KubeDuration {
    KubeDuration::from_millis(100)
}

fn default_max() -> KubeDuration {
    KubeDuration::from_secs(2)
}

/// Token buckets (GCRA) on what consumers receive.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimitSpec {
    /// Budget for the whole link. Default: 50 updates/s, burst 100.
    #[serde(default = "default_per_link")]
    pub per_link: Bucket,
    /// Budget for each service. Default: 5 updates/s, burst 10.
    #[serde(default = "default_per_service")]
    pub per_service: Bucket,
}

impl Default for RateLimitSpec {
    fn default() -> Self {
        Self {
            per_link: default_per_link(),
            per_service: default_per_service(),
        }
    }
}

fn default_per_link() -> Bucket {
    Bucket {
        updates_per_second: 50,
        burst: 100,
    }
}

fn default_per_service() -> Bucket {
    Bucket {
        updates_per_second: 5,
        burst: 10,
    }
}

/// One token bucket: a sustained rate and how many updates may go at once.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bucket {
    /// Sustained updates per second. At least 1.
    #[schemars(range(min = 1))]
    pub updates_per_second: u32,
    /// Updates that may go at once after a calm period. At least 1.
    #[schemars(range(min = 1))]
    pub burst: u32,
}

/// Hard limits.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapsSpec {
    /// Endpoints published per service; the rest are withheld (ready first, then those already
    /// published, then by name) and counted as truncated. Default: 1000.
    #[serde(default = "default_max_endpoints")]
    #[schemars(range(min = 1))]
    pub max_endpoints_per_service: u32,
    /// Selected services served; services past it are withheld and counted. Default: 2000.
    #[serde(default = "default_max_services")]
    #[schemars(range(min = 1))]
    pub max_services: u32,
    /// Upstream objects the link may hold; past it the link is quarantined. Default: 200000.
    #[serde(default = "default_max_objects")]
    #[schemars(range(min = 1))]
    pub max_objects: u32,
}

impl Default for CapsSpec {
    fn default() -> Self {
        Self {
            max_endpoints_per_service: default_max_endpoints(),
            max_services: default_max_services(),
            max_objects: default_max_objects(),
        }
    }
}

fn default_max_endpoints() -> u32 {
    1000
}

fn default_max_services() -> u32 {
    2000
}

fn default_max_objects() -> u32 {
    200_000
}

/// Flood detection and release.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuarantineSpec {
    /// The thresholds that contain a service or quarantine the link.
    #[serde(default)]
    pub when: QuarantineWhen,
    /// Release by itself after a cool-down whose re-check passes, for the link and for each
    /// contained service alike. Absent: only an operator releases them (admin API
    /// `POST /links/{name}/release`, `POST /links/{name}/services/{namespace}/{name}/release`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_release: Option<AutoRelease>,
}

/// Flood thresholds. The per-service ones (`endpointsPerService`, `serviceEventsPerSecond`)
/// *contain* that one service: it stays served at its last published state while the link's
/// other services keep flowing. The link-wide ones (`eventsPerSecond`, `containedServices`, and
/// `caps.maxObjects`) quarantine the whole link. Any one of them is enough.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuarantineWhen {
    /// Upstream events per second concerning selected services that are not flooding on their
    /// own (events of a service over `serviceEventsPerSecond`, or contained, are not counted),
    /// sustained for `sustainedFor`: the link is quarantined. Default: 2000.
    #[serde(default = "default_events_per_second")]
    #[schemars(range(min = 1))]
    pub events_per_second: u32,
    /// How long an event rate must be exceeded without a break. Rates are counted in one-second
    /// buckets, each event in the second Floodgate read it from the remote; once a run has
    /// begun, a second under the threshold goes on with it while the last three seconds average
    /// over the threshold (a remote delivers watch events in lumps, and a steady flood near its
    /// threshold straddles it second by second); a second without an event breaks it. Default:
    /// `10s`.
    #[serde(default = "default_sustained_for")]
    pub sustained_for: KubeDuration,
    /// Upstream endpoints of one selected service (before the cap): the service is contained.
    /// Must be at least `caps.maxEndpointsPerService`. Default: 20000.
    #[serde(default = "default_endpoints_per_service")]
    #[schemars(range(min = 1))]
    pub endpoints_per_service: u32,
    /// Upstream events per second concerning one selected service, sustained for
    /// `sustainedFor`: the service is contained. An EndpointSlice change counts once per
    /// endpoint it changes. Default: 200 (a rollout of a 1,000-pod Deployment stays under it;
    /// a ReplicaSet of crash-looping pods does not).
    #[serde(default = "default_service_events_per_second")]
    #[schemars(range(min = 1))]
    pub service_events_per_second: u32,
    /// Services contained at once above which the whole link is quarantined: that many
    /// services flooding together is the remote failing, not one workload. Default: 10.
    #[serde(default = "default_contained_services")]
    #[schemars(range(min = 1))]
    pub contained_services: u32,
    /// A link-wide removal: when, within `removedWithin`, the remote removes over this share
    /// (in percent) of the services the link serves, or of their endpoints (services deleted,
    /// unexported or emptied, slices deleted; a relist that comes back smaller counts the
    /// same), the link is quarantined with its last view served. A removal that takes a
    /// service out of the view (or empties it) waits until no other removal has come for 1 s
    /// (at most `removedWithin`) before it is served, so the first removals of a mass removal
    /// do not escape. 100 turns it off. Default: 50.
    #[serde(default = "default_removed_share")]
    #[schemars(range(min = 1, max = 100))]
    pub removed_share: u32,
    /// The fewest services a link-wide removal takes out (or empties) or takes endpoints
    /// from: one service deleted, unexported or scaled to zero is never a link-wide removal,
    /// however small the remote. Default: 2.
    #[serde(default = "default_removed_services")]
    #[schemars(range(min = 2))]
    pub removed_services: u32,
    /// The window over which removals add up. Default: `10s`.
    #[serde(default = "default_removed_within")]
    pub removed_within: KubeDuration,
}

impl Default for QuarantineWhen {
    fn default() -> Self {
        Self {
            events_per_second: default_events_per_second(),
            sustained_for: default_sustained_for(),
            endpoints_per_service: default_endpoints_per_service(),
            service_events_per_second: default_service_events_per_second(),
            contained_services: default_contained_services(),
            removed_share: default_removed_share(),
            removed_services: default_removed_services(),
            removed_within: default_removed_within(),
        }
    }
}

fn default_events_per_second() -> u32 {
    2000
}

fn default_sustained_for() -> KubeDuration {
    KubeDuration::from_secs(10)
}

fn default_endpoints_per_service() -> u32 {
    20_000
}

fn default_service_events_per_second() -> u32 {
    200
}

fn default_contained_services() -> u32 {
    10
}

fn default_removed_share() -> u32 {
    50
}

fn default_removed_services() -> u32 {
    2
}

fn default_removed_within() -> KubeDuration {
    KubeDuration::from_secs(10)
}

/// Opt-in release after a cool-down. When the re-check still sees a flood, the cool-down doubles,
/// up to `maxAfter`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AutoRelease {
    /// First cool-down before a re-check. Default: `10m`.
    #[serde(default = "default_after")]
    pub after: KubeDuration,
    /// Longest cool-down after repeated failed re-checks. Default: `1h`.
    #[serde(default = "default_max_after")]
    pub max_after: KubeDuration,
}

impl Default for AutoRelease {
    fn default() -> Self {
        Self {
            after: default_after(),
            max_after: default_max_after(),
        }
    }
}

fn default_after() -> KubeDuration {
    KubeDuration::from_secs(600)
}

fn default_max_after() -> KubeDuration {
    KubeDuration::from_secs(3600)
}

impl LinkSpec {
    /// A spec with every default and the given remote.
    pub fn with_remote(remote: RemoteSpec) -> Self {
        Self {
            remote,
            select: SelectSpec::default(),
            target_cluster_linkerd_namespace: default_linkerd_namespace(),
            coalesce: CoalesceSpec::default(),
            rate_limit: RateLimitSpec::default(),
            caps: CapsSpec::default(),
            quarantine: QuarantineSpec::default(),
        }
    }
}
