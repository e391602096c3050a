//! `metav1.Status` errors: every refusal the facade makes, with the code and reason the
//! Kubernetes API server would use, so clients react as they do against a real cluster.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The reasons the facade answers with (`metav1.StatusReason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// 400.
    BadRequest,
    /// 401.
    Unauthorized,
    /// 403.
    Forbidden,
    /// 404.
    NotFound,
    /// 405.
    MethodNotAllowed,
    /// 406.
    NotAcceptable,
    /// 409 on create.
    AlreadyExists,
    /// 409 on update with a stale resourceVersion.
    Conflict,
    /// 410.
    Expired,
    /// 413.
    RequestEntityTooLarge,
    /// 415.
    UnsupportedMediaType,
    /// 422.
    Invalid,
    /// 429.
    TooManyRequests,
    /// 500.
    InternalError,
    /// 503.
    ServiceUnavailable,
    /// 504.
    Timeout,
}

impl Reason {
    fn code(self) -> StatusCode {
        match self {
            Reason::BadRequest => StatusCode::BAD_REQUEST,
            Reason::Unauthorized => StatusCode::UNAUTHORIZED,
            Reason::Forbidden => StatusCode::FORBIDDEN,
            Reason::NotFound => StatusCode::NOT_FOUND,
            Reason::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Reason::NotAcceptable => StatusCode::NOT_ACCEPTABLE,
            Reason::AlreadyExists | Reason::Conflict => StatusCode::CONFLICT,
            Reason::Expired => StatusCode::GONE,
            Reason::RequestEntityTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Reason::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Reason::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
            Reason::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            Reason::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
            Reason::ServiceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Reason::Timeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Reason::BadRequest => "BadRequest",
            Reason::Unauthorized => "Unauthorized",
            Reason::Forbidden => "Forbidden",
            Reason::NotFound => "NotFound",
            Reason::MethodNotAllowed => "MethodNotAllowed",
            Reason::NotAcceptable => "NotAcceptable",
            Reason::AlreadyExists => "AlreadyExists",
            Reason::Conflict => "Conflict",
            Reason::Expired => "Expired",
            Reason::RequestEntityTooLarge => "RequestEntityTooLarge",
            Reason::UnsupportedMediaType => "UnsupportedMediaType",
            Reason::Invalid => "Invalid",
            Reason::TooManyRequests => "TooManyRequests",
            Reason::InternalError => "InternalError",
            Reason::ServiceUnavailable => "ServiceUnavailable",
            Reason::Timeout => "Timeout",
        }
    }
}

/// A refusal, rendered as a `metav1.Status`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct StatusError {
    /// The reason.
    pub reason: Reason,
    /// For people.
    pub message: String,
    /// `details`, when useful (`causes`, `retryAfterSeconds`, `name`, `kind`).
    pub details: Option<serde_json::Value>,
}

impl StatusError {
    /// A refusal with a reason and a message.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(Reason::BadRequest, message)
    }

    /// 422 Invalid.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Reason::Invalid, message)
    }

    /// 404 NotFound for an object.
    pub fn not_found(kind: &str, name: &str) -> Self {
        Self {
            details: Some(json!({ "name": name, "kind": kind })),
            ..Self::new(Reason::NotFound, format!("{kind} {name:?} not found"))
        }
    }

    /// 410 Expired: the version is older than the history the server holds.
    pub fn expired(resource_version: &str) -> Self {
        Self::new(
            Reason::Expired,
            format!("too old resource version: {resource_version}"),
        )
    }

    /// 504 Timeout with cause `ResourceVersionTooLarge`: the version is ahead of this server.
    pub fn too_large(resource_version: &str) -> Self {
        Self {
            details: Some(json!({
                "causes": [{ "reason": "ResourceVersionTooLarge", "message": "Too large resource version" }],
                "retryAfterSeconds": 1,
            })),
            ..Self::new(
                Reason::Timeout,
                format!("Too large resource version: {resource_version}"),
            )
        }
    }

    /// 503 with `retryAfterSeconds`.
    pub fn unavailable(message: impl Into<String>, retry_after_seconds: u32) -> Self {
        Self {
            details: Some(json!({ "retryAfterSeconds": retry_after_seconds })),
            ..Self::new(Reason::ServiceUnavailable, message)
        }
    }

    /// The HTTP status code.
    pub fn code(&self) -> StatusCode {
        self.reason.code()
    }

    /// The `metav1.Status` object.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason.name(),
            "code": self.code().as_u16(),
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }

    /// The same Status as a protobuf envelope (an in-stream ERROR of a protobuf watch). Its
    /// `details` carry the retry hint; the rest of them are in the JSON form only.
    pub fn to_protobuf(&self) -> Vec<u8> {
        use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb;
        use prost::Message as _;
        let retry = self
            .details
            .as_ref()
            .and_then(|d| d["retryAfterSeconds"].as_i64())
            .and_then(|s| i32::try_from(s).ok());
        let status = pb::Status {
            metadata: Some(pb::ListMeta::default()),
            status: Some("Failure".into()),
            message: Some(self.message.clone()),
            reason: Some(self.reason.name().into()),
            details: retry.map(|s| pb::StatusDetails {
                retry_after_seconds: Some(s),
                ..Default::default()
            }),
            code: Some(i32::from(self.code().as_u16())),
        };
        crate::protobuf::envelope("v1", "Status", &status.encode_to_vec())
    }
}

impl IntoResponse for StatusError {
    fn into_response(self) -> Response {
        let body = self.to_json().to_string();
        let mut resp = (self.code(), body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self
            .details
            .as_ref()
            .and_then(|d| d["retryAfterSeconds"].as_u64())
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}
