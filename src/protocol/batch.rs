//! Operations of holds that may share one script call (`hold_batch`). A [`ReadOperation`] is
//! one read acquisition of a read-write lock: it goes alone (`rw_acquire.lua`) or with other
//! reads of the same lock and lease (`rw_read_many.lua`). A [`HoldRelease`] is one release of a
//! semaphore's or read-write lock's hold: it goes alone (`sem_release.lua`) or with other
//! releases of holds of the same lock (`sem_release_many.lua`). The grouped scripts do what
//! their operations share once and answer each as its own script would, so a reply is parsed
//! by the same function either way ([`read_outcome`], [`hold_release_outcome`]). Which
//! operations ride together, and when, is the engine's business (`engine::batch`).

use std::borrow::Cow;
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value;

use super::lock::release_call;
use super::rwlock::{rw_acquire_reply, RwAcquireReply, RwMode};
use super::semaphore::{expiry_arg, HoldAcquire};
use super::{invoke_as, millis, on_hash, owner_reply, scripts, LockKeys, OwnerReply, PubSub};
use crate::base::error::Error;

/// An operation that may share a script call with others of its group: built once with
/// everything it sends (it may wait in a queue), sent alone by its own script or with others by
/// the grouped one.
pub(crate) trait Grouped: Send + Sync + 'static {
    /// What operations must have in common to share a call (on a cluster the engine also keeps
    /// a call within one hash slot).
    type Group: Clone + Eq + Hash + Send + Sync;

    fn group(&self) -> Self::Group;

    /// The operation by its own script, on its own: its raw reply.
    fn run_alone<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
    ) -> impl Future<Output = Result<Value, Error>> + Send;

    /// `ops`, all of one group, in one call of the grouped script: one outcome per operation,
    /// in their order, each its own script's reply or its error. `Err`: the call as a whole
    /// failed (the connection, a timeout: the outcome of every operation is unknown; also a key
    /// of a foreign type, which they all share), as redis-rs reported it, for each operation to
    /// take as its own ([`Error::from_reply`]).
    fn run_together<C: ConnectionLike + Send>(
        conn: &mut C,
        ops: &[&Self],
    ) -> impl Future<Output = Result<Vec<Result<Value, Error>>, redis::RedisError>> + Send;
}

/// One read acquisition of a read-write lock (`rw_acquire.lua`, mode "r"), with everything it
/// sends, owned; reads of the same lock with the same lease may share a call
/// (`rw_read_many.lua`).
#[derive(Debug, Clone)]
pub(crate) struct ReadOperation(HoldAcquire<'static>);

impl From<&HoldAcquire<'_>> for ReadOperation {
    /// As [`HoldAcquire::rw_acquire`] with [`RwMode::Read`].
    fn from(read: &HoldAcquire<'_>) -> ReadOperation {
        ReadOperation(HoldAcquire {
            keys: Cow::Owned(LockKeys::clone(&read.keys)),
            holder: Cow::Owned(read.holder.to_string()),
            label: read.label.as_deref().map(str::to_owned).map(Cow::Owned),
            lease: read.lease,
            op_ttl: read.op_ttl,
            pubsub: read.pubsub,
            field_expiry: read.field_expiry,
            recorded: read.recorded,
        })
    }
}

impl Grouped for ReadOperation {
    /// The read-write lock (its hash key) and the lease in milliseconds.
    type Group = (Vec<u8>, u64);

    fn group(&self) -> Self::Group {
        (self.0.keys.lock.clone(), millis(self.0.lease))
    }

    async fn run_alone<C: ConnectionLike + Send>(&self, conn: &mut C) -> Result<Value, Error> {
        invoke_as(conn, &self.0.rw_acquire_call(RwMode::Read, false)?).await
    }

    /// By `rw_read_many.lua`, each read answered as `rw_acquire.lua` answers it alone.
    async fn run_together<C: ConnectionLike + Send>(
        conn: &mut C,
        reads: &[&ReadOperation],
    ) -> Result<Vec<Result<Value, Error>>, redis::RedisError> {
        let first = &reads[0].0;
        let keys = &first.keys;
        let writers = keys.rw_writers().unwrap_or_default();
        let mut call = on_hash(&scripts().rw_read_many, keys);
        call.key(writers)
            .key(&keys.fence)
            .arg(reads.len())
            .arg(millis(first.lease))
            .arg(millis(first.op_ttl))
            .arg(first.pubsub.script_arg())
            .arg(expiry_arg(first.field_expiry));
        for read in reads {
            debug_assert!(read.group() == reads[0].group());
            let read = &read.0;
            call.key(keys.op(&read.holder))
                .arg(read.holder.as_ref())
                .arg(read.recorded)
                .arg(read.label.as_deref().unwrap_or(""));
        }
        let reply: Value = call.invoke_async(conn).await?;
        per_operation("rw_read_many", reads.len(), reply)
    }
}

/// One release of a hold of a semaphore or read-write lock (`sem_release.lua`), with everything
/// it sends; releases of holds of the same lock may share a call (`sem_release_many.lua`).
#[derive(Debug, Clone)]
pub(crate) struct HoldRelease {
    pub(crate) keys: LockKeys,
    holder: String,
    op_id: String,
    op_ttl: Duration,
    pubsub: PubSub,
    /// Alone, whether the script reads the release's op record (`sem_release.lua` ARGV[5]);
    /// a shared call reads every release's.
    read_record: bool,
}

impl HoldRelease {
    /// As [`super::release`] of a hold.
    pub(crate) fn new(
        keys: &LockKeys,
        holder: &str,
        op_id: &str,
        op_ttl: Duration,
        pubsub: PubSub,
        read_record: bool,
    ) -> HoldRelease {
        debug_assert!(
            keys.has_hold_leases(),
            "a plain lock releases by release.lua"
        );
        HoldRelease {
            keys: keys.clone(),
            holder: holder.to_owned(),
            op_id: op_id.to_owned(),
            op_ttl,
            pubsub,
            read_record,
        }
    }
}

impl Grouped for HoldRelease {
    /// The semaphore or read-write lock (its hash key).
    type Group = Vec<u8>;

    fn group(&self) -> Self::Group {
        self.keys.lock.clone()
    }

    async fn run_alone<C: ConnectionLike + Send>(&self, conn: &mut C) -> Result<Value, Error> {
        let mut call = release_call(
            &scripts().sem_release,
            &self.keys,
            &self.holder,
            &self.op_id,
            self.op_ttl,
            self.pubsub,
        );
        call.arg(self.read_record);
        invoke_as(conn, &call).await
    }

    /// By `sem_release_many.lua`, each release answered as `sem_release.lua` answers it alone.
    async fn run_together<C: ConnectionLike + Send>(
        conn: &mut C,
        releases: &[&HoldRelease],
    ) -> Result<Vec<Result<Value, Error>>, redis::RedisError> {
        let first = releases[0];
        let keys = &first.keys;
        let mut call = on_hash(&scripts().sem_release_many, keys);
        let writers = keys.rw_writers();
        if let Some(writers) = &writers {
            call.key(writers);
        }
        call.arg(releases.len())
            .arg(millis(first.op_ttl))
            .arg(first.pubsub.script_arg())
            .arg(if writers.is_some() { 3 } else { 2 });
        for release in releases {
            debug_assert!(release.keys.lock == keys.lock);
            call.key(keys.op(&release.op_id))
                .key(keys.op(&release.holder))
                .arg(&release.holder)
                .arg(&release.op_id);
        }
        let reply: Value = call.invoke_async(conn).await?;
        per_operation("sem_release_many", releases.len(), reply)
    }
}

/// A hold's release's raw reply (alone or shared), typed.
pub(crate) fn hold_release_outcome(reply: Value) -> Result<OwnerReply, Error> {
    owner_reply("sem_release", &integers("sem_release", reply)?)
}

/// A read's raw reply (alone or shared), typed.
pub(crate) fn read_outcome(reply: Value) -> Result<RwAcquireReply, Error> {
    rw_acquire_reply(&integers("rw_acquire", reply)?)
}

/// The replies of a call that carried `count` operations, one per operation: a string is the
/// error of that operation alone.
fn per_operation(
    script: &str,
    count: usize,
    reply: Value,
) -> Result<Vec<Result<Value, Error>>, redis::RedisError> {
    let replies = match reply {
        Value::Array(replies) if replies.len() == count => replies,
        other => {
            let wrong = || Err(super::unexpected(script, &other));
            return Ok((0..count).map(|_| wrong()).collect());
        }
    };
    Ok(replies
        .into_iter()
        .map(|reply| match reply {
            Value::BulkString(message) => Err(operation_error(script, &message)),
            reply => Ok(reply),
        })
        .collect())
}

/// The error of one operation, from the message the grouped `script` gives for it: typed as the
/// same error of the operation alone ([`Error::from_reply`] of the server's error reply).
fn operation_error(script: &str, message: &[u8]) -> Error {
    // The message as the error reply the operation alone would have had. Line breaks would
    // end that reply early; Redis never puts any in an error message.
    let line: Vec<u8> = message
        .iter()
        .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b })
        .collect();
    let reply = [&b"-"[..], &line, b"\r\n"].concat();
    match redis::parse_redis_value(&reply) {
        Ok(Value::ServerError(err)) => Error::from_reply(err.into()),
        _ => Error::Protocol(format!(
            "{script}.lua failed an operation: {}",
            String::from_utf8_lossy(message)
        )),
    }
}

fn integers(script: &str, reply: Value) -> Result<Vec<i64>, Error> {
    redis::from_redis_value(reply)
        .map_err(|err| Error::Protocol(format!("{script}.lua answered something else: {err}")))
}
