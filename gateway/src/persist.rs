//! Quarantine that survives restarts: a quarantined link's state and its last good view, in
//! `<state-dir>/links/<link>/quarantine.json`.
//!
//! The file is written when a link enters quarantine and removed when it is released; at start
//! a link that finds one stays quarantined and serves that view until an operator releases it
//! (or its auto-release re-check passes). Writes are atomic (write a temporary file, fsync,
//! rename, fsync the directory), so a crash leaves the old file or the new one, never half of
//! one. A file that cannot be read or decoded is reported and treated as no snapshot: the link
//! then starts from upstream like any other.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::churn::flood::Trigger;
use crate::churn::quarantine::Quarantine;
use crate::churn::restore::Saved;
use crate::model::{Kind, Object};
use crate::view::View;

pub mod contained;

/// The file format's version; a file of another version is refused (and reported).
const FORMAT: u32 = 1;

const FILE: &str = "quarantine.json";

/// Why a quarantine could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// Reading, writing or renaming failed. Retryable: the next transition writes again.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a snapshot this version can read. Not retryable: it is set aside.
    #[error("{path}: not a readable quarantine snapshot: {why}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

/// The file: this header's fields, then `objects`, the view's objects as served.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    format: u32,
    link: String,
    /// When the quarantine began (wall clock, RFC 3339).
    since: String,
    trigger: Trigger,
    before_first_sync: bool,
    cooldown_seconds: Option<u64>,
}

#[derive(Deserialize)]
struct File {
    #[serde(flatten)]
    header: Header,
    objects: Vec<serde_json::Value>,
}

/// Where one link keeps its state.
#[derive(Clone, Debug)]
pub struct LinkDir {
    link: String,
    dir: PathBuf,
}

impl LinkDir {
    /// `<state_dir>/links/<link>`.
    pub fn new(state_dir: &Path, link: &str) -> Self {
        Self {
            link: link.to_owned(),
            dir: state_dir.join("links").join(link),
        }
    }

    fn file(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Saves a quarantine and the view consumers see (frozen while quarantined).
    pub fn save(&self, q: &Quarantine, now: Instant, view: &View) -> Result<(), PersistError> {
        let since = wall_since(now, q.since);
        let header = Header {
            format: FORMAT,
            link: self.link.clone(),
            since: since.to_string(),
            trigger: q.trigger.clone(),
            before_first_sync: q.before_first_sync,
            cooldown_seconds: q.cooldown.map(|c| c.as_secs()),
        };
        let mut bytes = serde_json::to_vec(&header).map_err(|e| self.corrupt(e.to_string()))?;
        // The objects are written as the view encoded them, once, at publish time.
        bytes.pop(); // the header's closing brace
        bytes.extend_from_slice(b",\"objects\":[");
        let mut first = true;
        for kind in Kind::ALL {
            for stored in view.list(kind).items {
                if !std::mem::take(&mut first) {
                    bytes.push(b',');
                }
                stored.write_json(&mut bytes);
            }
        }
        bytes.extend_from_slice(b"]}");
        write_atomic(&self.file(), &bytes, 0o600)
    }

    /// The saved quarantine, if there is one. A corrupt file is renamed aside
    /// (`quarantine.json.corrupt`) so the next start does not trip on it again.
    pub fn load(&self, now: Instant) -> Result<Option<Saved>, PersistError> {
        let path = self.file();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(PersistError::Io { path, source }),
        };
        self.decode(&bytes, now).map(Some).inspect_err(|_| {
            let _ = std::fs::rename(&path, path.with_extension("json.corrupt"));
        })
    }

    fn decode(&self, bytes: &[u8], now: Instant) -> Result<Saved, PersistError> {
        let File { header: h, objects } =
            serde_json::from_slice(bytes).map_err(|e| self.corrupt(e.to_string()))?;
        if h.format != FORMAT {
            return Err(self.corrupt(format!(
                "format {} (this Floodgate reads {FORMAT})",
                h.format
            )));
        }
        if h.link != self.link {
            return Err(self.corrupt(format!("it belongs to link {:?}", h.link)));
        }
        let objects = objects
            .into_iter()
            .map(Object::from_json)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.corrupt(format!("an object does not decode: {e}")))?;
        let since = instant_since(&h.since, now)
            .map_err(|e| self.corrupt(format!("since {:?}: {e}", h.since)))?;
        Ok(Saved {
            trigger: h.trigger,
            since,
            before_first_sync: h.before_first_sync,
            cooldown: h.cooldown_seconds.map(Duration::from_secs),
            objects,
        })
    }

    /// Removes the saved quarantine (the link was released).
    pub fn clear(&self) -> Result<(), PersistError> {
        let path = self.file();
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(PersistError::Io { path, source }),
        }
    }

    fn corrupt(&self, why: String) -> PersistError {
        PersistError::Corrupt {
            path: self.file(),
            why,
        }
    }
}

/// The wall-clock time of `since`, an instant of this run's clock (`now` is the same moment as
/// the wall clock's now).
fn wall_since(now: Instant, since: Instant) -> jiff::Timestamp {
    let age = now.saturating_duration_since(since);
    jiff::Timestamp::now()
        .checked_sub(jiff::SignedDuration::try_from(age).unwrap_or_default())
        .unwrap_or_else(|_| jiff::Timestamp::now())
}

/// The instant of this run's clock that a saved RFC 3339 time stands for.
fn instant_since(saved: &str, now: Instant) -> Result<Instant, jiff::Error> {
    let since: jiff::Timestamp = saved.parse()?;
    let age = jiff::Timestamp::now()
        .duration_since(since)
        .try_into()
        .unwrap_or(Duration::ZERO);
    Ok(now.checked_sub(age).unwrap_or(now))
}

/// Writes `bytes` to `path` atomically with file mode `mode`: a temporary file beside it,
/// fsync, rename over `path`, fsync of the directory. Creates the directory.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), PersistError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| PersistError::Io { path, source }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut tmp_name = path.file_name().unwrap_or_default().to_owned();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::view::Change;

    fn mk_quarantine(now: Instant) -> Quarantine {
        Quarantine {
            since: now,
            trigger: Trigger::manual("maintenance"),
            before_first_sync: false,
            cooldown: Some(Duration::from_secs(600)),
            next_check: None,
        }
    }

    fn mk_view() -> View {
        let view = View::new(1, 10);
        view.apply(
            [Change::Upsert(Object::Service(Arc::new(Service {
                metadata: ObjectMeta {
                    name: Some("web".into()),
                    namespace: Some("prod".into()),
                    ..Default::default()
                },
                ..Default::default()
            })))],
            Instant::now(),
        );
        view
    }

    #[test]
    fn a_saved_quarantine_loads_back_with_its_view() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = LinkDir::new(tmp.path(), "east");
        let now = Instant::now();
        dir.save(&mk_quarantine(now), now, &mk_view())
            .expect("saved");
        let saved = dir.load(now).expect("readable").expect("present");
        assert_eq!(saved.trigger, Trigger::manual("maintenance"));
        assert_eq!(saved.cooldown, Some(Duration::from_secs(600)));
        assert_eq!(saved.objects.len(), 1);
        assert_eq!(saved.objects[0].key().id.to_string(), "prod/web");
        dir.clear().expect("cleared");
        assert!(dir.load(now).expect("readable").is_none());
    }

    #[test]
    fn a_corrupt_file_is_an_error_and_is_set_aside() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = LinkDir::new(tmp.path(), "east");
        let now = Instant::now();
        dir.save(&mk_quarantine(now), now, &mk_view())
            .expect("saved");
        let file = tmp.path().join("links/east/quarantine.json");
        let bytes = std::fs::read(&file).expect("read");
        std::fs::write(&file, &bytes[..bytes.len() / 2]).expect("truncate");
        let err = dir.load(now).expect_err("half a file");
        assert!(matches!(err, PersistError::Corrupt { .. }), "{err}");
        assert!(
            dir.load(now).expect("set aside").is_none(),
            "the next start finds no snapshot"
        );
        assert!(
            tmp.path()
                .join("links/east/quarantine.json.corrupt")
                .exists()
        );
    }

    #[test]
    fn another_links_file_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let now = Instant::now();
        LinkDir::new(tmp.path(), "east")
            .save(&mk_quarantine(now), now, &mk_view())
            .expect("saved");
        std::fs::create_dir_all(tmp.path().join("links/west")).expect("dir");
        std::fs::rename(
            tmp.path().join("links/east/quarantine.json"),
            tmp.path().join("links/west/quarantine.json"),
        )
        .expect("moved");
        let err = LinkDir::new(tmp.path(), "west")
            .load(now)
            .expect_err("not west's");
        assert!(
            err.to_string().contains("belongs to link \"east\""),
            "{err}"
        );
    }
}
