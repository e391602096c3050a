//! The same scenarios against `floodgate run` and `floodgate controller`: both modes are one
//! server ([`floodgate::server`]), so the admin API, `/metrics`, the status page, `/readyz`
//! and gRPC `WatchEndpoints` answer alike.

use std::time::Duration;

use floodgate_e2e::admin;
use floodgate_e2e::modes::{Mode, Served};
use floodgate_e2e::until;
use floodgate_proto::v1::WatchEndpointsRequest;
use floodgate_proto::v1::mirror_client::MirrorClient;
use tonic::Request;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// The admin API lists the link, `/metrics` shows it synced, the status page and its history
/// are served, and
/// `/readyz` says ok; a release without the admin token is 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_metrics_and_status_page_in_both_modes() {
    for mode in Mode::BOTH {
        let served = Served::start(mode, &["web"]).await;
        let addr = served.admin;
        until(10, "ready", async || {
            admin::call_text(addr, "GET", "/readyz", None, "")
                .await
                .is_ok_and(|(code, _)| code == 200)
        })
        .await;
        let (code, links) = admin::call(addr, "GET", "/links", None, "")
            .await
            .expect("GET /links");
        assert_eq!(code, 200, "{mode:?}: {links}");
        assert_eq!(links["links"][0]["name"], "east", "{mode:?}: {links}");
        assert_eq!(links["links"][0]["synced"], true, "{mode:?}: {links}");

        let (code, text) = admin::call_text(addr, "GET", "/metrics", None, "")
            .await
            .expect("GET /metrics");
        assert_eq!(code, 200, "{mode:?}");
        assert!(
            text.contains("floodgate_link_synced{link=\"east\"} 1"),
            "{mode:?}: {text}"
        );

        let (code, page) = admin::call_text(addr, "GET", "/", None, "")
            .await
            .expect("GET /");
        assert_eq!(code, 200, "{mode:?}");
        assert!(page.contains("<title>Floodgate</title>"), "{mode:?}");
        // The page's history: the server samples east every second.
        until(10, "two samples of east in /history", async || {
            admin::call(addr, "GET", "/history", None, "")
                .await
                .is_ok_and(|(code, v)| {
                    code == 200 && v["links"]["east"].as_array().is_some_and(|s| s.len() >= 2)
                })
        })
        .await;

        let (code, v) = admin::call(addr, "POST", "/links/east/release", None, "")
            .await
            .expect("POST");
        assert_eq!(code, 401, "{mode:?}: no token: {v}");
        let (code, v) = admin::call(addr, "POST", "/links/east/release", Some("wrong"), "")
            .await
            .expect("POST");
        assert_eq!(code, 401, "{mode:?}: wrong token: {v}");
        served.stop().await;
    }
}

/// A gRPC consumer of link `east` gets the service's snapshot with its two ready endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_watch_endpoints_in_both_modes() {
    for mode in Mode::BOTH {
        let served = Served::start(mode, &["web"]).await;
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&served.ca_pem))
            .domain_name("localhost");
        let channel = Endpoint::from_shared(format!("https://{}", served.grpc))
            .expect("url")
            .tls_config(tls)
            .expect("tls")
            .connect()
            .await
            .expect("connect");
        let mut req = Request::new(WatchEndpointsRequest {
            link: "east".into(),
            service: "prod/web".into(),
        });
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", served.token).parse().expect("ascii"),
        );
        let mut stream = MirrorClient::new(channel)
            .watch_endpoints(req)
            .await
            .expect("watch")
            .into_inner();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let snap = tokio::time::timeout(left, stream.message())
                .await
                .unwrap_or_else(|_| panic!("{mode:?}: two ready endpoints within 20 s"))
                .expect("no error")
                .expect("stream open");
            if snap.service == "web" && snap.endpoints.iter().filter(|e| e.ready).count() == 2 {
                break;
            }
        }
        served.stop().await;
    }
}
