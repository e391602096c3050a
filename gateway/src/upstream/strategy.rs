//! How each watcher takes its initial list: a streaming list (`sendInitialEvents=true`, served
//! by Kubernetes 1.32 and later, and by kube-sim unless told otherwise), so no list arrives as
//! one body, or paged lists where the remote refuses that.
//!
//! A remote that does not serve streaming lists refuses the watch that asks for one with a 4xx
//! `Status` before any event: an API server with the `WatchList` feature off answers 422
//! Invalid (`sendInitialEvents is forbidden for watch unless the WatchList feature gate is
//! enabled`), older ones refuse `resourceVersionMatch` on a watch the same way. A watcher whose
//! streaming list is refused so falls back to paged lists for the life of its upstream, and
//! says so once (a log line and [`super::UpstreamCounters::list_strategy`]). 401, 403, 404, 410
//! and 429 say something else (credentials, a missing resource, an expired version, load) and
//! are retried as they are; this is what client-go's reflector does too, minus its fallback on
//! every other error.

use std::sync::atomic::{AtomicU8, Ordering};

use kube::runtime::watcher;

/// How a watcher lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListStrategy {
    /// Not chosen yet (the watcher has not started).
    Unknown,
    /// A watch with `sendInitialEvents=true`, ended by the `k8s.io/initial-events-end` bookmark.
    Streaming,
    /// LIST pages, then a WATCH from the list's version.
    Paged,
}

impl ListStrategy {
    /// Its name, for logs, metrics and the link's state.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Streaming => "streaming",
            Self::Paged => "paged",
        }
    }

    pub(super) fn load(a: &AtomicU8) -> Self {
        match a.load(Ordering::Relaxed) {
            1 => Self::Streaming,
            2 => Self::Paged,
            _ => Self::Unknown,
        }
    }

    pub(super) fn store(self, a: &AtomicU8) {
        let v = match self {
            Self::Unknown => 0,
            Self::Streaming => 1,
            Self::Paged => 2,
        };
        a.store(v, Ordering::Relaxed);
    }

    /// The watcher configuration for this strategy.
    pub(super) fn config(self, base: watcher::Config) -> watcher::Config {
        match self {
            Self::Streaming => base.streaming_lists(),
            Self::Unknown | Self::Paged => base,
        }
    }
}

/// True when `e` is a remote refusing a streaming list (see the module docs).
pub fn refuses_streaming(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => {
            (400..500).contains(&s.code) && ![401, 403, 404, 410, 429].contains(&s.code)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start_failed(code: u16) -> watcher::Error {
        watcher::Error::WatchStartFailed(kube::Error::Api(
            kube::core::Status::failure("refused", "Invalid")
                .with_code(code)
                .boxed(),
        ))
    }

    #[test]
    fn only_a_refusal_of_the_request_itself_falls_back() {
        assert!(refuses_streaming(&start_failed(422)));
        assert!(refuses_streaming(&start_failed(400)));
        for code in [401, 403, 404, 410, 429, 500, 503] {
            assert!(!refuses_streaming(&start_failed(code)), "{code}");
        }
    }
}
