//! Pre-decoded upstream events through one link's churn engine, on one core: how many events per
//! second `ingest` takes (plus a `poll` every 1,000 events), with 10,000 selected services.
//! Target from the design: at least 1,000,000 events/s.

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use floodgate::churn::object::{Kind, Object, SERVICE_NAME_LABEL};
use floodgate::churn::{Change, Engine};
use floodgate::view::View;
use floodgate_link_crd::{LinkSpec, RemoteSpec};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
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
    Object::EndpointSlice(Arc::new(EndpointSlice {
        address_type: "IPv4".into(),
        endpoints: Some(eps),
        metadata: meta(
            format!("s{svc}-1"),
            &[(SERVICE_NAME_LABEL, &format!("s{svc}"))],
        ),
        ports: None,
    }))
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
                Change::Apply(Object::Pod(Arc::new(Pod {
                    metadata: meta(format!("crash-{i}"), &[]),
                    ..Default::default()
                })))
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
}

criterion_group!(benches, bench);
criterion_main!(benches);
