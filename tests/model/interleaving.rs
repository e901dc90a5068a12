//! Concurrent interleaving check: tokio tasks in three `LockClient`s (one behind a fault
//! proxy) run generated programs against one lock and one fenced resource while the lock is
//! expired from outside and connections are cut; the recorded history must satisfy every
//! property of `fencelock_testing::check`. The harness is in `tests/model/harness/interleaving.rs`.
//!
//! `FENCELOCK_INTERLEAVING_CASES` sets the number of schedules (default 16).

use crate::common::events::handoffs_of;
use crate::harness::interleaving::{run_cases, World};
use crate::harness::model::env_cases;

const REGRESSIONS: &str = "tests/proptest-regressions/interleaving.txt";

#[test]
fn concurrent_histories_satisfy_every_property() {
    let cases = env_cases("FENCELOCK_INTERLEAVING_CASES", 16);
    let world = World::new(None);
    let started = std::time::Instant::now();
    if let Err(failure) = run_cases(&world, 3..6, cases, Some(REGRESSIONS)) {
        panic!("{failure}");
    }
    let stats = world.stats();
    eprintln!(
        "{cases} interleaving schedules passed in {:?}: {stats:?}",
        started.elapsed()
    );
    // The check judged real work, not empty histories.
    assert!(stats.granted > 0 && stats.accepted > 0, "{stats:?}");
}

/// The same check with one client running every task: a release hands the lock to a waiting
/// task of the client in its own call (`handoff.lua`), while connections are cut and replies
/// lost, so grants whose reply was lost are claimed by the waiter's replay or undone.
#[test]
fn one_client_handoff_histories_satisfy_every_property() {
    let cases = env_cases("FENCELOCK_INTERLEAVING_CASES", 16).div_ceil(2);
    let world = World::one_client(None);
    let client = world.client_ids().pop().expect("one client");
    let before = handoffs_of(&client);
    if let Err(failure) = run_cases(&world, 3..6, cases, Some(REGRESSIONS)) {
        panic!("{failure}");
    }
    let stats = world.stats();
    let handed = handoffs_of(&client) - before;
    eprintln!("{cases} one-client interleaving schedules passed, {handed} handoffs: {stats:?}");
    assert!(stats.granted > 0 && stats.accepted > 0, "{stats:?}");
    assert!(handed > 0, "no release handed the lock on");
}

/// The same check with every client in fair-handoff mode: reservations, the queue and claims
/// under outside expiries, killed connections and partitions; no reservation or queue may be
/// left without an expiry.
#[test]
fn fair_handoff_histories_satisfy_every_property() {
    let cases = env_cases("FENCELOCK_INTERLEAVING_CASES", 16).div_ceil(2);
    let world = World::with_fair_handoff(None, Some(Duration::from_millis(100)));
    if let Err(failure) = run_cases(&world, 3..6, cases, Some(REGRESSIONS)) {
        panic!("{failure}");
    }
    let stats = world.stats();
    eprintln!("{cases} fair-handoff interleaving schedules passed: {stats:?}");
    assert!(stats.granted > 0 && stats.accepted > 0, "{stats:?}");
}

// ---- Several OS processes feeding one history ----
//
// The test binary re-runs itself as child processes (as tests/lock/processes.rs does). Each child
// runs its generated program and prints its events as lines; the parent merges them into one
// history. Per-process monotonic clocks cannot be compared, so every timestamp is Redis
// `TIME` (one server clock, read in real-time order): taken after the grant for an entry,
// before the lease check for an exit, before sending and after the reply for a write.

use std::process::Command;
use std::time::Duration;

use crate::harness::interleaving::{Op, LEASE, NAME};
use fencelock::{Error, LockClient};
use fencelock_testing::check::{check_records, Event, Record};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const CHILD_URL: &str = "FENCELOCK_INTERLEAVING_CHILD_URL";
const CHILD_PROGRAM: &str = "FENCELOCK_INTERLEAVING_CHILD_PROGRAM";
const PROCESSES: usize = 3;

/// The child's program; edge writes (a single writer's tokens at the mark) are left to the
/// in-process check, which records them on one clock.
fn encode(ops: &[Op]) -> String {
    ops.iter()
        .filter(|op| !matches!(op, Op::EdgeWrite { .. }))
        .map(|op| match op {
            Op::Section {
                nested,
                writes,
                work_ms,
                overstay,
            } => format!("S{nested},{writes},{work_ms},{}", u8::from(*overstay)),
            Op::Pause { ms } => format!("P{ms}"),
            Op::EdgeWrite { .. } => unreachable!("filtered out above"),
        })
        .collect::<Vec<_>>()
        .join(";")
}

fn decode(text: &str) -> Vec<Op> {
    // A program made only of edge writes encodes as the empty string: no ops, not one empty op.
    text.split(';')
        .filter(|op| !op.is_empty())
        .map(|op| {
            if let Some(ms) = op.strip_prefix('P') {
                return Op::Pause {
                    ms: ms.parse().unwrap(),
                };
            }
            let f: Vec<u16> = op[1..].split(',').map(|n| n.parse().unwrap()).collect();
            Op::Section {
                nested: f[0] as u8,
                writes: f[1] as u8,
                work_ms: f[2],
                overstay: f[3] == 1,
            }
        })
        .collect()
}

async fn server_time(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1_000_000 + micros
}

fn emit(at: u64, line: String) {
    println!("EVENT {at} {line}");
}

/// The child's work; a no-op unless the parent started this binary as a child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_runs_its_program() {
    let (Ok(url), Ok(program)) = (std::env::var(CHILD_URL), std::env::var(CHILD_PROGRAM)) else {
        return;
    };
    let client = LockClient::builder(url.clone())
        .default_lease(LEASE)
        .connect()
        .await
        .unwrap();
    // Test plumbing, not the system under test: a reply slowed by a loaded machine must not
    // fail the check (redis-rs' default response timeout is 500 ms).
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    let mut clock = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let lock = client.lock(NAME).unwrap();
    let resource = client.resource("interleaved-res").unwrap();
    for op in decode(&program) {
        let (nested, writes, work_ms, overstay) = match op {
            Op::Pause { ms } => {
                tokio::time::sleep(Duration::from_millis(ms.into())).await;
                continue;
            }
            Op::EdgeWrite { .. } => continue,
            Op::Section {
                nested,
                writes,
                work_ms,
                overstay,
            } => (nested, writes, work_ms, overstay),
        };
        let lock = if overstay {
            lock.with_lease(LEASE).unwrap()
        } else {
            lock.clone()
        };
        let Ok(outer) = lock.acquire_timeout(Duration::from_secs(20)).await else {
            continue;
        };
        let holder = outer.holder_id().to_owned();
        let token = outer.token().get();
        let at = server_time(&mut clock).await;
        emit(at, format!("granted {holder} {token}"));
        emit(at, format!("enter {holder}"));
        let mut guards = vec![outer];
        for _ in 0..nested {
            let Ok(inner) = guards[0].reenter().await else {
                break;
            };
            let at = server_time(&mut clock).await;
            emit(at, format!("reentered {holder} {}", inner.token()));
            emit(at, format!("enter {holder}"));
            guards.push(inner);
        }
        let work = if overstay {
            LEASE + Duration::from_millis(100)
        } else {
            Duration::from_millis(work_ms.into())
        };
        for i in 0..=writes {
            if i == writes {
                tokio::time::sleep(work).await;
            }
            let sent = server_time(&mut clock).await;
            let outcome = resource.push(guards[0].token(), &[holder.as_bytes()]).await;
            let at = server_time(&mut clock).await;
            match outcome {
                Ok(seq) => emit(at, format!("accepted {holder} {token} {sent} {seq}")),
                Err(Error::StaleToken { latest, .. }) => {
                    emit(at, format!("rejected {holder} {token} {sent} {latest}"));
                }
                Err(_) => {}
            }
        }
        for _ in &guards {
            let at = server_time(&mut clock).await;
            emit(at, format!("exit {holder} {}", guards[0].is_valid()));
        }
        for guard in guards {
            let _ = guard.release().await;
            emit(0, format!("released {holder}"));
        }
    }
}

fn parse(line: &str) -> Option<Record> {
    let mut f = line.strip_prefix("EVENT ")?.split(' ');
    let at = f.next()?.parse().ok()?;
    let kind = f.next()?;
    let holder = f.next()?.to_owned();
    let mut num = || f.next().and_then(|n| n.parse::<u64>().ok());
    let event = match kind {
        "granted" => Event::Granted {
            holder,
            token: num()?,
        },
        "reentered" => Event::ReenterGranted {
            holder,
            token: num()?,
        },
        "enter" => Event::Enter { holder },
        "exit" => Event::Exit {
            holder,
            valid: f.next()? == "true",
        },
        "accepted" => Event::WriteAccepted {
            holder,
            token: num()?,
            sent: num()?,
            seq: num(),
        },
        "rejected" => Event::WriteRejected {
            holder,
            token: num()?,
            sent: num()?,
            latest: num()?,
        },
        "released" => Event::Released { holder },
        _ => return None,
    };
    Some(Record { at, event })
}

#[test]
fn processes_feed_one_history_that_satisfies_every_property() {
    let cases = env_cases("FENCELOCK_INTERLEAVING_CASES", 16).div_ceil(4);
    let world = World::new(None);
    let exe = std::env::current_exe().unwrap();
    let mut runner = TestRunner::new(Config {
        cases,
        max_shrink_iters: 16,
        failure_persistence: None,
        ..Config::default()
    });
    let programs = prop::collection::vec(
        prop::collection::vec(crate::harness::interleaving::op(), 1..4),
        PROCESSES..=PROCESSES,
    );
    let expiries = prop::collection::vec((0..800u64, any::<bool>()), 0..3);
    // How many schedules had a grant to judge: the check must judge real work.
    let judged = std::cell::Cell::new(0u32);
    let result = runner.run(&(programs, expiries), |(programs, expiries)| {
        let _: () = redis::cmd("FLUSHALL").query(&mut world.fx.raw()).unwrap();
        let children: Vec<_> = programs
            .iter()
            .map(|ops| {
                Command::new(&exe)
                    .args([
                        "--exact",
                        &crate::common::child::test_path(module_path!(), "child_runs_its_program"),
                        "--nocapture",
                    ])
                    .env(CHILD_URL, world.fx.server.url())
                    .env(CHILD_PROGRAM, encode(ops))
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        // Expire the lock from outside while the children run; name the broken holder.
        let mut records = Vec::new();
        let started = std::time::Instant::now();
        let mut expiries = expiries;
        expiries.sort();
        for (after_ms, by_delete) in expiries {
            std::thread::sleep(Duration::from_millis(after_ms).saturating_sub(started.elapsed()));
            if let Some(key) = world.fx.lock_key(NAME) {
                let mut pipe = redis::pipe();
                pipe.atomic().cmd("HGET").arg(&key).arg("~token");
                if by_delete {
                    pipe.cmd("DEL").arg(&key).ignore();
                } else {
                    pipe.cmd("PEXPIRE").arg(&key).arg(1).ignore();
                }
                let (token,): (Option<u64>,) = pipe.query(&mut world.fx.raw()).unwrap();
                if let Some(token) = token {
                    records.push(Record {
                        at: 0,
                        event: Event::Expired { token },
                    });
                }
            }
        }
        for child in children {
            let output = child.wait_with_output().unwrap();
            assert!(output.status.success(), "a child process failed");
            records.extend(
                String::from_utf8_lossy(&output.stdout)
                    .lines()
                    .filter_map(parse),
            );
        }
        // A generated program may hold only pauses and edge writes (the latter stay in this
        // process); children that were given a critical section must have entered one.
        let sections = programs
            .iter()
            .flatten()
            .any(|op| matches!(op, Op::Section { .. }));
        let granted = records
            .iter()
            .any(|r| matches!(r.event, Event::Granted { .. }));
        prop_assert!(granted || !sections, "the children recorded no grant");
        if granted {
            judged.set(judged.get() + 1);
        }
        let fx = &world.fx;
        let gone = std::iter::repeat_with(|| {
            std::thread::sleep(Duration::from_millis(10));
            fx.lock_key(NAME).is_none()
        })
        .take(1000)
        .any(|gone| gone);
        assert!(gone, "the lock outlived every child");
        let residue = fencelock_testing::check::residue(&mut fx.raw(), "fencelock:").unwrap();
        check_records(&records, Some(&residue)).map_err(|v| TestCaseError::fail(v.to_string()))
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    assert!(judged.get() > 0, "no schedule produced a grant to judge");
}
