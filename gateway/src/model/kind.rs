//! The kinds a link carries, each defined once: its variant in [`Kind`] and its row in
//! [`KINDS`] (API group and version, the names discovery and kubectl use, the Table columns,
//! whether it has a protobuf form, whether a remote may lack it). What a kind's objects are in
//! memory is its variant of [`super::Object`]; everything else that differs by kind is an
//! exhaustive `match` the compiler points at when a kind is added (ARCHITECTURE.md, "adding a
//! kind").

use serde::{Deserialize, Serialize};

/// The resources a link carries (the Linkerd consumer profile).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    /// `v1` services.
    Service,
    /// `discovery.k8s.io/v1` endpointslices.
    EndpointSlice,
    /// `v1` endpoints.
    Endpoints,
    /// `v1` pods.
    Pod,
    /// `apps/v1` replicasets (metadata only).
    ReplicaSet,
    /// `policy.linkerd.io/v1beta3` servers.
    Server,
    /// `v1` configmaps: only the remote's `linkerd-config` ([`super::LINKERD_CONFIG`]), passed
    /// through read-only for `linkerd multicluster check`.
    ConfigMap,
}

/// One kind's definition: what the API, discovery, kubectl and the wire need to know of it.
#[derive(Debug, PartialEq, Eq)]
pub struct KindDef {
    /// The kind.
    pub kind: Kind,
    /// `kind` as the API names it.
    pub name: &'static str,
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// `apiVersion` as the API names it (`version`, or `group/version`).
    pub api_version: &'static str,
    /// Plural resource name, as in URLs.
    pub plural: &'static str,
    /// Singular name.
    pub singular: &'static str,
    /// Short names kubectl accepts.
    pub short_names: &'static [&'static str],
    /// The Table columns kubectl prints, (name, type), as its own printers name them.
    pub columns: &'static [(&'static str, &'static str)],
    /// Whether its objects have a protobuf form (a custom resource has none).
    pub protobuf: bool,
    /// Whether a remote may not serve it: a link follows it only where the remote does, and a
    /// peer replica that does not serve it is no error.
    pub optional: bool,
}

/// Every kind's definition, in [`Kind::ALL`]'s order.
pub static KINDS: [KindDef; Kind::ALL.len()] = [
    KindDef {
        kind: Kind::Service,
        name: "Service",
        group: "",
        version: "v1",
        api_version: "v1",
        plural: "services",
        singular: "service",
        short_names: &["svc"],
        columns: &[
            ("Name", "name"),
            ("Type", "string"),
            ("Cluster-IP", "string"),
            ("Port(s)", "string"),
            ("Age", "string"),
        ],
        protobuf: true,
        optional: false,
    },
    KindDef {
        kind: Kind::EndpointSlice,
        name: "EndpointSlice",
        group: "discovery.k8s.io",
        version: "v1",
        api_version: "discovery.k8s.io/v1",
        plural: "endpointslices",
        singular: "endpointslice",
        short_names: &[],
        columns: &[
            ("Name", "name"),
            ("AddressType", "string"),
            ("Ports", "string"),
            ("Endpoints", "string"),
            ("Age", "string"),
        ],
        protobuf: true,
        optional: false,
    },
    KindDef {
        kind: Kind::Endpoints,
        name: "Endpoints",
        group: "",
        version: "v1",
        api_version: "v1",
        plural: "endpoints",
        singular: "endpoints",
        short_names: &["ep"],
        columns: &[("Name", "name"), ("Endpoints", "string"), ("Age", "string")],
        protobuf: true,
        optional: false,
    },
    KindDef {
        kind: Kind::Pod,
        name: "Pod",
        group: "",
        version: "v1",
        api_version: "v1",
        plural: "pods",
        singular: "pod",
        short_names: &["po"],
        columns: &[
            ("Name", "name"),
            ("Ready", "string"),
            ("Status", "string"),
            ("Restarts", "integer"),
            ("Age", "string"),
        ],
        protobuf: true,
        optional: false,
    },
    KindDef {
        kind: Kind::ReplicaSet,
        name: "ReplicaSet",
        group: "apps",
        version: "v1",
        api_version: "apps/v1",
        plural: "replicasets",
        singular: "replicaset",
        short_names: &["rs"],
        columns: &[("Name", "name"), ("Age", "string")],
        protobuf: true,
        optional: false,
    },
    KindDef {
        kind: Kind::Server,
        name: "Server",
        group: "policy.linkerd.io",
        version: "v1beta3",
        api_version: "policy.linkerd.io/v1beta3",
        plural: "servers",
        singular: "server",
        short_names: &["srv"],
        columns: &[("Name", "name"), ("Age", "string")],
        protobuf: false,
        optional: true,
    },
    KindDef {
        kind: Kind::ConfigMap,
        name: "ConfigMap",
        group: "",
        version: "v1",
        api_version: "v1",
        plural: "configmaps",
        singular: "configmap",
        short_names: &["cm"],
        columns: &[("Name", "name"), ("Data", "integer"), ("Age", "string")],
        protobuf: true,
        optional: true,
    },
];

// Each row sits at its kind's place, and its `apiVersion` is its group and version.
const _: () = {
    let mut i = 0;
    while i < Kind::ALL.len() {
        assert!(Kind::ALL[i].index() == i);
        assert!(KINDS[i].kind as usize == i);
        i += 1;
    }
};

impl Kind {
    /// Every kind, in a fixed order.
    pub const ALL: [Kind; 7] = [
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Endpoints,
        Kind::Pod,
        Kind::ReplicaSet,
        Kind::Server,
        Kind::ConfigMap,
    ];

    /// This kind's place in [`Kind::ALL`], for tables indexed by kind.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Its definition.
    pub fn def(self) -> &'static KindDef {
        &KINDS[self.index()]
    }

    /// `kind` as the API names it.
    pub fn name(self) -> &'static str {
        self.def().name
    }

    /// `apiVersion` as the API names it.
    pub fn api_version(self) -> &'static str {
        self.def().api_version
    }
}

impl KindDef {
    /// Finds a resource by group, version and plural.
    pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static KindDef> {
        KINDS
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// The list kind: `ServiceList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `apiVersion` is `version` in the core group, `group/version` elsewhere.
    #[test]
    fn every_api_version_is_its_group_and_version() {
        for d in &KINDS {
            let want = if d.group.is_empty() {
                d.version.to_owned()
            } else {
                format!("{}/{}", d.group, d.version)
            };
            assert_eq!(d.api_version, want, "{:?}", d.kind);
            assert_eq!(d.columns.first(), Some(&("Name", "name")), "{:?}", d.kind);
            assert_eq!(d.columns.last(), Some(&("Age", "string")), "{:?}", d.kind);
        }
    }
}
