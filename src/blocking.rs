//! A synchronous facade for callers without async code: the same locks, guards, tokens and
//! guarantees, driven by a small runtime that the client owns.
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelock::blocking::LockClient;
//!
//! let client = LockClient::connect("redis://127.0.0.1:7000/")?;
//! let lock = client.lock("report:daily")?;
//! if let Some(guard) = lock.try_acquire()? {
//!     // ... the job that must run on one instance only, writing with guard.token() ...
//!     guard.release()?;
//! }
//! let guard = lock.acquire_timeout(Duration::from_secs(5))?;
//! guard.release()?;
//! # Ok::<(), fencelock::Error>(())
//! ```
//!
//! Each method blocks the calling thread until the async operation it wraps completes, so do
//! not call it from inside an async runtime (it panics there, as `Runtime::block_on` does); use
//! the async API instead. Background work (the watchdog, releases of dropped guards, undoing
//! abandoned acquisitions) runs on the client's own runtime threads; when the last client,
//! lock and guard of a runtime are gone the runtime stops, and a release still pending then
//! falls back to the lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{Error, FencingToken};

/// A blocking [`crate::LockClient`]. Cheap to clone; clones share the connection and runtime.
#[derive(Clone, Debug)]
pub struct LockClient {
    inner: crate::LockClient,
    runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::Lock`].
#[derive(Clone, Debug)]
pub struct Lock {
    inner: crate::Lock,
    runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::LockGuard`]: proof of holding, released on [`LockGuard::release`] or,
/// in the background, on drop.
#[must_use = "a guard releases the lock when dropped; bind it for as long as the critical section lasts"]
#[derive(Debug)]
pub struct LockGuard {
    inner: crate::LockGuard,
    runtime: Arc<tokio::runtime::Runtime>,
}

impl LockClient {
    /// Connects with default options; see [`crate::LockClient::connect`].
    ///
    /// # Errors
    /// As [`crate::LockClient::connect`]; [`Error::InvalidConfig`] if the runtime cannot start.
    pub fn connect(url: &str) -> Result<LockClient, Error> {
        LockClient::connect_with(crate::LockClient::builder(url))
    }

    /// Connects with the options of `builder`.
    ///
    /// # Errors
    /// As [`crate::LockClientBuilder::connect`].
    pub fn connect_with(builder: crate::LockClientBuilder) -> Result<LockClient, Error> {
        // Two worker threads: one for the connection and the watchdog, one so that a release
        // scheduled by a dropped guard never waits behind a blocked caller.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fencelock")
            .enable_all()
            .build()
            .map_err(|e| Error::InvalidConfig {
                reason: format!("cannot start the blocking client's runtime: {e}"),
            })?;
        let inner = runtime.block_on(builder.connect())?;
        Ok(LockClient {
            inner,
            runtime: Arc::new(runtime),
        })
    }

    /// A handle to the lock called `name`; see [`crate::LockClient::lock`].
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name.
    pub fn lock(&self, name: impl AsRef<[u8]>) -> Result<Lock, Error> {
        Ok(Lock {
            inner: self.inner.lock(name)?,
            runtime: self.runtime.clone(),
        })
    }

    /// The async client underneath, for code that mixes both.
    pub fn as_async(&self) -> &crate::LockClient {
        &self.inner
    }
}

impl Lock {
    /// The lock's name.
    pub fn name(&self) -> &[u8] {
        self.inner.name()
    }

    /// A handle whose acquisitions get `lease`; see [`crate::Lock::with_lease`].
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for an unusable lease.
    pub fn with_lease(&self, lease: Duration) -> Result<Lock, Error> {
        Ok(Lock {
            inner: self.inner.with_lease(lease)?,
            runtime: self.runtime.clone(),
        })
    }

    /// Takes the lock if it is free; `Ok(None)` when another holder has it.
    ///
    /// # Errors
    /// As [`crate::Lock::try_acquire`].
    pub fn try_acquire(&self) -> Result<Option<LockGuard>, Error> {
        let guard = self.runtime.block_on(self.inner.try_acquire())?;
        Ok(guard.map(|inner| self.wrap(inner)))
    }

    /// Takes the lock, blocking as long as it takes.
    ///
    /// # Errors
    /// As [`crate::Lock::acquire`].
    pub fn acquire(&self) -> Result<LockGuard, Error> {
        let inner = self.runtime.block_on(self.inner.acquire())?;
        Ok(self.wrap(inner))
    }

    /// Takes the lock, blocking at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`crate::Lock::acquire_timeout`].
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard, Error> {
        let inner = self.runtime.block_on(self.inner.acquire_timeout(timeout))?;
        Ok(self.wrap(inner))
    }

    fn wrap(&self, inner: crate::LockGuard) -> LockGuard {
        LockGuard {
            inner,
            runtime: self.runtime.clone(),
        }
    }
}

impl LockGuard {
    /// The holder's fencing token; see [`crate::LockGuard::token`].
    pub fn token(&self) -> FencingToken {
        self.inner.token()
    }

    /// Whether the lease is still believed valid; see [`crate::LockGuard::is_valid`].
    pub fn is_valid(&self) -> bool {
        self.inner.is_valid()
    }

    /// When the lease ends by this process' clock.
    pub fn valid_until(&self) -> Instant {
        self.inner.valid_until()
    }

    /// The holder id Redis knows this holder by.
    pub fn holder_id(&self) -> &str {
        self.inner.holder_id()
    }

    /// Enters the lock again as the same holder, with the same token.
    ///
    /// # Errors
    /// As [`crate::LockGuard::reenter`].
    pub fn reenter(&self) -> Result<LockGuard, Error> {
        let inner = self.runtime.block_on(self.inner.reenter())?;
        Ok(LockGuard {
            inner,
            runtime: self.runtime.clone(),
        })
    }

    /// Sets the lease to `lease` from now.
    ///
    /// # Errors
    /// As [`crate::LockGuard::extend`].
    pub fn extend(&self, lease: Duration) -> Result<(), Error> {
        self.runtime.block_on(self.inner.extend(lease))
    }

    /// Blocks until the holder has lost the lock, or `timeout` passed; returns whether it was
    /// lost. See [`crate::LockGuard::lost`].
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        // The timer must be created inside the runtime, so inside the future.
        self.runtime
            .block_on(async { tokio::time::timeout(timeout, self.inner.lost()).await })
            .is_ok()
    }

    /// Leaves the lock once; see [`crate::LockGuard::release`].
    ///
    /// # Errors
    /// As [`crate::LockGuard::release`].
    pub fn release(self) -> Result<(), Error> {
        self.runtime.block_on(self.inner.release())
    }
}
