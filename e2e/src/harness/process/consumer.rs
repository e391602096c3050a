//! `consumer` processes (`src/bin/consumer.rs`): kube-rs informers of one kubeconfig that
//! report what they hold, for the demo and the side-by-side benchmarks; and S2's herd of
//! restarting consumers.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

use super::sibling_bin;
use crate::resolve::Counts;

/// What a consumer has reported so far (see `src/bin/consumer.rs`).
#[derive(Debug, Default, Clone)]
pub struct ConsumerStats {
    /// Objects its watchers delivered.
    pub events: u64,
    /// Objects in its stores.
    pub services: u64,
    /// EndpointSlices in its store.
    pub slices: u64,
    /// Pods in its store.
    pub pods: u64,
    /// Whether all three informers have synced.
    pub synced: bool,
    /// Stamped changes it saw: (stamp, arrival), wall-clock ms.
    pub seen: Vec<(u64, u64)>,
    /// Ready endpoints per service (`namespace/name`), as of its last report.
    pub ready_endpoints: BTreeMap<String, u64>,
    /// Ready endpoints whose pod it does not hold (`readyWithoutPod`), as of its last report.
    pub ready_without_pod: Counts,
    /// Those that have lacked their pod for more than 2 s (`readyWithoutPodSettled`).
    pub ready_without_pod_settled: Counts,
}

impl ConsumerStats {
    /// Ready endpoints of `service` (`namespace/name`).
    pub fn ready_of(&self, service: &str) -> u64 {
        self.ready_endpoints
            .get(service)
            .copied()
            .unwrap_or_default()
    }

    /// The settled figure summed over every service but `except`.
    pub fn settled_except(&self, except: &str) -> u64 {
        let c = &self.ready_without_pod_settled;
        c.total - c.of(except)
    }
}

/// Field `key` of a report line, or its default when absent or malformed.
fn field<T: serde::de::DeserializeOwned + Default>(line: &Value, key: &str) -> T {
    serde_json::from_value(line[key].clone()).unwrap_or_default()
}

/// A `consumer` process following one kubeconfig.
#[derive(Debug)]
pub struct Consumer {
    child: Child,
    stats: Arc<Mutex<ConsumerStats>>,
}

impl Consumer {
    /// Starts a consumer of `kubeconfig` (YAML, written to `dir/<name>.kubeconfig`).
    pub fn start(dir: &Path, name: &str, kubeconfig: &str) -> anyhow::Result<Self> {
        let path = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, kubeconfig)?;
        let mut child = Command::new(sibling_bin("consumer")?)
            .arg("--kubeconfig")
            .arg(&path)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting a consumer")?;
        let stdout = child.stdout.take().context("the consumer's stdout")?;
        let stats = Arc::new(Mutex::new(ConsumerStats::default()));
        let shared = stats.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let mut s = shared.lock().unwrap_or_else(|e| e.into_inner());
                let n = |k: &str| v[k].as_u64().unwrap_or_default();
                s.events = n("events");
                s.services = n("services");
                s.slices = n("slices");
                s.pods = n("pods");
                s.synced = v["synced"].as_bool().unwrap_or_default();
                s.ready_endpoints = field(&v, "readyEndpoints");
                s.ready_without_pod = field(&v, "readyWithoutPod");
                s.ready_without_pod_settled = field(&v, "readyWithoutPodSettled");
                for pair in v["seen"].as_array().into_iter().flatten() {
                    if let (Some(a), Some(b)) = (pair[0].as_u64(), pair[1].as_u64()) {
                        s.seen.push((a, b));
                    }
                }
            }
        });
        Ok(Self { child, stats })
    }

    /// What it has reported.
    pub fn stats(&self) -> ConsumerStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills and reaps the process.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}

/// Runs `n` restarting consumers of `kubeconfig` at once, each restarting `restarts` times
/// (S2), and waits for all of them.
pub async fn restart_herd(
    dir: &Path,
    kubeconfig: &str,
    n: usize,
    restarts: u32,
) -> anyhow::Result<()> {
    let path = dir.join("herd.kubeconfig");
    std::fs::write(&path, kubeconfig)?;
    let bin = sibling_bin("consumer")?;
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        children.push(
            Command::new(&bin)
                .arg("--kubeconfig")
                .arg(&path)
                .args(["--restarts", &restarts.to_string()])
                .stdout(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("starting a restarting consumer")?,
        );
    }
    for mut c in children {
        let status = c.wait().await?;
        anyhow::ensure!(status.success(), "a restarting consumer failed: {status}");
    }
    Ok(())
}
