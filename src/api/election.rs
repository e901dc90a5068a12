//! Leadership election: at most one leader per election name, whose term is the fencing token
//! of the lock it holds.
//!
//! An election is a lock under keys of its own (`prefix{tag}leader:NAME`, see
//! `protocol::keys`): the leader is the holder of that lock, so leases, the watchdog, waiting
//! on pub/sub, fair handoff and cancellation are the lock's. What an election adds is the
//! leader's metadata, recorded in the lock hash by `announce.lua` (owner-checked by holder id
//! and term, so it never shows one leader's metadata with another's term), a read of the
//! leader for anyone (`leader.lua`), and followers that see every change of leader.

use std::time::{Duration, Instant};

use super::client::LockClient;
use super::guard::LockGuard;
use super::handle::{until, Handle};
use super::lock::Lock;
use crate::base::error::Error;
use crate::base::metrics;
use crate::base::token::FencingToken;
use crate::engine::holder::Holder;
use crate::engine::wait::ObserveEntry;
use crate::engine::Engine;
use crate::protocol::{self, LeaderReply, LockKeys, OwnerReply};

/// The most metadata bytes a leader may publish ([`Election::campaign`]); more is refused
/// with [`Error::InvalidMetadata`] before anything is sent. Every follower reads the metadata
/// on every change of leader, so it is meant for an address or a small descriptor, not data.
///
/// ```
/// assert_eq!(fencelock::MAX_METADATA_LEN, 4096);
/// ```
pub const MAX_METADATA_LEN: usize = 4096;

/// The `fencelock.leader` event and the leadership metric for a leader `holder` elected or
/// resigned (`change`).
fn report_leadership(holder: &Holder, change: &'static str) {
    metrics::leadership(change);
    tracing::debug!(
        name: "fencelock.leader",
        election = %String::from_utf8_lossy(&holder.name),
        leader = holder.id.as_str(),
        term = holder.token.get(),
        change,
        "{}",
        match change {
            metrics::ELECTED => "leader elected",
            _ => "leader resigned",
        }
    );
}

/// When a follower that saw no lease (nobody leads) reads the leader again without having
/// been told anything: a stand-in for a message lost without a reconnect, which the lock's
/// own waiters bound by the holder's lease.
const NO_LEADER_RECHECK: Duration = Duration::from_secs(30);

/// When a follower reads again a leader whose lock has no expiry (an operator's doing).
const NO_EXPIRY_RECHECK: Duration = Duration::from_secs(1);

/// A leadership election under one name, made by [`LockClient::election`].
///
/// Candidates [`campaign`](Election::campaign) with their metadata (an address, say); the
/// winner gets a [`LeaderGuard`] whose [`term`](LeaderGuard::term) is strictly greater than
/// every earlier leader's of this name: pass it to every write the leader makes, through
/// fenced storage ([`FencedResource`](crate::FencedResource), [`sql`](crate::sql)), so that a
/// leader that lost its lease behind its back (a pause, a partition) is refused once its
/// successor wrote. Anyone reads the current [`leader`](Election::leader) or
/// [`observe`](Election::observe)s every change.
///
/// The leader holds a lock kept under keys of the election's own (`leader:` instead of
/// `lock:` after the slot tag), so no lock name can collide with an election name: the lock
/// `"jobs"` and the election `"jobs"` are unrelated.
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// let election = client.election("scheduler")?;
/// let leader = election.campaign(b"10.0.0.7:8080").await?; // waits until this one leads
/// println!("leading in term {}", leader.term());
/// leader.resign().await?; // the next candidate is woken at once
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    lock: Lock,
}

debug_struct!(Election(self) {
    name: String::from_utf8_lossy(self.name()),
    lease: self.lease(),
} ..);

impl LockClient {
    /// A handle to the election called `name`. Names follow the lock-name rules (1 to
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) arbitrary bytes) and never share a key with a
    /// lock of any name. Nothing is sent to Redis until a campaign, read or observer.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name.
    ///
    /// ```no_run
    /// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
    /// let election = client.election("scheduler")?;
    /// assert!(client.election("").unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: impl AsRef<[u8]>) -> Result<Election, Error> {
        let handle = Handle::named(self, name.as_ref(), LockKeys::election)?;
        Ok(Election {
            lock: Lock::of(handle),
        })
    }
}

fn validate_metadata(metadata: &[u8]) -> Result<(), Error> {
    if metadata.len() > MAX_METADATA_LEN {
        return Err(Error::InvalidMetadata {
            len: metadata.len(),
            max: MAX_METADATA_LEN,
        });
    }
    Ok(())
}

impl Election {
    getters! {
        /// The election's name, as given to [`LockClient::election`].
        fn name(&self) -> &[u8] => self.lock.name();

        /// The lease a leader of this handle gets: its own, or the client's default (then the
        /// client's watchdog renews it while the [`LeaderGuard`] lives).
        fn lease(&self) -> Duration => self.lock.lease();

        /// The label this handle's leaders carry ([`Election::with_label`]).
        fn label(&self) -> Option<&str> => self.lock.label();
    }

    /// A handle to the same election whose leaders get a fixed `lease` that nobody renews:
    /// leadership ends when it runs out unless the leader resigns first. For terms of bounded
    /// length; the default (watched) lease suits a leader that leads until it stops.
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms, over 7 days, or not a whole number of
    /// milliseconds.
    ///
    /// ```no_run
    /// # async fn demo(election: fencelock::Election) -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// let one_minute_terms = election.with_lease(Duration::from_secs(60))?;
    /// # Ok(()) }
    /// ```
    pub fn with_lease(&self, lease: Duration) -> Result<Election, Error> {
        self.lock.with_lease(lease).map(|lock| Election { lock })
    }

    /// A handle to the same election whose leaders' holds carry `label`: what operators see
    /// next to the leader (`fencelock elections`, the admin API's
    /// [`ElectionInfo::leader_label`](crate::admin::ElectionInfo::leader_label)), such as the
    /// deployment or build this candidate runs. Stored with the leader's hold by the campaign's
    /// own acquisition ([`Lock::with_label`]), and gone when the term ends.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a label that is empty, over 256 bytes, or has control
    /// characters.
    ///
    /// ```no_run
    /// # async fn demo(election: fencelock::Election) -> Result<(), fencelock::Error> {
    /// let leader = election.with_label("build-2026.12.5")?.campaign(b"10.0.0.7:8080").await?;
    /// assert!(election.with_label("two\nlines").unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<Election, Error> {
        self.lock.with_label(label).map(|lock| Election { lock })
    }

    /// Leads if nobody does, and returns at once either way: `Ok(None)` when another candidate
    /// leads (or has won and is recording its metadata).
    ///
    /// # Errors
    /// [`Error::InvalidMetadata`] for metadata over [`MAX_METADATA_LEN`] (nothing sent);
    /// [`Error::NotHeld`] when the lock was lost between winning it and recording the metadata
    /// (deleted, or the lease ran out: nothing of the attempt is left); [`Error::WrongType`]
    /// when the election's key holds foreign data; [`Error::Redis`] when Redis could not be
    /// reached within the retry window (a won lock is then released in the background).
    ///
    /// # Cancel safety
    /// Cancel safe. Dropped while winning the lock: as [`Lock::try_acquire`], the acquisition
    /// is undone. Dropped while recording the metadata: the won lock is released in the
    /// background; a recording still on its way is owner-checked and changes nothing after
    /// that release.
    ///
    /// ```no_run
    /// # async fn demo(election: fencelock::Election) -> Result<(), fencelock::Error> {
    /// match election.try_campaign(b"worker-3").await? {
    ///     Some(leader) => leader.resign().await?,
    ///     None => println!("someone else leads"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_campaign(&self, metadata: &[u8]) -> Result<Option<LeaderGuard>, Error> {
        validate_metadata(metadata)?;
        match self.lock.try_acquire().await? {
            Some(guard) => self.announce(guard, metadata).await.map(Some),
            None => Ok(None),
        }
    }

    /// Waits until this candidate leads, then records `metadata` for everyone to read.
    ///
    /// Waiting does not poll: the candidate waits on the election's channel as a lock waiter
    /// does, and is woken when the leader resigns (or its guard is dropped) or, for a leader
    /// that died silently, when its lease ends.
    ///
    /// # Errors
    /// As [`Election::try_campaign`], except that while the candidate waits a lost connection
    /// is retried for as long as it lasts (as in [`Lock::acquire`]); never [`Error::Timeout`].
    ///
    /// # Cancel safety
    /// Cancel safe. Dropped while waiting or winning: as [`Lock::acquire`], the candidate
    /// leaves the queue and a won lock is undone. Dropped while recording the metadata: the
    /// won lock is released in the background, so the next candidate is woken.
    ///
    /// ```no_run
    /// # async fn demo(election: fencelock::Election) -> Result<(), fencelock::Error> {
    /// # async fn lead(_term: fencelock::FencingToken) {}
    /// let leader = election.campaign(b"10.0.0.7:8080").await?;
    /// tokio::select! {
    ///     () = lead(leader.term()) => leader.resign().await?,
    ///     () = leader.lost() => eprintln!("leadership lost; stop acting as leader"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn campaign(&self, metadata: &[u8]) -> Result<LeaderGuard, Error> {
        validate_metadata(metadata)?;
        let guard = self.lock.acquire().await?;
        self.announce(guard, metadata).await
    }

    /// As [`Election::campaign`], giving up after `timeout` with [`Error::Timeout`]. The call
    /// returns at the deadline at the latest, also when the metadata is still being recorded
    /// (the won lock is then released in the background).
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`Election::campaign`] (a lost connection while waiting is
    /// retried until the deadline).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Election::campaign`].
    ///
    /// ```no_run
    /// # async fn demo(election: fencelock::Election) -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// match election.campaign_timeout(b"worker-3", Duration::from_secs(5)).await {
    ///     Ok(leader) => leader.resign().await?,
    ///     Err(err) if err.is_timeout() => println!("another candidate kept leading"),
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn campaign_timeout(
        &self,
        metadata: &[u8],
        timeout: Duration,
    ) -> Result<LeaderGuard, Error> {
        validate_metadata(metadata)?;
        let started = Instant::now();
        let campaign = || async {
            let guard = self.lock.acquire_timeout(timeout).await?;
            self.announce(guard, metadata).await
        };
        // A timeout past what `Instant` can hold (`Duration::MAX`: "wait forever") is none.
        let deadline = started.checked_add(timeout);
        until(deadline, self.name(), started, campaign).await
    }

    /// Records the metadata of the candidate that just won the lock (`announce.lua`), which
    /// also tells the followers; only then is it the leader. On any error the guard is dropped
    /// here and releases the lock in the background.
    async fn announce(&self, guard: LockGuard, metadata: &[u8]) -> Result<LeaderGuard, Error> {
        let (keys, holder, term) = (self.lock.keys(), guard.holder_id(), guard.token());
        let reply = self
            .engine()
            .retrying(|mut conn| async move {
                let pubsub = conn.pubsub();
                protocol::announce(&mut conn, keys, holder, term, metadata, pubsub).await
            })
            .await
            .map_err(|err| err.named(self.lock.name()))?;
        match reply {
            OwnerReply::Done { .. } => {
                report_leadership(guard.holder(), metrics::ELECTED);
                Ok(LeaderGuard {
                    guard,
                    metadata: metadata.to_vec(),
                })
            }
            OwnerReply::NotHeld => Err(Error::not_held(&guard.holder().name)),
        }
    }

    /// Who leads now, read once: `None` when nobody does (the lock is free, or its winner has
    /// not recorded its metadata yet). The id, term and metadata come from one atomic read, so
    /// they always belong to the same leader. A belief as of the read: leadership may change
    /// right after.
    ///
    /// # Errors
    /// [`Error::WrongType`] when the election's key holds foreign data; [`Error::Redis`] when
    /// Redis could not be reached within the retry window.
    ///
    /// # Cancel safety
    /// Cancel safe: one read-only script; a dropped call changes nothing.
    ///
    /// ```no_run
    /// # async fn demo(election: fencelock::Election) -> Result<(), fencelock::Error> {
    /// if let Some(leader) = election.leader().await? {
    ///     println!("{} leads term {}", String::from_utf8_lossy(leader.metadata()), leader.term());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        Ok(self.read().await?.leader.map(Leader::from))
    }

    fn engine(&self) -> &Engine {
        self.lock.handle.engine()
    }

    async fn read(&self) -> Result<LeaderReply, Error> {
        let keys = self.lock.keys();
        self.engine()
            .retrying(|mut conn| async move { protocol::leader(&mut conn, keys).await })
            .await
            .map_err(|err| err.named(self.lock.name()))
    }

    /// Follows the election without campaigning: the returned [`Observer`] starts at the
    /// current leader ([`Observer::current`]) and reports every later change
    /// ([`Observer::changed`]). It shares the client's connection and subscription to the
    /// election's channel.
    ///
    /// # Errors
    /// As [`Election::leader`], or [`Error::Redis`] when subscribing failed.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves no follower behind (the subscription is dropped
    /// again when nobody of this client needs it).
    ///
    /// ```no_run
    /// # async fn demo(election: fencelock::Election) -> Result<(), fencelock::Error> {
    /// let mut followers_view = election.observe().await?;
    /// loop {
    ///     match followers_view.changed().await? {
    ///         Some(leader) => println!("new leader {} in term {}", leader.id(), leader.term()),
    ///         None => println!("nobody leads"),
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn observe(&self) -> Result<Observer, Error> {
        let entry = self
            .engine()
            .waiters
            .observe(&self.lock.keys().lock)
            .await?;
        // Read after following: a change between the two is also a wake-up for `changed`.
        let read = self.read().await?;
        Ok(Observer {
            election: self.clone(),
            entry,
            current: read.leader.map(Leader::from),
            recheck_at: recheck_at(read.lease_left),
            unread_wake: false,
        })
    }
}

/// When a follower should read again without being told: when the lease it saw ends (a
/// leader that died silently is gone then), or after [`NO_LEADER_RECHECK`] when it saw none.
fn recheck_at(lease_left: Option<Option<Duration>>) -> Instant {
    let wait = match lease_left {
        // One millisecond past the end, so the read finds the key expired.
        Some(Some(left)) => left + Duration::from_millis(1),
        Some(None) => NO_EXPIRY_RECHECK,
        None => NO_LEADER_RECHECK,
    };
    Instant::now() + wait
}

/// The leader of an election as read from Redis: [`Election::leader`],
/// [`Observer::changed`].
///
/// ```no_run
/// # async fn demo(election: fencelock::Election) -> Result<(), fencelock::Error> {
/// let leader = election.leader().await?.expect("someone leads");
/// println!("{} (holder {}) leads term {}",
///     String::from_utf8_lossy(leader.metadata()), leader.id(), leader.term());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    id: String,
    term: FencingToken,
    metadata: Vec<u8>,
}

impl From<protocol::LeaderRecord> for Leader {
    fn from(record: protocol::LeaderRecord) -> Leader {
        Leader {
            id: record.holder,
            term: record.term,
            metadata: record.metadata,
        }
    }
}

impl Leader {
    getters! {
        /// The leader's holder id (its client's [`id`](LockClient::id), then a sequence number):
        /// the same as [`LeaderGuard::id`] of the leader itself.
        fn id(&self) -> &str => &self.id;

        /// The leader's term: the fencing token of its acquisition.
        fn term(&self) -> FencingToken => self.term;

        /// The metadata the leader campaigned with.
        fn metadata(&self) -> &[u8] => &self.metadata;
    }
}

/// Proof of leading an election, made by [`Election::campaign`] and its siblings.
///
/// Leadership lasts while the guard lives and its lease holds (renewed by the client's
/// watchdog unless the election has a lease of its own). [`LeaderGuard::resign`] hands over
/// at once; a guard that is dropped resigns in the background, as a dropped
/// [`LockGuard`] releases.
///
/// ```no_run
/// # async fn demo(election: fencelock::Election, client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// let leader = election.campaign(b"worker-3").await?;
/// let state = client.resource("scheduler-state")?;
/// state.set(leader.term(), b"tick").await?; // StaleToken once a newer leader wrote
/// leader.resign().await?;
/// # Ok(()) }
/// ```
#[must_use = "a leader guard resigns when dropped; bind it for as long as this instance leads"]
pub struct LeaderGuard {
    guard: LockGuard,
    metadata: Vec<u8>,
}

debug_struct!(LeaderGuard(self) {
    election: String::from_utf8_lossy(self.guard.lock_name()),
    id: self.id(),
    term: self.term(),
    valid: self.is_valid(),
});

impl LeaderGuard {
    getters! {
        /// This leader's term: strictly greater than the term of every earlier leader of this
        /// election (it is the fencing token of the leader's lock). Pass it to every write the
        /// leader makes.
        fn term(&self) -> FencingToken => self.guard.token();

        /// The holder id Redis knows this leader by, as [`Leader::id`] reports it.
        fn id(&self) -> &str => self.guard.holder_id();

        /// The metadata this leader campaigned with.
        fn metadata(&self) -> &[u8] => &self.metadata;

        /// When the lease ends by this process' monotonic clock (as
        /// [`LockGuard::valid_until`]).
        fn valid_until(&self) -> Instant => self.guard.valid_until();

        /// Whether this instance still leads as far as it knows (as [`LockGuard::is_valid`]): a
        /// belief, not a proof; fence your writes with [`Self::term`].
        fn is_valid(&self) -> bool => self.guard.is_valid();
    }

    /// Resolves when this instance has lost the leadership (as [`LockGuard::lost`]): a
    /// renewal found the lock gone or taken over, renewals kept failing until the lease ran
    /// out, or a fixed lease ended.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits and changes nothing.
    ///
    /// ```no_run
    /// # async fn demo(leader: fencelock::LeaderGuard) {
    /// leader.lost().await;
    /// eprintln!("no longer leader of term {}", leader.term());
    /// # }
    /// ```
    pub async fn lost(&self) {
        self.guard.lost().await;
    }

    /// Steps down now: the election's lock is released and its channel tells the waiting
    /// candidates (the next one leads two round trips later: its acquisition and its
    /// announcement) and the followers.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when this instance had already lost the leadership (its lease ran
    /// out, the key was deleted, another leader took over): nothing of the new leader's is
    /// touched. [`Error::Redis`] when Redis could not be reached within the retry window; the
    /// resignation then goes on in the background.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped `resign` is finished in the background as the same operation.
    ///
    /// ```no_run
    /// # async fn demo(leader: fencelock::LeaderGuard) -> Result<(), fencelock::Error> {
    /// leader.resign().await?;
    /// # Ok(()) }
    /// ```
    pub async fn resign(self) -> Result<(), Error> {
        let holder = self.guard.holder().clone();
        let resigned = self.guard.release().await;
        if resigned.is_ok() {
            report_leadership(&holder, metrics::RESIGNED);
        }
        resigned
    }
}

/// A follower's view of an election, made by [`Election::observe`]: reports each change of
/// leader without campaigning.
///
/// It reads the leader again on every message on the election's channel (a leader elected,
/// resigned or force-released), after a reconnect, and when the lease it last saw ends, which
/// is how a leader that died silently is noticed. So a follower sees an election or a
/// resignation within one message delivery and one read, and the expiry of a silent leader's
/// lease within one read after the lease ends on the server. When nobody leads it also reads
/// every 30 s, the bound on a message lost without a reconnect.
///
/// Changes are reported as they are found, not queued: two changes within one read (a
/// resignation and the next election) are reported as the second one alone.
///
/// ```no_run
/// # async fn demo(election: fencelock::Election) -> Result<(), fencelock::Error> {
/// let mut observer = election.observe().await?;
/// println!("leader now: {:?}", observer.current().map(|l| l.term()));
/// let next = observer.changed().await?;
/// println!("leader then: {:?}", next.map(|l| l.term()));
/// # Ok(()) }
/// ```
pub struct Observer {
    election: Election,
    entry: ObserveEntry,
    current: Option<Leader>,
    recheck_at: Instant,
    /// A wake-up was taken but its read has not been applied (the call was dropped or failed
    /// in between): the next call reads at once instead of waiting for another one.
    unread_wake: bool,
}

debug_struct!(Observer(self) {
    election: self.election,
    current: self.current,
} ..);

impl Observer {
    /// The name of the election observed, for errors.
    pub(crate) fn election_name(&self) -> &[u8] {
        self.election.name()
    }

    /// The leader as last reported (by [`Election::observe`] or [`Observer::changed`]).
    pub fn current(&self) -> Option<&Leader> {
        self.current.as_ref()
    }

    /// Waits until the leader differs from [`Observer::current`] and returns the new one
    /// (`None`: nobody leads any more).
    ///
    /// # Errors
    /// As [`Election::leader`]; the next call reads again at once.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped while waiting, nothing is lost (a wake-up stays for the next
    /// call); dropped during its read, the next call reads again at once. The reported leader
    /// only changes when a call returns it.
    pub async fn changed(&mut self) -> Result<Option<Leader>, Error> {
        loop {
            if !self.unread_wake {
                self.entry.next_event(self.recheck_at).await;
                self.unread_wake = true;
            }
            let read = self.election.read().await?;
            self.unread_wake = false;
            self.recheck_at = recheck_at(read.lease_left);
            let leader = read.leader.map(Leader::from);
            if leader != self.current {
                self.current.clone_from(&leader);
                return Ok(leader);
            }
        }
    }
}
