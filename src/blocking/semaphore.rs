//! The blocking semaphore and its permits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::LockClient;
use crate::{Error, FencingToken};

/// A blocking [`crate::Semaphore`]: `limit` permits shared by every client, each hold with its
/// own lease (DESIGN section 20).
///
/// ```no_run
/// use fencelock::blocking::LockClient;
///
/// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
/// let exports = client.semaphore("exports", 4)?;
/// let permit = exports.acquire(1)?;
/// // ... one of at most four exports at a time, across every instance ...
/// permit.release()?;
/// # Ok::<(), fencelock::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    pub(super) inner: crate::Semaphore,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::SemaphorePermit`]: permits held, given back on
/// [`SemaphorePermit::release`] or, in the background, on drop.
#[must_use = "a permit is given back when dropped; bind it for as long as the work lasts"]
#[derive(Debug)]
pub struct SemaphorePermit {
    pub(super) inner: crate::SemaphorePermit,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
}

impl LockClient {
    /// A handle to the semaphore called `name` with `limit` permits; see
    /// [`crate::LockClient::semaphore`].
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name, [`Error::InvalidPermits`] for a
    /// limit of zero.
    pub fn semaphore(&self, name: impl AsRef<[u8]>, limit: u32) -> Result<Semaphore, Error> {
        Ok(Semaphore {
            inner: self.inner.semaphore(name, limit)?,
            runtime: self.runtime.clone(),
        })
    }
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &[u8] {
        self.inner.name()
    }

    /// The limit this handle records when the semaphore is idle.
    pub fn limit(&self) -> u32 {
        self.inner.limit()
    }

    /// A handle whose holds get a fixed `lease`; see [`crate::Semaphore::with_lease`].
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms, over 7 days, or not whole milliseconds.
    pub fn with_lease(&self, lease: Duration) -> Result<Semaphore, Error> {
        Ok(Semaphore {
            inner: self.inner.with_lease(lease)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A handle whose holds carry `label` (a request or trace id) for operators; see
    /// [`crate::Semaphore::with_label`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let permit = client.semaphore("exports", 4)?.with_label("export-7731")?.acquire(1)?;
    /// permit.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty, over-long or multi-line label.
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<Semaphore, Error> {
        Ok(Semaphore {
            inner: self.inner.with_label(label)?,
            runtime: self.runtime.clone(),
        })
    }

    /// Takes `permits` permits if that many are free; `Ok(None)` when they are not.
    ///
    /// # Errors
    /// As [`crate::Semaphore::try_acquire`].
    pub fn try_acquire(&self, permits: u32) -> Result<Option<SemaphorePermit>, Error> {
        let permit = self.runtime.block_on(self.inner.try_acquire(permits))?;
        Ok(permit.map(|inner| self.wrap(inner)))
    }

    /// Takes `permits` permits, blocking as long as it takes.
    ///
    /// # Errors
    /// As [`crate::Semaphore::acquire`].
    pub fn acquire(&self, permits: u32) -> Result<SemaphorePermit, Error> {
        let inner = self.runtime.block_on(self.inner.acquire(permits))?;
        Ok(self.wrap(inner))
    }

    /// Takes `permits` permits, blocking at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`crate::Semaphore::acquire_timeout`].
    pub fn acquire_timeout(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<SemaphorePermit, Error> {
        let inner = self
            .runtime
            .block_on(self.inner.acquire_timeout(permits, timeout))?;
        Ok(self.wrap(inner))
    }

    fn wrap(&self, inner: crate::SemaphorePermit) -> SemaphorePermit {
        SemaphorePermit {
            inner,
            runtime: self.runtime.clone(),
        }
    }
}

impl SemaphorePermit {
    /// The hold's fencing token.
    pub fn token(&self) -> FencingToken {
        self.inner.token()
    }

    /// How many permits this hold has.
    pub fn permits(&self) -> u32 {
        self.inner.permits()
    }

    /// The limit in force when the permits were acquired.
    pub fn limit(&self) -> u32 {
        self.inner.limit()
    }

    /// Whether the hold is still this process's as far as it knows.
    pub fn is_valid(&self) -> bool {
        self.inner.is_valid()
    }

    /// Until when this process may count on the hold, by its own clock.
    pub fn valid_until(&self) -> Instant {
        self.inner.valid_until()
    }

    /// Gives the permits back and wakes waiters.
    ///
    /// # Errors
    /// As [`crate::SemaphorePermit::release`].
    pub fn release(self) -> Result<(), Error> {
        self.runtime.block_on(self.inner.release())
    }
}
