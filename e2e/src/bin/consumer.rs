//! `consumer`: a stand-in for Linkerd's remote-discovery informers, as its own process so its
//! memory can be read from `/proc`.
//!
//! `consumer --kubeconfig FILE` runs kube-rs reflectors (watcher + in-memory store, streaming
//! lists) on Services, EndpointSlices and Pods, cluster-wide, as the destination controller's
//! informers do, and prints one JSON line a second on stdout:
//!
//! ```text
//! {"events":N,"services":S,"slices":E,"pods":P,"synced":true,"seen":[[stamp_ms,seen_ms],...],
//!  "readyEndpoints":{"ns/svc":N,...},
//!  "readyWithoutPod":{"total":N,"services":{"ns/svc":N,...}},
//!  "readyWithoutPodSettled":{"total":N,"services":{...}}}
//! ```
//!
//! `events` counts every object the watchers delivered (initial ones included); `seen` lists the
//! changes stamped with [`STAMP`] (an annotation holding the writer's wall-clock time in ms)
//! that arrived since the last line, with the time they arrived.
//!
//! It also resolves as Linkerd's destination does ([`floodgate_e2e::resolve`]): every ready
//! endpoint of the slices it holds is looked up by its `targetRef` pod in the pods it holds.
//! `readyEndpoints` counts the ready endpoints per service (`kubernetes.io/service-name`);
//! `readyWithoutPod` those whose pod it does not hold (the destination would drop them), and
//! `readyWithoutPodSettled` those that have been so for longer than 2 s. It looks twice a
//! second, so an endpoint's wait is measured to within half a second.
//!
//! `consumer --kubeconfig FILE --restarts N` is a restarting consumer instead: N times it builds
//! a client, syncs the three informers, and drops them; then it prints `{"restarts":N}`.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use floodgate_e2e::flood::STAMP;
use floodgate_e2e::resolve::Resolver;
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde_json::json;
use tokio::sync::mpsc;

/// A Linkerd-like consumer of one cluster's discovery API.
#[derive(Debug, Parser)]
struct Args {
    /// The kubeconfig to connect with.
    #[arg(long)]
    kubeconfig: std::path::PathBuf,
    /// Restart N times instead of following.
    #[arg(long)]
    restarts: Option<u32>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

async fn client(path: &std::path::Path) -> anyhow::Result<Client> {
    let yaml = std::fs::read_to_string(path)?;
    let kc = kube::config::Kubeconfig::from_yaml(&yaml)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await?;
    Ok(Client::try_from(cfg)?)
}

/// What a reflector tells the reporter.
#[derive(Debug)]
enum Note {
    Events(u64),
    Synced,
    Seen(u64, u64),
}

/// Runs a reflector of `K` until the process ends, reporting what it delivers.
fn follow<K>(client: Client, notes: mpsc::Sender<Note>) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher::watcher(
            Api::<K>::all(client),
            watcher::Config::default().streaming_lists(),
        ),
    );
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut stamps: HashMap<String, String> = HashMap::new();
        while let Some(ev) = stream.next().await {
            let note = match ev {
                Ok(Event::InitApply(_)) | Ok(Event::Delete(_)) => Note::Events(1),
                Ok(Event::InitDone) => Note::Synced,
                Ok(Event::Apply(k)) => {
                    let stamp = k.meta().annotations.as_ref().and_then(|a| a.get(STAMP));
                    if let Some(stamp) = stamp {
                        let name = k.meta().name.clone().unwrap_or_default();
                        if stamps.get(&name) != Some(stamp) {
                            stamps.insert(name, stamp.clone());
                            if let Ok(at) = stamp.parse() {
                                // Bounded by the channel: a stalled reporter slows the watcher,
                                // as a busy informer's handler would.
                                let _ = notes.send(Note::Seen(at, now_ms())).await;
                            }
                        }
                    }
                    Note::Events(1)
                }
                Ok(Event::Init) => continue,
                Err(e) => {
                    eprintln!("consumer: watcher error: {e}");
                    continue;
                }
            };
            if notes.send(note).await.is_err() {
                return;
            }
        }
    });
    reader
}

/// Drives `stream` until its initial list is done.
async fn sync<K>(
    mut stream: impl Stream<Item = watcher::Result<Event<K>>> + Unpin,
) -> anyhow::Result<()> {
    while let Some(ev) = stream.next().await {
        if let Event::InitDone = ev? {
            return Ok(());
        }
    }
    anyhow::bail!("the watch ended before its initial list was done")
}

async fn restart_loop(args: &Args, n: u32) -> anyhow::Result<()> {
    for _ in 0..n {
        let c = client(&args.kubeconfig).await?;
        let cfg = || watcher::Config::default().streaming_lists();
        tokio::try_join!(
            sync(watcher::watcher(Api::<Service>::all(c.clone()), cfg()).boxed()),
            sync(watcher::watcher(Api::<EndpointSlice>::all(c.clone()), cfg()).boxed()),
            sync(watcher::watcher(Api::<Pod>::all(c.clone()), cfg()).boxed()),
        )?;
    }
    println!("{}", json!({ "restarts": n }));
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(n) = args.restarts {
        return restart_loop(&args, n).await;
    }
    let c = client(&args.kubeconfig).await?;
    // Reflectors send a note per event; the reporter drains them continuously, so 4096 only
    // absorbs bursts.
    let (tx, mut rx) = mpsc::channel(4096);
    let services = follow::<Service>(c.clone(), tx.clone());
    let slices = follow::<EndpointSlice>(c.clone(), tx.clone());
    let pods = follow::<Pod>(c, tx);
    let (mut events, mut synced, mut seen) = (0u64, 0, Vec::new());
    let mut resolver = Resolver::default();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut ticks = 0u64;
    loop {
        tokio::select! {
            note = rx.recv() => match note {
                Some(Note::Events(n)) => events += n,
                Some(Note::Synced) => synced += 1,
                Some(Note::Seen(at, now)) => seen.push([at, now]),
                None => return Ok(()),
            },
            _ = tick.tick() => {
                let held = slices.state();
                let r = resolver.look(
                    held.iter().map(|s| s.as_ref()),
                    |ns, name| pods.get(&ObjectRef::new(name).within(ns)).is_some(),
                    std::time::Instant::now(),
                );
                ticks += 1;
                if ticks % 2 == 1 {
                    continue;
                }
                let line = json!({
                    "events": events, "services": services.len(), "slices": slices.len(),
                    "pods": pods.len(), "synced": synced >= 3, "seen": std::mem::take(&mut seen),
                    "readyEndpoints": r.ready, "readyWithoutPod": r.without_pod,
                    "readyWithoutPodSettled": r.settled,
                });
                println!("{line}");
            }
        }
    }
}
