//! One link's churn engine on one core, with 10,000 selected services:
//!
//! - `engine/ingest_100k_events_10k_services`: pre-decoded upstream events, how many per second
//!   `ingest` takes (plus a `poll` every 1,000 events). Design target: >= 1,000,000 events/s.
//! - `upstream/decode_and_ingest_10k_slice_frames`: the same path from the wire, each event a
//!   watch frame of JSON decoded as Floodgate's EndpointSlice watcher decodes it
//!   (`WatchEvent<EndpointSlice>`, then its size counted by encoding it), then ingested. Design
//!   target: >= 65,000 EndpointSlice events/s.
//! - `upstream/decode_10k_slice_frames`: that decoding alone, for reference.
//! - `upstream/decode_10k_slice_frames_kept_as_json`: the same frames decoded as the pod
//!   watcher decodes pods (`WatchEvent<Wire<_>>`: kept as JSON, then typed), for reference:
//!   what keeping a list's objects as JSON costs in CPU.

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use floodgate::churn::{Change, Engine};
use floodgate::model::{Kind, Object, SERVICE_NAME_LABEL, SliceObject};
use floodgate::upstream::wire::Wire;
use floodgate::upstream::{MAX_OBJECT_BYTES, encoded_len};
use floodgate::view::View;
use floodgate_link_crd::{LinkSpec, RemoteSpec};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::WatchEvent;
use tokio::time::Instant;

const SERVICES: usize = 10_000;

fn meta(name: String, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some("ns".into()),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn slice(svc: usize, ready: bool) -> Object {
    let eps = (0..10)
        .map(|i| Endpoint {
            addresses: vec![format!("10.{}.{}.{i}", svc / 256, svc % 256)],
            conditions: Some(EndpointConditions {
                ready: Some(ready || i > 0),
                ..Default::default()
            }),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some(format!("p{svc}-{i}")),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    Object::EndpointSlice(
        SliceObject::from(EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(eps),
            metadata: meta(
                format!("s{svc}-1"),
                &[(SERVICE_NAME_LABEL, &format!("s{svc}"))],
            ),
            ports: None,
        })
        .into(),
    )
}

fn bench(c: &mut Criterion) {
    let mut spec = LinkSpec::with_remote(RemoteSpec {
        kubeconfig_path: Some("/k".into()),
        ..Default::default()
    });
    // Measure the engine, not a quarantine: thresholds out of reach.
    spec.quarantine.when.events_per_second = u32::MAX;
    spec.caps.max_services = 20_000;
    let kinds = [Kind::Service, Kind::EndpointSlice, Kind::Pod];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let start = Instant::now();
    let mut engine = Engine::new(&spec, &kinds, View::new(1, 10_000), start);
    for k in kinds {
        engine.ingest(Change::InitStart(k), start);
    }
    for s in 0..SERVICES {
        let svc = Object::Service(Arc::new(Service {
            metadata: meta(format!("s{s}"), &[("mirror.linkerd.io/exported", "true")]),
            ..Default::default()
        }));
        engine.ingest(Change::Apply(svc), start);
        engine.ingest(Change::Apply(slice(s, true)), start);
    }
    for k in kinds {
        engine.ingest(Change::InitDone(k), start);
    }
    engine.poll(start);

    // The event mix of a flood: slice flips across services, and pods nothing points at.
    let events: Vec<Change> = (0..100_000usize)
        .map(|i| {
            if i.is_multiple_of(2) {
                Change::Apply(slice(
                    (i / 2) % SERVICES,
                    (i / 2 / SERVICES).is_multiple_of(2),
                ))
            } else {
                let pod = Pod {
                    metadata: meta(format!("crash-{i}"), &[]),
                    ..Default::default()
                };
                Change::Apply(Object::Pod(Arc::new(pod.into())))
            }
        })
        .collect();
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(events.len() as u64));
    g.measurement_time(Duration::from_secs(10));
    g.sample_size(10);
    let mut now = start;
    g.bench_function("ingest_100k_events_10k_services", |b| {
        b.iter(|| {
            for (i, e) in events.iter().enumerate() {
                engine.ingest(e.clone(), now);
                if i % 1000 == 999 {
                    now += Duration::from_millis(1);
                    engine.poll(now);
                }
            }
        })
    });
    g.finish();
    wire(c, &mut engine, now);
}

/// An EndpointSlice watch frame as an API server sends it: every field a real object carries,
/// managed fields included.
fn frame(svc: usize, ready: bool, rv: usize) -> Vec<u8> {
    let endpoints: Vec<_> = (0..10)
        .map(|i| {
            serde_json::json!({
                "addresses": [format!("10.{}.{}.{i}", svc / 256, svc % 256)],
                "conditions": {"ready": ready || i > 0, "serving": true, "terminating": false},
                "nodeName": format!("node-{}", i % 7), "zone": "zone-a",
                "targetRef": {"kind": "Pod", "name": format!("p{svc}-{i}"), "namespace": "ns",
                              "uid": "2f1c7f6e-5d6a-4b7e-9c1d-0a1b2c3d4e5f"},
            })
        })
        .collect();
    let object = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {
            "name": format!("s{svc}-1"), "namespace": "ns", "resourceVersion": rv.to_string(),
            "uid": "6b8d0a1e-3f4c-4d5e-8f9a-0b1c2d3e4f5a", "generation": rv,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {SERVICE_NAME_LABEL: format!("s{svc}"),
                       "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": format!("s{svc}"),
                                 "uid": "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d",
                                 "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "apiVersion": "discovery.k8s.io/v1", "time": "2026-01-01T00:00:00Z",
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:addressType": {}}}],
        },
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    });
    let mut line = serde_json::to_vec(&serde_json::json!({"type": "MODIFIED", "object": object}))
        .unwrap_or_default();
    line.push(b'\n');
    line
}

/// A frame decoded as the EndpointSlice watcher does: typed, size counted by encoding it, then
/// held with its endpoints as their JSON.
fn decode(line: &[u8]) -> Option<Object> {
    match serde_json::from_slice::<WatchEvent<EndpointSlice>>(line) {
        Ok(WatchEvent::Modified(s)) if encoded_len(&s) <= MAX_OBJECT_BYTES => {
            Some(Object::EndpointSlice(SliceObject::from(s).into()))
        }
        _ => None,
    }
}

/// A frame decoded as the pod watcher does: kept as JSON, size checked, then typed.
fn decode_kept(line: &[u8]) -> Option<Object> {
    match serde_json::from_slice::<WatchEvent<Wire<EndpointSlice>>>(line) {
        Ok(WatchEvent::Modified(w)) if w.bytes() <= MAX_OBJECT_BYTES => w
            .decode()
            .ok()
            .map(|s| Object::EndpointSlice(SliceObject::from(s).into())),
        _ => None,
    }
}

fn wire(c: &mut Criterion, engine: &mut Engine, mut now: Instant) {
    const FRAMES: usize = 10_000;
    let frames: Vec<Vec<u8>> = (0..FRAMES)
        .map(|i| frame((i * 7) % SERVICES, i % 3 == 0, 1_000_000 + i))
        .collect();
    let mut g = c.benchmark_group("upstream");
    g.throughput(Throughput::Elements(FRAMES as u64));
    g.measurement_time(Duration::from_secs(10));
    g.sample_size(10);
    g.bench_function("decode_10k_slice_frames", |b| {
        b.iter(|| frames.iter().filter_map(|f| decode(f)).count())
    });
    g.bench_function("decode_10k_slice_frames_kept_as_json", |b| {
        b.iter(|| frames.iter().filter_map(|f| decode_kept(f)).count())
    });
    g.bench_function("decode_and_ingest_10k_slice_frames", |b| {
        b.iter(|| {
            for (i, f) in frames.iter().enumerate() {
                if let Some(o) = decode(f) {
                    engine.ingest(Change::Apply(o), now);
                }
                if i % 1000 == 999 {
                    now += Duration::from_millis(1);
                    engine.poll(now);
                }
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
