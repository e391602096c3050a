//! Fuzzing the facade's parsers with proptest: label and field selectors, query strings and
//! watch frames never panic, refuse with a 400/422 Status that says why, and what they accept
//! means what it says. `PROPTEST_CASES` sets the number of cases (`make e2e` runs 20,000).

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::kubeapi::query::Query;
use crate::kubeapi::selector::{FieldFilter, LabelFilter};

/// Strings made of what selectors are made of, so the parser's corners get hit.
fn selectorish() -> impl Strategy<Value = String> {
    proptest::string::string_regex(r"[a-c=!,() in/.\-_x]{0,40}").expect("regex")
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_owned()),
        Just("b".to_owned()),
        Just("x.io/c".to_owned())
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("1".to_owned()),
        Just("2".to_owned()),
        Just("v-3".to_owned())
    ]
}

/// One requirement, and the model of what it means.
#[derive(Clone, Debug)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

impl Req {
    fn text(&self) -> String {
        match self {
            Req::Eq(k, v) => format!("{k}={v}"),
            Req::Ne(k, v) => format!("{k}!={v}"),
            Req::In(k, vs) => format!("{k} in ({})", vs.join(",")),
            Req::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
            Req::Exists(k) => k.clone(),
            Req::Absent(k) => format!("!{k}"),
        }
    }

    fn holds(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Req::Eq(k, v) => labels.get(k) == Some(v),
            Req::Ne(k, v) => labels.get(k) != Some(v),
            Req::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Req::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Req::Exists(k) => labels.contains_key(k),
            Req::Absent(k) => !labels.contains_key(k),
        }
    }
}

fn req() -> impl Strategy<Value = Req> {
    let vals = || proptest::collection::vec(value(), 1..3);
    prop_oneof![
        (key(), value()).prop_map(|(k, v)| Req::Eq(k, v)),
        (key(), value()).prop_map(|(k, v)| Req::Ne(k, v)),
        (key(), vals()).prop_map(|(k, v)| Req::In(k, v)),
        (key(), vals()).prop_map(|(k, v)| Req::NotIn(k, v)),
        key().prop_map(Req::Exists),
        key().prop_map(Req::Absent),
    ]
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(key(), value(), 0..3)
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn fuzz_label_selectors_never_panic(s in prop_oneof![selectorish(), any::<String>()], l in labels()) {
        match LabelFilter::parse(&s) {
            Ok(f) => { let _ = f.matches(Some(&l)); }
            Err(e) => {
                prop_assert_eq!(e.code().as_u16(), 400, "{}", s);
                prop_assert!(!e.message.is_empty());
            }
        }
    }

    #[test]
    fn fuzz_label_selectors_mean_what_they_say(reqs in proptest::collection::vec(req(), 1..4), l in labels()) {
        let text = reqs.iter().map(Req::text).collect::<Vec<_>>().join(",");
        let f = LabelFilter::parse(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        prop_assert_eq!(f.matches(Some(&l)), reqs.iter().all(|r| r.holds(&l)), "{} on {:?}", text, l);
    }

    #[test]
    fn fuzz_field_selectors_never_panic(s in prop_oneof![
        proptest::string::string_regex(r"(metadata\.(name|namespace)|spec\.x|)(=|==|!=|)[a-z,=!]{0,12}").expect("regex"),
        any::<String>(),
    ], ns in "[a-z]{1,3}", name in "[a-z]{1,3}") {
        match FieldFilter::parse(&s) {
            Ok(f) => { let _ = f.matches(&ns, &name); }
            Err(e) => prop_assert_eq!(e.code().as_u16(), 400, "{}", s),
        }
        let exact = FieldFilter::parse(&format!("metadata.name={name}"))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(exact.matches(&ns, &name));
        prop_assert_eq!(exact.exact_name(), Some(name.as_str()));
    }

    #[test]
    fn fuzz_query_strings_never_panic(pairs in proptest::collection::vec((
        prop_oneof![
            Just("watch"), Just("labelSelector"), Just("fieldSelector"), Just("resourceVersion"),
            Just("resourceVersionMatch"), Just("allowWatchBookmarks"), Just("sendInitialEvents"),
            Just("timeoutSeconds"), Just("limit"), Just("timeout"), Just(""), Just("%zz"),
        ],
        prop_oneof![any::<String>(), "[0-9a-zA-Z%=&.-]{0,12}".prop_map(String::from)],
    ), 0..6), raw in any::<String>()) {
        let built: String = pairs.iter().map(|(k, v)| {
            let v: String = form_urlencoded::byte_serialize(v.as_bytes()).collect();
            format!("{k}={v}&")
        }).collect();
        for q in [built.as_str(), raw.as_str()] {
            if let Err(e) = Query::parse(q) {
                let code = e.code().as_u16();
                prop_assert!(code == 400 || code == 422, "{} for {:?}", code, q);
                prop_assert!(!e.message.is_empty());
            }
        }
    }

    /// The view's frames decode back to what was encoded: one line, `type` and `object`.
    #[test]
    fn fuzz_watch_frames_round_trip(kind in "[A-Z]{1,8}", obj in proptest::collection::btree_map(any::<String>(), any::<String>(), 0..4)) {
        let json = serde_json::to_vec(&obj).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let frame = crate::view::frame(&kind, &json);
        prop_assert!(frame.ends_with(b"\n"));
        prop_assert_eq!(frame.iter().filter(|b| **b == b'\n').count(), 1, "one line per frame");
        let back: serde_json::Value = serde_json::from_slice(&frame).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back["type"].as_str(), Some(kind.as_str()));
        prop_assert_eq!(back["object"].clone(), serde_json::to_value(&obj).map_err(|e| TestCaseError::fail(e.to_string()))?);
    }
}
