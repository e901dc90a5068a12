//! The raw lock protocol: one function per Lua script, typed replies, no policy.
//!
//! This layer knows keys, holder ids and operation ids; it does not know about guards, leases
//! as deadlines, waiting or retries. Those live in the safe API above it (`client`, `lock`,
//! `guard`), the way `lock_api` separates a raw mutex from its guards.

pub(crate) mod keys;
pub(crate) mod scripts;

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::{Error, FencingToken};
pub(crate) use keys::{LockKeys, ResourceKeys};
use scripts::scripts;

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

pub(crate) async fn acquire<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    lease: Duration,
    op_ttl: Duration,
) -> Result<AcquireReply, Error> {
    let reply: Vec<i64> = scripts()
        .acquire
        .key(&keys.lock)
        .key(&keys.fence)
        .key(keys.op(holder))
        .arg(holder)
        .arg(millis(lease))
        .arg(millis(op_ttl))
        .invoke_async(conn)
        .await
        .map_err(map_err)?;
    match reply.as_slice() {
        [1, token, count] => Ok(AcquireReply::Acquired {
            token: token_from(*token)?,
            count: count_from(*count)?,
        }),
        [0, pttl] => Ok(AcquireReply::Held {
            pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
        }),
        [-2] => Ok(AcquireReply::Cancelled),
        other => Err(unexpected("acquire", other)),
    }
}

pub(crate) async fn reenter<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    op_id: &str,
    op_ttl: Duration,
) -> Result<EnterReply, Error> {
    let reply: Vec<i64> = scripts()
        .reenter
        .key(&keys.lock)
        .key(keys.op(op_id))
        .arg(holder)
        .arg(millis(op_ttl))
        .invoke_async(conn)
        .await
        .map_err(map_err)?;
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
) -> Result<OwnerReply, Error> {
    let reply: Vec<i64> = scripts()
        .release
        .key(&keys.lock)
        .key(keys.op(op_id))
        .arg(holder)
        .arg(millis(op_ttl))
        .invoke_async(conn)
        .await
        .map_err(map_err)?;
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
        .map_err(map_err)?;
    owner_reply("extend", &reply)
}

pub(crate) async fn cancel<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    op_id: &str,
    kind: CancelKind,
    op_ttl: Duration,
) -> Result<CancelReply, Error> {
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
        .invoke_async(conn)
        .await
        .map_err(map_err)?;
    match reply.as_slice() {
        [1, remaining] => Ok(CancelReply::Undone {
            remaining: count_from(*remaining)?,
        }),
        [0] => Ok(CancelReply::NotRun),
        other => Err(unexpected("cancel", other)),
    }
}

/// Renews a batch of leases in one call; one `bool` per `(keys, holder)` pair, `true` when
/// that holder still held that lock and its lease was set again.
pub(crate) async fn renew<C: ConnectionLike>(
    conn: &mut C,
    batch: &[(&LockKeys, &str)],
    lease: Duration,
) -> Result<Vec<bool>, Error> {
    let script = &scripts().renew;
    let mut call = script.prepare_invoke();
    call.arg(millis(lease));
    for (keys, holder) in batch {
        call.key(&keys.lock).arg(*holder);
    }
    let reply: Vec<i64> = call.invoke_async(conn).await.map_err(map_err)?;
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
    },
}

pub(crate) async fn fenced_write<C: ConnectionLike>(
    conn: &mut C,
    keys: &ResourceKeys,
    token: FencingToken,
    op_id: &str,
    op_ttl: Duration,
    write: Write<'_>,
) -> Result<WriteReply, Error> {
    let mut call = scripts().fenced_write.prepare_invoke();
    call.key(&keys.data)
        .key(&keys.mark)
        .key(keys.op(op_id))
        .arg(token.get())
        .arg(millis(op_ttl));
    match write {
        Write::Set(value) => call.arg("set").arg(value),
        Write::IncrBy(delta) => call.arg("incrby").arg(delta),
        Write::SetFields(fields) => {
            call.arg("hset");
            for (field, value) in fields {
                call.arg(*field).arg(*value);
            }
            &mut call
        }
        Write::Push(items) => {
            call.arg("rpush");
            for item in items {
                call.arg(*item);
            }
            &mut call
        }
        Write::Delete => call.arg("del"),
    };
    let reply: Vec<i64> = call.invoke_async(conn).await.map_err(map_err)?;
    match reply.as_slice() {
        [1, result] => Ok(WriteReply::Accepted(*result)),
        [0, latest] => Ok(WriteReply::Stale {
            latest: token_from(*latest)?,
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

/// Outcome of `fenced_read.lua`: the value read (nil for a missing key or field), or the newer
/// token that has claimed the resource.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ReadReply {
    Read(redis::Value),
    Stale { latest: FencingToken },
}

pub(crate) async fn fenced_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &ResourceKeys,
    token: FencingToken,
    read: Read<'_>,
) -> Result<ReadReply, Error> {
    let mut call = scripts().fenced_read.prepare_invoke();
    call.key(&keys.data).key(&keys.mark).arg(token.get());
    match read {
        Read::Get => call.arg("get"),
        Read::Field(field) => call.arg("hget").arg(field),
        Read::Items => call.arg("lrange"),
        Read::Claim => call.arg("claim"),
    };
    let reply: Vec<redis::Value> = call.invoke_async(conn).await.map_err(map_err)?;
    let mut reply = reply.into_iter();
    match (reply.next(), reply.next(), reply.next()) {
        (Some(redis::Value::Int(1)), Some(value), None) => Ok(ReadReply::Read(value)),
        (Some(redis::Value::Int(0)), Some(redis::Value::Int(latest)), None) => {
            Ok(ReadReply::Stale {
                latest: token_from(latest)?,
            })
        }
        other => Err(Error::Protocol(format!(
            "fenced_read.lua answered {other:?}"
        ))),
    }
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

/// Turns the scripts' own error replies into typed errors; everything else stays a Redis error.
fn map_err(err: redis::RedisError) -> Error {
    let detail = || err.detail().unwrap_or_default().to_owned();
    match err.code() {
        Some("FENCELOCK_WRONGTYPE") | Some("WRONGTYPE") => Error::WrongType { detail: detail() },
        Some("FENCELOCK_OVERFLOW") => Error::TokenOverflow { detail: detail() },
        Some("FENCELOCK_BADARG") => Error::Protocol(detail()),
        _ => Error::Redis(err),
    }
}

#[cfg(test)]
mod tests;
