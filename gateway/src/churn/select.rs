//! Matching labels against a Link's structured service selector (`matchLabels` and
//! `matchExpressions`, as `metav1.LabelSelector` defines them).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    /// An operator validation should have refused: matches nothing, so a bad spec selects
    /// nothing rather than everything.
    Invalid,
}

/// A compiled selector. The empty selector matches everything, as in Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    reqs: Vec<(String, Op)>,
}

impl From<&LabelSelector> for Selector {
    fn from(sel: &LabelSelector) -> Self {
        let mut reqs: Vec<(String, Op)> = sel
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), Op::In(vec![v.clone()])))
            .collect();
        for e in sel.match_expressions.iter().flatten() {
            let values = e.values.clone().unwrap_or_default();
            let op = match e.operator.as_str() {
                "In" => Op::In(values),
                "NotIn" => Op::NotIn(values),
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                _ => Op::Invalid,
            };
            reqs.push((e.key.clone(), op));
        }
        Self { reqs }
    }
}

impl Selector {
    /// True when every requirement holds for `labels`.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.reqs.iter().all(|(key, op)| {
            let v = labels.and_then(|l| l.get(key));
            match op {
                Op::In(vals) => v.is_some_and(|v| vals.contains(v)),
                Op::NotIn(vals) => v.is_none_or(|v| !vals.contains(v)),
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
                Op::Invalid => false,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    #[test]
    fn the_default_link_selector_takes_both_linkerd_export_modes() {
        let sel = Selector::from(&floodgate_link_crd::SelectSpec::default().services);
        assert!(sel.matches(Some(&labels(&[("mirror.linkerd.io/exported", "true")]))));
        assert!(sel.matches(Some(&labels(&[(
            "mirror.linkerd.io/exported",
            "remote-discovery"
        )]))));
        assert!(!sel.matches(Some(&labels(&[("mirror.linkerd.io/exported", "false")]))));
        assert!(!sel.matches(None));
    }

    #[test]
    fn every_operator() {
        let sel = Selector::from(&LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![
                req("tier", "NotIn", &["db"]),
                req("team", "Exists", &[]),
                req("legacy", "DoesNotExist", &[]),
            ]),
        });
        assert!(sel.matches(Some(&labels(&[("app", "web"), ("team", "a")]))));
        assert!(!sel.matches(Some(&labels(&[
            ("app", "web"),
            ("team", "a"),
            ("tier", "db")
        ]))));
        assert!(
            !sel.matches(Some(&labels(&[("app", "web")]))),
            "team must exist"
        );
        assert!(!sel.matches(Some(&labels(&[
            ("app", "web"),
            ("team", "a"),
            ("legacy", "")
        ]))));
        assert!(
            Selector::default().matches(None),
            "empty selector matches everything"
        );
        let bad = Selector::from(&LabelSelector {
            match_expressions: Some(vec![req("a", "Like", &["x"])]),
            match_labels: None,
        });
        assert!(!bad.matches(Some(&labels(&[("a", "x")]))));
    }
}
