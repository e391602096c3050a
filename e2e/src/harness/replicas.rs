//! Controller replicas as processes (`floodgate controller`, so a replica can be SIGKILLed)
//! against an in-process local cluster and one kube-sim remote behind every Link, with 2 s
//! Leases: what a failover does to a consumer of a follower, and how links spread as
//! replicas come and go, both checked against the remote's own count of the watches it serves.
//! `tests/replicas.rs` asserts on what [`failover`] and [`spread`] return; `scenarios --only
//! replicas` prints it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};
use serde::Serialize;

use crate::cluster::{self, ADMIN_TOKEN, NS, add_link, lease_holder, mk_link, service_names};
use crate::drivers::Cluster;
use crate::local::RunningLocal;
use crate::modes::Mode;
use crate::process::{Floodgate, Launch};
use crate::{RunningSim, until};

/// The replicas' Lease duration (`--lease-duration`), unless [`Fleet::lease`] says otherwise.
pub const LEASE: Duration = Duration::from_secs(2);
/// Their renewal (`--lease-renew`).
const RENEW: Duration = Duration::from_millis(200);

/// A local cluster, a remote, Links to it, and replicas started and SIGKILLed at will.
#[derive(Debug)]
pub struct Fleet {
    /// The local cluster (Links, Secrets, Leases).
    pub local: RunningLocal,
    /// The remote every Link follows.
    pub sim: RunningSim,
    /// The remote's workloads.
    pub cluster: Cluster,
    /// The replicas running, by identity, the first started first.
    pub replicas: Vec<(String, Floodgate)>,
    links: Vec<String>,
    kubeconfig: PathBuf,
    dir: PathBuf,
    lease: (Duration, Duration),
}

impl Fleet {
    /// The local cluster, a remote exporting `web` (two ready pods), and a Link to it for each
    /// of `links`; no replica yet.
    pub async fn start(dir: &Path, links: &[&str]) -> anyhow::Result<Self> {
        let local = RunningLocal::start().await?;
        let (sim, cluster) = cluster::remote(&["web"]).await;
        for name in links {
            add_link(&local, name, &sim, mk_link(name)).await;
        }
        std::fs::create_dir_all(dir)?;
        let kubeconfig = dir.join("local.kubeconfig");
        std::fs::write(&kubeconfig, local.kubeconfig(NS))?;
        Ok(Self {
            local,
            sim,
            cluster,
            replicas: Vec::new(),
            links: links.iter().map(|l| (*l).to_owned()).collect(),
            kubeconfig,
            dir: dir.to_owned(),
            lease: (LEASE, RENEW),
        })
    }

    /// The Lease duration and renewal of the replicas started from now on.
    pub fn lease(&mut self, duration: Duration, renew: Duration) {
        self.lease = (duration, renew);
    }

    /// Starts replica `identity` as the manifests run one (`--peers`, `--advertise-address`),
    /// beside the first replica running, with 2 s Leases renewed every 200 ms unless
    /// [`Self::lease`] set others; ready.
    pub async fn add_replica(&mut self, identity: &str) -> anyhow::Result<()> {
        let launch = Launch::new(Mode::Controller, &self.dir.join(identity))
            .cluster(&self.kubeconfig)
            .identity(identity)
            .admin_token(ADMIN_TOKEN)
            .args([
                format!("--lease-duration={}s", self.lease.0.as_secs()),
                format!("--lease-renew={}ms", self.lease.1.as_millis()),
            ]);
        let launch = match self.replicas.first() {
            Some((_, peer)) => launch.beside(peer),
            None => launch.first_of_peers(),
        };
        let fg = launch.start().await?;
        self.replicas.push((identity.to_owned(), fg));
        Ok(())
    }

    /// SIGKILLs replica `identity`: it gives nothing back, its Leases expire.
    pub async fn kill(&mut self, identity: &str) -> anyhow::Result<()> {
        let i = (self.replicas.iter())
            .position(|(id, _)| id == identity)
            .ok_or_else(|| anyhow::anyhow!("no replica {identity}"))?;
        let (_, mut fg) = self.replicas.remove(i);
        fg.kill().await
    }

    /// Replica `identity`.
    pub fn replica(&self, identity: &str) -> &Floodgate {
        let found = self.replicas.iter().find(|(id, _)| id == identity);
        &found.unwrap_or_else(|| panic!("no replica {identity}")).1
    }

    /// For each link, `<link>: recorded <base>, served <base>`, and ` same` when they agree:
    /// the base of the versions its Lease records for its holder's view, and the base of the
    /// version a list through the holder answers with (a Floodgate version's high bits).
    pub async fn view_bases(&self) -> Vec<String> {
        let mut bases = Vec::new();
        for link in &self.links {
            let recorded = cluster::lease_view_base(&self.local, link);
            let mut served = None;
            let holder = lease_holder(&self.local, link);
            let live = holder.filter(|h| self.replicas.iter().any(|(id, _)| id == h));
            if let Some(holder) = live
                && let Ok(client) = self.consumer(&holder, link).await
            {
                let listed = (Api::<Service>::all(client))
                    .list(&ListParams::default())
                    .await;
                served = (listed.ok())
                    .and_then(|l| l.metadata.resource_version?.parse::<u64>().ok())
                    .map(|rv| rv >> 40 << 40);
            }
            let same = if recorded.is_some() && recorded == served {
                " same"
            } else {
                ""
            };
            bases.push(format!(
                "{link}: recorded {recorded:?}, served {served:?}{same}"
            ));
        }
        bases
    }

    /// Each link's Lease holder, in the order the links were given.
    pub fn holders(&self) -> Vec<Option<String>> {
        (self.links.iter())
            .map(|l| lease_holder(&self.local, l))
            .collect()
    }

    /// Whether every link's Lease is held by a running replica, `replicas` of them holding
    /// at least one each.
    pub fn held_by(&self, replicas: usize) -> bool {
        let live: BTreeSet<&str> = self.replicas.iter().map(|(id, _)| id.as_str()).collect();
        let holders = self.holders();
        let distinct: BTreeSet<&str> = holders.iter().flatten().map(String::as_str).collect();
        holders
            .iter()
            .all(|h| h.as_deref().is_some_and(|h| live.contains(h)))
            && distinct.len() == replicas
    }

    /// A consumer of `link` through replica `identity`'s facade.
    pub async fn consumer(&self, identity: &str, link: &str) -> anyhow::Result<kube::Client> {
        let kubeconfig = self.replica(identity).consumer_kubeconfig_of(link)?;
        crate::gateway::client_from(&kubeconfig).await
    }

    /// Waits until every running replica serves exactly `services` on every link.
    pub async fn all_serve(&self, services: &[&str]) -> anyhow::Result<()> {
        let want: BTreeSet<String> = services.iter().map(|s| (*s).to_owned()).collect();
        let mut clients = Vec::new();
        for (id, _) in &self.replicas {
            for link in &self.links {
                clients.push(self.consumer(id, link).await?);
            }
        }
        until(60, "every replica serves every link", async || {
            for c in &clients {
                if service_names(c).await.as_ref() != Some(&want) {
                    return false;
                }
            }
            true
        })
        .await;
        Ok(())
    }
}

/// The most watches the remote serves at once, sampled every 20 ms from its own count until
/// [`WatchSampler::stop`].
#[derive(Debug)]
pub struct WatchSampler {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<usize>,
}

impl WatchSampler {
    /// Starts sampling `sim`'s open watches.
    pub fn start(sim: &RunningSim) -> Self {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let api = sim.api.clone();
        let task = tokio::spawn(async move {
            let mut most = 0;
            loop {
                most = most.max(api.open_watches());
                tokio::select! {
                    _ = stopped.changed() => return most,
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        });
        Self { stop, task }
    }

    /// The most seen.
    pub async fn stop(self) -> usize {
        self.stop.send_replace(true);
        self.task.await.expect("the sampler")
    }
}

/// The next event of `watch` that is not a bookmark, within `secs`; `None` when none came.
pub async fn next_change<S>(watch: &mut S, secs: u64) -> Option<WatchEvent<Service>>
where
    S: futures_util::Stream<Item = kube::Result<WatchEvent<Service>>> + Unpin,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let event = tokio::time::timeout_at(deadline, watch.next())
            .await
            .ok()??;
        match event {
            Ok(WatchEvent::Bookmark(_)) => {}
            Ok(event) => return Some(event),
            Err(e) => panic!("the watch failed: {e}"),
        }
    }
}

/// `ADDED web`, `ERROR 410 Expired`: what a watch event says, for the report.
pub fn describe(event: &WatchEvent<Service>) -> String {
    match event {
        WatchEvent::Added(s) => format!("ADDED {}", s.metadata.name.as_deref().unwrap_or("")),
        WatchEvent::Modified(s) => format!("MODIFIED {}", s.metadata.name.as_deref().unwrap_or("")),
        WatchEvent::Deleted(s) => format!("DELETED {}", s.metadata.name.as_deref().unwrap_or("")),
        WatchEvent::Bookmark(_) => "BOOKMARK".into(),
        WatchEvent::Error(e) => format!("ERROR {} {}", e.code, e.reason),
    }
}

/// What a consumer of a follower saw while the holder was SIGKILLed.
#[derive(Debug, Serialize)]
pub struct Failover {
    /// The remote's open watches with one replica, and the most at any moment with three,
    /// through the SIGKILL, the take-over and the reconnect.
    pub watches_one_replica: usize,
    /// See above.
    pub watches_most: usize,
    /// From the SIGKILL to another replica holding the Lease.
    pub lease_taken_s: f64,
    /// From the remote change (made right after the SIGKILL) to the consumer's event.
    pub change_reached_s: f64,
    /// The consumer's events up to and including the first, in order: `ADDED api` alone when
    /// nothing but the real change reached it.
    pub events: Vec<String>,
    /// The first event of the watch the consumer reopened on the third replica from its last
    /// version: `ADDED billing` when it resumed there (no 410, no relist).
    pub resumed_on_another: Vec<String>,
    /// Each replica's resource watchers on the remote before the SIGKILL, as its admin API
    /// says (`upstreamWatchers`), the holder first.
    pub upstream_watchers: Vec<(String, u64)>,
}

/// Three replicas and one Link: a consumer watches through a follower from the version of its
/// list; the holder is SIGKILLed and a service is exported on the remote right away; the
/// consumer's watch, never reopened, gets that change; then the consumer reopens its watch on
/// the other replica from the last version it saw and gets the next change there.
pub async fn failover(dir: &Path) -> anyhow::Result<Failover> {
    let mut fleet = Fleet::start(dir, &["east"]).await?;
    fleet.add_replica("floodgate-0").await?;
    until(30, "floodgate-0 holds the Lease", async || fleet.held_by(1)).await;
    fleet.all_serve(&["web"]).await?;
    let watches_one_replica = fleet.sim.api.open_watches();
    let sampler = WatchSampler::start(&fleet.sim);
    fleet.add_replica("floodgate-1").await?;
    fleet.add_replica("floodgate-2").await?;
    fleet.all_serve(&["web"]).await?;
    let holder = fleet.holders()[0].clone().expect("a holder");
    let mut followers = (fleet.replicas.iter())
        .map(|(id, _)| id.clone())
        .filter(|id| *id != holder);
    let (on, other) = (
        followers.next().expect("one"),
        followers.next().expect("two"),
    );
    let mut upstream_watchers = Vec::new();
    for id in [&holder, &on, &other] {
        let link = crate::admin::link(fleet.replica(id).admin, "east").await;
        let n = link.and_then(|l| l["counters"]["upstreamWatchers"].as_u64());
        upstream_watchers.push((id.clone(), n.unwrap_or(u64::MAX)));
    }

    let services: Api<Service> = Api::all(fleet.consumer(&on, "east").await?);
    let listed = services.list(&ListParams::default()).await?;
    let rv = listed.metadata.resource_version.unwrap_or_default();
    let params = WatchParams::default().timeout(290);
    let mut watch = services.watch(&params, &rv).await?.boxed();

    let killed = Instant::now();
    fleet.kill(&holder).await?;
    fleet.cluster.add_service("api", true);
    fleet.cluster.scale("api", 2, true);
    let changed = Instant::now();
    let taken = {
        let local = &fleet.local;
        let (holder, live) = (holder.clone(), [on.clone(), other.clone()]);
        async move {
            until(30, "another replica takes the Lease", async || {
                lease_holder(local, "east").is_some_and(|h| h != holder && live.contains(&h))
            })
            .await;
            killed.elapsed()
        }
    };
    let reached = async {
        let mut events = Vec::new();
        let mut last_rv = None;
        while let Some(e) = next_change(&mut watch, LEASE.as_secs() + 10).await {
            events.push(describe(&e));
            if let WatchEvent::Added(s) = &e {
                last_rv = s.metadata.resource_version.clone();
            }
            if events.last().is_some_and(|d| d == "ADDED api") || events.len() >= 5 {
                break;
            }
        }
        (events, changed.elapsed(), last_rv)
    };
    let (lease_taken, (events, change_reached, last_rv)) = tokio::join!(taken, reached);
    drop(watch);

    // Reconnected elsewhere from the last version seen.
    let elsewhere: Api<Service> = Api::all(fleet.consumer(&other, "east").await?);
    let last_rv = last_rv.unwrap_or(rv);
    let mut resumed = elsewhere.watch(&params, &last_rv).await?.boxed();
    fleet.cluster.add_service("billing", true);
    fleet.cluster.scale("billing", 2, true);
    let resumed_on_another = next_change(&mut resumed, 20)
        .await
        .iter()
        .map(describe)
        .collect();
    drop(resumed);
    fleet.all_serve(&["api", "billing", "web"]).await?;
    let watches_most = sampler.stop().await;
    Ok(Failover {
        watches_one_replica,
        watches_most,
        lease_taken_s: lease_taken.as_secs_f64(),
        change_reached_s: change_reached.as_secs_f64(),
        events,
        resumed_on_another,
        upstream_watchers,
    })
}

/// How four Links spread over replicas that come and go.
#[derive(Debug, Serialize)]
pub struct Spread {
    /// The remote's open watches with one replica holding the four links.
    pub watches_one_replica: usize,
    /// The most at any moment from the second replica's start to the end.
    pub watches_most: usize,
    /// Each link's holder with three replicas, then four, then after the SIGKILL.
    pub holders: Vec<Vec<Option<String>>>,
    /// From the fourth replica ready to it holding a link.
    pub joined_s: f64,
    /// From the SIGKILL of a replica to its link held by another.
    pub moved_s: f64,
    /// What each consumer watching a link through a replica that lived to the end saw first
    /// after a remote change made at the end (`<replica>/<link>: ADDED api` when its watch,
    /// opened before the fourth replica joined, lasted through the hand-over and the SIGKILL).
    pub consumers: Vec<String>,
    /// Each link's Lease at the end: `<link>: recorded <base>, served <base>`, the base of
    /// the versions its Lease records for the holder's view, and the base of the version a
    /// list through the holder answers with.
    pub view_bases: Vec<String>,
}

/// Four Links: one replica, then three (the links 2, 1, 1), then a fourth that takes one link
/// from the replica holding two, then one of the four SIGKILLed and its link taken by another;
/// every replica serves every link at the end. Consumers of every link through each of the
/// three first replicas watch throughout, and see a remote change made at the end.
pub async fn spread(dir: &Path) -> anyhow::Result<Spread> {
    let mut fleet = Fleet::start(dir, &["east", "west", "north", "south"]).await?;
    fleet.add_replica("floodgate-0").await?;
    until(30, "floodgate-0 holds the four Leases", async || {
        fleet.held_by(1)
    })
    .await;
    fleet.all_serve(&["web"]).await?;
    let watches_one_replica = fleet.sim.api.open_watches();
    let sampler = WatchSampler::start(&fleet.sim);
    fleet.add_replica("floodgate-1").await?;
    fleet.add_replica("floodgate-2").await?;
    until(30, "three replicas hold the links", async || {
        fleet.held_by(3)
    })
    .await;
    let mut holders = vec![fleet.holders()];
    // A consumer of every link through every replica, watching from its list's version.
    let mut watches = Vec::new();
    for (id, _) in &fleet.replicas {
        for link in &fleet.links {
            let services: Api<Service> = Api::all(fleet.consumer(id, link).await?);
            let listed = services.list(&ListParams::default()).await?;
            let rv = listed.metadata.resource_version.unwrap_or_default();
            let params = WatchParams::default().timeout(290);
            let watch = services.watch(&params, &rv).await?.boxed();
            watches.push((id.clone(), link.clone(), watch));
        }
    }

    fleet.add_replica("floodgate-3").await?;
    let ready = Instant::now();
    until(30, "the fourth replica takes a link", async || {
        fleet.held_by(4)
    })
    .await;
    let joined = ready.elapsed();
    holders.push(fleet.holders());

    // Not floodgate-0: its consumers watch the link it handed over to the fourth.
    let victim = "floodgate-1".to_owned();
    let killed = Instant::now();
    fleet.kill(&victim).await?;
    until(
        30,
        "the SIGKILLed replica's link is held by another",
        async || fleet.held_by(3),
    )
    .await;
    let moved = killed.elapsed();
    holders.push(fleet.holders());
    fleet.all_serve(&["web"]).await?;
    fleet.cluster.add_service("api", true);
    fleet.cluster.scale("api", 2, true);
    let mut consumers = Vec::new();
    for (id, link, mut watch) in watches {
        if id != victim {
            let first = next_change(&mut watch, 20).await;
            let first = first.as_ref().map_or("nothing".into(), describe);
            consumers.push(format!("{id}/{link}: {first}"));
        }
    }
    until(
        30,
        "the remote settles at one replica's watches",
        async || fleet.sim.api.open_watches() == watches_one_replica,
    )
    .await;
    let watches_most = sampler.stop().await;
    let mut view_bases = Vec::new();
    until(
        10,
        "every Lease records its holder's view base",
        async || {
            view_bases = fleet.view_bases().await;
            view_bases.iter().all(|b| b.ends_with(" same"))
        },
    )
    .await;
    Ok(Spread {
        watches_one_replica,
        watches_most,
        holders,
        joined_s: joined.as_secs_f64(),
        moved_s: moved.as_secs_f64(),
        consumers,
        view_bases,
    })
}
