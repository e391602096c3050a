//! What the shipped manifests let a ServiceAccount do, judged as RBAC judges it: the rules of
//! every Role bound to it, each in its binding's namespace. Tests hold what a controller asked
//! of the local cluster ([`crate::local::Access`]) against it.

use std::path::Path;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding};
use serde::Deserialize as _;

use crate::local::Access;

/// The rules granted to one ServiceAccount, by namespace.
#[derive(Debug)]
pub struct Grants {
    rules: Vec<(String, PolicyRule)>,
}

impl Grants {
    /// What `kubectl kustomize manifests/` grants ServiceAccount `namespace/name` (Roles and
    /// RoleBindings; the manifests hold no ClusterRole, and this says so if one appears).
    pub fn of_service_account(namespace: &str, name: &str) -> anyhow::Result<Self> {
        let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
        let out = std::process::Command::new("kubectl")
            .arg("kustomize")
            .arg(&manifests)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl kustomize: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout)?;
        let docs: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&text)
            .map(serde_json::Value::deserialize)
            .collect::<Result<_, _>>()?;
        let of = |kind: &'static str| docs.iter().filter(move |d| d["kind"] == kind);
        anyhow::ensure!(
            of("ClusterRole").next().is_none() && of("ClusterRoleBinding").next().is_none(),
            "the manifests grant cluster-wide rights"
        );
        let roles: Vec<Role> = of("Role")
            .map(|d| serde_json::from_value(d.clone()))
            .collect::<Result<_, _>>()?;
        let mut rules = Vec::new();
        for binding in of("RoleBinding") {
            let binding: RoleBinding = serde_json::from_value(binding.clone())?;
            let ns = binding.metadata.namespace.clone().unwrap_or_default();
            let bound = binding.subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount"
                    && s.name == name
                    && s.namespace.as_deref() == Some(namespace)
            });
            if !bound {
                continue;
            }
            let role = roles
                .iter()
                .find(|r| {
                    r.metadata.name.as_deref() == Some(binding.role_ref.name.as_str())
                        && r.metadata.namespace.as_deref() == Some(ns.as_str())
                })
                .ok_or_else(|| {
                    anyhow::anyhow!("RoleBinding {ns}/{:?}: no Role", binding.role_ref.name)
                })?;
            for rule in role.rules.iter().flatten() {
                rules.push((ns.clone(), rule.clone()));
            }
        }
        Ok(Self { rules })
    }

    /// True when some rule grants `access` (its namespace, group, resource and verb).
    /// Rules naming objects (`resourceNames`) are not counted: the controller's requests are
    /// lists and watches, which they do not cover.
    pub fn allow(&self, access: &Access) -> bool {
        let any = |list: &Option<Vec<String>>, want: &str| {
            list.iter().flatten().any(|x| x == "*" || x == want)
        };
        self.rules.iter().any(|(ns, rule)| {
            *ns == access.namespace
                && any(&rule.api_groups, access.group)
                && any(&rule.resources, &access.resource)
                && rule.verbs.iter().any(|v| v == "*" || v == access.verb)
                && rule.resource_names.as_ref().is_none_or(Vec::is_empty)
        })
    }

    /// The namespaces in which some rule grants any verb on `resource` of `group`.
    pub fn namespaces_granting(&self, group: &str, resource: &str) -> Vec<String> {
        let mut out: Vec<String> = (self.rules.iter())
            .filter(|(_, r)| {
                r.api_groups
                    .iter()
                    .flatten()
                    .any(|g| g == "*" || g == group)
                    && r.resources
                        .iter()
                        .flatten()
                        .any(|x| x == "*" || x == resource)
            })
            .map(|(ns, _)| ns.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}
