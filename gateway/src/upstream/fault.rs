//! The watcher errors kube-rs alone does not recover from, and the ones it does: what a
//! watcher's error says about the remote, and whether Floodgate must force a relist
//! ([`needs_relist`]).

use kube::runtime::watcher;

/// True when a watcher failed on a body it could not decode.
pub(super) fn is_decode_error(e: &watcher::Error) -> bool {
    matches!(
        e,
        watcher::Error::InitialListFailed(kube::Error::SerdeError(_))
            | watcher::Error::WatchStartFailed(kube::Error::SerdeError(_))
            | watcher::Error::WatchFailed(kube::Error::SerdeError(_))
    ) || is_undecodable_frame(e)
}

/// True for a watch frame that was JSON but no watch event: kube-rs then tries to read the line
/// as a `Status`, which any JSON object is (every field has a default), and reports an API
/// error without a code.
fn is_undecodable_frame(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchFailed(kube::Error::Api(s)) if s.code == 0)
}

/// The first and the longest wait before a relist Floodgate forces ([`needs_relist`]), so a
/// remote that keeps sending broken frames costs it a list every 30 s at most.
pub(super) const FORCED_RELIST_BACKOFF: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(30),
);

/// True when a watcher error leaves kube-rs unable to recover by itself, so the watcher must
/// start over from a fresh list:
/// - a watch frame that could not be decoded (not JSON, or JSON but no watch event): kube-rs
///   skips it and reads on, so the change it carried would be lost until the object changes
///   again;
/// - a resume the remote refused at the HTTP level with 504 (`ResourceVersionTooLarge`: its
///   versions went backwards, as after an etcd restore) or 410: kube-rs retries the same
///   version forever, and only relists on an in-stream 410.
pub fn needs_relist(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchFailed(kube::Error::SerdeError(_)) => true,
        e if is_undecodable_frame(e) => true,
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 504 || s.code == 410,
        _ => false,
    }
}

/// Whether a watcher's request broke on its connection with no answer from the remote (the
/// connection refused, reset or closed under it): the remote may be gone, or only that
/// connection ([`super::health::Health::suspect`]).
pub fn is_transport(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => {
            matches!(e, kube::Error::HyperError(_) | kube::Error::Service(_))
        }
        _ => false,
    }
}

/// The remote's answer when it refused our credentials (401 Unauthorized: an expired or
/// revoked token; 403 Forbidden: RBAC that no longer lets us read), from a request or a watch.
pub fn refusal(e: &kube::Error) -> Option<&kube::core::Status> {
    match e {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => Some(s),
        _ => None,
    }
}

/// [`refusal`] of a watcher's error.
pub fn watch_refusal(e: &watcher::Error) -> Option<&kube::core::Status> {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => refusal(e),
        watcher::Error::WatchError(s) if s.code == 401 || s.code == 403 => Some(s),
        _ => None,
    }
}

/// What a refusal says, for the link's message: which refusal, and the remote's words.
pub fn refused(s: &kube::core::Status, doing: &str) -> String {
    format!(
        "the remote refuses our credentials ({} {}) {doing}: {}",
        s.code, s.reason, s.message
    )
}

/// True for a watch the remote ended with 410 Gone (its history moved past the resume point):
/// the remote answered, so it is no sign of an outage, and kube-rs's watcher relists by itself.
pub fn is_expired(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(s) if s.code == 410)
}
