//! Floodgate's logs, captured in memory so a test can assert what was said. Each nextest test
//! runs in its own process, so one global subscriber per test is enough.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// The captured log text.
#[derive(Clone, Debug, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Installs a subscriber (level `info`, or `FLOODGATE_LOG`) that writes into the returned
    /// buffer and to stderr. A second call in one process returns a buffer nothing writes to.
    pub fn capture() -> Self {
        let logs = Self::default();
        let sink = logs.clone();
        let filter = tracing_subscriber::EnvFilter::try_from_env("FLOODGATE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(move || Tee(sink.clone()))
            .try_init();
        logs
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// The lines logged so far that contain every one of `words`.
    pub fn lines_with(&self, words: &[&str]) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| words.iter().all(|w| l.contains(w)))
            .map(str::to_owned)
            .collect()
    }
}

struct Tee(Logs);

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        std::io::stderr().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
