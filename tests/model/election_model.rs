//! Random programs of election steps (three candidates campaigning, resigning, being deposed
//! behind their backs, resigning and writing late after that, everyone reading the leader),
//! checked step by step against a reference model: at most one leader, terms strictly
//! increasing from leader to leader, the leader read by anyone is the model's (id, term and
//! metadata together), a deposed leader's resignation touches nothing and its fenced write is
//! refused once a newer leader wrote. Negative controls of the lock scripts an election is
//! built on, reachable through the election API, must each fail it.
//!
//! `FENCELOCK_PROPTEST_CASES` sets the number of programs (default 64).

use fencelock::{FencingToken, LeaderGuard, LockClient};
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

const CANDIDATES: usize = 3;

#[derive(Debug, Clone, Copy)]
enum Op {
    /// Candidate `0` tries to lead (`try_campaign`).
    Campaign(usize),
    /// The leader, if it is this candidate, resigns.
    Resign(usize),
    /// The election's key is deleted, as when the leader's lease ends behind its back.
    Depose,
    /// Candidate `0`'s deposed guard, if it has one, resigns (late).
    ResignDeposed(usize),
    /// Candidate `0` writes with its term (as leader, or as a deposed one) to fenced storage.
    Write(usize),
    /// Candidate `0` reads the leader.
    Read(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let who = 0..CANDIDATES;
    prop_oneof![
        4 => who.clone().prop_map(Op::Campaign),
        2 => who.clone().prop_map(Op::Resign),
        2 => Just(Op::Depose),
        1 => who.clone().prop_map(Op::ResignDeposed),
        3 => who.clone().prop_map(Op::Write),
        2 => who.prop_map(Op::Read),
    ]
}

struct Candidate {
    client: LockClient,
    leading: Option<LeaderGuard>,
    deposed: Option<LeaderGuard>,
}

struct World<'a> {
    server: &'a RedisServer,
    candidates: Vec<Candidate>,
    /// The model: who leads (candidate, term), every term seen, the storage's mark.
    leader: Option<(usize, FencingToken)>,
    terms: Vec<FencingToken>,
    mark: Option<FencingToken>,
}

fn fail(what: &str, err: fencelock::Error) -> TestCaseError {
    TestCaseError::fail(format!("{what}: {err}"))
}

impl World<'_> {
    fn metadata(candidate: usize) -> Vec<u8> {
        format!("candidate-{candidate}").into_bytes()
    }

    async fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Campaign(i) => {
                let election = self.candidates[i].client.election("model").unwrap();
                let won = election
                    .try_campaign(&Self::metadata(i))
                    .await
                    .map_err(|e| fail("campaign", e))?;
                match (won, self.leader) {
                    (Some(guard), None) => {
                        let term = guard.term();
                        if let Some(last) = self.terms.last() {
                            prop_assert!(term > *last, "term {term} after {last}");
                        }
                        self.terms.push(term);
                        self.leader = Some((i, term));
                        self.candidates[i].leading = Some(guard);
                    }
                    (None, Some(_)) => {}
                    (Some(guard), Some(leader)) => {
                        prop_assert!(
                            false,
                            "candidate {i} won term {} while {leader:?} leads",
                            guard.term()
                        );
                    }
                    (None, None) => prop_assert!(false, "candidate {i} lost a free election"),
                }
            }
            Op::Resign(i) => {
                if let Some(guard) = self.candidates[i].leading.take() {
                    guard.resign().await.map_err(|e| fail("resign", e))?;
                    self.leader = None;
                }
            }
            Op::Depose => {
                let keys: Vec<Vec<u8>> =
                    raw(self.server).keys("fencelock:{*}leader:model").unwrap();
                if !keys.is_empty() {
                    let _: () = raw(self.server).del(keys).unwrap();
                }
                if let Some((i, _)) = self.leader.take() {
                    let candidate = &mut self.candidates[i];
                    candidate.deposed = candidate.leading.take();
                }
            }
            Op::ResignDeposed(i) => {
                if let Some(guard) = self.candidates[i].deposed.take() {
                    let late = guard.resign().await;
                    prop_assert!(
                        matches!(late, Err(ref err) if err.is_not_held()),
                        "a deposed leader's resignation answered {late:?}"
                    );
                }
            }
            Op::Write(i) => {
                let candidate = &self.candidates[i];
                let Some(term) = candidate
                    .leading
                    .as_ref()
                    .or(candidate.deposed.as_ref())
                    .map(LeaderGuard::term)
                else {
                    return Ok(());
                };
                let storage = candidate.client.resource("model-state").unwrap();
                let written = storage.set(term, format!("by {i}")).await;
                if self.mark.is_none_or(|mark| term >= mark) {
                    prop_assert!(written.is_ok(), "term {term} refused: {written:?}");
                    self.mark = Some(term);
                } else {
                    prop_assert!(
                        matches!(written, Err(ref err) if err.is_stale_token()),
                        "a deposed term {term} written after {:?}: {written:?}",
                        self.mark
                    );
                }
            }
            Op::Read(i) => {
                let election = self.candidates[i].client.election("model").unwrap();
                let read = election.leader().await.map_err(|e| fail("read", e))?;
                match (read, self.leader) {
                    (None, None) => {}
                    (Some(read), Some((leader, term))) => {
                        let guard = self.candidates[leader].leading.as_ref().unwrap();
                        prop_assert_eq!(read.term(), term);
                        prop_assert_eq!(read.id(), guard.id());
                        prop_assert_eq!(read.metadata(), &Self::metadata(leader)[..]);
                    }
                    (read, model) => prop_assert!(false, "read {read:?}, model {model:?}"),
                }
            }
        }
        Ok(())
    }
}

fn raw(server: &RedisServer) -> redis::Connection {
    server.client().get_connection().unwrap()
}

async fn run_program(
    server: &RedisServer,
    program: &[Op],
    control: Option<Control>,
) -> Result<(), TestCaseError> {
    let _: () = redis::cmd("FLUSHALL").query(&mut raw(server)).unwrap();
    let mut candidates = Vec::new();
    for _ in 0..CANDIDATES {
        let mut builder = LockClient::builder(server.url());
        #[cfg(fencelock_negative_controls)]
        if let Some(control) = control {
            builder = builder.negative_control(control);
        }
        #[cfg(not(fencelock_negative_controls))]
        let _: Option<Control> = control;
        candidates.push(Candidate {
            client: builder.connect().await.unwrap(),
            leading: None,
            deposed: None,
        });
    }
    let mut world = World {
        server,
        candidates,
        leader: None,
        terms: Vec::new(),
        mark: None,
    };
    for op in program {
        world.step(*op).await?;
    }
    // Every program ends with everyone reading the model's leader.
    for i in 0..CANDIDATES {
        world.step(Op::Read(i)).await?;
    }
    Ok(())
}

/// Runs `cases` random programs of up to 30 steps on one server; the first failure, shrunk.
fn run_cases(cases: u32, control: Option<Control>) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start().unwrap();
    let mut runner = crate::common::model_runner(cases, control.is_some());
    runner
        .run(&prop::collection::vec(op(), 1..30), |program| {
            runtime.block_on(run_program(&server, &program, control))
        })
        .map_err(|failure| failure.to_string())
}

fn cases() -> u32 {
    crate::common::env_cases("FENCELOCK_PROPTEST_CASES", 64)
}

#[test]
fn random_election_programs_match_the_model() {
    let started = std::time::Instant::now();
    if let Err(failure) = run_cases(cases(), None) {
        panic!("{failure}");
    }
    eprintln!(
        "{} election programs passed in {:?}",
        cases(),
        started.elapsed()
    );
}

/// The lock scripts' controls that an election program can reach each make it fail: a second
/// leader while one leads, a term reused, a deposed leader's resignation freeing its
/// successor, a deposed leader's write accepted.
#[cfg(fencelock_negative_controls)]
#[test]
fn the_election_model_catches_the_controls_it_can_reach() {
    for control in [
        Control::AcquireIgnoresHolder,
        Control::AcquireReusesToken,
        Control::ReleaseWithoutOwnerCheck,
        Control::FenceNoCheck,
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
