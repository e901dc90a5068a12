//! The blocking lock and its guard.

use std::time::{Duration, Instant};

use crate::{Error, FencingToken, OnShortfall};

blocking! {
    /// A blocking [`crate::Lock`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let lock = client.lock("report:daily")?.with_lease(Duration::from_secs(10))?;
    /// match lock.acquire_timeout(Duration::from_secs(5)) {
    ///     Ok(guard) => guard.release()?,
    ///     Err(err) if err.is_timeout() => println!("still busy after 5 s; nothing held"),
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    #[derive(Clone)]
    pub struct Lock(crate::Lock) {
        fn name(&self) -> &[u8];
        fn with_label(&self, label: impl AsRef<str>) -> Result<Lock, Error> = wrap;
        fn with_lease(&self, lease: Duration) -> Result<Lock, Error> = wrap;
        /// The acquiring thread blocks for the `WAIT` too: at most `timeout` plus the response
        /// timeout.
        fn with_replica_ack(&self, replicas: u32, timeout: Duration) -> Result<Lock, Error> = wrap;
        /// [`crate::Lock::with_replica_ack`] has an example.
        fn without_replica_ack(&self) -> Lock = wrap;
        /// [`crate::Lock::with_replica_ack`] has an example.
        fn on_replica_shortfall(&self, policy: OnShortfall) -> Lock = wrap;
        /// [`crate::Lock::with_replica_ack`] has an example.
        fn replica_ack(&self) -> Option<(u32, Duration)>;
        /// As long as it takes.
        fn try_acquire | acquire | acquire_timeout(&self) -> LockGuard;
    }

    /// A blocking [`crate::LockGuard`]: proof of holding, released on [`LockGuard::release`]
    /// or, in the background, on drop.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.lock("account:42")?.acquire()?;
    /// let token = guard.token(); // write it with every change to the resource
    /// let inner = guard.reenter()?; // a nested critical section of the same holder
    /// assert_eq!(inner.token(), token);
    /// inner.release()?;
    /// guard.extend(Duration::from_secs(60))?;
    /// assert!(!guard.wait_lost(Duration::from_millis(10)));
    /// guard.release()?; // the lock is free now
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    #[must_use = "a guard releases the lock when dropped; bind it for as long as the critical section lasts"]
    pub struct LockGuard(crate::LockGuard) {
        fn wait_lost(&self, timeout: Duration) -> bool = lost;
        fn token(&self) -> FencingToken;
        fn is_valid(&self) -> bool;
        fn valid_until(&self) -> Instant;
        fn holder_id(&self) -> &str;
        /// [`crate::Lock::with_replica_ack`] has an example.
        fn replicated(&self) -> bool;
        /// [`crate::Lock::with_replica_ack`] has an example.
        fn replica_acks(&self) -> Option<u32>;
        fn reenter(&self) -> Result<LockGuard, Error> = block wrap;
        fn extend(&self, lease: Duration) -> Result<(), Error> = block;
        fn release(self) -> Result<(), Error> = block;
    }
}
