//! The Lease rules, decided from specs and caches alone.

use super::*;

fn spec(holder: &str, renewed_secs_ago: i64, now: jiff::Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(15),
        renew_time: Some(MicroTime(
            now - jiff::SignedDuration::from_secs(renewed_secs_ago),
        )),
        ..LeaseSpec::default()
    }
}

/// The transitions a take made, whether the cache has the take yet or still the last
/// holder's Lease: two replicas taking in turn count different ones.
#[test]
fn a_take_counts_its_own_transition_before_the_cache_shows_it() {
    let now = jiff::Timestamp::now();
    let (reader, mut writer) = kube::runtime::reflector::store::<Lease>();
    let mut put = |holder: &str, transitions: i32| {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(lease_name("east")),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                lease_transitions: Some(transitions),
                ..spec(holder, 0, now)
            }),
        };
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(lease));
    };
    put("h1", 4);
    // f took it from h1 (the take made 5); its cache still shows h1's Lease.
    assert_eq!(transitions_since_taken(&reader, "ns", "east", "f"), Some(5));
    put("f", 5);
    assert_eq!(transitions_since_taken(&reader, "ns", "east", "f"), Some(5));
    // g took it from f (the take made 6).
    assert_eq!(transitions_since_taken(&reader, "ns", "east", "g"), Some(6));
    assert_eq!(transitions_since_taken(&reader, "ns", "west", "g"), None);
}

/// A holder records its view's base on its Lease at every renewal; one that knows none
/// (a Lease handed over), or a lower one (a replica that took the Lease before its view
/// followed the last holder's), keeps the one recorded, which the next holder reads.
#[test]
fn the_holders_view_base_is_recorded_and_read_back() {
    let mut annotations = BTreeMap::new();
    let recorded = |a: &BTreeMap<String, String>| a.get(VIEW_BASE_ANNOTATION).cloned();
    annotate(&mut annotations, Some("10.0.0.1:6443"), Some(7 << 40));
    annotate(&mut annotations, Some("10.0.0.1:6443"), None);
    assert_eq!(recorded(&annotations), Some((7u64 << 40).to_string()));
    annotate(&mut annotations, Some("10.0.0.2:6443"), Some(3 << 40));
    assert_eq!(recorded(&annotations), Some((7u64 << 40).to_string()));
    annotate(&mut annotations, None, Some(9 << 40));
    assert_eq!(recorded(&annotations), Some((9u64 << 40).to_string()));
    assert!(!annotations.contains_key(FACADE_ANNOTATION));

    let (reader, mut writer) = kube::runtime::reflector::store::<Lease>();
    let mut put = |annotations: BTreeMap<String, String>| {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(lease_name("east")),
                namespace: Some("ns".into()),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(lease));
    };
    put(annotations);
    assert_eq!(recorded_view_base(&reader, "ns", "east"), 9 << 40);
    assert_eq!(recorded_view_base(&reader, "ns", "west"), 0, "no Lease");
    put([(VIEW_BASE_ANNOTATION.to_owned(), "x".to_owned())].into());
    assert_eq!(recorded_view_base(&reader, "ns", "east"), 0, "not a number");
}

#[test]
fn a_live_lease_of_another_replica_is_left_an_expired_one_taken() {
    let now = jiff::Timestamp::from_second(1_700_000_000).expect("time");
    assert_eq!(decide(None, "a", now), Decision::Take);
    assert_eq!(decide(Some(&spec("a", 3, now)), "a", now), Decision::Renew);
    assert_eq!(decide(Some(&spec("b", 3, now)), "a", now), Decision::Leave);
    assert_eq!(decide(Some(&spec("b", 16, now)), "a", now), Decision::Take);
    assert_eq!(decide(Some(&spec("", 1, now)), "a", now), Decision::Take);
    let never_renewed = LeaseSpec {
        holder_identity: Some("b".into()),
        ..LeaseSpec::default()
    };
    assert_eq!(decide(Some(&never_renewed), "a", now), Decision::Take);
}
