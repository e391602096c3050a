//! Protobuf through the router: negotiation in the Accept header's order, LIST, GET and WATCH
//! decoding with `k8s-pb` to the objects the JSON forms carry, and custom resources as JSON.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use k8s_pb::api::core::v1 as pb;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
use prost::Message;
use serde_json::Value;
use tokio::time::Instant;
use tower::ServiceExt;

use super::{api, fetch, mk_service, shared};
use crate::protobuf::{self, convert};
use crate::view::Change;

const CLIENT_GO: &str = "application/vnd.kubernetes.protobuf, application/json";

fn raw(envelope: &[u8], kind: &str) -> Vec<u8> {
    let u = protobuf::open(envelope).expect("an envelope");
    assert_eq!(u.type_meta.and_then(|t| t.kind).as_deref(), Some(kind));
    u.raw.expect("raw")
}

/// The services a JSON list carries, as protobuf messages.
fn expected(json_list: &Value) -> Vec<pb::Service> {
    json_list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|v| {
            let s: k8s_openapi::api::core::v1::Service =
                serde_json::from_value(v.clone()).expect("a service");
            let rv = s.metadata.resource_version.clone().expect("rv");
            convert::service(&s, &rv)
        })
        .collect()
}

#[tokio::test]
async fn a_protobuf_list_and_get_carry_the_json_objects() {
    // One router: pages are kept by its view.
    let r = api();
    let (code, ct, body) = fetch(r.clone(), "/api/v1/services", CLIENT_GO).await;
    assert_eq!((code, ct.as_str()), (StatusCode::OK, protobuf::MEDIA_TYPE));
    let list = pb::ServiceList::decode(raw(&body, "ServiceList").as_slice()).expect("a list");
    let (_, _, json) = fetch(r.clone(), "/api/v1/services", "application/json").await;
    let json: Value = serde_json::from_slice(&json).expect("json");
    assert_eq!(list.items, expected(&json));
    assert_eq!(list.items.len(), 3);
    assert_eq!(
        list.metadata.and_then(|m| m.resource_version).as_deref(),
        json["metadata"]["resourceVersion"].as_str()
    );

    // A page: its continue token and remaining count, as in JSON.
    let (_, _, body) = fetch(r.clone(), "/api/v1/services?limit=2", CLIENT_GO).await;
    let page = pb::ServiceList::decode(raw(&body, "ServiceList").as_slice()).expect("a page");
    let meta = page.metadata.expect("meta");
    assert_eq!((page.items.len(), meta.remaining_item_count), (2, Some(1)));
    let token = meta.r#continue.expect("a continue token");
    let uri = format!("/api/v1/services?limit=2&continue={token}");
    let (_, _, body) = fetch(r.clone(), &uri, CLIENT_GO).await;
    let rest = pb::ServiceList::decode(raw(&body, "ServiceList").as_slice()).expect("a page");
    assert_eq!(rest.items.len(), 1);

    let (code, ct, body) =
        fetch(r.clone(), "/api/v1/namespaces/prod/services/web", CLIENT_GO).await;
    assert_eq!((code, ct.as_str()), (StatusCode::OK, protobuf::MEDIA_TYPE));
    let s = pb::Service::decode(raw(&body, "Service").as_slice()).expect("a service");
    assert_eq!(
        s.metadata.and_then(|m| m.namespace).as_deref(),
        Some("prod")
    );
}

#[tokio::test]
async fn negotiation_follows_the_accept_order_and_kinds() {
    let (_, ct, _) = fetch(
        api(),
        "/api/v1/services",
        "application/json, application/vnd.kubernetes.protobuf",
    )
    .await;
    assert_eq!(ct, "application/json", "the first entry served wins");
    let (_, ct, _) = fetch(api(), "/api/v1/services", "*/*").await;
    assert_eq!(ct, "application/json");
    // A custom resource: JSON when the client takes it, 406 when it takes protobuf only.
    let servers = "/apis/policy.linkerd.io/v1beta3/servers";
    let (code, ct, _) = fetch(api(), servers, CLIENT_GO).await;
    assert_eq!((code, ct.as_str()), (StatusCode::OK, "application/json"));
    let (code, _, body) = fetch(api(), servers, protobuf::MEDIA_TYPE).await;
    assert_eq!(code, StatusCode::NOT_ACCEPTABLE);
    let status: Value = serde_json::from_slice(&body).expect("a Status");
    assert_eq!(status["reason"], "NotAcceptable");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("custom resource")),
        "{status}"
    );
    // Its metadata has a protobuf form, as on the API server.
    let meta = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let (code, ct, body) = fetch(api(), servers, meta).await;
    assert_eq!((code, ct.as_str()), (StatusCode::OK, protobuf::MEDIA_TYPE));
    pb_meta::PartialObjectMetadataList::decode(raw(&body, "PartialObjectMetadataList").as_slice())
        .expect("a metadata list");
    let (_, ct, body) = fetch(api(), "/api/v1/services", meta).await;
    assert_eq!(ct, protobuf::MEDIA_TYPE);
    let l = pb_meta::PartialObjectMetadataList::decode(
        raw(&body, "PartialObjectMetadataList").as_slice(),
    )
    .expect("a metadata list");
    assert_eq!(l.items.len(), 3);
    assert!(l.items.iter().all(|i| {
        i.metadata
            .as_ref()
            .is_some_and(|m| m.resource_version.is_some())
    }));
    // Tables are JSON only: kubectl's protobuf Table entry is passed over.
    let table = "application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1,application/json;as=Table;g=meta.k8s.io;v=v1";
    let (_, ct, body) = fetch(api(), "/api/v1/services", table).await;
    assert_eq!(ct, "application/json");
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["kind"], "Table");
}

/// Reads protobuf watch events off a body, as they arrive.
struct Events {
    body: axum::body::BodyDataStream,
    buf: Vec<u8>,
}

impl Events {
    async fn next(&mut self) -> Option<pb_meta::WatchEvent> {
        use futures_util::StreamExt;
        loop {
            if let Some((len, rest)) = self.buf.split_first_chunk::<4>() {
                let len = u32::from_be_bytes(*len) as usize;
                if rest.len() >= len {
                    let frame: Vec<u8> = self.buf.drain(..4 + len).collect();
                    let mut events = protobuf::read_watch(&frame).expect("a whole frame");
                    return events.pop();
                }
            }
            let chunk = tokio::time::timeout(std::time::Duration::from_secs(5), self.body.next())
                .await
                .expect("a frame within 5 s")?;
            self.buf.extend_from_slice(&chunk.expect("body chunk"));
        }
    }
}

fn event_service(ev: &pb_meta::WatchEvent, kind: &str) -> pb::Service {
    let envelope = ev
        .object
        .as_ref()
        .and_then(|o| o.raw.as_deref())
        .expect("an object");
    pb::Service::decode(raw(envelope, kind).as_slice()).expect("a service")
}

#[tokio::test]
async fn a_protobuf_watch_streams_the_changes_json_watchers_see() {
    let (view, r) = shared();
    let uri = "/api/v1/namespaces/prod/services?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
    let req = Request::get(uri)
        .header("authorization", "Bearer t0k3n")
        .header("accept", CLIENT_GO)
        .body(Body::empty())
        .expect("req");
    let resp = r.clone().oneshot(req).await.expect("resp");
    assert_eq!(
        resp.headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some(protobuf::WATCH_MEDIA_TYPE)
    );
    let mut events = Events {
        body: resp.into_body().into_data_stream(),
        buf: Vec::new(),
    };
    let mut names = Vec::new();
    let bookmark = loop {
        let ev = events.next().await.expect("an event");
        match ev.r#type.as_deref() {
            Some("ADDED") => {
                names.push(event_service(&ev, "Service").metadata.and_then(|m| m.name))
            }
            Some("BOOKMARK") => break ev,
            other => panic!("unexpected {other:?}"),
        }
    };
    names.sort();
    assert_eq!(names, [Some("db".to_owned()), Some("web".to_owned())]);
    let end = event_service(&bookmark, "Service")
        .metadata
        .expect("metadata");
    assert_eq!(
        end.annotations
            .get("k8s.io/initial-events-end")
            .map(String::as_str),
        Some("true")
    );

    // A live change: the frame the view encoded once, the same object a JSON GET gives.
    view.apply(
        [Change::Upsert(mk_service("api", "prod", "api"))],
        Instant::now(),
    );
    let ev = events.next().await.expect("the change");
    assert_eq!(ev.r#type.as_deref(), Some("ADDED"));
    let got = event_service(&ev, "Service");
    let (_, _, json) = fetch(r, "/api/v1/namespaces/prod/services", "application/json").await;
    let json: Value = serde_json::from_slice(&json).expect("json");
    let want = expected(&json);
    assert!(want.contains(&got), "{got:?} is one of {want:?}");
    let stored = view
        .get(&crate::model::ObjKey {
            kind: crate::model::Kind::Service,
            id: crate::model::NsName::new("prod", "api"),
        })
        .expect("stored");
    let forms = stored.protobuf().expect("encoded by the watch");
    assert_eq!(forms.item(), got.encode_to_vec().as_slice());
    assert!(Arc::strong_count(&stored) >= 1);
}

#[tokio::test]
async fn a_protobuf_watch_from_a_foreign_version_gets_an_in_stream_410() {
    let uri = "/api/v1/services?watch=1&resourceVersion=1";
    let (code, ct, body) = fetch(api(), uri, CLIENT_GO).await;
    assert_eq!(
        (code, ct.as_str()),
        (StatusCode::OK, protobuf::WATCH_MEDIA_TYPE)
    );
    let events = protobuf::read_watch(&body).expect("frames");
    assert_eq!(events[0].r#type.as_deref(), Some("ERROR"));
    let envelope = events[0]
        .object
        .as_ref()
        .and_then(|o| o.raw.as_deref())
        .expect("object");
    let status = pb_meta::Status::decode(raw(envelope, "Status").as_slice()).expect("a Status");
    assert_eq!(
        (status.code, status.reason.as_deref()),
        (Some(410), Some("Expired"))
    );
}
