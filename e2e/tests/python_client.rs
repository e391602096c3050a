//! The Python `kubernetes` client (a client we did not write) against a Floodgate link: list,
//! then `watch.Watch().stream` across changes. `make test` installs the client into a
//! virtualenv and points `FLOODGATE_PYTHON` at it.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use floodgate::kubeapi::ApiStore;
use floodgate_e2e::RunningFacade;
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::sim::SimStore;
use tokio::io::{AsyncBufReadExt, BufReader};

fn python() -> String {
    if let Ok(p) = std::env::var("FLOODGATE_PYTHON") {
        return p;
    }
    let ok = std::process::Command::new("python3")
        .args(["-c", "import kubernetes"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the Python kubernetes client is missing: run `make test` (it installs it) or set FLOODGATE_PYTHON"
    );
    "python3".to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_lists_and_watches() {
    let store = Arc::new(SimStore::new(31, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    for svc in ["web", "api"] {
        cluster.add_service(svc, true);
    }
    let facade = RunningFacade::start(vec![("east", "py-token", store.view().clone())])
        .await
        .expect("facade");
    let kubeconfig = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(kubeconfig.path(), facade.kubeconfig("east")).expect("kubeconfig");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/list_and_watch.py"
    );
    let mut child = tokio::process::Command::new(python())
        .arg(script)
        .arg(kubeconfig.path())
        .arg("2")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python runs");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("a line within 30 s")
            .expect("read")
            .expect("the script is still running")
    };
    assert_eq!(next().await, "LISTED api,web");
    assert_eq!(next().await, "WATCHING");
    cluster.add_service("cache", true);
    assert_eq!(next().await, "EVENT ADDED cache");
    cluster.relabel("web", "tier", Some("front"));
    assert_eq!(next().await, "EVENT MODIFIED web");
    assert_eq!(next().await, "DONE");
}
