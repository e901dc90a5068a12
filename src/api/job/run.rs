//! What a job's tick and an idempotency key's run share above their scripts: the runner-death
//! policy as the begin scripts take it, a record's times, a takeover as an error, and what a
//! finish's reply leaves to the run.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::OnRunnerDeath;
use crate::api::guard::LockGuard;
use crate::base::error::{Error, Superseded};
use crate::base::metrics;
use crate::base::token::FencingToken;
use crate::protocol::{FinishReply, RunnerDeathArg};

impl OnRunnerDeath {
    /// The policy as the begin scripts take it.
    pub(crate) fn arg(self) -> RunnerDeathArg {
        match self {
            OnRunnerDeath::GiveUp => RunnerDeathArg::GiveUp,
            OnRunnerDeath::RunAgain => RunnerDeathArg::RunAgain,
        }
    }
}

/// A record's server time, ms since the Unix epoch.
pub(crate) fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// The error of a run with token `presented` whose record a newer runner (token `latest`)
/// has taken over.
pub(crate) fn taken_over(presented: FencingToken, latest: FencingToken) -> Error {
    Error::StaleToken {
        presented,
        latest,
        by: Superseded::TookOver,
    }
}

/// What the reply of a finish leaves to the run holding `guard` with `token`: the guard back
/// and the server time its end was recorded; or the error, passed through `report`, when a
/// newer runner had taken the record over (a stale write, refused), or when the finish went
/// unanswered. Then whether it landed is unknown, so the hold is kept until its lease ends
/// rather than let another caller run the same work again at once.
pub(crate) fn finished(
    reply: Result<FinishReply, Error>,
    guard: LockGuard,
    token: FencingToken,
    report: impl FnOnce(Error) -> Error,
) -> Result<(LockGuard, u64), Error> {
    match reply {
        Ok(FinishReply::Done { finished_ms }) => Ok((guard, finished_ms)),
        Ok(FinishReply::TakenOver { token: latest }) => {
            metrics::stale_write_rejected();
            Err(report(taken_over(token, latest)))
        }
        Err(err) => {
            guard.keep_until_lease_ends();
            Err(report(err))
        }
    }
}
