//! The raw lock protocol: one function per Lua script, typed replies, no policy.
//!
//! This layer knows keys, holder ids and operation ids; it does not know about guards, leases
//! as deadlines, waiting or retries. Those live in the safe API above it (`client`, `lock`,
//! `guard`), the way `lock_api` separates a raw mutex from its guards.

pub(crate) mod batch;
#[cfg(fencelock_negative_controls)]
pub(crate) mod controls;
mod handoff;
mod idempotency;
mod job;
pub(crate) mod keys;
mod pubsub;
mod run_record;
pub(crate) mod rwlock;
mod scripts;
pub(crate) mod semaphore;
pub(crate) mod server;
mod waits;

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::base::error::{Error, Superseded};
use crate::base::token::FencingToken;
pub(crate) use handoff::{
    release_handing_off, sem_release_handing_off, Candidate, HandoffReply, Room,
};
pub(crate) use idempotency::{
    idem_begin, idem_finish, idem_read, KeyArgs, KeyBeginReply, KeyFinish, KeyRead, KeyReadMode,
    KeyRecord,
};
pub(crate) use job::{
    job_begin, job_finish, job_read, BeginReply, JobRead, RunOutcome, TickArgs, TickRecord,
};
pub(crate) use keys::{LockKeys, ResourceKeys};
pub(crate) use pubsub::{PubSub, ReleaseMessage};
pub(crate) use run_record::{FinishReply, RunnerDeathArg};
use scripts::Scripts;
pub(crate) use waits::{forget_wait, record_wait, WaitArgs};

/// The scripts for the current call: the production ones, unless the calling client was built
/// with a negative control (test builds only, `--cfg fencelock_negative_controls`).
fn scripts() -> &'static Scripts {
    #[cfg(fencelock_negative_controls)]
    if let Some(control) = controls::current() {
        return controls::scripts_for(control);
    }
    scripts::production()
}

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

/// Outcome of `release.lua`, `extend.lua` and the renewal of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnerReply {
    /// Done; for a release, the entries that remain (0: the lock is free).
    Done {
        remaining: u64,
    },
    NotHeld,
}

/// Outcome of `cancel.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelReply {
    /// The operation had run and was undone.
    Undone { remaining: u64 },
    /// The operation had not run, and now never will.
    NotRun,
}

/// Which operation `cancel.lua` undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelKind {
    Acquire,
    Reenter,
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

fn acquire_reply(script: &str, reply: &[i64]) -> Result<AcquireReply, Error> {
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

/// Outcome of `acquire_all.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireAllReply {
    /// Every member is held by its holder; one token per member, in the order given.
    Acquired { tokens: Vec<FencingToken> },
    /// Member `index` (0-based, in the order given) is held by another holder; nothing changed.
    Held {
        index: usize,
        pttl: Option<Duration>,
    },
    /// The set was cancelled, or this is a late copy of one whose hold has ended.
    Cancelled,
}

/// Acquires every `(keys, holder id)` member or none, in one script (all keys must be
/// reachable by one script call: standalone, or one cluster slot); `label`, when given, is
/// stored with every member's hold.
pub(crate) async fn acquire_all<C: ConnectionLike>(
    conn: &mut C,
    members: &[(&LockKeys, &str)],
    lease: Duration,
    op_ttl: Duration,
    label: Option<&str>,
) -> Result<AcquireAllReply, Error> {
    let mut call = scripts().acquire_all.prepare_invoke();
    call.arg(millis(lease)).arg(millis(op_ttl));
    for (keys, holder) in members {
        call.key(&keys.lock)
            .key(&keys.fence)
            .key(keys.op(holder))
            .arg(*holder);
    }
    if let Some(label) = label {
        call.arg(label);
    }
    let reply: Vec<i64> = call.invoke_async(conn).await.map_err(Error::from_reply)?;
    match reply.as_slice() {
        [1, tokens @ ..] if tokens.len() == members.len() => Ok(AcquireAllReply::Acquired {
            tokens: tokens
                .iter()
                .map(|t| token_from(*t))
                .collect::<Result<_, _>>()?,
        }),
        [0, index, pttl] => match usize::try_from(*index) {
            Ok(index @ 1..) if index <= members.len() => Ok(AcquireAllReply::Held {
                index: index - 1,
                pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
            }),
            _ => Err(unexpected("acquire_all", &reply)),
        },
        [-2] => Ok(AcquireAllReply::Cancelled),
        other => Err(unexpected("acquire_all", other)),
    }
}

/// Releases each `(keys, holder id, op id)` member once, in one script; one reply per member.
pub(crate) async fn release_all<C: ConnectionLike>(
    conn: &mut C,
    members: &[(&LockKeys, &str, &str)],
    op_ttl: Duration,
) -> Result<Vec<OwnerReply>, Error> {
    let mut call = scripts().release_all.prepare_invoke();
    call.arg(millis(op_ttl));
    for (keys, holder, op) in members {
        call.key(&keys.lock)
            .key(keys.op(op))
            .key(keys.op(holder))
            .arg(*holder)
            .arg(*op);
    }
    let reply: Vec<i64> = call.invoke_async(conn).await.map_err(Error::from_reply)?;
    if reply.len() != members.len() {
        return Err(unexpected("release_all", &reply));
    }
    reply
        .into_iter()
        .map(|r| match r {
            -1 => Ok(OwnerReply::NotHeld),
            n => Ok(OwnerReply::Done {
                remaining: count_from(n)?,
            }),
        })
        .collect()
}

/// `WAIT numreplicas timeout` on `conn`: how many replicas have acknowledged every write this
/// connection made so far. Blocks the connection for up to `timeout`.
pub(crate) async fn wait_replicas<C: ConnectionLike>(
    conn: &mut C,
    replicas: u32,
    timeout: Duration,
) -> Result<u32, Error> {
    let acked: i64 = redis::cmd("WAIT")
        .arg(replicas)
        .arg(millis(timeout))
        .query_async(conn)
        .await?;
    u32::try_from(acked).map_err(|_| Error::Protocol(format!("WAIT answered {acked}")))
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
    match reply.as_slice() {
        [1, remaining] => Ok(CancelReply::Undone {
            remaining: count_from(*remaining)?,
        }),
        [0] => Ok(CancelReply::NotRun),
        other => Err(unexpected("cancel", other)),
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

/// One write to a fenced resource.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Write<'a> {
    Set(&'a [u8]),
    IncrBy(i64),
    SetFields(&'a [(&'a [u8], &'a [u8])]),
    Push(&'a [&'a [u8]]),
    Delete,
}

/// Outcome of `fenced_write.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteReply {
    /// Applied; the number the write produced (new value, new length) or 0.
    Accepted(i64),
    Stale {
        latest: FencingToken,
        by: Superseded,
    },
}

/// What a fenced script's refusal says refused it: 1, the shared mark; 2, the retention's
/// floor (no mark left); 0, the exclusive mark.
fn superseded_by(code: i64) -> Superseded {
    match code {
        1 => Superseded::SharedRead,
        2 => Superseded::Expired,
        _ => Superseded::WroteOrClaimed,
    }
}

pub(crate) async fn fenced_write<C: ConnectionLike>(
    conn: &mut C,
    keys: &ResourceKeys,
    token: FencingToken,
    op_id: &str,
    op_ttl: Duration,
    write: Write<'_>,
    retention: Duration,
) -> Result<WriteReply, Error> {
    let mut call = scripts().fenced_write.prepare_invoke();
    call.key(&keys.data)
        .key(&keys.mark)
        .key(keys.op(op_id))
        .key(&keys.shared)
        .arg(token.get())
        .arg(millis(op_ttl));
    let retention = millis(retention);
    match write {
        Write::Set(value) => call.arg("set").arg(retention).arg(value),
        Write::IncrBy(delta) => call.arg("incrby").arg(retention).arg(delta),
        Write::SetFields(fields) => {
            call.arg("hset").arg(retention);
            for (field, value) in fields {
                call.arg(*field).arg(*value);
            }
            &mut call
        }
        Write::Push(items) => {
            call.arg("rpush").arg(retention);
            for item in items {
                call.arg(*item);
            }
            &mut call
        }
        Write::Delete => call.arg("del").arg(retention),
    };
    let reply: Vec<i64> = call.invoke_async(conn).await.map_err(Error::from_reply)?;
    match reply.as_slice() {
        [1, result] => Ok(WriteReply::Accepted(*result)),
        [0, latest, by] => Ok(WriteReply::Stale {
            latest: token_from(*latest)?,
            by: superseded_by(*by),
        }),
        other => Err(unexpected("fenced_write", other)),
    }
}

/// One claiming read of a fenced resource.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Read<'a> {
    Get,
    Field(&'a [u8]),
    Items,
    Claim,
}

/// How a fenced read fences: a claim (a holder alone in its critical section) or a shared read
/// (holders that share a hold, such as the readers of a read-write lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadMode {
    Claim,
    Shared,
}

/// Outcome of `fenced_read.lua`: the value read (nil for a missing key or field), or the newer
/// token that has claimed the resource.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ReadReply {
    Read(redis::Value),
    Stale {
        latest: FencingToken,
        by: Superseded,
    },
}

pub(crate) async fn fenced_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &ResourceKeys,
    token: FencingToken,
    read: Read<'_>,
    mode: ReadMode,
    retention: Duration,
) -> Result<ReadReply, Error> {
    let mut call = scripts().fenced_read.prepare_invoke();
    call.key(&keys.data)
        .key(&keys.mark)
        .key(&keys.shared)
        .arg(token.get());
    match read {
        Read::Get => call.arg("get").arg(""),
        Read::Field(field) => call.arg("hget").arg(field),
        Read::Items => call.arg("lrange").arg(""),
        Read::Claim => call.arg("claim").arg(""),
    };
    call.arg(match mode {
        ReadMode::Claim => "claim",
        ReadMode::Shared => "shared",
    })
    .arg(millis(retention));
    let reply: Vec<redis::Value> = call.invoke_async(conn).await.map_err(Error::from_reply)?;
    let mut reply = reply.into_iter();
    match (reply.next(), reply.next(), reply.next()) {
        (Some(redis::Value::Int(1)), Some(value), None) => Ok(ReadReply::Read(value)),
        (
            Some(redis::Value::Int(0)),
            Some(redis::Value::Int(latest)),
            Some(redis::Value::Int(by)),
        ) => Ok(ReadReply::Stale {
            latest: token_from(latest)?,
            by: superseded_by(by),
        }),
        other => Err(Error::Protocol(format!(
            "fenced_read.lua answered {other:?}"
        ))),
    }
}

/// Outcome of `force_release.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ForceReleaseReply {
    /// The hash was deleted and waiters were woken; the fence counter is now `fence`.
    Evicted {
        /// The evicted holder's token (`None` only for a hash without a token field).
        token: Option<FencingToken>,
        fence: u64,
        /// The evicted holder id (empty if the hash had no holder field) and its count.
        holder: Vec<u8>,
        count: u64,
    },
    /// Nobody held the lock.
    NotHeld,
    /// Held, but with another token than the expected one; nothing changed.
    OtherToken { token: Option<FencingToken> },
}

/// Evicts the holder of a lock (any holder, or only the one with `expected` token), raises the
/// slot's fence counter to at least the evicted token and wakes waiters.
pub(crate) async fn force_release<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    expected: Option<FencingToken>,
) -> Result<ForceReleaseReply, Error> {
    let reply: Vec<redis::Value> = scripts()
        .force_release
        .key(&keys.lock)
        .key(&keys.fence)
        .arg(expected.map(|t| t.get().to_string()).unwrap_or_default())
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    use redis::Value::{BulkString, Int};
    match reply.as_slice() {
        [Int(1), Int(token), Int(fence), BulkString(holder), Int(count)] => {
            Ok(ForceReleaseReply::Evicted {
                token: u64::try_from(*token).ok().and_then(FencingToken::new),
                fence: u64::try_from(*fence)
                    .map_err(|_| Error::Protocol(format!("invalid fence counter {fence}")))?,
                holder: holder.clone(),
                count: count_from(*count)?,
            })
        }
        [Int(0)] => Ok(ForceReleaseReply::NotHeld),
        [Int(-1), Int(token)] => Ok(ForceReleaseReply::OtherToken {
            token: u64::try_from(*token).ok().and_then(FencingToken::new),
        }),
        other => Err(Error::Protocol(format!(
            "force_release.lua answered {other:?}"
        ))),
    }
}

/// Outcome of `permissions.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PermissionsReply {
    /// The user may run every command the scripts send, on these keys and channel.
    Granted,
    /// The commands the user may not run on them.
    Refused(Vec<String>),
}

/// Asks the server which of the protocol's commands the calling user may not run on the keys
/// of `keys` (and their release channel), the fair-handoff queue's commands included when
/// `fair`. Writes nothing.
pub(crate) async fn permissions<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    pubsub: PubSub,
    fair: bool,
    holds: Option<bool>,
) -> Result<PermissionsReply, Error> {
    let refused: Vec<String> = scripts()
        .permissions
        .key(&keys.lock)
        .key(&keys.fence)
        .key(keys.op("permissions"))
        .key(keys.queue())
        .arg(pubsub.script_arg())
        .arg(flag(fair))
        .arg(match holds {
            None => "",
            Some(false) => "holds",
            Some(true) => "holds+fields",
        })
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    Ok(if refused.is_empty() {
        PermissionsReply::Granted
    } else {
        PermissionsReply::Refused(refused)
    })
}

/// Records `metadata` next to the term of the election leader `holder` and publishes
/// `elected` (`announce.lua`); [`OwnerReply::NotHeld`] when `holder` does not hold the
/// election's lock with `term` any more.
pub(crate) async fn announce<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    term: FencingToken,
    metadata: &[u8],
    pubsub: PubSub,
) -> Result<OwnerReply, Error> {
    let reply: Vec<i64> = scripts()
        .announce
        .key(&keys.lock)
        .arg(holder)
        .arg(term.get())
        .arg(metadata)
        .arg(pubsub.script_arg())
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    owner_reply("announce", &reply)
}

/// The leader of an election as `leader.lua` read it: id, term and metadata of one hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaderRecord {
    pub(crate) holder: String,
    pub(crate) term: FencingToken,
    pub(crate) metadata: Vec<u8>,
}

/// Outcome of `leader.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaderReply {
    /// The leader, when one has recorded its metadata.
    pub(crate) leader: Option<LeaderRecord>,
    /// When the election's lock is held (by a leader or a winner not yet announced): the time
    /// left of its lease (`None` inside: the key has no expiry).
    pub(crate) lease_left: Option<Option<Duration>>,
}

/// Reads who leads the election whose lock is `keys` (`leader.lua`); writes nothing.
pub(crate) async fn leader<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
) -> Result<LeaderReply, Error> {
    let reply: Vec<redis::Value> = scripts()
        .leader
        .key(&keys.lock)
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    use redis::Value::{BulkString, Int};
    let pttl = |raw: i64| u64::try_from(raw).ok().map(Duration::from_millis);
    match reply.as_slice() {
        [] => Ok(LeaderReply {
            leader: None,
            lease_left: None,
        }),
        [Int(0), Int(left)] => Ok(LeaderReply {
            leader: None,
            lease_left: Some(pttl(*left)),
        }),
        [Int(1), BulkString(holder), Int(term), BulkString(metadata), Int(left)] => {
            Ok(LeaderReply {
                leader: Some(LeaderRecord {
                    holder: String::from_utf8(holder.clone()).map_err(|_| {
                        Error::Protocol("leader.lua answered a holder id that is not UTF-8".into())
                    })?,
                    term: token_from(*term)?,
                    metadata: metadata.clone(),
                }),
                lease_left: Some(pttl(*left)),
            })
        }
        other => Err(Error::Protocol(format!("leader.lua answered {other:?}"))),
    }
}

/// A lock's `~token` and `PTTL` as a read script answers them (0: no token; -2: no key, -1: no
/// expiry): the holder's token, and when held, the time left of its lease (`None`: no expiry).
fn lock_state(token: i64, pttl: i64) -> (Option<FencingToken>, Option<Option<Duration>>) {
    let lock_token = u64::try_from(token).ok().and_then(FencingToken::new);
    let lease_left = match pttl {
        -2 => None,
        -1 => Some(None),
        left => Some(u64::try_from(left).ok().map(Duration::from_millis)),
    };
    (lock_token, lease_left)
}

fn ms_from(script: &str, raw: i64) -> Result<u64, Error> {
    u64::try_from(raw).map_err(|_| Error::Protocol(format!("{script}.lua answered the time {raw}")))
}

fn owner_reply(script: &str, reply: &[i64]) -> Result<OwnerReply, Error> {
    match reply {
        [1] => Ok(OwnerReply::Done { remaining: 0 }),
        [1, remaining] => Ok(OwnerReply::Done {
            remaining: count_from(*remaining)?,
        }),
        [-1] => Ok(OwnerReply::NotHeld),
        other => Err(unexpected(script, other)),
    }
}

/// A script's yes/no argument.
fn flag(yes: bool) -> &'static str {
    if yes {
        "1"
    } else {
        "0"
    }
}

/// Milliseconds for a script argument; callers validated that leases are whole, positive
/// milliseconds well inside `u64`.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn token_from(raw: i64) -> Result<FencingToken, Error> {
    u64::try_from(raw)
        .ok()
        .and_then(FencingToken::new)
        .ok_or_else(|| Error::Protocol(format!("invalid fencing token {raw}")))
}

fn count_from(raw: i64) -> Result<u64, Error> {
    u64::try_from(raw).map_err(|_| Error::Protocol(format!("invalid re-entry count {raw}")))
}

fn unexpected(script: &str, reply: &[i64]) -> Error {
    Error::Protocol(format!("{script}.lua answered {reply:?}"))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod multi_tests;

#[cfg(test)]
mod election_tests;

#[cfg(test)]
mod job_tests;

#[cfg(test)]
mod idempotency_tests;

#[cfg(test)]
mod semaphore_tests;

#[cfg(test)]
mod rwlock_tests;

#[cfg(test)]
mod rw_read_many_tests;

#[cfg(test)]
mod sem_release_many_tests;

#[cfg(test)]
mod fenced_read_tests;

#[cfg(test)]
mod retention_tests;

#[cfg(test)]
mod acquire_record_tests;

#[cfg(test)]
mod handoff_tests;

#[cfg(test)]
mod sem_handoff_tests;

#[cfg(test)]
mod batch_tests;
