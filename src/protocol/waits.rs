//! Wait records for operators (`wait_record.lua`): which acquisition waits for which key, and
//! what its task holds. Advice only: nothing a lock guarantees reads them.

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::{invoke_as, millis, scripts};
use crate::base::error::Error;

/// What one wait record says (`wait_record.lua` ARGV).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaitArgs<'a> {
    /// The key waited for.
    pub(crate) awaited: &'a [u8],
    /// The acquisition's label, if any.
    pub(crate) label: Option<&'a str>,
    /// The keys of the locks and holds the waiting task holds.
    pub(crate) holds: &'a [Vec<u8>],
    /// How long the record lives unless refreshed.
    pub(crate) lifetime: Duration,
    /// How long the wait has lasted (the record's `since` is that long before the server's
    /// clock, on its first write).
    pub(crate) waited: Duration,
}

/// Writes (or refreshes) the wait record at `key`.
pub(crate) async fn record_wait<C: ConnectionLike>(
    conn: &mut C,
    key: &[u8],
    args: WaitArgs<'_>,
) -> Result<(), Error> {
    let mut call = scripts().wait_record.prepare_invoke();
    call.key(key)
        .arg(millis(args.lifetime).max(1))
        .arg(millis(args.waited))
        .arg(args.awaited)
        .arg(args.label.unwrap_or(""))
        .arg(args.holds);
    invoke_as::<i64, _>(conn, &call).await?;
    Ok(())
}

/// Deletes the wait record at `key` (the wait ended).
pub(crate) async fn forget_wait<C: ConnectionLike>(conn: &mut C, key: &[u8]) -> Result<(), Error> {
    redis::cmd("DEL")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .map_err(Error::from_reply)?;
    Ok(())
}
