//! `floodgate status`: every link in one table, from a cluster's Link resources (what their
//! Lease holders wrote in status, as `floodgate release` reads them) or from a standalone
//! Floodgate's admin API (`GET /links`). `--wait` polls until every link is well (phase
//! `Healthy`, no service contained) or the timeout passes, and the exit code says which, so it
//! can gate a rollout.

use std::time::Duration;

use floodgate_link_crd::{KubeDuration, Link, LinkStatus};
use kube::{Api, ResourceExt as _};
use serde::Serialize;
use serde_json::Value;

/// `floodgate status`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// A standalone Floodgate's admin API (`http://127.0.0.1:9990`). Without it, the Links of
    /// the kubeconfig's cluster, in `--namespace`.
    #[arg(long)]
    pub admin: Option<String>,
    /// The namespace of the Links (Floodgate's own).
    #[arg(
        long,
        short = 'n',
        env = "FLOODGATE_NAMESPACE",
        default_value = "floodgate"
    )]
    pub namespace: String,
    /// Wait until every link is well (`Healthy`, no service contained); exit 1 if one is not
    /// when `--timeout` passes.
    #[arg(long)]
    pub wait: bool,
    /// How long `--wait` waits, e.g. 90s or 5m.
    #[arg(long, default_value = "5m")]
    pub timeout: KubeDuration,
    /// `table` for people, `json` for scripts (one object per link).
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// How `floodgate status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns.
    Table,
    /// A JSON array.
    Json,
}

/// One link as `floodgate status` shows it. Fields the source does not know are `None`
/// (a Link's status has no watchers; the admin API has them).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkRow {
    /// The link's name.
    pub name: String,
    /// `Healthy`, `Throttled`, `Quarantined`, `Degraded`, or `Unknown` before any status.
    pub phase: String,
    /// Whether the remote answers: `reachable`, `unreachable since <time>`, or `unknown`.
    pub remote: String,
    /// Services served.
    pub services: Option<i64>,
    /// Endpoints published.
    pub endpoints: Option<i64>,
    /// Endpoints held back by the cap.
    pub truncated: Option<i64>,
    /// Services contained now.
    pub contained: i64,
    /// The first contained services, `namespace/name`.
    pub contained_first: Vec<String>,
    /// Objects the link holds (admin API only).
    pub objects: Option<i64>,
    /// Watchers of its facade (admin API only).
    pub watchers: Option<i64>,
    /// The replica holding its Lease (cluster only).
    pub holder: Option<String>,
    /// The quarantine's reason and since when, if quarantined.
    pub quarantine: Option<String>,
    /// Why it is not ready, or the link's message.
    pub message: String,
}

impl LinkRow {
    /// Healthy and containing nothing: what `--wait` waits for.
    pub fn well(&self) -> bool {
        self.phase == "Healthy" && self.contained == 0
    }

    /// The row of a Link as its status records it.
    pub fn of_link(link: &Link) -> Self {
        let name = link.name_any();
        let Some(s) = &link.status else {
            return Self {
                name,
                phase: "Unknown".into(),
                message: "no status yet: is a floodgate controller running?".into(),
                ..Self::default()
            };
        };
        Self::of_status(name, s)
    }

    fn of_status(name: String, s: &LinkStatus) -> Self {
        let counters = s.counters.unwrap_or_default();
        let contained = s.contained_services.clone().unwrap_or_default();
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready");
        let phase = s.phase.map_or("Unknown".into(), |p| p.as_str().to_owned());
        Self {
            name,
            remote: remote(&phase, s.conditions.iter().map(|c| c.message.as_str())),
            phase,
            services: s.counters.as_ref().map(|_| counters.services),
            endpoints: s.counters.as_ref().map(|_| counters.endpoints_published),
            truncated: s.counters.as_ref().map(|_| counters.endpoints_truncated),
            contained: contained.count,
            contained_first: contained.first.into_iter().map(|c| c.service).collect(),
            objects: None,
            watchers: None,
            holder: s.lease_holder.clone(),
            quarantine: s
                .quarantine
                .as_ref()
                .map(|q| with_message(format!("{} since {}", q.reason, q.since.0), &q.message)),
            message: ready
                .filter(|c| c.status != "True")
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_default(),
        }
    }

    /// The row of one link of the admin API's `GET /links`.
    pub fn of_admin(v: &Value) -> Self {
        let n = |p: &str| v.pointer(p).and_then(Value::as_i64);
        let s = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_owned);
        let contained: Vec<String> = (v["contained"].as_array().into_iter().flatten())
            .filter_map(|c| c["service"].as_str().map(str::to_owned))
            .collect();
        let phase = s("/phase").unwrap_or_else(|| "Unknown".into());
        let message = s("/message").unwrap_or_default();
        Self {
            name: s("/name").unwrap_or_default(),
            remote: remote(&phase, std::iter::once(message.as_str())),
            phase,
            services: n("/counters/services"),
            endpoints: n("/counters/endpointsPublished"),
            truncated: n("/counters/endpointsTruncated"),
            contained: i64::try_from(contained.len()).unwrap_or(i64::MAX),
            contained_first: contained,
            objects: n("/counters/objectsHeld"),
            watchers: n("/counters/watchers"),
            holder: s("/leaseHolder"),
            quarantine: v["quarantine"].is_object().then(|| {
                let reason = s("/quarantine/reason").unwrap_or_else(|| "Manual".into());
                let head = match s("/quarantine/since") {
                    Some(since) => format!("{reason} since {since}"),
                    None => reason,
                };
                with_message(head, &s("/quarantine/message").unwrap_or_default())
            }),
            message,
        }
    }
}

/// Whether the remote answers, from the link's phase and what it says: a link says "the
/// remote is unreachable since <time>: <why>" while its remote does not answer.
fn remote<'a>(phase: &str, said: impl Iterator<Item = &'a str>) -> String {
    use crate::upstream::health::UNREACHABLE_SINCE as UNREACHABLE;
    for text in said {
        if let Some(at) = text.find(UNREACHABLE) {
            let rest = &text[at + UNREACHABLE.len()..];
            // The time is the first word; a colon ends the sentence before the reason.
            let since = rest.split(' ').next().unwrap_or(rest);
            return format!("{UNREACHABLE}{}", since.trim_end_matches(':'));
        }
    }
    match phase {
        "Unknown" => "unknown".into(),
        // A quarantined link does not read its remote until it is released.
        "Quarantined" => "-".into(),
        _ => "reachable".into(),
    }
}

/// `head: message`, or `head` alone when there is no message.
fn with_message(head: String, message: &str) -> String {
    if message.is_empty() {
        head
    } else {
        format!("{head}: {message}")
    }
}

/// Where the links are read from.
#[derive(Clone)]
#[allow(missing_debug_implementations)] // kube's Client has no Debug
pub enum Source {
    /// The Links of a namespace of a cluster.
    Cluster(Api<Link>),
    /// A standalone Floodgate's admin API, through a client whose base URL is its address.
    Admin(kube::Client),
}

impl Source {
    /// The source `args` name: the admin API, or the kubeconfig's cluster.
    pub async fn of(args: &StatusArgs) -> anyhow::Result<Self> {
        match &args.admin {
            Some(url) => {
                let uri = url
                    .parse()
                    .map_err(|e| anyhow::anyhow!("--admin {url:?} is not a URL: {e}"))?;
                Ok(Self::Admin(kube::Client::try_from(kube::Config::new(uri))?))
            }
            None => {
                let client = kube::Client::try_default().await?;
                Ok(Self::Cluster(Api::namespaced(client, &args.namespace)))
            }
        }
    }

    /// Every link, by name.
    pub async fn rows(&self) -> anyhow::Result<Vec<LinkRow>> {
        let mut rows: Vec<LinkRow> = match self {
            Self::Cluster(api) => (api.list(&Default::default()).await?.items.iter())
                .map(LinkRow::of_link)
                .collect(),
            Self::Admin(client) => {
                let req = axum::http::Request::get("/links").body(Vec::new())?;
                let body: Value = serde_json::from_str(&client.request_text(req).await?)?;
                (body["links"].as_array().into_iter().flatten())
                    .map(LinkRow::of_admin)
                    .collect()
            }
        };
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(rows)
    }
}

/// What `floodgate status` prints and whether it ends well.
#[derive(Debug)]
pub struct Report {
    /// The table or the JSON.
    pub text: String,
    /// False when `--wait` timed out with a link not well.
    pub ok: bool,
}

/// `floodgate status` on `source`: the links now, or once all are well (`--wait`).
pub async fn status(source: &Source, args: &StatusArgs) -> anyhow::Result<Report> {
    let deadline = tokio::time::Instant::now() + Duration::from(args.timeout);
    loop {
        let rows = source.rows().await?;
        let well = rows.iter().all(LinkRow::well);
        let timed_out = tokio::time::Instant::now() >= deadline;
        if !args.wait || well || timed_out {
            let mut text = match args.output {
                Output::Table => table(&rows),
                Output::Json => serde_json::to_string_pretty(&rows)? + "\n",
            };
            if args.wait && !well {
                let ill: Vec<String> = (rows.iter().filter(|r| !r.well()))
                    .map(|r| format!("{} {}", r.name, r.phase))
                    .collect();
                text.push_str(&format!(
                    "after {}: {} of {} links not well ({})\n",
                    args.timeout,
                    ill.len(),
                    rows.len(),
                    ill.join(", ")
                ));
            }
            return Ok(Report {
                text,
                ok: !args.wait || well,
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The rows as aligned columns; `-` where the source does not know.
pub fn table(rows: &[LinkRow]) -> String {
    if rows.is_empty() {
        return "no links\n".into();
    }
    let num = |n: Option<i64>| n.map_or("-".into(), |n| n.to_string());
    let head = [
        "NAME",
        "PHASE",
        "REMOTE",
        "SERVICES",
        "ENDPOINTS",
        "TRUNCATED",
        "CONTAINED",
        "OBJECTS",
        "WATCHERS",
        "HOLDER",
        "QUARANTINE",
        "MESSAGE",
    ];
    let mut cells: Vec<Vec<String>> = vec![head.map(str::to_owned).to_vec()];
    for r in rows {
        let contained = match r.contained {
            0 => "0".to_owned(),
            n => format!("{n} ({})", r.contained_first.join(" ")),
        };
        cells.push(vec![
            r.name.clone(),
            r.phase.clone(),
            r.remote.clone(),
            num(r.services),
            num(r.endpoints),
            num(r.truncated),
            contained,
            num(r.objects),
            num(r.watchers),
            r.holder.clone().unwrap_or_else(|| "-".into()),
            r.quarantine.clone().unwrap_or_else(|| "-".into()),
            r.message.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|i| {
            cells
                .iter()
                .map(|row| row[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admin_link_becomes_a_row() {
        let v = serde_json::json!({
            "name": "east", "phase": "Quarantined", "message": "over 5000 endpoints",
            "quarantine": {"reason": "ObjectCount", "since": "2026-12-05T01:00:00Z",
                           "message": "over 5000 endpoints"},
            "counters": {"services": 3, "endpointsPublished": 9, "endpointsTruncated": 2,
                         "objectsHeld": 40, "watchers": 5},
            "contained": [{"service": "prod/flood"}],
            "leaseHolder": "floodgate-0",
        });
        let r = LinkRow::of_admin(&v);
        assert_eq!(
            r,
            LinkRow {
                name: "east".into(),
                phase: "Quarantined".into(),
                remote: "-".into(),
                services: Some(3),
                endpoints: Some(9),
                truncated: Some(2),
                contained: 1,
                contained_first: vec!["prod/flood".into()],
                objects: Some(40),
                watchers: Some(5),
                holder: Some("floodgate-0".into()),
                quarantine: Some(
                    "ObjectCount since 2026-12-05T01:00:00Z: over 5000 endpoints".into()
                ),
                message: "over 5000 endpoints".into(),
            }
        );
        assert!(!r.well());
        let text = table(&[r]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAME   PHASE"), "{text}");
        assert!(lines[1].contains("1 (prod/flood)"), "{text}");
    }

    #[test]
    fn an_unreachable_remote_is_said_with_since_when() {
        let v = serde_json::json!({
            "name": "east", "phase": "Degraded",
            "message": "the remote is unreachable since 2026-12-05T01:00:00Z: connection refused",
        });
        assert_eq!(
            LinkRow::of_admin(&v).remote,
            "unreachable since 2026-12-05T01:00:00Z"
        );
        let healthy = serde_json::json!({"name": "east", "phase": "Healthy"});
        assert_eq!(LinkRow::of_admin(&healthy).remote, "reachable");
    }

    #[test]
    fn a_link_without_status_is_unknown_and_not_well() {
        let link = Link::new(
            "east",
            floodgate_link_crd::LinkSpec::with_remote(Default::default()),
        );
        let r = LinkRow::of_link(&link);
        assert_eq!(r.phase, "Unknown");
        assert!(!r.well());
        assert_eq!(table(&[]), "no links\n");
    }
}
