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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_one_millisecond_and_exactly_one_week() {
        let week = Duration::from_secs(604_800);
        assert_eq!(validate(week).unwrap(), week);
        assert!(validate(week + Duration::from_millis(1)).is_err());
        assert_eq!(
            validate(Duration::from_millis(1)).unwrap(),
            Duration::from_millis(1)
        );
        assert!(validate(Duration::from_micros(999)).is_err());
        assert!(validate(Duration::ZERO).is_err());
    }

    #[test]
    fn sub_millisecond_remainders_are_refused_not_rounded() {
        let err = validate(Duration::from_micros(1_500)).unwrap_err();
        assert!(matches!(err, Error::InvalidLease { reason, .. } if reason.contains("whole")));
        assert!(validate(Duration::from_millis(1_500)).is_ok());
    }
}
