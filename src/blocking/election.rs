//! The blocking election: candidates, the leader's guard, followers.

use std::time::{Duration, Instant};

use crate::{Error, FencingToken, Leader};

facade! {
    /// A blocking [`crate::Election`]: candidates campaign, anyone reads or follows the
    /// leader.
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
    pub struct Election(crate::Election);

    /// A blocking [`crate::LeaderGuard`]: proof of leading, resigned on
    /// [`LeaderGuard::resign`] or, in the background, on drop.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let leader = client.election("scheduler")?.campaign(b"worker-3")?; // blocks until it leads
    /// println!("leading in term {}", leader.term()); // pass it to every fenced write
    /// assert!(leader.is_valid());
    /// leader.resign()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    #[must_use = "a leader guard resigns when dropped; bind it for as long as this instance leads"]
    #[derive(Debug)]
    pub struct LeaderGuard(crate::LeaderGuard);

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
    pub struct Observer(crate::Observer);
}

impl Election {
    forward! {
        /// See [`crate::Election::name`].
        fn name(&self) -> &[u8];
        /// See [`crate::Election::lease`].
        fn lease(&self) -> Duration;
        /// See [`crate::Election::with_lease`].
        fn with_lease(&self, lease: Duration) -> Result<Election, Error> = wrap;
        /// See [`crate::Election::with_label`].
        fn with_label(&self, label: impl AsRef<str>) -> Result<Election, Error> = wrap;
        /// See [`crate::Election::label`].
        fn label(&self) -> Option<&str>;
        /// See [`crate::Election::try_campaign`]; blocks the thread until Redis answered.
        fn try_campaign(&self, metadata: &[u8]) -> Result<Option<LeaderGuard>, Error> = block wrap;
        /// See [`crate::Election::campaign`]; blocks the thread until this candidate leads.
        fn campaign(&self, metadata: &[u8]) -> Result<LeaderGuard, Error> = block wrap;
        /// See [`crate::Election::campaign_timeout`]; blocks the thread at most `timeout`.
        fn campaign_timeout(
            &self,
            metadata: &[u8],
            timeout: Duration
        ) -> Result<LeaderGuard, Error> = block wrap;
        /// See [`crate::Election::leader`]; blocks the thread until Redis answered.
        fn leader(&self) -> Result<Option<Leader>, Error> = block;
        /// See [`crate::Election::observe`]; blocks the thread until the follower is set up.
        fn observe(&self) -> Result<Observer, Error> = block wrap;
    }
}

impl LeaderGuard {
    /// Blocks the thread until this instance has lost the leadership, or `timeout` passed;
    /// returns whether it was lost. See [`crate::LeaderGuard::lost`].
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        self.runtime
            .block_on_timeout(timeout, self.inner.lost())
            .is_some()
    }

    forward! {
        /// See [`crate::LeaderGuard::term`].
        fn term(&self) -> FencingToken;
        /// See [`crate::LeaderGuard::id`].
        fn id(&self) -> &str;
        /// See [`crate::LeaderGuard::metadata`].
        fn metadata(&self) -> &[u8];
        /// See [`crate::LeaderGuard::is_valid`].
        fn is_valid(&self) -> bool;
        /// See [`crate::LeaderGuard::valid_until`].
        fn valid_until(&self) -> Instant;
        /// See [`crate::LeaderGuard::resign`]; blocks the thread until Redis answered.
        fn resign(self) -> Result<(), Error> = block;
    }
}

impl Observer {
    /// See [`crate::Observer::current`].
    pub fn current(&self) -> Option<&Leader> {
        self.inner.current()
    }

    /// See [`crate::Observer::changed`]; blocks the thread until the leader changes.
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
        self.runtime
            .block_on_timeout(timeout, self.inner.changed())
            .unwrap_or_else(|| {
                Err(Error::Timeout {
                    waited: started.elapsed(),
                })
            })
    }
}
