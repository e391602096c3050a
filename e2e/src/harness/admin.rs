//! A small client of Floodgate's admin API (plain HTTP on loopback), for scenario tests.

use std::net::SocketAddr;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// One admin request: the status and the body (JSON when it parses, a string otherwise).
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> anyhow::Result<(u16, Value)> {
    let (status, text) = call_text(addr, method, path, token, body).await?;
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, v))
}

/// One admin request: the status and the body as text.
pub async fn call_text(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = client
        .request(req.body(Full::new(Bytes::from(body.to_owned())))?)
        .await?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// A command to the admin API with its bearer token: the status and the JSON body. Panics when
/// the request cannot be made at all (the tests' Floodgate is on loopback).
pub async fn post(addr: SocketAddr, path: &str, token: &str, body: &str) -> (u16, Value) {
    call(addr, "POST", path, Some(token), body)
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

/// `GET /links/{name}`'s body, `None` unless it answers 200.
pub async fn link(addr: SocketAddr, name: &str) -> Option<Value> {
    match call(addr, "GET", &format!("/links/{name}"), None, "").await {
        Ok((200, v)) => Some(v),
        _ => None,
    }
}

/// The metrics the shipped alerts and dashboard use (`manifests/monitoring/metrics.txt`) that
/// the exposition `text` does not serve: a name is served when a `# TYPE` line declares it
/// (a counter's samples carry `_total`, a histogram's `_bucket`, `_sum` and `_count`).
pub fn unserved_monitoring_metrics(text: &str) -> Vec<String> {
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../manifests/monitoring/metrics.txt"
    );
    let wanted = std::fs::read_to_string(file).expect("manifests/monitoring/metrics.txt");
    let declared: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect();
    wanted
        .lines()
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .filter(|m| {
            let base = m.strip_suffix("_total").unwrap_or(m);
            !declared.contains(m) && !declared.contains(base)
        })
        .map(str::to_owned)
        .collect()
}
