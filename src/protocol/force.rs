//! The operator's eviction of a stuck holder (`force_release.lua`).

use redis::aio::ConnectionLike;

use super::{count_from, held_token, invoke_as, scripts, unexpected, LockKeys, PubSub};
use crate::base::error::Error;
use crate::base::token::FencingToken;

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
/// slot's fence counter to at least the evicted token and wakes waiters (on the channels of
/// `pubsub`).
pub(crate) async fn force_release<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    expected: Option<FencingToken>,
    pubsub: PubSub,
) -> Result<ForceReleaseReply, Error> {
    let mut call = scripts().force_release.key(&keys.lock);
    call.key(&keys.fence)
        .arg(expected.map(|t| t.get().to_string()).unwrap_or_default())
        .arg(pubsub.script_arg());
    let reply: Vec<redis::Value> = invoke_as(conn, &call).await?;
    use redis::Value::{BulkString, Int};
    match reply.as_slice() {
        [Int(1), Int(token), Int(fence), BulkString(holder), Int(count)] => {
            Ok(ForceReleaseReply::Evicted {
                token: held_token(*token),
                fence: u64::try_from(*fence)
                    .map_err(|_| Error::Protocol(format!("invalid fence counter {fence}")))?,
                holder: holder.clone(),
                count: count_from(*count)?,
            })
        }
        [Int(0)] => Ok(ForceReleaseReply::NotHeld),
        [Int(-1), Int(token)] => Ok(ForceReleaseReply::OtherToken {
            token: held_token(*token),
        }),
        other => Err(unexpected("force_release", other)),
    }
}
