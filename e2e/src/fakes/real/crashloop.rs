//! The crash-loop driver (`e2e/realkube/cmd/crashloop`) as a child process: it creates the
//! services, ReplicaSets, pods and slices a remote's controllers would, then flips pods between
//! Ready and CrashLoopBackOff. A reader task keeps its phase lines (`ready`, `churn`, `done`).

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};

#[derive(Debug, Default)]
struct Lines {
    ready: Option<Value>,
    last: Option<Value>,
}

/// A running driver, killed when dropped.
#[derive(Debug)]
pub struct Crashloop {
    child: Child,
    lines: Arc<Mutex<Lines>>,
    log: std::path::PathBuf,
}

impl Crashloop {
    /// Starts the driver against the API server of `kubeconfig` (a file) with `args` (its
    /// flags: `--pods`, `--rate`, `--duration`, ...), its stderr into `dir/crashloop.log`.
    pub fn start(kubeconfig: &Path, args: &[&str], dir: &Path) -> anyhow::Result<Self> {
        let log = dir.join("crashloop.log");
        let mut child = Command::new(super::bin("crashloop")?)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(super::log_file(&log)?)
            .kill_on_drop(true)
            .spawn()
            .context("starting the crash-loop driver")?;
        let out = child.stdout.take().context("the driver's stdout")?;
        let lines = Arc::new(Mutex::new(Lines::default()));
        let keep = lines.clone();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let mut l = keep.lock().unwrap_or_else(|e| e.into_inner());
                if v["phase"] == "ready" {
                    l.ready = Some(v.clone());
                }
                l.last = Some(v);
            }
        });
        Ok(Self { child, lines, log })
    }

    /// Creates the objects and exits (`--duration 0`): waits up to `secs` for it to finish and
    /// returns its `ready` line.
    pub async fn setup(
        kubeconfig: &Path,
        args: &[&str],
        dir: &Path,
        secs: u64,
    ) -> anyhow::Result<Value> {
        let mut all = args.to_vec();
        all.extend(["--duration", "0s"]);
        let mut driver = Self::start(kubeconfig, &all, dir)?;
        driver.wait_exit(secs).await?;
        driver.ready_line().context("the driver's ready line")
    }

    /// Waits up to `secs` for the objects to exist (the `ready` line) and returns that line.
    pub async fn wait_ready(&mut self, secs: u64) -> anyhow::Result<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(v) = self.ready_line() {
                return Ok(v);
            }
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!(
                    "the driver exited ({status}) before its objects existed; {}",
                    super::tail(&self.log)
                );
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the driver's objects did not exist within {secs} s; {}",
                super::tail(&self.log)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits up to `secs` for the driver to exit successfully; returns its last line.
    pub async fn wait_exit(&mut self, secs: u64) -> anyhow::Result<Value> {
        let status = tokio::time::timeout(Duration::from_secs(secs), self.child.wait())
            .await
            .with_context(|| format!("the driver did not finish within {secs} s"))??;
        anyhow::ensure!(
            status.success(),
            "the driver failed: {status}; {}",
            super::tail(&self.log)
        );
        // The reader may still hold the last line: give it a moment to take it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            let last = self.lock().last.clone();
            match last {
                Some(v) if v["phase"] != "churn" => return Ok(v),
                _ if tokio::time::Instant::now() >= deadline => {
                    return last.context("the driver printed nothing");
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Lets a driver started with `--wait-stdin` begin its churn.
    pub async fn go(&mut self) -> anyhow::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        let stdin = self.child.stdin.as_mut().context("the driver's stdin")?;
        stdin.write_all(b"go\n").await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Its `ready` line, once printed.
    pub fn ready_line(&self) -> Option<Value> {
        self.lock().ready.clone()
    }

    /// Its latest line.
    pub fn last_line(&self) -> Option<Value> {
        self.lock().last.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lines> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner())
    }
}
