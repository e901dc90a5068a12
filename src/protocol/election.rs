//! The election's scripts: a leader's announcement on its lock's hash (`announce.lua`) and
//! the read of who leads (`leader.lua`).

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::{
    invoke, invoke_as, owner_reply, pttl_from, scripts, token_from, LockKeys, OwnerReply, PubSub,
};
use crate::base::error::Error;
use crate::base::token::FencingToken;

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
    let mut call = scripts().announce.key(&keys.lock);
    call.arg(holder)
        .arg(term.get())
        .arg(metadata)
        .arg(pubsub.script_arg());
    owner_reply("announce", &invoke(conn, &call).await?)
}

/// The leader of an election as `leader.lua` read it: id, term and metadata of one hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaderRecord {
    pub(crate) holder: String,
    pub(crate) term: FencingToken,
    pub(crate) metadata: Vec<u8>,
}

/// Outcome of `leader.lua`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    let call = scripts().leader.key(&keys.lock);
    let reply: Vec<redis::Value> = invoke_as(conn, &call).await?;
    use redis::Value::{BulkString, Int};
    let (leader, left) = match reply.as_slice() {
        // The election's lock is free.
        [] => return Ok(LeaderReply::default()),
        [Int(0), Int(left)] => (None, left),
        [Int(1), BulkString(holder), Int(term), BulkString(metadata), Int(left)] => {
            let record = LeaderRecord {
                holder: String::from_utf8(holder.clone()).map_err(|_| {
                    Error::Protocol("leader.lua answered a holder id that is not UTF-8".into())
                })?,
                term: token_from(*term)?,
                metadata: metadata.clone(),
            };
            (Some(record), left)
        }
        other => return Err(super::unexpected("leader", other)),
    };
    Ok(LeaderReply {
        leader,
        lease_left: Some(pttl_from(*left)),
    })
}
