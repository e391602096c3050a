//! The objects that flow through a link, their keys, and the relations that tie them to a
//! publication group (a service, or the Servers of a namespace).
//!
//! Objects arrive decoded (the upstream edge decodes JSON) and are shared behind `Arc`s: the
//! upstream cache, the published view and every watcher refer to one allocation. The pods the
//! engine wants are announced to the pod watcher through [`wanted::WantedPods`].

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

mod endpoints;
mod kind;
mod pod;
mod slice;
pub mod wanted;

pub use endpoints::{EndpointsObject, HeldAddress, HeldSubset};
pub use kind::{KINDS, Kind, KindDef};
pub use pod::PodObject;
pub use slice::{
    DeflatedSlice, Dictionary, Form, HeldSlice, SliceEndpoint, SliceObject, shared_dictionary,
};

/// The label the EndpointSlice controller puts on a slice: the name of its service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Set on a published Service whose endpoints the cap truncated: how many were withheld.
pub const TRUNCATED_ANNOTATION: &str = "floodgate.dev/endpoints-truncated";

/// Set beside [`TRUNCATED_ANNOTATION`]: the service's endpoints upstream, before the cap.
pub const TOTAL_ANNOTATION: &str = "floodgate.dev/endpoints-total";

/// The one ConfigMap a link carries: the remote's Linkerd configuration (its identity trust
/// anchors among it), in the Link's `targetClusterLinkerdNamespace`.
pub const LINKERD_CONFIG: &str = "linkerd-config";

/// A namespaced name. Cheap to clone: both parts are shared.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NsName {
    /// The namespace.
    pub namespace: Arc<str>,
    /// The name.
    pub name: Arc<str>,
}

impl NsName {
    /// `namespace/name`.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of an object's metadata (an empty namespace for cluster-scoped ones).
    pub fn of(meta: &ObjectMeta) -> Self {
        Self::new(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }
}

impl fmt::Debug for NsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl Serialize for NsName {
    /// As `namespace/name`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for NsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// An object's identity in a link.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjKey {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace and name.
    pub id: NsName,
}

/// A Linkerd `Server` (policy.linkerd.io/v1beta3): carried through as it is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Server {
    /// The object's metadata.
    pub metadata: ObjectMeta,
    /// The spec, uninterpreted.
    #[serde(default)]
    pub spec: serde_json::Value,
}

/// A decoded object of one of the link's kinds.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// A service.
    Service(Arc<Service>),
    /// An EndpointSlice, whole or deflated.
    EndpointSlice(HeldSlice),
    /// A core/v1 Endpoints.
    Endpoints(Arc<EndpointsObject>),
    /// A pod.
    Pod(Arc<PodObject>),
    /// A ReplicaSet's metadata.
    ReplicaSet(Arc<ObjectMeta>),
    /// A Linkerd Server.
    Server(Arc<Server>),
    /// The remote's `linkerd-config`.
    ConfigMap(Arc<ConfigMap>),
}

impl Object {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::Endpoints(_) => Kind::Endpoints,
            Object::Pod(_) => Kind::Pod,
            Object::ReplicaSet(_) => Kind::ReplicaSet,
            Object::Server(_) => Kind::Server,
            Object::ConfigMap(_) => Kind::ConfigMap,
        }
    }

    /// Its metadata. A pod's and a slice's are decoded from their JSON
    /// ([`PodObject::metadata`], [`SliceObject::metadata`]): where only the name is read,
    /// [`Object::namespace`] and [`Object::name`] cost nothing.
    pub fn meta(&self) -> Cow<'_, ObjectMeta> {
        Cow::Borrowed(match self {
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(o) => return Cow::Owned(o.metadata()),
            Object::Endpoints(o) => &o.metadata,
            Object::Pod(o) => return Cow::Owned(o.metadata()),
            Object::ReplicaSet(m) => m,
            Object::Server(o) => &o.metadata,
            Object::ConfigMap(o) => &o.metadata,
        })
    }

    /// Its namespace (empty for none).
    pub fn namespace(&self) -> &str {
        match (self, self.typed_meta()) {
            (Object::Pod(o), _) => &o.id().namespace,
            (Object::EndpointSlice(o), _) => &o.id().namespace,
            (_, m) => m.and_then(|m| m.namespace.as_deref()).unwrap_or_default(),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        match (self, self.typed_meta()) {
            (Object::Pod(o), _) => &o.id().name,
            (Object::EndpointSlice(o), _) => &o.id().name,
            (_, m) => m.and_then(|m| m.name.as_deref()).unwrap_or_default(),
        }
    }

    /// The metadata of a kind held typed (every kind but pods).
    fn typed_meta(&self) -> Option<&ObjectMeta> {
        Some(match self {
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(_) => return None,
            Object::Endpoints(o) => &o.metadata,
            Object::Pod(_) => return None,
            Object::ReplicaSet(m) => m,
            Object::Server(o) => &o.metadata,
            Object::ConfigMap(o) => &o.metadata,
        })
    }

    /// Its namespace and name.
    pub fn id(&self) -> NsName {
        match self {
            Object::Pod(o) => o.id().clone(),
            Object::EndpointSlice(o) => o.id().clone(),
            _ => NsName::new(self.namespace(), self.name()),
        }
    }

    /// Its key.
    pub fn key(&self) -> ObjKey {
        ObjKey {
            kind: self.kind(),
            id: self.id(),
        }
    }

    /// The same object as served downstream: no upstream resourceVersion (Floodgate issues its
    /// own) and no managedFields. Content comparisons between two upstream states use this form,
    /// so a relist that changes nothing publishes nothing. An object that is already clean is
    /// returned as it is, and one that is not shared is cleaned in place: decoded upstream
    /// objects are never copied.
    pub fn into_sanitized(mut self) -> Object {
        fn dirty(meta: &ObjectMeta) -> bool {
            meta.resource_version.is_some() || meta.managed_fields.is_some()
        }
        fn clean(meta: &mut ObjectMeta) {
            meta.resource_version = None;
            meta.managed_fields = None;
        }
        // A pod is held without them ([`PodObject`]).
        if !self.typed_meta().is_some_and(dirty) {
            return self;
        }
        match &mut self {
            Object::Service(x) => clean(&mut Arc::make_mut(x).metadata),
            // Held without them ([`SliceObject`]).
            Object::EndpointSlice(_) => {}
            Object::Endpoints(x) => clean(&mut Arc::make_mut(x).metadata),
            Object::Pod(_) => {}
            Object::ReplicaSet(x) => clean(Arc::make_mut(x)),
            Object::Server(x) => clean(&mut Arc::make_mut(x).metadata),
            Object::ConfigMap(x) => clean(&mut Arc::make_mut(x).metadata),
        }
        self
    }

    /// Decodes what [`Object::to_json`] wrote (a saved view): the kind comes from `kind`.
    pub fn from_json(mut v: serde_json::Value) -> Result<Object, serde_json::Error> {
        use serde::de::Error as _;
        let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
        let o = match kind {
            "Service" => Object::Service(Arc::new(serde_json::from_value(v)?)),
            "EndpointSlice" => Object::EndpointSlice(serde_json::from_value(v)?),
            "Endpoints" => Object::Endpoints(Arc::new(serde_json::from_value(v)?)),
            "Pod" => Object::Pod(Arc::new(serde_json::from_value(v)?)),
            "ReplicaSet" => {
                let meta = v.get_mut("metadata").map(serde_json::Value::take);
                Object::ReplicaSet(Arc::new(serde_json::from_value(meta.unwrap_or_default())?))
            }
            "Server" => Object::Server(Arc::new(serde_json::from_value(v)?)),
            "ConfigMap" => Object::ConfigMap(Arc::new(serde_json::from_value(v)?)),
            other => {
                return Err(serde_json::Error::custom(format!("unknown kind {other:?}")));
            }
        };
        Ok(o)
    }

    /// The JSON a Kubernetes client expects, with `kind`, `apiVersion` and the given
    /// resourceVersion.
    pub fn to_json(&self, resource_version: &str) -> serde_json::Value {
        let mut v = match self {
            Object::Service(o) => serde_json::to_value(o.as_ref()),
            Object::EndpointSlice(o) => serde_json::to_value(o),
            Object::Endpoints(o) => serde_json::to_value(o.as_ref()),
            Object::Pod(o) => serde_json::to_value(o.as_ref()),
            Object::ReplicaSet(m) => {
                serde_json::to_value(m.as_ref()).map(|m| serde_json::json!({ "metadata": m }))
            }
            Object::Server(o) => serde_json::to_value(o.as_ref()),
            Object::ConfigMap(o) => serde_json::to_value(o.as_ref()),
        }
        .unwrap_or_default();
        if let Some(map) = v.as_object_mut() {
            let kind = self.kind();
            map.insert("kind".into(), kind.name().into());
            map.insert("apiVersion".into(), kind.api_version().into());
            if let Some(meta) = map.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                meta.insert("resourceVersion".into(), resource_version.into());
            }
        }
        v
    }
}

/// The group a publication belongs to: what coalescing, rate limits and caps count in.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// A service with its slices, endpoints, pods and their ReplicaSets.
    Service(NsName),
    /// The Servers of a namespace that holds a selected service.
    Servers(Arc<str>),
    /// The remote's `linkerd-config` ConfigMap: looked up by no other kind, and counted in no
    /// rate that could contain a service or quarantine the link.
    LinkerdConfig,
}
