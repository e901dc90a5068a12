//! Random programs over a semaphore (three permits) and a read-write lock, by three clients,
//! checked step by step against a reference model: tries of one to three permits, reads and
//! writes (also several reads at once, and several releases at once, which the third client
//! sends through shared calls), releases, downgrades, and holds whose lease ends under them (their deadline moved
//! into the past, as a crashed holder's). After every step the permits Redis counts equal the
//! model's; never more than the limit, never a writer beside another holder; every hold's token
//! is greater than every token before it (so every read sits between the writes around it); and
//! when the program ends and everyone left, nothing stays behind. Readers read a fenced
//! resource with shared reads and the writer writes it, live or after their lease ended under
//! them: a shared read is refused exactly when a newer writer wrote, a write exactly below a
//! newer reader's or writer's token, and every accepted read sees the last accepted write.
//! The negative controls that a
//! program can reach must each fail it. On a server with hash-field expiry, one client keeps
//! its deadlines in the lease zset and the other two as field expiry: a semaphore is created
//! either way, depending on the program, and shared by clients of both.
//!
//! `FENCELOCK_PROPTEST_CASES` sets the number of programs (default 64).

use std::collections::HashMap;

use fencelock::{FencingToken, HoldExpiry, LockClient, ReadGuard, SemaphorePermit, WriteGuard};
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

const CLIENTS: usize = 3;
const LIMIT: u32 = 3;
/// The permits a writer holds in the read-write lock's layout.
const WRITER_PERMITS: u32 = 1_000_000_000;

#[derive(Debug, Clone, Copy)]
enum Op {
    /// A client tries for `permits` permits of the semaphore.
    TryPermits {
        client: usize,
        permits: u32,
    },
    /// The `n`-th live permit (modulo) is released.
    ReleasePermit(usize),
    /// The `n`-th live permit's lease ends under it.
    ExpirePermit(usize),
    /// A client tries to read, or to write.
    TryRead(usize),
    TryWrite(usize),
    /// The `n`-th live read hold is released.
    ReleaseRead(usize),
    /// A client tries `count` reads at once; on the client whose operations share calls,
    /// all but the first ride one call (`rw_read_many.lua`).
    TryReads {
        client: usize,
        count: usize,
    },
    /// Up to three live read holds from the `n`-th on are released at once (those of the
    /// client that shares calls, together: `sem_release_many.lua`).
    ReleaseReads(usize),
    /// The write hold is released, or downgraded to a read.
    ReleaseWrite,
    Downgrade,
    /// The `n`-th live read hold's lease ends under it, or the write hold's.
    ExpireRead(usize),
    ExpireWrite,
    /// A read hold reads the fenced resource with its token (a shared read): the `n`-th live
    /// one, or (`ended`) the `n`-th whose lease ended under it, as a reader that paused.
    ReadData {
        n: usize,
        ended: bool,
    },
    /// The write hold writes the fenced resource with its token, or (`ended`) the `n`-th
    /// writer whose lease ended under it, as a writer that paused.
    WriteData {
        n: usize,
        ended: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..CLIENTS, 1..=LIMIT).prop_map(|(client, permits)| Op::TryPermits { client, permits }),
        2 => (0..8usize).prop_map(Op::ReleasePermit),
        1 => (0..8usize).prop_map(Op::ExpirePermit),
        3 => (0..CLIENTS).prop_map(Op::TryRead),
        3 => (0..CLIENTS).prop_map(Op::TryWrite),
        2 => (0..8usize).prop_map(Op::ReleaseRead),
        2 => (0..CLIENTS, 2..=4usize).prop_map(|(client, count)| Op::TryReads { client, count }),
        2 => (0..8usize).prop_map(Op::ReleaseReads),
        1 => Just(Op::ReleaseWrite),
        2 => Just(Op::Downgrade),
        1 => (0..8usize).prop_map(Op::ExpireRead),
        1 => Just(Op::ExpireWrite),
        3 => (0..8usize, prop::bool::weighted(0.3)).prop_map(|(n, ended)| Op::ReadData { n, ended }),
        2 => (0..8usize, prop::bool::weighted(0.4)).prop_map(|(n, ended)| Op::WriteData { n, ended }),
    ]
}

/// The state of both primitives: the live holds the program has, and what the model says.
struct World<'a> {
    server: &'a RedisServer,
    clients: Vec<LockClient>,
    permits: Vec<SemaphorePermit>,
    /// Holds whose lease was ended under them; their release must be refused.
    ended_permits: Vec<SemaphorePermit>,
    reads: Vec<ReadGuard>,
    write: Option<WriteGuard>,
    ended_reads: Vec<ReadGuard>,
    ended_writes: Vec<WriteGuard>,
    /// The highest token any hold got so far.
    newest: Option<FencingToken>,
    /// The fenced resource as the model has it: the token of the last accepted write (also
    /// the value written), and its two marks.
    data: Resource,
}

/// The fenced resource's model: a shared read is refused below `exclusive` only; a write
/// below either mark.
#[derive(Default)]
struct Resource {
    value: Option<u64>,
    exclusive: u64,
    shared: u64,
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if ok {
        Ok(())
    } else {
        Err(TestCaseError::fail(what()))
    }
}

impl World<'_> {
    fn raw(&self) -> redis::Connection {
        self.server.client().get_connection().unwrap()
    }

    /// The one key matching `pattern`, if any.
    fn key(&self, pattern: &str) -> Option<Vec<u8>> {
        let keys: Vec<Vec<u8>> = self.raw().keys(pattern).unwrap();
        keys.into_iter().next()
    }

    /// Moves a hold's deadline into the past, as if its holder had crashed a lease ago: in
    /// the lease zset, or (a hash that keeps its deadlines as field expiry) on the hold's
    /// fields, which the server then drops.
    fn end_lease(&self, hash: &str, leases: &str, holder: &str) {
        let hash = self.key(hash).expect("the hash of a live hold");
        let fields: Option<String> = self.raw().hget(&hash, "~expiry").unwrap();
        if fields.as_deref() == Some("fields") {
            let _: () = redis::cmd("HPEXPIREAT")
                .arg(&hash)
                .arg(1)
                .arg("FIELDS")
                .arg(2)
                .arg(holder)
                .arg(format!("~entries:{holder}"))
                .query(&mut self.raw())
                .unwrap();
        } else {
            let key = self.key(leases).expect("the lease zset of a live hold");
            let _: () = self.raw().zadd(key, holder, 1).unwrap();
        }
    }

    /// A new hold's token is above every earlier one.
    fn fresh(&mut self, token: FencingToken, what: &str) -> Result<(), TestCaseError> {
        let newest = self.newest;
        check(newest.is_none_or(|n| token > n), || {
            format!("{what} got token {token}, not above the newest {newest:?}")
        })?;
        self.newest = Some(token);
        Ok(())
    }

    fn permits_used(&self) -> u32 {
        self.permits.iter().map(SemaphorePermit::permits).sum()
    }

    async fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::TryPermits { client, permits } => {
                let fits = self.permits_used() + permits <= LIMIT;
                let got = self.clients[client]
                    .semaphore("pool", LIMIT)
                    .unwrap()
                    .try_acquire(permits)
                    .await
                    .unwrap();
                check(got.is_some() == fits, || {
                    format!(
                        "{permits} permits with {} of {LIMIT} held: got {:?}",
                        self.permits_used(),
                        got.as_ref().map(SemaphorePermit::token)
                    )
                })?;
                if let Some(permit) = got {
                    self.fresh(permit.token(), "a permit")?;
                    self.permits.push(permit);
                }
            }
            Op::ReleasePermit(n) if !self.permits.is_empty() => {
                let permit = self.permits.remove(n % self.permits.len());
                let released = permit.release().await;
                check(released.is_ok(), || {
                    format!("a live permit's release: {released:?}")
                })?;
            }
            Op::ExpirePermit(n) if !self.permits.is_empty() => {
                let permit = self.permits.remove(n % self.permits.len());
                self.end_lease(
                    "fencelock:{*}sem:pool",
                    "fencelock:{*}sem-leases:pool",
                    permit.holder_id(),
                );
                self.ended_permits.push(permit);
            }
            Op::TryRead(client) => {
                let free = self.write.is_none();
                let got = self.clients[client]
                    .rwlock("doc")
                    .unwrap()
                    .try_read()
                    .await
                    .unwrap();
                check(got.is_some() == free, || {
                    format!(
                        "a read with a writer: {}, got one: {}",
                        !free,
                        got.is_some()
                    )
                })?;
                if let Some(read) = got {
                    self.fresh(read.token(), "a read")?;
                    self.reads.push(read);
                }
            }
            Op::TryWrite(client) => {
                let free = self.write.is_none() && self.reads.is_empty();
                let got = self.clients[client]
                    .rwlock("doc")
                    .unwrap()
                    .try_write()
                    .await
                    .unwrap();
                check(got.is_some() == free, || {
                    format!(
                        "a write with {} readers and a writer: {}, got one: {}",
                        self.reads.len(),
                        self.write.is_some(),
                        got.is_some()
                    )
                })?;
                if let Some(write) = got {
                    self.fresh(write.token(), "a write")?;
                    self.write = Some(write);
                }
            }
            Op::ReleaseRead(n) if !self.reads.is_empty() => {
                let read = self.reads.remove(n % self.reads.len());
                let released = read.release().await;
                check(released.is_ok(), || {
                    format!("a live read's release: {released:?}")
                })?;
            }
            Op::TryReads { client, count } => {
                let free = self.write.is_none();
                let rw = self.clients[client].rwlock("doc").unwrap();
                let got = futures_util::future::join_all((0..count).map(|_| rw.try_read())).await;
                let mut tokens = Vec::new();
                for read in got {
                    let read = read.unwrap();
                    check(read.is_some() == free, || {
                        format!("{count} reads at once with a writer: {}", !free)
                    })?;
                    if let Some(read) = read {
                        tokens.push(read.token());
                        self.reads.push(read);
                    }
                }
                tokens.sort();
                check(tokens.windows(2).all(|pair| pair[0] < pair[1]), || {
                    format!("reads at once got tokens {tokens:?}")
                })?;
                if let Some(&first) = tokens.first() {
                    self.fresh(first, "the first of reads at once")?;
                    self.newest = tokens.last().copied();
                }
            }
            Op::ReleaseReads(n) if !self.reads.is_empty() => {
                let from = n % self.reads.len();
                let count = (self.reads.len() - from).min(3);
                let reads: Vec<ReadGuard> = self.reads.drain(from..from + count).collect();
                let released =
                    futures_util::future::join_all(reads.into_iter().map(ReadGuard::release)).await;
                check(released.iter().all(Result::is_ok), || {
                    format!("live reads released at once: {released:?}")
                })?;
            }
            Op::ReleaseWrite => {
                if let Some(write) = self.write.take() {
                    let released = write.release().await;
                    check(released.is_ok(), || {
                        format!("the write's release: {released:?}")
                    })?;
                }
            }
            Op::Downgrade => {
                if let Some(write) = self.write.take() {
                    let token = write.token();
                    let read = write.downgrade().await;
                    let read = read.map_err(|e| TestCaseError::fail(format!("downgrade: {e}")))?;
                    check(read.token() == token, || {
                        "the downgraded read's token".into()
                    })?;
                    self.reads.push(read);
                }
            }
            Op::ExpireRead(n) if !self.reads.is_empty() => {
                let read = self.reads.remove(n % self.reads.len());
                self.end_lease(
                    "fencelock:{*}rw:doc",
                    "fencelock:{*}rw-leases:doc",
                    read.holder_id(),
                );
                self.ended_reads.push(read);
            }
            Op::ExpireWrite => {
                if let Some(write) = self.write.take() {
                    self.end_lease(
                        "fencelock:{*}rw:doc",
                        "fencelock:{*}rw-leases:doc",
                        write.holder_id(),
                    );
                    self.ended_writes.push(write);
                }
            }
            Op::ReadData { n, ended } => {
                let holds = if ended {
                    &self.ended_reads
                } else {
                    &self.reads
                };
                if let Some(read) = holds.get(n % holds.len().max(1)) {
                    let token = read.token();
                    let outcome = self.clients[0]
                        .resource("doc-data")
                        .unwrap()
                        .get_shared(token)
                        .await;
                    self.data.shared_read(token.get(), outcome)?;
                }
            }
            Op::WriteData { n, ended } => {
                let token = if ended {
                    let n = n % self.ended_writes.len().max(1);
                    self.ended_writes.get(n).map(WriteGuard::token)
                } else {
                    self.write.as_ref().map(WriteGuard::token)
                };
                if let Some(token) = token {
                    let outcome = self.clients[1]
                        .resource("doc-data")
                        .unwrap()
                        .set(token, token.to_string())
                        .await;
                    self.data.write(token.get(), outcome)?;
                }
            }
            _ => {}
        }
        self.compare_with_redis()
    }

    /// The permits Redis counts, after the purge any script does, equal the model's. A
    /// read-only look would not purge, so expired holds are purged by the next script; the
    /// comparison allows them until then and checks they are exactly the ended ones.
    fn compare_with_redis(&self) -> Result<(), TestCaseError> {
        // The sum over the holds' fields; on the lease-zset path `~used` must equal it.
        let used = |pattern: &str| -> Result<u32, TestCaseError> {
            let Some(key) = self.key(pattern) else {
                return Ok(0);
            };
            let hash: HashMap<String, String> = self.raw().hgetall(key).unwrap();
            crate::common::permits_held(&hash).map_err(TestCaseError::fail)
        };
        let sem = used("fencelock:{*}sem:pool")?;
        let sem_live = self.permits_used();
        let sem_ended: u32 = self
            .ended_permits
            .iter()
            .map(SemaphorePermit::permits)
            .sum();
        check(sem >= sem_live && sem <= sem_live + sem_ended, || {
            format!("Redis counts {sem} permits used; the model {sem_live} (+{sem_ended} ended)")
        })?;
        check(sem_live <= LIMIT, || format!("{sem_live} permits held"))?;
        let rw = used("fencelock:{*}rw:doc")?;
        let live = u32::try_from(self.reads.len()).unwrap()
            + if self.write.is_some() {
                WRITER_PERMITS
            } else {
                0
            };
        check(self.write.is_none() || self.reads.is_empty(), || {
            "a writer beside readers".into()
        })?;
        check(rw >= live, || {
            format!("Redis counts {rw} read-write permits; the model's live holds {live}")
        })
    }

    /// Everyone leaves: live holds release, ended ones are refused; nothing stays behind.
    async fn finish(mut self) -> Result<(), TestCaseError> {
        for permit in self.permits.drain(..) {
            permit.release().await.unwrap();
        }
        for read in self.reads.drain(..) {
            read.release().await.unwrap();
        }
        if let Some(write) = self.write.take() {
            write.release().await.unwrap();
        }
        for permit in self.ended_permits.drain(..) {
            let refused = permit.release().await;
            check(
                refused.as_ref().is_err_and(fencelock::Error::is_not_held),
                || format!("an ended permit's release: {refused:?}"),
            )?;
        }
        for read in self.ended_reads.drain(..) {
            let refused = read.release().await;
            check(
                refused.as_ref().is_err_and(fencelock::Error::is_not_held),
                || format!("an ended read's release: {refused:?}"),
            )?;
        }
        for write in self.ended_writes.drain(..) {
            let refused = write.release().await;
            check(
                refused.as_ref().is_err_and(fencelock::Error::is_not_held),
                || format!("an ended write's release: {refused:?}"),
            )?;
        }
        let left: Vec<Vec<u8>> = self.raw().keys("fencelock:{*}sem*").unwrap();
        let rw_left: Vec<Vec<u8>> = self.raw().keys("fencelock:{*}rw*").unwrap();
        check(left.is_empty() && rw_left.is_empty(), || {
            format!("left behind: {left:?} {rw_left:?}")
        })
    }
}

impl Resource {
    /// Judges a shared read by the holder of `token`: refused exactly when a newer token
    /// wrote, naming it; else the value of the last write, and the shared mark raised.
    fn shared_read(
        &mut self,
        token: u64,
        outcome: Result<Option<Vec<u8>>, fencelock::Error>,
    ) -> Result<(), TestCaseError> {
        let expected = self.value.map(|v| v.to_string().into_bytes());
        if token < self.exclusive {
            let exclusive = self.exclusive;
            return check(
                matches!(&outcome, Err(fencelock::Error::StaleToken { latest, .. }) if latest.get() == exclusive),
                || format!("a shared read by {token} under a write by {exclusive}: {outcome:?}"),
            );
        }
        check(outcome.as_ref().is_ok_and(|v| *v == expected), || {
            format!(
                "a shared read by {token} (marks {} / {}): {outcome:?}, expected {expected:?}",
                self.exclusive, self.shared
            )
        })?;
        self.shared = self.shared.max(token);
        Ok(())
    }

    /// Judges a write by the holder of `token`: refused exactly below either mark, naming
    /// the higher; else it is the resource's value.
    fn write(
        &mut self,
        token: u64,
        outcome: Result<(), fencelock::Error>,
    ) -> Result<(), TestCaseError> {
        let mark = self.exclusive.max(self.shared);
        if token < mark {
            return check(
                matches!(&outcome, Err(fencelock::Error::StaleToken { latest, .. }) if latest.get() == mark),
                || {
                    format!(
                        "a write by {token} under marks {} / {}: {outcome:?}",
                        self.exclusive, self.shared
                    )
                },
            );
        }
        check(outcome.is_ok(), || {
            format!(
                "a write by {token} (marks {} / {}): {outcome:?}",
                self.exclusive, self.shared
            )
        })?;
        self.exclusive = token;
        self.value = Some(token);
        Ok(())
    }
}

async fn run_program(
    server: &RedisServer,
    program: &[Op],
    control: Option<Control>,
) -> Result<(), TestCaseError> {
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut server.client().get_connection().unwrap())
        .unwrap();
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let mut builder = LockClient::builder(server.url());
        // One client keeps the lease zset; on a server with hash-field expiry the others
        // choose field expiry, so whichever client creates a semaphore, the others share it.
        if client == 1 {
            builder = builder.hold_expiry(HoldExpiry::LeaseZset);
        }
        // One client sends every read and release alone; the others' that meet share calls
        // (reads and releases of holds of one lock: the grouped scripts), one with a small cap.
        if client == 0 {
            builder = builder.hold_batch(1);
        }
        if client == 2 {
            builder = builder.hold_batch(16);
        }
        #[cfg(fencelock_negative_controls)]
        if let Some(control) = control {
            builder = builder.negative_control(control);
        }
        #[cfg(not(fencelock_negative_controls))]
        let _: Option<Control> = control;
        clients.push(builder.connect().await.unwrap());
    }
    let mut world = World {
        server,
        clients,
        permits: Vec::new(),
        ended_permits: Vec::new(),
        reads: Vec::new(),
        write: None,
        ended_reads: Vec::new(),
        ended_writes: Vec::new(),
        newest: None,
        data: Resource::default(),
    };
    for op in program {
        world.step(*op).await?;
    }
    world.finish().await
}

/// Runs `cases` random programs of up to 40 steps on one server; the first failure, shrunk.
fn run_cases(cases: u32, control: Option<Control>) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start().unwrap();
    let mut runner = crate::common::model_runner(cases, control.is_some());
    runner
        .run(&prop::collection::vec(op(), 1..40), |program| {
            runtime.block_on(run_program(&server, &program, control))
        })
        .map_err(|failure| failure.to_string())
}

fn cases() -> u32 {
    crate::common::env_cases("FENCELOCK_PROPTEST_CASES", 64)
}

#[test]
fn random_semaphore_and_rwlock_programs_match_the_model() {
    let started = std::time::Instant::now();
    if let Err(failure) = run_cases(cases(), None) {
        panic!("{failure}");
    }
    eprintln!("{} programs passed in {:?}", cases(), started.elapsed());
}

/// The semaphore, read-write lock and shared-read controls that a program can reach each make
/// it fail: permits over the limit, an expired hold still counted, a writer beside readers, a
/// downgrade that keeps readers out, readers refusing each other, a paused writer writing
/// under newer readers.
#[cfg(fencelock_negative_controls)]
#[test]
fn the_hold_model_catches_the_controls_it_can_reach() {
    for control in [
        Control::SemAcquireIgnoresLimit,
        Control::SemKeepsExpiredHolds,
        Control::RwWriterIgnoresReaders,
        Control::RwDowngradeKeepsWriting,
        Control::SharedReadClaims,
        Control::SharedReadDoesNotFence,
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
