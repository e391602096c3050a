//! Cluster mode on the real server, RBAC on: the shipped manifests applied as they are, link
//! `east` whose remote is the same server, `floodgate controller` as the `floodgate`
//! ServiceAccount with a token from the TokenRequest API; and the same with a verb taken out of
//! its Role. The setup here is shared with [`super::replicas`].

use std::path::{Path, PathBuf};
use std::time::Instant;

use floodgate_e2e::cluster;
use floodgate_e2e::modes::Mode;
use floodgate_e2e::process::{Floodgate, Launch};
use floodgate_e2e::real::{self, RealKube};
use floodgate_e2e::sim;
use floodgate_link_crd::Link;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;

use super::{CALM, calm_services, resolver_whole, served_services, spec, write};

/// The shipped manifests (`kubectl kustomize manifests/`, then rewritten by `role`) applied to
/// the real server, the calm services, link `east`'s Secrets and its Link. Returns the
/// kubeconfig of the `floodgate` ServiceAccount the controller runs as.
pub(super) async fn shipped_cluster(kube: &RealKube, role: impl Fn(&str) -> String) -> PathBuf {
    let manifests = repo().join("manifests");
    let rendered = kube
        .kubectl(&["kustomize", &manifests.display().to_string()])
        .await
        .expect("kubectl kustomize manifests/");
    let file = write(kube.dir(), "manifests.yaml", &role(&rendered));
    kube.kubectl(&["apply", "-f", &file.display().to_string()])
        .await
        .expect("kubectl apply of the shipped manifests");
    installed(kube).await
}

/// The chart `charts/floodgate` installed with its default values as the README shows it
/// (`helm install floodgate charts/floodgate -n floodgate --create-namespace`), then the rest
/// as [`shipped_cluster`] does.
async fn helm_cluster(kube: &RealKube) -> PathBuf {
    let chart = repo().join("charts/floodgate");
    let out = real::helm_run(
        kube.kubeconfig_path(),
        &[
            "install",
            "floodgate",
            &chart.display().to_string(),
            "-n",
            cluster::NS,
            "--create-namespace",
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("helm install of the chart: {e:#}"));
    println!(
        "helm install: {}",
        out.lines().take(4).collect::<Vec<_>>().join(" / ")
    );
    installed(kube).await
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What follows an install: the Link CRD established, the calm services, link `east`'s Secrets
/// and its Link. Returns the kubeconfig of the `floodgate` ServiceAccount.
async fn installed(kube: &RealKube) -> PathBuf {
    kube.kubectl(&[
        "wait",
        "--for=condition=established",
        "crd/links.floodgate.dev",
        "--timeout=30s",
    ])
    .await
    .expect("the Link CRD established");
    calm_services(kube).await;
    link_secrets(kube).await;
    let links: Api<Link> = Api::namespaced(kube.client().await.expect("client"), cluster::NS);
    links
        .create(&PostParams::default(), &cluster::mk_link("east"))
        .await
        .expect("the Link");
    account_kubeconfig(kube, cluster::NS, "floodgate").await
}

/// Link `east`'s Secrets, as an operator creates them: its remote's kubeconfig (the real
/// server, as its admin) and its consumers' token. The only Secrets this lane writes.
async fn link_secrets(kube: &RealKube) {
    let client = kube.client().await.expect("client");
    let secrets: Api<Secret> = Api::namespaced(client, cluster::CREDENTIALS_NS);
    let remote = kube.kubeconfig().expect("kubeconfig");
    for secret in [
        cluster::mk_secret("east-credentials", "kubeconfig", &remote),
        cluster::mk_secret("floodgate-token-east", "token", &cluster::token("east")),
    ] {
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("secret");
    }
}

/// A kubeconfig for ServiceAccount `namespace/name` on the real server, with an hour's token
/// from the TokenRequest API (`kubectl create token`).
pub(super) async fn account_kubeconfig(kube: &RealKube, namespace: &str, name: &str) -> PathBuf {
    let token = kube
        .kubectl(&["create", "token", name, "-n", namespace, "--duration=1h"])
        .await
        .unwrap_or_else(|e| panic!("a token for ServiceAccount {namespace}/{name}: {e:#}"));
    write(
        kube.dir(),
        &format!("{namespace}-{name}.kubeconfig"),
        &sim::kubeconfig(&kube.url, token.trim(), Some(&kube.ca_pem), name),
    )
}

/// `floodgate controller` as replica `identity` of the cluster of `account` (a kubeconfig file),
/// its files under the server's directory in `identity/`, its admin API opened by
/// [`cluster::ADMIN_TOKEN`]. Not yet waited for.
pub(super) async fn replica(
    kube: &RealKube,
    account: &Path,
    identity: &str,
    peering: impl FnOnce(Launch) -> Launch,
) -> Floodgate {
    let launch = Launch::new(Mode::Controller, &kube.dir().join(identity))
        .cluster(account)
        .identity(identity)
        .link("east", &kube.kubeconfig().expect("kubeconfig"), spec())
        .admin_token(cluster::ADMIN_TOKEN);
    peering(launch).spawn().await.expect("floodgate controller")
}

/// [`shipped_cluster`], and one controller replica in it. Not yet waited for.
async fn controller_under_rbac(kube: &RealKube, role: impl Fn(&str) -> String) -> Floodgate {
    let account = shipped_cluster(kube, role).await;
    replica(kube, &account, "floodgate-0", |l| l).await
}

/// Link `east` as the cluster has it.
pub(super) async fn link_east(kube: &RealKube) -> Option<Link> {
    let links: Api<Link> = Api::namespaced(kube.client().await.ok()?, cluster::NS);
    links.get_opt("east").await.ok()?
}

/// The Link's status phase as the cluster has it.
pub(super) async fn link_phase(kube: &RealKube) -> Option<String> {
    link_east(kube)
        .await?
        .status?
        .phase
        .map(|p| format!("{p:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn cluster_mode_under_real_rbac_with_the_shipped_role() {
    let kube = RealKube::start().await.expect("the real API server");
    let fg = controller_under_rbac(&kube, str::to_owned).await;
    serves_under_rbac(&kube, fg).await;
}

/// The same installed with the Helm chart: the release's objects accepted by the real server,
/// and the chart's two replicas under its ServiceAccount and Role, both ready, one holding link
/// `east` and the other following it, each serving it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn cluster_mode_under_real_rbac_installed_with_the_helm_chart() {
    let kube = RealKube::start().await.expect("the real API server");
    let account = helm_cluster(&kube).await;
    let ([first, _second], holder) = super::replicas::two_replicas_as(&kube, &account).await;
    println!("helm chart: both replicas ready and serving link east, {holder} holding it");
    serves_under_rbac(&kube, first).await;
    let status = real::helm_run(
        kube.kubeconfig_path(),
        &["status", "floodgate", "-n", cluster::NS],
    )
    .await
    .expect("helm status");
    assert!(status.contains("STATUS: deployed"), "{status}");
}

/// The replica `fg` gets ready, serves the calm services, a resolver syncs through it, and the
/// Link's status is written under RBAC.
async fn serves_under_rbac(kube: &RealKube, mut fg: Floodgate) {
    fg.wait_ready(60).await.expect("the controller is ready");
    let started = Instant::now();
    floodgate_e2e::until(60, "link east serves the calm services", async || {
        served_services(&fg).await == Ok(CALM)
    })
    .await;
    println!(
        "cluster mode: link east served {:.1} s after ready",
        started.elapsed().as_secs_f64()
    );
    let (_resolver, r) = resolver_whole(kube, &fg, "through", 60).await;
    println!(
        "  resolver through the controller's facade synced in {} ms",
        r.sync_ms
    );
    let mut phase = None;
    floodgate_e2e::until(30, "the Link's status written under RBAC", async || {
        phase = link_phase(kube).await;
        phase.as_deref() == Some("Healthy")
    })
    .await;
    println!("  Link status phase: {phase:?}");
}

/// The same with `list` taken from the Role's rule on Secrets: the real server refuses the
/// controller's list of the link's credentials, the Link is blocked with reason
/// `SecretsUnreadable` and the server's answer, and the link never serves. The shipped Role is not generous by accident.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real API server: make test-real"]
async fn cluster_mode_fails_without_a_verb_the_controller_needs() {
    let kube = RealKube::start().await.expect("the real API server");
    let rule = "  - secrets\n  verbs:\n  - list\n  - watch\n";
    let fg = controller_under_rbac(&kube, |yaml| {
        assert!(
            yaml.contains(rule),
            "the shipped Role's rule on Secrets: {yaml}"
        );
        yaml.replace(rule, "  - secrets\n  verbs:\n  - watch\n")
    })
    .await;
    // The proof that it tried and was refused: the Link's Ready condition, with the server's
    // 403 in its message.
    let mut ready = None;
    floodgate_e2e::until(
        60,
        "the Link blocked on its unreadable Secrets",
        async || {
            ready = link_east(&kube).await.and_then(|l| {
                let s = l.status?;
                s.conditions.into_iter().find(|c| c.type_ == "Ready")
            });
            ready
                .as_ref()
                .is_some_and(|c| c.reason == "SecretsUnreadable")
        },
    )
    .await;
    let ready = ready.expect("the Ready condition");
    println!(
        "  Ready: {} {}: {}",
        ready.status, ready.reason, ready.message
    );
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains("floodgate-credentials") && ready.message.contains("forbidden"),
        "the condition says where and why: {}",
        ready.message
    );
    let served = served_services(&fg).await;
    println!("  link east through the facade: {served:?}");
    assert!(
        served.as_ref().is_err_and(|e| e.contains("404")),
        "the facade knows no link east: {served:?}"
    );
    println!("  /readyz: {:?}", fg.readyz().await);
}
