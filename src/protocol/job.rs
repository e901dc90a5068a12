//! The scheduled-job scripts: begin a tick, record it done or failed, read it back.

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::run_record::{begin_code, finish_reply, read_reply, BeginCode, RawRun, RunRead};
use super::{millis, ms_from, scripts, FinishReply, LockKeys, RunnerDeathArg};
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
    Ok(match begin_code("job_begin", &reply)? {
        BeginCode::Begun(took_over, started_ms) => BeginReply::Begun {
            took_over,
            started_ms,
        },
        BeginCode::NotHeld => BeginReply::NotHeld,
        BeginCode::Record(code, record) => {
            let record = tick_record("job_begin", record)?;
            match code {
                2 => BeginReply::Done(record),
                3 => BeginReply::Abandoned(record),
                4 => BeginReply::Late(record),
                -2 => BeginReply::Newer(record),
                _ => return Err(Error::Protocol(format!("job_begin.lua answered {reply:?}"))),
            }
        }
    })
}

/// How a run ended, as `job_finish.lua` records it: the tick done, or left to a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunOutcome {
    Done,
    Failed,
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
    finish_reply("job_finish", &reply)
}

/// Outcome of `job_read.lua`: the newest tick begun within the record's retention, and the
/// job lock's holder.
pub(crate) type JobRead = RunRead<TickRecord>;

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
    read_reply("job_read", &reply, |record| tick_record("job_read", record))
}

/// Decodes `tick, runner, token, started, finished, failed` (0: not set).
fn tick_record(script: &str, fields: &[redis::Value]) -> Result<TickRecord, Error> {
    let shaped = match fields {
        [redis::Value::Int(tick), run @ ..] => RawRun::shape(run).map(|run| (*tick, run)),
        _ => None,
    };
    let Some((tick, run)) = shaped else {
        return Err(Error::Protocol(format!(
            "{script}.lua answered the tick record {fields:?}"
        )));
    };
    let tick_ms = ms_from(script, tick)?;
    let run = run.decode(script)?;
    Ok(TickRecord {
        tick_ms,
        runner: run.runner,
        token: run.token,
        started_ms: run.started_ms,
        finished_ms: run.finished_ms,
        failed_ms: run.failed_ms,
    })
}
