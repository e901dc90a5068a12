//! The scripts of read-write locks (`lua/rw_*.lua`): acquisition and downgrade, one function
//! each, typed replies, no policy. Their holds are a semaphore's in layout, and are released,
//! undone, renewed and re-entered by the semaphore's scripts ([`super::semaphore`]).

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::semaphore::expiry_arg;
use super::{
    flag, millis, owner_reply, scripts, token_from, unexpected, LockKeys, OwnerReply, PubSub,
};
use crate::base::error::Error;
use crate::base::token::FencingToken;

/// Outcome of `rw_acquire.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwAcquireReply {
    /// Held, with this token (fresh, or a replay of the same request).
    Acquired { token: FencingToken },
    /// Busy; `wait`: until the earliest deadline that could end it (`None`: unknown).
    Busy { wait: Option<Duration> },
    /// This acquisition was cancelled before it ran (or ran and its hold ended).
    Cancelled,
}

/// Which side of a read-write lock an acquisition takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwMode {
    Read,
    Write,
}

/// One read-write lock acquire attempt; `wait`: a writer that will wait (marks itself
/// waiting when busy, which stops new readers). `field_expiry` as for [`super::semaphore::sem_acquire`];
/// `label`, when given, is stored in the hold's field (ARGV[9]); `recorded`: this send leaves an
/// op record (ARGV[8]).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn rw_acquire<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    mode: RwMode,
    lease: Duration,
    wait: bool,
    op_ttl: Duration,
    pubsub: PubSub,
    field_expiry: bool,
    label: Option<&str>,
    recorded: bool,
) -> Result<RwAcquireReply, Error> {
    let call = rw_acquire_call(
        keys,
        holder,
        mode,
        lease,
        wait,
        op_ttl,
        pubsub,
        field_expiry,
        label,
        recorded,
    )?;
    let reply: Vec<i64> = call.invoke_async(conn).await.map_err(Error::from_reply)?;
    rw_acquire_reply(&reply)
}

/// The `rw_acquire.lua` call of [`rw_acquire`], ready to send.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rw_acquire_call(
    keys: &LockKeys,
    holder: &str,
    mode: RwMode,
    lease: Duration,
    wait: bool,
    op_ttl: Duration,
    pubsub: PubSub,
    field_expiry: bool,
    label: Option<&str>,
    recorded: bool,
) -> Result<redis::ScriptInvocation<'static>, Error> {
    let writers = keys
        .rw_writers()
        .ok_or_else(|| Error::Protocol("rw_acquire.lua called with keys of another kind".into()))?;
    let mut call = scripts().rw_acquire.prepare_invoke();
    call.key(&keys.lock)
        .key(keys.sem_leases())
        .key(writers)
        .key(&keys.fence)
        .key(keys.op(holder))
        .arg(holder)
        .arg(match mode {
            RwMode::Read => "r",
            RwMode::Write => "w",
        })
        .arg(millis(lease))
        .arg(flag(wait))
        .arg(millis(op_ttl))
        .arg(pubsub.script_arg())
        .arg(expiry_arg(field_expiry))
        .arg(flag(recorded));
    if let Some(label) = label {
        call.arg(label);
    }
    Ok(call)
}

/// `rw_acquire.lua`'s reply (also each of `rw_read_many.lua`'s), typed.
pub(crate) fn rw_acquire_reply(reply: &[i64]) -> Result<RwAcquireReply, Error> {
    match reply {
        [1, token] => Ok(RwAcquireReply::Acquired {
            token: token_from(*token)?,
        }),
        [0, wait] => Ok(RwAcquireReply::Busy {
            wait: u64::try_from(*wait).ok().map(Duration::from_millis),
        }),
        [-2] => Ok(RwAcquireReply::Cancelled),
        other => Err(unexpected("rw_acquire", other)),
    }
}

/// A writer becomes a reader of the same lock (`rw_downgrade.lua`).
pub(crate) async fn rw_downgrade<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    holder: &str,
    pubsub: PubSub,
) -> Result<OwnerReply, Error> {
    let reply: Vec<i64> = scripts()
        .rw_downgrade
        .key(&keys.lock)
        .key(keys.sem_leases())
        .arg(holder)
        .arg(pubsub.script_arg())
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    owner_reply("rw_downgrade", &reply)
}
