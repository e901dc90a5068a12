//! The idempotency-key scripts: begin a run, store its result or leave the key to a retry,
//! read (or forget) the record.

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::run_record::{begin_code, finish_reply, read_reply, BeginCode, RawRun, RunRead};
use super::{millis, scripts, FinishReply, LockKeys, RunnerDeathArg};
use crate::base::error::Error;
use crate::base::token::FencingToken;

/// An idempotency key's record as the scripts return it: the newest run and its result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyRecord {
    pub(crate) runner: String,
    pub(crate) token: FencingToken,
    /// Server time of the begin, ms since the Unix epoch.
    pub(crate) started_ms: u64,
    /// Server time the result was stored; `None` while the run goes on (or its runner died,
    /// or it failed).
    pub(crate) finished_ms: Option<u64>,
    /// Server time the run failed and left the key to a retry; `None` otherwise.
    pub(crate) failed_ms: Option<u64>,
    /// The stored result is a failure the runner made final.
    pub(crate) is_final_failure: bool,
    /// The stored result (empty unless finished).
    pub(crate) result: Vec<u8>,
    pub(crate) fingerprint: Vec<u8>,
}

/// Outcome of `idem_begin.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyBeginReply {
    /// The caller runs the request; `took_over` is the token of a runner whose hold had ended
    /// before it finished, or whose run failed. `started_ms` is the server time of the begin.
    Begun {
        took_over: Option<FencingToken>,
        started_ms: u64,
    },
    /// The key is done: its result is stored.
    Done(KeyRecord),
    /// The runner lost its hold before finishing, and the policy gives the key up.
    Abandoned(KeyRecord),
    /// The caller does not hold the key's lock with its token.
    NotHeld,
    /// The record carries a newer token than the caller's.
    Newer(KeyRecord),
    /// The key was used with another fingerprint.
    OtherFingerprint(KeyRecord),
}

/// The arguments of one run's begin and finish.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyArgs<'a> {
    pub(crate) holder: &'a str,
    pub(crate) token: FencingToken,
    pub(crate) fingerprint: &'a [u8],
    pub(crate) retention: Duration,
}

/// What a run's finish stores (`idem_finish.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyFinish<'a> {
    /// The run succeeded: store its result.
    Done(&'a [u8]),
    /// The run failed and the caller made that final: store its result as a failure.
    Final(&'a [u8]),
    /// The run failed: leave the key to a retry.
    Failed,
}

/// Records that `args.holder` (holding the key's lock with `args.token`) runs the request
/// with `args.fingerprint`, unless the key is done, abandoned or another request's
/// (`idem_begin.lua`).
pub(crate) async fn idem_begin<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    args: KeyArgs<'_>,
    on_death: RunnerDeathArg,
) -> Result<KeyBeginReply, Error> {
    let reply: Vec<redis::Value> = scripts()
        .idem_begin
        .key(&keys.lock)
        .key(keys.idem_record())
        .arg(args.holder)
        .arg(args.token.get())
        .arg(args.fingerprint)
        .arg(millis(args.retention))
        .arg(on_death.as_arg())
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    Ok(match begin_code("idem_begin", &reply)? {
        BeginCode::Begun(took_over, started_ms) => KeyBeginReply::Begun {
            took_over,
            started_ms,
        },
        BeginCode::NotHeld => KeyBeginReply::NotHeld,
        BeginCode::Record(code, record) => {
            let record = key_record("idem_begin", record)?;
            match code {
                2 => KeyBeginReply::Done(record),
                3 => KeyBeginReply::Abandoned(record),
                -2 => KeyBeginReply::Newer(record),
                -3 => KeyBeginReply::OtherFingerprint(record),
                _ => {
                    return Err(Error::Protocol(format!(
                        "idem_begin.lua answered {reply:?}"
                    )))
                }
            }
        }
    })
}

/// Stores the run's result, or leaves the key to a retry, fenced by its token
/// (`idem_finish.lua`).
pub(crate) async fn idem_finish<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    args: KeyArgs<'_>,
    started_ms: u64,
    finish: KeyFinish<'_>,
) -> Result<FinishReply, Error> {
    let (outcome, result): (&str, &[u8]) = match finish {
        KeyFinish::Done(result) => ("done", result),
        KeyFinish::Final(result) => ("final", result),
        KeyFinish::Failed => ("failed", b""),
    };
    let reply: Vec<i64> = scripts()
        .idem_finish
        .key(keys.idem_record())
        .arg(args.holder)
        .arg(args.token.get())
        .arg(args.fingerprint)
        .arg(started_ms)
        .arg(millis(args.retention))
        .arg(outcome)
        .arg(result)
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    finish_reply("idem_finish", &reply)
}

/// Outcome of `idem_read.lua`: the newest run within the record's retention, and the key
/// lock's holder.
pub(crate) type KeyRead = RunRead<KeyRecord>;

/// Whether `idem_read.lua` only reads, or deletes the record of a key nobody holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyReadMode {
    Read,
    Forget,
}

/// Reads an idempotency key's record and its lock's holder token (`idem_read.lua`); with
/// [`KeyReadMode::Forget`], also deletes the record when nobody holds the key.
pub(crate) async fn idem_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    mode: KeyReadMode,
) -> Result<KeyRead, Error> {
    let reply: Vec<redis::Value> = scripts()
        .idem_read
        .key(&keys.lock)
        .key(keys.idem_record())
        .arg(match mode {
            KeyReadMode::Read => "read",
            KeyReadMode::Forget => "forget",
        })
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    read_reply("idem_read", &reply, |record| {
        key_record("idem_read", record)
    })
}

/// Decodes `runner, token, started, finished, failed, final, result, fingerprint` (0: not
/// set).
fn key_record(script: &str, fields: &[redis::Value]) -> Result<KeyRecord, Error> {
    use redis::Value::{BulkString, Int};
    let shaped = match fields {
        [run @ .., Int(is_final), BulkString(result), BulkString(fingerprint)] => {
            RawRun::shape(run).map(|run| (run, *is_final, result, fingerprint))
        }
        _ => None,
    };
    let Some((run, is_final, result, fingerprint)) = shaped else {
        return Err(Error::Protocol(format!(
            "{script}.lua answered the idempotency record {fields:?}"
        )));
    };
    let run = run.decode(script)?;
    Ok(KeyRecord {
        runner: run.runner,
        token: run.token,
        started_ms: run.started_ms,
        finished_ms: run.finished_ms,
        failed_ms: run.failed_ms,
        is_final_failure: is_final == 1,
        result: result.clone(),
        fingerprint: fingerprint.clone(),
    })
}
