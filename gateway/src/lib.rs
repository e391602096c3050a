//! Floodgate: a per-link gateway between a remote Kubernetes cluster's API server and the local
//! consumers of that API (Linkerd's service mirror and destination controllers, or any informer).
//!
//! See `ARCHITECTURE.md` for the tasks, ports and data flow. Modules:
//! - [`churn`]: the pure engine of one link: coalesce, rate-limit, cap, detect floods, quarantine.
//! - [`view`]: the published, versioned store consumers read, with history and fan-out.
//! - [`upstream`]: the link's watchers on its remote API server.
//! - [`link`]: one supervised task per link: upstream, engine, state.
//! - [`persist`]: quarantine that survives restarts (state and last good view on disk).
//! - [`kubeapi`]: the Kubernetes list/watch facade consumers talk to.
//! - [`grpc`]: `floodgate.v1` endpoint snapshots, link listing and gRPC health.
//! - [`auth`]: bearer tokens, read and compared once for every listener.
//! - [`admin`]: the admin API: links, release and quarantine, config, the status page.
//! - [`metrics`]: Prometheus metrics per link, computed at scrape time.
//! - [`model`]: the object model every layer shares: `Object`, `Kind`, `NsName`, the annotations.
//! - [`registry`]: the links a process serves, which every listener reads.
//! - [`server`]: the facade, gRPC, admin API and health over the registry, for both modes.
//! - [`serving`]: the serving flags and the start-up both modes share.
//! - [`credentials`]: link tokens, TLS material, kubeconfigs and the state directory.
//! - [`command`]: operators' commands (release, quarantine) and their one path to a link.
//! - [`run`]: `floodgate run`: the links of a links file.
//! - [`tls`]: certificates (read or generated) for the facade's listener.
//! - [`cli`]: the command line and its commands.
//! - [`controller`]: `floodgate controller`: links from Link resources, status, Leases.
//! - [`wrap`]: `floodgate wrap`: adopt a Linkerd link's credentials.

#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod churn;
pub mod cli;
pub mod command;
pub mod controller;
pub mod credentials;
pub mod grpc;
pub mod kubeapi;
pub mod link;
pub mod metrics;
pub mod model;
pub mod persist;
pub mod protobuf;
pub mod registry;
pub mod run;
pub mod server;
pub mod serving;
pub mod tls;
pub mod upstream;
pub mod view;
pub mod wrap;
