//! Pure reconciliation: a `Link` and the Secrets it names become what should run (or why it
//! cannot), and what runs becomes an action. No kube client, no clock: the controller feeds it
//! what its caches hold, and the tests feed it builders.

use floodgate_link_crd::{Link, LinkSpec, validate};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;

use crate::credentials::{TOKEN_KEY, token_secret_name};

/// A link the controller should run, with everything it needs to connect and to serve.
#[derive(Clone, PartialEq)]
pub struct DesiredLink {
    /// The Link's name: the facade's `/links/<name>/` prefix.
    pub name: String,
    /// The validated spec.
    pub spec: LinkSpec,
    /// The remote's kubeconfig (YAML), from the referenced Secret.
    pub kubeconfig: String,
    /// The consumers' bearer token, from `floodgate-token-<name>`.
    pub token: String,
    /// The Link's `metadata.generation` this was computed from.
    pub generation: Option<i64>,
}

impl std::fmt::Debug for DesiredLink {
    // Credentials stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DesiredLink")
            .field("name", &self.name)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl DesiredLink {
    /// True when `other` runs the same way: same spec, remote credentials and token. A change
    /// of generation alone (a label, say) needs no restart.
    pub fn same_run(&self, other: &Self) -> bool {
        self.same_view(other) && self.kubeconfig == other.kubeconfig
    }

    /// True when `other` serves the same view (same spec and token), whatever its credentials.
    pub fn same_view(&self, other: &Self) -> bool {
        self.spec == other.spec && self.token == other.token
    }
}

/// Why a Link cannot run now. Becomes a `SpecValid` or `Ready` condition with this reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// CamelCase, for the condition and the Event.
    pub reason: &'static str,
    /// A sentence for people.
    pub message: String,
}

impl Blocked {
    /// True when the spec itself is wrong (as opposed to a missing Secret).
    pub fn is_spec_error(&self) -> bool {
        matches!(self.reason, "InvalidSpec" | "KubeconfigPathInCluster")
    }
}

/// The Secrets a Link needs, by name (its credentials, its token).
pub fn referenced_secrets(link: &Link) -> Vec<String> {
    let mut names = vec![token_secret_name(&link.name_any())];
    if let Some(s) = &link.spec.remote.kubeconfig_secret {
        names.push(s.name.clone());
    }
    names
}

/// What should run for `link`, given the Secrets the controller found in `namespace` (`None`:
/// not found).
pub fn desired(
    link: &Link,
    namespace: &str,
    credentials: Option<&Secret>,
    token: Option<&Secret>,
) -> Result<DesiredLink, Blocked> {
    let name = link.name_any();
    if let Err(errs) = validate(&link.spec, "spec") {
        return Err(Blocked {
            reason: "InvalidSpec",
            message: errs.to_string(),
        });
    }
    let Some(secret_ref) = &link.spec.remote.kubeconfig_secret else {
        return Err(Blocked {
            reason: "KubeconfigPathInCluster",
            message: "in a cluster, spec.remote.kubeconfigSecret names the remote's credentials; kubeconfigPath is for `floodgate run`".into(),
        });
    };
    let Some(credentials) = credentials else {
        return Err(Blocked {
            reason: "SecretNotFound",
            message: format!("Secret {namespace}/{} not found", secret_ref.name),
        });
    };
    let kubeconfig = secret_value(credentials, &secret_ref.key).ok_or_else(|| Blocked {
        reason: "SecretKeyNotFound",
        message: format!(
            "Secret {namespace}/{} has no key {:?}",
            secret_ref.name, secret_ref.key
        ),
    })?;
    if let Err(e) = kube::config::Kubeconfig::from_yaml(&kubeconfig) {
        return Err(Blocked {
            reason: "InvalidKubeconfig",
            message: format!(
                "Secret {namespace}/{} key {:?} is not a kubeconfig: {e}",
                secret_ref.name, secret_ref.key
            ),
        });
    }
    let token_name = token_secret_name(&name);
    let token = token
        .and_then(|t| secret_value(t, TOKEN_KEY))
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Blocked {
            reason: "TokenNotFound",
            message: format!(
                "Secret {namespace}/{token_name} with key {TOKEN_KEY:?} (the consumers' token) not found: `floodgate wrap` prints it"
            ),
        })?;
    Ok(DesiredLink {
        name,
        spec: link.spec.clone(),
        kubeconfig,
        token,
        generation: link.metadata.generation,
    })
}

fn secret_value(secret: &Secret, key: &str) -> Option<String> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return String::from_utf8(v.0.clone()).ok();
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .cloned()
}

/// What the controller does with one link.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Start it.
    Start(DesiredLink),
    /// Stop the running one and start this one (its spec or token changed).
    Restart(DesiredLink),
    /// Keep the running link and its view; reconnect its upstream with these credentials.
    Reconnect(DesiredLink),
    /// Stop it (the Link is gone).
    Stop,
    /// Leave it as it is (unchanged; or blocked, which keeps the last good run serving).
    Keep,
}

/// The action that takes `running` to `desired`. `desired` is `None` when the Link is gone.
/// A blocked Link keeps its last good run: an invalid edit or a deleted Secret never takes a
/// serving view away from consumers; its status says what is wrong.
pub fn plan(
    running: Option<&DesiredLink>,
    desired: Option<&Result<DesiredLink, Blocked>>,
) -> Action {
    match (running, desired) {
        (Some(_), None) => Action::Stop,
        (None, None) | (_, Some(Err(_))) => Action::Keep,
        (None, Some(Ok(d))) => Action::Start(d.clone()),
        (Some(r), Some(Ok(d))) if r.same_run(d) => Action::Keep,
        (Some(r), Some(Ok(d))) if r.same_view(d) => Action::Reconnect(d.clone()),
        (Some(_), Some(Ok(d))) => Action::Restart(d.clone()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use floodgate_link_crd::{RemoteSpec, SecretKeyRef};
    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    /// The credentials namespace.
    const NS: &str = "floodgate-credentials";

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: east\n  cluster:\n    server: https://east.example.com:6443\ncontexts:\n- name: east\n  context: {cluster: east, user: sa}\ncurrent-context: east\nusers:\n- name: sa\n  user: {token: remote}\n";

    fn mk_link(name: &str) -> Link {
        let mut link = Link::new(
            name,
            LinkSpec::with_remote(RemoteSpec {
                kubeconfig_secret: Some(SecretKeyRef {
                    name: format!("cluster-credentials-{name}-upstream"),
                    key: "kubeconfig".into(),
                }),
                ..RemoteSpec::default()
            }),
        );
        link.metadata.namespace = Some("floodgate".into());
        link.metadata.generation = Some(1);
        link
    }

    fn mk_secret(name: &str, key: &str, value: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("floodgate".into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                key.to_owned(),
                ByteString(value.as_bytes().to_vec()),
            )])),
            ..Secret::default()
        }
    }

    fn creds() -> Secret {
        mk_secret(
            "cluster-credentials-east-upstream",
            "kubeconfig",
            KUBECONFIG,
        )
    }

    fn token() -> Secret {
        mk_secret("floodgate-token-east", "token", "t0ken\n")
    }

    #[test]
    fn a_link_with_its_secrets_runs() {
        let d = desired(&mk_link("east"), NS, Some(&creds()), Some(&token())).expect("runs");
        assert_eq!(d.name, "east");
        assert_eq!(d.kubeconfig, KUBECONFIG);
        assert_eq!(d.token, "t0ken");
        assert_eq!(d.generation, Some(1));
        assert!(!format!("{d:?}").contains("t0ken"), "no secrets in Debug");
        assert_eq!(
            referenced_secrets(&mk_link("east")),
            ["floodgate-token-east", "cluster-credentials-east-upstream"]
        );
    }

    #[test]
    fn each_missing_piece_has_its_reason() {
        let link = mk_link("east");
        let reason = |r: Result<DesiredLink, Blocked>| r.expect_err("blocked").reason;
        assert_eq!(
            reason(desired(&link, NS, None, Some(&token()))),
            "SecretNotFound"
        );
        assert_eq!(
            reason(desired(&link, NS, Some(&creds()), None)),
            "TokenNotFound"
        );
        let wrong_key = mk_secret("cluster-credentials-east-upstream", "config", KUBECONFIG);
        assert_eq!(
            reason(desired(&link, NS, Some(&wrong_key), Some(&token()))),
            "SecretKeyNotFound"
        );
        let garbage = mk_secret(
            "cluster-credentials-east-upstream",
            "kubeconfig",
            "clusters: 7",
        );
        assert_eq!(
            reason(desired(&link, NS, Some(&garbage), Some(&token()))),
            "InvalidKubeconfig"
        );
        let empty_token = mk_secret("floodgate-token-east", "token", "  ");
        assert_eq!(
            reason(desired(&link, NS, Some(&creds()), Some(&empty_token))),
            "TokenNotFound"
        );
    }

    #[test]
    fn an_invalid_spec_is_blocked_with_every_problem() {
        let mut link = mk_link("east");
        link.spec.coalesce.quiet = "5s".parse().expect("duration");
        link.spec.remote.kubeconfig_path = Some("/etc/east".into());
        let b = desired(&link, NS, Some(&creds()), Some(&token())).expect_err("invalid");
        assert_eq!(b.reason, "InvalidSpec");
        assert!(b.is_spec_error());
        assert!(b.message.contains("spec.coalesce.quiet"), "{}", b.message);
        assert!(b.message.contains("spec.remote"), "{}", b.message);

        let mut path_only = mk_link("east");
        path_only.spec.remote = RemoteSpec {
            kubeconfig_path: Some("/etc/east".into()),
            ..RemoteSpec::default()
        };
        let b = desired(&path_only, NS, None, Some(&token())).expect_err("no path in a cluster");
        assert_eq!(b.reason, "KubeconfigPathInCluster");
    }

    #[test]
    fn plans_follow_the_link() {
        let link = mk_link("east");
        let d = desired(&link, NS, Some(&creds()), Some(&token()));
        let run = d.clone().expect("runs");
        assert_eq!(plan(None, Some(&d)), Action::Start(run.clone()));
        assert_eq!(plan(Some(&run), Some(&d)), Action::Keep);
        assert_eq!(plan(Some(&run), None), Action::Stop);
        assert_eq!(plan(None, None), Action::Keep);

        // A new generation with the same spec (a label edit) restarts nothing.
        let mut relabelled = run.clone();
        relabelled.generation = Some(2);
        assert_eq!(plan(Some(&run), Some(&Ok(relabelled))), Action::Keep);

        // New credentials reconnect the running link; a new spec restarts it.
        let rotated = desired(
            &link,
            NS,
            Some(&mk_secret(
                "cluster-credentials-east-upstream",
                "kubeconfig",
                &KUBECONFIG.replace("remote", "rotated"),
            )),
            Some(&token()),
        );
        assert!(matches!(
            plan(Some(&run), Some(&rotated)),
            Action::Reconnect(_)
        ));
        let mut edited = link.clone();
        edited.spec.caps.max_endpoints_per_service = 10;
        let edited = desired(&edited, NS, Some(&creds()), Some(&token()));
        assert!(matches!(
            plan(Some(&run), Some(&edited)),
            Action::Restart(_)
        ));

        // A broken edit keeps the last good run serving.
        let broken = desired(&link, NS, None, Some(&token()));
        assert_eq!(plan(Some(&run), Some(&broken)), Action::Keep);
        assert_eq!(plan(None, Some(&broken)), Action::Keep);
    }
}
