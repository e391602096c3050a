//! What runs Floodgate for a test, and talks to it as its users and operators do.
//!
//! | module | what it is |
//! | --- | --- |
//! | [`gateway`] | `floodgate run` in-process in front of a kube-sim ([`gateway::Stack`]), and consumers of a link |
//! | [`cluster`] | `floodgate controller` in-process against a [`crate::local`] cluster, Links and their Secrets |
//! | [`replicas`] | controller replicas as processes (one can be SIGKILLed) sharing links through Leases |
//! | [`modes`] | either mode behind one shape, so a scenario runs against both |
//! | [`process`] | Floodgate and its consumers as processes, measured from outside (`/proc`) |
//! | [`admin`] | a client of the admin API |
//! | [`logs`] | the logs, captured so a test can assert what was said |
//! | [`rbac`] | what the shipped manifests let a ServiceAccount do, judged as RBAC judges it |

pub mod admin;
pub mod cluster;
pub mod gateway;
pub mod logs;
pub mod modes;
pub mod process;
pub mod rbac;
pub mod replicas;
