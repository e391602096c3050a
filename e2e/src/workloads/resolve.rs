//! What a consumer that resolves endpoints as Linkerd's destination does can use: each ready
//! endpoint (`conditions.ready` true or unset) of the EndpointSlices it holds is looked up by
//! its `targetRef` pod (namespace/name) in the pods it holds; one whose pod is missing is
//! dropped ("Unable to create new address") until its slice changes again.
//!
//! [`Resolver`] counts those endpoints per service (the slice's namespace and its
//! `kubernetes.io/service-name` label), both at once and *settled*: over the endpoints that have
//! been ready without their pod for longer than [`SETTLE`] (a ready endpoint may wait for its
//! pod that long, the time to list or fetch it). It remembers when it first saw each one; an
//! endpoint that gets its pod, stops being ready or goes away is forgotten.

mod at_event;

pub use at_event::EventResolver;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use floodgate::model::SERVICE_NAME_LABEL;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::{Deserialize, Serialize};

/// How long a ready endpoint may wait for its pod.
pub const SETTLE: Duration = Duration::from_secs(2);

/// Counts by service (`namespace/name`) and their total.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// The sum over every service.
    pub total: u64,
    /// The services with a count above zero.
    pub services: BTreeMap<String, u64>,
}

impl Counts {
    fn add(&mut self, service: &str) {
        self.total += 1;
        *self.services.entry(service.to_owned()).or_default() += 1;
    }

    /// One service's count.
    pub fn of(&self, service: &str) -> u64 {
        self.services.get(service).copied().unwrap_or_default()
    }
}

/// What one look at the consumer's stores found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// Ready endpoints per service, every service with a slice listed (0 included).
    pub ready: BTreeMap<String, u64>,
    /// Ready endpoints whose pod the consumer does not hold.
    pub without_pod: Counts,
    /// Those of them that have been so for longer than [`SETTLE`].
    pub settled: Counts,
}

/// Follows the ready endpoints without their pod across looks (see the module's docs).
#[derive(Debug, Default)]
pub struct Resolver {
    /// (service, pod namespace/name) -> when first seen ready without its pod.
    first_seen: HashMap<(String, String), Instant>,
}

impl Resolver {
    /// Looks at `slices` at `now`; `has_pod(namespace, name)` says whether the pod is held.
    pub fn look<'a>(
        &mut self,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
        has_pod: impl Fn(&str, &str) -> bool,
        now: Instant,
    ) -> Resolution {
        let mut out = Resolution::default();
        let mut missing: HashMap<(String, String), Instant> = HashMap::new();
        for slice in slices {
            let Some((service, endpoints)) = ready_endpoints(slice) else {
                continue;
            };
            *out.ready.entry(service.clone()).or_default() += endpoints.len() as u64;
            for (pod_ns, pod) in endpoints.into_iter().flatten() {
                if has_pod(&pod_ns, &pod) {
                    continue;
                }
                let key = (service.clone(), format!("{pod_ns}/{pod}"));
                let since = self.first_seen.get(&key).copied().unwrap_or(now);
                missing.insert(key, since);
            }
        }
        for ((service, _), since) in &missing {
            out.without_pod.add(service);
            if now.saturating_duration_since(*since) > SETTLE {
                out.settled.add(service);
            }
        }
        self.first_seen = missing;
        out
    }
}

/// A pod named by an endpoint: its namespace and name.
pub(crate) type PodRef = (String, String);

/// A slice's service (`namespace/name`, by its `kubernetes.io/service-name` label) and, for
/// each ready endpoint (`conditions.ready` true or unset), the pod (namespace, name) its
/// `targetRef` names, `None` for one that names no pod. `None` for a slice of no service.
pub(crate) fn ready_endpoints(slice: &EndpointSlice) -> Option<(String, Vec<Option<PodRef>>)> {
    let meta = &slice.metadata;
    let ns = meta.namespace.as_deref()?;
    let name = meta.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    let endpoints = (slice.endpoints.iter().flatten())
        .filter(|ep| ep.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .map(|ep| {
            let target = ep.target_ref.as_ref()?;
            if target.kind.as_deref().is_some_and(|k| k != "Pod") {
                return None;
            }
            let pod_ns = target.namespace.as_deref().unwrap_or(ns);
            Some((pod_ns.to_owned(), target.name.clone()?))
        })
        .collect();
    Some((format!("{ns}/{name}"), endpoints))
}

/// What a scenario's run saw of `readyWithoutPodSettled`: the consumer behind Floodgate's
/// (and the direct one's, for comparison), looked at once a second after the first sync. The
/// flooder's figures cover the flood, while its pods exist on the remote.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Resolved {
    /// Looks taken.
    pub looks: u64,
    /// The highest settled figure, every service.
    pub settled_max: u64,
    /// The settled figure at the last look, every service.
    pub settled_end: u64,
    /// The highest settled figure over every service but the flooder.
    pub calm_settled_max: u64,
    /// The flooder's highest settled figure.
    pub flooder_settled_max: u64,
    /// The flooder's settled figure at the last look while its pods existed.
    pub flooder_settled_end: u64,
    /// The flooder's settled figure at the last look while it was contained.
    pub flooder_settled_contained: Option<u64>,
    /// The flooder's ready endpoints at the last look while it was contained.
    pub flooder_ready_contained: Option<u64>,
    /// The flooder's ready endpoints without their pod at the last look while it was
    /// contained, at once (not only settled).
    pub flooder_without_pod_contained: Option<u64>,
    /// The direct consumer's highest settled figure, every service (when there is one).
    pub direct_settled_max: u64,
}

impl Resolved {
    /// Takes one look: `via` is the consumer behind Floodgate, `flooder` the flooding
    /// service (`namespace/name`), `contained` whether the link contains it now. With
    /// `flooder_pods_exist` false (the remote has been fixed and the flood's pods deleted),
    /// the flooder's endpoints are not counted: a frozen view may name pods that no longer
    /// exist, and no gateway can serve those.
    pub fn look(
        &mut self,
        via: &crate::process::ConsumerStats,
        direct: Option<&crate::process::ConsumerStats>,
        flooder: &str,
        contained: bool,
        flooder_pods_exist: bool,
    ) {
        let settled = &via.ready_without_pod_settled;
        let calm = via.settled_except(flooder);
        self.looks += 1;
        self.calm_settled_max = self.calm_settled_max.max(calm);
        if flooder_pods_exist {
            self.settled_max = self.settled_max.max(settled.total);
            self.settled_end = settled.total;
            self.flooder_settled_max = self.flooder_settled_max.max(settled.of(flooder));
            self.flooder_settled_end = settled.of(flooder);
            if contained {
                self.flooder_settled_contained = Some(settled.of(flooder));
                self.flooder_ready_contained = Some(via.ready_of(flooder));
                self.flooder_without_pod_contained = Some(via.ready_without_pod.of(flooder));
            }
        } else {
            self.settled_max = self.settled_max.max(calm);
            self.settled_end = calm;
        }
        if let Some(d) = direct {
            self.direct_settled_max = self
                .direct_settled_max
                .max(d.ready_without_pod_settled.total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn mk_slice(service: &str, endpoints: &[(&str, Option<bool>)]) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            metadata: ObjectMeta {
                name: Some(format!("{service}-abc")),
                namespace: Some("prod".into()),
                labels: Some([(SERVICE_NAME_LABEL.to_owned(), service.to_owned())].into()),
                ..Default::default()
            },
            endpoints: Some(
                endpoints
                    .iter()
                    .map(|(pod, ready)| Endpoint {
                        addresses: vec!["10.0.0.1".into()],
                        conditions: ready.map(|r| EndpointConditions {
                            ready: Some(r),
                            ..Default::default()
                        }),
                        target_ref: Some(ObjectReference {
                            kind: Some("Pod".into()),
                            name: Some((*pod).into()),
                            namespace: Some("prod".into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ports: None,
        }
    }

    /// Ready (or unset) endpoints without their pod count at once and, past 2 s, as settled;
    /// not-ready ones never; one whose pod arrives is forgotten, and counts from zero if it
    /// loses it again.
    #[test]
    fn ready_endpoints_without_their_pod_settle_after_two_seconds() {
        let slices = [
            mk_slice("web", &[("web-0", Some(true)), ("web-1", None)]),
            mk_slice(
                "flood",
                &[("flood-0", Some(true)), ("flood-1", Some(false))],
            ),
        ];
        let held = |pods: &'static [&'static str]| move |_: &str, p: &str| pods.contains(&p);
        let mut r = Resolver::default();
        let t0 = Instant::now();
        let a = r.look(&slices, held(&["web-0"]), t0);
        assert_eq!(
            a.ready,
            [("prod/flood".into(), 1), ("prod/web".into(), 2)].into()
        );
        assert_eq!(a.without_pod.total, 2);
        assert_eq!(
            (a.without_pod.of("prod/web"), a.without_pod.of("prod/flood")),
            (1, 1)
        );
        assert_eq!(a.settled, Counts::default());

        let b = r.look(&slices, held(&["web-0"]), t0 + Duration::from_secs(2));
        assert_eq!(b.settled.total, 0, "2 s is allowed");
        let c = r.look(
            &slices,
            held(&["web-0", "web-1"]),
            t0 + Duration::from_millis(2500),
        );
        assert_eq!(c.without_pod.total, 1);
        assert_eq!(c.settled.of("prod/flood"), 1);
        assert_eq!(c.settled.of("prod/web"), 0);

        let d = r.look(&slices, held(&["web-0"]), t0 + Duration::from_secs(3));
        assert_eq!(d.without_pod.of("prod/web"), 1);
        assert_eq!(d.settled.of("prod/web"), 0, "web-1 lost its pod just now");
    }
}
