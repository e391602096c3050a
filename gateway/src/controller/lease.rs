//! One `coordination.k8s.io` Lease per link (`floodgate-link-<name>`): the holder writes the
//! link's status and makes its quarantine decisions; every replica serves its view.
//!
//! A small lease loop on kube's `Api<Lease>`: get, then create (absent), update with the
//! resourceVersion read (ours, or expired), or leave it (someone else's, live). A conflict is
//! a lost race. Which links this replica holds is published on a `watch` channel; a link whose
//! renewal fails, or is older than the lease duration, leaves the set at once, so the status
//! writer stops before another replica can take over. A replica that drains gives its Leases
//! back ([`give_back`]), and the others, watching the Leases, take them at once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::store::Writer;
use tokio::sync::watch;

/// What the name of every link's Lease starts with.
const LEASE_PREFIX: &str = "floodgate-link-";

/// The Lease of a link.
pub fn lease_name(link: &str) -> String {
    format!("{LEASE_PREFIX}{link}")
}

/// How long a holder's claim lasts without renewal, and how often it renews.
#[derive(Clone, Copy, Debug)]
pub struct LeaseTiming {
    /// `leaseDurationSeconds`.
    pub duration: Duration,
    /// Time between renewals; well under `duration` so one slow renewal loses nothing.
    pub renew: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew: Duration::from_secs(5),
        }
    }
}

/// What to do with a Lease as found.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Ours: renew it.
    Renew,
    /// Free or expired: take it.
    Take,
    /// Another replica's, still live.
    Leave,
}

/// Decides, from the Lease's spec, who may hold it at `now`.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: jiff::Timestamp) -> Decision {
    let Some(spec) = spec else {
        return Decision::Take;
    };
    match spec.holder_identity.as_deref() {
        Some(h) if h == identity => Decision::Renew,
        None | Some("") => Decision::Take,
        Some(_) => {
            let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15));
            let renewed = spec
                .renew_time
                .as_ref()
                .or(spec.acquire_time.as_ref())
                .map(|t| t.0);
            match renewed {
                Some(t) if t + jiff::SignedDuration::from_secs(secs) > now => Decision::Leave,
                _ => Decision::Take,
            }
        }
    }
}

/// Who claims the Leases: this replica's identity, and where the other replicas reach its
/// facade (written on the Leases it holds, [`FACADE_ANNOTATION`]).
#[derive(Clone, Debug)]
pub struct Claimant {
    /// The holder identity (the pod's name).
    pub identity: String,
    /// The facade's `host:port`, if the replicas may follow this one.
    pub facade: Option<String>,
}

/// Tries once to hold `link`'s Lease as `me`, recording `view_base` (the base of the
/// versions this replica's view of the link serves, [`VIEW_BASE_ANNOTATION`]) when known.
/// `Ok(true)`: held until `now + duration`.
pub async fn try_hold(
    api: &Api<Lease>,
    link: &str,
    me: &Claimant,
    timing: LeaseTiming,
    view_base: Option<u64>,
) -> Result<bool, kube::Error> {
    try_hold_named(api, lease_name(link), me, timing, view_base).await
}

async fn try_hold_named(
    api: &Api<Lease>,
    name: String,
    me: &Claimant,
    timing: LeaseTiming,
    view_base: Option<u64>,
) -> Result<bool, kube::Error> {
    let (identity, facade) = (me.identity.as_str(), me.facade.as_deref());
    let now = jiff::Timestamp::now();
    let duration = i32::try_from(timing.duration.as_secs()).unwrap_or(i32::MAX);
    let existing = api.get_opt(&name).await?;
    let decision = decide(
        existing.as_ref().and_then(|l| l.spec.as_ref()),
        identity,
        now,
    );
    let result = match (existing, decision) {
        (_, Decision::Leave) => return Ok(false),
        (None, _) => {
            let mut annotations = std::collections::BTreeMap::new();
            annotate(&mut annotations, facade, view_base);
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    annotations: Some(annotations).filter(|a| !a.is_empty()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(identity.to_owned()),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        (Some(mut lease), d) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if d == Decision::Take {
                spec.holder_identity = Some(identity.to_owned());
                spec.acquire_time = Some(MicroTime(now));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.renew_time = Some(MicroTime(now));
            spec.lease_duration_seconds = Some(duration);
            let annotations = lease
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            annotate(annotations, facade, view_base);
            // The resourceVersion read makes this a compare-and-swap: a 409 is a lost race.
            api.replace(&name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
    };
    match result {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Writes a holder's annotations: its facade (removed when it has none) and the base of its
/// view's versions, never below the one recorded. A replica that takes the Lease holds its
/// view's base from before its take-over (its own, maybe below the last holder's, when it
/// never followed it) until the take-over begins its term above the recorded one: written as
/// it is, it would lower the mark its own take-over reads.
fn annotate(
    annotations: &mut std::collections::BTreeMap<String, String>,
    facade: Option<&str>,
    view_base: Option<u64>,
) {
    match facade {
        Some(f) => annotations.insert(FACADE_ANNOTATION.to_owned(), f.to_owned()),
        None => annotations.remove(FACADE_ANNOTATION),
    };
    let recorded = (annotations.get(VIEW_BASE_ANNOTATION)).and_then(|b| b.parse::<u64>().ok());
    if let Some(base) = view_base.filter(|b| recorded.is_none_or(|r| *b > r)) {
        annotations.insert(VIEW_BASE_ANNOTATION.to_owned(), base.to_string());
    }
}

/// Gives a held Lease back: empties its holder and shortens it to a second, so another
/// replica takes it at once (it learns of it from its watch of the Leases, [`freed`]) instead
/// of after `leaseDurationSeconds`. `Ok(false)`: not ours (any more), left as it is.
pub async fn give_back(api: &Api<Lease>, link: &str, identity: &str) -> Result<bool, kube::Error> {
    give_back_named(api, lease_name(link), identity).await
}

async fn give_back_named(
    api: &Api<Lease>,
    name: String,
    identity: &str,
) -> Result<bool, kube::Error> {
    let Some(mut lease) = api.get_opt(&name).await? else {
        return Ok(false);
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(identity) {
        return Ok(false);
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
    // Compare-and-swap on the resourceVersion read: a 409 means another replica has it now.
    match api.replace(&name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// What the name of every replica's presence Lease starts with: each replica holds one while
/// it runs, so the others know how many share the links.
const REPLICA_PREFIX: &str = "floodgate-replica-";

mod balance;
mod records;

pub use balance::share;
use balance::{loads, over_balance, worth_taking};
pub use records::{
    FACADE_ANNOTATION, VIEW_BASE_ANNOTATION, holder, holder_facade, recorded_view_base,
    transitions_since_taken,
};

/// Yields whenever a link's Lease has no holder (given back by a replica that drains, or new):
/// the replicas that want it try at once rather than at their next renewal. The Leases seen
/// are kept in `seen`'s store, where the admin API reads who holds each.
fn freed(api: Api<Lease>, seen: Writer<Lease>) -> impl futures_util::Stream<Item = ()> + Send {
    use futures_util::StreamExt as _;
    use kube::runtime::WatchStreamExt as _;
    let watch = kube::runtime::watcher(api, kube::runtime::watcher::Config::default());
    kube::runtime::reflector(seen, watch)
        .default_backoff()
        .applied_objects()
        .filter_map(|lease| async move {
            let lease = lease.ok()?;
            let ours = lease
                .metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(LEASE_PREFIX));
            let free = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .is_none_or(str::is_empty);
            (ours && free).then_some(())
        })
}

/// What the controller tells the lease loop.
#[derive(Debug)]
pub struct Links {
    /// The links whose Leases this replica wants: every Link's.
    pub links: watch::Receiver<BTreeSet<String>>,
    /// The links whose remote this replica reads now: a Lease handed over goes back only once
    /// its link has stopped reading, so that two replicas never read one remote.
    pub reading: watch::Receiver<BTreeSet<String>>,
    /// The links whose view this replica could go on from as their holder: it reads their
    /// remote, or it holds the whole view of the holder it follows. A free Lease of any other
    /// waits a Lease duration for a replica whose view does ([`balance::worth_taking`]).
    pub synced: watch::Receiver<BTreeSet<String>>,
    /// The base of the versions each link's view serves now, recorded on the Leases this
    /// replica holds ([`VIEW_BASE_ANNOTATION`]).
    pub view_bases: watch::Receiver<BTreeMap<String, u64>>,
}

/// Keeps holding this replica's share of the Leases of the links in `links`, publishing the
/// set held on `held` and the Leases it watches in `seen`'s store. The replicas share the
/// links: each holds a presence Lease, takes free Leases while it holds less than its
/// [`share`], and gives one back per renewal while it holds more (a replica that joins gets
/// its share within a few renewals). Runs until `shutdown`; then it empties `held` (this
/// replica decides no more) and gives back its presence and every Lease it held, so a rolling
/// restart hands each link over at once.
pub async fn run(
    api: Api<Lease>,
    me: Claimant,
    timing: LeaseTiming,
    Links {
        mut links,
        reading,
        mut synced,
        view_bases,
    }: Links,
    held: watch::Sender<BTreeSet<String>>,
    seen: Writer<Lease>,
    mut shutdown: watch::Receiver<bool>,
) {
    use futures_util::StreamExt as _;
    let mut tick = tokio::time::interval(timing.renew);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let leases = seen.as_reader();
    let namespace = api.namespace().unwrap_or_default().to_owned();
    let presence = format!("{REPLICA_PREFIX}{}", me.identity);
    let mut freed = std::pin::pin!(freed(api.clone(), seen));
    // A link over this replica's share, out of `held` since the last renewal (so that its
    // upstream stops reading the remote) and given back at this one.
    let mut leaving: Option<String> = None;
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tick.tick() => {}
            Some(()) = freed.next() => {}
            // A link wanted anew is tried at once, not at the next renewal; so is one whose
            // view has just synced (the Lease handed to it may be free already).
            Ok(()) = links.changed() => {}
            Ok(()) = synced.changed() => {}
        }
        if let Err(e) = try_hold_named(&api, presence.clone(), &me, timing, None).await {
            tracing::warn!(error = %e, "cannot renew this replica's presence Lease");
        }
        let wanted = links.borrow().clone();
        // Links no longer wanted are dropped before anything else.
        held.send_if_modified(|h| {
            let before = h.len();
            h.retain(|l| wanted.contains(l));
            h.len() != before
        });
        let now = jiff::Timestamp::now();
        let others = loads(&leases, &me.identity, now);
        let share = share(wanted.len(), others.len() + 1);
        let fewest_elsewhere = others.values().min().copied();
        if let Some(link) = leaving.take() {
            let still_reading = reading.borrow().contains(&link);
            leaving = hand_over(&api, &me, timing, link, still_reading).await;
        }
        for link in &wanted {
            if leaving.as_ref() == Some(link) {
                continue;
            }
            let mine = held.borrow().contains(link);
            let lease = leases.get(&ObjectRef::new(&lease_name(link)).within(&namespace));
            let load = (held.borrow().len(), share);
            let ours = synced.borrow().contains(link);
            if !mine && !worth_taking(lease.as_deref(), load, fewest_elsewhere, ours, now, timing) {
                continue;
            }
            let started = tokio::time::Instant::now();
            let view_base = view_bases.borrow().get(link).copied();
            let ok = match try_hold(&api, link, &me, timing, view_base).await {
                Ok(ok) => ok,
                Err(e) => {
                    tracing::warn!(%link, error = %e, "cannot renew the link's lease");
                    false
                }
            };
            // A renewal that took longer than the lease lasts proves nothing.
            let ok = ok && started.elapsed() < timing.duration;
            held.send_if_modified(|h| {
                if ok {
                    h.insert(link.clone())
                } else {
                    h.remove(link)
                }
            });
        }
        // More than its share: one Lease back per renewal, for a replica with less to take. It
        // leaves `held` now and its Lease at the next renewal: this replica stops reading its
        // remote in between, so two replicas never read one remote (break before make).
        // One at a time: a link still handed over is not joined by another.
        let n = held.borrow().len();
        let excess = (leaving.is_none() && (n > share || over_balance(n, &others, &me.identity)))
            .then(|| held.borrow().iter().next_back().cloned())
            .flatten();
        if let Some(link) = excess {
            tracing::info!(%link, share, "handing the link over: its Lease goes back at the next renewal");
            held.send_modify(|h| {
                h.remove(&link);
            });
            leaving = Some(link);
        }
    }
    let mut given = held.send_replace(BTreeSet::new());
    given.extend(leaving);
    give_all_back(&api, &me, timing, presence, given, reading).await;
}

/// At shutdown: gives back this replica's presence and the link Leases `given`, once their
/// links have stopped reading their remotes (the controller disconnects them on the same
/// signal), so that whoever takes a Lease is the only one reading; not later than a renewal,
/// after which the Leases go back all the same.
async fn give_all_back(
    api: &Api<Lease>,
    me: &Claimant,
    timing: LeaseTiming,
    presence: String,
    given: BTreeSet<String>,
    mut reading: watch::Receiver<BTreeSet<String>>,
) {
    let stopped = reading.wait_for(|r| r.iter().all(|l| !given.contains(l)));
    if tokio::time::timeout(timing.renew, stopped).await.is_err() {
        tracing::warn!("links still read their remotes: giving their Leases back all the same");
    }
    // The presence first: a replica that sees a link's Lease freed already counts one replica
    // less, so its share covers the link.
    if let Err(e) = give_back_named(api, presence, &me.identity).await {
        tracing::warn!(error = %e, "cannot give this replica's presence Lease back");
    }
    for link in given {
        match give_back(api, &link, &me.identity).await {
            Ok(true) => tracing::info!(%link, "gave the link's Lease back for another replica"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(%link, error = %e, "cannot give the link's Lease back; it expires by itself")
            }
        }
    }
}

/// A renewal of link `link`'s Lease while it is handed over: kept while its link still reads
/// the remote (returned, to try again at the next renewal), given back once it has stopped.
async fn hand_over(
    api: &Api<Lease>,
    me: &Claimant,
    timing: LeaseTiming,
    link: String,
    still_reading: bool,
) -> Option<String> {
    if still_reading {
        if let Err(e) = try_hold(api, &link, me, timing, None).await {
            tracing::warn!(%link, error = %e, "cannot renew the Lease of a link handed over");
        }
        return Some(link);
    }
    match give_back(api, &link, &me.identity).await {
        Ok(true) => {
            tracing::info!(%link, "gave the link's Lease back: this replica holds more than its share")
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(%link, error = %e, "cannot give the link's Lease back"),
    }
    None
}

#[cfg(test)]
mod tests;
