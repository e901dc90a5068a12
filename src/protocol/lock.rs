//! The plain lock's scripts: acquire (and its fair-mode variant), re-enter, release (and
//! the fair release and leave), extend, renew, cancel. `reenter` and `cancel` serve every kind
//! of hold: they pick the script of the keys' layout.

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::{
    count_from, invoke, millis, on_hash, owner_reply, pick, pttl_from, scripts, token_from,
    unexpected, CancelKind, CancelReply, LockKeys, OwnerReply, PubSub,
};
use crate::base::error::Error;
use crate::base::token::FencingToken;

/// Outcome of `acquire.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// The holder holds the lock with this token (fresh, or a replay of the same request).
    /// `lease_left`: on a replay, what is left of the hold's lease, which began before this
    /// send (`None`: a fresh hold, whose lease began with this send; or no expiry).
    Acquired {
        token: FencingToken,
        count: u64,
        lease_left: Option<Duration>,
    },
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
    acquire_attempt(conn, keys, holder, lease, op_ttl, None, None, false).await
}

/// `acquire.lua` with a label and the op-record flag (script-contract tests).
#[cfg(test)]
pub(crate) async fn acquire_labelled<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    lease: Duration,
    op_ttl: Duration,
    label: Option<&str>,
    recorded: bool,
) -> Result<AcquireReply, Error> {
    acquire_attempt(conn, keys, holder, lease, op_ttl, None, label, recorded).await
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

/// One acquire attempt: `acquire.lua`, or `acquire_fair.lua` for a fair-mode client, which
/// claims a reservation made for `fair.client` and queues the client when the lock is held
/// (waiters only); `label`, when given, is stored with the hold; `recorded`: this send leaves
/// an op record.
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
    let (script, name) = pick!(fair.is_some(), acquire, acquire_fair);
    let mut call = script.key(&keys.lock);
    call.key(&keys.fence).key(keys.op(holder));
    call.arg(holder).arg(millis(lease)).arg(millis(op_ttl));
    // The fair script also takes the queue after the other keys, and the client's part before
    // the record flag (a call's keys and arguments are lists of their own).
    if let Some(fair) = fair {
        call.key(keys.queue())
            .arg(fair.client)
            .arg(fair.enqueue)
            .arg(millis(fair.queue_slack));
    }
    call.arg(recorded).arg(label);
    match invoke(conn, &call).await?.as_slice() {
        [1, token, count, rest @ ..] if rest.len() <= 1 => Ok(AcquireReply::Acquired {
            token: token_from(*token)?,
            count: count_from(*count)?,
            lease_left: rest.first().and_then(|pttl| pttl_from(*pttl)),
        }),
        [0, pttl] => Ok(AcquireReply::Held {
            pttl: pttl_from(*pttl),
        }),
        [-2] => Ok(AcquireReply::Cancelled),
        other => Err(unexpected(name, other)),
    }
}

/// `acquire.lua` with the fair-handoff queue ([`acquire_attempt`] of a fair-mode client).
#[cfg(test)]
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
    acquire_attempt(
        conn,
        keys,
        holder,
        lease,
        op_ttl,
        Some(fair),
        label,
        recorded,
    )
    .await
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
    // A lock's release call, then the queue and what the fair release adds.
    let mut call = release_call(&scripts().release_fair, keys, holder, op_id, op_ttl, pubsub);
    call.key(keys.queue())
        .arg(millis(grace))
        .arg(requeue.map_or("", |(client, _)| client))
        .arg(requeue.map_or(0, |(_, life)| millis(life)));
    owner_reply("release_fair", &invoke(conn, &call).await?)
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
    let mut call = scripts().leave_fair.key(&keys.lock);
    call.key(keys.queue())
        .arg(client)
        .arg(millis(grace))
        .arg(pubsub.script_arg());
    match invoke(conn, &call).await?.as_slice() {
        [0] => Ok(LeaveReply::Absent),
        [1] => Ok(LeaveReply::Dequeued),
        [2] => Ok(LeaveReply::PassedOn),
        other => Err(unexpected("leave_fair", other)),
    }
}

pub(crate) async fn reenter<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    op_id: &str,
    op_ttl: Duration,
) -> Result<EnterReply, Error> {
    let (script, name) = pick!(keys.has_hold_leases(), reenter, hold_reenter);
    // A hold with a lease of its own (a read-write lock's) is checked against its deadline.
    let mut call = on_hash(script, keys);
    call.key(keys.op(op_id)).arg(holder).arg(millis(op_ttl));
    match invoke(conn, &call).await?.as_slice() {
        [1, token, count] => Ok(EnterReply::Entered {
            token: token_from(*token)?,
            count: count_from(*count)?,
        }),
        [-1] => Ok(EnterReply::NotHeld),
        [-2] => Ok(EnterReply::Cancelled),
        other => Err(unexpected(name, other)),
    }
}

/// One send of the release of one entry of `holder`'s hold as operation `op_id`:
/// `release.lua` for a lock, `sem_release.lua` for a semaphore's or read-write lock's hold.
/// `read_record`: the script reads the op record a copy of this release would have left and
/// replays it; `false` only where no copy can have left one (`release.lua` and
/// `sem_release.lua` ARGV[5]: the first send of a release of a hold never re-entered).
pub(crate) async fn release<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    op_id: &str,
    op_ttl: Duration,
    pubsub: PubSub,
    read_record: bool,
) -> Result<OwnerReply, Error> {
    let holds = keys.has_hold_leases();
    let (script, name) = pick!(holds, release, sem_release);
    let mut call = release_call(script, keys, holder, op_id, op_ttl, pubsub);
    call.arg(read_record);
    owner_reply(name, &invoke(conn, &call).await?)
}

/// The call of `script` that releases one entry of `holder`'s hold as operation `op_id`:
/// `release.lua` for a lock's hash, `sem_release.lua` for a hold's (the semaphore's and the
/// read-write lock's), or a fair release or handoff script, which takes more keys and
/// arguments after these.
pub(super) fn release_call(
    script: &'static redis::Script,
    keys: &LockKeys,
    holder: &str,
    op_id: &str,
    op_ttl: Duration,
    pubsub: PubSub,
) -> redis::ScriptInvocation<'static> {
    let mut call = on_hash(script, keys);
    call.key(keys.op(op_id)).key(keys.op(holder));
    // A read-write lock's release also tells its waiting writers.
    if let Some(writers) = keys.rw_writers() {
        call.key(writers);
    }
    call.arg(holder)
        .arg(millis(op_ttl))
        .arg(pubsub.script_arg())
        .arg(op_id);
    call
}

pub(crate) async fn extend<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    lease: Duration,
) -> Result<OwnerReply, Error> {
    let mut call = scripts().extend.key(&keys.lock);
    call.arg(holder).arg(millis(lease));
    owner_reply("extend", &invoke(conn, &call).await?)
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
    if !keys.has_hold_leases() {
        let mut call = scripts().cancel.key(&keys.lock);
        call.key(keys.op(op_id))
            .arg(holder)
            .arg(millis(op_ttl))
            .arg(kind.script_arg())
            .arg(pubsub.script_arg());
        return cancel_reply("cancel", &invoke(conn, &call).await?);
    }
    let mut call = on_hash(&scripts().sem_cancel, keys);
    call.key(keys.op(op_id));
    // A writer of a read-write lock that gave up waiting also takes its mark back; a
    // semaphore's waiter its fair-queue entry.
    match keys.rw_writers() {
        Some(writers) => call.key(writers),
        None => call.key(keys.queue()).key(keys.sem_waiting()),
    };
    call.arg(holder)
        .arg(millis(op_ttl))
        .arg(pubsub.script_arg())
        .arg(kind.script_arg());
    cancel_reply("sem_cancel", &invoke(conn, &call).await?)
}

/// The reply of `cancel.lua` or `sem_cancel.lua`.
fn cancel_reply(script: &str, reply: &[i64]) -> Result<CancelReply, Error> {
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
    let holds = batch
        .first()
        .is_some_and(|(keys, _)| keys.has_hold_leases());
    let (script, name) = pick!(holds, renew, sem_renew);
    let mut call = script.arg(millis(lease));
    for (keys, holder) in batch {
        call.key(&keys.lock);
        // A hold's deadline is also in its lease zset.
        if holds {
            call.key(keys.sem_leases());
        }
        call.arg(*holder);
    }
    // One reply per lease: 1 when its holder still held it and the lease was set again.
    let reply = invoke(conn, &call).await?;
    if reply.len() != batch.len() {
        return Err(unexpected(name, &reply));
    }
    Ok(reply.into_iter().map(|r| r == 1).collect())
}
