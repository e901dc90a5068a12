//! The blocking election: candidates, the leader's guard, followers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{Error, FencingToken, Leader};

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
    pub(super) inner: crate::Election,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
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
    pub(super) inner: crate::LeaderGuard,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
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
    pub(super) inner: crate::Observer,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
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

    /// A handle whose leaders' holds carry `label`; see [`crate::Election::with_label`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let election = client.election("scheduler")?.with_label("build-2026.12.5")?;
    /// assert_eq!(election.label(), Some("build-2026.12.5"));
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty, over-long or multi-line label.
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<Election, Error> {
        Ok(Election {
            inner: self.inner.with_label(label)?,
            runtime: self.runtime.clone(),
        })
    }

    /// The label this handle's leaders carry.
    pub fn label(&self) -> Option<&str> {
        self.inner.label()
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
