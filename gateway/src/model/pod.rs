//! A pod as Floodgate holds it: the JSON of its trimmed form ([`crate::upstream::trim`]),
//! beside the two things the engine reads of it on every change (its namespace and name, and
//! the ReplicaSets that own it).
//!
//! Why: pods are most of what a link serves (one behind every published endpoint), and the
//! served JSON is already held once, in the view's watch frame. A typed `ObjectMeta` beside it
//! cost about 1.9 KB a pod (350 bytes inline, a 544-byte B-tree node for the labels and another
//! for the annotations, an allocation per string), over twice the pod's JSON; held as JSON a
//! pod costs its own bytes and three small allocations. Everything else reads the JSON: the
//! served JSON and protobuf forms (once per published version), the metadata-only forms, and
//! a label selector (decoding only `metadata`, [`PodObject::metadata`]).
//!
//! The JSON is written by serde from a typed `Pod` ([`From<Pod>`]), never taken from the
//! wire, so it always decodes back to the same `Pod`: [`PodObject::to_pod`] is exact. It is
//! written without the upstream `resourceVersion` and `managedFields` (what
//! [`super::Object::into_sanitized`] drops of every other kind), so two states compare by
//! their JSON.

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use smallvec::SmallVec;

use super::NsName;

/// A pod held compactly (see the module docs).
#[derive(Clone, Debug)]
pub struct PodObject {
    id: NsName,
    /// The names of the ReplicaSets among its owners (one, held inline, for nearly every pod).
    replicasets: SmallVec<[Box<str>; 1]>,
    /// Whether its `Ready` condition is `True`.
    ready: bool,
    /// Where `,"status":` begins in the JSON (its length when there is no status): what comes
    /// before is what identifies and addresses the pod ([`PodObject::same_but_status`]).
    status_at: u32,
    /// `{"metadata":..,"spec":..,"status":..}`.
    json: Box<RawValue>,
}

/// What the JSON holds: a `Pod` without `apiVersion` and `kind`, which the served forms add
/// before its `metadata`, written first ([`crate::view::Stored`]).
#[derive(Serialize)]
struct Parts<'a> {
    metadata: &'a ObjectMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: &'a Option<PodSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: &'a Option<PodStatus>,
}

impl PodObject {
    /// Its namespace and name.
    pub fn id(&self) -> &NsName {
        &self.id
    }

    /// The ReplicaSets that own it.
    pub fn replicasets(&self) -> impl Iterator<Item = NsName> + '_ {
        self.replicasets
            .iter()
            .map(|name| NsName::new(&self.id.namespace, name))
    }

    /// Whether its `Ready` condition is `True` (the kubelet sets it before the EndpointSlice
    /// controller marks the pod's endpoints ready).
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// True when `other` differs from it in its `status` alone (readiness, restarts, container
    /// states): the same uid, labels, annotations, owners and spec. A contained service's pods
    /// are kept current in all but this ([`crate::churn::publish`]).
    pub fn same_but_status(&self, other: &PodObject) -> bool {
        self.head() == other.head()
    }

    /// Its JSON before `status`.
    fn head(&self) -> &str {
        &self.json.get()[..self.status_at as usize]
    }

    /// Its JSON: `metadata`, `spec` and `status`, without `apiVersion` and `kind`.
    pub fn json(&self) -> &RawValue {
        &self.json
    }

    /// Its metadata, decoded (the rest of the JSON is skipped).
    pub fn metadata(&self) -> ObjectMeta {
        #[derive(Deserialize)]
        struct Head {
            #[serde(default)]
            metadata: ObjectMeta,
        }
        serde_json::from_str::<Head>(self.json.get())
            .expect("the JSON was encoded from a Pod, so its metadata decodes")
            .metadata
    }

    /// The typed pod.
    pub fn to_pod(&self) -> Pod {
        serde_json::from_str(self.json.get())
            .expect("the JSON was encoded from a Pod, so it decodes as one")
    }
}

impl From<Pod> for PodObject {
    /// Holds `pod` without its upstream `resourceVersion` and `managedFields`.
    fn from(mut pod: Pod) -> Self {
        let meta = &mut pod.metadata;
        meta.resource_version = None;
        meta.managed_fields = None;
        let replicasets = meta
            .owner_references
            .iter()
            .flatten()
            .filter(|o| o.kind == "ReplicaSet")
            .map(|o| o.name.as_str().into())
            .collect();
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        // Written as `Parts` would be, in two steps, to know where `status` begins.
        let head = Parts {
            metadata: &pod.metadata,
            spec: &pod.spec,
            status: &None,
        };
        let mut json =
            serde_json::to_string(&head).expect("a k8s-openapi Pod always encodes as JSON");
        json.pop(); // the closing brace
        let status_at = u32::try_from(json.len()).unwrap_or(u32::MAX);
        if let Some(status) = &pod.status {
            json.push_str(r#","status":"#);
            json.push_str(
                &serde_json::to_string(status).expect("a k8s-openapi Pod always encodes as JSON"),
            );
        }
        json.push('}');
        Self {
            id: NsName::of(&pod.metadata),
            replicasets,
            ready,
            status_at,
            json: RawValue::from_string(json).expect("written as JSON above"),
        }
    }
}

impl Default for PodObject {
    fn default() -> Self {
        Pod::default().into()
    }
}

impl PartialEq for PodObject {
    fn eq(&self, other: &Self) -> bool {
        // The identity and the owners are read out of the JSON, so the JSON decides.
        self.json.get() == other.json.get()
    }
}

impl Serialize for PodObject {
    /// As its JSON.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

impl<'de> Deserialize<'de> for PodObject {
    /// From a pod's JSON (a saved view): decoded as a `Pod` and held again.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Pod::deserialize(d).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};

    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "web-0", "namespace": "prod", "resourceVersion": "42",
                "labels": {"app": "web"},
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "u1"},
                    {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u2"}
                ]
            },
            "spec": {"containers": [{"name": "app"}], "nodeName": "n1"},
            "status": {"phase": "Running", "podIP": "10.0.0.1"}
        }))
        .expect("a pod")
    }

    #[test]
    fn a_pod_is_ready_only_with_a_true_ready_condition() {
        assert!(!PodObject::from(pod()).is_ready(), "no conditions");
        let with = |ty: &str, status: &str| {
            let mut p = pod();
            p.status
                .get_or_insert_default()
                .conditions
                .get_or_insert_default()
                .push(k8s_openapi::api::core::v1::PodCondition {
                    type_: ty.into(),
                    status: status.into(),
                    ..Default::default()
                });
            PodObject::from(p).is_ready()
        };
        assert!(with("Ready", "True"));
        assert!(!with("Ready", "False"));
        assert!(!with("ContainersReady", "True"));
    }

    #[test]
    fn a_held_pod_decodes_to_the_pod_without_its_upstream_version() {
        let mut full = pod();
        full.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        let held = PodObject::from(full.clone());
        assert_eq!(held.id(), &NsName::new("prod", "web-0"));
        assert_eq!(
            held.replicasets().collect::<Vec<_>>(),
            [NsName::new("prod", "web-abc")],
            "only ReplicaSet owners"
        );
        full.metadata.resource_version = None;
        full.metadata.managed_fields = None;
        assert_eq!(held.to_pod(), full);
        assert_eq!(held.metadata(), full.metadata);
        assert!(
            held.json().get().starts_with(r#"{"metadata":"#),
            "no apiVersion and kind: the served forms add them"
        );
    }

    #[test]
    fn two_states_compare_by_their_json_and_a_saved_pod_reads_back() {
        let a = PodObject::from(pod());
        let mut other = pod();
        other.metadata.resource_version = Some("43".into());
        assert_eq!(
            a,
            PodObject::from(other),
            "the upstream version is not content"
        );
        let mut moved = pod();
        moved.metadata.owner_references = Some(vec![OwnerReference {
            kind: "ReplicaSet".into(),
            name: "web-def".into(),
            ..OwnerReference::default()
        }]);
        assert_ne!(a, PodObject::from(moved));
        let saved = serde_json::to_string(&a).expect("encodes");
        let back: PodObject = serde_json::from_str(&saved).expect("decodes");
        assert_eq!(back, a);
        assert_eq!(back.id(), a.id());
    }

    #[test]
    fn its_json_is_the_pods_and_a_status_change_alone_is_told_apart() {
        let held = PodObject::from(pod());
        let mut typed = pod();
        typed.metadata.resource_version = None;
        let parts = Parts {
            metadata: &typed.metadata,
            spec: &typed.spec,
            status: &typed.status,
        };
        assert_eq!(
            held.json().get(),
            serde_json::to_string(&parts).expect("encodes"),
            "written in two steps, the same JSON"
        );
        let mut crashed = pod();
        crashed.status.as_mut().expect("status").phase = Some("Failed".into());
        let crashed = PodObject::from(crashed);
        assert_ne!(held, crashed);
        assert!(held.same_but_status(&crashed), "status alone");
        let mut relabelled = pod();
        relabelled.metadata.labels = Some([("app".to_owned(), "api".to_owned())].into());
        assert!(!held.same_but_status(&PodObject::from(relabelled)));
        let bare = PodObject::from(Pod::default());
        assert!(bare.same_but_status(&PodObject::from(Pod::default())));
        assert_eq!(bare.to_pod(), Pod::default());
    }
}
