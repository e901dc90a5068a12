//! The scheduled-job scripts (`job_begin.lua`, `job_finish.lua`, `job_read.lua`): a job's
//! tick record is a run record ([`super::run_record`]) whose own field is the tick.
//!
//! A begin's own arguments are the tick and the period (two views less than half a period
//! apart are one tick), a finish's the tick; its own refusal (code 4) says a newer tick has
//! begun.

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use super::run_record::{run_read, Record, RunKind, RunRead};
use super::scripts::Scripts;
use super::LockKeys;
use crate::base::error::Error;

/// A job's own field of its tick record: the tick as its first runner saw it, ms since the
/// Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tick {
    pub(crate) tick_ms: u64,
}

/// A job's tick record as the job scripts return it: the newest tick begun and its runner.
pub(crate) type TickRecord = Record<Tick>;

/// Outcome of `job_read.lua`: the newest tick begun within the record's retention, and the
/// job lock's holder.
pub(crate) type JobRead = RunRead<Tick>;

impl RunKind for Tick {
    const WHAT: &'static str = "tick record";
    const REFUSED: i64 = 4;

    const NAMES: [&'static str; 3] = ["job_begin", "job_finish", "job_read"];

    fn scripts(all: &Scripts) -> [&Script; 3] {
        [&all.job_begin, &all.job_finish, &all.job_read]
    }

    fn record_key(keys: &LockKeys) -> Vec<u8> {
        keys.job_record()
    }

    /// `tick, runner, token, started, finished, failed`.
    fn split(fields: &[Value]) -> Option<(Tick, &[Value])> {
        match fields {
            [Value::Int(tick), run @ ..] => Some((
                Tick {
                    tick_ms: u64::try_from(*tick).ok()?,
                },
                run,
            )),
            _ => None,
        }
    }
}

/// Reads a job's tick record and its lock's holder token (`job_read.lua`); writes nothing.
pub(crate) async fn job_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
) -> Result<JobRead, Error> {
    run_read(conn, keys, &[]).await
}
