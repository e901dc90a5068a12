//! The blocking lock and its guard.

use std::time::{Duration, Instant};

use crate::{Error, FencingToken, OnShortfall};

facade! {
    /// A blocking [`crate::Lock`].
    #[derive(Clone, Debug)]
    pub struct Lock(crate::Lock);

    /// A blocking [`crate::LockGuard`]: proof of holding, released on [`LockGuard::release`]
    /// or, in the background, on drop.
    #[must_use = "a guard releases the lock when dropped; bind it for as long as the critical section lasts"]
    #[derive(Debug)]
    pub struct LockGuard(crate::LockGuard);
}

impl Lock {
    forward! {
        /// See [`crate::Lock::name`].
        fn name(&self) -> &[u8];
        /// See [`crate::Lock::with_label`].
        fn with_label(&self, label: impl AsRef<str>) -> Result<Lock, Error> = wrap;
        /// See [`crate::Lock::with_lease`].
        fn with_lease(&self, lease: Duration) -> Result<Lock, Error> = wrap;
        /// See [`crate::Lock::with_replica_ack`]; the acquiring thread blocks for the `WAIT`
        /// too: at most `timeout` plus the response timeout.
        fn with_replica_ack(&self, replicas: u32, timeout: Duration) -> Result<Lock, Error> = wrap;
        /// See [`crate::Lock::without_replica_ack`] (and [`crate::Lock::with_replica_ack`] for
        /// an example).
        fn without_replica_ack(&self) -> Lock = wrap;
        /// See [`crate::Lock::on_replica_shortfall`] (and [`crate::Lock::with_replica_ack`] for
        /// an example).
        fn on_replica_shortfall(&self, policy: OnShortfall) -> Lock = wrap;
        /// See [`crate::Lock::replica_ack`] (and [`crate::Lock::with_replica_ack`] for an
        /// example).
        fn replica_ack(&self) -> Option<(u32, Duration)>;
        /// See [`crate::Lock::try_acquire`]; blocks the thread until Redis answered.
        fn try_acquire(&self) -> Result<Option<LockGuard>, Error> = block wrap;
        /// See [`crate::Lock::acquire`]; blocks the thread as long as it takes.
        fn acquire(&self) -> Result<LockGuard, Error> = block wrap;
        /// See [`crate::Lock::acquire_timeout`]; blocks the thread at most `timeout`.
        fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard, Error> = block wrap;
    }
}

impl LockGuard {
    /// Blocks the thread until the holder has lost the lock, or `timeout` passed; returns
    /// whether it was lost. See [`crate::LockGuard::lost`].
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        self.runtime
            .block_on_timeout(timeout, self.inner.lost())
            .is_some()
    }

    forward! {
        /// See [`crate::LockGuard::token`].
        fn token(&self) -> FencingToken;
        /// See [`crate::LockGuard::is_valid`].
        fn is_valid(&self) -> bool;
        /// See [`crate::LockGuard::valid_until`].
        fn valid_until(&self) -> Instant;
        /// See [`crate::LockGuard::holder_id`].
        fn holder_id(&self) -> &str;
        /// See [`crate::LockGuard::replicated`] (and [`crate::Lock::with_replica_ack`] for an
        /// example).
        fn replicated(&self) -> bool;
        /// See [`crate::LockGuard::replica_acks`] (and [`crate::Lock::with_replica_ack`] for
        /// an example).
        fn replica_acks(&self) -> Option<u32>;
        /// See [`crate::LockGuard::reenter`]; blocks the thread until Redis answered.
        fn reenter(&self) -> Result<LockGuard, Error> = block wrap;
        /// See [`crate::LockGuard::extend`]; blocks the thread until Redis answered.
        fn extend(&self, lease: Duration) -> Result<(), Error> = block;
        /// See [`crate::LockGuard::release`]; blocks the thread until Redis answered.
        fn release(self) -> Result<(), Error> = block;
    }
}
