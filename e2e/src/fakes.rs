//! What stands in for the clusters Floodgate sits between, and for the network between them.
//!
//! | module | what it is |
//! | --- | --- |
//! | [`sim`] | kube-sim, the remote: Floodgate's own facade over a writable store |
//! | [`drivers`] | what makes kube-sim behave like a cluster: Services, Deployments, crash loops, the EndpointSlice and Endpoints controllers, in a real cluster's order |
//! | [`local`] | the local cluster `floodgate controller` runs in: a small in-memory API server for the kinds it reads and writes |
//! | [`real`] | a real etcd and kube-apiserver built from Go modules, and the Go programs the real-server lane drives |
//! | [`chaos`] | a fault-injecting HTTP proxy between a link and its remote |
//! | [`relay`] | a TCP relay between a follower and its Lease holder, cut on demand |

pub mod chaos;
pub mod drivers;
pub mod local;
pub mod real;
pub mod relay;
pub mod sim;
