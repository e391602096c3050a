//! The scenarios the demo, `make bench` and the scenario tests run, the consumers that judge
//! them, and the rows they report.
//!
//! | module | what it is |
//! | --- | --- |
//! | [`flood`] | incident 2 replayed side by side: kube-sim floods, two consumers watch, one direct and one through Floodgate (the demo, S1) |
//! | [`herd`] | S2, the restart herd of incident 1 |
//! | [`cold`] | cold starts against a large remote |
//! | [`hub`] | a hub of many links in one `floodgate run` |
//! | [`resolve`] | consumers that resolve endpoints to pods as Linkerd's destination does, settled and at each event |
//! | [`shapes`] | the shapes a real cluster's controllers make (scale-up, burst, scale-down, rolling update), judged at the event direct and through Floodgate |
//! | [`report`] | the rows side-by-side runs report, each figure beside the design's target |

pub mod cold;
pub mod flood;
pub mod herd;
pub mod hub;
pub mod report;
pub mod resolve;
pub mod shapes;
