//! How the links are shared between replicas, from the Leases alone: each replica's share,
//! which free Lease it takes, and when it hands one over.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::Store;

use super::{Decision, LEASE_PREFIX, LeaseTiming, REPLICA_PREFIX, decide};

/// The Leases a replica holds of `links` when `replicas` share them: as many as any other,
/// give or take one.
pub fn share(links: usize, replicas: usize) -> usize {
    links.div_ceil(replicas.max(1))
}

/// How many link Leases each other live replica holds, as `leases` last saw them: every
/// replica with a live presence Lease (0 for one holding no link) and every live holder of a
/// link's Lease; `me` is left out. The replicas sharing the links are these and `me`.
pub(super) fn loads(
    leases: &Store<Lease>,
    me: &str,
    now: jiff::Timestamp,
) -> BTreeMap<String, usize> {
    let mut loads = BTreeMap::new();
    for lease in leases.state() {
        let name = lease.metadata.name.as_deref().unwrap_or_default();
        if !name.starts_with(LEASE_PREFIX) && !name.starts_with(REPLICA_PREFIX) {
            continue;
        }
        let spec = lease.spec.as_ref();
        let holder = spec.and_then(|s| s.holder_identity.as_deref());
        let Some(holder) = holder.filter(|h| !h.is_empty() && *h != me) else {
            continue;
        };
        if decide(spec, "", now) != Decision::Leave {
            continue;
        }
        let load: &mut usize = loads.entry(holder.to_owned()).or_default();
        if name.starts_with(LEASE_PREFIX) {
            *load += 1;
        }
    }
    loads
}

/// Whether this replica, holding `held` link Leases while the others hold `loads`, hands one
/// over although it holds no more than its share: when another holds at least two fewer
/// (four links over three replicas held 2, 2, 0 would leave the third with nothing). Of the
/// replicas holding the most, only the first by identity does, one link per renewal.
pub(super) fn over_balance(held: usize, loads: &BTreeMap<String, usize>, me: &str) -> bool {
    let fewest = loads.values().min().copied().unwrap_or(held);
    let most = loads.values().max().copied().unwrap_or(held).max(held);
    let first_of_most = (loads.iter())
        .filter(|(_, n)| **n == most)
        .map(|(id, _)| id.as_str())
        .chain((held == most).then_some(me))
        .min();
    held >= fewest + 2 && first_of_most == Some(me)
}

/// Whether this replica, holding `held` Leases of its `share`, tries to take `lease` (`None`:
/// not created yet) while another holds `fewest_elsewhere` at the least, its view of the link
/// `synced` or not ([`super::Links::synced`]). A live holder's is left alone. A free or lapsed
/// one is taken while this replica holds less than its share and no more than any other (the
/// replica holding fewest takes first: one that just joined gets what the others hand over),
/// and its view holds the last holder's (taken over before, the link's versions would go on
/// below the last holder's, and every other replica's consumers would have to relist). Past
/// that, a Lease is taken only once it has stayed free longer than a Lease lasts (no other
/// replica took it: a link is never left without a holder for balance, nor for a view that
/// cannot sync); half as long for a replica under its share whose view has not synced, so
/// that it takes the link before one at its share would (which would hand it over again).
pub(super) fn worth_taking(
    lease: Option<&Lease>,
    (held, share): (usize, usize),
    fewest_elsewhere: Option<usize>,
    synced: bool,
    now: jiff::Timestamp,
    timing: LeaseTiming,
) -> bool {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return true;
    };
    if decide(Some(spec), "", now) == Decision::Leave {
        return false;
    }
    let under_share = held < share && fewest_elsewhere.is_none_or(|f| held <= f);
    if under_share && synced {
        return true;
    }
    let lasts =
        jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    let grace = if under_share {
        timing.duration / 2
    } else {
        timing.duration
    };
    let grace = jiff::SignedDuration::try_from(grace).unwrap_or_default();
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref());
    renewed.is_none_or(|t| t.0 + lasts + grace < now)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    #[test]
    fn each_replica_holds_its_share_give_or_take_one() {
        assert_eq!(share(3, 1), 3);
        assert_eq!(share(3, 2), 2);
        assert_eq!(share(3, 3), 1);
        assert_eq!(share(2, 3), 1);
        assert_eq!(share(0, 2), 0);
        assert_eq!(share(4, 0), 4, "no replica seen: this one holds everything");
    }

    /// A Lease renewed `secs_ago` before `now` for `lasts` seconds: given back (no holder,
    /// as a replica gives one back: for 1 s), or `holder`'s.
    fn lease(holder: Option<&str>, lasts: i32, secs_ago: i64, now: jiff::Timestamp) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                lease_duration_seconds: Some(lasts),
                renew_time: Some(MicroTime(now - jiff::SignedDuration::from_secs(secs_ago))),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    /// A replica under its share takes a free Lease; at its share it leaves it for one under
    /// its share, unless nobody took it for longer than a Lease lasts; a live holder's it
    /// never takes.
    #[test]
    fn a_free_lease_is_taken_by_a_replica_under_its_share() {
        let now = jiff::Timestamp::now();
        // Held, share; the fewest another holds; its view synced.
        let takes = |lease: Option<&Lease>, load, fewest| {
            worth_taking(lease, load, fewest, true, now, LeaseTiming::default())
        };
        let fresh = lease(None, 1, 0, now);
        assert!(takes(Some(&fresh), (0, 1), None));
        assert!(!takes(Some(&fresh), (1, 1), None));
        assert!(
            !takes(Some(&fresh), (1, 2), Some(0)),
            "left for the replica holding fewer"
        );
        assert!(takes(Some(&fresh), (1, 2), Some(1)));
        let long_free = lease(None, 1, 60, now);
        assert!(takes(Some(&long_free), (1, 1), Some(0)));
        let live = lease(Some("replica-b"), 15, 1, now);
        assert!(!takes(Some(&live), (0, 5), None));
        assert!(takes(None, (3, 1), None), "a Lease nobody made yet");
    }

    /// A replica whose view of the link does not hold its last holder's (it joined and has
    /// not synced from the holder yet) leaves a Lease just given back, or just lapsed, to one
    /// whose view does, though it holds fewest; it takes it once it has stayed free half a
    /// Lease duration longer than it lasts (before a replica at its share would), and a Lease
    /// nobody made at once.
    #[test]
    fn a_replica_that_has_not_synced_the_holders_view_waits_before_taking_its_lease() {
        let now = jiff::Timestamp::now();
        // Held, share; its view synced (nobody else holds fewer).
        let takes = |lease: Option<&Lease>, load, synced| {
            worth_taking(lease, load, None, synced, now, LeaseTiming::default())
        };
        let given_back = lease(None, 1, 0, now);
        assert!(takes(Some(&given_back), (0, 1), true));
        assert!(!takes(Some(&given_back), (0, 1), false));
        let lapsed = lease(Some("replica-b"), 15, 16, now);
        assert!(takes(Some(&lapsed), (0, 1), true));
        assert!(!takes(Some(&lapsed), (0, 1), false));
        let free_10_s = lease(None, 1, 10, now);
        assert!(takes(Some(&free_10_s), (0, 1), false));
        assert!(
            !takes(Some(&free_10_s), (1, 1), true),
            "one at its share takes it later"
        );
        let long_lapsed = lease(Some("replica-b"), 15, 60, now);
        assert!(takes(Some(&long_lapsed), (0, 1), false));
        assert!(takes(None, (0, 1), false), "a Lease nobody made yet");
    }

    /// Four links over three replicas held 2, 2, 0: the first of the two holding two hands
    /// one over, the other does not; 2, 1, 1 is balanced; alone, a replica hands nothing.
    #[test]
    fn a_replica_two_links_above_another_hands_one_over() {
        let loads = |l: &[(&str, usize)]| -> BTreeMap<String, usize> {
            l.iter().map(|(id, n)| ((*id).to_owned(), *n)).collect()
        };
        assert!(over_balance(2, &loads(&[("b", 2), ("c", 0)]), "a"));
        assert!(!over_balance(2, &loads(&[("a", 2), ("c", 0)]), "b"));
        assert!(!over_balance(2, &loads(&[("b", 1), ("c", 1)]), "a"));
        assert!(!over_balance(0, &loads(&[("a", 2), ("b", 2)]), "c"));
        assert!(over_balance(3, &loads(&[("a", 1)]), "b"));
        assert!(!over_balance(4, &BTreeMap::new(), "a"));
    }
}
