//! The remote's Linkerd configuration: the one ConfigMap `linkerd-config` in the Link's
//! `targetClusterLinkerdNamespace`, which `linkerd multicluster check` reads through the link's
//! credentials to compare trust anchors. Watched by name (a `metadata.name` field selector in
//! that namespace), so no other ConfigMap of the remote is ever read.
//!
//! Linkerd's own remote-access ClusterRole grants only `get` on it: where the credentials may
//! not list it, the link follows no ConfigMap (said once at each connection) rather than never
//! syncing.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::task::JoinSet;

use super::admit::typed;
use super::watch::{Gate, Watch};
use crate::model::{Kind, LINKERD_CONFIG, Object};

/// The field selector that names the one ConfigMap followed.
pub fn field_selector() -> String {
    format!("metadata.name={LINKERD_CONFIG}")
}

/// Whether the remote lets these credentials list `linkerd-config` in `namespace` (an empty
/// list counts: a remote without Linkerd has none to serve). A refusal (403) is an answer, not
/// an error; anything else is the remote's failure to answer.
pub async fn readable(client: &Client, namespace: &str) -> Result<bool, kube::Error> {
    let lp = ListParams::default().fields(&field_selector()).limit(1);
    match Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            tracing::warn!(
                namespace,
                message = %s.message,
                "the remote's credentials may not list ConfigMap {LINKERD_CONFIG}: it is not \
                 served (grant get, list and watch on it, docs/configuration.md)"
            );
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

impl Watch<'_> {
    /// Spawns the watcher of `linkerd-config` in `namespace`, by name (`all` with a field
    /// selector).
    pub(super) fn linkerd_config(
        &self,
        tasks: &mut JoinSet<()>,
        all: watcher::Config,
        namespace: &str,
    ) {
        let c = self.client.clone();
        let ns = namespace.to_owned();
        self.spawn(
            tasks,
            Kind::ConfigMap,
            all.fields(&field_selector()),
            move |w| watcher::watcher(Api::<ConfigMap>::namespaced(c.clone(), &ns), w),
            |c| typed(c, |c| Object::ConfigMap(Arc::new(c))),
            Gate::Open,
            None,
        );
    }
}
