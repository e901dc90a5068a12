//! Lease bounds.

use std::time::Duration;

use crate::Error;

/// The longest lease accepted: a week. Longer leases are almost always a unit mistake
/// (seconds passed as milliseconds), and a lock that outlives its holder for longer than this
/// is an outage, not a safety margin.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Checks that a lease is at least one millisecond, a whole number of milliseconds (Redis keeps
/// milliseconds; rounding would silently change the deadline the guard reports), and at most
/// [`MAX_LEASE`].
pub(crate) fn validate(lease: Duration) -> Result<Duration, Error> {
    let reason = if lease < Duration::from_millis(1) {
        "a lease must be at least 1 ms"
    } else if lease > MAX_LEASE {
        "a lease must be at most 7 days"
    } else if !lease.subsec_nanos().is_multiple_of(1_000_000) {
        "a lease must be a whole number of milliseconds"
    } else {
        return Ok(lease);
    };
    Err(Error::InvalidLease { lease, reason })
}
