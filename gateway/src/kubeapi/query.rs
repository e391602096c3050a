//! The query string of a GET, LIST or WATCH, parsed and checked the way the API server does.
//!
//! What real clients send is accepted: kube-rs's leading empty pair (`?&watch=true`), client-go's
//! `timeout=<Go duration>` beside `timeoutSeconds`, `resourceVersion=0&limit=500`. Unknown
//! parameters are ignored, as the API server ignores them. Invalid combinations of
//! `resourceVersion`, `resourceVersionMatch` and `sendInitialEvents` are 422 Invalid.

use std::time::Duration;

use super::selector::{FieldFilter, LabelFilter};
use super::status::StatusError;

/// The longest watch Floodgate serves; longer requests are cut to this.
pub const MAX_WATCH: Duration = Duration::from_secs(3600);
/// A watch without `timeoutSeconds` lasts this long (the API server picks 30-60 minutes).
pub const DEFAULT_WATCH: Duration = Duration::from_secs(1800);

/// `resourceVersionMatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RvMatch {
    /// Not given.
    Unset,
    /// `NotOlderThan`.
    NotOlderThan,
    /// `Exact`.
    Exact,
}

/// A parsed request query.
#[derive(Clone, Debug)]
pub struct Query {
    /// `watch=true|1`.
    pub watch: bool,
    /// `labelSelector`.
    pub labels: LabelFilter,
    /// `fieldSelector`.
    pub fields: FieldFilter,
    /// `resourceVersion`, as given (`None` when absent).
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`.
    pub rv_match: RvMatch,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true|false`, when given.
    pub send_initial_events: Option<bool>,
    /// How long a watch lasts (`timeoutSeconds`, bounded).
    pub timeout: Duration,
    /// `limit`: the most items in one page of a list read from the current state (see
    /// [`super::list`] for when it is honoured).
    pub limit: Option<u64>,
    /// `continue`: the token of the page before, when not empty.
    pub continue_token: Option<String>,
}

fn boolean(name: &str, v: &str) -> Result<bool, StatusError> {
    match v {
        "true" | "1" | "True" | "TRUE" => Ok(true),
        "false" | "0" | "False" | "FALSE" | "" => Ok(false),
        _ => Err(StatusError::bad_request(format!(
            "invalid value for {name}: {v:?} is not a boolean"
        ))),
    }
}

impl Query {
    /// Parses a raw query string (without the `?`).
    pub fn parse(raw: &str) -> Result<Self, StatusError> {
        let mut q = Query {
            watch: false,
            labels: LabelFilter::default(),
            fields: FieldFilter::default(),
            resource_version: None,
            rv_match: RvMatch::Unset,
            bookmarks: false,
            send_initial_events: None,
            timeout: DEFAULT_WATCH,
            limit: None,
            continue_token: None,
        };
        for (k, v) in form_urlencoded::parse(raw.as_bytes()) {
            match &*k {
                "" => {}
                "watch" => q.watch = boolean("watch", &v)?,
                "labelSelector" => q.labels = LabelFilter::parse(&v)?,
                "fieldSelector" => q.fields = FieldFilter::parse(&v)?,
                "resourceVersion" => q.resource_version = Some(v.into_owned()),
                "resourceVersionMatch" => {
                    q.rv_match = match &*v {
                        "" => RvMatch::Unset,
                        "NotOlderThan" => RvMatch::NotOlderThan,
                        "Exact" => RvMatch::Exact,
                        other => {
                            return Err(StatusError::invalid(format!(
                                "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
                            )));
                        }
                    }
                }
                "allowWatchBookmarks" => q.bookmarks = boolean("allowWatchBookmarks", &v)?,
                "sendInitialEvents" => {
                    q.send_initial_events = Some(boolean("sendInitialEvents", &v)?)
                }
                "timeoutSeconds" => {
                    let secs: u64 = v.parse().map_err(|_| {
                        StatusError::bad_request(format!("invalid value for timeoutSeconds: {v:?}"))
                    })?;
                    q.timeout = Duration::from_secs(secs).min(MAX_WATCH);
                }
                "limit" => {
                    q.limit = Some(v.parse().map_err(|_| {
                        StatusError::bad_request(format!("invalid value for limit: {v:?}"))
                    })?);
                }
                "continue" => q.continue_token = Some(v.into_owned()).filter(|t| !t.is_empty()),
                // `timeout` (client-go's Go duration) is the client's own deadline; `timeoutSeconds`
                // rules. `pretty` and the rest are accepted and ignored.
                _ => {}
            }
        }
        q.check()?;
        Ok(q)
    }

    /// The API server's rules (apimachinery's `ValidateListOptions`), list and watch apart.
    fn check(&self) -> Result<(), StatusError> {
        let rv = self.resource_version.as_deref().unwrap_or_default();
        let forbidden = |field: &str, why: &str| {
            Err(StatusError::invalid(format!("{field}: Forbidden: {why}")))
        };
        if !self.watch {
            if self.rv_match != RvMatch::Unset && rv.is_empty() {
                return forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                );
            }
            if self.rv_match == RvMatch::Exact && rv == "0" {
                return forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                );
            }
            if self.send_initial_events.is_some() {
                return forbidden(
                    "sendInitialEvents",
                    "sendInitialEvents is forbidden for list",
                );
            }
            if self.continue_token.is_some() && !rv.is_empty() {
                // The API server's storage says this with a 400, not a 422.
                return Err(StatusError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            return Ok(());
        }
        if let Some(send) = self.send_initial_events {
            if self.rv_match != RvMatch::NotOlderThan {
                return forbidden(
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                );
            }
            if send && !self.bookmarks {
                return forbidden(
                    "allowWatchBookmarks",
                    "sendInitialEvents requires setting allowWatchBookmarks=true",
                );
            }
        }
        if self.rv_match != RvMatch::Unset {
            if self.send_initial_events.is_none() {
                return forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                );
            }
            if self.rv_match != RvMatch::NotOlderThan {
                return Err(StatusError::invalid(
                    "resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\"",
                ));
            }
        }
        Ok(())
    }
}

/// A resourceVersion a client sent, in Floodgate's numbering.
pub fn parse_rv(rv: &str) -> Result<u64, StatusError> {
    rv.parse::<u64>().map_err(|_| {
        StatusError::invalid(format!(
            "resourceVersion: Invalid value: {rv:?}: must be a number"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_real_clients_send_parses() {
        let kube_rs = Query::parse(
            "&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=12",
        )
        .expect("kube-rs watch");
        assert!(kube_rs.watch && kube_rs.bookmarks);
        assert_eq!(kube_rs.timeout, Duration::from_secs(290));
        // client-go's streaming list: NotOlderThan with no resourceVersion is legal on a watch.
        let client_go = Query::parse(
            "allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&timeout=9m47s&timeoutSeconds=587&watch=true",
        )
        .expect("client-go streaming list");
        assert_eq!(client_go.send_initial_events, Some(true));
        assert_eq!(client_go.timeout, Duration::from_secs(587));
        let fallback = Query::parse("limit=500&resourceVersion=0").expect("list fallback");
        assert_eq!(fallback.limit, Some(500));
        assert_eq!(fallback.resource_version.as_deref(), Some("0"));
        let huge = Query::parse("watch=1&timeoutSeconds=999999").expect("bounded");
        assert_eq!(huge.timeout, MAX_WATCH);
    }

    #[test]
    fn invalid_combinations_are_422_and_garbage_is_400() {
        for (q, code) in [
            ("resourceVersionMatch=Exact", 422),
            ("resourceVersion=5&resourceVersionMatch=Sometimes", 422),
            ("resourceVersion=0&resourceVersionMatch=Exact", 422),
            ("sendInitialEvents=true", 422),
            (
                "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=1",
                422,
            ),
            (
                "watch=true&sendInitialEvents=true&allowWatchBookmarks=true",
                422,
            ),
            (
                "watch=true&resourceVersion=3&resourceVersionMatch=NotOlderThan",
                422,
            ),
            ("watch=maybe", 400),
            ("timeoutSeconds=-1", 400),
            ("limit=ten", 400),
            ("continue=abc&resourceVersion=5", 400),
            ("labelSelector=a%20in", 400),
            ("fieldSelector=spec.nodeName%3Dx", 400),
        ] {
            let err = Query::parse(q)
                .err()
                .unwrap_or_else(|| panic!("{q} must fail"));
            assert_eq!(err.code().as_u16(), code, "{q}: {}", err.message);
        }
    }
}
