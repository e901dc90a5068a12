//! What a job's tick and an idempotency key's run share above their scripts: a record's
//! times, and the begin and finish of a run on the one run-record binding
//! (`protocol::run_record`), with the runner-death policy as the begin scripts take it, a
//! takeover as an error, and what a finish's reply leaves to the run. Each kind passes its own
//! arguments (`own`) and keeps its own answers; this is everything else.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::ToRedisArgs;

use super::OnRunnerDeath;
use crate::api::guard::LockGuard;
use crate::base::durations::{whole_millis_in, OutOfRange};
use crate::base::error::{Error, Superseded};
use crate::base::metrics;
use crate::base::token::FencingToken;
use crate::engine::holder::Holder;
use crate::protocol::{self, BeginReply, FinishReply, Record, RunArgs, RunEnd, RunKind};

/// The longest span a job or key accepts (a period, a retention): ten years. Longer is a unit
/// mistake.
pub(crate) const MAX_SPAN: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// Checks that `d`, the `what` of a job or key, is a whole number of milliseconds within
/// `min..=max` (`max` named `max_name`); the reason why not otherwise.
pub(crate) fn check_span(
    what: &str,
    d: Duration,
    min: Duration,
    (max, max_name): (Duration, &str),
) -> Result<(), String> {
    match whole_millis_in(d, min, max) {
        Ok(_) => Ok(()),
        Err(OutOfRange::TooShort) => Err(format!("the {what} {d:?} is under {min:?}")),
        Err(OutOfRange::TooLong) => Err(format!("the {what} {d:?} is over {max_name}")),
        Err(OutOfRange::NotWholeMillis) => Err(format!(
            "the {what} {d:?} is not a whole number of milliseconds"
        )),
    }
}

/// A record's server time, ms since the Unix epoch.
pub(crate) fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// A run this call has begun: its guard, its hold as its view keeps it, the server time of its
/// begin, and the retention its record is written with.
pub(crate) struct Started {
    pub(crate) guard: LockGuard,
    pub(crate) hold: RunHold,
    started_ms: u64,
    retention: Duration,
}

/// A run's hold as its view ([`JobRun`](crate::JobRun), [`KeyRun`](crate::KeyRun)) keeps it:
/// the holder, and the token of the runner it took over from (whose hold had ended before it
/// finished, or whose run failed).
#[derive(Clone)]
pub(crate) struct RunHold {
    pub(crate) holder: Arc<Holder>,
    pub(crate) took_over: Option<FencingToken>,
}

/// What a job's or key's begin found for its caller: a run to do (`R`, the run with what its
/// finish needs), or the answer without running (`A`, the outcome of a skip or a duplicate).
pub(crate) enum Begun<R, A> {
    Run(R),
    Answered(A),
}

/// What a begin found: a run to do, or the record that answers instead, as the kind's public
/// record (`R`: [`TickRecord`](crate::TickRecord), [`RunRecord`](crate::RunRecord)).
pub(crate) enum Began<R> {
    Run(Started),
    /// The run is done (a job's tick, a key's result stored).
    Done(R),
    /// Its runner lost its hold before finishing, and the policy gives the run up.
    Abandoned(R),
    /// The kind's own refusal: a newer tick has begun, or the key was used with another
    /// fingerprint.
    Refused(R),
}

/// The error of a run of `name` (a job, an idempotency key) with token `presented` whose
/// record a newer runner (token `latest`) has taken over.
fn taken_over(name: &[u8], presented: FencingToken, latest: FencingToken) -> Error {
    Error::stale(name, presented, latest, Superseded::TookOver)
}

/// Records the run of `guard`'s holder in the record next to its lock, or finds why not
/// (`K`'s begin script, with `own` the kind's arguments). Anything but a run to do lets go of
/// the guard at once: a record that answers (as `R`), [`Error::NotHeld`] when the guard's hold
/// is gone (deleted by an operator), [`Error::StaleToken`] when the record carries a newer
/// token.
pub(crate) async fn begin<K: RunKind, R: From<Record<K>>>(
    guard: LockGuard,
    own: impl ToRedisArgs + Copy,
    retention: Duration,
    on_death: OnRunnerDeath,
) -> Result<Began<R>, Error> {
    let holder = guard.holder().clone();
    let args = RunArgs {
        holder: &holder.id,
        token: holder.token,
        retention,
    };
    let give_up = on_death == OnRunnerDeath::GiveUp;
    let keys = &*holder.keys;
    let reply = holder
        .engine
        .retrying(|mut conn| async move {
            protocol::run_begin(&mut conn, keys, args, own, give_up).await
        })
        .await
        .map_err(|err| err.named(&holder.name));
    let found = match reply {
        Ok(BeginReply::Begun {
            took_over,
            started_ms,
        }) => {
            let hold = RunHold { holder, took_over };
            return Ok(Began::Run(Started {
                guard,
                hold,
                started_ms,
                retention,
            }));
        }
        Ok(BeginReply::Done(record)) => Ok(Began::Done(record.into())),
        Ok(BeginReply::Abandoned(record)) => Ok(Began::Abandoned(record.into())),
        Ok(BeginReply::Refused(record)) => Ok(Began::Refused(record.into())),
        Ok(BeginReply::NotHeld) => Err(Error::not_held(guard.lock_name())),
        Ok(BeginReply::Newer(record)) => {
            Err(taken_over(guard.lock_name(), holder.token, record.token))
        }
        Err(err) => Err(err),
    };
    // Nothing to run: let go at once (a failed release is finished in the background, and
    // the lease bounds it anyway).
    let _ = guard.release().await;
    found
}

impl Started {
    /// Records the run's end, fenced by its token (`K`'s finish script, with `own` the kind's
    /// arguments and `result` what a key stores): the guard back and how long the run took by
    /// the server's clock, in ms; or the error, passed through `report`, when a newer runner
    /// had taken the record over (a stale write, refused), or when the finish went unanswered.
    /// Then whether it landed is unknown, so the hold is kept until its lease ends rather than
    /// let another caller run the same work again at once.
    pub(crate) async fn finish<K: RunKind>(
        self,
        own: impl ToRedisArgs + Copy,
        end: RunEnd,
        result: Option<&[u8]>,
        report: impl FnOnce(Error) -> Error,
    ) -> Result<(LockGuard, u64), Error> {
        let holder = self.guard.holder().clone();
        let args = RunArgs {
            holder: &holder.id,
            token: holder.token,
            retention: self.retention,
        };
        let (keys, started_ms) = (&*holder.keys, self.started_ms);
        let reply = holder
            .engine
            .retrying(|mut conn| async move {
                protocol::run_finish::<K, _>(&mut conn, keys, args, own, started_ms, end, result)
                    .await
            })
            .await
            .map_err(|err| err.named(&holder.name));
        match reply {
            Ok(FinishReply::Done { finished_ms }) => {
                Ok((self.guard, finished_ms.saturating_sub(started_ms)))
            }
            Ok(FinishReply::TakenOver { token: latest }) => {
                metrics::stale_write_rejected();
                let name = self.guard.lock_name();
                Err(report(taken_over(name, holder.token, latest)))
            }
            Err(err) => {
                self.guard.keep_until_lease_ends();
                Err(report(err))
            }
        }
    }
}

/// Writes the accessors every run's view has ([`JobRun`](crate::JobRun),
/// [`KeyRun`](crate::KeyRun)), inside its `impl`: the type has `run: RunHold`.
macro_rules! run_view_accessors {
    () => {
        /// This run's fencing token: strictly greater than every earlier run's of its job or
        /// key (and of every other name in its slot bucket). Pass it to every write the run
        /// makes.
        pub fn token(&self) -> FencingToken {
            self.run.holder.token
        }

        /// `Some(token)` when this run takes over from a runner (with that token) that lost
        /// its hold before finishing
        /// ([`OnRunnerDeath::RunAgain`](crate::OnRunnerDeath::RunAgain)), or whose run failed
        /// and left the work to a retry: its writes may be half done.
        pub fn took_over(&self) -> Option<FencingToken> {
            self.run.took_over
        }

        /// Whether the run still holds its job or key as far as this process knows:
        /// `at_most_for` has not passed since it began. A belief, not a proof; fence the
        /// writes with [`Self::token`].
        pub fn is_valid(&self) -> bool {
            self.run.holder.is_valid()
        }

        /// When the hold ends by this process' monotonic clock (`at_most_for` after the
        /// acquiring request was sent).
        pub fn valid_until(&self) -> Instant {
            self.run.holder.deadline()
        }

        /// Resolves when the hold has ended (`at_most_for` passed): from then on another
        /// caller may run the same work again (another instance take the tick over, a
        /// duplicate run the request), so a long run should stop here.
        ///
        /// # Cancel safety
        /// Cancel safe: it only waits and changes nothing.
        pub async fn lost(&self) {
            self.run.holder.lost().await;
        }
    };
}
pub(crate) use run_view_accessors;

/// Writes the accessors every record's public view has ([`TickRecord`](crate::TickRecord),
/// [`RunRecord`](crate::RunRecord)), inside its `impl`: the type has the fields `runner`,
/// `token`, `started`, `finished` and `failed`, the record's as times.
macro_rules! record_accessors {
    () => {
        /// The holder id of the runner (its client's [`id`](crate::LockClient::id), then a
        /// sequence number).
        pub fn runner(&self) -> &str {
            &self.runner
        }

        getters! {
            /// The runner's fencing token: strictly greater than every earlier run's of its job
            /// or key.
            fn token(&self) -> FencingToken => token;

            /// When the run began, by the Redis server's clock.
            fn started(&self) -> SystemTime => started;

            /// When the run finished (for a key: its result was stored), by the Redis server's
            /// clock; `None` while it runs, after its runner lost its hold before finishing, or
            /// after it failed.
            fn finished(&self) -> Option<SystemTime> => finished;

            /// When the run failed and left the work to a retry, by the Redis server's clock
            /// ([`Job::run_fallible`](crate::Job::run_fallible) under
            /// [`OnFailure::Retry`](crate::OnFailure::Retry),
            /// [`Failure::Retry`](crate::Failure::Retry)); `None` otherwise.
            fn failed(&self) -> Option<SystemTime> => failed;
        }
    };
}
pub(crate) use record_accessors;
