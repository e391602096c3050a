//! The view's tests: versions, history and resume, fan-out per kind, shared buffers.

use super::*;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::borrow::Cow;

fn mk_service(name: &str, label: &str) -> Object {
    Object::Service(Arc::new(Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            labels: Some([("v".to_owned(), label.to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    }))
}

#[test]
fn versions_are_monotonic_never_zero_and_stamped_in_the_json() {
    let view = View::new(7, 100);
    assert_ne!(view.resource_version(), 0);
    let e1 = view.apply([Change::Upsert(mk_service("a", "1"))], Instant::now());
    let e2 = view.apply([Change::Upsert(mk_service("a", "2"))], Instant::now());
    assert_eq!(e1[0].kind, EventType::Added);
    assert_eq!(e2[0].kind, EventType::Modified);
    assert!(e2[0].resource_version > e1[0].resource_version);
    let json: serde_json::Value = serde_json::from_slice(&e2[0].object.json()).expect("json");
    assert_eq!(json["kind"], "Service");
    assert_eq!(json["apiVersion"], "v1");
    assert_eq!(
        json["metadata"]["resourceVersion"],
        e2[0].resource_version.to_string()
    );
}

#[test]
fn json_bytes_follow_what_is_served() {
    let view = View::new(7, 100);
    assert_eq!(view.json_bytes(), 0);
    view.apply(
        [
            Change::Upsert(mk_service("a", "1")),
            Change::Upsert(mk_service("b", "1")),
        ],
        Instant::now(),
    );
    let sum = |v: &View| -> usize {
        v.list(Kind::Service)
            .items
            .iter()
            .map(|s| s.json_len())
            .sum()
    };
    assert_eq!(view.json_bytes(), sum(&view));
    view.apply(
        [Change::Upsert(mk_service("a", "a longer label"))],
        Instant::now(),
    );
    assert_eq!(view.json_bytes(), sum(&view));
    view.apply(
        [
            Change::Delete(mk_service("a", "").key()),
            Change::Delete(mk_service("b", "").key()),
        ],
        Instant::now(),
    );
    assert_eq!(view.json_bytes(), 0);
}

#[test]
fn an_unchanged_object_publishes_nothing() {
    let view = View::new(1, 100);
    view.apply([Change::Upsert(mk_service("a", "1"))], Instant::now());
    let rv = view.resource_version();
    assert!(
        view.apply([Change::Upsert(mk_service("a", "1"))], Instant::now())
            .is_empty()
    );
    assert!(
        view.apply([Change::Delete(mk_service("b", "1").key())], Instant::now())
            .is_empty()
    );
    assert_eq!(view.resource_version(), rv);
}

#[test]
fn a_deletion_carries_the_last_state_with_a_new_version() {
    let view = View::new(1, 100);
    view.apply([Change::Upsert(mk_service("a", "1"))], Instant::now());
    let e = view.apply([Change::Delete(mk_service("a", "1").key())], Instant::now());
    assert_eq!(e[0].kind, EventType::Deleted);
    assert_eq!(e[0].object.object, mk_service("a", "1"));
    assert_eq!(e[0].object.resource_version, e[0].resource_version);
    assert_eq!(view.len(Kind::Service), 0);
}

#[test]
fn resume_gives_exactly_the_later_changes_or_says_why_not() {
    let view = View::new(3, 2);
    let first =
        view.apply([Change::Upsert(mk_service("a", "1"))], Instant::now())[0].resource_version;
    let second =
        view.apply([Change::Upsert(mk_service("a", "2"))], Instant::now())[0].resource_version;
    let (events, _rx) = view.watch_from(Kind::Service, first).expect("in history");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].resource_version, second);
    view.apply([Change::Upsert(mk_service("a", "3"))], Instant::now());
    view.apply([Change::Upsert(mk_service("a", "4"))], Instant::now());
    assert_eq!(
        view.watch_from(Kind::Service, first).err(),
        Some(ResumeError::Expired),
        "history holds 2"
    );
    assert_eq!(
        view.watch_from(Kind::Service, view.resource_version() + 1)
            .err(),
        Some(ResumeError::TooLarge)
    );
    let other_run = View::new(4, 2).resource_version();
    assert_eq!(
        view.watch_from(Kind::Service, other_run).err(),
        Some(ResumeError::Expired)
    );
    let (events, _rx) = view
        .watch_from(Kind::Service, view.resource_version())
        .expect("now");
    assert!(events.is_empty());
}

#[tokio::test]
async fn subscribers_see_every_change_after_their_snapshot() {
    let view = View::new(1, 100);
    view.apply([Change::Upsert(mk_service("a", "1"))], Instant::now());
    let (snap, mut rx) = view.list_and_watch(Kind::Service);
    assert_eq!(snap.items.len(), 1);
    view.apply([Change::Upsert(mk_service("b", "1"))], Instant::now());
    let e = rx.recv().await.expect("event");
    assert_eq!(e.kind, EventType::Added);
    assert!(e.resource_version > snap.resource_version);
}

fn mk_pod(name: &str, phase: &str) -> Object {
    use k8s_openapi::api::core::v1::{Pod, PodStatus};
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        status: Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Object::Pod(Arc::new(pod.into()))
}

/// A burst of pod changes larger than a receiver's backlog and the history: a Service
/// watcher neither wakes for it nor lags, and resumes from its version afterwards.
#[tokio::test]
async fn a_pod_burst_neither_lags_nor_expires_a_service_watcher() {
    let view = View::new(2, 1000);
    view.apply([Change::Upsert(mk_service("a", "1"))], Instant::now());
    let (_, mut services) = view.list_and_watch(Kind::Service);
    let (_, mut pods) = view.list_and_watch(Kind::Pod);
    let seen = view.resource_version();
    for i in 0..FANOUT_BACKLOG + 10 {
        let phase = if i % 2 == 0 { "Running" } else { "Failed" };
        view.apply([Change::Upsert(mk_pod("p", phase))], Instant::now());
    }
    assert!(
        matches!(
            pods.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(_))
        ),
        "the pod watcher fell behind: the burst is real"
    );
    assert!(
        matches!(
            services.try_recv(),
            Err(broadcast::error::TryRecvError::Empty)
        ),
        "no pod change reached the Service feed"
    );
    view.apply([Change::Upsert(mk_service("a", "2"))], Instant::now());
    let e = services.recv().await.expect("the service's change");
    assert_eq!(e.object.object, mk_service("a", "2"));

    // The pods pushed every older change out of the history (1000 held), the Service's
    // among them only if it was older than `seen`.
    assert_eq!(
        view.watch_from(Kind::Pod, seen).err(),
        Some(ResumeError::Expired)
    );
    let (events, _rx) = view
        .watch_from(Kind::Service, seen)
        .expect("no Service change after `seen` left the history");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].resource_version, e.resource_version);
}

#[test]
fn a_stored_object_and_its_event_share_one_buffer() {
    let view = View::new(1, 100);
    let e = view.apply([Change::Upsert(mk_service("a", "1"))], Instant::now());
    let (json, frame) = (e[0].object.json(), &e[0].frame);
    let Cow::Borrowed(json) = json else {
        panic!("a service's JSON is held")
    };
    let start = frame.len() - json.len() - 2;
    assert_eq!(
        &frame[..],
        [&b"{\"type\":\"ADDED\",\"object\":"[..], json, b"}\n"].concat()
    );
    assert!(
        std::ptr::eq(json.as_ptr(), frame[start..].as_ptr()),
        "the stored JSON points into the frame"
    );
    let framed: serde_json::Value = serde_json::from_slice(frame).expect("a JSON line");
    assert_eq!(framed["object"]["metadata"]["name"], "a");
}

#[test]
fn pods_slices_and_endpoints_are_served_from_their_held_form() {
    // A slice is held deflated, and served inflated as the whole slice would be.
    use k8s_openapi::api::core::v1::{Endpoints, Pod};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let pod = |meta: serde_json::Value| -> Object {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": meta,
            "spec": {"containers": [{"name": "app"}]},
            "status": {"podIP": "10.0.0.1"}
        }))
        .expect("a pod");
        Object::Pod(Arc::new(pod.into()))
    };
    let slice = |meta: serde_json::Value| -> Object {
        let s: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": meta,
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "name": "web-0"}}],
            "ports": [{"name": "http", "port": 80}]
        }))
        .expect("a slice");
        Object::EndpointSlice(crate::model::SliceObject::from(s).into())
    };
    let endpoints = |meta: serde_json::Value| -> Object {
        let e: Endpoints = serde_json::from_value(serde_json::json!({
            "metadata": meta,
            "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]
        }))
        .expect("an Endpoints");
        Object::Endpoints(Arc::new(e.into()))
    };
    let named = serde_json::json!({"name": "web", "namespace": "prod", "labels": {"app": "web"}});
    let objects = [pod, slice, endpoints]
        .into_iter()
        .flat_map(|make| [make(named.clone()), make(serde_json::json!({}))]);
    for object in objects {
        for rv in [7, 10, 123_456_789] {
            let (stored, frame) = Stored::framed(object.clone(), rv, EventType::Modified);
            let json = stored.json();
            assert!(
                matches!(json, Cow::Owned(_)),
                "{:?} written from the held object, not held again",
                object.kind()
            );
            assert_eq!(json.len(), stored.json_len());
            if let Object::EndpointSlice(held) = &stored.object {
                assert!(
                    held.dictionary().is_some(),
                    "a slice given whole (as a follower decodes it) is kept deflated"
                );
            }
            let served: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
            assert_eq!(served, object.to_json(&rv.to_string()), "rv {rv}");
            assert_eq!(
                &frame[..],
                [&b"{\"type\":\"MODIFIED\",\"object\":"[..], &json, b"}\n"].concat()
            );
            assert_eq!(
                Object::from_json(served)
                    .expect("reads back")
                    .into_sanitized(),
                object,
                "a saved view reads it back"
            );
        }
    }
}

#[test]
fn a_frame_holds_no_growth_room() {
    // About 1.5 KB of JSON: its vector doubled from 256 bytes to 2 KB while it was written.
    let (stored, frame) = Stored::framed(mk_service("a", &"x".repeat(1400)), 7, EventType::Added);
    drop(stored);
    let len = frame.len();
    assert!(len > 1024, "{len} bytes");
    let held = frame.try_into_mut().expect("the only reference").capacity();
    assert_eq!(held, len, "the frame is held without its growth room");
}

#[test]
fn metadata_and_protobuf_forms_are_encoded_once_and_shared() {
    use prost::Message as _;
    let (stored, _) = Stored::framed(mk_service("a", "1"), 7, EventType::Modified);
    let m = stored.metadata();
    assert!(
        std::ptr::eq(m, stored.metadata()),
        "kept, not encoded again"
    );
    let frame = m.json_frame();
    assert_eq!(
        frame.as_ptr(),
        m.json_frame().as_ptr(),
        "every watcher shares one frame"
    );
    let v: serde_json::Value = serde_json::from_slice(&frame).expect("a JSON line");
    assert_eq!(v["type"], "MODIFIED", "the state's own event");
    assert_eq!(v["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(v["object"]["metadata"]["resourceVersion"], "7");
    assert!(v["object"].get("spec").is_none());
    let pb = crate::protobuf::read_watch(&m.protobuf().frame()).expect("a frame");
    assert_eq!(pb[0].r#type.as_deref(), Some("MODIFIED"));
    let item = k8s_pb::apimachinery::pkg::apis::meta::v1::PartialObjectMetadata::decode(
        m.protobuf().item(),
    )
    .expect("metadata");
    assert_eq!(
        item.metadata.and_then(|m| m.resource_version).as_deref(),
        Some("7")
    );
    let forms = stored.protobuf().expect("a service has one");
    assert!(std::ptr::eq(forms, stored.protobuf().expect("kept")));
}

#[tokio::test(start_paused = true)]
async fn history_older_than_the_cutoff_is_forgotten() {
    let view = View::new(5, 100);
    let start = view.resource_version();
    let old =
        view.apply([Change::Upsert(mk_service("a", "1"))], Instant::now())[0].resource_version;
    tokio::time::advance(std::time::Duration::from_secs(60)).await;
    view.apply([Change::Upsert(mk_service("a", "2"))], Instant::now());
    view.expire_history(Instant::now() - std::time::Duration::from_secs(30));
    assert_eq!(
        view.watch_from(Kind::Service, start).err(),
        Some(ResumeError::Expired),
        "the change after `start` is older than the cutoff"
    );
    let (events, _rx) = view
        .watch_from(Kind::Service, old)
        .expect("the change after `old` is kept");
    assert_eq!(events.len(), 1);
}

#[test]
fn a_key_changed_several_times_in_one_batch_gets_an_event_each() {
    let view = View::new(7, 100);
    let a = |label| Change::Upsert(mk_service("a", label));
    let key = mk_service("a", "1").key();
    let e = view.apply(
        [a("1"), a("1"), a("2"), Change::Delete(key.clone()), a("3")],
        Instant::now(),
    );
    let kinds: Vec<EventType> = e.iter().map(|e| e.kind).collect();
    // The repeated "1" changes nothing.
    use EventType::*;
    assert_eq!(kinds, [Added, Modified, Deleted, Added]);
    let versions: Vec<u64> = e.iter().map(|e| e.resource_version).collect();
    assert!(
        versions.windows(2).all(|w| w[1] == w[0] + 1),
        "{versions:?}"
    );
    assert_eq!(view.resource_version(), versions[3]);
    // The modification's previous state is the batch's own first one; the deletion carries
    // the state it removed.
    let previous = e[1].previous.as_ref().expect("previous");
    assert!(Arc::ptr_eq(previous, &e[0].object));
    assert_eq!(e[2].object.object, mk_service("a", "2"));
    assert_eq!(view.get(&key).expect("a").object, mk_service("a", "3"));
    assert_eq!(view.json_bytes(), e[3].object.json_len());
    let (history, _) = view
        .watch_from(Kind::Service, versions[0] - 1)
        .expect("resume");
    assert_eq!(history.len(), 4);
}

#[test]
fn a_publication_is_encoded_while_readers_hold_the_view() {
    let view = View::new(7, 100);
    let (next, planned) = {
        // A reader (a LIST, a watch resuming) holds the view while the batch is planned and
        // encoded: neither needs the write lock.
        let _reader = view.read();
        let (next, planned) = view.plan([Change::Upsert(mk_service("a", "1"))]);
        (next, encode(next, planned))
    };
    assert_eq!(planned.len(), 1);
    assert!(!planned[0].frame.is_empty(), "encoded before the commit");
    assert!(view.is_empty(), "nothing is served before the commit");
    view.commit(&planned, Instant::now());
    assert_eq!(view.resource_version(), next);
    assert_eq!(view.len(Kind::Service), 1);
}

#[test]
fn a_namespaced_list_copies_its_namespace_only() {
    let view = View::new(7, 100);
    let in_ns = |ns: &str, name: &str| {
        let mut o = mk_service(name, "1");
        if let Object::Service(s) = &mut o {
            Arc::make_mut(s).metadata.namespace = Some(ns.into());
        }
        Change::Upsert(o)
    };
    view.apply(
        [
            in_ns("a", "x"),
            in_ns("b", "y"),
            in_ns("b", "z"),
            in_ns("ba", "w"),
            in_ns("c", "v"),
        ],
        Instant::now(),
    );
    let names = |s: Snapshot| -> Vec<String> {
        s.items.iter().map(|o| o.object.id().to_string()).collect()
    };
    assert_eq!(
        names(view.list_namespace(Kind::Service, "b")),
        ["b/y", "b/z"]
    );
    assert!(view.list_namespace(Kind::Service, "nope").items.is_empty());
    let snap = view.list_namespace(Kind::Service, "c");
    assert_eq!(snap.resource_version, view.resource_version());
    assert_eq!(names(view.list(Kind::Service)).len(), 5);

    // A watch of one object copies that object only, and its receiver sees the next change.
    let (snap, mut rx) = view.list_and_watch_scope(Kind::Service, Scope::Object("b", "z"));
    assert_eq!(names(snap), ["b/z"]);
    let (none, _) = view.list_and_watch_scope(Kind::Service, Scope::Object("b", "w"));
    assert!(none.items.is_empty(), "w is in ba, not in b");
    let (ns, _) = view.list_and_watch_scope(Kind::Service, Scope::Namespace("b"));
    assert_eq!(names(ns), ["b/y", "b/z"]);
    view.apply([in_ns("b", "new")], Instant::now());
    let event = rx.try_recv().expect("the change after the snapshot");
    assert_eq!(event.object.object.id().to_string(), "b/new");
}

#[test]
fn a_kind_holds_its_feed_only_while_someone_watches_it() {
    let view = View::new(7, 100);
    let feeds = |v: &View| {
        let s = v.read();
        Kind::ALL
            .iter()
            .filter(|k| s.shelf(**k).tx.get().is_some())
            .count()
    };
    let now = Instant::now();
    view.apply([Change::Upsert(mk_service("a", "1"))], now);
    assert_eq!(feeds(&view), 0, "no watcher, no feed");

    let (_, mut rx) = view.list_and_watch(Kind::Service);
    assert_eq!(feeds(&view), 1, "the first watcher makes its kind's feed");
    view.apply([Change::Upsert(mk_service("a", "2"))], now);
    let e = rx.try_recv().expect("the watcher gets the change");
    assert_eq!(e.kind, EventType::Modified);

    drop(rx);
    assert_eq!(feeds(&view), 1, "kept until a publication finds nobody");
    view.apply([Change::Upsert(mk_service("a", "3"))], now);
    assert_eq!(feeds(&view), 0, "let go once its last watcher left");

    // A watcher that comes later resumes from the history and follows a new feed.
    let v3 = view.resource_version();
    let (missed, mut rx) = view.watch_from(Kind::Service, v3 - 1).expect("resume");
    assert_eq!(missed.len(), 1);
    view.apply([Change::Upsert(mk_service("a", "4"))], now);
    assert_eq!(
        rx.try_recv().expect("the new feed").resource_version,
        v3 + 1
    );

    // Disconnecting drops the feed, which closes every receiver of it.
    view.disconnect();
    assert!(matches!(
        rx.try_recv(),
        Err(tokio::sync::broadcast::error::TryRecvError::Closed)
    ));
    assert_eq!(feeds(&view), 0);
}

#[test]
fn the_history_keeps_a_pods_json_once_and_a_resume_writes_the_same_frame() {
    let view = View::new(1, 100);
    let start = view.resource_version();
    let published = view.apply(
        [
            Change::Upsert(mk_pod("p", "Pending")),
            Change::Upsert(mk_service("a", "1")),
        ],
        Instant::now(),
    );
    let deleted = view.apply(
        [Change::Delete(mk_pod("p", "Pending").key())],
        Instant::now(),
    );
    let (pods, _rx) = view.watch_from(Kind::Pod, start).expect("in history");
    assert_eq!(pods.len(), 2);
    for (kept, sent) in pods.iter().zip([&published[0], &deleted[0]]) {
        assert!(kept.frame.is_empty(), "a pod's frame is not held twice");
        assert_eq!(kept.json_frame(), sent.frame, "written again, the same");
    }
    let (services, _rx) = view.watch_from(Kind::Service, start).expect("in history");
    assert_eq!(
        services[0].frame, published[1].frame,
        "a service's JSON is its frame: kept"
    );
}
