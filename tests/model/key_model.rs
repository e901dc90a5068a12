//! Random programs of idempotency-key runs (three callers with their own runner-death
//! policies running two keys in any order, with the key's own request or another one; runs
//! that store their result, fail and leave the key to a retry, fail for good, are dropped
//! mid-run, or lose their hold mid-run while another caller takes over), checked call by call
//! against a reference model of each key's record, with the records in Redis compared after
//! every step. The negative controls of the key scripts that a program can reach must each
//! fail it.
//!
//! `FENCELOCK_PROPTEST_CASES` sets the number of programs (default 64).

use std::time::Duration;

use crate::common::deadline::{within, HANDOFF};
use fencelock::{
    Error, Failure, FencingToken, Idempotency, IdempotencyOptions, LockClient, OnRunnerDeath,
    Processed,
};
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

/// Each caller's policy for a key whose runner died.
const POLICIES: [OnRunnerDeath; 3] = [
    OnRunnerDeath::GiveUp,
    OnRunnerDeath::RunAgain,
    OnRunnerDeath::RunAgain,
];
const KEYS: [&str; 2] = ["k0", "k1"];
/// The key's own request, and another one under the same key.
const FINGERPRINTS: [&str; 2] = ["the request", "another request"];

/// How a run's closure ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ends {
    Stored,
    Retry,
    Final,
}

#[derive(Debug, Clone)]
enum Op {
    /// `caller` runs `key` with fingerprint `print`; its run ends as `ends`, or the call is
    /// dropped mid-run.
    Call {
        caller: usize,
        key: usize,
        print: usize,
        ends: Ends,
        dies: bool,
    },
    /// `runner` runs `key` and its hold ends mid-run (the lock deleted behind it); `taker`
    /// runs the same key meanwhile; then the runner's run stores its result.
    Overrun {
        runner: usize,
        taker: usize,
        key: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let ends = prop_oneof![3 => Just(Ends::Stored), 1 => Just(Ends::Retry), 1 => Just(Ends::Final)];
    prop_oneof![
        4 => (0..3usize, 0..2usize, prop::bool::weighted(0.15), ends, prop::bool::weighted(0.2))
            .prop_map(|(caller, key, other, ends, dies)| Op::Call {
                caller, key, print: usize::from(other), ends, dies
            }),
        1 => (0..3usize, 1..3usize, 0..2usize).prop_map(|(runner, shift, key)| {
            Op::Overrun { runner, taker: (runner + shift) % 3, key }
        }),
    ]
}

/// A key's record as the model has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Failed,
    Stored { is_final: bool },
}

#[derive(Debug, Clone, Copy)]
struct Record {
    token: FencingToken,
    print: usize,
    state: State,
}

/// What a run of a key with `print` by a caller with `policy` must do, given `record`.
#[derive(Debug, PartialEq, Eq)]
enum Expect {
    Begin { took_over: Option<FencingToken> },
    Completed,
    Abandoned,
    Reused,
}

fn expect(record: Option<Record>, print: usize, policy: OnRunnerDeath) -> Expect {
    let Some(record) = record else {
        return Expect::Begin { took_over: None };
    };
    if record.print != print {
        return Expect::Reused;
    }
    match record.state {
        State::Stored { .. } => Expect::Completed,
        State::Failed => Expect::Begin {
            took_over: Some(record.token),
        },
        State::Running if policy == OnRunnerDeath::RunAgain => Expect::Begin {
            took_over: Some(record.token),
        },
        State::Running => Expect::Abandoned,
    }
}

/// What a run stores: its token, so the record in Redis shows whose result it is.
fn result_of(token: FencingToken) -> Vec<u8> {
    token.to_string().into_bytes()
}

struct World<'a> {
    server: &'a RedisServer,
    callers: Vec<Idempotency>,
    tokens: Vec<FencingToken>,
    records: [Option<Record>; 2],
}

fn raw(server: &RedisServer) -> redis::Connection {
    server.client().get_connection().unwrap()
}

impl World<'_> {
    fn held(&self, key: usize) -> Vec<Vec<u8>> {
        raw(self.server)
            .keys(format!("fencelock:{{*}}idem:model:{}", KEYS[key]))
            .unwrap()
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
        caller: usize,
        key: usize,
        print: usize,
        ends: Ends,
        dies: bool,
    ) -> Result<(), TestCaseError> {
        let expected = expect(self.records[key], print, POLICIES[caller]);
        let handle = self.callers[caller].clone();
        if dies && matches!(expected, Expect::Begin { .. }) {
            let (began_tx, began_rx) = tokio::sync::oneshot::channel();
            let run = tokio::spawn(async move {
                handle
                    .run(KEYS[key], FINGERPRINTS[print], |run| async move {
                        began_tx.send((run.token(), run.took_over())).unwrap();
                        std::future::pending::<Result<Vec<u8>, Failure<()>>>().await
                    })
                    .await
            });
            let (token, took_over) = within(HANDOFF, "the run begins", began_rx).await.unwrap();
            run.abort();
            let _ = run.await;
            within(HANDOFF, "a dropped run's hold is released", async {
                while !self.held(key).is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
            .await;
            prop_assert_eq!(Expect::Begin { took_over }, expected);
            self.began(token)?;
            self.records[key] = Some(Record {
                token,
                print,
                state: State::Running,
            });
            return Ok(());
        }
        let outcome = handle
            .run(KEYS[key], FINGERPRINTS[print], |run| async move {
                let took_over = run.took_over();
                match ends {
                    Ends::Stored => Ok(result_of(run.token())),
                    Ends::Retry => Err(Failure::Retry(took_over)),
                    Ends::Final => Err(Failure::Final {
                        error: took_over,
                        result: result_of(run.token()),
                    }),
                }
            })
            .await;
        match (&expected, outcome) {
            (Expect::Reused, Err(Error::KeyReused { .. })) => {}
            (Expect::Completed, Ok(Processed::Completed(record))) => {
                let model = self.records[key].expect("a record");
                prop_assert_eq!(record.token(), model.token);
            }
            (Expect::Abandoned, Ok(Processed::Abandoned(record))) => {
                prop_assert_eq!(record.token(), self.records[key].expect("a record").token);
            }
            (Expect::Begin { took_over }, Ok(Processed::Ran { token, output })) => {
                let seen = match &output {
                    Ok(_) => *took_over,
                    Err(failure) => *failure.error(),
                };
                prop_assert_eq!(seen, *took_over, "took_over");
                self.began(token)?;
                let state = match ends {
                    Ends::Stored => State::Stored { is_final: false },
                    Ends::Retry => State::Failed,
                    Ends::Final => State::Stored { is_final: true },
                };
                self.records[key] = Some(Record {
                    token,
                    print,
                    state,
                });
            }
            (expected, outcome) => {
                prop_assert!(false, "expected {expected:?}, got {outcome:?}");
            }
        }
        Ok(())
    }

    async fn overrun(
        &mut self,
        runner: usize,
        taker: usize,
        key: usize,
    ) -> Result<(), TestCaseError> {
        if !matches!(
            expect(self.records[key], 0, POLICIES[runner]),
            Expect::Begin { .. }
        ) {
            return self.call(runner, key, 0, Ends::Stored, false).await;
        }
        let handle = self.callers[runner].clone();
        let (began_tx, began_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let slow = tokio::spawn(async move {
            handle
                .run(KEYS[key], FINGERPRINTS[0], |run| async move {
                    began_tx.send(run.token()).unwrap();
                    let _ = go_rx.await; // also when a failed program drops the sender
                    Ok::<_, Failure<()>>(result_of(run.token()))
                })
                .await
        });
        let token = within(HANDOFF, "the slow run begins", began_rx)
            .await
            .unwrap();
        self.began(token)?;
        self.records[key] = Some(Record {
            token,
            print: 0,
            state: State::Running,
        });
        // Its hold ends behind it, as when at_most_for passes.
        let held = self.held(key);
        if !held.is_empty() {
            let _: () = raw(self.server).del(held).unwrap();
        }
        self.call(taker, key, 0, Ends::Stored, false).await?;
        go_tx.send(()).unwrap();
        let finished = within(HANDOFF, "the slow run finishes", slow)
            .await
            .unwrap();
        let record = self.records[key].expect("a record");
        if record.token == token {
            // Nobody took over: the late result is stored.
            prop_assert!(
                matches!(finished, Ok(Processed::Ran { output: Ok(_), .. })),
                "the overrun's finish with nobody after it: {finished:?}"
            );
            self.records[key] = Some(Record {
                state: State::Stored { is_final: false },
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

    /// The records in Redis are the model's.
    async fn compare(&self) -> Result<(), TestCaseError> {
        for (key, model) in self.records.iter().enumerate() {
            let read = self.callers[0]
                .record(KEYS[key])
                .await
                .map_err(|err| TestCaseError::fail(format!("read: {err}")))?;
            match (model, read) {
                (None, None) => {}
                (Some(model), Some(read)) => {
                    prop_assert_eq!(read.token(), model.token);
                    prop_assert_eq!(read.fingerprint(), FINGERPRINTS[model.print].as_bytes());
                    let state = match (read.finished(), read.failed()) {
                        (Some(_), _) => State::Stored {
                            is_final: read.is_final_failure(),
                        },
                        (None, Some(_)) => State::Failed,
                        (None, None) => State::Running,
                    };
                    prop_assert_eq!(state, model.state);
                    if let State::Stored { .. } = state {
                        prop_assert_eq!(read.result(), Some(&result_of(model.token)[..]));
                    }
                }
                (model, read) => prop_assert!(false, "key {key}: model {model:?}, Redis {read:?}"),
            }
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
    let mut callers = Vec::new();
    for policy in POLICIES {
        let mut builder = LockClient::builder(server.url());
        #[cfg(fencelock_negative_controls)]
        if let Some(control) = control {
            builder = builder.negative_control(control);
        }
        #[cfg(not(fencelock_negative_controls))]
        let _: Option<Control> = control;
        let client = builder.connect().await.unwrap();
        let options = IdempotencyOptions::new(Duration::from_secs(30)).on_runner_death(policy);
        callers.push(client.idempotency("model", options).unwrap());
    }
    let mut world = World {
        server,
        callers,
        tokens: Vec::new(),
        records: [None, None],
    };
    for op in program {
        match *op {
            Op::Call {
                caller,
                key,
                print,
                ends,
                dies,
            } => world.call(caller, key, print, ends, dies).await?,
            Op::Overrun { runner, taker, key } => world.overrun(runner, taker, key).await?,
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
fn random_key_programs_match_the_model() {
    let started = std::time::Instant::now();
    if let Err(failure) = run_cases(cases(), None) {
        panic!("{failure}");
    }
    eprintln!("{} key programs passed in {:?}", cases(), started.elapsed());
}

/// Each key control that a program of runs can reach makes the model check fail (the fourth,
/// a begin by a non-holder, cannot be reached through the API: its contract check in
/// `src/protocol/idempotency_tests.rs` catches it).
#[cfg(fencelock_negative_controls)]
#[test]
fn the_key_model_catches_the_key_scripts_negative_controls() {
    for control in [
        Control::KeyRerunsDone,
        Control::KeyResultWithoutFence,
        Control::KeyIgnoresFingerprint,
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
