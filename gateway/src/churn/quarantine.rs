//! The quarantine state machine of one link.
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
//! While Quarantined the view is frozen and upstream is stopped; while Rechecking upstream runs
//! again but nothing is published until the re-check passes. Manual quarantines are released
//! only by an operator.

use std::time::Duration;

use floodgate_link_crd::AutoRelease;
use serde::Serialize;
use tokio::time::Instant;

use super::flood::Trigger;

/// Where the link stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Following upstream and publishing.
    Active,
    /// Frozen; upstream stopped.
    Quarantined(Quarantine),
    /// Frozen; upstream running to see whether the flood is over.
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
    /// True when the link had not finished its first sync: consumers see an empty view.
    pub before_first_sync: bool,
    /// The cool-down before the next re-check (auto-release only).
    pub cooldown: Option<Duration>,
    /// When the next re-check starts (auto-release only).
    pub next_check: Option<Instant>,
}

/// A change of state, for logs, events and status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Transition {
    /// The state left: `Active`, `Quarantined` or `Rechecking`.
    pub from: &'static str,
    /// The state entered.
    pub to: &'static str,
    /// A CamelCase reason.
    pub reason: String,
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
}

/// The machine.
#[derive(Debug)]
pub struct Machine {
    state: State,
    auto: Option<AutoRelease>,
    recheck_for: Duration,
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Active => "Active",
            State::Quarantined(_) => "Quarantined",
            State::Rechecking { .. } => "Rechecking",
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
                "{} (before the first complete sync: serving an empty view)",
                trigger.message
            )
        } else {
            trigger.message.clone()
        };
        let q = Quarantine {
            since: now,
            trigger,
            before_first_sync,
            cooldown,
            next_check: cooldown.map(|c| now + c),
        };
        Some(self.enter(State::Quarantined(q), message))
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
        Ok(self.enter(State::Quarantined(q), message))
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
        Ok(self.enter(State::Active, format!("released by {by}")))
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
                    format!(
                        "cool-down over: watching upstream for {}s before release",
                        self.recheck_for.as_secs()
                    ),
                ))
            }
            State::Rechecking { until, .. } if now >= *until => Some(self.enter(
                State::Active,
                "re-check passed: no flood seen, released".to_owned(),
            )),
            _ => None,
        }
    }

    fn enter(&mut self, next: State, message: String) -> Transition {
        let from = self.state.name();
        let reason = match (&self.state, &next) {
            (_, State::Quarantined(q)) => q.trigger.reason.to_string(),
            (_, State::Rechecking { .. }) => "CooldownOver".to_owned(),
            (State::Rechecking { .. }, State::Active) => "RecheckPassed".to_owned(),
            (_, State::Active) => "Released".to_owned(),
        };
        self.state = next;
        Transition {
            from,
            to: self.state.name(),
            reason,
            message,
        }
    }
}
