//! The blocking semaphore and its permits.

use std::time::{Duration, Instant};

use crate::{Error, FencingToken};

blocking! {
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
    #[derive(Clone)]
    pub struct Semaphore(crate::Semaphore) {
        fn name(&self) -> &[u8];
        fn limit(&self) -> u32;
        fn with_lease(&self, lease: Duration) -> Result<Semaphore, Error> = wrap;
        fn with_label(&self, label: impl AsRef<str>) -> Result<Semaphore, Error> = wrap;
        /// As long as it takes.
        fn try_acquire | acquire | acquire_timeout(&self, permits: u32) -> SemaphorePermit;
    }

    /// A blocking [`crate::SemaphorePermit`]: permits held, given back on
    /// [`SemaphorePermit::release`] or, in the background, on drop.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let permit = client.semaphore("exports", 4)?.acquire(2)?;
    /// assert_eq!((permit.permits(), permit.limit()), (2, 4));
    /// println!("two of four permits, token {}", permit.token());
    /// permit.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    #[must_use = "a permit is given back when dropped; bind it for as long as the work lasts"]
    pub struct SemaphorePermit(crate::SemaphorePermit) {
        fn token(&self) -> FencingToken;
        fn permits(&self) -> u32;
        fn limit(&self) -> u32;
        /// A permit dereferences to that guard.
        [crate::LockGuard] fn is_valid(&self) -> bool;
        /// A permit dereferences to that guard.
        [crate::LockGuard] fn valid_until(&self) -> Instant;
        fn release(self) -> Result<(), Error> = block;
    }
}
