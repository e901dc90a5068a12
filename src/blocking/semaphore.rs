//! The blocking semaphore and its permits.

use std::time::{Duration, Instant};

use crate::{Error, FencingToken};

facade! {
    /// A blocking [`crate::Semaphore`]: `limit` permits shared by every client, each hold with
    /// its own lease (DESIGN section 20).
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
    pub struct Semaphore(crate::Semaphore);

    /// A blocking [`crate::SemaphorePermit`]: permits held, given back on
    /// [`SemaphorePermit::release`] or, in the background, on drop.
    #[must_use = "a permit is given back when dropped; bind it for as long as the work lasts"]
    #[derive(Debug)]
    pub struct SemaphorePermit(crate::SemaphorePermit);
}

impl Semaphore {
    forward! {
        /// See [`crate::Semaphore::name`].
        fn name(&self) -> &[u8];
        /// See [`crate::Semaphore::limit`].
        fn limit(&self) -> u32;
        /// See [`crate::Semaphore::with_lease`].
        fn with_lease(&self, lease: Duration) -> Result<Semaphore, Error> = wrap;
        /// See [`crate::Semaphore::with_label`].
        fn with_label(&self, label: impl AsRef<str>) -> Result<Semaphore, Error> = wrap;
        /// See [`crate::Semaphore::try_acquire`]; blocks the thread until Redis answered.
        fn try_acquire(&self, permits: u32) -> Result<Option<SemaphorePermit>, Error> = block wrap;
        /// See [`crate::Semaphore::acquire`]; blocks the thread as long as it takes.
        fn acquire(&self, permits: u32) -> Result<SemaphorePermit, Error> = block wrap;
        /// See [`crate::Semaphore::acquire_timeout`]; blocks the thread at most `timeout`.
        fn acquire_timeout(
            &self,
            permits: u32,
            timeout: Duration
        ) -> Result<SemaphorePermit, Error> = block wrap;
    }
}

impl SemaphorePermit {
    forward! {
        /// See [`crate::SemaphorePermit::token`].
        fn token(&self) -> FencingToken;
        /// See [`crate::SemaphorePermit::permits`].
        fn permits(&self) -> u32;
        /// See [`crate::SemaphorePermit::limit`].
        fn limit(&self) -> u32;
        /// See [`crate::LockGuard::is_valid`], which a permit dereferences to.
        fn is_valid(&self) -> bool;
        /// See [`crate::LockGuard::valid_until`], which a permit dereferences to.
        fn valid_until(&self) -> Instant;
        /// See [`crate::SemaphorePermit::release`]; blocks the thread until Redis answered.
        fn release(self) -> Result<(), Error> = block;
    }
}
