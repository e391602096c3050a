//! A replica that starts while a link is quarantined serves the last good view, taken from a
//! peer. In cluster mode the quarantine lives in the Link's status, not on a disk, so a new
//! replica (a rollout, a reschedule) has no saved view of its own; its remote is the one that
//! floods. Every replica's facade is a Kubernetes API for its links, so the new one lists a
//! peer's view as any consumer would: the replicas reach each other through a headless Service
//! (`--peers`, every replica's address), with the link's token and the CA they share.
//!
//! A peer that answers with a view serves the frozen view of the quarantine (the holder's, or
//! one that followed it); the new replica starts with it, quarantined, and its upstream stays
//! stopped until the release. When no peer answers (the only replica, or all restarting), the
//! link starts from its remote as before: capped, and quarantined once the record is followed.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use floodgate_link_crd::QuarantineStatus;
use serde_json::Value;
use tokio::time::Instant;

use crate::churn::flood::Trigger;
use crate::churn::restore::Saved;
use crate::model::KINDS;
use crate::model::Object;

/// How long a new replica looks for a peer's view before it starts from its remote.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(4);

/// Where the other replicas are and how to trust them.
#[derive(Clone, Debug)]
pub struct Peers {
    /// `host:port` resolving to every replica's facade (a headless Service).
    pub address: String,
    /// The name the shared certificate is checked against (the replicas are reached by IP).
    pub server_name: String,
    /// The CA every replica's certificate comes from.
    pub ca_pem: String,
}

/// The last good view of link `link` from the first peer that serves one, as a quarantine to
/// restore (`recorded` is the holder's record of it). `None` when no peer answers in
/// [`PEER_TIMEOUT`].
pub async fn last_good_view(
    peers: &Peers,
    link: &str,
    token: &str,
    recorded: &QuarantineStatus,
) -> Option<Saved> {
    let started = Instant::now();
    let found = tokio::time::timeout(PEER_TIMEOUT, async {
        let addrs: Vec<SocketAddr> = match tokio::net::lookup_host(&peers.address).await {
            Ok(a) => a.collect(),
            Err(e) => {
                tracing::info!(link, peers = %peers.address, error = %e, "no peers to take the last good view from");
                return None;
            }
        };
        for addr in addrs {
            match view_of(peers, addr, link, token).await {
                Ok(objects) if !objects.is_empty() => return Some((addr, objects)),
                Ok(_) => tracing::debug!(link, %addr, "a peer serves an empty view"),
                Err(e) => tracing::debug!(link, %addr, error = format!("{e:#}"), "a peer has no view to give"),
            }
        }
        None
    })
    .await
    .ok()
    .flatten();
    let Some((addr, objects)) = found else {
        tracing::warn!(
            link,
            "no peer served the link's view: starting from the remote (capped) under the recorded quarantine"
        );
        return None;
    };
    tracing::warn!(link, peer = %addr, objects = objects.len(), elapsed = ?started.elapsed(), "serving the last good view a peer serves, quarantined as recorded");
    let reason = recorded
        .reason
        .parse()
        .unwrap_or(crate::churn::flood::Reason::Manual);
    let message = format!("recorded in status: {}", recorded.message);
    let now = Instant::now();
    let age = jiff::Timestamp::now()
        .duration_since(recorded.since.0)
        .try_into()
        .unwrap_or(Duration::ZERO);
    Some(Saved {
        trigger: Trigger::recorded(reason, message, recorded.figures.clone()),
        since: now.checked_sub(age).unwrap_or(now),
        before_first_sync: false,
        cooldown: None,
        objects,
    })
}

/// Every object peer `addr` serves for `link`, through its facade.
async fn view_of(
    peers: &Peers,
    addr: SocketAddr,
    link: &str,
    token: &str,
) -> anyhow::Result<Vec<Object>> {
    let server = format!("https://{addr}/links/{link}");
    let yaml = crate::credentials::consumer_kubeconfig(&server, token, Some(&peers.ca_pem), link);
    let mut kc = kube::config::Kubeconfig::from_yaml(&yaml)?;
    for c in &mut kc.clusters {
        if let Some(cluster) = &mut c.cluster {
            cluster.tls_server_name = Some(peers.server_name.clone());
        }
    }
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await?;
    let client = kube::Client::try_from(cfg)?;
    let mut objects = Vec::new();
    for def in &KINDS {
        let path = if def.group.is_empty() {
            format!("/api/{}/{}", def.version, def.plural)
        } else {
            format!("/apis/{}/{}/{}", def.group, def.version, def.plural)
        };
        let req = axum::http::Request::get(&path).body(Vec::new())?;
        let text = match client.request_text(req).await {
            Ok(t) => t,
            // A kind the remote may lack (a link whose remote serves no Linkerd Servers
            // serves none either), or that a replica of an earlier release did not serve.
            Err(kube::Error::Api(s)) if s.code == 404 && def.optional => {
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("listing {path}")),
        };
        let list: Value = serde_json::from_str(&text).with_context(|| path.clone())?;
        for mut item in list["items"].as_array().cloned().unwrap_or_default() {
            item["kind"] = def.kind.name().into();
            item["apiVersion"] = def.kind.api_version().into();
            objects.push(Object::from_json(item).with_context(|| format!("an item of {path}"))?);
        }
    }
    Ok(objects)
}
