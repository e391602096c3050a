//! What a publication waits for before and after it reaches the view: the pods and Endpoints
//! its consumers will look up ([`Publisher::awaits`], at most [`super::AWAIT`]), and its later
//! stages ([`super::stages`]: pods lead the endpoints that name them by [`super::stages::LEAD`]).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::desired::{Desired, referred};
use super::stages::{self, Stage};
use super::{AWAIT, Publisher};
use crate::churn::Fetch;
use crate::churn::store::Store;
use crate::model::wanted::{PodHash, PodSet};
use crate::model::{Group, NsName};
use crate::view::Change as ViewChange;

impl Publisher {
    /// Whether `desired` waits before it is published for what its consumers will look up:
    /// - pods its ready endpoints name that the endpoints it published did not name as ready
    ///   (an endpoint published already is not held back again), that the store lacks and that
    ///   a fetch or the pod watcher's list is bringing. The group then wants them too (the
    ///   fetch is asked);
    /// - for a Service entering the view, the Endpoints the remote's controller writes for a
    ///   Service with a selector (Linkerd's service mirror reads them when it handles the
    ///   Service's `ADDED`, and ignores an Endpoints `ADDED` after it).
    ///
    /// Nothing is published meanwhile; `Some` holds the fetch to ask. A group waits [`AWAIT`]
    /// at most from its first wait.
    pub(super) fn awaits(
        &mut self,
        g: &Group,
        desired: &Desired,
        store: &mut Store,
        now: Instant,
    ) -> Option<Option<Fetch>> {
        let (since, _) = *self.awaiting.entry(g.clone()).or_insert((now, false));
        if now >= since + AWAIT {
            self.awaiting.remove(g);
            return None;
        }
        let endpoints = match g {
            Group::Service(svc) => {
                self.endpoints_followed
                    && !self.has_published(g)
                    && store.endpoints_of(svc).is_none()
                    && store.service(svc).is_some_and(|s| {
                        let spec = s.spec.as_ref();
                        spec.and_then(|s| s.selector.as_ref())
                            .is_some_and(|sel| !sel.is_empty())
                    })
            }
            Group::Servers(_) | Group::LinkerdConfig => false,
        };
        // Pods the endpoints it published named as ready already wait for nothing more.
        let mut named: BTreeMap<NsName, bool> = BTreeMap::new();
        if !desired.unresolved.is_empty()
            && let Some(p) = self.groups.get(g)
        {
            referred(&p.slices, p.endpoints_object.as_ref(), &mut named);
        }
        let new: Vec<NsName> = (desired.unresolved.iter())
            .filter(|p| named.get(*p) != Some(&true))
            .cloned()
            .collect();
        let previous = self.groups.get(g).map(|p| &p.pods);
        if new.is_empty() && !endpoints {
            self.awaiting.remove(g);
            return None;
        }
        // Wanted from now on (with what the group wanted before, which it still publishes),
        // so the pod watcher sends them and a fetch is asked.
        let before = previous.into_iter().flat_map(PodSet::iter);
        let pods: PodSet = (desired.pods.iter().map(PodHash::of_id))
            .chain(before)
            .collect();
        self.set_pod_hashes(g, pods, store);
        // Every pod it lacks, as a publication asks (the not-ready endpoints' too).
        let missing = (desired.pods.iter())
            .filter(|p| store.pod(p).is_none())
            .cloned()
            .collect();
        let fetch = self.request_pods(missing);
        if !endpoints && !new.iter().any(|p| self.wanted.coming(p)) {
            self.awaiting.remove(g);
            return None;
        }
        Some(fetch)
    }

    /// The groups waiting for pods ([`Self::publish`] with `wait`) that `pod` is one of, or
    /// every waiting group (`None`): to be published again now that it came or is known
    /// absent.
    pub fn awaiting(&self, pod: Option<&NsName>) -> Vec<Group> {
        let wanting = pod.map(|p| self.wanted.by(p));
        (self.awaiting.keys())
            .filter(|g| match (g, wanting) {
                (_, None) => true,
                (Group::Service(svc), Some(by)) => by.contains(svc),
                (Group::Servers(_) | Group::LinkerdConfig, Some(_)) => false,
            })
            .cloned()
            .collect()
    }

    /// True while the group's publication waits ([`Self::publish`] with `wait`).
    pub fn is_awaiting(&self, g: &Group) -> bool {
        self.awaiting.contains_key(g)
    }

    /// Groups whose wait ended by `now`, once each: they publish what they have.
    pub fn awaited_too_long(&mut self, now: Instant) -> Vec<Group> {
        (self.awaiting.iter_mut())
            .filter(|(_, (since, over))| !*over && now >= *since + AWAIT)
            .map(|(g, (_, over))| {
                *over = true;
                g.clone()
            })
            .collect()
    }

    /// When the next stage of a publication is due, or a wait for pods ends.
    pub fn next_deadline(&self) -> Option<Instant> {
        let tails = self.tails.values().map(|t| t.due);
        let waits = (self.awaiting.values())
            .filter(|(_, over)| !over)
            .map(|(since, _)| *since + AWAIT);
        tails.chain(waits).min()
    }

    /// How long after `now` a group's last publication is out whole: its stages still to
    /// apply, a [`stages::LEAD`] each at most.
    pub fn out_within(&self, g: &Group, now: Instant) -> Duration {
        self.tails.get(g).map_or(Duration::ZERO, |t| {
            let later = t.stages.len().saturating_sub(1) as u32;
            t.due.saturating_duration_since(now) + stages::LEAD * later
        })
    }

    /// Until when a group's last publication still has stages to apply: it is not published
    /// again before.
    pub fn busy_until(&self, g: &Group) -> Option<Instant> {
        self.tails.get(g).map(|t| t.due)
    }

    /// Applies the stages due by `now`.
    pub fn apply_due(&mut self, now: Instant) {
        let due: Vec<Group> = (self.tails.iter())
            .filter(|(_, t)| t.due <= now)
            .map(|(g, _)| g.clone())
            .collect();
        for g in due {
            if let Some(tail) = self.tails.remove(&g) {
                self.apply_stages(g, tail.stages, tail.due, true, stages::LEAD);
            }
        }
    }

    /// Applies every stage waiting, at once and in order, and waits for no pod any more (the
    /// view freezes, or is taken over).
    pub fn flush(&mut self) {
        self.awaiting.clear();
        for (g, tail) in std::mem::take(&mut self.tails) {
            self.apply_stages(g, tail.stages, tail.due, false, stages::LEAD);
        }
    }

    /// Applies a group's stages from `now` ([`stages::apply`], `entering` the lead of a pod new
    /// to the view); what must wait is kept. A deletion of an object some group publishes
    /// again since is dropped.
    pub(super) fn apply_stages(
        &mut self,
        g: Group,
        stages: VecDeque<(Stage, Vec<ViewChange>)>,
        now: Instant,
        staged: bool,
        entering: Duration,
    ) -> bool {
        let refs = &self.obj_refs;
        let keep = |c: &ViewChange| !matches!(c, ViewChange::Delete(k) if refs.contains_key(k));
        let (tail, produced) = stages::apply(&self.view, stages, now, staged, entering, keep);
        if let Some(tail) = tail {
            self.tails.insert(g, tail);
        }
        produced
    }
}
