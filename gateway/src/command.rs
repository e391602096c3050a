//! Operators' commands in a cluster, carried by the Link itself.
//!
//! Only the holder of a link's Lease decides its quarantine and containments; every other
//! replica follows the holder's record. So a release sent to any replica's admin API, or set
//! with nothing but `kubectl` and RBAC, has to reach the holder. It goes through the API server
//! every replica already watches: the command is an annotation on the Link.
//!
//! | annotation | written by | value |
//! | --- | --- | --- |
//! | `floodgate.dev/command` | the operator (`kubectl annotate`, `floodgate release`, a replica's admin API) | one [`Order`]: `release`, `quarantine [message]`, `release-service <namespace>/<name>` |
//! | `floodgate.dev/command-from` | the same, optional | who sent it, for logs, Events and status |
//! | `floodgate.dev/command-result` | the Lease holder | the [`Outcome`], as JSON |
//!
//! The holder acts on the command, records an Event naming where it came from, and in one JSON
//! patch checks that the command is still the one it acted on, removes it and writes the
//! result (`crate::controller::commands`). A sender waits for a result naming its own `from`.
//! One command is pending per Link at a time: a second sender gets [`SendError::Pending`].

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use floodgate_link_crd::Link;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::{Deserialize, Serialize};

use crate::churn::quarantine::{RequestError, Transition};
use crate::link::{LinkError, LinkHandle};
use crate::model::NsName;

/// Longest a link may take to answer a release or quarantine (it answers between batches of
/// upstream events, so this is a backstop, not a wait anyone should see).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest a replica waits for the Lease holder's answer to a command it passed on (the
/// holder looks at its Links every second).
pub const RELAY_WAIT: Duration = Duration::from_secs(8);

/// The command to the Lease holder.
pub const COMMAND: &str = "floodgate.dev/command";
/// Who sent it (optional).
pub const COMMAND_FROM: &str = "floodgate.dev/command-from";
/// The holder's answer to the last command.
pub const COMMAND_RESULT: &str = "floodgate.dev/command-result";

/// The longest quarantine message a command carries (an annotation value holds far more; a
/// message is a sentence).
pub const MAX_MESSAGE: usize = 1024;

/// What an operator asks of a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Order {
    /// Release the quarantined link.
    Release,
    /// Quarantine the link until an operator releases it, with an optional message.
    Quarantine(Option<String>),
    /// Release one contained service.
    ReleaseService(NsName),
}

/// Why a command's text is not an [`Order`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0}; a command is `release`, `quarantine [message]` or `release-service <namespace>/<name>`"
)]
pub struct ParseError(String);

impl FromStr for Order {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let s = s.trim();
        let (verb, rest) = s.split_once(char::is_whitespace).unwrap_or((s, ""));
        let rest = rest.trim();
        match verb {
            "release" if rest.is_empty() => Ok(Order::Release),
            "release" => Err(ParseError(format!(
                "`release` takes nothing after it (got {rest:?})"
            ))),
            "quarantine" if rest.len() > MAX_MESSAGE => Err(ParseError(format!(
                "the quarantine message is {} bytes, over {MAX_MESSAGE}",
                rest.len()
            ))),
            "quarantine" if rest.contains(['\n', '\r']) => Err(ParseError(
                "the quarantine message is more than one line".into(),
            )),
            "quarantine" => Ok(Order::Quarantine(
                (!rest.is_empty()).then(|| rest.to_owned()),
            )),
            "release-service" => {
                let valid = |p: &str| {
                    !p.is_empty()
                        && p.len() <= 253
                        && p.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                };
                match rest.split_once('/') {
                    Some((ns, name)) if valid(ns) && valid(name) => {
                        Ok(Order::ReleaseService(NsName::new(ns, name)))
                    }
                    _ => Err(ParseError(format!(
                        "`release-service` takes the service as <namespace>/<name> (got {rest:?})"
                    ))),
                }
            }
            "" => Err(ParseError("the command is empty".into())),
            other => Err(ParseError(format!("unknown command {other:?}"))),
        }
    }
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Order::Release => f.write_str("release"),
            Order::Quarantine(None) => f.write_str("quarantine"),
            Order::Quarantine(Some(m)) => write!(f, "quarantine {m}"),
            Order::ReleaseService(svc) => write!(f, "release-service {svc}"),
        }
    }
}

impl Order {
    /// Carries the order out on a link this replica decides for; `by` says who asked.
    pub async fn apply(&self, handle: &LinkHandle, by: &str) -> Result<Transition, LinkError> {
        match self {
            Order::Release => handle.release(by).await,
            Order::Quarantine(message) => {
                let message = message
                    .clone()
                    .unwrap_or_else(|| format!("quarantined by {by}"));
                handle.quarantine(message).await
            }
            Order::ReleaseService(svc) => handle.release_service(svc.clone(), by).await,
        }
    }
}

/// The HTTP status an order's refusal answers with, as the admin API does: 404 for a service
/// the link does not select, 409 for a transition that makes no sense now, 503 for a link that
/// is stopping.
pub fn refusal_code(e: &LinkError) -> u16 {
    match e {
        LinkError::Refused(RequestError::UnknownService) => 404,
        LinkError::Refused(_) => 409,
        LinkError::Stopped => 503,
    }
}

/// The Lease holder's answer to a command, written to [`COMMAND_RESULT`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The command, as it was written.
    pub command: String,
    /// Its [`COMMAND_FROM`], if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// What the admin API would have answered: 200 done, 400 unreadable, 404 unknown service,
    /// 409 refused in this state, 503 the link is not running.
    pub code: u16,
    /// What happened, for people.
    pub message: String,
    /// The replica that decided (the Lease holder's identity).
    pub decided_by: String,
    /// When, RFC 3339.
    pub at: String,
}

/// Why a command could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No such Link.
    #[error("no Link {0}")]
    NoLink(String),
    /// The Link carries a command the holder has not taken yet.
    #[error("link {link} has a command waiting for its Lease holder: {command:?} from {from}")]
    Pending {
        /// The link.
        link: String,
        /// The waiting command.
        command: String,
        /// Its sender, as it said.
        from: String,
    },
    /// The API server refused or could not be reached.
    #[error("writing the command on Link {0}: {1}")]
    Api(String, #[source] kube::Error),
}

/// Attempts at writing a command while the Link keeps changing under us (the holder's status
/// writes change its resource version every few seconds).
const WRITE_ATTEMPTS: usize = 5;

/// How often a sender looks for its result.
const RESULT_POLL: Duration = Duration::from_millis(200);

/// Sends `order` to link `name`'s Lease holder through its Link, marked as coming from `from`
/// (which should be unique to this request: the result is recognised by it), and waits up to
/// `wait` for the holder's [`Outcome`], reading the Link from the API server.
/// `Ok(None)`: written, not answered yet.
pub async fn send(
    api: &Api<Link>,
    name: &str,
    order: &Order,
    from: &str,
    wait: Duration,
) -> Result<Option<Outcome>, SendError> {
    write(api, name, order, from).await?;
    let read = || {
        let api = api.clone();
        async move { api.get_opt(name).await }
    };
    wait_for_result(read, name, from, wait).await
}

/// Writes `order` on link `name`, unless a command is waiting there already.
pub async fn write(
    api: &Api<Link>,
    name: &str,
    order: &Order,
    from: &str,
) -> Result<(), SendError> {
    let api_err = |e| SendError::Api(name.to_owned(), e);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let link = api
            .get_opt(name)
            .await
            .map_err(api_err)?
            .ok_or_else(|| SendError::NoLink(name.to_owned()))?;
        let annotations = link.metadata.annotations.as_ref();
        if let Some(command) = annotations.and_then(|a| a.get(COMMAND)) {
            return Err(SendError::Pending {
                link: name.to_owned(),
                command: command.clone(),
                from: annotations
                    .and_then(|a| a.get(COMMAND_FROM))
                    .cloned()
                    .unwrap_or_else(|| "an unnamed sender".into()),
            });
        }
        // The version makes the patch conditional: a command written meanwhile is not replaced.
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": link.metadata.resource_version,
            "annotations": {COMMAND: order.to_string(), COMMAND_FROM: from},
        }});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < WRITE_ATTEMPTS => continue,
            Err(e) => return Err(api_err(e)),
        }
    }
}

/// Waits up to `wait` for the holder's answer to the command from `from`, reading the Link
/// with `read` (the API server, or a controller's cache of Links) every 200 ms.
pub async fn wait_for_result<F, R>(
    mut read: F,
    name: &str,
    from: &str,
    wait: Duration,
) -> Result<Option<Outcome>, SendError>
where
    F: FnMut() -> R,
    R: std::future::Future<Output = Result<Option<Link>, kube::Error>>,
{
    let api_err = |e| SendError::Api(name.to_owned(), e);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let link = read().await.map_err(api_err)?;
        let Some(link) = link else {
            return Err(SendError::NoLink(name.to_owned()));
        };
        if let Some(outcome) = result_of(&link).filter(|o| o.from.as_deref() == Some(from)) {
            return Ok(Some(outcome));
        }
        if tokio::time::Instant::now() + RESULT_POLL > deadline {
            return Ok(None);
        }
        tokio::time::sleep(RESULT_POLL).await;
    }
}

/// The result the holder last wrote on `link`, if it can be read.
pub fn result_of(link: &Link) -> Option<Outcome> {
    let raw = link.metadata.annotations.as_ref()?.get(COMMAND_RESULT)?;
    serde_json::from_str(raw).ok()
}

/// The command waiting on `link` and its sender, if any.
pub fn pending(annotations: Option<&BTreeMap<String, String>>) -> Option<(String, Option<String>)> {
    let a = annotations?;
    Some((a.get(COMMAND)?.clone(), a.get(COMMAND_FROM).cloned()))
}

/// A sender name unique to this request: `what`, then a random id.
pub fn unique_from(what: &str) -> String {
    let mut id = [0u8; 6];
    // Without randomness the time tells requests apart well enough.
    if getrandom::fill(&mut id).is_err() {
        id.copy_from_slice(&jiff::Timestamp::now().as_nanosecond().to_le_bytes()[..6]);
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!("{what} (request {hex})")
}

/// `floodgate release` and `floodgate quarantine`: where the Link is and how long to wait.
#[derive(Debug, Clone, clap::Args)]
pub struct SendArgs {
    /// The namespace of the Link (Floodgate's own).
    #[arg(
        long,
        short = 'n',
        env = "FLOODGATE_NAMESPACE",
        default_value = "floodgate"
    )]
    pub namespace: String,
    /// Seconds to wait for the Lease holder's answer (0: write the command and return).
    #[arg(long, default_value_t = 30)]
    pub wait: u64,
}

/// `floodgate release`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReleaseArgs {
    /// The Link.
    pub link: String,
    /// Release this contained service (`<namespace>/<name>`) instead of the link's quarantine.
    #[arg(long)]
    pub service: Option<String>,
    #[command(flatten)]
    pub send: SendArgs,
}

/// `floodgate quarantine`.
#[derive(Debug, Clone, clap::Args)]
pub struct QuarantineArgs {
    /// The Link.
    pub link: String,
    /// Why, for the Link's status and Events.
    #[arg(long)]
    pub message: Option<String>,
    #[command(flatten)]
    pub send: SendArgs,
}

impl ReleaseArgs {
    /// The order these arguments give.
    pub fn order(&self) -> Result<Order, ParseError> {
        match &self.service {
            None => Ok(Order::Release),
            Some(svc) => format!("release-service {svc}").parse(),
        }
    }
}

impl QuarantineArgs {
    /// The order these arguments give.
    pub fn order(&self) -> Result<Order, ParseError> {
        match &self.message {
            None => Ok(Order::Quarantine(None)),
            Some(m) => format!("quarantine {m}").parse(),
        }
    }
}

/// Sends `order` to `link` from the command line, with `client`'s credentials (which need
/// `get` and `patch` on Links: the `floodgate-operator` Role), and says what the holder
/// answered. An answer other than done, or none in time, is an error.
pub async fn send_from_cli(
    client: kube::Client,
    link: &str,
    order: &Order,
    args: &SendArgs,
) -> anyhow::Result<String> {
    let api: Api<Link> = Api::namespaced(client, &args.namespace);
    let from = unique_from("the floodgate CLI");
    let wait = Duration::from_secs(args.wait);
    match send(&api, link, order, &from, wait).await? {
        Some(o) if o.code == 200 => Ok(format!(
            "link {link}: {} (decided by {})\n",
            o.message, o.decided_by
        )),
        Some(o) => anyhow::bail!(
            "link {link}: {:?} refused ({}): {} (decided by {})",
            o.command,
            o.code,
            o.message,
            o.decided_by
        ),
        None if args.wait == 0 => Ok(format!(
            "link {link}: \"{order}\" written; the Lease holder answers in the {COMMAND_RESULT} annotation\n"
        )),
        None => anyhow::bail!(
            "link {link}: the command is written but no Lease holder answered within {}s; is \
             `floodgate controller` running? (the command stays on the Link until one does)",
            args.wait
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_read_back_what_they_write() {
        for o in [
            Order::Release,
            Order::Quarantine(None),
            Order::Quarantine(Some("the remote floods: ticket 42".into())),
            Order::ReleaseService(NsName::new("shop", "web-2")),
        ] {
            assert_eq!(o.to_string().parse::<Order>(), Ok(o.clone()), "{o}");
        }
        assert_eq!("  release \n".parse(), Ok(Order::Release));
    }

    #[test]
    fn unreadable_commands_say_why() {
        for (text, says) in [
            ("", "empty"),
            ("relase", "unknown command \"relase\""),
            ("release now", "takes nothing after it"),
            ("release-service web", "<namespace>/<name>"),
            ("release-service shop/", "<namespace>/<name>"),
            ("release-service Shop/web", "<namespace>/<name>"),
            ("quarantine one\ntwo", "more than one line"),
        ] {
            let e = text.parse::<Order>().expect_err(text);
            assert!(e.to_string().contains(says), "{text:?}: {e}");
            assert!(e.to_string().contains("a command is `release`"), "{e}");
        }
        let long = format!("quarantine {}", "x".repeat(MAX_MESSAGE + 1));
        assert!(long.parse::<Order>().is_err());
    }

    #[test]
    fn senders_are_told_apart() {
        let (a, b) = (unique_from("x"), unique_from("x"));
        assert_ne!(a, b);
        assert!(a.starts_with("x (request "), "{a}");
    }
}
