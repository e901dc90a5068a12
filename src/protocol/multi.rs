//! The multi-lock's scripts: every member at once (`acquire_all.lua`, `release_all.lua`).

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::{
    count_from, invoke, millis, pttl_from, scripts, token_from, unexpected, LockKeys, OwnerReply,
};
use crate::base::error::Error;
use crate::base::token::FencingToken;

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
    call.arg(label);
    let reply = invoke(conn, &call).await?;
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
                pttl: pttl_from(*pttl),
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
    let reply = invoke(conn, &call).await?;
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
