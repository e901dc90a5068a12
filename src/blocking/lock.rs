//! The blocking lock and its guard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{Error, FencingToken, OnShortfall};

/// A blocking [`crate::Lock`].
#[derive(Clone, Debug)]
pub struct Lock {
    pub(super) inner: crate::Lock,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::LockGuard`]: proof of holding, released on [`LockGuard::release`] or,
/// in the background, on drop.
#[must_use = "a guard releases the lock when dropped; bind it for as long as the critical section lasts"]
#[derive(Debug)]
pub struct LockGuard {
    pub(super) inner: crate::LockGuard,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
}

impl Lock {
    /// The lock's name.
    pub fn name(&self) -> &[u8] {
        self.inner.name()
    }

    /// A handle whose acquisitions carry `label` (a request or trace id) for operators; see
    /// [`crate::Lock::with_label`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.lock("account:42")?.with_label("order-8812")?.acquire()?;
    /// guard.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty, over-long or multi-line label.
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<Lock, Error> {
        Ok(Lock {
            inner: self.inner.with_label(label)?,
            runtime: self.runtime.clone(),
        })
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

    /// A handle whose acquisitions return only after `replicas` replicas confirmed them
    /// (`WAIT`); see [`crate::Lock::with_replica_ack`]. On a shortfall the acquisition is
    /// rolled back and fails with [`Error::ReplicationTimeout`] (the lock is free again), or,
    /// after [`Lock::on_replica_shortfall`], the guard is returned with
    /// [`LockGuard::replicated`] `false`. The acquiring thread blocks for the `WAIT` too: at
    /// most `timeout` plus the response timeout.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let lock = client.lock("job")?.with_replica_ack(1, Duration::from_millis(200))?;
    /// match lock.acquire_timeout(Duration::from_secs(5)) {
    ///     Ok(guard) => {
    ///         assert!(guard.replicated());
    ///         guard.release()?;
    ///     }
    ///     Err(err) if err.is_replication_timeout() => { /* no replica confirmed; lock free */ }
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for zero replicas or a timeout outside 1 ms..=60 s.
    pub fn with_replica_ack(&self, replicas: u32, timeout: Duration) -> Result<Lock, Error> {
        Ok(Lock {
            inner: self.inner.with_replica_ack(replicas, timeout)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A handle whose acquisitions do not wait for replicas, whatever the client's default;
    /// see [`crate::Lock::without_replica_ack`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let lock = client.lock("job")?.without_replica_ack();
    /// assert_eq!(lock.replica_ack(), None);
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn without_replica_ack(&self) -> Lock {
        Lock {
            inner: self.inner.without_replica_ack(),
            runtime: self.runtime.clone(),
        }
    }

    /// A handle with another [`OnShortfall`] policy for its replica acknowledgement; see
    /// [`crate::Lock::on_replica_shortfall`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    /// use fencelock::OnShortfall;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let lock = client
    ///     .lock("job")?
    ///     .with_replica_ack(1, Duration::from_millis(200))?
    ///     .on_replica_shortfall(OnShortfall::ReturnUnreplicated);
    /// let guard = lock.acquire()?;
    /// if !guard.replicated() {
    ///     eprintln!("only {:?} replicas confirmed", guard.replica_acks());
    /// }
    /// guard.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn on_replica_shortfall(&self, policy: OnShortfall) -> Lock {
        Lock {
            inner: self.inner.on_replica_shortfall(policy),
            runtime: self.runtime.clone(),
        }
    }

    /// The replica acknowledgement this handle's acquisitions require; see
    /// [`crate::Lock::replica_ack`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let lock = client.lock("job")?.with_replica_ack(2, Duration::from_millis(100))?;
    /// assert_eq!(lock.replica_ack(), Some((2, Duration::from_millis(100))));
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn replica_ack(&self) -> Option<(u32, Duration)> {
        self.inner.replica_ack()
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

    /// Whether the acquisition reached the replicas it required; see
    /// [`crate::LockGuard::replicated`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.lock("job")?.acquire()?;
    /// assert!(guard.replicated()); // nothing was required
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn replicated(&self) -> bool {
        self.inner.replicated()
    }

    /// How many replicas confirmed the acquisition, or `None` when none were required; see
    /// [`crate::LockGuard::replica_acks`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.lock("job")?.acquire()?;
    /// assert_eq!(guard.replica_acks(), None);
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn replica_acks(&self) -> Option<u32> {
        self.inner.replica_acks()
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
