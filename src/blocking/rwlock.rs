//! The blocking read-write lock and its guards.

use std::sync::Arc;
use std::time::Duration;

use super::LockClient;
use crate::{Error, FencingToken};

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
pub struct RwLock {
    pub(super) inner: crate::RwLock,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::ReadGuard`], released on [`ReadGuard::release`] or, in the
/// background, on drop.
#[must_use = "a read guard releases when dropped; bind it for as long as the read lasts"]
#[derive(Debug)]
pub struct ReadGuard {
    pub(super) inner: crate::ReadGuard,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::WriteGuard`], released on [`WriteGuard::release`] or, in the
/// background, on drop.
#[must_use = "a write guard releases when dropped; bind it for as long as the write lasts"]
#[derive(Debug)]
pub struct WriteGuard {
    pub(super) inner: crate::WriteGuard,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
}

impl LockClient {
    /// A handle to the read-write lock called `name`; see [`crate::LockClient::rwlock`].
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name.
    pub fn rwlock(&self, name: impl AsRef<[u8]>) -> Result<RwLock, Error> {
        Ok(RwLock {
            inner: self.inner.rwlock(name)?,
            runtime: self.runtime.clone(),
        })
    }
}

impl RwLock {
    /// The lock's name.
    pub fn name(&self) -> &[u8] {
        self.inner.name()
    }

    /// A handle whose holds get a fixed `lease`; see [`crate::RwLock::with_lease`].
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms, over 7 days, or not whole milliseconds.
    pub fn with_lease(&self, lease: Duration) -> Result<RwLock, Error> {
        Ok(RwLock {
            inner: self.inner.with_lease(lease)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A handle whose holds carry `label` (a request or trace id) for operators; see
    /// [`crate::RwLock::with_label`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let read = client.rwlock("catalogue")?.with_label("report-118")?.read()?;
    /// read.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty, over-long or multi-line label.
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<RwLock, Error> {
        Ok(RwLock {
            inner: self.inner.with_label(label)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A read hold if no writer holds or waits; see [`crate::RwLock::try_read`].
    ///
    /// # Errors
    /// As [`crate::RwLock::try_read`].
    pub fn try_read(&self) -> Result<Option<ReadGuard>, Error> {
        let read = self.runtime.block_on(self.inner.try_read())?;
        Ok(read.map(|inner| self.wrap_read(inner)))
    }

    /// The write hold if nobody holds the lock; see [`crate::RwLock::try_write`].
    ///
    /// # Errors
    /// As [`crate::RwLock::try_write`].
    pub fn try_write(&self) -> Result<Option<WriteGuard>, Error> {
        let write = self.runtime.block_on(self.inner.try_write())?;
        Ok(write.map(|inner| self.wrap_write(inner)))
    }

    /// A read hold, blocking as long as it takes.
    ///
    /// # Errors
    /// As [`crate::RwLock::read`].
    pub fn read(&self) -> Result<ReadGuard, Error> {
        let inner = self.runtime.block_on(self.inner.read())?;
        Ok(self.wrap_read(inner))
    }

    /// The write hold, blocking as long as it takes.
    ///
    /// # Errors
    /// As [`crate::RwLock::write`].
    pub fn write(&self) -> Result<WriteGuard, Error> {
        let inner = self.runtime.block_on(self.inner.write())?;
        Ok(self.wrap_write(inner))
    }

    /// A read hold, blocking at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`crate::RwLock::read_timeout`].
    pub fn read_timeout(&self, timeout: Duration) -> Result<ReadGuard, Error> {
        let inner = self.runtime.block_on(self.inner.read_timeout(timeout))?;
        Ok(self.wrap_read(inner))
    }

    /// The write hold, blocking at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`crate::RwLock::write_timeout`].
    pub fn write_timeout(&self, timeout: Duration) -> Result<WriteGuard, Error> {
        let inner = self.runtime.block_on(self.inner.write_timeout(timeout))?;
        Ok(self.wrap_write(inner))
    }

    fn wrap_read(&self, inner: crate::ReadGuard) -> ReadGuard {
        ReadGuard {
            inner,
            runtime: self.runtime.clone(),
        }
    }

    fn wrap_write(&self, inner: crate::WriteGuard) -> WriteGuard {
        WriteGuard {
            inner,
            runtime: self.runtime.clone(),
        }
    }
}

impl ReadGuard {
    /// Enters the read hold once more; see [`crate::ReadGuard::reenter`].
    ///
    /// # Errors
    /// As [`crate::ReadGuard::reenter`].
    pub fn reenter(&self) -> Result<ReadGuard, Error> {
        let inner = self.runtime.block_on(self.inner.reenter())?;
        Ok(ReadGuard {
            inner,
            runtime: self.runtime.clone(),
        })
    }

    /// The read's write epoch; see [`crate::ReadGuard::token`].
    pub fn token(&self) -> FencingToken {
        self.inner.token()
    }

    /// Whether the hold is still this process's as far as it knows.
    pub fn is_valid(&self) -> bool {
        self.inner.is_valid()
    }

    /// Releases the read hold.
    ///
    /// # Errors
    /// As [`crate::ReadGuard::release`].
    pub fn release(self) -> Result<(), Error> {
        self.runtime.block_on(self.inner.release())
    }
}

impl WriteGuard {
    /// Enters the write hold once more; see [`crate::WriteGuard::reenter`].
    ///
    /// # Errors
    /// As [`crate::WriteGuard::reenter`].
    pub fn reenter(&self) -> Result<WriteGuard, Error> {
        let inner = self.runtime.block_on(self.inner.reenter())?;
        Ok(WriteGuard {
            inner,
            runtime: self.runtime.clone(),
        })
    }

    /// The writer's fencing token.
    pub fn token(&self) -> FencingToken {
        self.inner.token()
    }

    /// Whether the hold is still this process's as far as it knows.
    pub fn is_valid(&self) -> bool {
        self.inner.is_valid()
    }

    /// Turns the write hold into a read hold with no gap; see
    /// [`crate::WriteGuard::downgrade`].
    ///
    /// # Errors
    /// As [`crate::WriteGuard::downgrade`].
    pub fn downgrade(self) -> Result<ReadGuard, Error> {
        let inner = self.runtime.block_on(self.inner.downgrade())?;
        Ok(ReadGuard {
            inner,
            runtime: self.runtime,
        })
    }

    /// Releases the write hold.
    ///
    /// # Errors
    /// As [`crate::WriteGuard::release`].
    pub fn release(self) -> Result<(), Error> {
        self.runtime.block_on(self.inner.release())
    }
}
