//! The per-link metrics: each link's figures read once a scrape ([`Sample`]), encoded by
//! area (what was published, what the link holds and its phase, the remote as it reads it, the
//! signals the alerts use).

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use super::{CONTAINMENT_REASONS, PHASES, counter, gauge};
use crate::link::LinkState;
use crate::registry::Registry as Links;

#[derive(Debug)]
pub(super) struct LinkCollector {
    pub(super) links: Arc<Links>,
}

/// One link's figures, read once per scrape.
struct Sample {
    name: String,
    state: LinkState,
    watchers: u64,
    watchers_limit: u64,
    watchers_by_resource: Vec<(&'static str, u64)>,
    discarded: u64,
    view_bytes: u64,
    without_pod: u64,
    requests: std::collections::BTreeMap<crate::kubeapi::RequestKey, u64>,
    /// In cluster mode: whether this replica holds the link's Lease, and whether it follows
    /// the holder.
    lease: Option<(bool, bool)>,
}

impl LinkCollector {
    fn samples(&self) -> Vec<Sample> {
        self.links
            .all()
            .iter()
            .map(|l| Sample {
                name: l.name().to_owned(),
                state: l.handle.state.borrow().clone(),
                watchers: l.api.open_watches() as u64,
                watchers_limit: l.api.max_watches() as u64,
                watchers_by_resource: l.api.counters.open_watches.by_resource(),
                discarded: l.api.counters.snapshot().events_discarded,
                view_bytes: l.handle.view.json_bytes() as u64,
                without_pod: l.handle.view.ready_endpoints_without_pod(),
                requests: l.api.counters.requests(),
                lease: (l.relay.as_ref()).map(|r| (r.holds(), r.follows().is_some())),
            })
            .collect()
    }
}

fn link(s: &Sample) -> Vec<(&'static str, String)> {
    vec![("link", s.name.clone())]
}

impl Collector for LinkCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let samples = self.samples();
        publishing(&mut enc, &samples)?;
        state(&mut enc, &samples)?;
        phase(&mut enc, &samples)?;
        upstream(&mut enc, &samples)?;
        signals(&mut enc, &samples)
    }
}

/// One row a link, of `f` of its sample.
fn per_link(
    samples: &[Sample],
    f: fn(&Sample) -> u64,
) -> impl Iterator<Item = (Vec<(&'static str, String)>, u64)> + '_ {
    samples.iter().map(move |s| (link(s), f(s)))
}

/// What the engine published and held back.
fn publishing(enc: &mut DescriptorEncoder<'_>, samples: &[Sample]) -> std::fmt::Result {
    counter(
        enc,
        "upstream_events",
        "Upstream changes received, by whether they concerned a selected service.",
        samples.iter().flat_map(|s| {
            let c = s.state.counters;
            [
                ("relevant", c.relevant_events),
                ("irrelevant", c.irrelevant_events),
            ]
            .into_iter()
            .map(move |(r, v)| {
                (
                    vec![("link", s.name.clone()), ("relevance", r.to_owned())],
                    v,
                )
            })
        }),
    )?;
    counter(
        enc,
        "upstream_resource_events",
        "Upstream objects applied or deleted, by resource (initial lists included).",
        samples.iter().flat_map(|s| {
            s.state.upstream.events_by_kind.iter().map(move |(k, v)| {
                (
                    vec![("link", s.name.clone()), ("resource", (*k).to_owned())],
                    *v,
                )
            })
        }),
    )?;
    counter(
        enc,
        "downstream_updates",
        "Publications to consumers (one service's objects, diffed).",
        per_link(samples, |s| s.state.counters.downstream_updates),
    )?;
    counter(
        enc,
        "coalesced",
        "Upstream changes absorbed into a publication already pending.",
        per_link(samples, |s| s.state.counters.coalesced),
    )?;
    counter(
        enc,
        "throttled",
        "Times a publication had to wait for a rate-limit token.",
        per_link(samples, |s| s.state.counters.throttled),
    )?;
    gauge(
        enc,
        "endpoints_published",
        "Endpoints published to consumers, across services.",
        per_link(samples, |s| s.state.counters.endpoints_published),
    )?;
    gauge(
        enc,
        "endpoints_truncated",
        "Endpoints withheld by caps.maxEndpointsPerService.",
        per_link(samples, |s| s.state.counters.endpoints_truncated),
    )?;
    gauge(
        enc,
        "services",
        "Selected services published.",
        per_link(samples, |s| s.state.counters.services),
    )?;
    gauge(
        enc,
        "services_withheld",
        "Selected services withheld by caps.maxServices.",
        per_link(samples, |s| s.state.counters.services_withheld),
    )?;
    Ok(())
}

/// What the link holds.
fn state(enc: &mut DescriptorEncoder<'_>, samples: &[Sample]) -> std::fmt::Result {
    gauge(
        enc,
        "upstream_watchers",
        "Resource watchers running against the link's remote (0 on a replica that follows the Lease holder).",
        per_link(samples, |s| s.state.upstream.watchers),
    )?;
    gauge(
        enc,
        "upstream_objects",
        "Upstream objects the link holds.",
        per_link(samples, |s| s.state.engine.objects_held as u64),
    )?;
    gauge(
        enc,
        "upstream_objects_by_resource",
        "Upstream objects the link holds, by resource.",
        samples.iter().flat_map(|s| {
            s.state.engine.objects_by_kind.iter().map(move |(k, v)| {
                (
                    vec![("link", s.name.clone()), ("resource", (*k).to_owned())],
                    *v as u64,
                )
            })
        }),
    )?;
    gauge(
        enc,
        "upstream_slices_deflated",
        "EndpointSlices the link holds for the cap to choose from, deflated against their service's own dictionary: those of services with more endpoints upstream than caps.maxEndpointsPerService (the others are deflated against one dictionary shared by all).",
        per_link(samples, |s| s.state.engine.slices_deflated as u64),
    )?;
    gauge(
        enc,
        "view_bytes",
        "JSON bytes of the objects the link serves (each held once).",
        per_link(samples, |s| s.view_bytes),
    )?;
    gauge(
        enc,
        "upstream_events_last_second",
        "Relevant upstream events in the last complete second.",
        per_link(samples, |s| s.state.engine.events_last_second),
    )?;
    Ok(())
}

/// Its phase, quarantine and containment.
fn phase(enc: &mut DescriptorEncoder<'_>, samples: &[Sample]) -> std::fmt::Result {
    gauge(
        enc,
        "link_synced",
        "1 once the link has published its first complete sync.",
        per_link(samples, |s| u64::from(s.state.synced)),
    )?;
    gauge(
        enc,
        "link_quarantined",
        "1 while the link is quarantined (re-checks included).",
        per_link(samples, |s| u64::from(s.state.quarantine.since.is_some())),
    )?;
    gauge(
        enc,
        "link_phase",
        "1 for the link's current phase, 0 for the others.",
        samples.iter().flat_map(|s| {
            PHASES.iter().map(move |p| {
                (
                    vec![("link", s.name.clone()), ("phase", p.as_str().to_owned())],
                    u64::from(s.state.phase == *p),
                )
            })
        }),
    )?;
    counter(
        enc,
        "quarantine_transitions",
        "Quarantine state changes (quarantined, re-checking, released).",
        per_link(samples, |s| s.state.quarantine.transitions),
    )?;
    gauge(
        enc,
        "services_contained",
        "Services contained now: served at their last published state until released.",
        per_link(samples, |s| s.state.containment.contained.len() as u64),
    )?;
    counter(
        enc,
        "containment_transitions",
        "Service containment changes, by reason (contained, re-checking, released).",
        samples.iter().flat_map(|s| {
            CONTAINMENT_REASONS.iter().map(move |r| {
                let n = s.state.containment.transitions.get(r).copied();
                (
                    vec![("link", s.name.clone()), ("reason", (*r).to_owned())],
                    n.unwrap_or(0),
                )
            })
        }),
    )?;
    Ok(())
}

/// The remote as the link reads it, and what a follower took from its holder.
fn upstream(enc: &mut DescriptorEncoder<'_>, samples: &[Sample]) -> std::fmt::Result {
    gauge(
        enc,
        "watchers",
        "Watches consumers hold open on the link's facade.",
        per_link(samples, |s| s.watchers),
    )?;
    counter(
        enc,
        "upstream_errors",
        "Upstream watch errors, each followed by a reconnect with backoff.",
        per_link(samples, |s| s.state.upstream.errors),
    )?;
    counter(
        enc,
        "upstream_relists",
        "Upstream relists (initial lists included).",
        per_link(samples, |s| s.state.upstream.relists),
    )?;
    counter(
        enc,
        "upstream_decode_errors",
        "Upstream watch errors caused by JSON the client could not decode.",
        per_link(samples, |s| s.state.upstream.decode_errors),
    )?;
    counter(
        enc,
        "follower_snapshots",
        "On a replica that follows the Lease holder: snapshots of the holder's view taken.",
        per_link(samples, |s| s.state.upstream.followed_snapshots),
    )?;
    counter(
        enc,
        "follower_changes",
        "On a replica that follows the Lease holder: the holder's changes taken one by one.",
        per_link(samples, |s| s.state.upstream.followed_changes),
    )?;
    counter(
        enc,
        "upstream_forced_relists",
        "Upstream relists Floodgate forced: a resume refused with 410 or 504, or a watch frame lost.",
        per_link(samples, |s| s.state.upstream.forced_relists),
    )?;
    counter(
        enc,
        "upstream_refusals",
        "Upstream requests and watches the remote refused our credentials for (401, 403).",
        per_link(samples, |s| s.state.upstream.refusals),
    )?;
    counter(
        enc,
        "upstream_oversized",
        "Upstream objects refused for being over the size limit.",
        per_link(samples, |s| s.state.upstream.oversized),
    )?;
    counter(
        enc,
        "upstream_pods_skipped",
        "Upstream pod events not decoded because no published endpoint names the pod.",
        per_link(samples, |s| s.state.upstream.pods_skipped),
    )?;
    counter(
        enc,
        "discarded_writes",
        "Writes consumers made that were accepted and discarded (Events).",
        per_link(samples, |s| s.discarded),
    )?;
    Ok(())
}

/// What operators alert on beyond the counters: publication delay, the remote's reachability,
/// the facade's load and limit, and whether the view is whole.
fn signals(enc: &mut DescriptorEncoder<'_>, samples: &[Sample]) -> std::fmt::Result {
    let per_link = |f: fn(&Sample) -> u64| samples.iter().map(move |s| (link(s), f(s)));
    {
        let mut m = enc.encode_descriptor(
            "publication_delay",
            "How long published changes waited, from their arrival from the remote to their publication (changes dropped unpublished, as a quarantine drops them, are not counted).",
            Some(&prometheus_client::registry::Unit::Seconds),
            MetricType::Histogram,
        )?;
        for s in samples {
            let d = &s.state.engine.publication_delays;
            m.encode_family(&link(s))?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    d.sum,
                    d.count,
                    &d.buckets(),
                    None,
                )?;
        }
    }
    gauge(
        enc,
        "upstream_reachable",
        "1 while the remote answers (connected, no watcher failing).",
        per_link(|s| u64::from(s.state.upstream.reachable)),
    )?;
    counter(
        enc,
        "upstream_outages",
        "Outages of the remote: each begins with a watcher's failure and ends when it answers again.",
        per_link(|s| s.state.upstream.outages),
    )?;
    facade(enc, samples)
}

/// The facade: its watches, its limit and requests, the Lease, and whether the view is whole.
fn facade(enc: &mut DescriptorEncoder<'_>, samples: &[Sample]) -> std::fmt::Result {
    gauge(
        enc,
        "watchers_by_resource",
        "Watches consumers hold open on the link's facade, by resource.",
        samples.iter().flat_map(|s| {
            s.watchers_by_resource.iter().map(move |(r, n)| {
                (
                    vec![("link", s.name.clone()), ("resource", (*r).to_owned())],
                    *n,
                )
            })
        }),
    )?;
    // Cluster mode only: which replica holds each link, and which follow the holder.
    let leased = || samples.iter().filter_map(|s| s.lease.map(|l| (link(s), l)));
    gauge(
        enc,
        "link_lease_held",
        "1 when this replica holds the link's Lease: it reads the remote and decides (cluster mode).",
        leased().map(|(l, (held, _))| (l, u64::from(held))),
    )?;
    gauge(
        enc,
        "link_follows_holder",
        "1 when this replica reads the link from the Lease holder's facade, not the remote (cluster mode).",
        leased().map(|(l, (_, follows))| (l, u64::from(follows))),
    )?;
    gauge(
        enc,
        "watchers_limit",
        "Watches the link's facade serves at most at once (more are refused with 429).",
        per_link(samples, |s| s.watchers_limit),
    )?;
    gauge(
        enc,
        "ready_endpoints_without_pod",
        "Ready endpoints served whose pod the link does not serve (0 when the view is whole).",
        per_link(samples, |s| s.without_pod),
    )?;
    counter(
        enc,
        "facade_requests",
        "Authenticated requests to the link's facade, by verb, resource, response code and encoding served.",
        samples.iter().flat_map(|s| {
            s.requests
                .iter()
                .map(move |((verb, resource, code, encoding), n)| {
                    (
                        vec![
                            ("link", s.name.clone()),
                            ("verb", (*verb).to_owned()),
                            ("resource", (*resource).to_owned()),
                            ("code", code.to_string()),
                            ("encoding", (*encoding).to_owned()),
                        ],
                        *n,
                    )
                })
        }),
    )
}
