//! The status page in a real browser: headless Chromium driven over WebDriver (chromedriver,
//! started by the test on a free loopback port) loads `GET /`, sees a quarantined link, clicks
//! its Release button, answers the token prompt, and sees the link Healthy; then sees a
//! contained service under the link and releases it the same way.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them). Without them the
//! test fails and says how to install them: a browser test that skips proves nothing.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use fantoccini::{ClientBuilder, Locator};
use floodgate_e2e::admin;
use floodgate_e2e::drivers::Cluster;
use floodgate_e2e::gateway::Stack;
use floodgate_e2e::sim::SimStore;
use floodgate_e2e::until;
use floodgate_link_crd::Phase;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;

const INSTALL: &str = "install them with `apt-get update && apt-get install -y chromium chromium-driver` (bash .ci/run does)";

/// The first of `names` found on PATH.
fn on_path(names: &[&str]) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("addr").port()
}

/// Starts chromedriver on a free port and waits until it accepts connections.
async fn chromedriver(driver: &std::path::Path) -> (tokio::process::Child, SocketAddr) {
    let port = free_port();
    let child = tokio::process::Command::new(driver)
        .arg(format!("--port={port}"))
        .arg("--allowed-ips=127.0.0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}; {INSTALL}", driver.display()));
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "chromedriver listens on {addr} within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (child, addr)
}

/// The text of the first element matching `css`, if any.
async fn text_of(c: &fantoccini::Client, css: &str) -> Option<String> {
    let e = c.find(Locator::Css(css)).await.ok()?;
    e.text().await.ok()
}

async fn wait_text(c: &fantoccini::Client, css: &str, want: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let got = text_of(c, css).await;
        if got.as_deref() == Some(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{css} shows {want:?} within 20 s (it shows {got:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_releases_a_quarantined_link_and_a_contained_service_in_chromium() {
    let browser = on_path(&["chromium", "chromium-browser", "google-chrome"])
        .unwrap_or_else(|| panic!("no Chromium on PATH: {INSTALL}"));
    let driver =
        on_path(&["chromedriver"]).unwrap_or_else(|| panic!("no chromedriver on PATH: {INSTALL}"));

    let store = Arc::new(SimStore::new(62, 1000));
    let mut cluster = Cluster::new(store.clone(), "prod");
    cluster.add_service("web", true);
    cluster.scale("web", 3, true);
    let mut spec = Stack::default_spec();
    // More than 8 upstream endpoints contain a service (at most 5 are served).
    spec.caps.max_endpoints_per_service = 5;
    spec.quarantine.when.endpoints_per_service = 8;
    let stack = Stack::start(store, spec).await.expect("stack");
    let (code, v) = admin::call(
        stack.admin_addr(),
        "POST",
        "/links/east/quarantine",
        Some(&stack.admin_token),
        r#"{"message": "browser test"}"#,
    )
    .await
    .expect("POST");
    assert_eq!(code, 200, "{v}");

    let (_driver, driver_addr) = chromedriver(&driver).await;
    let profile = tempfile::tempdir().expect("profile dir");
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": browser.display().to_string(),
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1280,800",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        }),
    );
    caps.insert("unhandledPromptBehavior".into(), json!("ignore"));
    // chromedriver speaks plain HTTP on loopback: no TLS connector needed.
    let c = ClientBuilder::new(HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://{driver_addr}"))
        .await
        .unwrap_or_else(|e| panic!("a Chromium session through chromedriver: {e}; {INSTALL}"));

    // The server's own history of the link: the page, opened now, starts from it.
    let history = async || {
        let (_, v) = admin::call(stack.admin_addr(), "GET", "/history", None, "")
            .await
            .expect("GET /history");
        v["links"]["east"].as_array().map_or(0, Vec::len)
    };
    until(20, "eight samples of east in /history", async || {
        history().await >= 8
    })
    .await;
    c.goto(&format!("http://{}/", stack.admin_addr()))
        .await
        .expect("load the status page");
    let row = r#"tr[data-link="east"]"#;
    wait_text(&c, &format!("{row} .phase"), "Quarantined").await;
    let points = c
        .find(Locator::Css(&format!("{row} svg.spark polyline")))
        .await
        .expect("a sparkline")
        .attr("points")
        .await
        .expect("points")
        .unwrap_or_default();
    // Seven rates from the server's eight samples at least; the page's own polls since it
    // loaded add one a second.
    assert!(
        points.split_whitespace().count() >= 7,
        "the sparkline starts from the server's history: {points:?}"
    );
    // A few samples, so the sparklines have something to draw; a picture for people.
    wait_text(&c, &format!("{row} .phase"), "Quarantined").await;
    let shot = c.screenshot().await.expect("screenshot");
    let shot_path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    std::fs::write(&shot_path, shot).expect("write the screenshot");
    eprintln!("status page screenshot: {}", shot_path.display());
    let lines = c
        .find_all(Locator::Css(&format!("{row} svg.spark polyline")))
        .await
        .expect("sparklines");
    assert_eq!(lines.len(), 2, "upstream and downstream sparklines");

    click_release(
        &c,
        &format!("{row} button.release"),
        &stack.admin_token,
        "link east",
    )
    .await;

    wait_text(&c, &format!("{row} .phase"), "Healthy").await;
    assert_eq!(stack.link().phase, Phase::Healthy);
    assert!(
        c.find(Locator::Css(&format!("{row} button.release")))
            .await
            .is_err(),
        "no Release button on a healthy link"
    );

    // A service grows past the threshold: contained, it shows under its link.
    cluster.add_service("injector", true);
    cluster.scale("injector", 12, true);
    stack
        .wait_link("the injector contained", Duration::from_secs(20), |s| {
            !s.containment.contained.is_empty()
        })
        .await
        .expect("contained");
    let contained = r#"tr.contained[data-service="prod/injector"]"#;
    wait_text(&c, &format!("{contained} .phase"), "Contained").await;
    let text = text_of(&c, contained).await.unwrap_or_default();
    assert!(text.contains("EndpointsPerService"), "{text}");
    // Its rollout is fixed; an operator releases it from the page.
    cluster.scale("injector", 4, true);
    click_release(
        &c,
        &format!("{contained} button.release"),
        &stack.admin_token,
        "service prod/injector",
    )
    .await;
    stack
        .wait_link("the service released", Duration::from_secs(20), |s| {
            s.containment.contained.is_empty()
        })
        .await
        .expect("released");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while c.find(Locator::Css(contained)).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the contained row goes within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(stack.link().phase, Phase::Healthy);
    c.close().await.expect("close the session");
}

/// Clicks the Release button `css` (the table is redrawn every second: it is found again when
/// it went stale), checks the prompt names `what`, and answers it with `token`.
async fn click_release(c: &fantoccini::Client, css: &str, token: &str, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let clicked = match c.find(Locator::Css(css)).await {
            Ok(b) => b.click().await.is_ok(),
            Err(_) => false,
        };
        if clicked {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Release button {css} can be clicked"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let prompt = c.get_alert_text().await.expect("the token prompt opens");
    assert!(
        prompt.contains("token") && prompt.contains(what),
        "{prompt}"
    );
    c.send_alert_text(token).await.expect("type the token");
    c.accept_alert().await.expect("accept the prompt");
}
