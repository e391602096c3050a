//! The remote's `linkerd-config` through the engine: a publication of its own, first in its
//! stages, followed to its last state, and measured against no rate.

use k8s_openapi::api::core::v1::ConfigMap;

use super::*;

fn mk_config(anchors: &str) -> Object {
    Object::ConfigMap(Arc::new(ConfigMap {
        metadata: ObjectMeta {
            name: Some(crate::model::LINKERD_CONFIG.into()),
            namespace: Some("linkerd".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("values".into(), anchors.into())])),
        ..ConfigMap::default()
    }))
}

fn anchors_served(e: &Engine) -> Vec<String> {
    (e.view().list(Kind::ConfigMap).items.iter())
        .map(|s| {
            let v: serde_json::Value = serde_json::from_slice(&s.json()).expect("json");
            v["data"]["values"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

/// Rotations of the trust anchors at three times the link's event threshold, sustained well
/// past `sustainedFor`: they are followed to the last one, and the link is neither quarantined
/// nor a service contained.
#[tokio::test(start_paused = true)]
async fn the_linkerd_config_is_followed_and_never_quarantines_the_link() {
    let mut spec = mk_spec();
    spec.quarantine.when.events_per_second = 100;
    spec.quarantine.when.sustained_for = KubeDuration::from_secs(3);
    let now = Instant::now();
    let kinds = [Kind::Service, Kind::ConfigMap];
    let mut e = Engine::new(&spec, &kinds, View::new(1, 100_000), now);
    for k in kinds {
        e.ingest(Change::InitStart(k), now);
    }
    e.ingest(Change::Apply(mk_service("a", true)), now);
    e.ingest(Change::Apply(mk_config("anchor-0")), now);
    for k in kinds {
        e.ingest(Change::InitDone(k), now);
    }
    e.poll(now);
    assert!(e.synced_once());
    assert_eq!(anchors_served(&e), ["anchor-0"]);

    let mut last = String::new();
    for tick in 0..100u32 {
        for i in 0..30u32 {
            last = format!("anchor-{tick}-{i}");
            apply(&mut e, mk_config(&last));
        }
        time::advance(Duration::from_millis(100)).await;
        e.poll(Instant::now());
        assert_ne!(e.phase(), Phase::Quarantined, "at tick {tick}");
    }
    run(&mut e, Duration::from_secs(5), Duration::from_millis(100)).await;
    assert_eq!(anchors_served(&e), [last]);
    assert!(
        e.take_effects()
            .iter()
            .all(|f| !matches!(f, Effect::Transition(_)))
    );

    // Gone upstream: gone from the view.
    e.ingest(Change::Delete(mk_config("").key()), Instant::now());
    run(&mut e, Duration::from_secs(5), Duration::from_millis(100)).await;
    assert!(anchors_served(&e).is_empty());
}
