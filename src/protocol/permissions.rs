//! The connect-time probe of the ACL (`permissions.lua`): every command of the protocol, tried
//! on a probe lock's keys.

use redis::aio::ConnectionLike;

use super::{invoke_as, scripts, LockKeys, PubSub};
use crate::base::error::Error;

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
    let mut call = scripts().permissions.key(&keys.lock);
    call.key(&keys.fence)
        .key(keys.op("permissions"))
        .key(keys.queue())
        .arg(pubsub.script_arg())
        .arg(fair)
        .arg(match holds {
            None => "",
            Some(false) => "holds",
            Some(true) => "holds+fields",
        });
    let refused: Vec<String> = invoke_as(conn, &call).await?;
    Ok(if refused.is_empty() {
        PermissionsReply::Granted
    } else {
        PermissionsReply::Refused(refused)
    })
}
