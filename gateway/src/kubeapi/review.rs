//! `SelfSubjectAccessReview`: Linkerd asks whether it may list pods and servers before it starts
//! its informers. client-go (1.32 and later) sends the review as protobuf (`k8s\0` magic, then a
//! `runtime.Unknown` wrapping the object); kubectl and others send JSON. Both are read; the
//! answer is JSON, which clients decode by its Content-Type.

use k8s_pb::api::authorization::v1::SelfSubjectAccessReview;
use prost::Message;
use serde_json::{Value, json};

use super::status::{Reason, StatusError};
use crate::model::KindDef;
use crate::protobuf;

/// What the review asks about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    /// Namespace, empty for all.
    pub namespace: String,
    /// Verb: get, list, watch, create...
    pub verb: String,
    /// API group.
    pub group: String,
    /// Resource (plural).
    pub resource: String,
    /// Subresource, if any.
    pub subresource: String,
}

/// Reads a review body, JSON or protobuf.
pub fn parse(body: &[u8], content_type: &str) -> Result<Attributes, StatusError> {
    if content_type.starts_with(protobuf::MEDIA_TYPE) || body.starts_with(protobuf::MAGIC) {
        let unknown = protobuf::open(body).map_err(|e| StatusError::bad_request(e.to_string()))?;
        let raw = unknown.raw.unwrap_or_default();
        let review = SelfSubjectAccessReview::decode(raw.as_slice()).map_err(|e| {
            StatusError::bad_request(format!("invalid protobuf SelfSubjectAccessReview: {e}"))
        })?;
        let a = review
            .spec
            .and_then(|s| s.resource_attributes)
            .unwrap_or_default();
        return Ok(Attributes {
            namespace: a.namespace.unwrap_or_default(),
            verb: a.verb.unwrap_or_default(),
            group: a.group.unwrap_or_default(),
            resource: a.resource.unwrap_or_default(),
            subresource: a.subresource.unwrap_or_default(),
        });
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        StatusError::bad_request(format!("invalid JSON SelfSubjectAccessReview: {e}"))
    })?;
    let a = &v["spec"]["resourceAttributes"];
    let s = |k: &str| a[k].as_str().unwrap_or_default().to_owned();
    Ok(Attributes {
        namespace: s("namespace"),
        verb: s("verb"),
        group: s("group"),
        resource: s("resource"),
        subresource: s("subresource"),
    })
}

/// The answer: allowed for get/list/watch of a served resource, refused with a reason otherwise.
pub fn answer(a: &Attributes, served: &[&'static KindDef]) -> Value {
    let resource_served = served
        .iter()
        .any(|r| r.group == a.group && r.plural == a.resource);
    let read = matches!(a.verb.as_str(), "get" | "list" | "watch");
    let (allowed, reason) = match (read, resource_served, a.subresource.is_empty()) {
        (true, true, true) => (true, "Floodgate serves this resource read-only".to_owned()),
        (_, false, _) => (
            false,
            format!("Floodgate does not serve {}.{}", a.resource, a.group),
        ),
        (_, _, false) => (
            false,
            format!("Floodgate serves no subresource {}", a.subresource),
        ),
        (false, _, _) => (
            false,
            format!("Floodgate is read-only: verb {:?} is not allowed", a.verb),
        ),
    };
    json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {},
        "spec": { "resourceAttributes": {
            "namespace": a.namespace, "verb": a.verb, "group": a.group, "resource": a.resource,
        }},
        "status": { "allowed": allowed, "reason": reason },
    })
}

/// A body we could not read at all.
pub fn unsupported(content_type: &str) -> StatusError {
    StatusError::new(
        Reason::UnsupportedMediaType,
        format!("unsupported content type {content_type:?}"),
    )
}

/// A review of `verb` on `resource` in `group`, encoded exactly as client-go sends it: the
/// `k8s\0` magic, then a `runtime.Unknown` carrying the SelfSubjectAccessReview (for tests and
/// tools that replay Linkerd's requests).
pub fn client_go_body(verb: &str, group: &str, resource: &str) -> Vec<u8> {
    use k8s_pb::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReviewSpec};
    let attrs = ResourceAttributes {
        namespace: Some(String::new()),
        verb: Some(verb.into()),
        group: Some(group.into()),
        version: Some(String::new()),
        resource: Some(resource.into()),
        subresource: Some(String::new()),
        name: Some(String::new()),
        ..Default::default()
    };
    let review = SelfSubjectAccessReview {
        spec: Some(SelfSubjectAccessReviewSpec {
            resource_attributes: Some(attrs),
            non_resource_attributes: None,
        }),
        ..Default::default()
    };
    protobuf::envelope(
        "authorization.k8s.io/v1",
        "SelfSubjectAccessReview",
        &review.encode_to_vec(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::KINDS;

    #[test]
    fn protobuf_reviews_from_client_go_are_read() {
        let served: Vec<_> = KINDS.iter().collect();
        let a = parse(
            &client_go_body("list", "", "pods"),
            "application/vnd.kubernetes.protobuf",
        )
        .expect("decodes");
        assert_eq!((a.verb.as_str(), a.resource.as_str()), ("list", "pods"));
        assert_eq!(answer(&a, &served)["status"]["allowed"], true);
        let srv = parse(
            &client_go_body("list", "policy.linkerd.io", "servers"),
            "application/vnd.kubernetes.protobuf",
        )
        .expect("decodes");
        assert_eq!(answer(&srv, &served)["status"]["allowed"], true);
    }

    #[test]
    fn json_reviews_and_refusals() {
        let served: Vec<_> = KINDS.iter().collect();
        let body = br#"{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview","spec":{"resourceAttributes":{"verb":"delete","resource":"pods"}}}"#;
        let a = parse(body, "application/json").expect("json");
        let ans = answer(&a, &served);
        assert_eq!(ans["status"]["allowed"], false);
        assert!(
            ans["status"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("read-only"))
        );
        let secrets = Attributes {
            verb: "get".into(),
            resource: "secrets".into(),
            ..Default::default()
        };
        assert_eq!(answer(&secrets, &served)["status"]["allowed"], false);
        assert!(parse(b"k8s\0\xff\xff", "application/vnd.kubernetes.protobuf").is_err());
        assert!(parse(b"{not json", "application/json").is_err());
    }
}
