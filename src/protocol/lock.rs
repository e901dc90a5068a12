//! The plain lock's scripts: acquire (and its fair-mode variant), re-enter, release (and
//! the fair release and leave), extend, renew, cancel. `reenter` and `cancel` serve every kind
//! of hold: they pick the script of the keys' layout.

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::{
    count_from, flag, millis, owner_reply, scripts, semaphore, token_from, unexpected, CancelKind,
    CancelReply, LockKeys, OwnerReply, PubSub,
};
use crate::base::error::Error;
use crate::base::token::FencingToken;

/// Outcome of `acquire.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// The holder holds the lock with this token (fresh, or a replay of the same request).
    Acquired { token: FencingToken, count: u64 },
    /// Another holder has it; its lease ends after `pttl` (`None`: the key has no expiry).
    Held { pttl: Option<Duration> },
    /// This acquisition was cancelled before it ran.
    Cancelled,
}

/// Outcome of `reenter.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EnterReply {
    Entered { token: FencingToken, count: u64 },
    NotHeld,
    Cancelled,
}

/// `acquire.lua` without a label.
#[cfg(test)]
pub(crate) async fn acquire<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    lease: Duration,
    op_ttl: Duration,
) -> Result<AcquireReply, Error> {
    acquire_labelled(conn, keys, holder, lease, op_ttl, None, false).await
}

/// `acquire.lua`; `label`, when given, is stored with the hold (ARGV[5]); `recorded`: an
/// earlier send of this acquisition may still arrive, so this one leaves an op record
/// (ARGV[4], [`crate::engine::pending::Sends`]).
pub(crate) async fn acquire_labelled<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    lease: Duration,
    op_ttl: Duration,
    label: Option<&str>,
    recorded: bool,
) -> Result<AcquireReply, Error> {
    let mut call = scripts().acquire.prepare_invoke();
    call.key(&keys.lock)
        .key(&keys.fence)
        .key(keys.op(holder))
        .arg(holder)
        .arg(millis(lease))
        .arg(millis(op_ttl))
        .arg(flag(recorded));
    if let Some(label) = label {
        call.arg(label);
    }
    let reply: Vec<i64> = call.invoke_async(conn).await.map_err(Error::from_reply)?;
    acquire_reply("acquire", &reply)
}

/// What a fair-mode client adds to an acquire attempt (`acquire_fair.lua`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FairAttempt<'a> {
    /// The client's id: its queue entry, and what a reservation names.
    pub(crate) client: &'a str,
    /// A waiter (queue the client on failure), not a `try_acquire`.
    pub(crate) enqueue: bool,
    /// How long past the holder's lease the queue outlives the last failed attempt.
    pub(crate) queue_slack: Duration,
}

/// One acquire attempt: `acquire.lua`, or `acquire_fair.lua` for a fair-mode client; `label`,
/// when given, is stored with the hold; `recorded`: this send leaves an op record.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn acquire_attempt<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    lease: Duration,
    op_ttl: Duration,
    fair: Option<FairAttempt<'_>>,
    label: Option<&str>,
    recorded: bool,
) -> Result<AcquireReply, Error> {
    match fair {
        None => acquire_labelled(conn, keys, holder, lease, op_ttl, label, recorded).await,
        Some(fair) => acquire_fair(conn, keys, holder, lease, op_ttl, fair, label, recorded).await,
    }
}

/// `acquire.lua` with the fair-handoff queue: claims a reservation made for `fair.client`,
/// queues the client when the lock is held (waiters only).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn acquire_fair<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    lease: Duration,
    op_ttl: Duration,
    fair: FairAttempt<'_>,
    label: Option<&str>,
    recorded: bool,
) -> Result<AcquireReply, Error> {
    let mut call = scripts().acquire_fair.prepare_invoke();
    call.key(&keys.lock)
        .key(&keys.fence)
        .key(keys.op(holder))
        .key(keys.queue())
        .arg(holder)
        .arg(millis(lease))
        .arg(millis(op_ttl))
        .arg(fair.client)
        .arg(flag(fair.enqueue))
        .arg(millis(fair.queue_slack))
        .arg(flag(recorded));
    if let Some(label) = label {
        call.arg(label);
    }
    let reply: Vec<i64> = call.invoke_async(conn).await.map_err(Error::from_reply)?;
    acquire_reply("acquire_fair", &reply)
}

/// `release.lua` that hands a freed lock to the first queued client (`release_fair.lua`);
/// `requeue`: the releasing client's id and the queue's lifetime, when it has more waiters.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn release_fair<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    op_id: &str,
    op_ttl: Duration,
    pubsub: PubSub,
    grace: Duration,
    requeue: Option<(&str, Duration)>,
) -> Result<OwnerReply, Error> {
    let reply: Vec<i64> = scripts()
        .release_fair
        .key(&keys.lock)
        .key(keys.op(op_id))
        .key(keys.op(holder))
        .key(keys.queue())
        .arg(holder)
        .arg(millis(op_ttl))
        .arg(pubsub.script_arg())
        .arg(op_id)
        .arg(millis(grace))
        .arg(requeue.map_or("", |(client, _)| client))
        .arg(requeue.map_or(0, |(_, life)| millis(life)))
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    owner_reply("release_fair", &reply)
}

/// Outcome of `leave_fair.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaveReply {
    /// The client was neither queued nor reserved for.
    Absent,
    /// Its queue entry was removed.
    Dequeued,
    /// The lock was reserved for it and has been passed on (or freed).
    PassedOn,
}

/// Takes `client` off the lock's fair queue and passes on a reservation made for it
/// (`leave_fair.lua`): its last waiter gave up.
pub(crate) async fn leave_fair<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    client: &str,
    grace: Duration,
    pubsub: PubSub,
) -> Result<LeaveReply, Error> {
    let reply: Vec<i64> = scripts()
        .leave_fair
        .key(&keys.lock)
        .key(keys.queue())
        .arg(client)
        .arg(millis(grace))
        .arg(pubsub.script_arg())
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    match reply.as_slice() {
        [0] => Ok(LeaveReply::Absent),
        [1] => Ok(LeaveReply::Dequeued),
        [2] => Ok(LeaveReply::PassedOn),
        other => Err(unexpected("leave_fair", other)),
    }
}

pub(super) fn acquire_reply(script: &str, reply: &[i64]) -> Result<AcquireReply, Error> {
    match reply {
        [1, token, count] => Ok(AcquireReply::Acquired {
            token: token_from(*token)?,
            count: count_from(*count)?,
        }),
        [0, pttl] => Ok(AcquireReply::Held {
            pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
        }),
        [-2] => Ok(AcquireReply::Cancelled),
        other => Err(unexpected(script, other)),
    }
}

pub(crate) async fn reenter<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    op_id: &str,
    op_ttl: Duration,
) -> Result<EnterReply, Error> {
    let script = if keys.has_hold_leases() {
        &scripts().hold_reenter
    } else {
        &scripts().reenter
    };
    let mut call = script.prepare_invoke();
    call.key(&keys.lock);
    // A hold with a lease of its own (a read-write lock's) is checked against its deadline.
    if keys.has_hold_leases() {
        call.key(keys.sem_leases());
    }
    call.key(keys.op(op_id)).arg(holder).arg(millis(op_ttl));
    let reply: Vec<i64> = call.invoke_async(conn).await.map_err(Error::from_reply)?;
    match reply.as_slice() {
        [1, token, count] => Ok(EnterReply::Entered {
            token: token_from(*token)?,
            count: count_from(*count)?,
        }),
        [-1] => Ok(EnterReply::NotHeld),
        [-2] => Ok(EnterReply::Cancelled),
        other => Err(unexpected("reenter", other)),
    }
}

pub(crate) async fn release<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    op_id: &str,
    op_ttl: Duration,
    pubsub: PubSub,
) -> Result<OwnerReply, Error> {
    if keys.has_hold_leases() {
        return semaphore::sem_release(conn, keys, holder, op_id, op_ttl, pubsub).await;
    }
    let reply: Vec<i64> = scripts()
        .release
        .key(&keys.lock)
        .key(keys.op(op_id))
        .key(keys.op(holder))
        .arg(holder)
        .arg(millis(op_ttl))
        .arg(pubsub.script_arg())
        .arg(op_id)
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    owner_reply("release", &reply)
}

pub(crate) async fn extend<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    lease: Duration,
) -> Result<OwnerReply, Error> {
    let reply: Vec<i64> = scripts()
        .extend
        .key(&keys.lock)
        .arg(holder)
        .arg(millis(lease))
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    owner_reply("extend", &reply)
}

pub(crate) async fn cancel<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    op_id: &str,
    kind: CancelKind,
    op_ttl: Duration,
    pubsub: PubSub,
) -> Result<CancelReply, Error> {
    if keys.has_hold_leases() {
        return semaphore::sem_cancel(conn, keys, holder, op_id, kind, op_ttl, pubsub).await;
    }
    let reply: Vec<i64> = scripts()
        .cancel
        .key(&keys.lock)
        .key(keys.op(op_id))
        .arg(holder)
        .arg(millis(op_ttl))
        .arg(match kind {
            CancelKind::Acquire => "acquire",
            CancelKind::Reenter => "reenter",
        })
        .arg(pubsub.script_arg())
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    cancel_reply("cancel", &reply)
}

/// The reply of `cancel.lua` or `sem_cancel.lua`.
pub(super) fn cancel_reply(script: &str, reply: &[i64]) -> Result<CancelReply, Error> {
    match reply {
        [1, remaining] => Ok(CancelReply::Undone {
            remaining: count_from(*remaining)?,
        }),
        [0] => Ok(CancelReply::NotRun),
        other => Err(unexpected(script, other)),
    }
}

/// Renews a batch of leases in one call; one `bool` per `(keys, holder)` pair, `true` when
/// that holder still held that lock and its lease was set again. A batch is all locks or all
/// semaphore holds (the watchdog groups them), whose script it picks.
pub(crate) async fn renew<C: ConnectionLike>(
    conn: &mut C,
    batch: &[(&LockKeys, &str)],
    lease: Duration,
) -> Result<Vec<bool>, Error> {
    if batch
        .first()
        .is_some_and(|(keys, _)| keys.has_hold_leases())
    {
        return semaphore::sem_renew(conn, batch, lease).await;
    }
    let script = &scripts().renew;
    let mut call = script.prepare_invoke();
    call.arg(millis(lease));
    for (keys, holder) in batch {
        call.key(&keys.lock).arg(*holder);
    }
    let reply: Vec<i64> = call.invoke_async(conn).await.map_err(Error::from_reply)?;
    if reply.len() != batch.len() {
        return Err(unexpected("renew", &reply));
    }
    Ok(reply.into_iter().map(|r| r == 1).collect())
}
