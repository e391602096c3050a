//! Token buckets on publications: one GCRA bucket for the link, one per service (`governor`).
//!
//! The limiters are generic over `governor::Clock`. The engine runs them on a [`FedClock`], whose
//! time is whatever the engine was last told (`tokio::time::Instant`s from its caller), so the
//! engine stays free of wall-clock reads and tests drive it with paused time; unit tests here use
//! governor's `FakeRelativeClock`.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use floodgate_link_crd::Bucket;
use governor::clock::{Clock, Reference};
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

/// A direct (unkeyed) GCRA limiter on clock `C`.
pub type Limiter<C> =
    RateLimiter<NotKeyed, InMemoryState, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// A clock that reads the time it was last set to: nanoseconds since the engine's origin.
#[derive(Clone, Debug, Default)]
pub struct FedClock {
    nanos: Arc<AtomicU64>,
}

impl FedClock {
    /// Moves the clock to `since_origin`. Time never goes backwards: an earlier value is ignored.
    pub fn set(&self, since_origin: Duration) {
        let n = u64::try_from(since_origin.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_max(n, Ordering::Relaxed);
    }
}

impl Clock for FedClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::from(self.nanos.load(Ordering::Relaxed))
    }
}

/// The quota of a bucket from the spec.
pub fn quota(b: &Bucket) -> Quota {
    let rate = NonZeroU32::new(b.updates_per_second).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(b.burst).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(rate).allow_burst(burst)
}

/// The link's budget: its own bucket and the quota each service's bucket gets.
#[derive(Debug)]
pub struct Budget<C: Clock> {
    link: Limiter<C>,
    per_service: Quota,
    clock: C,
}

impl<C: Clock + Clone> Budget<C> {
    /// A budget from the spec's buckets.
    pub fn new(per_link: &Bucket, per_service: &Bucket, clock: C) -> Self {
        Self {
            link: RateLimiter::direct_with_clock(quota(per_link), clock.clone()),
            per_service: quota(per_service),
            clock,
        }
    }

    /// A fresh bucket for one service, full.
    pub fn service_bucket(&self) -> Limiter<C> {
        RateLimiter::direct_with_clock(self.per_service, self.clock.clone())
    }

    /// Takes a token from the link's bucket, or says how long until one is there.
    pub fn take_link(&self) -> Result<(), Duration> {
        take(&self.link, &self.clock)
    }

    /// Takes a token from a service's bucket, or says how long until one is there.
    pub fn take_service(&self, bucket: &Limiter<C>) -> Result<(), Duration> {
        take(bucket, &self.clock)
    }
}

fn take<C: Clock>(l: &Limiter<C>, clock: &C) -> Result<(), Duration> {
    l.check().map_err(|not_until| {
        let now = clock.now();
        Duration::from(not_until.earliest_possible().duration_since(now))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor::clock::FakeRelativeClock;

    fn bucket(rate: u32, burst: u32) -> Bucket {
        Bucket {
            updates_per_second: rate,
            burst,
        }
    }

    #[test]
    fn the_link_bucket_allows_its_burst_then_its_rate() {
        let clock = FakeRelativeClock::default();
        let budget = Budget::new(&bucket(10, 3), &bucket(1, 1), clock.clone());
        for _ in 0..3 {
            assert_eq!(budget.take_link(), Ok(()));
        }
        let wait = budget.take_link().expect_err("burst spent");
        assert_eq!(wait, Duration::from_millis(100), "one token every 1/10 s");
        clock.advance(wait);
        assert_eq!(budget.take_link(), Ok(()));
        assert!(budget.take_link().is_err());
    }

    #[test]
    fn each_service_has_its_own_bucket() {
        let clock = FakeRelativeClock::default();
        let budget = Budget::new(&bucket(100, 100), &bucket(2, 2), clock.clone());
        let (a, b) = (budget.service_bucket(), budget.service_bucket());
        assert!(budget.take_service(&a).is_ok() && budget.take_service(&a).is_ok());
        assert_eq!(budget.take_service(&a), Err(Duration::from_millis(500)));
        assert!(
            budget.take_service(&b).is_ok(),
            "a hot service does not spend a calm one's tokens"
        );
    }

    #[test]
    fn the_fed_clock_only_moves_forward() {
        let clock = FedClock::default();
        clock.set(Duration::from_secs(2));
        clock.set(Duration::from_secs(1));
        assert_eq!(Duration::from(clock.now()), Duration::from_secs(2));
    }
}
