//! What a link's Lease records about its holder, as the lease loop's cache last saw it: who
//! holds it, where its facade is, the base of its view's versions, and how many times it
//! changed hands. The other replicas follow the holder there and begin their own terms from it.

use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::{ObjectRef, Store};

use super::{Decision, decide, lease_name};

/// The annotation on a link's Lease where its holder says where its facade is: the other
/// replicas watch the link there instead of its remote.
pub const FACADE_ANNOTATION: &str = "floodgate.dev/facade";

/// The annotation on a link's Lease where its holders record the base of the resource
/// versions their views serve (decimal; the highest recorded stays). A replica that takes the
/// link over begins its view's term above it ([`crate::view::replica::NewTerm::above`]), so the
/// versions every replica's consumers see keep growing even when its own view never followed
/// the last holder's.
pub const VIEW_BASE_ANNOTATION: &str = "floodgate.dev/view-base";

/// The `leaseTransitions` of link `link`'s Lease since this replica (`me`) took it, as
/// `leases` shows it: the Lease's own count once the cache has this replica's take, one above
/// the previous holder's while it still shows theirs (the take added one). Two replicas that
/// take a Lease one after the other count different transitions, so the terms they begin in
/// the link's view ([`crate::view::View::begin_own_term`]) take different bases.
pub fn transitions_since_taken(
    leases: &Store<Lease>,
    namespace: &str,
    link: &str,
    me: &str,
) -> Option<u32> {
    let lease = leases.get(&ObjectRef::new(&lease_name(link)).within(namespace))?;
    let spec = lease.spec.as_ref()?;
    let counted = u32::try_from(spec.lease_transitions.unwrap_or(0)).unwrap_or(0);
    let taken = spec.holder_identity.as_deref() == Some(me);
    Some(if taken { counted } else { counted + 1 })
}

/// The base of the versions the last holder of link `link`'s Lease recorded for its view
/// ([`VIEW_BASE_ANNOTATION`]), as `leases` last saw it; 0 when none is recorded (or it does
/// not parse: a term above nothing recorded is what a Lease without one gives too).
pub fn recorded_view_base(leases: &Store<Lease>, namespace: &str, link: &str) -> u64 {
    let lease = leases.get(&ObjectRef::new(&lease_name(link)).within(namespace));
    lease
        .as_ref()
        .and_then(|l| {
            l.metadata
                .annotations
                .as_ref()?
                .get(VIEW_BASE_ANNOTATION)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The holder of link `link`'s Lease as `leases` (the lease loop's cache) last saw it: the
/// replica that decides for the link, or `None` while nobody does.
pub fn holder(leases: &Store<Lease>, namespace: &str, link: &str) -> Option<String> {
    let lease = leases.get(&ObjectRef::new(&lease_name(link)).within(namespace))?;
    (lease.spec.as_ref()?.holder_identity.clone()).filter(|h| !h.is_empty())
}

/// Where the live holder of link `link`'s Lease serves it, as `leases` last saw it: its
/// identity and its facade's `host:port`. `None` while nobody holds the Lease, its claim has
/// lapsed, or its holder says no address.
pub fn holder_facade(
    leases: &Store<Lease>,
    namespace: &str,
    link: &str,
) -> Option<(String, String)> {
    let lease = leases.get(&ObjectRef::new(&lease_name(link)).within(namespace))?;
    let holder = holder(leases, namespace, link)?;
    // Judged as a replica that wants it would: a claim that lapsed is nobody's.
    if decide(lease.spec.as_ref(), "", jiff::Timestamp::now()) != Decision::Leave {
        return None;
    }
    let facade = lease
        .metadata
        .annotations
        .as_ref()?
        .get(FACADE_ANNOTATION)?;
    Some((holder, facade.clone()))
}
