//! The link's task through a fake remote: no socket, paused time. Each test waits for the
//! state, view or watcher run that proves the task moved before asserting on it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use futures_util::future::BoxFuture;
use tokio::sync::{broadcast, oneshot};
use tokio::task::JoinHandle;

use super::super::LinkState;
use super::super::wire::{Dialed, Watchers, Wire};
use super::*;
use crate::churn::tests::{mk_service, mk_spec};
use crate::model::{NsName, ObjKey, Object};
use crate::view::replica::{Mirrored, Start};
use floodgate_link_crd::Phase;

/// The kinds the fake remote serves.
const KINDS: [Kind; 3] = [Kind::Service, Kind::EndpointSlice, Kind::Pod];

/// A remote that refuses the first `failures` dials, then answers; it records every run of
/// watchers the task starts.
struct Fake {
    failures: AtomicUsize,
    dials: AtomicUsize,
    runs: watch::Sender<Vec<Run>>,
    /// The Lease holder's view a follower follows, in-process.
    holder: Option<View>,
}

/// One run of watchers: the test sends its changes through `tx`.
#[derive(Clone)]
struct Run {
    generation: u64,
    tx: mpsc::Sender<Message>,
    /// False once the task dropped the run's watchers.
    live: Arc<AtomicBool>,
    /// The kinds whose first list the task said it took in.
    listed: Arc<Mutex<Vec<Kind>>>,
}

impl Run {
    fn is_live(&self) -> bool {
        self.live.load(Ordering::SeqCst)
    }

    async fn send(&self, change: Change) {
        self.send_as(self.generation, change).await;
    }

    async fn send_as(&self, generation: u64, change: Change) {
        let msg = Message {
            generation,
            change,
            at: Instant::now(),
        };
        self.tx.send(msg).await.expect("the task takes changes");
    }

    /// A whole first list: `services`, and no slice or pod.
    async fn list(&self, services: &[&str]) {
        for kind in KINDS {
            self.send(Change::InitStart(kind)).await;
        }
        for name in services {
            self.send(Change::Apply(mk_service(name, true))).await;
        }
        for kind in KINDS {
            self.send(Change::InitDone(kind)).await;
        }
    }
}

struct FakeWatchers(Run);

impl Drop for FakeWatchers {
    fn drop(&mut self) {
        self.0.live.store(false, Ordering::SeqCst);
    }
}

impl Watchers for FakeWatchers {
    fn listed(&self, kind: Kind) -> bool {
        self.0.listed.lock().expect("lock").push(kind);
        false
    }
}

impl Wire for Arc<Fake> {
    type Remote = ();
    type Watchers = FakeWatchers;

    fn dial(&self, _: &Connect) -> BoxFuture<'static, anyhow::Result<Dialed<()>>> {
        self.dials.fetch_add(1, Ordering::SeqCst);
        let refused = (self.failures)
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        Box::pin(async move {
            anyhow::ensure!(!refused, "connection refused");
            Ok(Dialed {
                remote: (),
                kinds: KINDS.into(),
                version: Some(serde_json::json!({"gitVersion": "v1.32.0"})),
            })
        })
    }

    fn watch(
        &self,
        (): &(),
        generation: u64,
        tx: mpsc::Sender<Message>,
        _: Arc<UpstreamCounters>,
        _: WantedPods,
    ) -> FakeWatchers {
        let run = Run {
            generation,
            tx,
            live: Arc::new(AtomicBool::new(true)),
            listed: Arc::default(),
        };
        self.runs.send_modify(|runs| runs.push(run.clone()));
        FakeWatchers(run)
    }

    fn fetch_pods(
        &self,
        (): &(),
        _: crate::churn::Fetch,
        _: u64,
        _: mpsc::Sender<Message>,
        _: Arc<UpstreamCounters>,
    ) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }

    /// What the holder's facade and the follower's stream do, without the wire: a snapshot,
    /// then every publication.
    fn follow(
        &self,
        (): &(),
        view: View,
        _: Arc<UpstreamCounters>,
        synced: watch::Sender<bool>,
    ) -> BoxFuture<'static, ()> {
        let holder = self.holder.clone().expect("a holder to follow");
        Box::pin(async move {
            let (start, mut rx) = holder.replicate(None);
            let Start::Snapshot {
                resource_version,
                items,
            } = start
            else {
                panic!("a snapshot when asked from no version");
            };
            let items = (items.iter())
                .map(|s| (s.object.clone(), s.resource_version))
                .collect();
            view.resync(resource_version, items, Instant::now());
            synced.send_replace(true);
            while let Ok(batch) = rx.recv().await {
                let changes = (batch.iter())
                    .map(|e| Mirrored {
                        kind: e.kind,
                        object: e.object.object.clone(),
                        resource_version: e.resource_version,
                    })
                    .collect();
                view.mirror(changes, Instant::now()).expect("in order");
            }
        })
    }
}

/// A link's task on the fake remote, and the handles a test drives it with.
struct Link {
    fake: Arc<Fake>,
    state: watch::Receiver<LinkState>,
    view: View,
    commands: mpsc::Sender<Command>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Credentials the fake never uses.
fn no_credentials() -> Connect {
    Arc::new(|| Box::pin(async { anyhow::bail!("the fake dials without credentials") }))
}

/// The term a reconnect carries to a link that follows no holder, which leaves it unused.
const UNUSED_TERM: NewTerm = NewTerm { step: 1, above: 0 };

impl Link {
    fn start(failures: usize) -> Self {
        Self::start_with(failures, None)
    }

    /// A link whose fake can follow `holder`'s view.
    fn start_with(failures: usize, holder: Option<View>) -> Self {
        let fake = Arc::new(Fake {
            failures: AtomicUsize::new(failures),
            dials: AtomicUsize::new(0),
            runs: watch::channel(Vec::new()).0,
            holder,
        });
        let view = View::new(1, 1_000);
        let (state_tx, state) = watch::channel(LinkState::default());
        let out = Outputs {
            state: state_tx,
            transitions: broadcast::channel(8).0,
            version: watch::channel(None).0,
            has_servers: watch::channel(false).0,
        };
        let (commands, commands_rx) = mpsc::channel(4);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let setup = Setup {
            spec: mk_spec(),
            view: view.clone(),
            connect: no_credentials(),
            dir: None,
            seed: None,
        };
        let task = LinkTask::new(fake.clone(), setup, out, commands_rx, shutdown_rx);
        Self {
            fake,
            state,
            view,
            commands,
            shutdown,
            task: tokio::spawn(task.run()),
        }
    }

    /// Waits until the link's state satisfies `ok` (time is paused: a minute passes at once
    /// when nothing else can run).
    async fn until(&mut self, what: &str, ok: impl FnMut(&LinkState) -> bool) {
        let waited = tokio::time::timeout(Duration::from_secs(60), self.state.wait_for(ok));
        let reached = matches!(waited.await, Ok(Ok(_)));
        assert!(
            reached,
            "{what}: the link's state is {:?}",
            *self.state.borrow()
        );
    }

    /// The `n`th run of watchers (from 1), once started.
    async fn run(&self, n: usize) -> Run {
        let mut runs = self.fake.runs.subscribe();
        let waited = tokio::time::timeout(Duration::from_secs(60), runs.wait_for(|r| r.len() >= n));
        let run = waited
            .await
            .ok()
            .and_then(|r| r.ok())
            .map(|runs| runs[n - 1].clone());
        run.unwrap_or_else(|| panic!("no run {n} of watchers: {}", self.fake.runs.borrow().len()))
    }

    /// Waits until the view serves exactly these services.
    async fn serves(&self, services: &[&str]) {
        let names = || {
            let (snapshot, _) = self.view.list_and_watch(Kind::Service);
            let mut names: Vec<String> = (snapshot.items.iter())
                .map(|s| s.object.key().id.name.to_string())
                .collect();
            names.sort();
            names
        };
        for _ in 0..600 {
            if names() == services {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(names(), services, "the view's services");
    }

    async fn ask<T>(&self, command: impl FnOnce(oneshot::Sender<T>) -> Command) -> T {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(command(tx))
            .await
            .expect("the task takes commands");
        rx.await.expect("an answer")
    }

    async fn quarantine(&self) -> Result<Transition, RequestError> {
        self.ask(|tx| Command::Quarantine("ticket 7".into(), tx))
            .await
    }

    async fn release(&self) -> Result<Transition, RequestError> {
        self.ask(|tx| Command::Release("a test".into(), tx)).await
    }
}

fn service(name: &str) -> Object {
    mk_service(name, true)
}

#[tokio::test(start_paused = true)]
async fn a_refused_dial_is_degraded_and_retried_until_the_remote_answers_and_syncs() {
    let mut link = Link::start(2);
    link.until("Degraded with the dial's error", |s| {
        s.phase == Phase::Degraded && s.message == "cannot reach the remote: connection refused"
    })
    .await;
    let run = link.run(1).await;
    assert_eq!(
        link.fake.dials.load(Ordering::SeqCst),
        3,
        "two refusals, one answer"
    );
    assert_eq!(run.generation, 1);
    run.list(&["web", "api"]).await;
    link.until("synced and Healthy", |s| {
        s.synced && s.connected && s.phase == Phase::Healthy && s.message.is_empty()
    })
    .await;
    link.serves(&["api", "web"]).await;
    // Every first list was passed on to the watchers (the pod watcher opens on them).
    let mut listed = run.listed.lock().expect("lock").clone();
    listed.sort_by_key(|k| k.name());
    assert_eq!(listed, [Kind::EndpointSlice, Kind::Pod, Kind::Service]);
}

#[tokio::test(start_paused = true)]
async fn a_quarantine_stops_the_watchers_and_a_release_starts_a_run_whose_changes_alone_count() {
    let mut link = Link::start(0);
    let first = link.run(1).await;
    first.list(&["web"]).await;
    link.until("synced", |s| s.synced).await;

    link.quarantine().await.expect("quarantined");
    // The answer comes once the state says it.
    assert_eq!(link.state.borrow().phase, Phase::Quarantined);
    assert!(
        !first.is_live(),
        "a quarantined link's watchers are stopped"
    );

    link.release().await.expect("released");
    let second = link.run(2).await;
    assert_eq!(second.generation, first.generation + 1);
    // A change the stopped run sent late is not the remote's state any more.
    first.send(Change::Apply(service("stale"))).await;
    second.list(&["web", "api"]).await;
    link.serves(&["api", "web"]).await;
    link.until("Healthy again", |s| s.phase == Phase::Healthy)
        .await;
}

#[tokio::test(start_paused = true)]
async fn new_credentials_replace_the_connection_not_the_view() {
    let mut link = Link::start(0);
    let first = link.run(1).await;
    first.list(&["web"]).await;
    link.serves(&["web"]).await;

    let connect = no_credentials();
    let reconnect = Command::Reconnect(super::super::Reconnect(connect), UNUSED_TERM);
    link.commands.send(reconnect).await.expect("sent");
    let second = link.run(2).await;
    assert!(
        !first.is_live(),
        "the old connection's watchers are stopped"
    );
    assert_eq!(link.fake.dials.load(Ordering::SeqCst), 2);
    second.list(&["web", "api"]).await;
    link.serves(&["api", "web"]).await;

    // The old run's late delete is dropped; the new run's change behind it is taken.
    first.send(Change::Delete(service("web").key())).await;
    second.send(Change::Apply(service("db"))).await;
    link.serves(&["api", "db", "web"]).await;
    link.until("Healthy", |s| s.phase == Phase::Healthy && s.connected)
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_link_quarantined_while_connecting_answers_at_once_and_starts_no_watchers() {
    let mut link = Link::start(3);
    link.until("Degraded", |s| s.phase == Phase::Degraded).await;
    link.quarantine()
        .await
        .expect("quarantined before the remote answers");
    assert_eq!(link.state.borrow().phase, Phase::Quarantined);
    link.until("connected", |s| s.connected).await;
    assert_eq!(link.fake.dials.load(Ordering::SeqCst), 4);
    assert!(
        link.fake.runs.borrow().is_empty(),
        "no watcher while quarantined"
    );
    assert_eq!(link.state.borrow().phase, Phase::Quarantined);

    link.release().await.expect("released");
    let run = link.run(1).await;
    run.list(&["web"]).await;
    link.serves(&["web"]).await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_the_task_and_stops_its_watchers() {
    let mut link = Link::start(0);
    let run = link.run(1).await;
    run.list(&["web"]).await;
    link.until("synced", |s| s.synced).await;
    link.shutdown.send_replace(true);
    tokio::time::timeout(Duration::from_secs(60), &mut link.task)
        .await
        .expect("the task ends")
        .expect("without panicking");
    assert!(!run.is_live());
}

#[tokio::test(start_paused = true)]
async fn a_disconnected_link_reads_nothing_until_told_where_to_read_again() {
    let mut link = Link::start(0);
    let first = link.run(1).await;
    first.list(&["web"]).await;
    link.serves(&["web"]).await;

    let why = "handing the link over";
    link.commands
        .send(Command::Disconnect(why.into()))
        .await
        .expect("sent");
    link.until("disconnected", |s| !s.connected && s.message == why)
        .await;
    assert!(!first.is_live(), "its watchers are stopped");
    // What the stopped run still sends is not taken; the view stays as it was.
    first.send(Change::Delete(service("web").key())).await;
    let reconnect = Command::Reconnect(super::super::Reconnect(no_credentials()), UNUSED_TERM);
    link.commands.send(reconnect).await.expect("sent");
    let second = link.run(2).await;
    assert!(second.generation > first.generation);
    second.list(&["web", "api"]).await;
    link.serves(&["api", "web"]).await;
    link.until("connected again", |s| {
        s.connected && s.phase == Phase::Healthy
    })
    .await;
}

/// The version of service `name` in `view`.
fn version_of(view: &View, name: &str) -> Option<u64> {
    let key = ObjKey {
        kind: Kind::Service,
        id: NsName::new("default", name),
    };
    view.get(&key).map(|s| s.resource_version)
}

/// A link that holds a remote serving `services`, the run of watchers its remote lists with,
/// and a link whose view follows the holder's, synced.
async fn holder_and_follower(services: &[&str]) -> (Link, Run, Link) {
    let holder = Link::start(0);
    let holders_remote = holder.run(1).await;
    holders_remote.list(services).await;
    holder.serves(services).await;
    let mut follower = Link::start_with(0, Some(holder.view.clone()));
    (follower.commands)
        .send(Command::Follow(super::super::Reconnect(no_credentials())))
        .await
        .expect("the task takes commands");
    follower
        .until("synced from the holder's view", |s| s.synced)
        .await;
    (holder, holders_remote, follower)
}

#[tokio::test(start_paused = true)]
async fn a_follower_serves_the_holders_versions_and_takes_over_with_only_what_changed() {
    let (holder, holders_remote, follower) = holder_and_follower(&["a", "b"]).await;
    follower.serves(&["a", "b"]).await;
    assert_eq!(
        follower.view.resource_version(),
        holder.view.resource_version()
    );
    for name in ["a", "b"] {
        assert_eq!(
            version_of(&follower.view, name),
            version_of(&holder.view, name),
            "{name} at the holder's version"
        );
    }

    // A change the holder publishes reaches the follower with the holder's version.
    holders_remote.send(Change::Apply(service("c"))).await;
    holder.serves(&["a", "b", "c"]).await;
    follower.serves(&["a", "b", "c"]).await;
    let seen = holder.view.resource_version();
    assert_eq!(
        version_of(&follower.view, "c"),
        version_of(&holder.view, "c")
    );
    // A consumer that saw the holder's latest version resumes at the follower: nothing missed.
    let (missed, mut consumer) = (follower.view)
        .watch_from(Kind::Service, seen)
        .expect("the holder's version resumes at the follower");
    assert!(missed.is_empty(), "{missed:?}");
    assert!(
        follower.fake.runs.borrow().is_empty(),
        "a follower starts no watchers"
    );

    // The holder goes on without the follower (which stops following), then the follower
    // takes over: its remote lists a and c, b is gone.
    holders_remote.send(Change::Apply(service("d"))).await;
    holder.serves(&["a", "b", "c", "d"]).await;
    (follower.commands)
        .send(Command::Reconnect(
            super::super::Reconnect(no_credentials()),
            crate::view::replica::NewTerm { step: 7, above: 0 },
        ))
        .await
        .expect("the task takes commands");
    let run = follower.run(1).await;
    run.list(&["a", "c"]).await;
    follower.serves(&["a", "c"]).await;
    // Its consumer saw what changed and nothing else: d, which it followed, then, from the
    // take-over, the deletions of b and d; no event for a or c, unchanged on the remote.
    let mut seen_events = Vec::new();
    while let Ok(e) = consumer.try_recv() {
        seen_events.push((e.kind.as_str(), e.object.object.key().id.name.to_string()));
    }
    let expected = [("ADDED", "d"), ("DELETED", "b"), ("DELETED", "d")];
    assert_eq!(
        seen_events,
        expected.map(|(k, n)| (k, n.to_owned())),
        "the consumer's events"
    );
    assert_eq!(
        version_of(&follower.view, "a"),
        version_of(&holder.view, "a"),
        "a unchanged"
    );
    // Its own term's base steps above the holder's by the Lease's transitions (7 here).
    let base = |rv: u64| rv >> 40;
    assert_eq!(
        base(follower.view.resource_version()),
        base(holder.view.resource_version()) + 1 + 7
    );
    // The holder's versions it followed still resume, in a term of the follower's own...
    let (after, _) = (follower.view)
        .watch_from(Kind::Service, seen)
        .expect("a followed version resumes after the take-over");
    assert_eq!(after.len(), seen_events.len(), "{after:?}");
    // ...and one the holder served after the follower stopped following is Expired, never a
    // wrong resume.
    holders_remote.send(Change::Apply(service("e"))).await;
    holder.serves(&["a", "b", "c", "d", "e"]).await;
    let later = holder.view.resource_version();
    assert!(later > seen);
    assert_eq!(
        follower.view.watch_from(Kind::Service, later).err(),
        Some(crate::view::ResumeError::Expired)
    );
}

#[tokio::test(start_paused = true)]
async fn a_follower_that_follows_the_holders_quarantine_keeps_following_its_view() {
    let (holder, holders_remote, follower) = holder_and_follower(&["a"]).await;

    // The controller makes a follower follow the quarantine the holder recorded, and its
    // release: the follower's view goes on following the holder's all along.
    follower.quarantine().await.expect("quarantined");
    holders_remote.send(Change::Apply(service("b"))).await;
    holder.serves(&["a", "b"]).await;
    follower.serves(&["a", "b"]).await;
    follower.release().await.expect("released");
    holders_remote.send(Change::Apply(service("c"))).await;
    holder.serves(&["a", "b", "c"]).await;
    follower.serves(&["a", "b", "c"]).await;
    assert_eq!(
        follower.view.resource_version(),
        holder.view.resource_version()
    );
    assert!(
        follower.fake.runs.borrow().is_empty(),
        "a follower starts no watchers, released or not"
    );
}

/// Reading the remote -> following the holder ([`Command::Follow`]): the remote's watchers stop
/// (the mode that held them is let go), and the view follows the holder's.
#[tokio::test(start_paused = true)]
async fn following_the_holder_stops_the_watchers_of_the_remote() {
    let holder = Link::start(0);
    holder.run(1).await.list(&["a", "b"]).await;
    holder.serves(&["a", "b"]).await;
    let mut link = Link::start_with(0, Some(holder.view.clone()));
    let own = link.run(1).await;
    own.list(&["x"]).await;
    link.serves(&["x"]).await;
    assert!(own.is_live());
    (link.commands)
        .send(Command::Follow(super::super::Reconnect(no_credentials())))
        .await
        .expect("the task takes commands");
    link.serves(&["a", "b"]).await;
    link.until("connected to the holder", |s| s.connected).await;
    assert!(!own.is_live(), "the remote's watchers stopped");
}

/// Following the holder -> reading the remote (a take-over): the follower is aborted, so the
/// holder's view loses its one subscriber, and the link's own watchers start.
#[tokio::test(start_paused = true)]
async fn taking_over_stops_following_the_holder() {
    let (holder, _holders_remote, follower) = holder_and_follower(&["a"]).await;
    assert!(
        holder.view.watched(),
        "the follower subscribes to the holder's view"
    );
    (follower.commands)
        .send(Command::Reconnect(
            super::super::Reconnect(no_credentials()),
            crate::view::replica::NewTerm { step: 1, above: 0 },
        ))
        .await
        .expect("the task takes commands");
    let run = follower.run(1).await;
    assert!(run.is_live(), "its own watchers run");
    let mut let_go = false;
    for _ in 0..600 {
        if !holder.view.watched() {
            let_go = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(let_go, "the follower still follows the holder's view");
}
