//! Upstream objects as they come off the wire: each one kept as compact JSON, only its identity
//! read out, and decoded into its typed form one at a time, as the engine takes it. The pod
//! watcher uses it: pods are the one kind watched cluster-wide, so the one whose lists grow
//! with the remote rather than with what the link exports. It costs CPU: the same EndpointSlice
//! frames decoded at 38,900/s this way and at 55,400/s typed at once with their size counted by
//! encoding them, as the other watchers do (criterion, `upstream/decode_10k_slice_frames*`).
//!
//! kube-rs decodes a list page whole before the watcher yields its first object. Decoded into
//! typed objects, a page of 200,000 pods from a remote that ignores `limit` took 1.5 GiB, about
//! 15 times its JSON; kept as JSON until each is taken, it costs about its own size. The JSON
//! also gives each object's size for free, so one over the size limit is refused before
//! anything decodes it, and an object whose JSON is valid but whose shape is not (a field of
//! the wrong type) is refused on its own instead of failing the list it came in.
//!
//! The JSON is written back from the decoder's tokens (`serde_transcode`), not sliced out of
//! the input: serde hands a watch frame's object over from a buffer when the frame's `object`
//! comes before its `type` (JSON keys have no order), and a buffer has no input text left.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::OnceLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, Error as _};

use crate::model::wanted::WantedPods;

/// One upstream object of kind `K`: its JSON, and the metadata the watcher needs (name,
/// namespace, resourceVersion).
///
/// Its identity is held as three short strings and its `ObjectMeta` built from them on the
/// first [`kube::Resource::meta`] call: a list body decodes into a vector of every item before
/// the watcher yields the first, and an `ObjectMeta` is about 350 bytes inline however little
/// it holds (200,000 pods in one body: 90 MB of vector, where this is about 80 bytes an item).
pub struct Wire<K> {
    name: Option<Box<str>>,
    namespace: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    metadata: OnceLock<Box<ObjectMeta>>,
    /// `None` when the object was not wanted as it was decoded ([`WANTED`]).
    json: Option<Box<str>>,
    /// The object's controller, when a ReplicaSet: a skipped pod's churn is still its
    /// service's, and a new pod of a wanted ReplicaSet is kept ([`Wire::owner`]).
    owner: Option<Box<str>>,
    kind: PhantomData<fn() -> K>,
}

tokio::task_local! {
    /// The objects worth keeping, for the task decoding them: the pod watcher runs in its
    /// scope, so a list body's pods that nobody wants are dropped as the body decodes, instead
    /// of all being held as JSON until the watcher has yielded each (a one-body list of 50,000
    /// pods held 35 MB of them at once, and the pods kept meanwhile pinned those pages after
    /// they were freed). Outside a scope (the fetches, the benchmarks) everything is kept.
    /// Correct for the reasons [`super::wanted`] gives: a pod skipped just before it became
    /// wanted is covered by the fetch the engine asks for after wanting it.
    pub static WANTED: Option<WantedPods>;
}

impl<K> Wire<K> {
    fn build_meta(&self) -> Box<ObjectMeta> {
        let owned = |s: &Option<Box<str>>| s.as_deref().map(str::to_owned);
        Box::new(ObjectMeta {
            name: owned(&self.name),
            namespace: owned(&self.namespace),
            resource_version: owned(&self.resource_version),
            ..ObjectMeta::default()
        })
    }

    /// The object's JSON, compact; empty when it was skipped.
    pub fn json(&self) -> &str {
        self.json.as_deref().unwrap_or_default()
    }

    /// The size of the object's JSON, compact (0 when it was skipped).
    pub fn bytes(&self) -> usize {
        self.json().len()
    }

    /// True when the object was not wanted as it was decoded, so only its identity was kept.
    pub fn is_skipped(&self) -> bool {
        self.json.is_none()
    }

    /// The ReplicaSet that controls the object, if one does: the pod watcher counts a skipped
    /// pod's event as churn of the services that serve that ReplicaSet's pods, and admits a
    /// new pod of a wanted ReplicaSet ([`WantedPods::admits`]).
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }
}

impl<K: DeserializeOwned> Wire<K> {
    /// The typed object (an error for a skipped one: it has no JSON left).
    pub fn decode(&self) -> serde_json::Result<K> {
        match &self.json {
            Some(json) => serde_json::from_str(json),
            None => Err(serde_json::Error::custom(
                "the object was skipped as unwanted",
            )),
        }
    }
}

/// What is read of every object before it is decoded.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    metadata: Option<HeadMeta>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeadMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    #[serde(default)]
    owner_references: Vec<HeadOwner>,
}

/// An owner reference, as far as [`Wire::owner`] reads it.
#[derive(Deserialize)]
struct HeadOwner {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    controller: Option<bool>,
}

impl<'de, K> Deserialize<'de> for Wire<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut text = Vec::with_capacity(1024);
        serde_transcode::transcode(d, &mut serde_json::Serializer::new(&mut text))
            .map_err(D::Error::custom)?;
        // serde_json writes UTF-8 only.
        let json = String::from_utf8(text)
            .map_err(D::Error::custom)?
            .into_boxed_str();
        let head: Head = serde_json::from_str(&json).map_err(D::Error::custom)?;
        let meta = head.metadata.unwrap_or_default();
        let boxed = |s: Option<String>| s.map(String::into_boxed_str);
        let (name, namespace) = (boxed(meta.name), boxed(meta.namespace));
        let owner = (meta.owner_references.into_iter())
            .find(|o| o.controller == Some(true) && o.kind == "ReplicaSet")
            .map(|o| o.name.into_boxed_str());
        let wanted = WANTED
            .try_with(|w| {
                w.as_ref().is_none_or(|w| {
                    w.admits(
                        namespace.as_deref().unwrap_or_default(),
                        name.as_deref().unwrap_or_default(),
                        owner.as_deref(),
                    )
                })
            })
            .unwrap_or(true);
        Ok(Self {
            name,
            namespace,
            resource_version: boxed(meta.resource_version),
            metadata: OnceLock::new(),
            json: wanted.then_some(json),
            owner,
            kind: PhantomData,
        })
    }
}

// kube-rs's watcher asks for `Clone + Debug`; neither is on a hot path.
impl<K> Clone for Wire<K> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            resource_version: self.resource_version.clone(),
            metadata: self.metadata.clone(),
            json: self.json.clone(),
            owner: self.owner.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for Wire<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wire")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl<K: kube::Resource> kube::Resource for Wire<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn metadata_api() -> bool {
        K::metadata_api()
    }

    fn url_path(dt: &Self::DynamicType, namespace: Option<&str>) -> String {
        K::url_path(dt, namespace)
    }

    fn meta(&self) -> &ObjectMeta {
        self.metadata.get_or_init(|| self.build_meta())
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        if self.metadata.get().is_none() {
            let _ = self.metadata.set(self.build_meta());
        }
        self.metadata.get_mut().expect("set just above")
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use kube::core::{ObjectList, WatchEvent};
    use kube::{Resource, ResourceExt};

    use super::*;
    use crate::model::wanted::PodHash;

    const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-0","namespace":"prod","resourceVersion":"42","labels":{"app":"web"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web-rs","uid":"u1","controller":true}]},"spec":{"containers":[{"name":"app","image":"web:1"}]},"status":{"podIP":"10.0.0.7"}}"#;

    /// The pod of a MODIFIED watch frame.
    fn modified(line: &str) -> Wire<Pod> {
        match serde_json::from_str::<WatchEvent<Wire<Pod>>>(line) {
            Ok(WatchEvent::Modified(w)) => w,
            other => panic!("not a MODIFIED event: {other:?}"),
        }
    }

    #[test]
    fn a_list_keeps_each_object_as_json_and_decodes_it_on_demand() {
        let body = format!(
            r#"{{"apiVersion":"v1","kind":"PodList","metadata":{{"resourceVersion":"50"}},"items":[{POD},{{"kind":"Pod"}}]}}"#
        );
        let list: ObjectList<Wire<Pod>> = serde_json::from_str(&body).expect("a list of wires");
        assert_eq!(list.metadata.resource_version.as_deref(), Some("50"));
        assert_eq!(list.items.len(), 2);
        let w = &list.items[0];
        assert_eq!(w.name_any(), "web-0");
        assert_eq!(w.namespace().as_deref(), Some("prod"));
        assert_eq!(w.resource_version().as_deref(), Some("42"));
        assert_eq!(w.bytes(), POD.len(), "compact JSON comes out as it went in");
        let pod = w.decode().expect("a pod");
        assert_eq!(pod.labels().get("app").map(String::as_str), Some("web"));
        assert_eq!(
            pod.status.and_then(|s| s.pod_ip).as_deref(),
            Some("10.0.0.7")
        );
        assert_eq!(
            list.items[1].name_any(),
            "",
            "an object without metadata has no name"
        );
    }

    #[test]
    fn a_watch_frame_keeps_its_object_and_a_wrong_shape_fails_only_its_decoding() {
        let line = format!(r#"{{"type":"MODIFIED","object":{POD}}}"#);
        let w = modified(&line);
        assert_eq!(w.json(), POD);
        let bad = POD.replace(r#""podIP":"10.0.0.7""#, r#""podIP":7"#);
        let line = format!(r#"{{"type":"MODIFIED","object":{bad}}}"#);
        let w = modified(&line);
        assert_eq!(w.name_any(), "web-0");
        let e = w.decode().expect_err("a number is no IP string");
        assert!(e.to_string().contains("invalid type"), "{e}");
    }

    #[test]
    fn an_object_before_its_type_is_kept_all_the_same() {
        let line = format!(r#"{{"object":{POD},"type":"MODIFIED"}}"#);
        let w = modified(&line);
        assert_eq!(w.resource_version().as_deref(), Some("42"));
        assert_eq!(
            w.decode().expect("a pod").metadata.name.as_deref(),
            Some("web-0")
        );
    }

    #[test]
    fn what_is_no_object_does_not_make_a_wire() {
        for bad in [
            r#"{"type":"MODIFIED","object":"this is not an object"}"#,
            r#"{"type":"MODIFIED","object":{"metadata":{"name":7}}}"#,
            r#"{"type":"MODIFIED","object":{"metadata":{"name":"x"}"#,
        ] {
            assert!(
                serde_json::from_str::<WatchEvent<Wire<Pod>>>(bad).is_err(),
                "{bad}"
            );
        }
    }

    /// In the pod watcher's scope, a list's unwanted pods keep only their identity as the body
    /// decodes; wanted ones, and every one outside the scope, keep their JSON.
    #[tokio::test]
    async fn in_a_wanted_scope_unwanted_objects_are_dropped_as_they_decode() {
        let other = POD.replace("web-0", "web-1");
        let body = format!(r#"{{"kind":"PodList","metadata":{{}},"items":[{POD},{other}]}}"#);
        let decode = || serde_json::from_str::<ObjectList<Wire<Pod>>>(&body).expect("a list");
        let wanted = WantedPods::default();
        wanted.insert(PodHash::of("prod", "web-0"));
        let list = WANTED.scope(Some(wanted.clone()), async { decode() }).await;
        let [kept, skipped] = &list.items[..] else {
            panic!("two items")
        };
        assert!(!kept.is_skipped());
        assert_eq!(kept.json(), POD);
        assert!(skipped.is_skipped());
        assert_eq!(skipped.name_any(), "web-1", "its identity stays");
        assert_eq!(skipped.owner(), Some("web-rs"), "and its ReplicaSet");
        assert_eq!(kept.owner(), Some("web-rs"));
        assert_eq!(skipped.resource_version().as_deref(), Some("42"));
        assert_eq!(skipped.bytes(), 0);
        assert!(skipped.decode().is_err(), "nothing left to decode");
        // Wanted since (the race): refused as unwanted, not as undecodable; the fetch brings it.
        let admitted = super::super::admit::wired(skipped.clone(), |p| {
            crate::model::Object::Pod(std::sync::Arc::new(p.into()))
        });
        assert!(matches!(
            admitted,
            Err(super::super::admit::Refused::Unwanted)
        ));
        let outside = decode();
        assert!(outside.items.iter().all(|w| !w.is_skipped()));
        let everything = WANTED
            .scope(Some(WantedPods::everything()), async { decode() })
            .await;
        assert!(everything.items.iter().all(|w| !w.is_skipped()));
        // A new pod of a wanted ReplicaSet is kept before anything names it.
        wanted.want_owner(&crate::model::NsName::new("prod", "web-rs"), true);
        let list = WANTED.scope(Some(wanted), async { decode() }).await;
        assert!(list.items.iter().all(|w| !w.is_skipped()));
    }

    #[test]
    fn it_asks_for_what_its_kind_asks_for() {
        use k8s_openapi::api::apps::v1::ReplicaSet;
        use kube::api::PartialObjectMeta;
        assert_eq!(
            Wire::<Pod>::url_path(&(), Some("prod")),
            "/api/v1/namespaces/prod/pods"
        );
        assert_eq!(Wire::<Pod>::kind(&()), "Pod");
        assert!(!Wire::<Pod>::metadata_api());
        assert!(Wire::<PartialObjectMeta<ReplicaSet>>::metadata_api());
    }
}
