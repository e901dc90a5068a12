//! The blocking multi-lock: a set of locks taken all or nothing, and its guard.

use std::time::{Duration, Instant};

use super::{FromAsync, LockGuard};
use crate::{Error, FencingToken, OnShortfall};

blocking! {
    /// A blocking [`crate::MultiLock`]: a set of locks taken all or nothing, in a global
    /// order, so threads that take overlapping sets in any order never deadlock.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    /// use fencelock::OnShortfall;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let accounts = client.multi_lock(["account:alice", "account:bob"])?;
    /// let guard = accounts.acquire()?;
    /// // ... move money, writing each account with guard.token(its name) ...
    /// guard.release()?;
    ///
    /// // A set of other settings, waiting at most two seconds.
    /// let set = accounts
    ///     .with_lease(Duration::from_secs(5))?
    ///     .with_replica_ack(1, Duration::from_millis(200))?
    ///     .on_replica_shortfall(OnShortfall::ReturnUnreplicated);
    /// assert_eq!(set.lease(), Duration::from_secs(5));
    /// assert_eq!(set.names().count(), 2);
    /// match set.acquire_timeout(Duration::from_secs(2)) {
    ///     Ok(guard) => guard.release()?,
    ///     Err(err) if err.is_timeout() => { /* still busy; nothing held */ }
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    #[derive(Clone)]
    pub struct MultiLock(crate::MultiLock) {
        fn names(&self) -> impl Iterator<Item = &[u8]>;
        fn lease(&self) -> Duration;
        fn with_lease(&self, lease: Duration) -> Result<MultiLock, Error> = wrap;
        fn with_label(&self, label: impl AsRef<str>) -> Result<MultiLock, Error> = wrap;
        /// The acquiring thread blocks for the `WAIT` too.
        fn with_replica_ack(
            &self,
            replicas: u32,
            timeout: Duration,
        ) -> Result<MultiLock, Error> = wrap;
        fn on_replica_shortfall(&self, policy: OnShortfall) -> MultiLock = wrap;
        /// As long as it takes, holding nothing while it waits.
        fn try_acquire | acquire | acquire_timeout(&self) -> MultiGuard;
    }

    /// A blocking [`crate::MultiGuard`]: every member of a [`MultiLock`] held, with one
    /// fencing token per member; released whole on [`MultiGuard::release`] or, in the
    /// background, on drop.
    ///
    /// ```no_run
    /// use std::time::Instant;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client.multi_lock(["a", "b"])?;
    /// let guard = set.acquire()?;
    /// let a = guard.token("a").expect("a member");
    /// assert!(guard.is_valid() && guard.valid_until() > Instant::now());
    /// assert!(guard.replicated()); // no replica was required
    /// for (name, token) in guard.tokens() {
    ///     println!("{} -> {token}", String::from_utf8_lossy(name));
    /// }
    /// guard.release()?; // every member at once
    ///
    /// if let Some(guard) = set.try_acquire()? {
    ///     for member in guard.into_guards() {
    ///         member.release()?; // or member by member
    ///     }
    /// }
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    #[must_use = "a guard releases its locks when dropped; bind it for as long as the critical section lasts"]
    pub struct MultiGuard(crate::MultiGuard) {
        /// Any member lost counts.
        ///
        /// ```no_run
        /// use std::time::Duration;
        /// use fencelock::blocking::LockClient;
        ///
        /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
        /// let set = client.multi_lock(["a", "b"])?.with_lease(Duration::from_millis(100))?;
        /// let guard = set.acquire()?;
        /// assert!(guard.wait_lost(Duration::from_secs(1))); // the fixed lease ran out
        /// # Ok::<(), fencelock::Error>(())
        /// ```
        fn wait_lost(&self, timeout: Duration) -> bool = lost;
        fn token(&self, name: impl AsRef<[u8]>) -> Option<FencingToken>;
        fn tokens(&self) -> impl Iterator<Item = (&[u8], FencingToken)>;
        fn is_valid(&self) -> bool;
        fn valid_until(&self) -> Instant;
        fn replicated(&self) -> bool;
        fn into_guards(self) -> Vec<LockGuard> = wrap;
        fn release(self) -> Result<(), Error> = block;
    }
}

impl MultiGuard {
    /// Enters the member called `name` again as the same holder, with the same token; `None`
    /// if the set has no such member. The blocking form of
    /// [`crate::MultiGuard::guard`]`(name)` and [`crate::LockGuard::reenter`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// let inner = guard.reenter("a").expect("a member")?;
    /// assert_eq!(Some(inner.token()), guard.token("a"));
    /// inner.release()?;
    /// guard.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`crate::LockGuard::reenter`].
    pub fn reenter(&self, name: impl AsRef<[u8]>) -> Option<Result<LockGuard, Error>> {
        let member = self.inner.guard(name)?;
        let reentered = self.runtime.block_on(member.reenter());
        Some(FromAsync::from_async(reentered, &self.runtime))
    }
}
