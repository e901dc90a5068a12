//! The raw lock protocol: one function per Lua script, typed replies, no policy.
//!
//! This layer knows keys, holder ids and operation ids; it does not know about guards, leases
//! as deadlines, waiting or retries. Those live in the safe API above it (`client`, `lock`,
//! `guard`), the way `lock_api` separates a raw mutex from its guards.

pub(crate) mod batch;
// The negative controls are test scaffolding: they live with the tests and are compiled into
// the crate only for the project's own builds (`.cargo/config.toml` sets the cfg; a dependent
// never does, and the published package does not ship the file).
#[cfg(fencelock_negative_controls)]
#[path = "../../tests/support/negative_controls.rs"]
pub(crate) mod controls;
mod election;
mod force;
mod handoff;
mod idempotency;
mod job;
pub(crate) mod keys;
mod lock;
mod multi;
mod permissions;
mod pubsub;
mod resource;
mod run_record;
pub(crate) mod rwlock;
mod scripts;
pub(crate) mod semaphore;
pub(crate) mod server;
mod waits;

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::base::error::Error;
use crate::base::token::FencingToken;
pub(crate) use election::{announce, leader, LeaderRecord, LeaderReply};
pub(crate) use force::{force_release, ForceReleaseReply};
pub(crate) use handoff::{release_handing_off, Candidate, HandoffReply, Room};
pub(crate) use idempotency::{idem_read, KeyRead, KeyReadMode, KeyRecord, KeyResult};
pub(crate) use job::{job_read, JobRead, Tick, TickRecord};
pub(crate) use keys::{LockKeys, ResourceKeys};
#[cfg(test)]
pub(crate) use lock::{acquire, acquire_fair, acquire_labelled, LeaveReply};
pub(crate) use lock::{
    acquire_attempt, cancel, extend, leave_fair, reenter, release, release_fair, renew,
    AcquireReply, EnterReply, FairAttempt,
};
pub(crate) use multi::{acquire_all, release_all, AcquireAllReply};
pub(crate) use permissions::{permissions, PermissionsReply};
pub(crate) use pubsub::{PubSub, ReleaseMessage};
pub(crate) use resource::{
    fenced_read, fenced_write, Read, ReadMode, ReadReply, Write, WriteReply,
};
pub(crate) use run_record::{
    run_begin, run_finish, BeginReply, FinishReply, Record, RunArgs, RunEnd, RunKind,
};
use scripts::Scripts;
pub(crate) use waits::{forget_wait, record_wait, WaitArgs};

/// `$b`'s script when `$pick`, else `$a`'s (two of [`Scripts`]' fields), each with its name
/// (its file in `lua/`), which errors about its replies give.
macro_rules! pick {
    ($pick:expr, $a:ident, $b:ident) => {
        match $pick {
            false => (&scripts().$a, stringify!($a)),
            true => (&scripts().$b, stringify!($b)),
        }
    };
}
use pick;

/// The scripts for the current call: the production ones, unless the calling client was built
/// with a negative control (test builds only, `--cfg fencelock_negative_controls`).
fn scripts() -> &'static Scripts {
    #[cfg(fencelock_negative_controls)]
    if let Some(control) = controls::current() {
        return controls::scripts_for(control);
    }
    scripts::production()
}

/// Outcome of `release.lua`, `extend.lua` and the renewal of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnerReply {
    /// Done; for a release, the entries that remain (0: the lock is free).
    Done {
        remaining: u64,
    },
    NotHeld,
}

/// Outcome of `cancel.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelReply {
    /// The operation had run and was undone.
    Undone { remaining: u64 },
    /// The operation had not run, and now never will.
    NotRun,
}

/// Which operation `cancel.lua` undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelKind {
    Acquire,
    Reenter,
}

impl CancelKind {
    /// The word `cancel.lua` and `sem_cancel.lua` take for it.
    fn script_arg(self) -> &'static str {
        match self {
            CancelKind::Acquire => "acquire",
            CancelKind::Reenter => "reenter",
        }
    }
}

/// The call of `script` on the hash of `keys`, and, for a hold with a lease of its own (a
/// semaphore's, a read-write lock's), on its lease zset next: the first keys of every script
/// that serves holds, and of the lock scripts that serve both.
fn on_hash(script: &'static redis::Script, keys: &LockKeys) -> redis::ScriptInvocation<'static> {
    let mut call = script.key(&keys.lock);
    if keys.has_hold_leases() {
        call.key(keys.sem_leases());
    }
    call
}

// A script's yes/no argument is a `bool`, which redis-rs sends as "1" or "0".

/// Sends a script call; its reply as integers, the shape of most scripts' replies.
async fn invoke<C: ConnectionLike>(
    conn: &mut C,
    call: &redis::ScriptInvocation<'_>,
) -> Result<Vec<i64>, Error> {
    invoke_as(conn, call).await
}

/// Sends a script call; its reply as `T`, an error reply typed by [`Error::from_reply`].
async fn invoke_as<T: redis::FromRedisValue, C: ConnectionLike>(
    conn: &mut C,
    call: &redis::ScriptInvocation<'_>,
) -> Result<T, Error> {
    call.invoke_async(conn).await.map_err(Error::from_reply)
}

/// `WAIT numreplicas timeout` on `conn`: how many replicas have acknowledged every write this
/// connection made so far. Blocks the connection for up to `timeout`.
pub(crate) async fn wait_replicas<C: ConnectionLike>(
    conn: &mut C,
    replicas: u32,
    timeout: Duration,
) -> Result<u32, Error> {
    let acked: i64 = redis::cmd("WAIT")
        .arg(replicas)
        .arg(millis(timeout))
        .query_async(conn)
        .await?;
    u32::try_from(acked).map_err(|_| Error::Protocol(format!("WAIT answered {acked}")))
}

/// A script's `PTTL`-like reply: a time left, or `None` for a negative one (no expiry).
fn pttl_from(raw: i64) -> Option<Duration> {
    u64::try_from(raw).ok().map(Duration::from_millis)
}

fn ms_from(script: &str, raw: i64) -> Result<u64, Error> {
    u64::try_from(raw).map_err(|_| Error::Protocol(format!("{script}.lua answered the time {raw}")))
}

fn owner_reply(script: &str, reply: &[i64]) -> Result<OwnerReply, Error> {
    match reply {
        [1] => Ok(OwnerReply::Done { remaining: 0 }),
        [1, remaining] => Ok(OwnerReply::Done {
            remaining: count_from(*remaining)?,
        }),
        [-1] => Ok(OwnerReply::NotHeld),
        other => Err(unexpected(script, other)),
    }
}

/// Milliseconds for a script argument; callers validated that leases are whole, positive
/// milliseconds well inside `u64`.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A token in a reply where none may be (0: none).
fn held_token(raw: i64) -> Option<FencingToken> {
    u64::try_from(raw).ok().and_then(FencingToken::new)
}

fn token_from(raw: i64) -> Result<FencingToken, Error> {
    held_token(raw).ok_or_else(|| Error::Protocol(format!("invalid fencing token {raw}")))
}

/// A number of permits (a semaphore's limit, free or held ones) in a reply of `script`.
fn permits_from(script: &str, raw: i64) -> Result<u32, Error> {
    u32::try_from(raw).map_err(|_| Error::Protocol(format!("{script}.lua answered {raw} permits")))
}

fn count_from(raw: i64) -> Result<u64, Error> {
    u64::try_from(raw).map_err(|_| Error::Protocol(format!("invalid re-entry count {raw}")))
}

/// The error for a reply of `script` of no shape its contract names.
fn unexpected(script: &str, reply: impl std::fmt::Debug) -> Error {
    Error::Protocol(format!("{script}.lua answered {reply:?}"))
}

#[cfg(test)]
mod contract_tests;

#[cfg(test)]
mod lock_tests;

#[cfg(test)]
mod token_tests;

#[cfg(test)]
mod multi_tests;

#[cfg(test)]
mod election_tests;

#[cfg(test)]
mod job_tests;

#[cfg(test)]
mod idempotency_tests;

#[cfg(test)]
mod run_record_tests;

#[cfg(test)]
mod semaphore_tests;

#[cfg(test)]
mod rwlock_tests;

#[cfg(test)]
mod rw_read_many_tests;

#[cfg(test)]
mod sem_release_many_tests;

#[cfg(test)]
mod resource_tests;

#[cfg(test)]
mod retention_tests;

#[cfg(test)]
mod acquire_record_tests;

#[cfg(test)]
mod handoff_tests;

#[cfg(test)]
mod sem_handoff_tests;
