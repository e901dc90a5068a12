//! The scripts of holds with leases of their own (`lua/sem_*.lua`): one function each, typed
//! replies, no policy. A semaphore's and a read-write lock's holds are released, undone and
//! renewed by the same scripts (a read-write lock's acquisition and downgrade are
//! [`super::rwlock`]'s), which [`super::release`], [`super::cancel`] and [`super::renew`] send
//! for the keys of such a hold, so that the engine's guards, pending operations and watchdog
//! serve these holds unchanged.

use std::borrow::Cow;
use std::time::Duration;

use redis::aio::ConnectionLike;

use super::{
    invoke, millis, on_hash, permits_from, pttl_from, scripts, token_from, unexpected, LockKeys,
    PubSub,
};
use crate::base::error::Error;
use crate::base::token::FencingToken;

/// Outcome of `sem_acquire.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SemAcquireReply {
    /// The hold has `permits` with this token (fresh, or a replay of the same request); the
    /// semaphore has `limit` in all and `free` left. `lease_left`: on a replay, what is left of
    /// the hold's lease, which began before this send.
    Acquired {
        token: FencingToken,
        permits: u32,
        limit: u32,
        free: u32,
        lease_left: Option<Duration>,
    },
    /// Too few permits free. `wait`: until the earliest lease of a holder ends (`None`: no
    /// hold is live, which happens only when the limit is below what was asked, see
    /// `OverLimit`).
    Busy {
        wait: Option<Duration>,
        free: u32,
        limit: u32,
    },
    /// This acquisition was cancelled before it ran (or ran and its hold ended).
    Cancelled,
    /// More permits were asked for than the semaphore has in all.
    OverLimit { limit: u32 },
}

/// What every acquisition of a hold with a lease of its own sends, a semaphore's
/// ([`HoldAcquire::sem_acquire`]) or a read-write lock's ([`HoldAcquire::rw_acquire`]): built
/// per send, borrowing its parts, or owning them to wait in a queue
/// ([`super::batch::ReadOperation`]).
#[derive(Debug, Clone)]
pub(crate) struct HoldAcquire<'a> {
    pub(crate) keys: Cow<'a, LockKeys>,
    /// The holder id, also the acquisition's operation id.
    pub(crate) holder: Cow<'a, str>,
    pub(crate) lease: Duration,
    pub(crate) op_ttl: Duration,
    pub(crate) pubsub: PubSub,
    /// A hold this creates keeps its deadlines as hash-field expiry (the server must have it;
    /// an existing semaphore or read-write lock keeps its own way).
    pub(crate) field_expiry: bool,
    /// Stored in the hold's field, when given.
    pub(crate) label: Option<Cow<'a, str>>,
    /// This send leaves an op record (as `acquire.lua`'s,
    /// [`crate::engine::pending::Sends`]).
    pub(crate) recorded: bool,
}

impl HoldAcquire<'_> {
    /// One semaphore acquire attempt (`sem_acquire.lua`) of `permits` of `limit`. `fair`:
    /// `Some(wait)` for a fair-handoff client (the oldest queued acquisition is protected;
    /// `wait`: a busy attempt queues this one), `None` otherwise. The label is ARGV[10], the
    /// record flag ARGV[9].
    pub(crate) async fn sem_acquire<C: ConnectionLike>(
        &self,
        conn: &mut C,
        permits: u32,
        limit: u32,
        fair: Option<bool>,
    ) -> Result<SemAcquireReply, Error> {
        let keys = &self.keys;
        let mut call = on_hash(&scripts().sem_acquire, keys);
        call.key(&keys.fence).key(keys.op(&self.holder));
        if fair.is_some() {
            call.key(keys.queue()).key(keys.sem_waiting());
        }
        call.arg(self.holder.as_ref())
            .arg(permits)
            .arg(limit)
            .arg(millis(self.lease))
            .arg(millis(self.op_ttl))
            .arg(self.pubsub.script_arg())
            .arg(fair == Some(true))
            .arg(expiry_arg(self.field_expiry))
            .arg(self.recorded)
            .arg(self.label.as_deref());
        let reply = invoke(conn, &call).await?;
        let permits_from = |raw: i64| permits_from("sem_acquire", raw.max(0));
        match reply.as_slice() {
            [1, token, permits, limit, free, left @ ..] if left.len() <= 1 => {
                Ok(SemAcquireReply::Acquired {
                    token: token_from(*token)?,
                    permits: permits_from(*permits)?,
                    limit: permits_from(*limit)?,
                    free: permits_from(*free)?,
                    lease_left: left.first().and_then(|left| pttl_from(*left)),
                })
            }
            [0, wait, free, limit] => Ok(SemAcquireReply::Busy {
                wait: pttl_from(*wait),
                free: permits_from(*free)?,
                limit: permits_from(*limit)?,
            }),
            [-2] => Ok(SemAcquireReply::Cancelled),
            [-3, limit] => Ok(SemAcquireReply::OverLimit {
                limit: permits_from(*limit)?,
            }),
            other => Err(unexpected("sem_acquire", other)),
        }
    }
}

#[cfg(test)]
impl<'a> HoldAcquire<'a> {
    /// The request of these parts, in the order of its fields.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn of(
        keys: &'a LockKeys,
        holder: &'a str,
        lease: Duration,
        op_ttl: Duration,
        pubsub: PubSub,
        field_expiry: bool,
        label: Option<&'a str>,
        recorded: bool,
    ) -> Self {
        HoldAcquire {
            keys: Cow::Borrowed(keys),
            holder: Cow::Borrowed(holder),
            lease,
            op_ttl,
            pubsub,
            field_expiry,
            label: label.map(Cow::Borrowed),
            recorded,
        }
    }
}

/// An operator sets the recorded limit of a semaphore in use (`sem_limit.lua`); the limit it
/// had, or `None` when the semaphore is not in use (nothing recorded).
pub(crate) async fn sem_limit<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    limit: u32,
    pubsub: PubSub,
) -> Result<Option<u32>, Error> {
    let mut call = on_hash(&scripts().sem_limit, keys);
    call.arg(limit).arg(pubsub.script_arg());
    match invoke(conn, &call).await?.as_slice() {
        [1, old] => permits_from("sem_limit", *old).map(Some),
        [0] => Ok(None),
        other => Err(unexpected("sem_limit", other)),
    }
}

/// The scripts' word for how a new semaphore keeps its deadlines (`lib/sem_holds.lua`).
pub(crate) fn expiry_arg(field_expiry: bool) -> &'static str {
    if field_expiry {
        "fields"
    } else {
        "zset"
    }
}

#[cfg(test)]
#[path = "hold_label_tests.rs"]
mod label_tests;
