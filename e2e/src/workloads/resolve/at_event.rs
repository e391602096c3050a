//! A consumer that resolves at the event, as Linkerd's destination does: a Pod watcher and an
//! EndpointSlice watcher, each in a task of its own (two informers), and on every slice event
//! each ready endpoint's pod is looked up in the pods held *at that moment*. A miss is an
//! address lost until that slice's next event ("Unable to create new address"); nothing looks
//! again before it. What [`super::Resolver`] judges once the view settles, this judges at every
//! event, which is what the destination's proxies see.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::task::JoinHandle;

/// What the resolver has seen, shared by its two watchers.
#[derive(Debug, Default)]
struct Seen {
    /// Pods held (`namespace/name`).
    pods: HashSet<String>,
    /// The pods of a relist in progress: they replace `pods` when it is done.
    relisted: Option<HashSet<String>>,
    /// Whether each watcher (pods, slices) has completed a list.
    listed: (bool, bool),
    /// The slices held: resolved again, not judged, once both watchers have listed (as a
    /// proxy's subscription after the start resolves what the caches hold then).
    held_slices: HashMap<String, EndpointSlice>,
    /// Per slice (`namespace/name`): its service and the addresses (pod `namespace/name`) it
    /// resolved at its last event.
    slices: HashMap<String, (String, BTreeSet<String>)>,
    /// Addresses lost at a slice event, by service: each (slice event, endpoint) whose pod was
    /// not held.
    lost: BTreeMap<String, u64>,
    /// The pods of the lost addresses, by service, as first lost (for the failure message).
    lost_pods: BTreeMap<String, Vec<String>>,
    /// Slice events handled.
    slice_events: u64,
    /// When each address (service, pod) was first resolved.
    resolved_at: HashMap<(String, String), Instant>,
}

/// Two watchers of one client, resolving at every slice event (see the module's docs).
#[derive(Debug)]
pub struct EventResolver {
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for EventResolver {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl EventResolver {
    /// Starts the two watchers on every namespace of `client`.
    pub fn start(client: Client) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let pods = {
            let seen = seen.clone();
            let api: Api<Pod> = Api::all(client.clone());
            tokio::spawn(async move {
                let mut events = watcher(api, watcher::Config::default()).boxed();
                while let Some(ev) = events.next().await {
                    let Ok(ev) = ev else { continue };
                    let mut s = seen.lock().unwrap_or_else(PoisonError::into_inner);
                    match ev {
                        watcher::Event::Apply(p) => {
                            s.pods.insert(key(&p.metadata));
                        }
                        watcher::Event::InitApply(p) => {
                            let k = key(&p.metadata);
                            s.relisted.get_or_insert_default().insert(k.clone());
                            s.pods.insert(k);
                        }
                        watcher::Event::Delete(p) => {
                            s.pods.remove(&key(&p.metadata));
                        }
                        watcher::Event::Init => s.relisted = Some(HashSet::new()),
                        watcher::Event::InitDone => {
                            if let Some(pods) = s.relisted.take() {
                                s.pods = pods;
                            }
                            s.listed.0 = true;
                            s.both_listed();
                        }
                    }
                }
            })
        };
        let slices = {
            let seen = seen.clone();
            let api: Api<EndpointSlice> = Api::all(client);
            tokio::spawn(async move {
                let mut events = watcher(api, watcher::Config::default()).boxed();
                while let Some(ev) = events.next().await {
                    let Ok(ev) = ev else { continue };
                    let mut s = seen.lock().unwrap_or_else(PoisonError::into_inner);
                    match ev {
                        watcher::Event::Apply(sl) => s.resolve(&sl, Instant::now(), true),
                        // Both informers list at once at the start: a slice listed before its
                        // pod is the start's race, direct as through a gateway, not judged.
                        watcher::Event::InitApply(sl) => s.resolve(&sl, Instant::now(), false),
                        watcher::Event::Delete(sl) => {
                            s.slices.remove(&key(&sl.metadata));
                            s.held_slices.remove(&key(&sl.metadata));
                        }
                        watcher::Event::Init => {}
                        watcher::Event::InitDone => {
                            s.listed.1 = true;
                            s.both_listed();
                        }
                    }
                }
            })
        };
        Self {
            seen,
            tasks: vec![pods, slices],
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The addresses (pod `namespace/name`) of `service` (`namespace/name`) resolved now.
    pub fn held(&self, service: &str) -> BTreeSet<String> {
        let s = self.seen();
        (s.slices.values())
            .filter(|(svc, _)| svc == service)
            .flat_map(|(_, pods)| pods.iter().cloned())
            .collect()
    }

    /// Waits until both watchers have listed, up to `within`.
    pub async fn synced(&self, within: Duration) -> anyhow::Result<()> {
        let end = tokio::time::Instant::now() + within;
        while self.seen().listed != (true, true) {
            if tokio::time::Instant::now() >= end {
                anyhow::bail!("the resolver's watchers did not list within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// Addresses lost at a slice event, every service.
    pub fn lost(&self) -> u64 {
        self.seen().lost.values().sum()
    }

    /// The lost addresses, by service, with the pods first lost.
    pub fn lost_by_service(&self) -> BTreeMap<String, (u64, Vec<String>)> {
        let s = self.seen();
        (s.lost.iter())
            .map(|(svc, n)| (svc.clone(), (*n, s.lost_pods[svc].clone())))
            .collect()
    }

    /// Slice events handled.
    pub fn slice_events(&self) -> u64 {
        self.seen().slice_events
    }

    /// When the address of `pod` (`namespace/name`) in `service` was first resolved.
    pub fn resolved_at(&self, service: &str, pod: &str) -> Option<Instant> {
        let key = (service.to_owned(), pod.to_owned());
        self.seen().resolved_at.get(&key).copied()
    }

    /// Waits until `service` holds exactly `pods` (`namespace/name`), up to `within`.
    pub async fn wait_for(
        &self,
        service: &str,
        pods: &BTreeSet<String>,
        within: Duration,
    ) -> anyhow::Result<()> {
        let end = tokio::time::Instant::now() + within;
        loop {
            let held = self.held(service);
            if &held == pods {
                return Ok(());
            }
            if tokio::time::Instant::now() >= end {
                anyhow::bail!(
                    "{service} holds {} addresses, not the {} wanted: missing {:?}, extra {:?}; lost {:?}",
                    held.len(),
                    pods.len(),
                    pods.difference(&held).collect::<Vec<_>>(),
                    held.difference(pods).collect::<Vec<_>>(),
                    self.lost_by_service(),
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Seen {
    /// Once both watchers have listed: every slice held is resolved against the pods held.
    fn both_listed(&mut self) {
        if self.listed == (true, true) {
            let slices: Vec<EndpointSlice> = self.held_slices.values().cloned().collect();
            for sl in &slices {
                self.resolve(sl, Instant::now(), false);
            }
        }
    }

    /// A slice event: every ready endpoint (ready true or unset) is resolved against the pods
    /// held now; the slice's addresses become those resolved. `judged`: a miss counts as lost.
    fn resolve(&mut self, slice: &EndpointSlice, now: Instant, judged: bool) {
        self.slice_events += 1;
        let meta = &slice.metadata;
        let Some((service, endpoints)) = super::ready_endpoints(slice) else {
            return;
        };
        let mut resolved = BTreeSet::new();
        for (pod_ns, pod) in endpoints.into_iter().flatten() {
            let pod = format!("{pod_ns}/{pod}");
            if self.pods.contains(&pod) {
                (self.resolved_at)
                    .entry((service.clone(), pod.clone()))
                    .or_insert(now);
                resolved.insert(pod);
            } else if judged {
                *self.lost.entry(service.clone()).or_default() += 1;
                let first = self.lost_pods.entry(service.clone()).or_default();
                if first.len() < 10 {
                    first.push(pod);
                }
            }
        }
        self.slices.insert(key(meta), (service, resolved));
        self.held_slices.insert(key(meta), slice.clone());
    }
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}
