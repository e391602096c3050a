//! A simulated pod as the kubelet reports it (`pods/status`), and the shapes a flood of them
//! takes.
//!
//! A pod is Ready (container running, `Ready`/`ContainersReady` conditions `True`), or not:
//! either crashed and waiting to restart (`state.waiting.reason: CrashLoopBackOff`, the last
//! run in `lastState.terminated`, `Ready`/`ContainersReady` `False`), or, never having
//! restarted, running but not passing its readiness probe. Each transition time is kept in the
//! model, so rendering a pod that did not change writes the same object again.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// How the pods of a flood behave once they exist.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FloodShape {
    /// A real crash loop: pods start and turn Ready, the EndpointSlice controller names them
    /// ready, then they crash (CrashLoopBackOff, restart count growing) and come back Ready in
    /// turn, `ready_share` of them Ready at any moment (0.0 to 1.0).
    CrashLoop {
        /// The share of the pods Ready at any moment once the loop runs.
        ready_share: f64,
    },
    /// kube-sim's first flood: pods are created not Ready (named not ready by their slices from
    /// the start), then each flip toggles the next pod in turn between Ready and crashed, so
    /// the share ready sweeps between none and all.
    NeverReady,
}

impl Default for FloodShape {
    /// The crash loop of issue 32's replay: two pods in three Ready at any moment.
    fn default() -> Self {
        Self::CrashLoop {
            ready_share: 2.0 / 3.0,
        }
    }
}

impl FloodShape {
    /// Whether the flood's pods are created Ready.
    pub fn starts_ready(self) -> bool {
        matches!(self, Self::CrashLoop { .. })
    }
}

impl std::str::FromStr for FloodShape {
    type Err = String;

    /// `crash-loop` (two in three Ready), `crash-loop:SHARE` (SHARE from 0 to 1 Ready), or
    /// `never-ready`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            None if s == "crash-loop" => Ok(Self::default()),
            None if s == "never-ready" => Ok(Self::NeverReady),
            Some(("crash-loop", share)) => match share.parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => Ok(Self::CrashLoop { ready_share: r }),
                _ => Err(format!(
                    "a ready share is a number from 0 to 1, not {share:?}"
                )),
            },
            _ => Err(format!(
                "a flood shape is crash-loop, crash-loop:SHARE or never-ready, not {s:?}"
            )),
        }
    }
}

impl std::fmt::Display for FloodShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::CrashLoop { ready_share } => {
                write!(f, "crash loop, {:.0}% ready", ready_share * 100.0)
            }
            Self::NeverReady => f.write_str("never-ready"),
        }
    }
}

/// One pod of a simulated Deployment.
#[derive(Clone, Debug)]
pub(super) struct PodModel {
    pub index: u32,
    pub ip: String,
    pub ready: bool,
    pub restarts: i32,
    /// When its container last started (Ready) or crashed (not Ready).
    pub since: Time,
    /// Its ReplicaSet's revision: 0 for the service's first, one more for each rolling update
    /// that replaced its predecessor.
    pub revision: u32,
}

impl PodModel {
    pub fn new(index: u32, ip: String, ready: bool) -> Self {
        Self {
            index,
            ip,
            ready,
            restarts: 0,
            since: now(),
            revision: 0,
        }
    }

    /// The container crashes: not Ready, CrashLoopBackOff, one restart more.
    pub fn crash(&mut self) {
        self.ready = false;
        self.restarts += 1;
        self.since = now();
    }

    /// The container is restarted and passes its readiness probe.
    pub fn recover(&mut self) {
        self.ready = true;
        self.since = now();
    }

    /// The status the kubelet writes for it.
    pub fn status(&self, pod_name: &str) -> PodStatus {
        let cond = |type_: &str, ok: bool| PodCondition {
            type_: type_.into(),
            status: if ok { "True" } else { "False" }.into(),
            last_transition_time: Some(self.since.clone()),
            reason: (!ok).then(|| "ContainersNotReady".into()),
            message: (!ok).then(|| "containers with unready status: [app]".into()),
            ..Default::default()
        };
        let crashed = !self.ready && self.restarts > 0;
        let state = if crashed {
            ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("CrashLoopBackOff".into()),
                    message: Some(format!(
                        "back-off 10s restarting failed container=app pod={pod_name}"
                    )),
                }),
                ..Default::default()
            }
        } else {
            ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(self.since.clone()),
                }),
                ..Default::default()
            }
        };
        let last_state = (self.restarts > 0).then(|| ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 1,
                reason: Some("Error".into()),
                finished_at: Some(self.since.clone()),
                ..Default::default()
            }),
            ..Default::default()
        });
        PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(self.ip.clone()),
            // The kubelet's conditions; the EndpointSlice controller follows `Ready`.
            conditions: Some(vec![
                PodCondition {
                    type_: "PodScheduled".into(),
                    status: "True".into(),
                    ..Default::default()
                },
                PodCondition {
                    type_: "Initialized".into(),
                    status: "True".into(),
                    ..Default::default()
                },
                cond("ContainersReady", self.ready),
                cond("Ready", self.ready),
            ]),
            container_statuses: Some(vec![ContainerStatus {
                name: "app".into(),
                ready: self.ready,
                started: Some(!crashed),
                restart_count: self.restarts,
                image: "app:1".into(),
                image_id: String::new(),
                state: Some(state),
                last_state,
                ..Default::default()
            }]),
            ..Default::default()
        }
    }
}

fn now() -> Time {
    Time(jiff::Timestamp::now())
}

/// Which pods one step of a [`FloodShape::CrashLoop`] changes: `count` transitions, each
/// crashing the next Ready pod after `cursors.0` or bringing back the next crashed one after
/// `cursors.1`, so that the share Ready moves to `ready_share` of the pods and then stays
/// within one pod of it (crashes and recoveries alternate). Returns the indices changed.
pub(super) fn crash_loop(
    pods: &mut [PodModel],
    ready_share: f64,
    count: usize,
    cursors: &mut (usize, usize),
) -> Vec<usize> {
    let n = pods.len();
    if n == 0 {
        return Vec::new();
    }
    let target = ((n as f64) * ready_share.clamp(0.0, 1.0)).round() as usize;
    let mut ready = pods.iter().filter(|p| p.ready).count();
    let mut changed = Vec::with_capacity(count);
    let mut crash_next = true;
    for _ in 0..count {
        let crash = match ready.cmp(&target) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => crash_next,
        };
        let (cursor, want_ready) = if crash {
            (&mut cursors.0, true)
        } else {
            (&mut cursors.1, false)
        };
        let Some(i) = (0..n)
            .map(|k| (*cursor + k) % n)
            .find(|&i| pods[i].ready == want_ready)
        else {
            break;
        };
        *cursor = (i + 1) % n;
        if crash {
            pods[i].crash();
            ready -= 1;
        } else {
            pods[i].recover();
            ready += 1;
        }
        crash_next = !crash;
        changed.push(i);
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_pods(n: usize, ready: bool) -> Vec<PodModel> {
        (0..n)
            .map(|i| PodModel::new(i as u32, format!("10.0.0.{i}"), ready))
            .collect()
    }

    /// From all Ready, the loop crashes pods until two in three are Ready, then holds the
    /// share while every pod takes its turn at crashing and coming back.
    #[test]
    fn the_crash_loop_reaches_its_share_and_keeps_it() {
        let mut pods = mk_pods(300, true);
        let mut cursors = (0, 0);
        let changed = crash_loop(&mut pods, 2.0 / 3.0, 100, &mut cursors);
        assert_eq!(changed.len(), 100);
        assert_eq!(pods.iter().filter(|p| p.ready).count(), 200);
        for _ in 0..20 {
            crash_loop(&mut pods, 2.0 / 3.0, 50, &mut cursors);
            let ready = pods.iter().filter(|p| p.ready).count();
            assert!((199..=201).contains(&ready), "{ready} ready");
        }
        assert!(
            pods.iter().all(|p| p.restarts >= 1),
            "every pod crashed once"
        );
    }

    #[test]
    fn shapes_parse_from_their_names() {
        assert_eq!("crash-loop".parse(), Ok(FloodShape::default()));
        assert_eq!(
            "crash-loop:0.5".parse(),
            Ok(FloodShape::CrashLoop { ready_share: 0.5 })
        );
        assert_eq!("never-ready".parse(), Ok(FloodShape::NeverReady));
        assert!("crash-loop:2".parse::<FloodShape>().is_err());
        assert!("flood".parse::<FloodShape>().is_err());
    }

    #[test]
    fn a_crashed_pod_shows_crash_loop_back_off_and_a_ready_one_runs() {
        let mut pod = PodModel::new(0, "10.0.0.1".into(), true);
        pod.crash();
        let s = pod.status("web-0");
        let c = &s.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(c.restart_count, 1);
        assert!(!c.ready);
        let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
        assert_eq!(
            waiting.and_then(|w| w.reason.as_deref()),
            Some("CrashLoopBackOff")
        );
        let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        assert_eq!(last.map(|t| t.exit_code), Some(1));
        let ready = |s: &PodStatus| {
            s.conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.status.clone())
        };
        assert_eq!(ready(&s).as_deref(), Some("False"));
        pod.recover();
        let s = pod.status("web-0");
        let c = &s.container_statuses.as_ref().expect("statuses")[0];
        assert!(c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()));
        assert_eq!(c.restart_count, 1);
        assert_eq!(ready(&s).as_deref(), Some("True"));
    }
}
