//! The run record shared by jobs and idempotency keys (`lua/lib/run_record.lua`): the fields
//! every record carries, and one binding for the begin, finish and read scripts of both kinds;
//! `job.rs` and `idempotency.rs` say what each kind adds ([`RunKind`]).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value::{BulkString, Int};
use redis::{Script, ToRedisArgs, Value};

use super::scripts::Scripts;
use super::{
    held_token, invoke, invoke_as, millis, ms_from, pttl_from, scripts, token_from, unexpected,
    LockKeys,
};
use crate::base::error::Error;
use crate::base::token::FencingToken;

/// What a kind of run record (a job's tick record, an idempotency key's record) adds to the
/// one both share: its scripts, its record's key and its own fields.
pub(crate) trait RunKind: Sized {
    /// How a reply's error names the record.
    const WHAT: &'static str;
    /// The begin script's code for the kind's own refusal: a job's newer tick (4), a key used
    /// with another fingerprint (-3).
    const REFUSED: i64;
    /// The names of the kind's begin, finish and read scripts.
    const NAMES: [&'static str; 3];
    /// The kind's begin, finish and read scripts.
    fn scripts(all: &Scripts) -> [&Script; 3];
    /// The record next to the lock of `keys`.
    fn record_key(keys: &LockKeys) -> Vec<u8>;
    /// The kind's own fields of a record as a script answered it, and the shared ones left
    /// (`runner, token, started, finished, failed`); `None` for another shape.
    fn split(fields: &[Value]) -> Option<(Self, &[Value])>;
}

/// A run record as the scripts answer it: the newest run, its runner and token, and the
/// kind's own fields (`K`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record<K> {
    pub(crate) runner: String,
    pub(crate) token: FencingToken,
    /// Server time of the begin, ms since the Unix epoch.
    pub(crate) started_ms: u64,
    /// Server time the run finished; `None` while it runs (or its runner died, or it failed).
    pub(crate) finished_ms: Option<u64>,
    /// Server time the run failed and left the record to a retry; `None` otherwise.
    pub(crate) failed_ms: Option<u64>,
    pub(crate) own: K,
}

impl<K: RunKind> Record<K> {
    /// Decodes a record's fields (0: a time not set): a UTF-8 runner, a valid token, times
    /// that are times.
    fn decode(script: &str, fields: &[Value]) -> Result<Record<K>, Error> {
        let what = K::WHAT;
        let unshaped = || Error::Protocol(format!("{script}.lua answered the {what} {fields:?}"));
        let (own, run) = K::split(fields).ok_or_else(unshaped)?;
        let [BulkString(runner), Int(token), Int(started), Int(finished), Int(failed)] = run else {
            return Err(unshaped());
        };
        let time = |raw: i64| (raw != 0).then(|| ms_from(script, raw)).transpose();
        Ok(Record {
            runner: String::from_utf8(runner.clone()).map_err(|_| {
                Error::Protocol(format!("{script}.lua answered a runner that is not UTF-8"))
            })?,
            token: token_from(*token)?,
            started_ms: ms_from(script, *started)?,
            finished_ms: time(*finished)?,
            failed_ms: time(*failed)?,
            own,
        })
    }
}

/// Who runs, with which token, and how long the record is kept after the write: the arguments
/// every begin and finish takes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunArgs<'a> {
    pub(crate) holder: &'a str,
    pub(crate) token: FencingToken,
    pub(crate) retention: Duration,
}

/// Outcome of a begin script (`job_begin.lua`, `idem_begin.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BeginReply<K> {
    /// The caller runs; `took_over` is the token of a runner whose hold had ended before it
    /// finished, or whose run failed. `started_ms` is the server time of the begin.
    Begun {
        took_over: Option<FencingToken>,
        started_ms: u64,
    },
    /// The run is done: a job's tick, a key's result stored.
    Done(Record<K>),
    /// The runner lost its hold before finishing, and the policy gives the run up.
    Abandoned(Record<K>),
    /// The kind's own refusal ([`RunKind::REFUSED`]): a newer tick has begun, or the key was
    /// used with another fingerprint.
    Refused(Record<K>),
    /// The caller does not hold the lock with its token.
    NotHeld,
    /// The record carries a newer token than the caller's.
    Newer(Record<K>),
}

/// Records that `args.holder` (holding the lock of `keys` with `args.token`) runs, unless the
/// record says why not: `K`'s begin script, with `own` its own arguments (a job's tick and
/// period, a key's fingerprint), and `give_up` the runner-death policy: whether a run whose
/// runner's hold ended before it finished is given up (else run again by this begin).
pub(crate) async fn run_begin<K: RunKind, C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    args: RunArgs<'_>,
    own: impl ToRedisArgs,
    give_up: bool,
) -> Result<BeginReply<K>, Error> {
    let [begin, ..] = K::scripts(scripts());
    let script = K::NAMES[0];
    let mut call = begin.key(&keys.lock);
    call.key(K::record_key(keys))
        .arg(args.holder)
        .arg(args.token.get())
        .arg(own)
        .arg(millis(args.retention))
        .arg(if give_up { "give-up" } else { "run-again" });
    let reply: Vec<Value> = invoke_as(conn, &call).await?;
    let record = |fields| Record::decode(script, fields);
    Ok(match &reply[..] {
        [Int(1), Int(previous), Int(started)] => BeginReply::Begun {
            took_over: held_token(*previous),
            started_ms: ms_from(script, *started)?,
        },
        [Int(-1)] => BeginReply::NotHeld,
        [Int(2), fields @ ..] => BeginReply::Done(record(fields)?),
        [Int(3), fields @ ..] => BeginReply::Abandoned(record(fields)?),
        [Int(-2), fields @ ..] => BeginReply::Newer(record(fields)?),
        [Int(code), fields @ ..] if *code == K::REFUSED => BeginReply::Refused(record(fields)?),
        _ => return Err(unexpected(script, &reply)),
    })
}

/// How a run ended, as a finish script records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunEnd {
    /// It ran: "finished".
    Done,
    /// It failed and the runner made that final (a key's result stored as a failure):
    /// "finished".
    Final,
    /// It failed and leaves the record to a retry: "failed".
    Failed,
}

/// Outcome of a finish script (`job_finish.lua`, `idem_finish.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FinishReply {
    /// The end is recorded at server time `finished_ms`.
    Done { finished_ms: u64 },
    /// A runner with the newer `token` took over; nothing changed.
    TakenOver { token: FencingToken },
}

/// Records the end of the run of `args`, begun at server time `started_ms`, fenced by its
/// token: `K`'s finish script, with `own` the kind's arguments as the begin's (a job's tick, a
/// key's fingerprint) and `result` what a key stores (none for a job).
pub(crate) async fn run_finish<K: RunKind, C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    args: RunArgs<'_>,
    own: impl ToRedisArgs,
    started_ms: u64,
    end: RunEnd,
    result: Option<&[u8]>,
) -> Result<FinishReply, Error> {
    let [_, finish, _] = K::scripts(scripts());
    let script = K::NAMES[1];
    let mut call = finish.key(K::record_key(keys));
    call.arg(args.holder)
        .arg(args.token.get())
        .arg(own)
        .arg(started_ms)
        .arg(millis(args.retention))
        .arg(match end {
            RunEnd::Done => "done",
            RunEnd::Final => "final",
            RunEnd::Failed => "failed",
        })
        .arg(result);
    let reply = invoke(conn, &call).await?;
    match reply[..] {
        [1, finished] => Ok(FinishReply::Done {
            finished_ms: ms_from(script, finished)?,
        }),
        [-2, token] => Ok(FinishReply::TakenOver {
            token: token_from(token)?,
        }),
        _ => Err(unexpected(script, &reply)),
    }
}

/// Outcome of a read script (`job_read.lua`, `idem_read.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunRead<K> {
    /// The newest run within the record's retention.
    pub(crate) record: Option<Record<K>>,
    /// The token of the lock's holder; `None` when the lock is free.
    pub(crate) lock_token: Option<FencingToken>,
    /// When the lock is held: the time left of its lease (`None` inside: no expiry).
    pub(crate) lease_left: Option<Option<Duration>>,
}

/// Reads the record of `keys` and its lock's holder token: `K`'s read script, with `mode` its
/// argument if it takes one; writes nothing unless `mode` says so.
pub(crate) async fn run_read<K: RunKind, C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    args: &[String],
) -> Result<RunRead<K>, Error> {
    let [_, _, read] = K::scripts(scripts());
    let script = K::NAMES[2];
    let mut call = read.key(&keys.lock);
    call.key(K::record_key(keys)).arg(args);
    let reply: Vec<Value> = invoke_as(conn, &call).await?;
    let (record, token, pttl) = match &reply[..] {
        [Int(0), Int(token), Int(pttl)] => (None, token, pttl),
        [Int(1), record @ .., Int(token), Int(pttl)] => (Some(record), token, pttl),
        other => return Err(unexpected(script, other)),
    };
    Ok(RunRead {
        record: record
            .map(|fields| Record::decode(script, fields))
            .transpose()?,
        // The lock's `~token` (0: none) and `PTTL` (-2: no key, -1: no expiry).
        lock_token: held_token(*token),
        lease_left: (*pttl != -2).then(|| pttl_from(*pttl)),
    })
}
