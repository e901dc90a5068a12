//! What a run of an idempotency key learns: the key's record, what the run's closure may
//! return, and the outcome (ran here, or why not).

use std::time::SystemTime;

#[cfg(doc)]
use super::{Idempotency, IdempotencyOptions, KeyRun};
use crate::api::job::run::{self, from_millis};
#[cfg(doc)]
use crate::api::job::OnRunnerDeath;
use crate::base::metrics;
use crate::base::token::FencingToken;
use crate::protocol;

/// An idempotency key's record: its newest run, who ran it with which token, and the stored
/// result once it finished.
///
/// ```no_run
/// # async fn demo(payments: fencelock::Idempotency) -> Result<(), fencelock::Error> {
/// if let Some(record) = payments.record("order-1842").await? {
///     println!("run by {} with token {}, result: {:?}",
///         record.runner(), record.token(), record.result());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    runner: String,
    token: FencingToken,
    started: SystemTime,
    finished: Option<SystemTime>,
    failed: Option<SystemTime>,
    is_final_failure: bool,
    result: Vec<u8>,
    fingerprint: Vec<u8>,
}

impl From<protocol::KeyRecord> for RunRecord {
    fn from(record: protocol::KeyRecord) -> RunRecord {
        RunRecord {
            runner: record.runner,
            token: record.token,
            started: from_millis(record.started_ms),
            finished: record.finished_ms.map(from_millis),
            failed: record.failed_ms.map(from_millis),
            is_final_failure: record.own.is_final_failure,
            result: record.own.result,
            fingerprint: record.own.fingerprint,
        }
    }
}

impl RunRecord {
    run::record_accessors!();

    /// The stored result, once the run finished: what its closure returned, or the result of
    /// a failure made final ([`Self::is_final_failure`]).
    pub fn result(&self) -> Option<&[u8]> {
        self.finished.map(|_| &self.result[..])
    }

    /// Whether the stored result is a failure the runner made final ([`Failure::Final`]).
    pub fn is_final_failure(&self) -> bool {
        self.is_final_failure
    }

    /// The fingerprint of the request the key was first used for.
    pub fn fingerprint(&self) -> &[u8] {
        &self.fingerprint
    }
}

/// How a run's closure failed.
///
/// ```
/// use fencelock::Failure;
/// let declined: Failure<&str> = Failure::Final {
///     error: "card declined",
///     result: br#"{"status":"declined"}"#.to_vec(),
/// };
/// assert_eq!(declined.error(), &"card declined");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure<E> {
    /// Leave the key to a retry: its record says failed, its hold is released at once, and
    /// the next run with the key runs the request again with a newer token. For failures a
    /// retry may not meet (a timeout, a service that was down).
    Retry(E),
    /// Store `result` as the key's outcome, marked as a failure: every later duplicate gets
    /// it, as after a success. For failures a retry would only repeat (a declined card).
    Final {
        /// The error, handed back to this run's caller.
        error: E,
        /// What duplicates are answered (at most [`MAX_RESULT_LEN`](crate::MAX_RESULT_LEN)
        /// bytes).
        result: Vec<u8>,
    },
}

impl<E> Failure<E> {
    /// The error, whichever kind of failure.
    pub fn error(&self) -> &E {
        match self {
            Failure::Retry(error) | Failure::Final { error, .. } => error,
        }
    }
}

/// How one [`Idempotency::run`] call ended.
///
/// ```no_run
/// # async fn demo(payments: fencelock::Idempotency) -> Result<(), fencelock::Error> {
/// use fencelock::{Failure, Processed};
/// let outcome = payments.run("order-1842", "amount=500;to=acct-9", |run| async move {
///     // charge, fenced by run.token() ...
///     Ok::<_, Failure<String>>(b"charged 500".to_vec())
/// }).await?;
/// match outcome.result() {
///     Some(result) => println!("answer: {}", String::from_utf8_lossy(result)),
///     None => println!("not finished yet: {outcome:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "the outcome says whether the request ran, and what to answer"]
#[non_exhaustive]
pub enum Processed<E> {
    /// This call ran the request with fencing token `token`. `output` is what its closure
    /// returned: `Ok` (stored as the key's result), [`Failure::Final`] (stored, marked as a
    /// failure) or [`Failure::Retry`] (nothing stored; the key is left to a retry).
    Ran {
        /// The run's fencing token.
        token: FencingToken,
        /// What the closure returned.
        output: Result<Vec<u8>, Failure<E>>,
    },
    /// An earlier run finished: its stored result is in the record.
    Completed(RunRecord),
    /// Another run holds the key now (by whom and since when, when its record is there: a
    /// hold just taken has none yet). With [`IdempotencyOptions::wait_for_outcome`], after
    /// that long. A hold that ended between this call's attempt and its read of the record
    /// does not answer this: the call takes the key itself (or, when that keeps racing other
    /// calls, answers `None` here after a few tries).
    InProgress(Option<RunRecord>),
    /// The key's runner lost its hold before finishing, and the namespace's
    /// [`OnRunnerDeath::GiveUp`] policy leaves it: nothing runs it again within the
    /// retention.
    Abandoned(RunRecord),
}

impl<E> Processed<E> {
    /// Whether this call ran the request.
    pub fn ran(&self) -> bool {
        matches!(self, Processed::Ran { .. })
    }

    /// The key's stored result, if it has one: the one this call stored, or an earlier run's.
    /// `None` for a run in progress, one given up, and one that failed and left the key to a
    /// retry.
    pub fn result(&self) -> Option<&[u8]> {
        match self {
            Processed::Ran {
                output: Ok(result) | Err(Failure::Final { result, .. }),
                ..
            } => Some(result),
            Processed::Completed(record) => record.result(),
            _ => None,
        }
    }

    /// The record the answer came from (`None` when this call ran, or when the running hold
    /// had no record yet).
    pub fn record(&self) -> Option<&RunRecord> {
        match self {
            Processed::Completed(record) | Processed::Abandoned(record) => Some(record),
            Processed::InProgress(record) => record.as_ref(),
            Processed::Ran { .. } => None,
        }
    }

    /// The metric and event label of this outcome.
    pub(super) fn label(&self) -> &'static str {
        match self {
            Processed::Ran { output, .. } => match output {
                Ok(_) => metrics::KEY_RAN,
                Err(Failure::Final { .. }) => metrics::KEY_RAN_FINAL,
                Err(Failure::Retry(_)) => metrics::KEY_RAN_FAILED,
            },
            Processed::Completed(_) => metrics::KEY_COMPLETED,
            Processed::InProgress(_) => metrics::KEY_IN_PROGRESS,
            Processed::Abandoned(_) => metrics::KEY_ABANDONED,
        }
    }
}
