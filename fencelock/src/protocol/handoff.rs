//! `handoff.lua`: a release that grants the freed lock to a waiter of the releasing client in
//! the same script call (the engine's one-round-trip handoff, `engine::handoff`).

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::{count_from, millis, scripts, token_from, unexpected, LockKeys, PubSub};
use crate::base::error::Error;
use crate::base::token::FencingToken;

/// The waiter a release may hand the lock to: a fresh acquisition by `holder`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candidate<'a> {
    /// The candidate acquisition's holder id (also its operation id).
    pub(crate) holder: &'a str,
    /// Its lease.
    pub(crate) lease: Duration,
    /// Its label, if it was given one.
    pub(crate) label: Option<&'a str>,
}

/// Outcome of `handoff.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandoffReply {
    /// Released once; `remaining` entries remain (0: the lock was freed and its release
    /// published; the candidate did not get it).
    Released { remaining: u64 },
    /// Freed and granted to the candidate with `token`.
    HandedOff { token: FencingToken },
    /// The releasing holder does not hold the lock; nothing changed.
    NotHeld,
}

/// `handoff.lua`: releases `holder`'s entry as `release.lua` does (same op record and mark, so
/// either script replays the other's release) and, if that frees the lock and no other client
/// listens on its channel, grants it to `candidate`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn release_handing_off<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    op_id: &str,
    op_ttl: Duration,
    pubsub: PubSub,
    candidate: Candidate<'_>,
) -> Result<HandoffReply, Error> {
    let mut call = scripts().handoff.prepare_invoke();
    call.key(&keys.lock)
        .key(keys.op(op_id))
        .key(keys.op(holder))
        .key(&keys.fence)
        .key(keys.op(candidate.holder))
        .arg(holder)
        .arg(millis(op_ttl))
        .arg(pubsub.script_arg())
        .arg(op_id)
        .arg(candidate.holder)
        .arg(millis(candidate.lease));
    if let Some(label) = candidate.label {
        call.arg(label);
    }
    let reply: Vec<i64> = call.invoke_async(conn).await.map_err(Error::from_reply)?;
    match reply.as_slice() {
        [1, remaining] => Ok(HandoffReply::Released {
            remaining: count_from(*remaining)?,
        }),
        [2, token] => Ok(HandoffReply::HandedOff {
            token: token_from(*token)?,
        }),
        [-1] => Ok(HandoffReply::NotHeld),
        other => Err(unexpected("handoff", other)),
    }
}
