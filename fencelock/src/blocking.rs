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
//! ([`LockClient::job`], [`Job`]; DESIGN section 19), semaphores ([`LockClient::semaphore`],
//! [`Semaphore`], [`SemaphorePermit`]; DESIGN section 20) and read-write locks
//! ([`LockClient::rwlock`], [`RwLock`], [`ReadGuard`], [`WriteGuard`]; DESIGN section 21). They run on the same client
//! runtime. Background work (the watchdog, releases of dropped guards, undoing
//! abandoned acquisitions) runs on the client's own runtime threads; when the last client,
//! lock and guard of a runtime are gone the runtime stops, and a release still pending then
//! falls back to the lease.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::api::job::Begun;
use crate::{Error, FencingToken, JobOptions, JobOutcome, JobRun, Leader, OnShortfall, TickRecord};

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

/// A blocking [`crate::MultiLock`]: a set of locks taken all or nothing, in a global order, so
/// threads that take overlapping sets in any order never deadlock.
///
/// ```no_run
/// use fencelock::blocking::LockClient;
///
/// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
/// let accounts = client.multi_lock(["account:alice", "account:bob"])?;
/// let guard = accounts.acquire()?;
/// // ... move money, writing each account with guard.token(its name) ...
/// guard.release()?;
/// # Ok::<(), fencelock::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct MultiLock {
    inner: crate::MultiLock,
    runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::MultiGuard`]: every member of a [`MultiLock`] held, with one fencing
/// token per member; released whole on [`MultiGuard::release`] or, in the background, on drop.
///
/// ```no_run
/// use fencelock::blocking::LockClient;
///
/// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
/// let guard = client.multi_lock(["a", "b"])?.acquire()?;
/// let a = guard.token("a").expect("a member");
/// assert!(guard.is_valid());
/// guard.release()?;
/// # Ok::<(), fencelock::Error>(())
/// ```
#[must_use = "a guard releases its locks when dropped; bind it for as long as the critical section lasts"]
#[derive(Debug)]
pub struct MultiGuard {
    inner: crate::MultiGuard,
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
    /// use std::time::{Duration, SystemTime};
    /// use fencelock::{blocking::LockClient, JobOptions};
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let options = JobOptions::new(Duration::from_secs(3600), Duration::from_secs(600));
    /// let report = client.job("hourly-report", options)?;
    /// let outcome = report.run_exclusive(SystemTime::now(), |run| {
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

    /// The async client underneath, for code that mixes both.
    pub fn as_async(&self) -> &crate::LockClient {
        &self.inner
    }
}

/// A blocking [`crate::Job`]: call [`Job::run_exclusive`] from every instance's scheduler;
/// each tick runs on one instance, once, with the job on the calling thread.
#[derive(Clone, Debug)]
pub struct Job {
    inner: crate::Job,
    runtime: Arc<tokio::runtime::Runtime>,
}

impl Job {
    /// The job's name.
    pub fn name(&self) -> &[u8] {
        self.inner.name()
    }

    /// The job's options.
    pub fn options(&self) -> &JobOptions {
        self.inner.options()
    }

    /// Runs `job` on the calling thread for `tick` if no instance has run or is running it,
    /// and returns at once otherwise; see [`crate::Job::run_exclusive`] for what counts as the
    /// same tick and what each outcome means. The run's hold is taken and its tick recorded
    /// before `job` is called, and the tick recorded done after it returns; a `job` that
    /// panics leaves the tick as one whose runner died (the lock is released as the panic
    /// unwinds, and the policy decides).
    ///
    /// # Errors
    /// As [`crate::Job::run_exclusive`].
    pub fn run_exclusive<T>(
        &self,
        tick: SystemTime,
        job: impl FnOnce(JobRun) -> T,
    ) -> Result<JobOutcome<T>, Error> {
        match self.runtime.block_on(self.inner.begin(tick))? {
            Begun::Skipped(skip) => Ok(skip.outcome()),
            Begun::Run(run) => {
                let output = job(run.view());
                let token = self.runtime.block_on(run.finish())?;
                Ok(JobOutcome::Ran { token, output })
            }
        }
    }

    /// The newest tick begun; see [`crate::Job::last_tick`].
    ///
    /// # Errors
    /// As [`crate::Job::last_tick`].
    pub fn last_tick(&self) -> Result<Option<TickRecord>, Error> {
        self.runtime.block_on(self.inner.last_tick())
    }
}

/// A blocking [`crate::Election`]: candidates campaign, anyone reads or follows the leader.
///
/// ```no_run
/// use fencelock::blocking::LockClient;
///
/// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
/// let election = client.election("scheduler")?;
/// match election.try_campaign(b"worker-3")? {
///     Some(leader) => leader.resign()?,
///     None => println!("led by {:?}", election.leader()?.map(|l| l.term())),
/// }
/// # Ok::<(), fencelock::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    inner: crate::Election,
    runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::LeaderGuard`]: proof of leading, resigned on [`LeaderGuard::resign`]
/// or, in the background, on drop.
///
/// ```no_run
/// use fencelock::blocking::LockClient;
///
/// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
/// let leader = client.election("scheduler")?.campaign(b"worker-3")?;
/// println!("leading in term {}", leader.term()); // pass it to every fenced write
/// assert!(leader.is_valid());
/// leader.resign()?;
/// # Ok::<(), fencelock::Error>(())
/// ```
#[must_use = "a leader guard resigns when dropped; bind it for as long as this instance leads"]
#[derive(Debug)]
pub struct LeaderGuard {
    inner: crate::LeaderGuard,
    runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::Observer`]: a follower's view of an election.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::blocking::LockClient;
///
/// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
/// let mut observer = client.election("scheduler")?.observe()?;
/// match observer.changed_timeout(Duration::from_secs(10)) {
///     Ok(leader) => println!("now led by {:?}", leader.map(|l| l.term())),
///     Err(err) if err.is_timeout() => println!("no change in 10 s"),
///     Err(err) => return Err(err),
/// }
/// # Ok::<(), fencelock::Error>(())
/// ```
#[derive(Debug)]
pub struct Observer {
    inner: crate::Observer,
    runtime: Arc<tokio::runtime::Runtime>,
}

impl Election {
    /// The election's name.
    pub fn name(&self) -> &[u8] {
        self.inner.name()
    }

    /// The lease a leader of this handle gets; see [`crate::Election::lease`].
    pub fn lease(&self) -> Duration {
        self.inner.lease()
    }

    /// A handle whose leaders get a fixed `lease`; see [`crate::Election::with_lease`].
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for an unusable lease.
    pub fn with_lease(&self, lease: Duration) -> Result<Election, Error> {
        Ok(Election {
            inner: self.inner.with_lease(lease)?,
            runtime: self.runtime.clone(),
        })
    }

    /// Leads if nobody does; `Ok(None)` when another candidate leads.
    ///
    /// # Errors
    /// As [`crate::Election::try_campaign`].
    pub fn try_campaign(&self, metadata: &[u8]) -> Result<Option<LeaderGuard>, Error> {
        let leader = self.runtime.block_on(self.inner.try_campaign(metadata))?;
        Ok(leader.map(|inner| self.wrap(inner)))
    }

    /// Blocks until this candidate leads.
    ///
    /// # Errors
    /// As [`crate::Election::campaign`].
    pub fn campaign(&self, metadata: &[u8]) -> Result<LeaderGuard, Error> {
        let inner = self.runtime.block_on(self.inner.campaign(metadata))?;
        Ok(self.wrap(inner))
    }

    /// Blocks at most `timeout` until this candidate leads.
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`crate::Election::campaign_timeout`].
    pub fn campaign_timeout(
        &self,
        metadata: &[u8],
        timeout: Duration,
    ) -> Result<LeaderGuard, Error> {
        let inner = self
            .runtime
            .block_on(self.inner.campaign_timeout(metadata, timeout))?;
        Ok(self.wrap(inner))
    }

    /// Who leads now, read once; see [`crate::Election::leader`].
    ///
    /// # Errors
    /// As [`crate::Election::leader`].
    pub fn leader(&self) -> Result<Option<Leader>, Error> {
        self.runtime.block_on(self.inner.leader())
    }

    /// A follower of this election, starting at the current leader; see
    /// [`crate::Election::observe`].
    ///
    /// # Errors
    /// As [`crate::Election::observe`].
    pub fn observe(&self) -> Result<Observer, Error> {
        let inner = self.runtime.block_on(self.inner.observe())?;
        Ok(Observer {
            inner,
            runtime: self.runtime.clone(),
        })
    }

    fn wrap(&self, inner: crate::LeaderGuard) -> LeaderGuard {
        LeaderGuard {
            inner,
            runtime: self.runtime.clone(),
        }
    }
}

impl LeaderGuard {
    /// This leader's term, its fencing token; see [`crate::LeaderGuard::term`].
    pub fn term(&self) -> FencingToken {
        self.inner.term()
    }

    /// The holder id Redis knows this leader by.
    pub fn id(&self) -> &str {
        self.inner.id()
    }

    /// The metadata this leader campaigned with.
    pub fn metadata(&self) -> &[u8] {
        self.inner.metadata()
    }

    /// Whether this instance still believes it leads; see [`crate::LeaderGuard::is_valid`].
    pub fn is_valid(&self) -> bool {
        self.inner.is_valid()
    }

    /// When the lease ends by this process' clock.
    pub fn valid_until(&self) -> Instant {
        self.inner.valid_until()
    }

    /// Blocks until this instance has lost the leadership, or `timeout` passed; returns
    /// whether it was lost. See [`crate::LeaderGuard::lost`].
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        // The timer must be created inside the runtime, so inside the future.
        self.runtime
            .block_on(async { tokio::time::timeout(timeout, self.inner.lost()).await })
            .is_ok()
    }

    /// Steps down now; see [`crate::LeaderGuard::resign`].
    ///
    /// # Errors
    /// As [`crate::LeaderGuard::resign`].
    pub fn resign(self) -> Result<(), Error> {
        self.runtime.block_on(self.inner.resign())
    }
}

impl Observer {
    /// The leader as last reported.
    pub fn current(&self) -> Option<&Leader> {
        self.inner.current()
    }

    /// Blocks until the leader changes and returns the new one (`None`: nobody leads).
    ///
    /// # Errors
    /// As [`crate::Observer::changed`].
    pub fn changed(&mut self) -> Result<Option<Leader>, Error> {
        self.runtime.block_on(self.inner.changed())
    }

    /// As [`Observer::changed`], blocking at most `timeout`: [`Error::Timeout`] when the
    /// leader did not change in time (nothing is lost: the next call sees the change).
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`crate::Observer::changed`].
    pub fn changed_timeout(&mut self, timeout: Duration) -> Result<Option<Leader>, Error> {
        let started = Instant::now();
        let inner = &mut self.inner;
        self.runtime
            .block_on(async { tokio::time::timeout(timeout, inner.changed()).await })
            .unwrap_or_else(|_elapsed| {
                Err(Error::Timeout {
                    waited: started.elapsed(),
                })
            })
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

impl MultiLock {
    /// The names of the members, in the order they are acquired (the global order).
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client.multi_lock(["b", "a"])?;
    /// let names: Vec<&[u8]> = set.names().collect();
    /// assert_eq!(names.len(), 2);
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn names(&self) -> impl Iterator<Item = &[u8]> {
        self.inner.names()
    }

    /// The lease every member gets; see [`crate::MultiLock::lease`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client.multi_lock(["a", "b"])?.with_lease(Duration::from_secs(5))?;
    /// assert_eq!(set.lease(), Duration::from_secs(5));
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn lease(&self) -> Duration {
        self.inner.lease()
    }

    /// A handle whose acquisitions give every member `lease` (not renewed by the watchdog);
    /// see [`crate::MultiLock::with_lease`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client.multi_lock(["a", "b"])?.with_lease(Duration::from_secs(5))?;
    /// set.acquire()?.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for an unusable lease.
    pub fn with_lease(&self, lease: Duration) -> Result<MultiLock, Error> {
        Ok(MultiLock {
            inner: self.inner.with_lease(lease)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A handle whose acquisitions return only after `replicas` replicas confirmed every
    /// member; on a shortfall the whole set is rolled back ([`Error::ReplicationTimeout`]) or,
    /// after [`MultiLock::on_replica_shortfall`], returned unreplicated. See
    /// [`crate::MultiLock::with_replica_ack`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client
    ///     .multi_lock(["a", "b"])?
    ///     .with_replica_ack(1, Duration::from_millis(200))?;
    /// let guard = set.acquire()?;
    /// assert!(guard.replicated());
    /// guard.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for zero replicas or a timeout outside 1 ms..=60 s.
    pub fn with_replica_ack(&self, replicas: u32, timeout: Duration) -> Result<MultiLock, Error> {
        Ok(MultiLock {
            inner: self.inner.with_replica_ack(replicas, timeout)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A handle with another [`OnShortfall`] policy; see
    /// [`crate::MultiLock::on_replica_shortfall`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    /// use fencelock::OnShortfall;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client
    ///     .multi_lock(["a", "b"])?
    ///     .with_replica_ack(1, Duration::from_millis(200))?
    ///     .on_replica_shortfall(OnShortfall::ReturnUnreplicated);
    /// set.acquire()?.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn on_replica_shortfall(&self, policy: OnShortfall) -> MultiLock {
        MultiLock {
            inner: self.inner.on_replica_shortfall(policy),
            runtime: self.runtime.clone(),
        }
    }

    /// Takes every member if all are free, and returns at once either way: `Ok(None)` when any
    /// member is held by another holder, and then none is held by this call.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// if let Some(guard) = client.multi_lock(["a", "b"])?.try_acquire()? {
    ///     guard.release()?;
    /// }
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`crate::MultiLock::try_acquire`].
    pub fn try_acquire(&self) -> Result<Option<MultiGuard>, Error> {
        let guard = self.runtime.block_on(self.inner.try_acquire())?;
        Ok(guard.map(|inner| self.wrap(inner)))
    }

    /// Takes every member, blocking as long as it takes. Nothing is held while the thread
    /// waits (it queues on the first busy member and tries the whole set again when that is
    /// released), so two threads taking overlapping sets cannot deadlock.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// guard.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`crate::MultiLock::acquire`].
    pub fn acquire(&self) -> Result<MultiGuard, Error> {
        let inner = self.runtime.block_on(self.inner.acquire())?;
        Ok(self.wrap(inner))
    }

    /// Takes every member, blocking at most `timeout`: [`Error::Timeout`] when some member was
    /// still held then (an attempt in flight at the deadline is undone in the background).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// match client.multi_lock(["a", "b"])?.acquire_timeout(Duration::from_secs(2)) {
    ///     Ok(guard) => guard.release()?,
    ///     Err(err) if err.is_timeout() => { /* still busy; nothing held */ }
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`crate::MultiLock::acquire_timeout`].
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<MultiGuard, Error> {
        let inner = self.runtime.block_on(self.inner.acquire_timeout(timeout))?;
        Ok(self.wrap(inner))
    }

    fn wrap(&self, inner: crate::MultiGuard) -> MultiGuard {
        MultiGuard {
            inner,
            runtime: self.runtime.clone(),
        }
    }
}

impl MultiGuard {
    /// The fencing token of the member called `name`, or `None` if the set has no such member.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// assert!(guard.token("a").is_some());
    /// assert!(guard.token("c").is_none());
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn token(&self, name: impl AsRef<[u8]>) -> Option<FencingToken> {
        self.inner.token(name)
    }

    /// `(name, token)` of every member, in the global order.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// for (name, token) in guard.tokens() {
    ///     println!("{} -> {token}", String::from_utf8_lossy(name));
    /// }
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn tokens(&self) -> impl Iterator<Item = (&[u8], FencingToken)> {
        self.inner.tokens()
    }

    /// Whether every member is still held as far as this process knows: the cheap check of
    /// the lost signal; see [`crate::MultiGuard::is_valid`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// assert!(guard.is_valid());
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn is_valid(&self) -> bool {
        self.inner.is_valid()
    }

    /// When the first member's lease ends by this process' clock.
    ///
    /// ```no_run
    /// use std::time::Instant;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// assert!(guard.valid_until() > Instant::now());
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn valid_until(&self) -> Instant {
        self.inner.valid_until()
    }

    /// Whether the acquisition reached the replicas it required, for every member; see
    /// [`crate::MultiGuard::replicated`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// assert!(guard.replicated()); // nothing was required
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn replicated(&self) -> bool {
        self.inner.replicated()
    }

    /// Blocks until any member is lost, or `timeout` passed; returns whether one was lost.
    /// See [`crate::MultiGuard::lost`].
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
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        // The timer must be created inside the runtime, so inside the future.
        self.runtime
            .block_on(async { tokio::time::timeout(timeout, self.inner.lost()).await })
            .is_ok()
    }

    /// Enters the member called `name` again as the same holder, with the same token; `None`
    /// if the set has no such member. See [`crate::LockGuard::reenter`].
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
        Some(
            self.runtime
                .block_on(member.reenter())
                .map(|inner| LockGuard {
                    inner,
                    runtime: self.runtime.clone(),
                }),
        )
    }

    /// Takes the set apart into its members' guards, in the global order (to release or
    /// extend them one by one).
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// for member in guard.into_guards() {
    ///     member.release()?;
    /// }
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn into_guards(self) -> Vec<LockGuard> {
        let runtime = self.runtime;
        self.inner
            .into_guards()
            .into_iter()
            .map(|inner| LockGuard {
                inner,
                runtime: runtime.clone(),
            })
            .collect()
    }

    /// Releases every member once; see [`crate::MultiGuard::release`]. Blocks until Redis
    /// answered; when it cannot be reached within the retry window, the error is returned and
    /// every member's release goes on in the background as the same operation.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// client.multi_lock(["a", "b"])?.acquire()?.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`crate::MultiGuard::release`].
    pub fn release(self) -> Result<(), Error> {
        self.runtime.block_on(self.inner.release())
    }
}

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
    inner: crate::Semaphore,
    runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::SemaphorePermit`]: permits held, given back on
/// [`SemaphorePermit::release`] or, in the background, on drop.
#[must_use = "a permit is given back when dropped; bind it for as long as the work lasts"]
#[derive(Debug)]
pub struct SemaphorePermit {
    inner: crate::SemaphorePermit,
    runtime: Arc<tokio::runtime::Runtime>,
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
    inner: crate::RwLock,
    runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::ReadGuard`], released on [`ReadGuard::release`] or, in the
/// background, on drop.
#[must_use = "a read guard releases when dropped; bind it for as long as the read lasts"]
#[derive(Debug)]
pub struct ReadGuard {
    inner: crate::ReadGuard,
    runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::WriteGuard`], released on [`WriteGuard::release`] or, in the
/// background, on drop.
#[must_use = "a write guard releases when dropped; bind it for as long as the write lasts"]
#[derive(Debug)]
pub struct WriteGuard {
    inner: crate::WriteGuard,
    runtime: Arc<tokio::runtime::Runtime>,
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
