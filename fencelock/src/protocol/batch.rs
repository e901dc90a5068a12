//! Many operations in one script call (`batch.lua`): the wire form of an acquisition or a
//! release that may travel with others, and the call that carries several.
//!
//! An [`Operation`] is one `acquire.lua` or `release.lua` call, built once with its keys and
//! arguments; it goes alone ([`Operation::run_alone`], the script itself) or with others
//! ([`run_batch`], `batch.lua`, which runs the same script text per operation). Either way its
//! reply is the script's own, parsed by the same functions. Which operations ride together is
//! the engine's business (`engine::batch`).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value;

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
    let replies = match reply {
        Value::Array(replies) if replies.len() == operations.len() => replies,
        other => {
            let wrong = || Err(Error::Protocol(format!("batch.lua answered {other:?}")));
            return Ok(operations.iter().map(|_| wrong()).collect());
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
