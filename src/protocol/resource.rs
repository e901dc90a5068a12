//! The fenced resource's scripts: a write and a read that present a token to storage
//! (`fenced_write.lua`, `fenced_read.lua`).

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::{invoke, invoke_as, millis, scripts, token_from, unexpected, ResourceKeys};
use crate::base::error::{Error, Superseded};
use crate::base::token::FencingToken;

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
        // A slice of values or of field-value pairs is one argument per value.
        Write::SetFields(fields) => call.arg("hset").arg(retention).arg(fields),
        Write::Push(items) => call.arg("rpush").arg(retention).arg(items),
        Write::Delete => call.arg("del").arg(retention),
    };
    let reply = invoke(conn, &call).await?;
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
    let reply: Vec<redis::Value> = invoke_as(conn, &call).await?;
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
        other => Err(unexpected("fenced_read", other)),
    }
}
