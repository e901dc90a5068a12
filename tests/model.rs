//! Random programs of acquire / re-enter / release / extend / forced expiry by several holders
//! in two clients, checked step by step against a small reference model of one lock, and the
//! Redis state compared with the model after every step.
//!
//! `FENCELOCK_PROPTEST_CASES` raises the number of programs (default 64).

mod common;

use std::time::Duration;

use common::Fixture;
use fencelock::{FencingToken, LockClient, LockGuard};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis::Commands;

const HOLDERS: usize = 3;
const NAME: &str = "model";

#[derive(Debug, Clone)]
enum Step {
    /// Holder slot `h` tries to take the lock (as a new holder if it already holds).
    Acquire(usize),
    /// Holder slot `h` re-enters through its newest guard.
    Reenter(usize),
    /// Holder slot `h` releases one of its guards, picked by `pick` (out of order allowed).
    Release(usize, usize),
    Extend(usize),
    /// The lock disappears behind everyone's back (`DEL`, or `PEXPIRE 1`).
    Expire {
        by_delete: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let h = 0..HOLDERS;
    prop_oneof![
        3 => h.clone().prop_map(Step::Acquire),
        2 => h.clone().prop_map(Step::Reenter),
        3 => (h.clone(), 0..4usize).prop_map(|(h, p)| Step::Release(h, p)),
        1 => h.prop_map(Step::Extend),
        1 => any::<bool>().prop_map(|by_delete| Step::Expire { by_delete }),
    ]
}

/// What the lock should look like.
#[derive(Default, Debug)]
struct Model {
    /// The slot holding the lock and its entry count, if any.
    owner: Option<(usize, u64)>,
    token: Option<FencingToken>,
    highest_issued: Option<FencingToken>,
}

/// One slot's guards; `lost` once the lock went away under it.
#[derive(Default)]
struct Slot {
    guards: Vec<LockGuard>,
    lost: bool,
}

async fn run_program(fx: &Fixture, clients: &[LockClient], steps: &[Step]) -> Result<(), String> {
    let mut model = Model::default();
    let mut slots: Vec<Slot> = (0..HOLDERS).map(|_| Slot::default()).collect();
    for (i, step) in steps.iter().enumerate() {
        let lock = clients[match step {
            Step::Acquire(h) | Step::Reenter(h) | Step::Release(h, _) | Step::Extend(h) => h % 2,
            Step::Expire { .. } => 0,
        }]
        .lock(NAME)
        .unwrap();
        let ctx = |what: &str| format!("step {i} {step:?}: {what}");
        match *step {
            Step::Acquire(h) => match lock.try_acquire().await.map_err(|e| ctx(&e.to_string()))? {
                Some(guard) => {
                    if model.owner.is_some() {
                        return Err(ctx("acquired a held lock"));
                    }
                    if model.highest_issued.is_some_and(|t| guard.token() <= t) {
                        return Err(ctx("token did not increase"));
                    }
                    // The slot's old guards (if any) belong to a holder that lost the lock.
                    for old in slots[h].guards.drain(..) {
                        std::mem::forget(old);
                    }
                    model.owner = Some((h, 1));
                    model.token = Some(guard.token());
                    model.highest_issued = Some(guard.token());
                    slots[h] = Slot {
                        guards: vec![guard],
                        lost: false,
                    };
                }
                None => {
                    if model.owner.is_none() {
                        return Err(ctx("a free lock was refused"));
                    }
                }
            },
            Step::Reenter(h) => {
                let Some(outer) = slots[h].guards.last() else {
                    continue;
                };
                match outer.reenter().await {
                    Ok(inner) => {
                        let Some((owner, count)) = model.owner.filter(|(o, _)| *o == h) else {
                            return Err(ctx("re-entered a lock the slot lost"));
                        };
                        if Some(inner.token()) != model.token {
                            return Err(ctx("re-entry changed the token"));
                        }
                        model.owner = Some((owner, count + 1));
                        slots[h].guards.push(inner);
                    }
                    Err(e) if e.is_not_held() => {
                        if model.owner.is_some_and(|(o, _)| o == h) {
                            return Err(ctx("owner was refused re-entry"));
                        }
                    }
                    Err(e) => return Err(ctx(&e.to_string())),
                }
            }
            Step::Release(h, pick) => {
                if slots[h].guards.is_empty() {
                    continue;
                }
                let index = pick % slots[h].guards.len();
                let guard = slots[h].guards.remove(index);
                let held = model.owner.is_some_and(|(o, _)| o == h) && !slots[h].lost;
                match guard.release().await {
                    Ok(()) if held => {
                        let (owner, count) = model.owner.unwrap();
                        model.owner = (count > 1).then_some((owner, count - 1));
                    }
                    Ok(()) => return Err(ctx("a lost holder released successfully")),
                    Err(e) if e.is_not_held() && !held => {}
                    Err(e) => return Err(ctx(&e.to_string())),
                }
            }
            Step::Extend(h) => {
                let Some(guard) = slots[h].guards.last() else {
                    continue;
                };
                let held = model.owner.is_some_and(|(o, _)| o == h) && !slots[h].lost;
                match guard.extend(Duration::from_secs(60)).await {
                    Ok(()) if held => {}
                    Ok(()) => return Err(ctx("a lost holder extended")),
                    Err(e) if e.is_not_held() && !held => {}
                    Err(e) => return Err(ctx(&e.to_string())),
                }
            }
            Step::Expire { by_delete } => {
                if let Some(key) = fx.lock_key(NAME) {
                    if by_delete {
                        let _: () = fx.raw().del(&key).unwrap();
                    } else {
                        let _: () = fx.raw().pexpire(&key, 1).unwrap();
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                }
                if let Some((owner, _)) = model.owner.take() {
                    slots[owner].lost = true;
                }
            }
        }
        check_redis(fx, &model, &slots).map_err(|e| ctx(&e))?;
    }
    // Every guard left is released (or finds its lock lost); the lock must end free.
    for slot in &mut slots {
        for guard in slot.guards.drain(..) {
            let _ = guard.release().await;
        }
    }
    if fx.lock_key(NAME).is_some() {
        return Err("the lock is still held after every guard was released".into());
    }
    Ok(())
}

fn check_redis(fx: &Fixture, model: &Model, slots: &[Slot]) -> Result<(), String> {
    let actual = fx.lock_state(NAME);
    match (model.owner, actual) {
        (None, None) => Ok(()),
        (Some((owner, count)), Some((holders, token))) => {
            let expected_id = slots[owner].guards[0].holder_id().to_owned();
            if holders != vec![(expected_id, count)] {
                return Err(format!("redis has {holders:?}, model {owner}x{count}"));
            }
            if Some(token) != model.token.map(FencingToken::get) {
                return Err(format!("redis token {token}, model {:?}", model.token));
            }
            Ok(())
        }
        (expected, actual) => Err(format!("model {expected:?}, redis {actual:?}")),
    }
}

#[test]
fn random_programs_match_the_model() {
    let cases = std::env::var("FENCELOCK_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let fx = Fixture::start();
    let clients: Vec<LockClient> =
        runtime.block_on(async { vec![fx.client().await, fx.client().await] });
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(step(), 1..40), |steps| {
        let _: () = redis::cmd("FLUSHALL").query(&mut fx.raw()).unwrap();
        runtime
            .block_on(run_program(&fx, &clients, &steps))
            .map_err(TestCaseError::fail)
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}
