//! The Lease holder's side of [`crate::command`]: it acts on the command a Link carries,
//! records an Event naming where the command came from, and clears it with its result.
//! Replicas that do not hold the Lease leave commands alone (their engines follow the
//! holder's record in status, which the command changes). A replica's admin API passes a
//! command it does not decide on to the holder through [`LinkRelay`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use floodgate_link_crd::Link;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1 as events;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource as _, ResourceExt as _};

use super::context::{Shared, Upstream};
use crate::command::{self, COMMAND, COMMAND_FROM, COMMAND_RESULT, Order, Outcome};
use crate::link::LinkHandle;

/// What a link is to this replica when a command for it arrives.
#[derive(Debug)]
pub enum Target {
    /// It runs here.
    Running(Arc<LinkHandle>),
    /// It does not run: its spec or its Secrets are wrong (the message says how).
    Blocked(String),
}

/// A command seen on a Link: its text and sender.
type Key = (String, Option<String>);

#[derive(Debug)]
enum Slot {
    /// Being carried out.
    Acting(Key),
    /// Carried out, with this result; the clearing patch has not landed yet.
    Done(Key, Outcome),
}

/// The holder's command handling for every link of one controller.
#[derive(Clone)]
pub struct Commands {
    api: Api<Link>,
    identity: String,
    slots: Arc<Mutex<HashMap<String, Slot>>>,
}

impl std::fmt::Debug for Commands {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Commands")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl Commands {
    /// Commands for the Links of `api`, decided by replica `identity`.
    pub fn new(api: Api<Link>, identity: String) -> Self {
        Self {
            api,
            identity,
            slots: Arc::default(),
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        // Every change is one map call: a poisoned lock still holds a consistent map.
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Looks at `link`'s command, if it has one, and acts on it when this replica holds the
    /// link's Lease. Called on every status tick; a command is carried out once, and its
    /// clearing is retried until it lands.
    pub fn poll(&self, link: &Link, holder: bool, target: impl FnOnce() -> Target) {
        let name = link.name_any();
        let Some(key) = command::pending(link.metadata.annotations.as_ref()) else {
            self.slots().remove(&name);
            return;
        };
        if !holder {
            return;
        }
        let retry = match self.slots().get(&name) {
            Some(Slot::Acting(k)) if *k == key => return,
            Some(Slot::Done(k, outcome)) if *k == key => Some(outcome.clone()),
            _ => None,
        };
        let this = self.clone();
        let link = link.clone();
        if let Some(outcome) = retry {
            tokio::spawn(async move { this.clear(&link, &key, outcome).await });
            return;
        }
        self.slots().insert(name, Slot::Acting(key.clone()));
        let target = target();
        tokio::spawn(async move {
            let outcome = this.act(&link, &key, target).await;
            this.record(&link, &outcome);
            this.clear(&link, &key, outcome).await;
        });
    }

    async fn act(&self, link: &Link, (text, from): &Key, target: Target) -> Outcome {
        let origin = from
            .clone()
            .unwrap_or_else(|| format!("the {COMMAND} annotation (no {COMMAND_FROM} given)"));
        let (code, message) = match (text.parse::<Order>(), target) {
            (Err(e), _) => (400, format!("the command cannot be read: {e}")),
            (Ok(_), Target::Blocked(why)) => (503, format!("the link is not running: {why}")),
            (Ok(order), Target::Running(handle)) => {
                let by = format!("an operator through {origin}");
                let answer = tokio::time::timeout(
                    crate::command::COMMAND_TIMEOUT,
                    order.apply(&handle, &by),
                )
                .await;
                match answer {
                    Ok(Ok(t)) => (200, t.message),
                    Ok(Err(e)) => (command::refusal_code(&e), e.to_string()),
                    Err(_) => (503, "the link did not answer in time".to_owned()),
                }
            }
        };
        if code == 200 {
            tracing::info!(link = %link.name_any(), command = %text, from = %origin, %message, "command carried out");
        } else {
            tracing::warn!(link = %link.name_any(), command = %text, from = %origin, code, %message, "command refused");
        }
        Outcome {
            command: text.clone(),
            from: from.clone(),
            code,
            message,
            decided_by: self.identity.clone(),
            at: jiff::Timestamp::now().to_string(),
        }
    }

    /// An Event on the Link: Normal when the command was carried out, Warning when refused.
    /// One Event per command, under a name of its own: kube's Recorder folds Events of one
    /// reason and action into a series that keeps the first Event's note, so a second release
    /// showed the first sender's name.
    fn record(&self, link: &Link, outcome: &Outcome) {
        let ev = command_event(link, outcome, &self.identity);
        let events: Api<events::Event> = Api::namespaced(
            self.api.clone().into_client(),
            link.namespace().as_deref().unwrap_or("default"),
        );
        tokio::spawn(async move {
            if let Err(e) = events.create(&PostParams::default(), &ev).await {
                tracing::warn!(error = %e, "cannot record an Event");
            }
        });
    }

    /// Removes the command and writes its result, only if the Link still carries this very
    /// command (one written meanwhile is left for the next poll).
    async fn clear(&self, link: &Link, (text, from): &Key, outcome: Outcome) {
        let name = link.name_any();
        let path = |key: &str| format!("/metadata/annotations/{}", key.replace('/', "~1"));
        let mut ops = vec![
            serde_json::json!({"op": "test", "path": path(COMMAND), "value": text}),
            serde_json::json!({"op": "remove", "path": path(COMMAND)}),
        ];
        if let Some(from) = from {
            ops.push(serde_json::json!({"op": "test", "path": path(COMMAND_FROM), "value": from}));
            ops.push(serde_json::json!({"op": "remove", "path": path(COMMAND_FROM)}));
        }
        let result = serde_json::to_string(&outcome).unwrap_or_default();
        ops.push(serde_json::json!({"op": "add", "path": path(COMMAND_RESULT), "value": result}));
        let patch: Result<json_patch::Patch, _> = serde_json::from_value(ops.into());
        let written = match patch {
            Ok(p) => self
                .api
                .patch(&name, &PatchParams::default(), &Patch::<()>::Json(p))
                .await
                .map(|_| ()),
            Err(e) => {
                tracing::error!(link = %name, error = %e, "building the command's clearing patch");
                return;
            }
        };
        match written {
            Ok(()) => tracing::debug!(link = %name, command = %text, "command cleared"),
            // 422: the command changed meanwhile (the new one is the next poll's), or our cache
            // was behind and it was cleared already.
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 404 => {
                tracing::debug!(link = %name, command = %text, "the command was no longer there to clear");
            }
            Err(e) => {
                tracing::warn!(link = %name, command = %text, error = %e, "cannot clear a command; retrying at the next tick");
            }
        }
        // Kept until a poll sees the Link without this command, so a cache that lags behind
        // the clearing never has it carried out twice.
        self.slots()
            .insert(name, Slot::Done((text.clone(), from.clone()), outcome));
    }
}

/// Carries a command sent to this replica's admin API to the link's Lease holder, through the
/// Link, whichever replica holds it (this one too): every command is decided, recorded in an
/// Event and answered on one path.
#[derive(Debug)]
pub(super) struct LinkRelay {
    pub(super) base: Shared,
    pub(super) link: String,
    /// Where the link reads its remote's objects from on this replica.
    pub(super) reads_from: tokio::sync::watch::Receiver<Upstream>,
}

impl crate::registry::Relay for LinkRelay {
    fn holder(&self) -> Option<String> {
        super::lease::holder(&self.base.holders, &self.base.namespace, &self.link)
    }

    fn holds(&self) -> bool {
        self.holder().as_deref() == Some(self.base.identity.as_str())
    }

    fn follows(&self) -> Option<String> {
        match &*self.reads_from.borrow() {
            Upstream::Remote | Upstream::HandingOver => None,
            Upstream::Holder { identity, .. } => Some(identity.clone()),
        }
    }

    fn reads_from(&self) -> String {
        self.reads_from.borrow().to_string()
    }

    fn forward(
        &self,
        order: crate::command::Order,
    ) -> futures_util::future::BoxFuture<
        'static,
        Result<Option<crate::command::Outcome>, crate::command::SendError>,
    > {
        let (api, link) = (self.base.api.clone(), self.link.clone());
        let from = crate::command::unique_from(&format!(
            "the admin API of replica {}",
            self.base.identity
        ));
        tracing::info!(link = %link, command = %order, %from, "passing a command to the link's Lease holder");
        let (links, key) = (
            self.base.links.clone(),
            kube::runtime::reflector::ObjectRef::new(&self.link).within(&self.base.namespace),
        );
        Box::pin(async move {
            crate::command::write(&api, &link, &order, &from).await?;
            // The answer arrives in the cache this replica keeps of its Links anyway: no reads
            // of the API server while waiting.
            let read = || std::future::ready(Ok(links.get(&key).map(|l| (*l).clone())));
            crate::command::wait_for_result(read, &link, &from, crate::command::RELAY_WAIT).await
        })
    }
}

/// The Event of one command's outcome on `link`, named after the Link and the moment it was
/// decided (unique per command). Its note names the sender, the outcome and the decider.
fn command_event(link: &Link, outcome: &Outcome, identity: &str) -> events::Event {
    let from = outcome.from.as_deref().unwrap_or("an unnamed sender");
    let now = jiff::Timestamp::now();
    let action = outcome
        .command
        .parse::<Order>()
        .map_or("Command", |o| match o {
            Order::Release => "Release",
            Order::Quarantine(_) => "Quarantine",
            Order::ReleaseService(_) => "ReleaseService",
        });
    let regarding: ObjectReference = link.object_ref(&());
    events::Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", link.name_any(), now.as_nanosecond())),
            namespace: link.namespace(),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some(
            if outcome.code == 200 {
                "Normal"
            } else {
                "Warning"
            }
            .into(),
        ),
        reason: Some(
            match outcome.code {
                200 => "CommandCarriedOut",
                400 => "CommandUnreadable",
                _ => "CommandRefused",
            }
            .into(),
        ),
        action: Some(action.into()),
        note: Some(format!(
            "{:?} from {from}: {} (decided by {})",
            outcome.command, outcome.message, outcome.decided_by
        )),
        regarding: Some(regarding),
        reporting_controller: Some("floodgate".into()),
        reporting_instance: Some(identity.to_owned()),
        ..events::Event::default()
    }
}
