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
//! the async API instead. A blocking call cannot be cancelled from outside: bound waiting with
//! the `*_timeout` methods, whose deadline cancels the async operation exactly as dropping its
//! future would (an attempt in flight is undone in the background).
//!
//! Multi-lock ([`LockClient::multi_lock`], [`MultiLock`], [`MultiGuard`]) and replica
//! acknowledgement ([`Lock::with_replica_ack`], [`MultiLock::with_replica_ack`]) have the
//! async API's semantics (DESIGN sections 13 and 14); so do elections ([`LockClient::election`],
//! [`Election`], [`LeaderGuard`], [`Observer`]; DESIGN section 18) and scheduled jobs
//! ([`LockClient::job`], [`Job`]; DESIGN section 19), idempotency keys
//! ([`LockClient::idempotency`], [`Idempotency`]; DESIGN section 22), semaphores ([`LockClient::semaphore`],
//! [`Semaphore`], [`SemaphorePermit`]; DESIGN section 20) and read-write locks
//! ([`LockClient::rwlock`], [`RwLock`], [`ReadGuard`], [`WriteGuard`]; DESIGN section 21). They run on the same client
//! runtime. Background work (the watchdog, releases of dropped guards, undoing
//! abandoned acquisitions) runs on the client's own runtime threads; when the last client,
//! lock and guard of a runtime are gone the runtime stops, and a release still pending then
//! falls back to the lease.

mod election;
mod idempotency;
mod job;
mod lock;
mod multi;
mod resource;
mod rwlock;
mod semaphore;

pub use election::{Election, LeaderGuard, Observer};
pub use idempotency::Idempotency;
pub use job::Job;
pub use lock::{Lock, LockGuard};
pub use multi::{MultiGuard, MultiLock};
pub use resource::FencedResource;
pub use rwlock::{ReadGuard, RwLock, WriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit};

use std::sync::Arc;

use crate::{Error, IdempotencyOptions, JobOptions};

/// A blocking [`crate::LockClient`]. Cheap to clone; clones share the connection and runtime.
#[derive(Clone, Debug)]
pub struct LockClient {
    inner: crate::LockClient,
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

    /// A handle to the set of locks `names`, taken all or nothing; see
    /// [`crate::LockClient::multi_lock`]. Nothing is sent until an acquisition.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client.multi_lock(["account:bob", "account:alice"])?;
    /// // Acquired in the global order, whatever order the names were given in.
    /// assert_eq!(set.names().count(), 2);
    /// assert!(client.multi_lock(["x", "x"]).is_err()); // a name twice is a bug
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an unusable name, [`Error::InvalidLockSet`] for an empty set,
    /// more than [`MAX_MULTI_LOCKS`](crate::MAX_MULTI_LOCKS) names, or a name given twice.
    pub fn multi_lock<I, N>(&self, names: I) -> Result<MultiLock, Error>
    where
        I: IntoIterator<Item = N>,
        N: AsRef<[u8]>,
    {
        Ok(MultiLock {
            inner: self.inner.multi_lock(names)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A handle to the election called `name`; see [`crate::LockClient::election`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let election = client.election("scheduler")?;
    /// let leader = election.campaign(b"10.0.0.7:8080")?; // blocks until this one leads
    /// leader.resign()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name.
    pub fn election(&self, name: impl AsRef<[u8]>) -> Result<Election, Error> {
        Ok(Election {
            inner: self.inner.election(name)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A handle to the scheduled job called `name`; see [`crate::LockClient::job`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::{blocking::LockClient, JobOptions};
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let options = JobOptions::new(Duration::from_secs(3600), Duration::from_secs(600));
    /// let report = client.job("hourly-report", options)?;
    /// let tick = report.ticks().next_blocking(); // the instant this tick was scheduled for
    /// let outcome = report.run_exclusive(tick, |run| {
    ///     println!("running with token {}", run.token()); // on this thread
    /// })?;
    /// println!("ran here: {}", outcome.ran());
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`crate::LockClient::job`].
    pub fn job(&self, name: impl AsRef<[u8]>, options: JobOptions) -> Result<Job, Error> {
        Ok(Job {
            inner: self.inner.job(name, options)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A handle to the idempotency keys of `namespace`; see [`crate::LockClient::idempotency`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::{blocking::LockClient, Failure, IdempotencyOptions};
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let payments = client.idempotency("payments", IdempotencyOptions::new(Duration::from_secs(30)))?;
    /// let outcome = payments.run("key-5f2c", "charge acct-9 500", |run| {
    ///     println!("charging with token {}", run.token()); // on this thread
    ///     Ok::<_, Failure<String>>(b"charged".to_vec())
    /// })?;
    /// println!("answer: {:?}", outcome.result());
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`crate::LockClient::idempotency`].
    pub fn idempotency(
        &self,
        namespace: impl AsRef<[u8]>,
        options: IdempotencyOptions,
    ) -> Result<Idempotency, Error> {
        Ok(Idempotency {
            inner: self.inner.idempotency(namespace, options)?,
            runtime: self.runtime.clone(),
        })
    }

    /// The async client underneath, for code that mixes both.
    pub fn as_async(&self) -> &crate::LockClient {
        &self.inner
    }
}
