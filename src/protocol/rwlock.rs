//! The scripts of read-write locks (`lua/rw_*.lua`): acquisition and downgrade, one function
//! each, typed replies, no policy. Their holds are a semaphore's in layout, and are released,
//! undone, renewed and re-entered by the semaphore's scripts ([`super::semaphore`]).

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::semaphore::{expiry_arg, HoldAcquire};
use super::{
    invoke, millis, on_hash, owner_reply, pttl_from, scripts, token_from, unexpected, LockKeys,
    OwnerReply, PubSub,
};
use crate::base::error::Error;
use crate::base::token::FencingToken;

/// Outcome of `rw_acquire.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwAcquireReply {
    /// Held, with this token (fresh, or a replay of the same request; `lease_left`: on a
    /// replay of a single acquisition, what is left of the hold's lease, which began before
    /// this send).
    Acquired {
        token: FencingToken,
        lease_left: Option<Duration>,
    },
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

impl HoldAcquire<'_> {
    /// One read-write lock acquire attempt (`rw_acquire.lua`) of `mode`'s side; `wait`: a
    /// writer that will wait (marks itself waiting when busy, which stops new readers). The
    /// label is ARGV[9], the record flag ARGV[8].
    pub(crate) async fn rw_acquire<C: ConnectionLike>(
        &self,
        conn: &mut C,
        mode: RwMode,
        wait: bool,
    ) -> Result<RwAcquireReply, Error> {
        let call = self.rw_acquire_call(mode, wait)?;
        rw_acquire_reply(&invoke(conn, &call).await?)
    }

    /// The `rw_acquire.lua` call of [`HoldAcquire::rw_acquire`], ready to send.
    pub(crate) fn rw_acquire_call(
        &self,
        mode: RwMode,
        wait: bool,
    ) -> Result<redis::ScriptInvocation<'static>, Error> {
        let keys = &self.keys;
        let writers = keys.rw_writers().ok_or_else(|| {
            Error::Protocol("rw_acquire.lua called with keys of another kind".into())
        })?;
        let mut call = on_hash(&scripts().rw_acquire, keys);
        call.key(writers)
            .key(&keys.fence)
            .key(keys.op(&self.holder))
            .arg(self.holder.as_ref())
            .arg(match mode {
                RwMode::Read => "r",
                RwMode::Write => "w",
            })
            .arg(millis(self.lease))
            .arg(wait)
            .arg(millis(self.op_ttl))
            .arg(self.pubsub.script_arg())
            .arg(expiry_arg(self.field_expiry))
            .arg(self.recorded)
            .arg(self.label.as_deref());
        Ok(call)
    }
}

/// `rw_acquire.lua`'s reply (also each of `rw_read_many.lua`'s), typed.
pub(crate) fn rw_acquire_reply(reply: &[i64]) -> Result<RwAcquireReply, Error> {
    match reply {
        [1, token, left @ ..] if left.len() <= 1 => Ok(RwAcquireReply::Acquired {
            token: token_from(*token)?,
            lease_left: left.first().and_then(|left| pttl_from(*left)),
        }),
        [0, wait] => Ok(RwAcquireReply::Busy {
            wait: pttl_from(*wait),
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
    let mut call = on_hash(&scripts().rw_downgrade, keys);
    call.arg(holder).arg(pubsub.script_arg());
    owner_reply("rw_downgrade", &invoke(conn, &call).await?)
}
