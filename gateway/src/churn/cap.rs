//! The endpoint cap: at most `max` endpoints of a service are published, chosen so that the cap
//! itself causes no churn.
//!
//! Order of preference: ready before not ready, already published before new, then (for the
//! slices) those the service's core/v1 Endpoints lists, then by address. An endpoint that is
//! published stays published while it is no worse than the candidates behind it, so endpoints
//! flapping beyond the cap change nothing downstream.
//!
//! The slices and the Endpoints choose alike: the Endpoints controller truncates a large
//! service's Endpoints to 1,000 addresses of its own choosing, and a slice cap blind to them
//! would publish a different 1,000, so the service's published endpoints, and the pods served
//! behind them, would be up to twice the cap.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::model::{EndpointsObject, Form, HeldSlice, shared_dictionary};

/// What the cap kept of a service.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Capped {
    /// The slices to publish (slices the cap emptied are left out): those it keeps whole
    /// shared with the store, as held there.
    pub slices: Vec<HeldSlice>,
    /// The core/v1 Endpoints to publish, if the service has one.
    pub endpoints: Option<Arc<EndpointsObject>>,
    /// Endpoints published, across slices and Endpoints (each key once).
    pub published: usize,
    /// Upstream endpoints of the service (before the cap).
    pub total: usize,
    /// Endpoints withheld by the cap.
    pub truncated: usize,
}

/// Picks at most `max` of `candidates` (key, ready), preferring ready, then those in `previous`,
/// then those in `also`, then the smallest key. A key listed twice (an endpoint in two slices
/// while the EndpointSlice controller moves it) is one candidate, ready if either listing is,
/// and takes one place.
/// Returns the chosen keys and the number of distinct candidates.
pub fn choose<'a>(
    candidates: impl IntoIterator<Item = (&'a str, bool)>,
    previous: &HashSet<&str>,
    also: &HashSet<&str>,
    max: usize,
) -> (HashSet<&'a str>, usize) {
    let mut ready_by_key: HashMap<&'a str, bool> = HashMap::new();
    for (k, ready) in candidates {
        *ready_by_key.entry(k).or_default() |= ready;
    }
    let distinct = ready_by_key.len();
    let mut all: Vec<(bool, bool, bool, &'a str)> = ready_by_key
        .into_iter()
        .map(|(k, ready)| (!ready, !previous.contains(k), !also.contains(k), k))
        .collect();
    if all.len() > max {
        all.select_nth_unstable(max);
        all.truncate(max);
    }
    (all.into_iter().map(|(.., k)| k).collect(), distinct)
}

/// The keys of the endpoints `slices` and `endpoints` list (what a service published, when
/// they are what [`cap`] kept: the cap sticks to them).
pub fn keys<'a>(
    slices: &'a [HeldSlice],
    endpoints: Option<&'a Arc<EndpointsObject>>,
) -> HashSet<&'a str> {
    slices
        .iter()
        .flat_map(|s| s.endpoints().map(|(key, _)| key))
        .chain(
            endpoints
                .into_iter()
                .flat_map(|ep| ep.subsets())
                .flat_map(|s| s.addresses())
                .map(|(a, _)| a.ip()),
        )
        .collect()
}

/// Caps a service's slices and Endpoints to `max` endpoints each, sticking to `previous` (the
/// [`keys`] of what it published). A slice held deflated is thawed only when it keeps an
/// endpoint.
pub fn cap(
    slices: &[&HeldSlice],
    endpoints: Option<&Arc<EndpointsObject>>,
    previous: &HashSet<&str>,
    max: usize,
) -> Capped {
    let mut out = Capped::default();
    let addrs: Vec<(&str, bool)> = endpoints
        .iter()
        .flat_map(|ep| ep.subsets())
        .flat_map(|s| s.addresses())
        .map(|(a, ready)| (a.ip(), ready))
        .collect();
    let listed: HashSet<&str> = addrs.iter().map(|(ip, _)| *ip).collect();

    // Slices: the same address may appear in two slices (dual-stack uses one per family).
    let (chosen, distinct) = choose(
        slices.iter().flat_map(|s| s.endpoints()),
        previous,
        &listed,
        max,
    );
    out.total = distinct;
    out.truncated = out.total.saturating_sub(chosen.len());
    for slice in slices {
        let kept = slice
            .endpoints()
            .filter(|(k, _)| chosen.contains(k))
            .count();
        if kept == slice.len() {
            out.slices.push((*slice).clone());
        } else if kept > 0 {
            // Deflated as the store holds the others, and shared with the view alike.
            let mut kept = HeldSlice::from(slice.retain(|k| chosen.contains(k)));
            kept.reform(Form::Deflated(Some(shared_dictionary())));
            out.slices.push(kept);
        }
    }
    let in_slices = &chosen;

    // core/v1 Endpoints: the same rule over its addresses, preferring the slices' choice.
    if let Some(ep) = endpoints {
        let (chosen, distinct) = choose(addrs.iter().copied(), previous, in_slices, max);
        if slices.is_empty() {
            // Without slices, the Endpoints object is the service's only count.
            out.total = distinct;
            out.truncated = distinct.saturating_sub(chosen.len());
        }
        if chosen.len() == distinct {
            out.endpoints = Some(ep.clone());
        } else {
            let capped = ep.retain(|ip| chosen.contains(ip));
            out.endpoints = Some(Arc::new(capped));
        }
        out.published = chosen.iter().filter(|k| !in_slices.contains(*k)).count();
    }
    out.published += in_slices.len();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Dictionary, Form, SliceObject};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};

    fn mk_endpoint(ip: &str, ready: bool) -> Endpoint {
        Endpoint {
            addresses: vec![ip.to_owned()],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn mk_slice(name: &str, eps: &[(&str, bool)]) -> Arc<SliceObject> {
        Arc::new(SliceObject::from(EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(eps.iter().map(|(ip, r)| mk_endpoint(ip, *r)).collect()),
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ports: None,
        }))
    }

    /// [`cap`] over `slices` held whole.
    fn cap_whole(
        slices: &[Arc<SliceObject>],
        endpoints: Option<&Arc<EndpointsObject>>,
        previous: &HashSet<&str>,
        max: usize,
    ) -> Capped {
        let held: Vec<HeldSlice> = slices.iter().cloned().map(HeldSlice::Whole).collect();
        cap(&held.iter().collect::<Vec<_>>(), endpoints, previous, max)
    }

    fn ips(c: &Capped) -> Vec<String> {
        let published = keys(&c.slices, c.endpoints.as_ref());
        assert_eq!(published.len(), c.published, "the count of what it kept");
        let mut v: Vec<String> = published.into_iter().map(str::to_owned).collect();
        v.sort();
        v
    }

    #[test]
    fn under_the_cap_everything_passes_unchanged() {
        let slices = [mk_slice("a", &[("10.0.0.1", true), ("10.0.0.2", false)])];
        let c = cap_whole(&slices, None, &HashSet::new(), 5);
        assert!(
            c.slices[0].shares(&HeldSlice::Whole(slices[0].clone())),
            "an uncapped slice is shared, not copied"
        );
        assert_eq!((c.total, c.truncated), (2, 0));
    }

    /// The Endpoints controller truncated the service's Endpoints to addresses of its own
    /// choosing (here the last ones by address): the slices' cap picks the same ones, so the
    /// service publishes `max` endpoints, not up to twice as many.
    #[test]
    fn the_slices_cap_agrees_with_a_truncated_endpoints_object() {
        use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset, Endpoints};
        let all: Vec<String> = (0..20).map(|i| format!("10.0.0.{:02}", i)).collect();
        let eps: Vec<(&str, bool)> = all.iter().map(|ip| (ip.as_str(), true)).collect();
        let slices = [mk_slice("a", &eps)];
        let truncated = Arc::new(EndpointsObject::from(Endpoints {
            subsets: Some(vec![EndpointSubset {
                addresses: Some(
                    all[10..]
                        .iter()
                        .map(|ip| EndpointAddress {
                            ip: ip.clone(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }]),
            ..Default::default()
        }));
        let c = cap_whole(&slices, Some(&truncated), &HashSet::new(), 10);
        assert_eq!(
            ips(&c),
            all[10..],
            "one choice of 10, the Endpoints object's"
        );
        assert!(Arc::ptr_eq(
            c.endpoints.as_ref().expect("endpoints"),
            &truncated
        ));
        assert_eq!((c.total, c.truncated), (20, 10));
    }

    #[test]
    fn ready_endpoints_win_then_address_order() {
        let slices = [mk_slice(
            "a",
            &[("10.0.0.3", true), ("10.0.0.1", false), ("10.0.0.2", true)],
        )];
        let c = cap_whole(&slices, None, &HashSet::new(), 2);
        assert_eq!(ips(&c), ["10.0.0.2", "10.0.0.3"]);
        assert_eq!((c.total, c.truncated), (3, 1));
    }

    #[test]
    fn published_endpoints_stick_while_new_ones_churn() {
        let prev: HashSet<&str> = ["10.0.0.9", "10.0.0.8"].into();
        let slices = [mk_slice(
            "a",
            &[
                ("10.0.0.1", true),
                ("10.0.0.8", true),
                ("10.0.0.9", true),
                ("10.0.0.2", true),
            ],
        )];
        let c = cap_whole(&slices, None, &prev, 2);
        assert_eq!(
            ips(&c),
            ["10.0.0.8", "10.0.0.9"],
            "lower addresses do not displace published ones"
        );
    }

    #[test]
    fn a_slice_the_cap_empties_is_left_out() {
        let slices = [
            mk_slice("a", &[("10.0.0.1", true)]),
            mk_slice("b", &[("10.0.0.5", false)]),
        ];
        let c = cap_whole(&slices, None, &HashSet::new(), 1);
        assert_eq!(c.slices.len(), 1);
        assert_eq!(c.slices[0].metadata().name.as_deref(), Some("a"));
    }

    #[test]
    fn an_address_in_two_slices_takes_one_place() {
        // The EndpointSlice controller moving an endpoint between slices lists it in both for
        // a moment; it must not push another endpoint out of the cap.
        let slices = [
            mk_slice("a", &[("10.0.0.1", true), ("10.0.0.2", true)]),
            mk_slice("b", &[("10.0.0.1", false), ("10.0.0.3", true)]),
        ];
        let c = cap_whole(&slices, None, &HashSet::new(), 3);
        assert_eq!(ips(&c), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        assert_eq!((c.total, c.truncated), (3, 0));
    }

    /// The cap chooses alike from slices held deflated (against their service's dictionary,
    /// as the store deflates them): the same endpoints, the same slices, those it keeps whole
    /// thawed and those it cuts written from the deflated JSON.
    #[test]
    fn deflated_slices_are_capped_as_whole_ones() {
        let slices = [
            mk_slice("a", &[("10.0.0.1", true), ("10.0.0.4", false)]),
            mk_slice("b", &[("10.0.0.2", true), ("10.0.0.3", true)]),
            mk_slice("c", &[("10.0.0.5", true)]),
            mk_slice("d", &[("10.0.0.6", false)]),
        ];
        let prev: HashSet<&str> = ["10.0.0.5"].into();
        let whole = cap_whole(&slices, None, &prev, 3);
        let mut held: Vec<HeldSlice> = slices.iter().cloned().map(HeldSlice::Whole).collect();
        let dictionary = Dictionary::from(slices[0].json().as_bytes());
        (held.iter_mut()).for_each(|s| s.reform(Form::Deflated(Some(&dictionary))));
        assert!(held.iter().all(|s| matches!(s, HeldSlice::Deflated(_))));
        let deflated = cap(&held.iter().collect::<Vec<_>>(), None, &prev, 3);
        assert_eq!(ips(&deflated), ["10.0.0.1", "10.0.0.2", "10.0.0.5"]);
        assert_eq!(deflated, whole, "the same choice, the same slices");
    }
}
