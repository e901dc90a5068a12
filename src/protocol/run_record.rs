//! The run record shared by jobs and idempotency keys (`lua/lib/run_record.lua`): the fields
//! every record carries, and the replies of the begin, finish and read scripts of both.

use std::time::Duration;

use redis::Value;

use super::{lock_state, ms_from, token_from, unexpected};
use crate::base::error::Error;
use crate::base::token::FencingToken;

/// The fields every run record answers with: its runner, token and times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RunFields {
    pub(super) runner: String,
    pub(super) token: FencingToken,
    /// Server time of the begin, ms since the Unix epoch.
    pub(super) started_ms: u64,
    /// Server time the run finished; `None` until then.
    pub(super) finished_ms: Option<u64>,
    /// Server time the run failed and left the record to a retry; `None` otherwise.
    pub(super) failed_ms: Option<u64>,
}

/// `runner, token, started, finished, failed` (0: not set) as a script answered them, before
/// they are checked.
pub(super) struct RawRun<'a>(&'a [u8], [i64; 4]);

impl<'a> RawRun<'a> {
    /// The five fields, when `fields` has their shape.
    pub(super) fn shape(fields: &'a [Value]) -> Option<RawRun<'a>> {
        use redis::Value::{BulkString, Int};
        match fields {
            [BulkString(runner), Int(token), Int(started), Int(finished), Int(failed)] => {
                Some(RawRun(runner, [*token, *started, *finished, *failed]))
            }
            _ => None,
        }
    }

    /// The fields checked: a UTF-8 runner, a valid token, times that are times.
    pub(super) fn decode(self, script: &str) -> Result<RunFields, Error> {
        let RawRun(runner, [token, started, finished, failed]) = self;
        let time = |raw: i64| (raw != 0).then(|| ms_from(script, raw)).transpose();
        Ok(RunFields {
            runner: String::from_utf8(runner.to_vec()).map_err(|_| {
                Error::Protocol(format!("{script}.lua answered a runner that is not UTF-8"))
            })?,
            token: token_from(token)?,
            started_ms: ms_from(script, started)?,
            finished_ms: time(finished)?,
            failed_ms: time(failed)?,
        })
    }
}

/// What a runner whose hold ended before it finished leaves to the next begin.
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

/// A begin script's reply, before the kind reads its record.
pub(super) enum BeginCode<'a> {
    /// The caller runs: the token of the runner it took over from, if any, and the server
    /// time of the begin.
    Begun(Option<FencingToken>, u64),
    /// The caller does not hold the lock with its token.
    NotHeld,
    /// Any other code, with the record the reply names.
    Record(i64, &'a [Value]),
}

/// Splits a begin script's reply (`lib/run_record.lua`'s `run_begin`) into its code and record.
pub(super) fn begin_code<'a>(script: &str, reply: &'a [Value]) -> Result<BeginCode<'a>, Error> {
    use redis::Value::Int;
    match reply {
        [Int(1), Int(previous), Int(started)] => Ok(BeginCode::Begun(
            u64::try_from(*previous).ok().and_then(FencingToken::new),
            ms_from(script, *started)?,
        )),
        [Int(-1)] => Ok(BeginCode::NotHeld),
        [Int(code), record @ ..] => Ok(BeginCode::Record(*code, record)),
        _ => Err(Error::Protocol(format!("{script}.lua answered {reply:?}"))),
    }
}

/// Outcome of a finish script (`job_finish.lua`, `idem_finish.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FinishReply {
    /// The end is recorded at server time `finished_ms`.
    Done { finished_ms: u64 },
    /// A runner with the newer `token` took over; nothing changed.
    TakenOver { token: FencingToken },
}

/// Reads a finish script's reply (`lib/run_record.lua`'s `run_finish`).
pub(super) fn finish_reply(script: &str, reply: &[i64]) -> Result<FinishReply, Error> {
    match reply {
        [1, finished] => Ok(FinishReply::Done {
            finished_ms: ms_from(script, *finished)?,
        }),
        [-2, token] => Ok(FinishReply::TakenOver {
            token: token_from(*token)?,
        }),
        other => Err(unexpected(script, other)),
    }
}

/// Outcome of a read script (`job_read.lua`, `idem_read.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunRead<R> {
    /// The newest run within the record's retention.
    pub(crate) record: Option<R>,
    /// The token of the lock's holder; `None` when the lock is free.
    pub(crate) lock_token: Option<FencingToken>,
    /// When the lock is held: the time left of its lease (`None` inside: no expiry).
    pub(crate) lease_left: Option<Option<Duration>>,
}

/// Reads a read script's reply (`lib/run_record.lua`'s `run_read`), the record by `decode`.
pub(super) fn read_reply<R>(
    script: &str,
    reply: &[Value],
    decode: impl FnOnce(&[Value]) -> Result<R, Error>,
) -> Result<RunRead<R>, Error> {
    use redis::Value::Int;
    let (record, token, pttl) = match reply {
        [Int(0), Int(token), Int(pttl)] => (None, token, pttl),
        [Int(1), record @ .., Int(token), Int(pttl)] => (Some(record), token, pttl),
        other => return Err(Error::Protocol(format!("{script}.lua answered {other:?}"))),
    };
    let (lock_token, lease_left) = lock_state(*token, *pttl);
    Ok(RunRead {
        record: record.map(decode).transpose()?,
        lock_token,
        lease_left,
    })
}
