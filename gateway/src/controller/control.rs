//! The controller's own loop, a status tick at a time: the Links it reads, the links it runs
//! ([`Runs`]), and where their statuses, the Leases it wants and its readiness go.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use floodgate_link_crd::Link;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::runtime::events::Recorder;
use kube::runtime::reflector;
use tokio::sync::{mpsc, watch};

use super::follow::{decide_if_held, follow_containment, follow_quarantine, record_containment};
use super::runs::Runs;
use super::{commands, status, writer};

/// What the controller's loop tells the lease loop ([`lease::Links`]).
pub(super) struct Wanted {
    /// The links whose Leases this replica wants: every Link's.
    pub(super) links: watch::Sender<BTreeSet<String>>,
    /// The links whose remote this replica reads now.
    pub(super) reading: watch::Sender<BTreeSet<String>>,
    /// The links whose view this replica could go on from as their holder.
    pub(super) synced: watch::Sender<BTreeSet<String>>,
    /// The base of the versions each link's view serves now, recorded on its Lease.
    pub(super) view_bases: watch::Sender<BTreeMap<String, u64>>,
}

/// The controller's loop: the Links it reads, the links it runs, and where their statuses,
/// the Leases it wants and its readiness go.
pub(super) struct Control {
    pub(super) identity: String,
    pub(super) reader: reflector::Store<Link>,
    pub(super) recorder: Recorder,
    pub(super) commands: commands::Commands,
    pub(super) runs: Runs,
    /// What the lease loop is told.
    pub(super) wanted: Wanted,
    /// True once every Link listed has been reconciled (readiness).
    pub(super) listed_tx: watch::Sender<bool>,
    /// The links whose Leases this replica holds.
    pub(super) held: watch::Receiver<BTreeSet<String>>,
    pub(super) status_tx: mpsc::Sender<writer::StatusUpdate>,
}

impl Control {
    /// A status tick: the links of Links gone are stopped, the Leases wanted follow the
    /// Links, and each Link gets its command, its following of the holder and its status.
    pub(super) fn tick(&mut self) {
        if futures_util::FutureExt::now_or_never(self.reader.wait_until_ready())
            .is_none_or(|r| r.is_err())
        {
            return;
        }
        let links = self.reader.state();
        let names: BTreeSet<String> = links.iter().map(|l| l.name_any()).collect();
        self.runs.prune(&names);
        let reading = self.runs.reading_remote();
        let synced = self.runs.synced_views();
        let told = [
            (&self.wanted.links, names),
            (&self.wanted.reading, reading),
            (&self.wanted.synced, synced),
        ];
        for (tx, now) in told {
            tell(tx, now);
        }
        tell(&self.wanted.view_bases, self.runs.view_bases());
        if self.runs.settled(&links) {
            self.listed_tx.send_replace(true);
        }
        let held = self.held.borrow().clone();
        let now = Time(jiff::Timestamp::now());
        let tick = Tick {
            identity: &self.identity,
            held: &held,
            now: &now,
            commands: &self.commands,
            recorder: &self.recorder,
            status_tx: &self.status_tx,
        };
        for link in links {
            tick.link(&link, &mut self.runs);
        }
    }

    /// At shutdown: every link stops reading its remote (the view keeps serving), and the lease
    /// loop is told once they have, within a second.
    pub(super) async fn stop_reading(&mut self) {
        // Through each link's forwarder, so that no switch sent before it lands after it.
        let stop = super::runs::Switch::Stop("the replica is stopping".into());
        for r in self.runs.running.values() {
            r.switch.send_replace(Some(stop.clone()));
        }
        let handles: Vec<_> = (self.runs.running.values())
            .map(|r| r.handle.clone())
            .collect();
        let stopped = async {
            for h in &handles {
                let mut state = h.state.clone();
                let _ = state.wait_for(|s| !s.connected).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), stopped).await;
        self.wanted.reading.send_replace(BTreeSet::new());
    }

    /// The holder wrote a new phase: record it as an Event on the Link.
    pub(super) fn record_phase(&self, ns: &str, change: &writer::PhaseChange) {
        let key = reflector::ObjectRef::new(&change.link).within(ns);
        if let Some(link) = self.reader.get(&key) {
            let note = (self.runs.running.get(&change.link))
                .map(|r| r.handle.state.borrow().message.clone())
                .or_else(|| (self.runs.blocked.get(&change.link)).map(|b| b.message.clone()));
            writer::record_event(&self.recorder, &link, change, note);
        }
    }
}

/// What one status tick shares between the Links it looks at.
struct Tick<'a> {
    /// This replica's identity in Leases.
    identity: &'a str,
    held: &'a BTreeSet<String>,
    now: &'a Time,
    commands: &'a commands::Commands,
    recorder: &'a Recorder,
    status_tx: &'a mpsc::Sender<writer::StatusUpdate>,
}

impl Tick<'_> {
    /// One Link at a status tick: its command, following the holder's decisions, its status.
    fn link(&self, link: &Arc<Link>, runs: &mut Runs) {
        let name = link.name_any();
        if !runs.reconciled(&name) {
            // Nothing to say of it yet: a status written now would erase what the Link
            // records (a quarantine to honour), and a command would find no link.
            return;
        }
        let run = runs.running.get_mut(&name);
        let blocked = runs.blocked.get(&name);
        let state = run.as_ref().map(|r| r.handle.state.borrow().clone());
        let obs = status::Observation {
            generation: link.metadata.generation,
            blocked,
            state: state.as_ref(),
            holder: self.identity,
        };
        let next = status::next_status(link.status.as_ref(), &obs, self.now);
        let holder = self.held.contains(&name);
        self.commands.poll(link, holder, || match &run {
            Some(r) => commands::Target::Running(r.handle.clone()),
            None => commands::Target::Blocked(blocked.map_or_else(
                || "it has not started yet".to_owned(),
                |b| b.message.clone(),
            )),
        });
        let mut deferred = false;
        if let (Some(r), Some(state)) = (run, &state) {
            let following = &mut r.following;
            decide_if_held(&name, following, holder);
            deferred = follow_quarantine(link, following, &r.handle, state, holder);
            follow_containment(link, following, &r.handle, state, holder);
            record_containment(self.recorder, link, following, holder);
        }
        runs.follow_upstream(&name, holder);
        if deferred {
            // The recorded quarantine is still to be followed: writing this link's state
            // now would erase it from status.
            return;
        }
        // A full queue skips this tick: the next carries the latest state.
        let _ = self.status_tx.try_send(writer::StatusUpdate {
            link: name,
            observed: link.status.clone(),
            status: next,
        });
    }
}

/// Sends `now` to the lease loop when it differs from what it was told last.
fn tell<T: PartialEq>(tx: &watch::Sender<T>, now: T) {
    tx.send_if_modified(|was| {
        let changed = *was != now;
        *was = now;
        changed
    });
}
