//! A named semaphore: a number of permits shared by every process, each hold with its own
//! lease.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::LockClient;
use super::guard::LockGuard;
use crate::base::config::checked_label;
use crate::base::durations::validate_lease;
use crate::base::error::Error;
use crate::base::metrics;
use crate::base::token::FencingToken;
use crate::engine::acquisition::{self, Acquisition, Attempt};
use crate::engine::handoff::{self, Grant, HandoffTerms};
use crate::engine::hold::SEMAPHORE;
use crate::engine::holder::Holder;
use crate::engine::pending::PendingOp;
use crate::engine::{Engine, PermissionScope};
use crate::protocol::keys::validate_name;
use crate::protocol::semaphore::{sem_acquire, SemAcquireReply};
use crate::protocol::{CancelKind, LockKeys};

/// A handle to one named semaphore, made by [`LockClient::semaphore`]: `limit` permits shared
/// by every client of the same Redis.
///
/// Each acquisition is one **hold** of one or more permits, with a lease of its own that the
/// client's watchdog renews while the [`SemaphorePermit`] lives (or a fixed lease, after
/// [`Semaphore::with_lease`]). A holder that crashes or hangs gives its permits back when its
/// lease ends, without a sweeper and without anyone's help: every semaphore script first drops
/// the holds whose lease has passed. Each hold gets a fencing token from the same strictly
/// increasing sequence as the locks of its slot, for audit and for storage that refuses a
/// late holder's writes ([`FencedResource`](crate::FencedResource)).
///
/// **The limit.** The first acquisition of an idle semaphore records its handle's limit in
/// Redis; while any hold is live, that recorded limit is the one every acquisition is judged
/// by, whatever its handle says (so that all holders agree on it), and each permit reports it
/// ([`SemaphorePermit::limit`]). When the last hold ends the record goes with it, and the
/// next acquisition records its own handle's limit: a change of configuration takes effect
/// once the semaphore has been idle, or at once through
/// [`Admin::set_semaphore_limit`](crate::admin::Admin::set_semaphore_limit).
///
/// Cheap to clone; it holds nothing by itself.
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// // At most 4 exports run at once, across every instance.
/// let exports = client.semaphore("exports", 4)?;
/// let permit = exports.acquire(1).await?;
/// println!("export with token {}", permit.token());
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    client: LockClient,
    name: Arc<[u8]>,
    keys: Arc<LockKeys>,
    limit: u32,
    lease: Option<Duration>,
    /// Stored with each hold this handle takes (in the hold's field of the semaphore hash).
    label: Option<Arc<str>>,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &String::from_utf8_lossy(&self.name))
            .field("limit", &self.limit)
            .field("lease", &self.lease())
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// A handle to the semaphore called `name` with `limit` permits in all (the limit an idle
    /// semaphore takes on its first acquisition: see [`Semaphore`]). Semaphore names are their
    /// own namespace: a semaphore and a lock of the same name are unrelated. Nothing is sent to
    /// Redis until a permit is acquired.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name; [`Error::InvalidPermits`] for a
    /// limit of zero.
    ///
    /// ```
    /// # fn demo(client: fencelock::LockClient) {
    /// assert!(client.semaphore("pool", 0).unwrap_err().is_invalid_input());
    /// # }
    /// ```
    pub fn semaphore(&self, name: impl AsRef<[u8]>, limit: u32) -> Result<Semaphore, Error> {
        let name = name.as_ref();
        validate_name(name)?;
        if limit == 0 {
            return Err(Error::InvalidPermits {
                reason: "a semaphore needs at least one permit".into(),
            });
        }
        Ok(Semaphore {
            client: self.clone(),
            keys: Arc::new(LockKeys::semaphore(&self.engine.config.prefix, name)),
            name: name.into(),
            limit,
            lease: None,
            label: None,
        })
    }
}

impl Semaphore {
    /// The semaphore's name, as given to [`LockClient::semaphore`].
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The limit this handle records when the semaphore is idle (see [`Semaphore`] for the
    /// limit in force while it is in use).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The lease each hold gets: this handle's own, or the client's default (renewed by the
    /// watchdog).
    pub fn lease(&self) -> Duration {
        self.lease
            .unwrap_or(self.client.engine.config.default_lease)
    }

    /// A handle to the same semaphore whose holds get a fixed `lease` that the watchdog does
    /// not renew: a hold ends at the latest when it runs out, released or not.
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms, over 7 days, or not a whole number of
    /// milliseconds.
    ///
    /// ```
    /// # fn demo(pool: fencelock::Semaphore) -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// let short = pool.with_lease(Duration::from_secs(5))?;
    /// assert!(pool.with_lease(Duration::ZERO).unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn with_lease(&self, lease: Duration) -> Result<Semaphore, Error> {
        let mut semaphore = self.clone();
        semaphore.lease = Some(validate_lease(lease)?);
        Ok(semaphore)
    }

    /// A handle to the same semaphore whose holds carry `label`: a request or trace id that
    /// operators see next to the hold (`fencelock semaphores`, `show`, the admin API's
    /// [`HoldEntry::label`](crate::admin::HoldEntry::label)) and that the
    /// `fencelock.semaphore` event and the `fencelock.long_hold` warning record. Stored in
    /// the hold's own field by the acquisition's script call, only when given, and gone with
    /// the hold. Use it per request (`pool.with_label(request_id)?.acquire(1)`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a label that is empty, over 256 bytes, or has control
    /// characters.
    ///
    /// ```
    /// # async fn demo(pool: fencelock::Semaphore) -> Result<(), fencelock::Error> {
    /// let permit = pool.with_label("export-7731")?.acquire(1).await?;
    /// assert!(pool.with_label("two\nlines").unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<Semaphore, Error> {
        let label = Some(checked_label(label.as_ref())?);
        Ok(Semaphore {
            label,
            ..self.clone()
        })
    }

    /// The label holds taken through this handle carry ([`Semaphore::with_label`]).
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// Takes `permits` permits if that many are free, and returns at once either way
    /// (`Ok(None)` when they are not).
    ///
    /// # Errors
    /// [`Error::InvalidPermits`] for zero permits or more than the limit; [`Error::WrongType`]
    /// when the semaphore's keys hold foreign data; [`Error::Redis`] when Redis could not be
    /// reached within the retry window; [`Error::PermissionDenied`] when the Redis user lacks
    /// a command the semaphore scripts need (checked before the client's first semaphore or
    /// read-write lock acquisition; nothing is written).
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped after the request was sent, the acquisition is
    /// undone in the background whether it already ran or not, so no permit is left held.
    pub async fn try_acquire(&self, permits: u32) -> Result<Option<SemaphorePermit>, Error> {
        let outcome = async {
            self.check(permits)?;
            acquisition::try_once(&PermitRequest { sem: self, permits }).await
        }
        .await;
        self.report("try_acquire", permits, outcome.as_ref().map(Option::as_ref));
        outcome
    }

    /// Takes `permits` permits, waiting as long as it takes.
    ///
    /// Waiting does not poll: the waiter subscribes to the semaphore's channel and goes back
    /// to Redis when a holder releases, or when the earliest lease among the holders ends
    /// (a crashed holder's permits come back then). Waiters of one client queue in FIFO order,
    /// so a request for many permits is not overtaken by later requests for few from the same
    /// client. Across clients, a client built with
    /// [`fair_handoff`](crate::LockClientBuilder::fair_handoff) queues its waiting acquisitions
    /// in Redis, and the oldest one is protected: no other acquisition (a try included) is
    /// granted unless it leaves that one's permits free, so a stream of small requests cannot
    /// starve a big one. Once waiting, a lost connection is retried for as long as it lasts.
    /// In the default mode, a release by a task of the same client hands its permits to the
    /// first waiter in the release's own script call when they are enough for it and no other
    /// client waits: the waiter returns without a round trip of its own.
    ///
    /// # Errors
    /// As [`Semaphore::try_acquire`], except that [`Error::Redis`] for an unreachable Redis
    /// comes only from the first try, before the call starts waiting.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves the queue and undoes an acquisition that may be
    /// in flight, or permits a release of this client may have handed it; no permit is left
    /// held by an acquire nobody waits for.
    pub async fn acquire(&self, permits: u32) -> Result<SemaphorePermit, Error> {
        let outcome = self.acquire_until(permits, None).await;
        self.report("acquire", permits, outcome.as_ref().map(Some));
        outcome
    }

    /// Takes `permits` permits, waiting at most `timeout`; [`Error::Timeout`] when too few
    /// were free until then. The call returns at the deadline at the latest.
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`Semaphore::acquire`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Semaphore::acquire`].
    pub async fn acquire_timeout(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<SemaphorePermit, Error> {
        let deadline = Instant::now() + timeout;
        let outcome = self.acquire_until(permits, Some(deadline)).await;
        self.report("acquire_timeout", permits, outcome.as_ref().map(Some));
        outcome
    }

    fn check(&self, permits: u32) -> Result<(), Error> {
        if permits == 0 || permits > self.limit {
            return Err(Error::InvalidPermits {
                reason: format!(
                    "asked for {permits} permits of semaphore {:?}, which has {} in all \
                     (at least 1 must be asked for)",
                    String::from_utf8_lossy(&self.name),
                    self.limit
                ),
            });
        }
        Ok(())
    }

    /// One `fencelock.semaphore` event and the acquisition metric for an acquire call.
    fn report(
        &self,
        method: &'static str,
        permits: u32,
        outcome: Result<Option<&SemaphorePermit>, &Error>,
    ) {
        let name = || String::from_utf8_lossy(&self.name);
        let ended = match outcome {
            Ok(Some(permit)) => {
                tracing::debug!(name: "fencelock.semaphore", semaphore = %name(), method, permits,
                    outcome = metrics::ACQUIRED, token = permit.token().get(),
                    holder = permit.holder_id(), limit = permit.limit(),
                    label = self.label.as_deref(), "permits acquired");
                metrics::ACQUIRED
            }
            Ok(None) => {
                tracing::debug!(name: "fencelock.semaphore", semaphore = %name(), method, permits,
                    outcome = metrics::BUSY, label = self.label.as_deref(), "too few permits free");
                metrics::BUSY
            }
            Err(err) if err.is_timeout() => {
                tracing::debug!(name: "fencelock.semaphore", semaphore = %name(), method, permits,
                    outcome = metrics::TIMEOUT, label = self.label.as_deref(),
                    "permit acquire timed out");
                metrics::TIMEOUT
            }
            Err(err) => {
                tracing::warn!(name: "fencelock.semaphore", semaphore = %name(), method, permits,
                    outcome = metrics::ERROR, label = self.label.as_deref(), error = %err,
                    "permit acquire failed");
                metrics::ERROR
            }
        };
        metrics::semaphore(ended);
    }

    async fn acquire_until(
        &self,
        permits: u32,
        deadline: Option<Instant>,
    ) -> Result<SemaphorePermit, Error> {
        self.check(permits)?;
        acquisition::acquire_hold(&PermitRequest { sem: self, permits }, deadline).await
    }
}

/// One acquisition of `permits` permits of `sem`, on the holds' acquire loop.
struct PermitRequest<'a> {
    sem: &'a Semaphore,
    permits: u32,
}

impl Acquisition for PermitRequest<'_> {
    type Held = SemaphorePermit;

    fn engine(&self) -> &Engine {
        &self.sem.client.engine
    }

    fn channel(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.sem.keys.lock)
    }

    fn label(&self) -> Option<&str> {
        self.sem.label()
    }

    fn pending(&self, holder: &str) -> PendingOp {
        // An acquisition's operation id is its holder id, as for a lock.
        PendingOp::of_kind(
            &SEMAPHORE,
            &self.sem.client.engine,
            &self.sem.keys,
            holder,
            holder,
            CancelKind::Acquire,
        )
    }

    /// One acquire round trip (re-sent while its outcome is unknown and `window` is open).
    /// `wait`: the attempt of a caller that will wait, which a fair-handoff client queues when
    /// busy; that entry stays until the waiter wins or gives up, so the pending op stays armed
    /// after a busy reply, and dropping it takes the entry out.
    async fn attempt(
        &self,
        holder: &str,
        pending: &mut PendingOp,
        wait: bool,
        window: Duration,
    ) -> Result<Attempt<SemaphorePermit>, Error> {
        let sem = self.sem;
        let permits = self.permits;
        let engine = &sem.client.engine;
        let lease = sem.lease();
        let op_ttl = engine.config.op_record_ttl;
        let limit = sem.limit;
        let fair = engine.config.fair_grace.map(|_| wait);
        let field_expiry = engine.field_expiry;
        let label = sem.label.as_deref();
        // Once per client, before anything is written (a drop here leaves nothing).
        engine.check_permissions(PermissionScope::Holds).await?;
        let sent_at = Instant::now();
        pending.arm();
        let sends = pending.sends();
        let reply = engine
            .retrying_within(window, |mut conn| {
                let keys = &sem.keys;
                let pubsub = conn.pubsub();
                let recorded = sends.send(&conn);
                async move {
                    sem_acquire(
                        &mut conn,
                        keys,
                        holder,
                        permits,
                        limit,
                        lease,
                        op_ttl,
                        pubsub,
                        fair,
                        field_expiry,
                        label,
                        recorded,
                    )
                    .await
                }
            })
            .await?;
        let queued = fair == Some(true) && matches!(reply, SemAcquireReply::Busy { .. });
        match reply {
            SemAcquireReply::Busy { .. } if queued => pending.answered(),
            SemAcquireReply::Busy { .. } => pending.busy(),
            _ => pending.disarm(),
        }
        match reply {
            SemAcquireReply::Acquired {
                token,
                permits,
                limit,
                free,
            } => {
                let permit = self.permit(holder, token, sent_at, permits, limit);
                // Permits are left: the next waiter of this client may fit.
                Ok(Attempt::Won {
                    held: permit,
                    hand_on: free > 0,
                })
            }
            SemAcquireReply::Busy { wait, .. } => Ok(Attempt::Busy(wait)),
            SemAcquireReply::Cancelled => Err(Error::Cancelled),
            SemAcquireReply::OverLimit { limit } => Err(Error::InvalidPermits {
                reason: format!(
                    "asked for {permits} permits of semaphore {:?}, whose limit in force is \
                     {limit} (recorded in Redis while it is in use)",
                    String::from_utf8_lossy(&sem.name)
                ),
            }),
        }
    }

    /// A waiter of a client in the default mode takes permits from a release of its client
    /// (`sem_handoff.lua`); a fair-handoff client's waiters queue in Redis instead.
    fn handoff_terms(&self, holder: &str) -> Option<HandoffTerms> {
        let sem = self.sem;
        if sem.client.fair_handoff().is_some() {
            return None;
        }
        Some(HandoffTerms {
            holder: holder.to_owned(),
            lease: sem.lease(),
            label: sem.label.clone(),
            permits: self.permits,
            undo: handoff::undo_by(self.pending(holder)),
        })
    }

    fn handed_off(
        &self,
        holder: &str,
        pending: &mut PendingOp,
        grant: Grant,
    ) -> Option<SemaphorePermit> {
        pending.disarm();
        let limit = grant.room.map_or(self.sem.limit, |room| room.limit);
        Some(self.permit(holder, grant.token, grant.sent_at, self.permits, limit))
    }
}

impl PermitRequest<'_> {
    /// The permit of a hold `holder` won (by its attempt, or from a release's grant), its lease
    /// counted from `sent_at`, renewed by the watchdog from now on.
    fn permit(
        &self,
        holder: &str,
        token: FencingToken,
        sent_at: Instant,
        permits: u32,
        limit: u32,
    ) -> SemaphorePermit {
        let sem = self.sem;
        let engine = &sem.client.engine;
        let holder = Holder::of_kind(
            &SEMAPHORE,
            engine.clone(),
            sem.keys.clone(),
            sem.name.clone(),
            holder.to_owned(),
            token,
            sent_at,
            sem.lease(),
            sem.lease.is_none(),
            None,
            sem.label.clone(),
        );
        engine.watchdog.watch(&holder);
        SemaphorePermit {
            guard: LockGuard::new(holder),
            permits,
            limit,
        }
    }
}

/// Proof of holding permits of a [`Semaphore`]: one hold, with its fencing token and lease.
///
/// Dropping it gives the permits back in the background (as dropping a
/// [`LockGuard`] releases a lock); [`SemaphorePermit::release`] does it and reports the
/// outcome. While it lives, the watchdog renews its lease (unless the semaphore handle has a
/// fixed lease); if renewal fails until the lease ends, or Redis no longer has the hold,
/// [`lost`](LockGuard::lost) resolves and [`is_valid`](LockGuard::is_valid) turns false: the
/// permits may be someone else's by then.
///
/// ```no_run
/// # async fn demo(pool: fencelock::Semaphore) -> Result<(), fencelock::Error> {
/// let permit = pool.acquire(2).await?;
/// tokio::select! {
///     () = permit.lost() => eprintln!("lease lost; stop working"),
///     () = async { /* the work the permits allow */ } => permit.release().await?,
/// }
/// # Ok(()) }
/// ```
///
/// A permit is a [`LockGuard`] of its kind of hold, which it dereferences to: its holder id,
/// validity (`valid_until`, `is_valid`, `lost`) and the rest are the guard's.
#[must_use = "a permit is given back when dropped; bind it for as long as the work lasts"]
pub struct SemaphorePermit {
    guard: LockGuard,
    permits: u32,
    limit: u32,
}

impl std::fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemaphorePermit")
            .field("semaphore", &String::from_utf8_lossy(self.semaphore_name()))
            .field("holder", &self.holder_id())
            .field("permits", &self.permits)
            .field("limit", &self.limit)
            .field("token", &self.token())
            .field("valid", &self.is_valid())
            .finish()
    }
}

impl std::ops::Deref for SemaphorePermit {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

// `token` stays a method of the permit (not only the guard's, through `Deref`): callers name
// it as a path (`SemaphorePermit::token`). `semaphore_name` is the guard's `lock_name` under
// the semaphore's word.
impl SemaphorePermit {
    /// The hold's fencing token: greater than every token issued before it to any hold of this
    /// semaphore (and any lock of its slot).
    pub fn token(&self) -> FencingToken {
        self.guard.token()
    }

    /// How many permits this hold has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The limit in force when the permits were acquired (see [`Semaphore`]).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The semaphore's name.
    pub fn semaphore_name(&self) -> &[u8] {
        self.guard.lock_name()
    }

    /// Gives the permits back and wakes waiters (or, in the same call, hands them to this
    /// client's first waiter when they are enough for it and no other client waits).
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the hold had already ended (its lease ran out, or an operator
    /// released it): the permits were not this holder's any more, and nothing else changed.
    /// [`Error::Redis`] when Redis could not be reached within the retry window; the lease
    /// then frees the permits.
    ///
    /// # Cancel safety
    /// Not cancel safe in outcome, safe in effect: if the future is dropped, the release may
    /// or may not have run, and the watchdog has already stopped renewing, so the lease frees
    /// the permits at the latest.
    pub async fn release(self) -> Result<(), Error> {
        self.guard.release().await
    }
}
