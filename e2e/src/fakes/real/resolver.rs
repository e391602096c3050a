//! The client-go resolver consumer (`e2e/realkube/cmd/resolver`) as a child process: shared
//! informers as Linkerd's destination has them, in one of four modes (protobuf or JSON, streaming
//! lists on or off). It prints a report line a second; a reader task keeps the latest line and,
//! per service, the most ready endpoints without their pod any line showed once synced. A line
//! also says when each stamped slice change (a calm roll of the crash-loop driver) arrived.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use serde::Deserialize;
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};

/// How the resolver's informers talk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolverMode {
    /// Protobuf (client-go's typed clients' choice) or JSON.
    pub protobuf: bool,
    /// Streaming lists (client-go's `WatchListClient`) or LIST then WATCH.
    pub streaming: bool,
}

impl ResolverMode {
    /// The four modes.
    pub const ALL: [Self; 4] = [
        Self::new(true, true),
        Self::new(true, false),
        Self::new(false, true),
        Self::new(false, false),
    ];

    /// A mode.
    pub const fn new(protobuf: bool, streaming: bool) -> Self {
        Self {
            protobuf,
            streaming,
        }
    }
}

impl std::fmt::Display for ResolverMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ct = if self.protobuf { "protobuf" } else { "json" };
        let list = if self.streaming {
            "streaming"
        } else {
            "list+watch"
        };
        write!(f, "{ct}/{list}")
    }
}

/// One report line (see the resolver's `report` type).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolverReport {
    /// Seconds since it started.
    pub t: f64,
    /// Whether every informer has synced.
    pub synced: bool,
    /// Milliseconds from start to sync.
    pub sync_ms: u64,
    /// Handler calls by kind.
    pub events: BTreeMap<String, u64>,
    /// Errors its reflectors' watches reported.
    pub watch_errors: u64,
    /// Objects in each cache.
    pub cached: BTreeMap<String, u64>,
    /// Ready endpoints in its slice cache.
    pub ready_endpoints: u64,
    /// Ready endpoints whose pod its pod cache lacks.
    pub ready_without_pod: u64,
    /// That figure by service (`namespace/name`).
    pub ready_without_pod_by_service: BTreeMap<String, u64>,
    /// Ready endpoints by service.
    pub ready_by_service: BTreeMap<String, u64>,
    /// Each stamped slice change it saw (see the crash-loop driver's calm rolls): the stamp and
    /// when its handler first saw it, wall-clock ms.
    #[serde(default)]
    pub stamped: Vec<(u64, u64)>,
    /// Addresses lost at a slice event (a ready endpoint whose pod the pod cache lacked when
    /// the slice's handler ran, as Linkerd's destination resolves), by service.
    #[serde(default)]
    pub lost_at_event_by_service: BTreeMap<String, u64>,
}

impl ResolverReport {
    /// Events of every kind.
    pub fn events_total(&self) -> u64 {
        self.events.values().sum()
    }

    /// When the change stamped `stamp` reached it (wall-clock ms), if it did.
    pub fn seen_at(&self, stamp: u64) -> Option<u64> {
        self.stamped
            .iter()
            .find(|(s, _)| *s == stamp)
            .map(|(_, at)| *at)
    }

    /// Addresses lost at a slice event over the services `in_scope` accepts.
    pub fn lost_at_event_where(&self, in_scope: impl Fn(&str) -> bool) -> u64 {
        (self.lost_at_event_by_service.iter())
            .filter(|(s, _)| in_scope(s))
            .map(|(_, n)| n)
            .sum()
    }

    /// Ready endpoints without their pod over the services `in_scope` accepts.
    pub fn without_pod_where(&self, in_scope: impl Fn(&str) -> bool) -> u64 {
        self.ready_without_pod_by_service
            .iter()
            .filter(|(s, _)| in_scope(s))
            .map(|(_, n)| n)
            .sum()
    }
}

#[derive(Debug, Default)]
struct Seen {
    latest: Option<ResolverReport>,
    /// Per service, the most ready endpoints without their pod of any line.
    max_without_pod: BTreeMap<String, u64>,
}

/// A running resolver, killed when dropped.
#[derive(Debug)]
pub struct Resolver {
    /// Its mode.
    pub mode: ResolverMode,
    child: Child,
    seen: Arc<Mutex<Seen>>,
    log: std::path::PathBuf,
}

impl Resolver {
    /// Starts the resolver in `mode` against the API of `kubeconfig` (YAML), its files (the
    /// kubeconfig, its stderr) in `dir` under `name`.
    pub fn start(
        kubeconfig: &str,
        mode: ResolverMode,
        dir: &Path,
        name: &str,
    ) -> anyhow::Result<Self> {
        let config = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&config, kubeconfig)?;
        let log = dir.join(format!("{name}.log"));
        let mut child = Command::new(super::bin("resolver")?)
            .arg("--kubeconfig")
            .arg(&config)
            .arg(format!(
                "--content-type={}",
                if mode.protobuf { "protobuf" } else { "json" }
            ))
            .arg(format!("--streaming={}", mode.streaming))
            .stdout(Stdio::piped())
            .stderr(super::log_file(&log)?)
            .kill_on_drop(true)
            .spawn()
            .context("starting the resolver")?;
        let out = child.stdout.take().context("the resolver's stdout")?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let keep = seen.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(report) = serde_json::from_str::<ResolverReport>(&line) else {
                    continue;
                };
                let mut seen = keep.lock().unwrap_or_else(|e| e.into_inner());
                // Before its caches synced, slices may well be listed before their pods.
                let counted = if report.synced {
                    &report.ready_without_pod_by_service
                } else {
                    &BTreeMap::new()
                };
                for (service, n) in counted {
                    let max = seen.max_without_pod.entry(service.clone()).or_default();
                    *max = (*max).max(*n);
                }
                seen.latest = Some(report);
            }
        });
        Ok(Self {
            mode,
            child,
            seen,
            log,
        })
    }

    /// The latest report (`None` before the first line).
    pub fn latest(&self) -> Option<ResolverReport> {
        self.lock().latest.clone()
    }

    /// Per service, the most ready endpoints without their pod any report showed once synced.
    pub fn max_without_pod(&self) -> BTreeMap<String, u64> {
        self.lock().max_without_pod.clone()
    }

    /// Waits up to `secs` for a report that satisfies `cond`, and returns it. Fails early if
    /// the process exits.
    pub async fn wait_for(
        &mut self,
        secs: u64,
        what: &str,
        cond: impl Fn(&ResolverReport) -> bool,
    ) -> anyhow::Result<ResolverReport> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(r) = self.latest().filter(|r| cond(r)) {
                return Ok(r);
            }
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!(
                    "resolver ({}) exited ({status}) before {what}; {}",
                    self.mode,
                    super::tail(&self.log)
                );
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "resolver ({}): no {what} within {secs} s; last report {:?}; {}",
                self.mode,
                self.latest(),
                super::tail(&self.log)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits up to `secs` until its event count has not moved for `quiet` (it has taken in
    /// everything the API sent), and returns the latest report.
    pub async fn settled(&mut self, secs: u64, quiet: Duration) -> anyhow::Result<ResolverReport> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        let mut last = (
            self.latest().unwrap_or_default().events_total(),
            tokio::time::Instant::now(),
        );
        loop {
            let now = self.latest().unwrap_or_default();
            if now.events_total() != last.0 {
                last = (now.events_total(), tokio::time::Instant::now());
            } else if last.1.elapsed() >= quiet {
                return Ok(now);
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "resolver ({}): events still moving after {secs} s: {now:?}",
                self.mode
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until its caches synced.
    pub async fn synced(&mut self, secs: u64) -> anyhow::Result<ResolverReport> {
        self.wait_for(secs, "sync", |r| r.synced).await
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Peak resident memory in KiB (`VmHWM`).
    pub fn peak_kib(&self) -> Option<u64> {
        crate::process::proc_status_kib(self.pid()?, "VmHWM")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}
