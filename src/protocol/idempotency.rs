//! The idempotency-key scripts (`idem_begin.lua`, `idem_finish.lua`, `idem_read.lua`): a
//! key's record is a run record ([`super::run_record`]) whose own fields are the request's
//! fingerprint and, once finished, the stored result.
//!
//! A begin's and a finish's own argument is the fingerprint, and a finish's tail the result;
//! a begin's own refusal (code -3) says the key was used with another fingerprint. The read
//! also forgets (deletes) the record of a key nobody holds, for operators.

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use super::run_record::{run_read, Record, RunKind, RunRead};
use super::scripts::Scripts;
use super::LockKeys;
use crate::base::error::Error;
use crate::base::token::FencingToken;

/// An idempotency key's own fields of its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyResult {
    /// The stored result is a failure the runner made final.
    pub(crate) is_final_failure: bool,
    /// The stored result (empty unless finished).
    pub(crate) result: Vec<u8>,
    pub(crate) fingerprint: Vec<u8>,
}

/// An idempotency key's record as the scripts return it: the newest run and its result.
pub(crate) type KeyRecord = Record<KeyResult>;

/// Outcome of `idem_read.lua`: the newest run within the record's retention, and the key
/// lock's holder.
pub(crate) type KeyRead = RunRead<KeyResult>;

impl RunKind for KeyResult {
    const WHAT: &'static str = "idempotency record";
    const REFUSED: i64 = -3;

    const NAMES: [&'static str; 3] = ["idem_begin", "idem_finish", "idem_read"];

    fn scripts(all: &Scripts) -> [&Script; 3] {
        [&all.idem_begin, &all.idem_finish, &all.idem_read]
    }

    fn record_key(keys: &LockKeys) -> Vec<u8> {
        keys.idem_record()
    }

    /// `runner, token, started, finished, failed, final, result, fingerprint`.
    fn split(fields: &[Value]) -> Option<(KeyResult, &[Value])> {
        use redis::Value::{BulkString, Int};
        match fields {
            [run @ .., Int(is_final), BulkString(result), BulkString(fingerprint)] => Some((
                KeyResult {
                    is_final_failure: *is_final == 1,
                    result: result.clone(),
                    fingerprint: fingerprint.clone(),
                },
                run,
            )),
            _ => None,
        }
    }
}

/// Whether `idem_read.lua` only reads, or deletes the record of a key nobody holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyReadMode {
    Read,
    /// Delete the record when nobody holds the key, and it is the run with this token's (any
    /// run's: `None`).
    Forget(Option<FencingToken>),
}

/// Reads an idempotency key's record and its lock's holder token (`idem_read.lua`); with
/// [`KeyReadMode::Forget`], also deletes the record when nobody holds the key.
pub(crate) async fn idem_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    mode: KeyReadMode,
) -> Result<KeyRead, Error> {
    match mode {
        KeyReadMode::Read => run_read(conn, keys, &["read".to_owned()]).await,
        KeyReadMode::Forget(run) => {
            let run = run.map(|t| t.get().to_string()).unwrap_or_default();
            run_read(conn, keys, &["forget".to_owned(), run]).await
        }
    }
}
