//! The blocking read-write lock and its guards.

use std::time::Duration;

use crate::{Error, FencingToken};

facade! {
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
    #[derive(Clone, Debug)]
    pub struct RwLock(crate::RwLock);

    /// A blocking [`crate::ReadGuard`], released on [`ReadGuard::release`] or, in the
    /// background, on drop. [`RwLock`] shows one in use.
    #[must_use = "a read guard releases when dropped; bind it for as long as the read lasts"]
    #[derive(Debug)]
    pub struct ReadGuard(crate::ReadGuard);

    /// A blocking [`crate::WriteGuard`], released on [`WriteGuard::release`] or, in the
    /// background, on drop. [`RwLock`] shows one in use.
    #[must_use = "a write guard releases when dropped; bind it for as long as the write lasts"]
    #[derive(Debug)]
    pub struct WriteGuard(crate::WriteGuard);
}

impl RwLock {
    forward! {
        /// See [`crate::RwLock::name`].
        fn name(&self) -> &[u8];
        /// See [`crate::RwLock::with_lease`].
        fn with_lease(&self, lease: Duration) -> Result<RwLock, Error> = wrap;
        /// See [`crate::RwLock::with_label`].
        fn with_label(&self, label: impl AsRef<str>) -> Result<RwLock, Error> = wrap;
        /// See [`crate::RwLock::try_read`]; blocks the thread until Redis answered.
        fn try_read(&self) -> Result<Option<ReadGuard>, Error> = block wrap;
        /// See [`crate::RwLock::try_write`]; blocks the thread until Redis answered.
        fn try_write(&self) -> Result<Option<WriteGuard>, Error> = block wrap;
        /// See [`crate::RwLock::read`]; blocks the thread as long as it takes.
        fn read(&self) -> Result<ReadGuard, Error> = block wrap;
        /// See [`crate::RwLock::write`]; blocks the thread as long as it takes.
        fn write(&self) -> Result<WriteGuard, Error> = block wrap;
        /// See [`crate::RwLock::read_timeout`]; blocks the thread at most `timeout`.
        fn read_timeout(&self, timeout: Duration) -> Result<ReadGuard, Error> = block wrap;
        /// See [`crate::RwLock::write_timeout`]; blocks the thread at most `timeout`.
        fn write_timeout(&self, timeout: Duration) -> Result<WriteGuard, Error> = block wrap;
    }
}

impl ReadGuard {
    forward! {
        /// See [`crate::ReadGuard::reenter`]; blocks the thread until Redis answered.
        fn reenter(&self) -> Result<ReadGuard, Error> = block wrap;
        /// See [`crate::ReadGuard::token`].
        fn token(&self) -> FencingToken;
        /// See [`crate::LockGuard::is_valid`], which a read guard dereferences to.
        fn is_valid(&self) -> bool;
        /// See [`crate::ReadGuard::release`]; blocks the thread until Redis answered.
        fn release(self) -> Result<(), Error> = block;
    }
}

impl WriteGuard {
    forward! {
        /// See [`crate::WriteGuard::reenter`]; blocks the thread until Redis answered.
        fn reenter(&self) -> Result<WriteGuard, Error> = block wrap;
        /// See [`crate::WriteGuard::token`].
        fn token(&self) -> FencingToken;
        /// See [`crate::LockGuard::is_valid`], which a write guard dereferences to.
        fn is_valid(&self) -> bool;
        /// See [`crate::WriteGuard::downgrade`]; blocks the thread until Redis answered.
        fn downgrade(self) -> Result<ReadGuard, Error> = block wrap;
        /// See [`crate::WriteGuard::release`]; blocks the thread until Redis answered.
        fn release(self) -> Result<(), Error> = block;
    }
}
