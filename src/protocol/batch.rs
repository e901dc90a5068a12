//! Many operations in one script call (`batch.lua`): the wire form of an acquisition or a
//! release that may travel with others, and the call that carries several.
//!
//! An [`Operation`] is one `acquire.lua` or `release.lua` call, built once with its keys and
//! arguments; it goes alone ([`Operation::run_alone`], the script itself) or with others
//! ([`run_batch`], `batch.lua`, which runs the same script text per operation). A
//! [`ReadOperation`] is one read acquisition of a read-write lock; it goes alone
//! (`rw_acquire.lua`) or with other reads of the same lock ([`run_reads`],
//! `rw_read_many.lua`, which does their common work once). Either way a reply is the script's
//! own, parsed by the same functions. A [`HoldRelease`] is one release of a semaphore's or
//! read-write lock's hold; it goes alone (`sem_release.lua`) or with other releases of holds
//! of the same lock ([`run_hold_releases`], `sem_release_many.lua`). Which operations ride
//! together is the engine's business (`engine::batch`).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value;

use super::semaphore::{
    expiry_arg, rw_acquire_call, rw_acquire_reply, sem_release_call, RwAcquireReply, RwMode,
};
use super::{acquire_reply, flag, millis, owner_reply, scripts, AcquireReply, LockKeys};
use super::{OwnerReply, PubSub};
use crate::base::error::Error;

/// Which script an [`Operation`] is a call of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Acquire,
    Release,
}

impl Kind {
    /// Its name in `batch.lua`'s operation list.
    fn code(self) -> &'static str {
        match self {
            Kind::Acquire => "a",
            Kind::Release => "r",
        }
    }
}

/// One call of `acquire.lua` or `release.lua` of a plain lock, with everything it sends.
#[derive(Debug, Clone)]
pub(crate) struct Operation {
    kind: Kind,
    keys: [Vec<u8>; 3],
    args: Vec<Vec<u8>>,
}

impl Operation {
    /// `acquire.lua` (without fair handoff): as [`super::acquire_labelled`]. The same
    /// arguments are built twice on purpose: an operation owns copies of its keys and
    /// arguments so it can wait in a queue, and building one for every call put 14 % more
    /// client instructions on the uncontended cycle (callgrind), so a client that does not
    /// batch calls `acquire_labelled` directly.
    pub(crate) fn acquire(
        keys: &LockKeys,
        holder: &str,
        lease: Duration,
        op_ttl: Duration,
        label: Option<&str>,
        recorded: bool,
    ) -> Operation {
        let mut args = vec![
            holder.as_bytes().to_vec(),
            millis(lease).to_string().into_bytes(),
            millis(op_ttl).to_string().into_bytes(),
            flag(recorded).as_bytes().to_vec(),
        ];
        if let Some(label) = label {
            args.push(label.as_bytes().to_vec());
        }
        Operation {
            kind: Kind::Acquire,
            keys: [keys.lock.clone(), keys.fence.clone(), keys.op(holder)],
            args,
        }
    }

    /// `release.lua` of a plain lock (not a semaphore's or a read-write lock's hold): as
    /// [`super::release`].
    pub(crate) fn release(
        keys: &LockKeys,
        holder: &str,
        op_id: &str,
        op_ttl: Duration,
        pubsub: PubSub,
    ) -> Operation {
        debug_assert!(!keys.has_hold_leases(), "holds release by their own script");
        Operation {
            kind: Kind::Release,
            keys: [keys.lock.clone(), keys.op(op_id), keys.op(holder)],
            args: vec![
                holder.as_bytes().to_vec(),
                millis(op_ttl).to_string().into_bytes(),
                pubsub.script_arg().as_bytes().to_vec(),
                op_id.as_bytes().to_vec(),
            ],
        }
    }

    #[cfg(test)]
    pub(crate) fn is_acquire(&self) -> bool {
        self.kind == Kind::Acquire
    }

    /// The operation by its own script, on its own: its raw reply.
    pub(crate) async fn run_alone<C: ConnectionLike>(&self, conn: &mut C) -> Result<Value, Error> {
        let script = match self.kind {
            Kind::Acquire => &scripts().acquire,
            Kind::Release => &scripts().release,
        };
        let mut call = script.prepare_invoke();
        for key in &self.keys {
            call.key(key);
        }
        for arg in &self.args {
            call.arg(arg);
        }
        call.invoke_async(conn).await.map_err(Error::from_reply)
    }
}

/// One read acquisition of a read-write lock (`rw_acquire.lua`, mode "r"), with everything it
/// sends; reads of the same lock with the same lease may share a call ([`run_reads`]).
#[derive(Debug, Clone)]
pub(crate) struct ReadOperation {
    keys: LockKeys,
    holder: String,
    lease: Duration,
    op_ttl: Duration,
    pubsub: PubSub,
    field_expiry: bool,
    label: Option<String>,
    recorded: bool,
}

impl ReadOperation {
    /// As [`super::semaphore::rw_acquire`] with [`RwMode::Read`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        keys: &LockKeys,
        holder: &str,
        lease: Duration,
        op_ttl: Duration,
        pubsub: PubSub,
        field_expiry: bool,
        label: Option<&str>,
        recorded: bool,
    ) -> ReadOperation {
        ReadOperation {
            keys: keys.clone(),
            holder: holder.to_owned(),
            lease,
            op_ttl,
            pubsub,
            field_expiry,
            label: label.map(str::to_owned),
            recorded,
        }
    }

    /// The read by `rw_acquire.lua`, on its own: its raw reply.
    pub(crate) async fn run_alone<C: ConnectionLike>(&self, conn: &mut C) -> Result<Value, Error> {
        let call = rw_acquire_call(
            &self.keys,
            &self.holder,
            RwMode::Read,
            self.lease,
            false,
            self.op_ttl,
            self.pubsub,
            self.field_expiry,
            self.label.as_deref(),
            self.recorded,
        )?;
        call.invoke_async(conn).await.map_err(Error::from_reply)
    }
}

/// Runs `reads`, all of one read-write lock with one lease, in one `rw_read_many.lua` call:
/// one outcome per read, in their order, each `rw_acquire.lua`'s reply for it or its error.
/// `Err`: the call as a whole failed (as [`run_batch`]'s; also a key of a foreign type, which
/// every read shares).
pub(crate) async fn run_reads<C: ConnectionLike>(
    conn: &mut C,
    reads: &[&ReadOperation],
) -> Result<Vec<Result<Value, Error>>, redis::RedisError> {
    let first = reads[0];
    let keys = &first.keys;
    let writers = keys.rw_writers().unwrap_or_default();
    let mut call = scripts().rw_read_many.prepare_invoke();
    call.key(&keys.lock)
        .key(keys.sem_leases())
        .key(writers)
        .key(&keys.fence)
        .arg(reads.len())
        .arg(millis(first.lease))
        .arg(millis(first.op_ttl))
        .arg(first.pubsub.script_arg())
        .arg(expiry_arg(first.field_expiry));
    for read in reads {
        debug_assert!(read.keys.lock == keys.lock && read.lease == first.lease);
        call.key(keys.op(&read.holder))
            .arg(&read.holder)
            .arg(flag(read.recorded))
            .arg(read.label.as_deref().unwrap_or(""));
    }
    let reply: Value = call.invoke_async(conn).await?;
    per_operation("rw_read_many", reads.len(), reply)
}

/// One release of a hold of a semaphore or read-write lock (`sem_release.lua`), with everything
/// it sends; releases of holds of the same lock may share a call ([`run_hold_releases`]).
#[derive(Debug, Clone)]
pub(crate) struct HoldRelease {
    keys: LockKeys,
    holder: String,
    op_id: String,
    op_ttl: Duration,
    pubsub: PubSub,
}

impl HoldRelease {
    /// As [`super::release`] of a hold.
    pub(crate) fn new(
        keys: &LockKeys,
        holder: &str,
        op_id: &str,
        op_ttl: Duration,
        pubsub: PubSub,
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
        }
    }

    /// The release by `sem_release.lua`, on its own: its raw reply.
    pub(crate) async fn run_alone<C: ConnectionLike>(&self, conn: &mut C) -> Result<Value, Error> {
        let call = sem_release_call(
            &self.keys,
            &self.holder,
            &self.op_id,
            self.op_ttl,
            self.pubsub,
        );
        call.invoke_async(conn).await.map_err(Error::from_reply)
    }
}

/// Runs `releases`, all of holds of one semaphore or read-write lock, in one
/// `sem_release_many.lua` call: one outcome per release, in their order (as [`run_reads`]).
pub(crate) async fn run_hold_releases<C: ConnectionLike>(
    conn: &mut C,
    releases: &[&HoldRelease],
) -> Result<Vec<Result<Value, Error>>, redis::RedisError> {
    let first = releases[0];
    let keys = &first.keys;
    let mut call = scripts().sem_release_many.prepare_invoke();
    call.key(&keys.lock).key(keys.sem_leases());
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

/// A hold's release's raw reply (alone or from [`run_hold_releases`]), typed.
pub(crate) fn hold_release_outcome(reply: Value) -> Result<OwnerReply, Error> {
    owner_reply("sem_release", &integers("sem_release", reply)?)
}

/// A read's raw reply (alone or from [`run_reads`]), typed.
pub(crate) fn read_outcome(reply: Value) -> Result<RwAcquireReply, Error> {
    rw_acquire_reply(&integers("rw_acquire", reply)?)
}

/// Runs `operations` in one `batch.lua` call, in their order: one outcome per operation, each
/// its own script's reply or the error of that operation alone. `Err`: the call as a whole
/// failed (the connection, a timeout: the outcome of every operation is unknown), as redis-rs
/// reported it, for each operation to take as its own ([`Error::from_reply`]).
pub(crate) async fn run_batch<C: ConnectionLike>(
    conn: &mut C,
    operations: &[&Operation],
) -> Result<Vec<Result<Value, Error>>, redis::RedisError> {
    let mut call = scripts().batch.prepare_invoke();
    call.arg(operations.len());
    for op in operations {
        for key in &op.keys {
            call.key(key);
        }
        call.arg(op.kind.code())
            .arg(op.keys.len())
            .arg(op.args.len());
        for arg in &op.args {
            call.arg(arg);
        }
    }
    let reply: Value = call.invoke_async(conn).await?;
    per_operation("batch", operations.len(), reply)
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
            let wrong = || Err(Error::Protocol(format!("{script}.lua answered {other:?}")));
            return Ok((0..count).map(|_| wrong()).collect());
        }
    };
    Ok(replies
        .into_iter()
        .map(|reply| match reply {
            Value::BulkString(message) => Err(operation_error(&message)),
            reply => Ok(reply),
        })
        .collect())
}

/// The error of one operation, from the message `batch.lua` gives for it: typed as the same
/// error of the operation alone ([`Error::from_reply`] of the server's error reply).
fn operation_error(message: &[u8]) -> Error {
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
            "batch.lua failed an operation: {}",
            String::from_utf8_lossy(message)
        )),
    }
}

/// An acquisition's raw reply (alone or from a batch), typed.
pub(crate) fn acquire_outcome(reply: Value) -> Result<AcquireReply, Error> {
    acquire_reply("acquire", &integers("acquire", reply)?)
}

/// A release's raw reply (alone or from a batch), typed.
pub(crate) fn release_outcome(reply: Value) -> Result<OwnerReply, Error> {
    owner_reply("release", &integers("release", reply)?)
}

fn integers(script: &str, reply: Value) -> Result<Vec<i64>, Error> {
    redis::from_redis_value(reply)
        .map_err(|err| Error::Protocol(format!("{script}.lua answered something else: {err}")))
}
