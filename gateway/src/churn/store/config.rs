//! How the store holds the remote's Linkerd configuration: the `linkerd-config` ConfigMap its
//! watcher selects by name in the Link's `targetClusterLinkerdNamespace`. It is one group of
//! its own ([`Group::LinkerdConfig`]), tied to no service.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;

use super::{Store, Touched};
use crate::model::{Group, NsName, Object};

impl Store {
    /// A ConfigMap applied or deleted: the Linkerd configuration's group.
    pub(super) fn change_config_map(&mut self, id: &NsName, obj: Option<Object>) -> Touched {
        match obj {
            Some(Object::ConfigMap(c)) => self.config_maps.insert(id.clone(), c),
            _ => self.config_maps.remove(id),
        };
        Touched {
            groups: vec![Group::LinkerdConfig],
            relevant: true,
            ..Touched::default()
        }
    }

    /// The ConfigMaps held (the remote's `linkerd-config`, or nothing), by name.
    pub fn config_maps(&self) -> Vec<Arc<ConfigMap>> {
        let mut v: Vec<_> = self.config_maps.values().cloned().collect();
        v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        v
    }
}
