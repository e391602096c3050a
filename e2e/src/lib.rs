//! Floodgate's end-to-end home: the remote-cluster simulator (kube-sim), churn drivers that replay
//! the incidents, scenario tests, side-by-side benchmarks and the demo.
//!
//! Today it holds the demo, which replays the discovery-flood incident through the churn engine
//! in-process; kube-sim and the network scenarios build on the Kubernetes facade.

#![forbid(unsafe_code)]
