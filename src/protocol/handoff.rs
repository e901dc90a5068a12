//! `handoff.lua` and `sem_handoff.lua`: a release that grants the freed lock (or a semaphore
//! hold's permits) to a waiter of the releasing client in the same script call (the engine's
//! one-round-trip handoff, `engine::handoff`).

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::lock::release_call;
use super::{
    count_from, invoke, millis, permits_from, pick, scripts, token_from, unexpected, LockKeys,
    PubSub,
};
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
    /// The permits it waits for (a semaphore's; 1 for a lock, whose script ignores it).
    pub(crate) permits: u32,
}

/// A semaphore's permits after a grant: `limit` in all, `free` left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    pub(crate) limit: u32,
    pub(crate) free: u32,
}

/// Outcome of `handoff.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandoffReply {
    /// Released once; `remaining` entries remain (0: the lock was freed and its release
    /// published; the candidate did not get it).
    Released { remaining: u64 },
    /// Freed and granted to the candidate with `token`; for a semaphore, what the grant left
    /// (`None` for a lock).
    HandedOff {
        token: FencingToken,
        room: Option<Room>,
    },
    /// The releasing holder does not hold the lock; nothing changed.
    NotHeld,
}

/// `handoff.lua`: releases `holder`'s entry as `release.lua` does (same op record and mark, so
/// either script replays the other's release) and, if that frees the lock and no other client
/// listens on its channel, grants it to `candidate`. For a semaphore's keys, `sem_handoff.lua`:
/// releases the hold as `sem_release.lua` does and, if that gives its permits back, no other
/// client listens and enough are free, grants `candidate.permits` of them to `candidate`. The
/// script is the one of the keys' layout, as for [`super::release`].
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
    let holds = keys.has_hold_leases();
    let (script, name) = pick!(holds, handoff, sem_handoff);
    // A read-write lock's holds are never handed off: its release call has no writers' key
    // to come before these.
    let mut call = release_call(script, keys, holder, op_id, op_ttl, pubsub);
    call.key(&keys.fence)
        .key(keys.op(candidate.holder))
        .arg(candidate.holder);
    if holds {
        call.arg(candidate.permits);
    }
    call.arg(millis(candidate.lease)).arg(candidate.label);
    // A grant of `sem_handoff.lua` also tells the semaphore's room.
    let permits = |raw: i64| permits_from(name, raw);
    match invoke(conn, &call).await?.as_slice() {
        [1, remaining] => Ok(HandoffReply::Released {
            remaining: count_from(*remaining)?,
        }),
        [2, token] => Ok(HandoffReply::HandedOff {
            token: token_from(*token)?,
            room: None,
        }),
        [2, token, limit, free] => Ok(HandoffReply::HandedOff {
            token: token_from(*token)?,
            room: Some(Room {
                limit: permits(*limit)?,
                free: permits(*free)?,
            }),
        }),
        [-1] => Ok(HandoffReply::NotHeld),
        other => Err(unexpected(name, other)),
    }
}
