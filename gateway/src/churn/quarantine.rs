//! The quarantine state machine of one link, and the containment machine of one service (the
//! same states; a service's frozen state is named `Contained`).
//!
//! ```text
//!            trip / manual quarantine
//!   Active ---------------------------> Quarantined <------------------+
//!     ^                                   |      |                     | flood again:
//!     |  operator release                 |      | cool-down over      | cool-down doubles
//!     +-----------------------------------+      v (auto-release only) | (up to maxAfter)
//!     ^                                       Rechecking --------------+
//!     +-------- re-check passes (sustainedFor without a trigger) --+
//! ```
//!
//! While a link is Quarantined its view is frozen and upstream is stopped; while Rechecking
//! upstream runs again but nothing is published until the re-check passes. While a service is
//! Contained (or Rechecking) its last published state stays served and its changes wait; the
//! link's other services keep flowing. Manual quarantines are released only by an operator.

use std::time::Duration;

use floodgate_link_crd::AutoRelease;
use serde::{Serialize, Serializer};
use tokio::time::Instant;

use super::flood::{Reason, Trigger};
use crate::model::NsName;

/// Where a link (or a contained service) stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Following upstream and publishing.
    Active,
    /// Frozen (the link: upstream stopped; a service: its changes wait).
    Quarantined(Quarantine),
    /// Frozen; watching upstream to see whether the flood is over.
    Rechecking {
        /// The quarantine being re-checked.
        quarantine: Quarantine,
        /// When the re-check passes if nothing trips before.
        until: Instant,
    },
}

/// A quarantine: when, why, and what happens next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantine {
    /// When it began.
    pub since: Instant,
    /// What tripped it.
    pub trigger: Trigger,
    /// True when the link had not finished its first sync: it then serves what it had listed,
    /// every service capped.
    pub before_first_sync: bool,
    /// The cool-down before the next re-check (auto-release only).
    pub cooldown: Option<Duration>,
    /// When the next re-check starts (auto-release only).
    pub next_check: Option<Instant>,
}

/// The name of a state, as logs, status and the admin API show it. A service's frozen state
/// is `Contained`, a link's `Quarantined`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum StateName {
    /// Following upstream.
    #[default]
    Active,
    /// A frozen link.
    Quarantined,
    /// A frozen service.
    Contained,
    /// Frozen while a re-check watches upstream.
    Rechecking,
}

impl StateName {
    /// The name.
    pub const fn as_str(self) -> &'static str {
        match self {
            StateName::Active => "Active",
            StateName::Quarantined => "Quarantined",
            StateName::Contained => "Contained",
            StateName::Rechecking => "Rechecking",
        }
    }
}

/// Why a state changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A threshold was crossed, or an operator asked for it.
    Tripped(Reason),
    /// The auto-release cool-down is over: a re-check starts.
    CooldownOver,
    /// The re-check saw no flood.
    RecheckPassed,
    /// Someone released it (the message says who).
    Released,
    /// A contained service left upstream (deleted, or no longer selected).
    ServiceGone,
}

impl Cause {
    /// The CamelCase reason.
    pub const fn as_str(self) -> &'static str {
        match self {
            Cause::Tripped(r) => r.as_str(),
            Cause::CooldownOver => "CooldownOver",
            Cause::RecheckPassed => "RecheckPassed",
            Cause::Released => "Released",
            Cause::ServiceGone => "ServiceGone",
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Cause {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A change of state, for logs, events and status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Transition {
    /// The contained service, for a service's transition; none for the link's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<NsName>,
    /// The state left.
    pub from: StateName,
    /// The state entered.
    pub to: StateName,
    /// Why.
    pub reason: Cause,
    /// For people.
    pub message: String,
}

/// Why an operator's request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Release of a link that is not quarantined.
    #[error("the link is not quarantined")]
    NotQuarantined,
    /// Quarantine of a link that already is.
    #[error("the link is already quarantined")]
    AlreadyQuarantined,
    /// Release of a service that is not contained.
    #[error("the service is not contained")]
    NotContained,
    /// A request about a service the link does not select.
    #[error("the link does not select this service")]
    UnknownService,
}

/// The machine of a link, or of one contained service.
#[derive(Debug)]
pub struct Machine {
    state: State,
    auto: Option<AutoRelease>,
    recheck_for: Duration,
    /// The service this machine contains; none for a link's.
    service: Option<NsName>,
}

impl Machine {
    /// The name of the current state.
    pub fn state_name(&self) -> StateName {
        match (&self.state, &self.service) {
            (State::Active, _) => StateName::Active,
            (State::Quarantined(_), None) => StateName::Quarantined,
            (State::Quarantined(_), Some(_)) => StateName::Contained,
            (State::Rechecking { .. }, _) => StateName::Rechecking,
        }
    }
}

impl Machine {
    /// A machine for a link with this auto-release policy and flood threshold duration. A
    /// re-check watches upstream for twice `sustained_for` after upstream has synced, so a flood
    /// that is still going has the time to show itself.
    pub fn new(auto: Option<AutoRelease>, sustained_for: Duration) -> Self {
        Self {
            state: State::Active,
            auto,
            recheck_for: sustained_for * 2,
            service: None,
        }
    }

    /// The same machine for one service: its transitions name the service and its frozen
    /// state is `Contained`.
    pub fn for_service(auto: Option<AutoRelease>, sustained_for: Duration, svc: NsName) -> Self {
        Self {
            service: Some(svc),
            ..Self::new(auto, sustained_for)
        }
    }

    /// The current state.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// True unless Active.
    pub fn is_frozen(&self) -> bool {
        !matches!(self.state, State::Active)
    }

    /// The quarantine in force, if any.
    pub fn quarantine(&self) -> Option<&Quarantine> {
        match &self.state {
            State::Active => None,
            State::Quarantined(q) | State::Rechecking { quarantine: q, .. } => Some(q),
        }
    }

    /// When [`Machine::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        match &self.state {
            State::Active => None,
            State::Quarantined(q) => q.next_check,
            State::Rechecking { until, .. } => Some(*until),
        }
    }

    /// A flood was detected. Active: quarantine. Rechecking: back to Quarantined with a longer
    /// cool-down. Quarantined: nothing (upstream is stopped; late events change nothing).
    pub fn trip(
        &mut self,
        now: Instant,
        trigger: Trigger,
        synced_once: bool,
    ) -> Option<Transition> {
        let (cooldown, before_first_sync) = match &self.state {
            State::Active => (self.auto.map(|a| a.after.get()), !synced_once),
            State::Rechecking { quarantine, .. } => {
                let max = self.auto.map(|a| a.max_after.get()).unwrap_or_default();
                let next = quarantine.cooldown.map(|c| (c * 2).min(max));
                (next, quarantine.before_first_sync)
            }
            State::Quarantined(_) => return None,
        };
        let message = if before_first_sync {
            format!(
                "{} (before the first complete sync: serving what was listed, every service capped)",
                trigger.message
            )
        } else {
            trigger.message.clone()
        };
        let reason = trigger.reason;
        let q = Quarantine {
            since: now,
            trigger,
            before_first_sync,
            cooldown,
            next_check: cooldown.map(|c| now + c),
        };
        Some(self.enter(State::Quarantined(q), Cause::Tripped(reason), message))
    }

    /// An operator quarantines the link. It stays quarantined until an operator releases it.
    pub fn quarantine_manually(
        &mut self,
        now: Instant,
        trigger: Trigger,
        synced_once: bool,
    ) -> Result<Transition, RequestError> {
        // Quarantined already (by an operator or a flood): nothing to do. Rechecking: an operator
        // stops the re-check and keeps the link quarantined.
        if matches!(self.state, State::Quarantined(_)) {
            return Err(RequestError::AlreadyQuarantined);
        }
        let message = trigger.message.clone();
        let q = Quarantine {
            since: now,
            trigger,
            before_first_sync: !synced_once,
            cooldown: None,
            next_check: None,
        };
        Ok(self.enter(
            State::Quarantined(q),
            Cause::Tripped(Reason::Manual),
            message,
        ))
    }

    /// Puts back a quarantine saved before a restart. It began at `since`; an auto-release
    /// cool-down starts over from `now` (the flood may have gone on while nobody watched).
    pub fn restore(
        &mut self,
        now: Instant,
        since: Instant,
        trigger: Trigger,
        before_first_sync: bool,
        cooldown: Option<Duration>,
    ) {
        self.state = State::Quarantined(Quarantine {
            since,
            trigger,
            before_first_sync,
            cooldown,
            next_check: cooldown.map(|c| now + c),
        });
    }

    /// Someone releases the link: `by` says who, for logs, Events and status ("an operator
    /// through the admin API", "the Lease holder's record").
    pub fn release(&mut self, by: &str) -> Result<Transition, RequestError> {
        if !self.is_frozen() {
            return Err(RequestError::NotQuarantined);
        }
        Ok(self.enter(State::Active, Cause::Released, format!("released by {by}")))
    }

    /// Moves time on: starts a due re-check, or passes one that saw no flood. A re-check passes
    /// only once upstream has `synced`; its window starts over until then.
    pub fn tick(&mut self, now: Instant, synced: bool) -> Option<Transition> {
        if let State::Rechecking { until, .. } = &mut self.state
            && !synced
        {
            *until = (*until).max(now + self.recheck_for);
            return None;
        }
        match &self.state {
            State::Quarantined(q) if q.next_check.is_some_and(|t| now >= t) => {
                let quarantine = q.clone();
                let until = now + self.recheck_for;
                Some(self.enter(
                    State::Rechecking { quarantine, until },
                    Cause::CooldownOver,
                    format!(
                        "cool-down over: watching upstream for {}s before release",
                        self.recheck_for.as_secs()
                    ),
                ))
            }
            State::Rechecking { until, .. } if now >= *until => Some(self.enter(
                State::Active,
                Cause::RecheckPassed,
                "re-check passed: no flood seen, released".to_owned(),
            )),
            _ => None,
        }
    }

    /// The service left upstream: its containment ends with it.
    pub fn gone(&mut self) -> Transition {
        self.enter(
            State::Active,
            Cause::ServiceGone,
            "the service left upstream: its containment ends".to_owned(),
        )
    }

    fn enter(&mut self, next: State, reason: Cause, message: String) -> Transition {
        let from = self.state_name();
        self.state = next;
        Transition {
            service: self.service.clone(),
            from,
            to: self.state_name(),
            reason,
            message,
        }
    }
}
