//! The remote's Linkerd configuration: the one ConfigMap `linkerd-config` in the Link's
//! `targetClusterLinkerdNamespace`, which `linkerd multicluster check` reads through the link's
//! credentials to compare trust anchors. Watched by name (a `metadata.name` field selector in
//! that namespace), so no other ConfigMap of the remote is ever read.
//!
//! Linkerd's own remote-access ClusterRole grants only `get` on it: where the remote's access
//! reviews say the credentials may not list and watch it, the link follows no ConfigMap (said
//! once at each connection) rather than never syncing.

use std::sync::Arc;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
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

/// Whether the remote lets these credentials list and watch `linkerd-config` in `namespace`,
/// as its access reviews answer (a review, not a list: connecting costs the remote no LIST). A
/// refused review (403) is an answer too; anything else is the remote's failure to answer.
pub async fn readable(client: &Client, namespace: &str) -> Result<bool, kube::Error> {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    for verb in ["list", "watch"] {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    version: Some("v1".into()),
                    resource: Some("configmaps".into()),
                    namespace: Some(namespace.into()),
                    name: Some(LINKERD_CONFIG.into()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let why = match reviews.create(&PostParams::default(), &review).await {
            Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => continue,
            Ok(r) => r.status.and_then(|s| s.reason).unwrap_or_default(),
            Err(kube::Error::Api(s)) if s.code == 403 => s.message,
            Err(e) => return Err(e),
        };
        tracing::warn!(
            namespace,
            verb,
            reason = %why,
            "the remote's credentials may not {verb} ConfigMap {LINKERD_CONFIG}: it is not \
             served (grant get, list and watch on it, docs/configuration.md)"
        );
        return Ok(false);
    }
    Ok(true)
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
