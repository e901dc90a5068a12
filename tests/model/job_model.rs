//! Random programs of scheduled-job calls (three instances with their own clock offsets and
//! runner-death policies calling for ticks in any order; runs that finish, runs whose job
//! fails and leaves the tick to a retry, runs dropped mid-job, runs whose hold ends under
//! them while another instance takes over), checked call
//! by call against a reference model of the job's tick record, with the record in Redis
//! compared after every step. The negative controls of the job scripts that a program can
//! reach must each fail it.
//!
//! `FENCELOCK_PROPTEST_CASES` sets the number of programs (default 64).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::deadline::{within, HANDOFF};
use fencelock::{FencingToken, Job, JobOptions, JobOutcome, LockClient, OnRunnerDeath};
use fencelock_testing::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use redis::Commands;

#[cfg(fencelock_negative_controls)]
use fencelock::negative_controls::Control;
/// Without negative controls compiled in, a program never runs with one.
#[cfg(not(fencelock_negative_controls))]
#[derive(Debug, Clone, Copy)]
enum Control {}

const PERIOD_MS: i64 = 10_000;
/// Each instance's clock offset, and what it does with a dead runner's tick.
const INSTANCES: [(i64, OnRunnerDeath); 3] = [
    (-2_000, OnRunnerDeath::GiveUp),
    (0, OnRunnerDeath::RunAgain),
    (2_400, OnRunnerDeath::RunAgain),
];

#[derive(Debug, Clone)]
enum Op {
    /// `instance` calls for tick `tick` (plus `late` ms of late wake-up); its job finishes,
    /// fails (`run_fallible` returning an error: the tick is left to a retry), or the call is
    /// dropped mid-job.
    Call {
        instance: usize,
        tick: i64,
        late: i64,
        dies: bool,
        fails: bool,
    },
    /// `runner` calls and its hold ends mid-job (the lock deleted behind it); `taker` calls
    /// for `tick + step` meanwhile; then the runner's job finishes.
    Overrun {
        runner: usize,
        taker: usize,
        tick: i64,
        step: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..6i64, 0..1_500i64, prop::bool::weighted(0.25), prop::bool::weighted(0.2)).prop_map(
            |(instance, tick, late, dies, fails)| Op::Call { instance, tick, late, dies, fails }
        ),
        1 => (0..3usize, 1..3usize, 0..6i64, -1..=1i64).prop_map(|(runner, shift, tick, step)| {
            Op::Overrun { runner, taker: (runner + shift) % 3, tick, step }
        }),
    ]
}

/// The tick record as the model has it.
#[derive(Debug, Clone, Copy)]
struct Record {
    view_ms: i64,
    token: FencingToken,
    finished: bool,
    /// Its job failed and left the tick to a retry.
    failed: bool,
}

/// What a call for `view_ms` by an instance with `policy` must do, given `record`.
#[derive(Debug, PartialEq, Eq)]
enum Expect {
    Begin { took_over: Option<FencingToken> },
    Done,
    Abandoned,
    Late,
}

fn expect(record: Option<Record>, view_ms: i64, policy: OnRunnerDeath) -> Expect {
    let Some(record) = record else {
        return Expect::Begin { took_over: None };
    };
    let distance = 2 * (view_ms - record.view_ms);
    if distance >= PERIOD_MS {
        Expect::Begin { took_over: None }
    } else if distance <= -PERIOD_MS {
        Expect::Late
    } else if record.finished {
        Expect::Done
    } else if record.failed || policy == OnRunnerDeath::RunAgain {
        Expect::Begin {
            took_over: Some(record.token),
        }
    } else {
        Expect::Abandoned
    }
}

struct World<'a> {
    server: &'a RedisServer,
    jobs: Vec<Job>,
    /// Every token a run began with, in order.
    tokens: Vec<FencingToken>,
    record: Option<Record>,
}

fn raw(server: &RedisServer) -> redis::Connection {
    server.client().get_connection().unwrap()
}

fn view(instance: usize, tick: i64, late: i64) -> (SystemTime, i64) {
    let ms = 1_800_000_000_000 + tick * PERIOD_MS + INSTANCES[instance].0 + late;
    (UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs()), ms)
}

fn check_outcome<T: std::fmt::Debug>(
    outcome: &JobOutcome<T>,
    expected: &Expect,
) -> Result<(), TestCaseError> {
    let matches = matches!(
        (expected, outcome),
        (Expect::Begin { .. }, JobOutcome::Ran { .. })
            | (Expect::Done, JobOutcome::SkippedDone { .. })
            | (Expect::Abandoned, JobOutcome::SkippedAbandoned { .. })
            | (Expect::Late, JobOutcome::SkippedLate { .. })
    );
    prop_assert!(matches, "expected {expected:?}, got {outcome:?}");
    Ok(())
}

impl World<'_> {
    fn policy(instance: usize) -> OnRunnerDeath {
        INSTANCES[instance].1
    }

    fn lock_held(&self) -> bool {
        let keys: Vec<String> = raw(self.server).keys("fencelock:{*}job:model").unwrap();
        !keys.is_empty()
    }

    async fn lock_released(&self) {
        within(HANDOFF, "a dropped run's lock is released", async {
            while self.lock_held() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
    }

    /// A new run's token must exceed every earlier one.
    fn began(&mut self, token: FencingToken) -> Result<(), TestCaseError> {
        if let Some(last) = self.tokens.last() {
            prop_assert!(token > *last, "token {token} after {last}");
        }
        self.tokens.push(token);
        Ok(())
    }

    async fn call(
        &mut self,
        instance: usize,
        tick: i64,
        late: i64,
        dies: bool,
        fails: bool,
    ) -> Result<(), TestCaseError> {
        let (at, ms) = view(instance, tick, late);
        let expected = expect(self.record, ms, Self::policy(instance));
        let job = self.jobs[instance].clone();
        if dies && matches!(expected, Expect::Begin { .. }) {
            let (began_tx, began_rx) = tokio::sync::oneshot::channel();
            let run = tokio::spawn(async move {
                job.run_exclusive(at, |run| async move {
                    began_tx.send((run.token(), run.took_over())).unwrap();
                    std::future::pending::<()>().await;
                })
                .await
            });
            let (token, took_over) = within(HANDOFF, "the run begins", began_rx).await.unwrap();
            run.abort();
            let _ = run.await;
            self.lock_released().await;
            prop_assert_eq!(Expect::Begin { took_over }, expected);
            self.began(token)?;
            self.record = Some(Record {
                view_ms: ms,
                token,
                finished: false,
                failed: false,
            });
            return Ok(());
        }
        if fails {
            let outcome = job
                .run_fallible(at, |run| async move { Err::<(), _>(run.took_over()) })
                .await
                .map_err(|err| TestCaseError::fail(format!("failing call: {err}")))?;
            check_outcome(&outcome, &expected)?;
            if let JobOutcome::Ran { token, output } = outcome {
                prop_assert_eq!(
                    Expect::Begin {
                        took_over: output.unwrap_err()
                    },
                    expected
                );
                self.began(token)?;
                self.record = Some(Record {
                    view_ms: ms,
                    token,
                    finished: false,
                    failed: true,
                });
            }
            return Ok(());
        }
        let outcome = job
            .run_exclusive(at, |run| async move { run.took_over() })
            .await
            .map_err(|err| TestCaseError::fail(format!("call: {err}")))?;
        check_outcome(&outcome, &expected)?;
        if let JobOutcome::Ran { token, output } = outcome {
            prop_assert_eq!(Expect::Begin { took_over: output }, expected);
            self.began(token)?;
            self.record = Some(Record {
                view_ms: ms,
                token,
                finished: true,
                failed: false,
            });
        }
        Ok(())
    }

    async fn overrun(
        &mut self,
        runner: usize,
        taker: usize,
        tick: i64,
        step: i64,
    ) -> Result<(), TestCaseError> {
        let (at, ms) = view(runner, tick, 0);
        if !matches!(
            expect(self.record, ms, Self::policy(runner)),
            Expect::Begin { .. }
        ) {
            return self.call(runner, tick, 0, false, false).await;
        }
        let job = self.jobs[runner].clone();
        let (began_tx, began_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let slow = tokio::spawn(async move {
            job.run_exclusive(at, |run| async move {
                began_tx.send(run.token()).unwrap();
                let _ = go_rx.await; // also when a failed program drops the sender
            })
            .await
        });
        let token = within(HANDOFF, "the slow run begins", began_rx)
            .await
            .unwrap();
        self.began(token)?;
        self.record = Some(Record {
            view_ms: ms,
            token,
            finished: false,
            failed: false,
        });
        // Its hold ends behind it, as when at_most_for passes.
        let keys: Vec<Vec<u8>> = raw(self.server).keys("fencelock:{*}job:model").unwrap();
        if !keys.is_empty() {
            let _: () = raw(self.server).del(keys).unwrap();
        }
        self.call(taker, tick + step, 0, false, false).await?;
        go_tx.send(()).unwrap();
        let finished = within(HANDOFF, "the slow run finishes", slow)
            .await
            .unwrap();
        let record = self.record.expect("a record");
        if record.token == token {
            // Nobody took over: the late finish is recorded.
            prop_assert!(
                matches!(finished, Ok(JobOutcome::Ran { .. })),
                "the overrun's finish with nobody after it: {finished:?}"
            );
            self.record = Some(Record {
                finished: true,
                ..record
            });
        } else {
            prop_assert!(
                matches!(finished, Err(ref err) if err.is_stale_token()),
                "the overrun's finish after a takeover: {finished:?}"
            );
        }
        Ok(())
    }

    /// The record in Redis is the model's.
    async fn compare(&self) -> Result<(), TestCaseError> {
        let read = self.jobs[0]
            .last_tick()
            .await
            .map_err(|err| TestCaseError::fail(format!("read: {err}")))?;
        match (self.record, read) {
            (None, None) => {}
            (Some(model), Some(read)) => {
                let view = read.tick().duration_since(UNIX_EPOCH).unwrap().as_millis();
                prop_assert_eq!(i128::try_from(view).unwrap(), i128::from(model.view_ms));
                prop_assert_eq!(read.token(), model.token);
                prop_assert_eq!(read.finished().is_some(), model.finished);
                prop_assert_eq!(read.failed().is_some(), model.failed);
            }
            (model, read) => prop_assert!(false, "model {model:?}, Redis {read:?}"),
        }
        Ok(())
    }
}

async fn run_program(
    server: &RedisServer,
    program: &[Op],
    control: Option<Control>,
) -> Result<(), TestCaseError> {
    let _: () = redis::cmd("FLUSHALL").query(&mut raw(server)).unwrap();
    let mut jobs = Vec::new();
    for (_, policy) in INSTANCES {
        let mut builder = LockClient::builder(server.url());
        #[cfg(fencelock_negative_controls)]
        if let Some(control) = control {
            builder = builder.negative_control(control);
        }
        #[cfg(not(fencelock_negative_controls))]
        let _: Option<Control> = control;
        let client = builder.connect().await.unwrap();
        let options = JobOptions::new(
            Duration::from_millis(PERIOD_MS.unsigned_abs()),
            Duration::from_secs(30),
        )
        .on_runner_death(policy);
        jobs.push(client.job("model", options).unwrap());
    }
    let mut world = World {
        server,
        jobs,
        tokens: Vec::new(),
        record: None,
    };
    for op in program {
        match *op {
            Op::Call {
                instance,
                tick,
                late,
                dies,
                fails,
            } => world.call(instance, tick, late, dies, fails).await?,
            Op::Overrun {
                runner,
                taker,
                tick,
                step,
            } => world.overrun(runner, taker, tick, step).await?,
        }
        world.compare().await?;
    }
    Ok(())
}

/// Runs `cases` random programs of up to 24 steps on one server; the first failure, shrunk.
fn run_cases(cases: u32, control: Option<Control>) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start().unwrap();
    let mut runner = crate::common::model_runner(cases, control.is_some());
    runner
        .run(&prop::collection::vec(op(), 1..24), |program| {
            runtime.block_on(run_program(&server, &program, control))
        })
        .map_err(|failure| failure.to_string())
}

fn cases() -> u32 {
    crate::common::env_cases("FENCELOCK_PROPTEST_CASES", 64)
}

#[test]
fn random_job_programs_match_the_model() {
    let started = std::time::Instant::now();
    if let Err(failure) = run_cases(cases(), None) {
        panic!("{failure}");
    }
    eprintln!("{} job programs passed in {:?}", cases(), started.elapsed());
}

/// Each job control that a program of calls can reach makes the model check fail (the
/// fourth, a begin by a non-holder, cannot be reached through the API: its contract check in
/// `src/protocol/job_tests.rs` catches it).
#[cfg(fencelock_negative_controls)]
#[test]
fn the_job_model_catches_the_job_scripts_negative_controls() {
    for control in [
        Control::JobRerunsDoneTick,
        Control::JobRunsOlderTick,
        Control::JobFinishWithoutFence,
        Control::JobGivesUpFailedTick,
    ] {
        if let Err(why) = control.applies() {
            eprintln!("NOT JUDGED {control:?}: {why}");
            continue;
        }
        match run_cases(cases(), Some(control)) {
            Ok(()) => panic!(
                "{control:?}: {} programs passed; the model missed it",
                cases()
            ),
            Err(failure) => eprintln!(
                "{control:?} caught: {}",
                failure.lines().next().unwrap_or("")
            ),
        }
    }
}
