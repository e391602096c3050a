//! The admin API on `--admin-listen`: how operators and their tools see and steer the links.
//!
//! ```text
//! GET  /                          the status page (one self-contained HTML file)
//! GET  /links                     every link: phase, quarantine, counters
//! GET  /links/{name}              one link, with its contained services
//! POST /links/{name}/release      release a quarantined link          (bearer token)
//! POST /links/{name}/quarantine   quarantine a link, {"message": ".."} (bearer token)
//! POST /links/{name}/services/{namespace}/{service}/release
//!                                 release a contained service         (bearer token)
//! GET  /history                   every link's rates over the last 10 minutes
//! GET  /config                    the effective configuration, secrets redacted
//! GET  /metrics                   Prometheus text (see [`crate::metrics`])
//! GET  /livez, /readyz            health (see [`crate::server::health_router`])
//! ```
//!
//! Reads are open (the admin port is meant for the cluster's network, like a metrics port);
//! the mutating routes need the bearer token read from `--admin-token-file`, compared in
//! constant time. Without a token file they are refused with 403. Every error is a JSON body
//! `{"error": ".."}` with its status code. Links answer through their [`LinkHandle`]s: a
//! transition that makes no sense in the link's state is a 409, a service the link does not
//! select a 404. In cluster mode a replica that does not hold a link's Lease passes the
//! command to the holder through the Link ([`crate::command`]) and answers with the holder's
//! answer (202 when none came within [`RELAY_WAIT`]).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::churn::quarantine::Transition;
use crate::command::{COMMAND_TIMEOUT, Order, Outcome, RELAY_WAIT, SendError, refusal_code};
use crate::kubeapi::bearer;
use crate::link::LinkError;
use crate::metrics::Metrics;
use crate::model::NsName;
use crate::registry::{Entry, Registry};

pub mod history;
pub mod links;

/// Largest request body the admin API reads: a quarantine message is a sentence.
pub const BODY_LIMIT: usize = 64 * 1024;

/// Longest an admin request may take (a link busy ingesting answers commands between batches).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The status page.
const PAGE: &str = include_str!("admin/page.html");

/// What the admin routes read.
#[derive(Debug)]
pub struct AdminState {
    /// The links served.
    pub links: Arc<Registry>,
    /// The effective configuration, already redacted.
    pub config: Value,
    /// The bearer token of the mutating routes; `None` disables them.
    pub token: Option<crate::auth::Token>,
    /// The metrics registry.
    pub metrics: Metrics,
    /// The last ten minutes of every link's rates.
    pub history: Arc<history::History>,
}

impl AdminState {
    fn link(&self, name: &str) -> Result<Arc<Entry>, AdminError> {
        self.links
            .get(name)
            .ok_or_else(|| AdminError::NotFound(format!("no link named {name:?}")))
    }

    fn authorize(&self, headers: &HeaderMap) -> Result<(), AdminError> {
        let Some(expected) = &self.token else {
            return Err(AdminError::Forbidden(
                "mutating admin routes are disabled: start floodgate with --admin-token-file FILE \
                 (or FLOODGATE_ADMIN_TOKEN_FILE) holding a bearer token to enable them"
                    .to_owned(),
            ));
        };
        match bearer(headers) {
            Some(t) if expected.opens(t) => Ok(()),
            Some(_) => Err(AdminError::Unauthorized("the bearer token is wrong")),
            None => Err(AdminError::Unauthorized(
                "a bearer token is required (Authorization: Bearer <token>)",
            )),
        }
    }
}

/// Why an admin request was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// 400: the body is not what the route takes.
    #[error("{0}")]
    BadRequest(String),
    /// 401: no token, or the wrong one.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// 403: mutating routes are disabled.
    #[error("{0}")]
    Forbidden(String),
    /// 404: no such link or route.
    #[error("{0}")]
    NotFound(String),
    /// 405: the route exists, not with this method.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 409: the transition makes no sense in the link's state.
    #[error("{0}")]
    Conflict(String),
    /// 503: the link's task is gone (shutting down).
    #[error("{0}")]
    Unavailable(String),
}

impl AdminError {
    /// The same refusal, its message saying what it is about (`service prod/web: ..`).
    fn about(self, what: &str) -> Self {
        match self {
            AdminError::NotFound(m) => AdminError::NotFound(format!("{what}: {m}")),
            AdminError::Conflict(m) => AdminError::Conflict(format!("{what}: {m}")),
            other => other,
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            AdminError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AdminError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            AdminError::Forbidden(_) => StatusCode::FORBIDDEN,
            AdminError::NotFound(_) => StatusCode::NOT_FOUND,
            AdminError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            AdminError::Conflict(_) => StatusCode::CONFLICT,
            AdminError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut resp = (status, Json(json!({ "error": self.to_string() }))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

impl From<LinkError> for AdminError {
    /// By [`refusal_code`], the code a command written on a Link is answered with too.
    fn from(e: LinkError) -> Self {
        let message = match &e {
            LinkError::Refused(r) => r.to_string(),
            LinkError::Stopped => e.to_string(),
        };
        match refusal_code(&e) {
            404 => AdminError::NotFound(message),
            409 => AdminError::Conflict(message),
            _ => AdminError::Unavailable(message),
        }
    }
}

/// The admin routes (health excluded: [`crate::server`] merges it in), with tracing, a timeout
/// and a body limit.
pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/links", get(list_links))
        .route("/links/{name}", get(get_link))
        .route("/links/{name}/release", post(release))
        .route("/links/{name}/quarantine", post(quarantine))
        .route(
            "/links/{name}/services/{namespace}/{service}/release",
            post(release_service),
        )
        .route("/history", get(get_history))
        .route("/config", get(get_config))
        .route("/metrics", get(get_metrics))
        .with_state(state)
}

/// Adds the JSON 404/405 answers and the layers; call on the full admin router.
pub fn finish(router: Router) -> Router {
    router
        .fallback(|uri: axum::http::Uri| async move {
            AdminError::NotFound(format!("no admin route {}", uri.path()))
        })
        .method_not_allowed_fallback(
            |method: axum::http::Method, uri: axum::http::Uri| async move {
                AdminError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
            },
        )
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        // A 5xx here is a 503 from /readyz or a link that is stopping: routine, not an ERROR.
        .layer(
            TraceLayer::new_for_http().on_failure(
                tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
            ),
        )
}

async fn list_links(State(s): State<Arc<AdminState>>) -> Json<Value> {
    let links: Vec<Value> = s.links.all().iter().map(|l| links::describe(l)).collect();
    Json(json!({ "links": links }))
}

async fn get_link(
    State(s): State<Arc<AdminState>>,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<Value>, AdminError> {
    let link = s.link(&name)?;
    Ok(Json(links::describe(&link)))
}

/// The optional body of the mutating routes.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    message: Option<String>,
}

fn parse_body(body: &Bytes) -> Result<Request, AdminError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Request::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        AdminError::BadRequest(format!(
            "the body must be empty or {{\"message\": \"..\"}}: {e}"
        ))
    })
}

/// What every mutating route checks first, in this order: the token (401/403), the link (404),
/// the body (400).
fn operator_request(
    s: &AdminState,
    name: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Arc<Entry>, Request), AdminError> {
    s.authorize(headers)?;
    Ok((s.link(name)?, parse_body(body)?))
}

/// Who the admin API's commands are from, in transitions and logs.
const BY: &str = "an operator through the admin API";

async fn release(
    State(s): State<Arc<AdminState>>,
    UrlPath(name): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, AdminError> {
    command(&s, &name, &headers, &body, |_| Order::Release).await
}

async fn release_service(
    State(s): State<Arc<AdminState>>,
    UrlPath((name, namespace, service)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, AdminError> {
    let svc = NsName::new(&namespace, &service);
    command(&s, &name, &headers, &body, |_| Order::ReleaseService(svc)).await
}

async fn quarantine(
    State(s): State<Arc<AdminState>>,
    UrlPath(name): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, AdminError> {
    command(&s, &name, &headers, &body, Order::Quarantine).await
}

/// The one path of the mutating routes: check the request ([`operator_request`]), then, in a
/// cluster, pass the [`Order`] made from its message to the Lease holder through the Link
/// (this replica's own holder loop included, so every command gets its Event); standalone,
/// carry it out here with [`Order::apply`], as a command written on a Link is.
async fn command(
    s: &AdminState,
    name: &str,
    headers: &HeaderMap,
    body: &Bytes,
    order: impl FnOnce(Option<String>) -> Order,
) -> Result<Response, AdminError> {
    let (link, req) = operator_request(s, name, headers, body)?;
    let note = req.message.clone().unwrap_or_default();
    let order = order(req.message);
    if let Some(relay) = &link.relay {
        return forwarded(name, relay.forward(order).await);
    }
    let applied = answer(name, order.apply(&link.handle, BY)).await;
    let t = match &order {
        Order::ReleaseService(svc) => applied.map_err(|e| e.about(&format!("service {svc}")))?,
        _ => applied?,
    };
    let body = match &order {
        Order::Release => {
            tracing::warn!(link = %name, message = note, "released by an operator");
            json!({ "link": name, "transition": t })
        }
        Order::ReleaseService(svc) => {
            tracing::warn!(link = %name, service = %svc, message = note, "service released by an operator");
            json!({ "link": name, "service": svc, "transition": t })
        }
        Order::Quarantine(_) => json!({ "link": name, "transition": t }),
    };
    Ok(Json(body).into_response())
}

/// The answer to a command passed on to the Lease holder: the holder's own code and message,
/// or 202 when it has not answered yet.
fn forwarded(name: &str, sent: Result<Option<Outcome>, SendError>) -> Result<Response, AdminError> {
    match sent {
        Ok(Some(o)) => {
            let code = StatusCode::from_u16(o.code).unwrap_or(StatusCode::BAD_GATEWAY);
            let key = if code.is_success() { "message" } else { "error" };
            let body = json!({
                "link": name, key: o.message, "command": o.command, "decidedBy": o.decided_by,
            });
            Ok((code, Json(body)).into_response())
        }
        Ok(None) => Ok((
            StatusCode::ACCEPTED,
            Json(json!({
                "link": name,
                "message": format!(
                    "passed to the link's Lease holder through the Link's {} annotation; no answer within {}s (see the Link's {} annotation and Events)",
                    crate::command::COMMAND, RELAY_WAIT.as_secs(), crate::command::COMMAND_RESULT,
                ),
            })),
        )
            .into_response()),
        Err(e @ SendError::Pending { .. }) => Err(AdminError::Conflict(e.to_string())),
        Err(e @ SendError::NoLink(_)) => Err(AdminError::NotFound(e.to_string())),
        Err(e @ SendError::Api(..)) => Err(AdminError::Unavailable(e.to_string())),
    }
}

/// A link's answer to a command, or 503 when it does not come in time.
async fn answer(
    name: &str,
    request: impl std::future::Future<Output = Result<Transition, LinkError>>,
) -> Result<Transition, AdminError> {
    match tokio::time::timeout(COMMAND_TIMEOUT, request).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(AdminError::Unavailable(format!(
            "link {name} did not answer within {}s",
            COMMAND_TIMEOUT.as_secs()
        ))),
    }
}

async fn get_history(State(s): State<Arc<AdminState>>) -> Json<Value> {
    Json(s.history.to_json())
}

async fn get_config(State(s): State<Arc<AdminState>>) -> Json<Value> {
    Json(s.config.clone())
}

async fn get_metrics(State(s): State<Arc<AdminState>>) -> Response {
    match s.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({ "error": format!("encoding metrics: {e}") })),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests;
