//! The replica-acknowledgement policy: how many replicas must confirm an acquisition, for how
//! long to wait, and what a shortfall does. The connections that carry the `WAIT` are the
//! transport's (`transport::ack_pool`); this is only what is asked of them.

use std::time::Duration;

use super::durations::whole_millis_in;
use super::error::Error;

/// Longest accepted `WAIT` timeout: a guard that waits longer for replicas than this has
/// probably lost most of its lease already.
const MAX_ACK_TIMEOUT: Duration = Duration::from_secs(60);

/// What an acquisition that required replica acknowledgement does when fewer replicas than
/// required confirmed it within the timeout.
///
/// ```
/// use fencelock::OnShortfall;
///
/// assert_eq!(OnShortfall::default(), OnShortfall::Fail);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnShortfall {
    /// Roll the acquisition back (the lock is free again) and return
    /// [`Error::ReplicationTimeout`]. The default.
    #[default]
    Fail,
    /// Return the guard anyway, marked: [`LockGuard::replicated`](crate::LockGuard::replicated)
    /// is `false` and [`LockGuard::replica_acks`](crate::LockGuard::replica_acks) tells how
    /// many replicas confirmed it. A failover may lose such a lock.
    ReturnUnreplicated,
}

/// Replica acknowledgement required of an acquisition: `replicas` replicas within `timeout`,
/// and what to do when fewer confirm. Set per client with
/// [`LockClientBuilder::replica_ack`](crate::LockClientBuilder::replica_ack), per lock with
/// [`Lock::with_replica_ack`](crate::Lock::with_replica_ack).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAck {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
    pub(crate) on_shortfall: OnShortfall,
}

impl ReplicaAck {
    /// Checks the numbers: at least one replica (zero would make `WAIT` a no-op that still
    /// costs a round trip), and a timeout of 1 ms..=60 s in whole milliseconds (`WAIT 0`
    /// blocks forever).
    pub(crate) fn new(
        replicas: u32,
        timeout: Duration,
        on_shortfall: OnShortfall,
    ) -> Result<ReplicaAck, Error> {
        if replicas == 0 {
            return Err(Error::InvalidConfig {
                reason: "replica acknowledgement needs at least one replica".into(),
            });
        }
        whole_millis_in(timeout, Duration::from_millis(1), MAX_ACK_TIMEOUT).map_err(|_| {
            Error::InvalidConfig {
                reason: format!(
                    "the replica acknowledgement timeout must be 1 ms..={MAX_ACK_TIMEOUT:?} in \
                     whole milliseconds, not {timeout:?}"
                ),
            }
        })?;
        Ok(ReplicaAck {
            replicas,
            timeout,
            on_shortfall,
        })
    }
}

/// How many replicas confirmed an acquisition, against how many it required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acks {
    pub(crate) acked: u32,
    pub(crate) required: u32,
}

impl Acks {
    pub(crate) fn enough(&self) -> bool {
        self.acked >= self.required
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_replicas_and_timeouts_outside_the_range_are_refused() {
        let ms = Duration::from_millis;
        assert!(ReplicaAck::new(0, ms(100), OnShortfall::Fail).is_err());
        assert!(ReplicaAck::new(1, Duration::ZERO, OnShortfall::Fail).is_err());
        assert!(ReplicaAck::new(1, ms(60_001), OnShortfall::Fail).is_err());
        assert!(ReplicaAck::new(1, Duration::from_micros(1_500), OnShortfall::Fail).is_err());
        let ack = ReplicaAck::new(2, ms(60_000), OnShortfall::ReturnUnreplicated).unwrap();
        assert_eq!((ack.replicas, ack.timeout), (2, ms(60_000)));
        assert!(Acks {
            acked: 2,
            required: 2
        }
        .enough());
        assert!(!Acks {
            acked: 1,
            required: 2
        }
        .enough());
    }
}
