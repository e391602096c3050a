//! Containment that survives restarts: the contained services of a link, each with its trigger
//! and the state it published, in `<state-dir>/links/<link>/contained.json`.
//!
//! The file is rewritten whole (atomically, like the quarantine's) after every containment or
//! release, and removed when no service is contained. At start each saved service is
//! published again at its saved state and stays contained until released.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::{LinkDir, PersistError, wall_since, write_atomic};
use crate::churn::flood::Trigger;
use crate::churn::restore::SavedContained;
use crate::model::{NsName, Object};

/// The file format's version; a file of another version is refused (and reported).
const FORMAT: u32 = 1;

const FILE: &str = "contained.json";

/// One contained service to save: what the engine says of it and what it published.
#[derive(Clone, Debug)]
pub struct ContainedSnapshot {
    /// The service.
    pub service: NsName,
    /// What contained it.
    pub trigger: Trigger,
    /// When.
    pub since: Instant,
    /// The auto-release cool-down in force, if any.
    pub cooldown: Option<Duration>,
    /// Its published objects as served (JSON).
    pub objects: Vec<serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct File {
    format: u32,
    link: String,
    services: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    namespace: String,
    name: String,
    /// When it was contained (wall clock, RFC 3339).
    since: String,
    trigger: Trigger,
    cooldown_seconds: Option<u64>,
    objects: Vec<serde_json::Value>,
}

impl LinkDir {
    fn contained_file(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Saves the contained services (none: removes the file).
    pub fn save_contained(
        &self,
        services: Vec<ContainedSnapshot>,
        now: Instant,
    ) -> Result<(), PersistError> {
        let path = self.contained_file();
        if services.is_empty() {
            return match std::fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(source) => Err(PersistError::Io { path, source }),
            };
        }
        let file = File {
            format: FORMAT,
            link: self.link.clone(),
            services: services
                .into_iter()
                .map(|c| Entry {
                    namespace: c.service.namespace.to_string(),
                    name: c.service.name.to_string(),
                    since: wall_since(now, c.since).to_string(),
                    trigger: c.trigger,
                    cooldown_seconds: c.cooldown.map(|d| d.as_secs()),
                    objects: c.objects,
                })
                .collect(),
        };
        let bytes = serde_json::to_vec(&file).map_err(|e| PersistError::Corrupt {
            path: path.clone(),
            why: e.to_string(),
        })?;
        write_atomic(&path, &bytes, 0o600)
    }

    /// The saved containments. A corrupt file is renamed aside (`contained.json.corrupt`).
    pub fn load_contained(&self, now: Instant) -> Result<Vec<SavedContained>, PersistError> {
        let path = self.contained_file();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(PersistError::Io { path, source }),
        };
        self.decode_contained(&bytes, now).inspect_err(|_| {
            let _ = std::fs::rename(&path, path.with_extension("json.corrupt"));
        })
    }

    fn decode_contained(
        &self,
        bytes: &[u8],
        now: Instant,
    ) -> Result<Vec<SavedContained>, PersistError> {
        let corrupt = |why: String| PersistError::Corrupt {
            path: self.contained_file(),
            why,
        };
        let f: File = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
        if f.format != FORMAT {
            return Err(corrupt(format!(
                "format {} (this Floodgate reads {FORMAT})",
                f.format
            )));
        }
        if f.link != self.link {
            return Err(corrupt(format!("it belongs to link {:?}", f.link)));
        }
        f.services
            .into_iter()
            .map(|e| {
                let objects = e
                    .objects
                    .into_iter()
                    .map(Object::from_json)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|err| corrupt(format!("an object does not decode: {err}")))?;
                let since = super::instant_since(&e.since, now)
                    .map_err(|err| corrupt(format!("since {:?}: {err}", e.since)))?;
                Ok(SavedContained {
                    service: NsName::new(&e.namespace, &e.name),
                    trigger: e.trigger,
                    since,
                    cooldown: e.cooldown_seconds.map(Duration::from_secs),
                    objects,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_containments_load_back_and_none_removes_the_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = LinkDir::new(tmp.path(), "east");
        let now = Instant::now();
        let web = serde_json::json!({
            "kind": "Service", "apiVersion": "v1",
            "metadata": {"name": "web", "namespace": "prod", "resourceVersion": "7"}
        });
        let snap = ContainedSnapshot {
            service: NsName::new("prod", "web"),
            trigger: Trigger::manual("flood"),
            since: now,
            cooldown: Some(Duration::from_secs(600)),
            objects: vec![web],
        };
        dir.save_contained(vec![snap], now).expect("saved");
        let back = dir.load_contained(now).expect("readable");
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].service, NsName::new("prod", "web"));
        assert_eq!(back[0].trigger, Trigger::manual("flood"));
        assert_eq!(back[0].cooldown, Some(Duration::from_secs(600)));
        assert_eq!(back[0].objects[0].key().id.to_string(), "prod/web");
        dir.save_contained(Vec::new(), now).expect("cleared");
        assert!(dir.load_contained(now).expect("readable").is_empty());
    }

    #[test]
    fn a_corrupt_file_is_set_aside() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = LinkDir::new(tmp.path(), "east");
        std::fs::create_dir_all(tmp.path().join("links/east")).expect("dir");
        std::fs::write(tmp.path().join("links/east/contained.json"), b"{nope").expect("write");
        assert!(matches!(
            dir.load_contained(Instant::now()),
            Err(PersistError::Corrupt { .. })
        ));
        assert!(
            tmp.path()
                .join("links/east/contained.json.corrupt")
                .exists()
        );
        assert!(dir.load_contained(Instant::now()).expect("gone").is_empty());
    }
}
