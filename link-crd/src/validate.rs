//! Validation of a [`LinkSpec`]: one pure function that returns every problem with its field
//! path, so an operator fixes a spec in one pass.
//!
//! The CRD's schema already rejects what OpenAPI can say (minimums, patterns, required fields,
//! exactly one remote); this adds what needs more than one field or real parsing: consistency
//! between thresholds, and label selector syntax.

use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::spec::{Bucket, LinkSpec};

/// One problem in a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Where, in the spec's own camelCase names: `spec.rateLimit.perLink.burst`.
    pub path: String,
    /// What is wrong, for people.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem found in a spec, in field order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for e in &self.0 {
            if !first {
                f.write_str("; ")?;
            }
            first = false;
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Checks a spec whose defaults are applied. `prefix` is the path of the spec itself (`spec`, or
/// `links[2].spec` in a file).
pub fn validate(spec: &LinkSpec, prefix: &str) -> Result<(), ValidationErrors> {
    let mut errs = Errors {
        prefix,
        list: Vec::new(),
    };

    let remote = &spec.remote;
    match (&remote.kubeconfig_secret, &remote.kubeconfig_path) {
        (Some(_), Some(_)) => errs.add(
            "remote",
            "set exactly one of kubeconfigSecret or kubeconfigPath, not both",
        ),
        (None, None) => errs.add(
            "remote",
            "set one of kubeconfigSecret (cluster mode) or kubeconfigPath (standalone mode)",
        ),
        _ => {}
    }
    if let Some(secret) = &remote.kubeconfig_secret {
        if !is_dns_subdomain(&secret.name) {
            errs.add(
                "remote.kubeconfigSecret.name",
                format!(
                    "{:?} is not a valid Secret name (a DNS-1123 subdomain)",
                    secret.name
                ),
            );
        }
        if secret.key.is_empty() {
            errs.add("remote.kubeconfigSecret.key", "must not be empty");
        }
    }
    if remote.kubeconfig_path.as_deref() == Some("") {
        errs.add("remote.kubeconfigPath", "must not be empty");
    }
    if remote.context.as_deref() == Some("") {
        errs.add(
            "remote.context",
            "must not be empty; leave it out for the current context",
        );
    }

    check_selector(&spec.select.services, "select.services", &mut errs);
    let ns = &spec.target_cluster_linkerd_namespace;
    if !is_dns_label(ns) {
        errs.add(
            "targetClusterLinkerdNamespace",
            format!("{ns:?} is not a valid namespace (a DNS-1123 label)"),
        );
    }

    let c = &spec.coalesce;
    if c.max.get().is_zero() {
        errs.add("coalesce.max", "must be greater than 0s");
    }
    if c.quiet > c.max {
        errs.add(
            "coalesce.quiet",
            format!("{} is longer than coalesce.max ({}): the quiet window must fit in the maximum delay", c.quiet, c.max),
        );
    }

    let r = &spec.rate_limit;
    check_bucket(&r.per_link, "rateLimit.perLink", &mut errs);
    check_bucket(&r.per_service, "rateLimit.perService", &mut errs);
    if r.per_service.updates_per_second > r.per_link.updates_per_second {
        errs.add(
            "rateLimit.perService.updatesPerSecond",
            format!(
                "{} is more than rateLimit.perLink.updatesPerSecond ({}): one service may not exceed the link's budget",
                r.per_service.updates_per_second, r.per_link.updates_per_second
            ),
        );
    }
    if r.per_service.burst > r.per_link.burst {
        errs.add(
            "rateLimit.perService.burst",
            format!(
                "{} is more than rateLimit.perLink.burst ({})",
                r.per_service.burst, r.per_link.burst
            ),
        );
    }

    let caps = &spec.caps;
    for (value, path) in [
        (
            caps.max_endpoints_per_service,
            "caps.maxEndpointsPerService",
        ),
        (caps.max_services, "caps.maxServices"),
        (caps.max_objects, "caps.maxObjects"),
    ] {
        if value == 0 {
            errs.add(path, "must be at least 1");
        }
    }
    if caps.max_services > caps.max_objects {
        errs.add(
            "caps.maxServices",
            format!(
                "{} is more than caps.maxObjects ({}): every service is an object",
                caps.max_services, caps.max_objects
            ),
        );
    }

    let when = &spec.quarantine.when;
    for (value, path) in [
        (when.events_per_second, "quarantine.when.eventsPerSecond"),
        (
            when.service_events_per_second,
            "quarantine.when.serviceEventsPerSecond",
        ),
        (when.contained_services, "quarantine.when.containedServices"),
    ] {
        if value == 0 {
            errs.add(path, "must be at least 1");
        }
    }
    if when.sustained_for.get().as_secs() < 1 {
        errs.add(
            "quarantine.when.sustainedFor",
            format!(
                "{} is too short: use at least 1s so one burst cannot quarantine a link",
                when.sustained_for
            ),
        );
    }
    if !(1..=100).contains(&when.removed_share) {
        errs.add(
            "quarantine.when.removedShare",
            format!(
                "{} is not a share in percent: use 1 to 100 (100 turns it off)",
                when.removed_share
            ),
        );
    }
    if when.removed_services < 2 {
        errs.add(
            "quarantine.when.removedServices",
            format!(
                "{} would quarantine a link for one service deleted or scaled to zero: use at least 2",
                when.removed_services
            ),
        );
    }
    if when.removed_within.get() < Duration::from_secs(1) {
        errs.add(
            "quarantine.when.removedWithin",
            format!(
                "{} is too short: removals wait up to this long to be counted together; use at least 1s",
                when.removed_within
            ),
        );
    }
    if when.endpoints_per_service < caps.max_endpoints_per_service {
        errs.add(
            "quarantine.when.endpointsPerService",
            format!(
                "{} is below caps.maxEndpointsPerService ({}): the service would be contained before the cap could help",
                when.endpoints_per_service, caps.max_endpoints_per_service
            ),
        );
    }
    if let Some(auto) = &spec.quarantine.auto_release {
        if auto.after < when.sustained_for || auto.after.get().is_zero() {
            errs.add(
                "quarantine.autoRelease.after",
                format!(
                    "{} is shorter than quarantine.when.sustainedFor ({}): the re-check could not see a sustained flood",
                    auto.after, when.sustained_for
                ),
            );
        }
        if auto.max_after < auto.after {
            errs.add(
                "quarantine.autoRelease.maxAfter",
                format!(
                    "{} is shorter than quarantine.autoRelease.after ({})",
                    auto.max_after, auto.after
                ),
            );
        }
    }

    if errs.list.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errs.list))
    }
}

struct Errors<'a> {
    prefix: &'a str,
    list: Vec<FieldError>,
}

impl Errors<'_> {
    fn add(&mut self, path: &str, message: impl Into<String>) {
        self.list.push(FieldError {
            path: format!("{}.{path}", self.prefix),
            message: message.into(),
        });
    }
}

fn check_bucket(b: &Bucket, path: &str, errs: &mut Errors<'_>) {
    if b.updates_per_second == 0 {
        errs.add(&format!("{path}.updatesPerSecond"), "must be at least 1");
    }
    if b.burst == 0 {
        errs.add(&format!("{path}.burst"), "must be at least 1");
    }
}

fn check_selector(sel: &LabelSelector, path: &str, errs: &mut Errors<'_>) {
    for (key, value) in sel.match_labels.iter().flatten() {
        if let Err(why) = check_label_key(key) {
            errs.add(
                &format!("{path}.matchLabels"),
                format!("key {key:?}: {why}"),
            );
        }
        if let Err(why) = check_label_value(value) {
            errs.add(
                &format!("{path}.matchLabels.{key}"),
                format!("value {value:?}: {why}"),
            );
        }
    }
    for (i, req) in sel.match_expressions.iter().flatten().enumerate() {
        let at = format!("{path}.matchExpressions[{i}]");
        if let Err(why) = check_label_key(&req.key) {
            errs.add(&format!("{at}.key"), format!("{:?}: {why}", req.key));
        }
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" | "NotIn" => {
                if values.is_empty() {
                    errs.add(
                        &format!("{at}.values"),
                        format!("operator {} needs at least one value", req.operator),
                    );
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    errs.add(
                        &format!("{at}.values"),
                        format!("operator {} takes no values", req.operator),
                    );
                }
            }
            other => errs.add(
                &format!("{at}.operator"),
                format!("{other:?} is not one of In, NotIn, Exists, DoesNotExist"),
            ),
        }
        for v in values {
            if let Err(why) = check_label_value(v) {
                errs.add(&format!("{at}.values"), format!("{v:?}: {why}"));
            }
        }
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
pub fn check_label_key(key: &str) -> Result<(), &'static str> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if !is_dns_subdomain(prefix) {
                return Err("the prefix before '/' must be a DNS-1123 subdomain");
            }
            name
        }
        None => key,
    };
    if name.is_empty() {
        return Err("the name part must not be empty");
    }
    check_label_value(name)
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_` and `.`, starting and ending with
/// an alphanumeric.
pub fn check_label_value(v: &str) -> Result<(), &'static str> {
    if v.len() > 63 {
        return Err("must be at most 63 characters");
    }
    let ok_edge = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    if !ok_edge(v.chars().next()) || !ok_edge(v.chars().last()) {
        return Err("must start and end with a letter or digit");
    }
    if !v
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("may hold only letters, digits, '-', '_' and '.'");
    }
    Ok(())
}

/// A DNS-1123 label: at most 63 lowercase alphanumerics or `-`, alphanumeric at both ends. Link
/// names are labels: they appear in URL paths and Lease names.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}
