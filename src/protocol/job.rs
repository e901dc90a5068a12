//! The scheduled-job scripts: begin a tick, record it done or failed, read it back.

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::{lock_state, millis, ms_from, scripts, token_from, unexpected, LockKeys};
use crate::base::error::Error;
use crate::base::token::FencingToken;

/// A job's tick record as the job scripts return it: the newest tick begun and its runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TickRecord {
    /// The tick as its first runner saw it, ms since the Unix epoch.
    pub(crate) tick_ms: u64,
    pub(crate) runner: String,
    pub(crate) token: FencingToken,
    /// Server time of the begin, ms since the Unix epoch.
    pub(crate) started_ms: u64,
    /// Server time of the finish; `None` while the tick runs (or its runner died).
    pub(crate) finished_ms: Option<u64>,
    /// Server time its run failed and left the tick to a retry; `None` otherwise.
    pub(crate) failed_ms: Option<u64>,
}

/// Outcome of `job_begin.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BeginReply {
    /// The caller runs the tick; `took_over` is the token of a runner whose hold had ended
    /// before it finished the same tick. `started_ms` is the server time of the begin.
    Begun {
        took_over: Option<FencingToken>,
        started_ms: u64,
    },
    /// The same tick is done.
    Done(TickRecord),
    /// The same tick's runner lost its hold before finishing, and the policy gives it up.
    Abandoned(TickRecord),
    /// A newer tick has begun.
    Late(TickRecord),
    /// The caller does not hold the job's lock with its token.
    NotHeld,
    /// The record carries a newer token than the caller's.
    Newer(TickRecord),
}

/// What a job does with a tick whose runner lost its hold before finishing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunnerDeathArg {
    RunAgain,
    GiveUp,
}

impl RunnerDeathArg {
    /// The policy as the begin scripts take it.
    pub(crate) fn as_arg(self) -> &'static str {
        match self {
            RunnerDeathArg::RunAgain => "run-again",
            RunnerDeathArg::GiveUp => "give-up",
        }
    }
}

/// The arguments of one tick's begin and finish.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TickArgs<'a> {
    pub(crate) holder: &'a str,
    pub(crate) token: FencingToken,
    pub(crate) tick_ms: u64,
    pub(crate) retention: Duration,
}

/// Records that `args.holder` (holding the job's lock with `args.token`) runs the tick
/// `args.tick_ms`, unless that tick is done, abandoned or past (`job_begin.lua`).
pub(crate) async fn job_begin<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    args: TickArgs<'_>,
    period: Duration,
    on_death: RunnerDeathArg,
) -> Result<BeginReply, Error> {
    let reply: Vec<redis::Value> = scripts()
        .job_begin
        .key(&keys.lock)
        .key(keys.job_record())
        .arg(args.holder)
        .arg(args.token.get())
        .arg(args.tick_ms)
        .arg(millis(period))
        .arg(millis(args.retention))
        .arg(on_death.as_arg())
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    use redis::Value::Int;
    match reply.as_slice() {
        [Int(1), Int(previous), Int(started)] => Ok(BeginReply::Begun {
            took_over: u64::try_from(*previous).ok().and_then(FencingToken::new),
            started_ms: ms_from("job_begin", *started)?,
        }),
        [Int(-1)] => Ok(BeginReply::NotHeld),
        [Int(code), record @ ..] => {
            let record = tick_record("job_begin", record)?;
            match code {
                2 => Ok(BeginReply::Done(record)),
                3 => Ok(BeginReply::Abandoned(record)),
                4 => Ok(BeginReply::Late(record)),
                -2 => Ok(BeginReply::Newer(record)),
                _ => Err(Error::Protocol(format!("job_begin.lua answered {reply:?}"))),
            }
        }
        _ => Err(Error::Protocol(format!("job_begin.lua answered {reply:?}"))),
    }
}

/// How a run ended, as `job_finish.lua` records it: the tick done, or left to a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunOutcome {
    Done,
    Failed,
}

/// Outcome of `job_finish.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FinishReply {
    /// The tick is recorded done (or failed) at server time `finished_ms`.
    Done { finished_ms: u64 },
    /// A runner with the newer `token` took the job over; nothing changed.
    TakenOver { token: FencingToken },
}

/// Records the tick of `args` done, fenced by its token (`job_finish.lua`).
pub(crate) async fn job_finish<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    args: TickArgs<'_>,
    started_ms: u64,
    outcome: RunOutcome,
) -> Result<FinishReply, Error> {
    let reply: Vec<i64> = scripts()
        .job_finish
        .key(keys.job_record())
        .arg(args.holder)
        .arg(args.token.get())
        .arg(args.tick_ms)
        .arg(started_ms)
        .arg(millis(args.retention))
        .arg(match outcome {
            RunOutcome::Done => "done",
            RunOutcome::Failed => "failed",
        })
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    match reply.as_slice() {
        [1, finished] => Ok(FinishReply::Done {
            finished_ms: ms_from("job_finish", *finished)?,
        }),
        [-2, token] => Ok(FinishReply::TakenOver {
            token: token_from(*token)?,
        }),
        other => Err(unexpected("job_finish", other)),
    }
}

/// Outcome of `job_read.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobRead {
    /// The newest tick begun within the record's retention.
    pub(crate) record: Option<TickRecord>,
    /// The token of the job lock's holder; `None` when the lock is free.
    pub(crate) lock_token: Option<FencingToken>,
    /// When the lock is held: the time left of its lease (`None` inside: no expiry).
    pub(crate) lease_left: Option<Option<Duration>>,
}

/// Reads a job's tick record and its lock's holder token (`job_read.lua`); writes nothing.
pub(crate) async fn job_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
) -> Result<JobRead, Error> {
    let reply: Vec<redis::Value> = scripts()
        .job_read
        .key(&keys.lock)
        .key(keys.job_record())
        .invoke_async(conn)
        .await
        .map_err(Error::from_reply)?;
    use redis::Value::Int;
    match reply.as_slice() {
        [Int(0), Int(token), Int(pttl)] => {
            let (lock_token, lease_left) = lock_state(*token, *pttl);
            Ok(JobRead {
                record: None,
                lock_token,
                lease_left,
            })
        }
        [Int(1), record @ .., Int(token), Int(pttl)] => {
            let (lock_token, lease_left) = lock_state(*token, *pttl);
            Ok(JobRead {
                record: Some(tick_record("job_read", record)?),
                lock_token,
                lease_left,
            })
        }
        other => Err(Error::Protocol(format!("job_read.lua answered {other:?}"))),
    }
}

/// Decodes `tick, runner, token, started, finished, failed` (0: not set).
fn tick_record(script: &str, fields: &[redis::Value]) -> Result<TickRecord, Error> {
    use redis::Value::{BulkString, Int};
    let time = |raw: i64| (raw != 0).then(|| ms_from(script, raw)).transpose();
    match fields {
        [Int(tick), BulkString(runner), Int(token), Int(started), Int(finished), Int(failed)] => {
            Ok(TickRecord {
                tick_ms: ms_from(script, *tick)?,
                runner: String::from_utf8(runner.clone()).map_err(|_| {
                    Error::Protocol(format!("{script}.lua answered a runner that is not UTF-8"))
                })?,
                token: token_from(*token)?,
                started_ms: ms_from(script, *started)?,
                finished_ms: time(*finished)?,
                failed_ms: time(*failed)?,
            })
        }
        other => Err(Error::Protocol(format!(
            "{script}.lua answered the tick record {other:?}"
        ))),
    }
}
