//! The real-server lane (`make test-real`): Floodgate in front of a real kube-apiserver 1.32 and
//! etcd built from Go modules (`e2e/realkube/`), with client-go consumers and a driver that plays
//! the remote's controllers. Every test is ignored by `make test` (it needs the Go binaries);
//! `make test-real` runs them with `--run-ignored only -E 'binary(real)'`. One module a scenario:
//!
//! - [`drop_in`]: kubectl, the Python client and client-go informers in all four modes through
//!   Floodgate;
//! - [`s1`]: 10,000 crash-looping pods behind one exported service, the resolver direct and
//!   through Floodgate side by side, reported in `make bench`'s S1 rows; a cold start during it;
//! - [`order`]: a scale-up one pod at a time, resolved at the slice event direct and through;
//! - [`s1_rate`]: 15,000 crash-looping pods under `endpointsPerService`, contained by their rate;
//! - [`outage`]: the API server SIGKILLed and restarted against the same etcd, and sent
//!   SIGTERM (it stops listening, keeps its watches silent, exits a minute later);
//! - [`balancer`]: two API servers on one etcd behind a TCP balancer, one of them sent SIGTERM
//!   and restarted (its watches resume on the other; consumers see every change, no 410 and
//!   no relist);
//! - [`refusal`]: the link's ClusterRoleBinding deleted on the remote, then put back;
//! - [`removal`]: three of five exported services deleted at once (a link-wide removal);
//! - [`controller`]: the shipped manifests applied under real RBAC, `floodgate controller` as its
//!   ServiceAccount; the same with a verb it needs taken out of its Role;
//! - [`linkerd_check`]: `linkerd multicluster check`'s requests against a wrapped link, under
//!   Linkerd's remote-access RBAC: `/version`, the access reviews, the trust anchors of
//!   `linkerd-config` as the remote's, and their rotation;
//! - [`replicas`]: two controller replicas: a command through the one without the Lease, a
//!   command set with kubectl by an operator bound to the shipped `floodgate-operator` Role, and
//!   the holder SIGKILLed.
//!
//! Guarantees 7 and 8 are asserted here against the real server: a contained service is served
//! whole (no ready endpoint without its pod, in the resolver's cache), and the link is
//! `Degraded` within 10 s of the outage.

mod balancer;
mod controller;
mod drop_in;
mod linkerd_check;
mod order;
mod outage;
mod refusal;
mod removal;
mod replicas;
mod s1;
mod s1_rate;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use floodgate_e2e::process::Floodgate;
use floodgate_e2e::real::{Crashloop, RealKube, Resolver, ResolverMode, ResolverReport};
use floodgate_link_crd::{LinkSpec, RemoteSpec};
use k8s_openapi::api::core::v1::Service;
use kube::Api;

/// The calm services the driver creates (namespace `calm`, 3 pods each).
const CALM: usize = 3;

fn is_calm(service: &str) -> bool {
    service.starts_with("calm/")
}

/// Ready endpoints of the calm services in a report.
fn calm_ready(r: &ResolverReport) -> u64 {
    r.ready_by_service
        .iter()
        .filter(|(s, _)| is_calm(s))
        .map(|(_, n)| n)
        .sum()
}

/// The calm services whole in `r`: every one of their 3 pods ready, none without its pod.
fn calm_whole(r: &ResolverReport) -> bool {
    r.synced && calm_ready(r) == (CALM * 3) as u64 && r.without_pod_where(is_calm) == 0
}

fn spec() -> LinkSpec {
    LinkSpec::with_remote(RemoteSpec::default())
}

/// Creates the calm services and exits.
async fn calm_services(kube: &RealKube) -> serde_json::Value {
    Crashloop::setup(
        kube.kubeconfig_path(),
        &["--calm-services", &CALM.to_string()],
        kube.dir(),
        60,
    )
    .await
    .expect("the driver creates the calm services")
}

/// Floodgate (`floodgate run`) with link `east` in front of `kube`, its files under `dir`.
async fn floodgate_in(kube: &RealKube, dir: &str, spec: LinkSpec) -> Floodgate {
    let admin = kube.kubeconfig().expect("kubeconfig");
    floodgate_with(kube, dir, &admin, spec).await
}

/// [`floodgate_in`] reading the remote with `kubeconfig` (YAML).
async fn floodgate_with(kube: &RealKube, dir: &str, kubeconfig: &str, spec: LinkSpec) -> Floodgate {
    Floodgate::start(&kube.dir().join(dir), "east", kubeconfig, spec)
        .await
        .expect("floodgate starts and is ready")
}

/// [`floodgate_in`] `floodgate/`.
async fn floodgate(kube: &RealKube, spec: LinkSpec) -> Floodgate {
    floodgate_in(kube, "floodgate", spec).await
}

/// A resolver as Linkerd's destination runs it (protobuf, streaming lists) on the API of
/// `kubeconfig` (YAML), its files in `kube`'s directory under `name`.
fn resolver(kube: &RealKube, kubeconfig: &str, name: &str) -> Resolver {
    Resolver::start(kubeconfig, ResolverMode::new(true, true), kube.dir(), name)
        .unwrap_or_else(|e| panic!("resolver {name}: {e:#}"))
}

/// A resolver straight on the real server, as its admin.
fn resolver_direct(kube: &RealKube, name: &str) -> Resolver {
    resolver(kube, &kube.kubeconfig().expect("kubeconfig"), name)
}

/// A resolver through `fg`'s facade, as a consumer of its first link.
fn resolver_through(kube: &RealKube, fg: &Floodgate, name: &str) -> Resolver {
    let config = fg.consumer_kubeconfig().expect("consumer kubeconfig");
    resolver(kube, &config, name)
}

/// Waits up to `secs` until the calm services are whole in `r`; returns that report.
async fn whole(r: &mut Resolver, secs: u64) -> ResolverReport {
    r.wait_for(secs, "the calm services whole", calm_whole)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// A resolver through `fg`, once the calm services are whole in it (within `secs`).
async fn resolver_whole(
    kube: &RealKube,
    fg: &Floodgate,
    name: &str,
    secs: u64,
) -> (Resolver, ResolverReport) {
    let mut r = resolver_through(kube, fg, name);
    let report = whole(&mut r, secs).await;
    (r, report)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

/// Names in `kubectl get ... -o name` output.
fn names(out: &str) -> BTreeSet<String> {
    out.lines().map(str::to_owned).collect()
}

/// The services a consumer of `fg`'s first link lists (`Err`: what the facade answered).
async fn served_services(fg: &Floodgate) -> Result<usize, String> {
    let client = fg.consumer().await.map_err(|e| format!("{e:#}"))?;
    let api: Api<Service> = Api::all(client);
    api.list(&Default::default())
        .await
        .map(|l| l.items.len())
        .map_err(|e| e.to_string())
}

/// The WARN lines `fg` logged after the first `from` bytes of its log, as the binary's default
/// filter (`info,kube_client=error`) keeps them: the harness runs it at `info`, which also
/// shows kube-client's line per watch retry.
fn warns_since(fg: &Floodgate, from: usize) -> Vec<String> {
    let text = fg.log_text();
    (text.get(from..).unwrap_or_default().lines())
        .filter(|l| l.contains(" WARN ") && !l.contains(" kube_client"))
        .map(str::to_owned)
        .collect()
}
