//! The blocking election: candidates, the leader's guard, followers.

use std::time::{Duration, Instant};

use crate::{Error, FencingToken, Leader};

blocking! {
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
    #[derive(Clone)]
    pub struct Election(crate::Election) {
        fn name(&self) -> &[u8];
        fn lease(&self) -> Duration;
        fn with_lease(&self, lease: Duration) -> Result<Election, Error> = wrap;
        fn with_label(&self, label: impl AsRef<str>) -> Result<Election, Error> = wrap;
        fn label(&self) -> Option<&str>;
        /// Until this candidate leads.
        fn try_campaign | campaign | campaign_timeout(&self, metadata: &[u8]) -> LeaderGuard;
        fn leader(&self) -> Result<Option<Leader>, Error> = block;
        /// Until the follower is set up.
        fn observe(&self) -> Result<Observer, Error> = block wrap;
    }

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
    pub struct LeaderGuard(crate::LeaderGuard) {
        fn wait_lost(&self, timeout: Duration) -> bool = lost;
        fn term(&self) -> FencingToken;
        fn id(&self) -> &str;
        fn metadata(&self) -> &[u8];
        fn is_valid(&self) -> bool;
        fn valid_until(&self) -> Instant;
        fn resign(self) -> Result<(), Error> = block;
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
    pub struct Observer(crate::Observer) {
        fn current(&self) -> Option<&Leader>;
        /// Until the leader changes.
        fn changed(&mut self) -> Result<Option<Leader>, Error> = block;
    }
}

impl Observer {
    /// As [`Observer::changed`], blocking at most `timeout`: [`Error::Timeout`] when the
    /// leader did not change in time (nothing is lost: the next call sees the change).
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`crate::Observer::changed`].
    pub fn changed_timeout(&mut self, timeout: Duration) -> Result<Option<Leader>, Error> {
        let started = Instant::now();
        super::block_on_timeout(&self.runtime, timeout, self.inner.changed())
            .unwrap_or_else(|| Err(Error::timeout(self.inner.election_name(), started)))
    }
}
