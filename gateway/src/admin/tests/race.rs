//! Admin abuse: operators (or scripts) racing releases and quarantines of one link.

use axum::http::StatusCode;

use super::{TOKEN, call_json, mk_admin};

/// Twenty-four requests at once, half quarantining and half releasing east, three rounds: every
/// answer is 200 or 409, the successes alternate (a release only succeeds on a quarantined
/// link and a quarantine only on an active one), and the link's state agrees with the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_releases_and_quarantines_stay_consistent() {
    let f = mk_admin(Some(TOKEN)).await;
    let (mut quarantined, mut released) = (0i64, 0i64);
    for _round in 0..3 {
        let tasks: Vec<_> = (0..24)
            .map(|i| {
                let router = f.router.clone();
                let path = if i % 2 == 0 {
                    "/links/east/quarantine"
                } else {
                    "/links/east/release"
                };
                tokio::spawn(async move {
                    let (code, v) = call_json(&router, "POST", path, Some(TOKEN), "").await;
                    (path, code, v)
                })
            })
            .collect();
        for t in tasks {
            let (path, code, v) = t.await.expect("no panic in a handler");
            match code {
                StatusCode::OK if path.ends_with("quarantine") => quarantined += 1,
                StatusCode::OK => released += 1,
                StatusCode::CONFLICT => {}
                other => panic!("{path}: {other} {v}"),
            }
        }
        let (_, east) = call_json(&f.router, "GET", "/links/east", None, "").await;
        let is_quarantined = east["phase"] == "Quarantined";
        assert_eq!(
            quarantined - released,
            i64::from(is_quarantined),
            "successes alternate: {quarantined} quarantines, {released} releases, now {east}"
        );
        assert_eq!(east["quarantine"].is_null(), !is_quarantined, "{east}");
    }
    assert!(quarantined >= 1, "at least one quarantine won");
}

/// Unknown links answer 404 whatever the token; a wrong token is refused before anything
/// else happens to a known link.
#[tokio::test]
async fn unknown_links_and_wrong_tokens_change_nothing() {
    let f = mk_admin(Some(TOKEN)).await;
    for path in ["/links/nope/release", "/links/nope/quarantine"] {
        let (code, v) = call_json(&f.router, "POST", path, Some(TOKEN), "").await;
        assert_eq!(code, StatusCode::NOT_FOUND, "{path}: {v}");
    }
    for token in [None, Some(""), Some("wrong"), Some("link-token-east")] {
        let (code, v) = call_json(&f.router, "POST", "/links/east/quarantine", token, "").await;
        assert_eq!(code, StatusCode::UNAUTHORIZED, "{token:?}: {v}");
    }
    let (_, east) = call_json(&f.router, "GET", "/links/east", None, "").await;
    assert_eq!(east["phase"], "Healthy", "{east}");
}
