//! Links that start together reach their remotes in turn: one process-wide token bucket
//! (`governor`) that every attempt to reach a remote passes through, the first dial and every
//! retry alike. A hub of many links that starts, or that gets its remotes back after an outage
//! of its own network, would otherwise list every remote in the same instant: the herd of
//! relists of incident 1. A few links start at once (half a second's worth: a gateway of three
//! links does not wait), the rest at the rate.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::Connect;

/// The default of `--link-starts-per-second`.
pub const DEFAULT_LINK_STARTS_PER_SECOND: u32 = 20;

/// The process's pace of attempts to reach a remote.
#[derive(Clone, Debug, Default)]
pub struct Pacer(Option<Arc<Paced>>);

#[derive(Debug)]
struct Paced {
    limiter: DefaultDirectRateLimiter,
    /// Attempts that had to wait for their turn.
    waited: AtomicU64,
}

impl Pacer {
    /// At most `per_second` attempts a second, `per_second / 2` (at least one) of them at once;
    /// 0 does not pace.
    pub fn new(per_second: u32) -> Self {
        let Some(rate) = NonZeroU32::new(per_second) else {
            return Self(None);
        };
        let burst = NonZeroU32::new(per_second / 2).unwrap_or(NonZeroU32::MIN);
        Self(Some(Arc::new(Paced {
            limiter: RateLimiter::direct(Quota::per_second(rate).allow_burst(burst)),
            waited: AtomicU64::new(0),
        })))
    }

    /// `connect`, waiting first for its turn.
    pub fn pace(&self, connect: Connect) -> Connect {
        let Some(paced) = self.0.clone() else {
            return connect;
        };
        Arc::new(move || {
            let (paced, connect) = (paced.clone(), connect.clone());
            Box::pin(async move {
                if paced.limiter.check().is_err() {
                    paced.waited.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("waiting for this link's turn to reach its remote");
                    paced.limiter.until_ready().await;
                }
                connect().await
            })
        })
    }

    /// Attempts so far that waited for their turn.
    pub fn waited(&self) -> u64 {
        self.0
            .as_ref()
            .map_or(0, |p| p.waited.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;

    /// A connect that notes when it was called and fails (no client is needed to see the pace).
    fn noting(calls: Arc<Mutex<Vec<Instant>>>) -> Connect {
        Arc::new(move || {
            let calls = calls.clone();
            Box::pin(async move {
                calls.lock().expect("calls").push(Instant::now());
                anyhow::bail!("not a remote")
            })
        })
    }

    #[tokio::test]
    async fn twelve_links_at_ten_a_second_start_five_at_once_and_the_rest_in_turn() {
        let pacer = Pacer::new(10);
        let calls = Arc::new(Mutex::new(Vec::new()));
        let began = Instant::now();
        let attempts = (0..12).map(|_| {
            let connect = pacer.pace(noting(calls.clone()));
            tokio::spawn(async move { connect().await })
        });
        for a in attempts.collect::<Vec<_>>() {
            assert!(a.await.expect("attempt").is_err());
        }
        let mut at: Vec<Duration> = calls
            .lock()
            .expect("calls")
            .iter()
            .map(|t| *t - began)
            .collect();
        at.sort();
        assert_eq!(at.len(), 12);
        // The burst (5) goes at once; the other 7 wait their turn, a tenth of a second apart,
        // so the last goes no sooner than 0.7 s after the first (a slow machine only spreads
        // them more).
        assert_eq!(pacer.waited(), 7);
        assert!(
            at[11] - at[0] >= Duration::from_millis(650),
            "12 attempts at 10/s spread over {:?}",
            at[11] - at[0]
        );
    }

    #[tokio::test]
    async fn zero_does_not_pace() {
        let pacer = Pacer::new(0);
        let calls = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..50 {
            let _ = pacer.pace(noting(calls.clone()))().await;
        }
        assert_eq!(calls.lock().expect("calls").len(), 50);
        assert_eq!(pacer.waited(), 0);
    }
}
