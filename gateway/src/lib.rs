//! Floodgate: a per-link gateway between a remote Kubernetes cluster's API server and the local
//! consumers of that API (Linkerd's service mirror and destination controllers, or any informer).
//!
//! See `ARCHITECTURE.md` for the tasks, ports and data flow. Modules:
//! - [`cli`]: the command line and its commands.

#![forbid(unsafe_code)]

pub mod cli;
