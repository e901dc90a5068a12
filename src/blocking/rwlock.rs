//! The blocking read-write lock and its guards.

use std::time::Duration;

use crate::{Error, FencingToken};

blocking! {
    /// A blocking [`crate::RwLock`]: many readers or one writer, every hold with its own lease
    /// (DESIGN section 21).
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let catalogue = client.rwlock("catalogue")?;
    /// let read = catalogue.read()?;
    /// read.release()?;
    /// let write = catalogue.write()?;
    /// let read = write.downgrade()?; // no writer can get in between
    /// read.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    #[derive(Clone)]
    pub struct RwLock(crate::RwLock) {
        fn name(&self) -> &[u8];
        fn with_lease(&self, lease: Duration) -> Result<RwLock, Error> = wrap;
        fn with_label(&self, label: impl AsRef<str>) -> Result<RwLock, Error> = wrap;
        /// As long as it takes.
        fn try_read | read | read_timeout(&self) -> ReadGuard;
        /// As long as it takes.
        fn try_write | write | write_timeout(&self) -> WriteGuard;
    }

    /// A blocking [`crate::ReadGuard`], released on [`ReadGuard::release`] or, in the
    /// background, on drop. [`RwLock`] shows one in use.
    #[must_use = "a read guard releases when dropped; bind it for as long as the read lasts"]
    pub struct ReadGuard(crate::ReadGuard) {
        fn reenter(&self) -> Result<ReadGuard, Error> = block wrap;
        fn token(&self) -> FencingToken;
        /// A read guard dereferences to that guard.
        [crate::LockGuard] fn is_valid(&self) -> bool;
        fn release(self) -> Result<(), Error> = block;
    }

    /// A blocking [`crate::WriteGuard`], released on [`WriteGuard::release`] or, in the
    /// background, on drop. [`RwLock`] shows one in use.
    #[must_use = "a write guard releases when dropped; bind it for as long as the write lasts"]
    pub struct WriteGuard(crate::WriteGuard) {
        fn reenter(&self) -> Result<WriteGuard, Error> = block wrap;
        fn token(&self) -> FencingToken;
        /// A write guard dereferences to that guard.
        [crate::LockGuard] fn is_valid(&self) -> bool;
        fn downgrade(self) -> Result<ReadGuard, Error> = block wrap;
        fn release(self) -> Result<(), Error> = block;
    }
}
