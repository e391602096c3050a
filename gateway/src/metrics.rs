//! Prometheus metrics, per link (label `link`), computed at scrape time from the figures the
//! links already keep: each link's [`crate::link::LinkState`] (engine and upstream counters)
//! and its facade's [`crate::kubeapi::ApiCounters`] and open watches. Nothing is counted twice
//! and the engine carries no metrics code: a scrape reads a few atomics and watch channels.
//!
//! What each metric means, with its labels: `docs/metrics.md` (the one list; the alerts and
//! the dashboard use them, `manifests/monitoring/`).

use std::sync::Arc;

mod link;
use link::LinkCollector;

use floodgate_link_crd::Phase;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::link::Pacer;
use crate::registry::Registry as Links;

/// Every phase, in the order `floodgate_link_phase` lists them.
const PHASES: [Phase; 4] = [
    Phase::Healthy,
    Phase::Throttled,
    Phase::Quarantined,
    Phase::Degraded,
];

/// Every reason a service's containment changes for, each exported from the start (0 until
/// it happens), so rates and alerts work before the first flood.
pub const CONTAINMENT_REASONS: [&str; 6] = [
    "EndpointsPerService",
    "ServiceEventRate",
    "CooldownOver",
    "RecheckPassed",
    "Released",
    "ServiceGone",
];

/// The registry the admin API encodes on `GET /metrics`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
}

/// `floodgate_build_info`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct BuildInfo {
    version: String,
    mode: String,
}

impl Metrics {
    /// Metrics of the links served, whichever they are at scrape time.
    pub fn new(links: Arc<Links>) -> Self {
        Self::of_mode(links, "", Pacer::default())
    }

    /// [`Metrics::new`] for a process running in `mode` (`run` or `controller`), which
    /// `floodgate_build_info` says with the version.
    pub fn of_mode(links: Arc<Links>, mode: &str, pacer: Pacer) -> Self {
        let mut registry = Registry::with_prefix("floodgate");
        let info = prometheus_client::metrics::family::Family::<
            BuildInfo,
            prometheus_client::metrics::gauge::Gauge,
        >::default();
        info.get_or_create(&BuildInfo {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            mode: mode.to_owned(),
        })
        .set(1);
        registry.register(
            "build_info",
            "The running Floodgate: its version and mode (always 1).",
            info,
        );
        registry.register_collector(Box::new(LinkCollector { links }));
        registry.register_collector(Box::new(PacerCollector(pacer)));
        Self { registry }
    }

    /// The exposition text (OpenMetrics, which Prometheus scrapes).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// `floodgate_link_dials_paced_total`: read from the pacer at scrape time.
#[derive(Debug)]
struct PacerCollector(Pacer);

impl Collector for PacerCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let help =
            "Attempts to reach a remote that waited for their turn (--link-starts-per-second).";
        let metric = enc.encode_descriptor("link_dials_paced", help, None, MetricType::Counter)?;
        ConstCounter::new(self.0.waited()).encode(metric)
    }
}

fn counter(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl Iterator<Item = (Vec<(&'static str, String)>, u64)>,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl Iterator<Item = (Vec<(&'static str, String)>, u64)>,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        let v = i64::try_from(v).unwrap_or(i64::MAX);
        ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}
