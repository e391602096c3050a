//! Router tests: every admin route and error, with `oneshot`, against real links whose remote
//! is the facade's own protocol code over an in-memory view (no sockets).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use floodgate_link_crd::{LinkSpec, LinksFile, NamedLink, Phase, RemoteSpec};
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::Service;
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;
use tower::ServiceExt as _;

use super::*;
use crate::credentials::{TlsSource, TokenError, read_token};
use crate::kubeapi::ApiStore;
use crate::link::LinkHandle;
use crate::link::{self, Connect};
use crate::model::{KINDS, KindDef};
use crate::model::{Kind, Object};
use crate::server::health_router;
use crate::serving::ServeConfig;
use crate::view::{self, View};

const TOKEN: &str = "s3cret-admin-token";

/// The remote: one exported service, served by the facade's code from a view.
#[derive(Debug)]
struct Remote {
    view: View,
}

impl ApiStore for Remote {
    fn view(&self) -> &View {
        &self.view
    }

    fn served(&self) -> Vec<&'static KindDef> {
        KINDS.iter().filter(|r| r.kind != Kind::Server).collect()
    }
}

fn mk_service(name: &str) -> Object {
    let mut s = Service::default();
    s.metadata.name = Some(name.to_owned());
    s.metadata.namespace = Some("prod".to_owned());
    s.metadata.uid = Some(format!("uid-{name}"));
    s.metadata.labels = Some(
        [("mirror.linkerd.io/exported".to_owned(), "true".to_owned())]
            .into_iter()
            .collect(),
    );
    Object::Service(Arc::new(s))
}

/// A kube client whose requests go straight into a facade router over `view`.
fn mk_client(view: View) -> kube::Client {
    let api = Arc::new(crate::kubeapi::Api::new(Remote { view }, "remote"));
    let svc = crate::kubeapi::router(api).map_request(|mut r: Request<kube::client::Body>| {
        r.headers_mut().insert(
            header::AUTHORIZATION,
            header::HeaderValue::from_static("Bearer remote"),
        );
        r
    });
    kube::Client::new(svc, "default")
}

struct Fixture {
    router: Router,
    links: Vec<Arc<LinkHandle>>,
    _shutdown: watch::Sender<bool>,
}

/// Links `east` (synced, one service) and `west` (its remote never answers), and the admin
/// router over them, the way `floodgate run` assembles it.
async fn mk_admin(token: Option<&str>) -> Fixture {
    let (shutdown_tx, shutdown) = watch::channel(false);
    let remote = View::new(7, view::DEFAULT_HISTORY);
    remote.apply([view::Change::Upsert(mk_service("web"))], Instant::now());
    let connect: Connect = Arc::new(move || {
        let client = mk_client(remote.clone());
        Box::pin(async move { Ok(client) })
    });
    let never: Connect =
        Arc::new(|| Box::pin(async { Err(anyhow::anyhow!("no route to the remote")) }));
    let spec = LinkSpec::with_remote(RemoteSpec {
        kubeconfig_path: Some("/etc/floodgate/east.kubeconfig".into()),
        ..Default::default()
    });
    let east = link::spawn("east", spec.clone(), connect, 1, None, shutdown.clone());
    let west = link::spawn("west", spec.clone(), never, 2, None, shutdown.clone());
    let links = vec![Arc::new(east), Arc::new(west)];
    let registry = Arc::new(Registry::new());
    for l in &links {
        registry.insert(l.clone(), &format!("link-token-{}", l.name));
    }
    let serving = ServeConfig {
        listen: "127.0.0.1:6443".parse().expect("addr"),
        admin_listen: "127.0.0.1:9990".parse().expect("addr"),
        grpc_listen: "127.0.0.1:8090".parse().expect("addr"),
        state_dir: "/var/lib/floodgate".into(),
        tls: TlsSource::SelfSigned,
        hosts: vec![],
        admin_token_file: token.map(|_| "/etc/floodgate/admin-token".into()),
        limits: Default::default(),
        shutdown_timeout: crate::server::DEFAULT_SHUTDOWN_TIMEOUT,
        link_starts_per_second: crate::link::DEFAULT_LINK_STARTS_PER_SECOND,
    };
    let mut config = serving.to_json();
    let file = LinksFile {
        links: vec![NamedLink {
            name: "east".into(),
            spec,
        }],
    };
    config.insert(
        "links".into(),
        serde_json::to_value(&file.links).expect("links"),
    );
    let state = Arc::new(AdminState {
        links: registry.clone(),
        config: Value::Object(config),
        token: token.map(crate::auth::Token::new),
        metrics: Metrics::new(registry.clone()),
        history: Arc::default(),
    });
    let (_, gate) = watch::channel(true);
    let router = finish(router(state).merge(health_router(registry, gate, shutdown)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !links[0].state.borrow().synced {
        assert!(
            tokio::time::Instant::now() < deadline,
            "east syncs from its in-memory remote"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Fixture {
        router,
        links,
        _shutdown: shutdown_tx,
    }
}

async fn call(
    router: &Router,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (StatusCode, String) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let resp = router
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).expect("request"))
        .await
        .expect("infallible");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

async fn call_json(
    router: &Router,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (StatusCode, Value) {
    let (status, text) = call(router, method, path, token, body).await;
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
    (status, v)
}

fn error_of(v: &Value) -> &str {
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {v}"))
}

#[tokio::test]
async fn links_are_listed_and_described() {
    let f = mk_admin(Some(TOKEN)).await;
    let (status, v) = call_json(&f.router, "GET", "/links", None, "").await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = v["links"]
        .as_array()
        .expect("links")
        .iter()
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert_eq!(names, ["east", "west"]);
    let (status, east) = call_json(&f.router, "GET", "/links/east", None, "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(east["phase"], "Healthy");
    assert_eq!(east["synced"], true);
    assert_eq!(east["quarantine"], Value::Null);
    assert_eq!(east["counters"]["services"], 1);
    assert!(
        east["counters"]["upstreamEvents"].as_u64() >= Some(1),
        "{east}"
    );
    assert_eq!(east["upstreamEventsByResource"]["Service"], 1);
    assert_eq!(east["objectsHeldByResource"]["Service"], 1, "{east}");
    let bytes = f.links[0].view.json_bytes() as u64;
    assert!(bytes > 0);
    assert_eq!(east["counters"]["viewBytes"], bytes, "{east}");
    let (_, west) = call_json(&f.router, "GET", "/links/west", None, "").await;
    assert_eq!(west["phase"], "Degraded");
    assert!(
        west["message"]
            .as_str()
            .is_some_and(|m| m.contains("no route")),
        "{west}"
    );
}

#[tokio::test]
async fn unknown_links_paths_and_methods_get_json_errors() {
    let f = mk_admin(Some(TOKEN)).await;
    let (status, v) = call_json(&f.router, "GET", "/links/nope", None, "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error_of(&v).contains("nope"));
    let (status, v) = call_json(&f.router, "POST", "/links/nope/release", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (status, v) = call_json(&f.router, "GET", "/no/such/route", None, "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error_of(&v).contains("/no/such/route"));
    let (status, v) = call_json(&f.router, "GET", "/links/east/release", None, "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(error_of(&v).contains("GET"), "{v}");
    let (status, _) = call_json(&f.router, "DELETE", "/links", None, "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn mutating_routes_need_the_token() {
    let f = mk_admin(Some(TOKEN)).await;
    for path in ["/links/east/release", "/links/east/quarantine"] {
        let (status, v) = call_json(&f.router, "POST", path, None, "").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert!(error_of(&v).contains("required"));
        let (status, v) = call_json(&f.router, "POST", path, Some("guess"), "").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert!(error_of(&v).contains("wrong"));
    }
    assert_eq!(f.links[0].state.borrow().phase, Phase::Healthy);
}

#[tokio::test]
async fn without_a_token_file_mutating_routes_are_forbidden() {
    let f = mk_admin(None).await;
    let (status, v) = call_json(&f.router, "POST", "/links/east/quarantine", Some("x"), "").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(error_of(&v).contains("--admin-token-file"), "{v}");
    let (_, cfg) = call_json(&f.router, "GET", "/config", None, "").await;
    assert_eq!(cfg["mutatingRoutes"], "disabled");
}

#[tokio::test]
async fn quarantine_and_release_with_conflicts() {
    let f = mk_admin(Some(TOKEN)).await;
    let (status, v) = call_json(&f.router, "POST", "/links/east/release", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(error_of(&v).contains("not quarantined"));
    let (status, v) = call_json(
        &f.router,
        "POST",
        "/links/east/quarantine",
        Some(TOKEN),
        r#"{"message": "maintenance on east"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["transition"]["to"], "Quarantined");
    let (status, v) = call_json(&f.router, "POST", "/links/east/quarantine", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(error_of(&v).contains("already"));
    let (_, east) = call_json(&f.router, "GET", "/links/east", None, "").await;
    assert_eq!(east["phase"], "Quarantined");
    assert_eq!(east["quarantine"]["reason"], "Manual");
    assert_eq!(east["quarantine"]["message"], "maintenance on east");
    let since = east["quarantine"]["since"].as_str().expect("since");
    let ts: jiff::Timestamp = since.parse().expect("RFC 3339");
    let skew = jiff::Timestamp::now().duration_since(ts).unsigned_abs();
    assert!(skew < Duration::from_secs(60), "{since}");
    let (status, v) = call_json(&f.router, "POST", "/links/east/release", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["transition"]["to"], "Active");
    let (_, east) = call_json(&f.router, "GET", "/links/east", None, "").await;
    assert_eq!(east["quarantine"], Value::Null, "{east}");
}

#[tokio::test]
async fn a_service_release_needs_the_token_a_selected_service_and_a_containment() {
    let f = mk_admin(Some(TOKEN)).await;
    let path = "/links/east/services/prod/web/release";
    let (status, v) = call_json(&f.router, "POST", path, None, "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    let (status, v) = call_json(&f.router, "POST", path, Some("guess"), "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    // Selected, not contained: 409, and nothing changes.
    let before = f.links[0].state.borrow().counters;
    let (status, v) = call_json(&f.router, "POST", path, Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(
        error_of(&v),
        "service prod/web: the service is not contained"
    );
    // Not selected (no such service): 404 naming it.
    let (status, v) = call_json(
        &f.router,
        "POST",
        "/links/east/services/prod/nope/release",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert!(error_of(&v).contains("prod/nope"), "{v}");
    let (status, _) = call_json(
        &f.router,
        "POST",
        "/links/nope/services/prod/web/release",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call_json(&f.router, "POST", path, Some(TOKEN), "{bad").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = call_json(&f.router, "GET", path, None, "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let east = f.links[0].state.borrow().clone();
    assert_eq!(east.phase, Phase::Healthy);
    assert_eq!(east.counters, before, "refused releases change nothing");
    let (_, east) = call_json(&f.router, "GET", "/links/east", None, "").await;
    assert_eq!(east["contained"], serde_json::json!([]), "{east}");
}

#[tokio::test]
async fn a_bad_body_is_a_400_and_a_link_still_connecting_takes_commands() {
    let f = mk_admin(Some(TOKEN)).await;
    for body in ["{not json", r#"{"msg": "typo"}"#, r#"{"message": 3}"#] {
        let (status, v) = call_json(
            &f.router,
            "POST",
            "/links/east/quarantine",
            Some(TOKEN),
            body,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(error_of(&v).contains("message"), "{v}");
    }
    assert_eq!(f.links[0].state.borrow().phase, Phase::Healthy);
    // west never reached its remote; its task answers operators all the same (a link restored
    // quarantined from disk must be releasable while its remote is down).
    let (status, v) = call_json(&f.router, "POST", "/links/west/quarantine", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["transition"]["to"], "Quarantined", "{v}");
}

#[tokio::test]
async fn config_is_served_without_secrets() {
    let f = mk_admin(Some(TOKEN)).await;
    let (status, text) = call(&f.router, "GET", "/config", None, "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(!text.contains(TOKEN), "{text}");
    assert!(!text.contains("link-token-"), "{text}");
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["adminTokenFile"], "/etc/floodgate/admin-token");
    assert_eq!(v["mutatingRoutes"], "enabled");
    assert_eq!(
        v["links"][0]["spec"]["remote"]["kubeconfigPath"],
        "/etc/floodgate/east.kubeconfig"
    );
    assert_eq!(
        v["links"][0]["spec"]["caps"]["maxEndpointsPerService"],
        1000
    );
}

#[tokio::test]
async fn health_answers_as_before() {
    let f = mk_admin(Some(TOKEN)).await;
    let (status, text) = call(&f.router, "GET", "/livez", None, "").await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "ok\n"));
    let (status, text) = call(&f.router, "GET", "/readyz", None, "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(text, "not synced yet: west\n");
}

#[tokio::test]
async fn the_status_page_is_self_contained() {
    let f = mk_admin(Some(TOKEN)).await;
    let resp = f
        .router
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).expect("request"))
        .await
        .expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    let ct = resp.headers()[header::CONTENT_TYPE]
        .to_str()
        .expect("ascii");
    assert!(ct.starts_with("text/html"), "{ct}");
    let page = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .to_vec(),
    )
    .expect("utf-8");
    for asset in ["src=", "href=", "@import", "url("] {
        assert!(!page.contains(asset), "the page loads nothing: {asset}");
    }
    assert!(page.contains("fetch(\"links\""));
    assert!(page.contains("/release"));
}

#[test]
fn engine_instants_become_wall_clock_times() {
    let now = tokio::time::Instant::now();
    let wall = std::time::UNIX_EPOCH + Duration::from_secs(1_764_579_600);
    let at = now.checked_sub(Duration::from_millis(1500)).expect("past");
    assert_eq!(
        links::wall_clock(at, now, wall).as_deref(),
        Some("2025-12-01T08:59:58.5Z")
    );
}

#[tokio::test]
async fn metrics_parse_and_follow_the_links() {
    let f = mk_admin(Some(TOKEN)).await;
    let (status, v) = call_json(&f.router, "POST", "/links/east/quarantine", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, text) = call(&f.router, "GET", "/metrics", None, "").await;
    assert_eq!(status, StatusCode::OK);
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("exposition format");
    let value = |name: &str, labels: &[(&str, &str)]| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| {
                s.metric == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(k).is_some_and(|x| x == *v))
            })
            .unwrap_or_else(|| panic!("no sample {name} {labels:?} in\n{text}"));
        match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => panic!("{name}: not a number"),
        }
    };
    let east = [("link", "east")];
    assert_eq!(value("floodgate_link_quarantined", &east), 1.0);
    assert_eq!(
        value(
            "floodgate_link_phase",
            &[("link", "east"), ("phase", "Quarantined")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "floodgate_link_phase",
            &[("link", "east"), ("phase", "Healthy")]
        ),
        0.0
    );
    assert_eq!(
        value(
            "floodgate_link_phase",
            &[("link", "west"), ("phase", "Degraded")]
        ),
        1.0
    );
    assert_eq!(value("floodgate_quarantine_transitions_total", &east), 1.0);
    assert_eq!(value("floodgate_services", &east), 1.0);
    assert_eq!(value("floodgate_link_synced", &east), 1.0);
    assert_eq!(value("floodgate_link_synced", &[("link", "west")]), 0.0);
    assert_eq!(
        value(
            "floodgate_upstream_resource_events_total",
            &[("link", "east"), ("resource", "Service")]
        ),
        1.0
    );
    assert!(
        value(
            "floodgate_upstream_events_total",
            &[("link", "east"), ("relevance", "relevant")]
        ) >= 1.0
    );
    // Six resources listed once each (the remote has no Linkerd policy API; linkerd-config
    // is one), by six watchers that keep running.
    assert_eq!(value("floodgate_upstream_relists_total", &east), 6.0);
    assert_eq!(value("floodgate_upstream_watchers", &east), 6.0);
    for name in [
        "floodgate_downstream_updates_total",
        "floodgate_coalesced_total",
        "floodgate_throttled_total",
        "floodgate_endpoints_published",
        "floodgate_endpoints_truncated",
        "floodgate_watchers",
        "floodgate_upstream_errors_total",
        "floodgate_upstream_decode_errors_total",
        "floodgate_upstream_forced_relists_total",
        "floodgate_upstream_refusals_total",
        "floodgate_upstream_oversized_total",
        "floodgate_upstream_pods_skipped_total",
        "floodgate_view_bytes",
        "floodgate_discarded_writes_total",
    ] {
        assert!(value(name, &east) >= 0.0, "{name}");
    }
}

#[test]
fn the_token_file_is_trimmed_and_must_hold_a_token() {
    let dir = std::env::temp_dir().join(format!("floodgate-admin-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let good = dir.join("token");
    std::fs::write(&good, "  abc123\n").expect("write");
    assert_eq!(read_token(&good).expect("token"), "abc123");
    let empty = dir.join("empty");
    std::fs::write(&empty, "\n").expect("write");
    assert!(matches!(read_token(&empty), Err(TokenError::Empty(_))));
    assert!(matches!(
        read_token(&dir.join("missing")),
        Err(TokenError::Read { .. })
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

mod race;
mod state_json;
