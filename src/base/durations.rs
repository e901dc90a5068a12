//! The one check every duration sent to Redis passes: a whole number of milliseconds within a
//! range. Redis keeps leases, `WAIT` timeouts and reservation graces in milliseconds, so a
//! sub-millisecond remainder would be rounded away on the server and the deadline a guard
//! reports would silently differ from the server's.

use std::time::Duration;

use super::error::Error;

/// The longest lease accepted: a week. Longer leases are almost always a unit mistake
/// (seconds passed as milliseconds), and a lock that outlives its holder for longer than this
/// is an outage, not a safety margin.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why a duration is not a whole number of milliseconds in its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutOfRange {
    TooShort,
    TooLong,
    NotWholeMillis,
}

/// Checks that `d` is a whole number of milliseconds within `min..=max`.
pub(crate) fn whole_millis_in(
    d: Duration,
    min: Duration,
    max: Duration,
) -> Result<Duration, OutOfRange> {
    if d < min {
        Err(OutOfRange::TooShort)
    } else if d > max {
        Err(OutOfRange::TooLong)
    } else if !d.subsec_nanos().is_multiple_of(1_000_000) {
        Err(OutOfRange::NotWholeMillis)
    } else {
        Ok(d)
    }
}

/// Checks a lease: at least one millisecond, a whole number of milliseconds, at most
/// [`MAX_LEASE`].
pub(crate) fn validate_lease(lease: Duration) -> Result<Duration, Error> {
    whole_millis_in(lease, Duration::from_millis(1), MAX_LEASE).map_err(|why| Error::InvalidLease {
        lease,
        reason: match why {
            OutOfRange::TooShort => "a lease must be at least 1 ms",
            OutOfRange::TooLong => "a lease must be at most 7 days",
            OutOfRange::NotWholeMillis => "a lease must be a whole number of milliseconds",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_one_millisecond_and_exactly_one_week() {
        let week = Duration::from_secs(604_800);
        assert_eq!(validate_lease(week).unwrap(), week);
        assert!(validate_lease(week + Duration::from_millis(1)).is_err());
        assert_eq!(
            validate_lease(Duration::from_millis(1)).unwrap(),
            Duration::from_millis(1)
        );
        assert!(validate_lease(Duration::from_micros(999)).is_err());
        assert!(validate_lease(Duration::ZERO).is_err());
    }

    #[test]
    fn sub_millisecond_remainders_are_refused_not_rounded() {
        let err = validate_lease(Duration::from_micros(1_500)).unwrap_err();
        assert!(matches!(err, Error::InvalidLease { reason, .. } if reason.contains("whole")));
        assert!(validate_lease(Duration::from_millis(1_500)).is_ok());
    }

    #[test]
    fn the_range_is_inclusive_and_says_which_bound_failed() {
        let (min, max) = (Duration::from_millis(1), Duration::from_secs(60));
        assert_eq!(whole_millis_in(min, min, max), Ok(min));
        assert_eq!(whole_millis_in(max, min, max), Ok(max));
        assert_eq!(
            whole_millis_in(Duration::ZERO, min, max),
            Err(OutOfRange::TooShort)
        );
        assert_eq!(
            whole_millis_in(max + Duration::from_millis(1), min, max),
            Err(OutOfRange::TooLong)
        );
        assert_eq!(
            whole_millis_in(Duration::from_micros(2_500), min, max),
            Err(OutOfRange::NotWholeMillis)
        );
    }
}
