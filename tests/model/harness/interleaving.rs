//! The concurrent interleaving check: real tokio tasks in several `LockClient`s run
//! proptest-generated programs (nested critical sections, fenced writes, pauses past the
//! lease) while an injector expires the lock from outside and cuts connections; every task
//! records what it saw into one `History`, and `fencelock_testing::check` judges it.
//! Every delay is drawn by proptest, so a failing schedule replays from its seed and shrinks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::negative_controls::Control;
use fencelock::{Error, FencedResource, LockClient};
use fencelock_testing::check::{self, Event, History, Violation};
use fencelock_testing::{Direction, FaultProxy};
use proptest::prelude::*;
use proptest::test_runner::{TestError, TestRunner};

use crate::common::{eventually, Fixture};

pub const NAME: &str = "interleaved";
const RESOURCE: &str = "interleaved-res";
/// Lease of every lock: short, so pauses past it are cheap. The watchdog renews every third.
pub const LEASE: Duration = Duration::from_millis(300);

/// What one task does, in order.
#[derive(Debug, Clone)]
pub enum Op {
    /// Acquire, re-enter `nested` times, write `writes` times with the token, work `work_ms`,
    /// write again, leave. With `overstay` the lock has a lease of its own (no watchdog) and
    /// the work sleeps past it, like a holder paused by GC: its late writes must be fenced.
    Section {
        nested: u8,
        writes: u8,
        work_ms: u16,
        overstay: bool,
    },
    /// Think time outside the lock.
    Pause { ms: u16 },
    /// A write to the resource with a token at the edge of its mark: the mark read just before,
    /// plus `offset` (-1, 0 or +1), as a storage sees from writers whose tokens are adjacent.
    /// Issued tokens come from the server clock in microseconds, so two holders almost never
    /// present adjacent tokens; this presents them on purpose.
    EdgeWrite { offset: i8 },
}

/// What the injector does to the lock or the network, `after_ms` after the start.
#[derive(Debug, Clone)]
pub enum Fault {
    /// `DEL` (or `PEXPIRE 1`) of the lock hash, from a raw connection.
    Expire { by_delete: bool },
    /// `CLIENT KILL TYPE normal`.
    Kill,
    /// The proxied client's network drops everything for `ms`; the connections that lost
    /// data end with it.
    Partition { ms: u16 },
}

/// One generated run.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub tasks: Vec<Vec<Op>>,
    pub faults: Vec<(u16, Fault)>,
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3u8, 1..3u8, 0..40u16).prop_map(|(nested, writes, work_ms)| Op::Section {
            nested,
            writes,
            work_ms,
            overstay: false,
        }),
        1 => (0..2u8, 1..3u8).prop_map(|(nested, writes)| Op::Section {
            nested,
            writes,
            work_ms: 0,
            overstay: true,
        }),
        2 => (0..50u16).prop_map(|ms| Op::Pause { ms }),
        1 => (-1i8..=1).prop_map(|offset| Op::EdgeWrite { offset }),
    ]
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        3 => any::<bool>().prop_map(|by_delete| Fault::Expire { by_delete }),
        1 => Just(Fault::Kill),
        1 => (100..500u16).prop_map(|ms| Fault::Partition { ms }),
    ]
}

pub fn schedule(tasks: std::ops::Range<usize>) -> impl Strategy<Value = Schedule> {
    (
        prop::collection::vec(prop::collection::vec(op(), 1..5), tasks),
        prop::collection::vec((0..600u16, fault()), 0..4),
    )
        .prop_map(|(tasks, faults)| Schedule { tasks, faults })
}

/// A server, a proxy and three clients (the last behind the proxy).
pub struct World {
    pub fx: Fixture,
    proxy: FaultProxy,
    clients: Vec<LockClient>,
    runtime: tokio::runtime::Runtime,
    stats: Mutex<Stats>,
}

/// Event counts over every schedule a world ran, to show what the check exercised.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub granted: u64,
    pub accepted: u64,
    pub rejected: u64,
    /// Sections left with the lease already over.
    pub overstayed: u64,
    pub expired: u64,
}

impl World {
    pub fn new(control: Option<Control>) -> World {
        World::with_fair_handoff(control, None)
    }

    /// As [`World::new`], with every client in fair-handoff mode when `fair` is a grace.
    pub fn with_fair_handoff(control: Option<Control>, fair: Option<Duration>) -> World {
        World::build(control, fair, false)
    }

    /// One client, behind the proxy, running every task: its releases hand the lock to its
    /// own waiting tasks (`handoff.lua`), under cut connections and lost replies.
    pub fn one_client(control: Option<Control>) -> World {
        World::build(control, None, true)
    }

    fn build(control: Option<Control>, fair: Option<Duration>, one_client: bool) -> World {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let fx = Fixture::start();
        let proxy = FaultProxy::start(fx.server.addr()).unwrap();
        let urls = if one_client {
            vec![proxy.url()]
        } else {
            vec![fx.server.url(), fx.server.url(), proxy.url()]
        };
        let clients = runtime.block_on(async {
            let mut clients = Vec::new();
            for url in urls {
                let mut builder = LockClient::builder(url)
                    .default_lease(LEASE)
                    .response_timeout(Duration::from_millis(300))
                    .retry_window(Duration::from_secs(2));
                if let Some(control) = control {
                    builder = builder.negative_control(control);
                }
                if let Some(grace) = fair {
                    builder = builder.fair_handoff(grace);
                }
                clients.push(builder.connect().await.unwrap());
            }
            clients
        });
        World {
            fx,
            proxy,
            clients,
            runtime,
            stats: Mutex::default(),
        }
    }

    /// Runs one schedule from an empty server and checks its history.
    pub fn run(&self, schedule: &Schedule) -> Result<(), Violation> {
        let _: () = redis::cmd("FLUSHALL").query(&mut self.fx.raw()).unwrap();
        let history = Arc::new(History::new());
        self.runtime.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for (t, ops) in schedule.tasks.iter().enumerate() {
                let client = self.clients[t % self.clients.len()].clone();
                let (ops, history) = (ops.clone(), history.clone());
                tasks.spawn(run_task(client, ops, history));
            }
            let injector = self.inject(&schedule.faults, &history);
            let ((), ()) = tokio::join!(injector, async {
                while tasks.join_next().await.is_some() {}
            });
            self.proxy.heal();
            // Dropped guards release in the background, and a release cut by a fault leaves
            // the lock to its lease: wait for both before reading the residue.
            let clients = &self.clients;
            let fx = &self.fx;
            eventually(Duration::from_secs(10), || {
                clients.iter().all(|c| c.watched_locks() == 0) && fx.lock_key(NAME).is_none()
            })
            .await;
        });
        self.tally(&history);
        let mut residue = check::residue(&mut self.fx.raw(), "fencelock:").unwrap();
        residue.watched = self.clients.iter().map(LockClient::watched_locks).sum();
        history.set_residue(residue);
        check::check(&history)
    }

    fn tally(&self, history: &History) {
        let mut stats = self.stats.lock().unwrap();
        for record in history.records() {
            match record.event {
                Event::Granted { .. } => stats.granted += 1,
                Event::WriteAccepted { .. } => stats.accepted += 1,
                Event::WriteRejected { .. } => stats.rejected += 1,
                Event::Exit { valid: false, .. } => stats.overstayed += 1,
                Event::Expired { .. } => stats.expired += 1,
                _ => {}
            }
        }
    }

    /// The ids of the world's clients.
    pub fn client_ids(&self) -> Vec<String> {
        self.clients.iter().map(|c| c.id().to_owned()).collect()
    }

    /// What the schedules run so far exercised.
    pub fn stats(&self) -> Stats {
        *self.stats.lock().unwrap()
    }

    async fn inject(&self, faults: &[(u16, Fault)], history: &History) {
        let mut faults = faults.to_vec();
        faults.sort_by_key(|f| f.0);
        let started = tokio::time::Instant::now();
        for (after_ms, fault) in faults {
            tokio::time::sleep_until(started + Duration::from_millis(after_ms.into())).await;
            match fault {
                Fault::Expire { by_delete } => {
                    let Some(key) = self.fx.lock_key(NAME) else {
                        continue;
                    };
                    // Read the token and expire in one transaction, so the history names
                    // exactly the holder whose lease was broken.
                    let mut pipe = redis::pipe();
                    pipe.atomic().cmd("HGET").arg(&key).arg("~token");
                    if by_delete {
                        pipe.cmd("DEL").arg(&key).ignore();
                    } else {
                        pipe.cmd("PEXPIRE").arg(&key).arg(1).ignore();
                    }
                    let (token,): (Option<u64>,) = pipe.query(&mut self.fx.raw()).unwrap();
                    if let Some(token) = token {
                        history.record(Event::Expired { token });
                    }
                }
                Fault::Kill => {
                    let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                        .arg("KILL")
                        .arg("TYPE")
                        .arg("normal")
                        .query(&mut self.fx.raw());
                }
                Fault::Partition { ms } => {
                    self.proxy.blackhole(Direction::Both);
                    tokio::time::sleep(Duration::from_millis(ms.into())).await;
                    // The proxy discarded bytes inside open streams, which TCP never does: a
                    // connection that lost bytes would answer later requests with earlier
                    // replies. Its streams end with the partition, as a real connection that
                    // lost data would (the clients reconnect), before traffic flows again.
                    self.proxy.reset_all();
                    self.proxy.heal();
                }
            }
        }
    }
}

async fn run_task(client: LockClient, ops: Vec<Op>, history: Arc<History>) {
    let lock = client.lock(NAME).unwrap();
    let resource = client.resource(RESOURCE).unwrap();
    for op in ops {
        match op {
            Op::Pause { ms } => tokio::time::sleep(Duration::from_millis(ms.into())).await,
            Op::EdgeWrite { offset } => edge_write(&resource, offset, &history).await,
            Op::Section {
                nested,
                writes,
                work_ms,
                overstay,
            } => {
                let lock = if overstay {
                    lock.with_lease(LEASE).unwrap()
                } else {
                    lock.clone()
                };
                // Errors (timeouts, connection faults) just skip the section.
                let Ok(outer) = lock.acquire_timeout(Duration::from_secs(10)).await else {
                    continue;
                };
                history.granted(&outer);
                history.enter(&outer);
                let mut guards = vec![outer];
                for _ in 0..nested {
                    match guards[0].reenter().await {
                        Ok(inner) => {
                            history.reentered(&inner);
                            history.enter(&inner);
                            guards.push(inner);
                        }
                        Err(_) => break,
                    }
                }
                let innermost = guards.last().unwrap();
                for _ in 0..writes {
                    write(&resource, innermost, &history).await;
                }
                let work = if overstay {
                    LEASE + Duration::from_millis(100)
                } else {
                    Duration::from_millis(work_ms.into())
                };
                tokio::time::sleep(work).await;
                write(&resource, innermost, &history).await;
                // Leave innermost first, then release every entry (out of order: outer first).
                for guard in guards.iter().rev() {
                    history.exit(guard);
                }
                for guard in guards {
                    let holder = guard.holder_id().to_owned();
                    let _ = guard.release().await;
                    history.record(Event::Released { holder });
                }
            }
        }
    }
}

async fn write(resource: &FencedResource, guard: &fencelock::LockGuard, history: &History) {
    let sent = history.now_us();
    let item = guard.holder_id().as_bytes();
    match resource.push(guard.token(), &[item]).await {
        Ok(len) => history.write_accepted(guard, sent, Some(len)),
        Err(Error::StaleToken { latest, .. }) => history.write_rejected(guard, sent, latest),
        // Unknown outcome (connection fault): not recorded.
        Err(_) => {}
    }
}

/// A write with the resource's current mark plus `offset`, recorded under a writer of its own.
async fn edge_write(resource: &FencedResource, offset: i8, history: &History) {
    let Ok(Some(mark)) = resource.high_water_mark().await else {
        return;
    };
    let Some(token) = mark
        .get()
        .checked_add_signed(i64::from(offset))
        .and_then(fencelock::FencingToken::new)
    else {
        return;
    };
    let holder = format!("edge-writer({offset:+})");
    let sent = history.now_us();
    match resource.push(token, &[holder.as_bytes()]).await {
        Ok(len) => history.record(Event::WriteAccepted {
            holder,
            token: token.get(),
            sent,
            seq: Some(len),
        }),
        Err(Error::StaleToken { latest, .. }) => history.record(Event::WriteRejected {
            holder,
            token: token.get(),
            sent,
            latest: latest.get(),
        }),
        // Unknown outcome (connection fault): not recorded.
        Err(_) => {}
    }
}

/// The shrunk failing schedule and the property it violated.
#[derive(Debug)]
pub struct Failure {
    pub schedule: Schedule,
    pub violation: Violation,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.violation)?;
        writeln!(f, "shrunk schedule:")?;
        for (t, ops) in self.schedule.tasks.iter().enumerate() {
            writeln!(f, "  task {t}: {ops:?}")?;
        }
        writeln!(f, "  faults: {:?}", self.schedule.faults)
    }
}

/// Runs `cases` schedules; the shrunk counterexample if one fails.
pub fn run_cases(
    world: &World,
    tasks: std::ops::Range<usize>,
    cases: u32,
    regressions: Option<&'static str>,
) -> Result<(), Failure> {
    // Each schedule takes up to a second or two: shrink a little, not for ever.
    let config = super::runner_config(cases, 48, regressions);
    let mut runner = TestRunner::new(config);
    let last = Mutex::new(None);
    let result = runner.run(&schedule(tasks), |schedule| {
        world.run(&schedule).map_err(|v| {
            let reason = v.to_string();
            *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
            TestCaseError::fail(reason)
        })
    });
    match result {
        Ok(()) => Ok(()),
        Err(TestError::Fail(_, schedule)) => Err(Failure {
            schedule,
            violation: last.into_inner().unwrap().expect("a failure was recorded"),
        }),
        Err(TestError::Abort(why)) => panic!("proptest aborted: {why}"),
    }
}
