//! The model-based sequential test: random programs of lock operations and faults by several
//! holders in two clients, checked step by step against a reference model of one lock and one
//! fenced resource, with the Redis state compared after every step. Every discrepancy is
//! reported as a [`Violation`] of a named [`Property`], so the negative controls
//! (`tests/model/controls.rs`) can assert which property caught them.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fencelock::negative_controls::Control;
use fencelock::{Error, FencingToken, LockClient, LockGuard};
use fencelock_testing::check::{self, Property, Violation};
use fencelock_testing::{Direction, FaultProxy};
use futures_util::FutureExt;
use proptest::prelude::*;
use proptest::test_runner::{TestError, TestRunner};
use redis::Commands;

use crate::common::{eventually, Fixture};

/// Holder slots; even slots use the direct client, odd slots the client behind the proxy.
pub const HOLDERS: usize = 4;
/// The lock's name in program `n`: each program has a lock of its own, so that an operation a
/// previous program left running in the background (a release given up after the harness's
/// patience, finished by the client later) can never touch this program's lock.
fn lock_name(n: u64) -> String {
    format!("model-{n}")
}
const RESOURCE: &str = "model-res";
/// The model clients' default lease: long enough that no watchdog tick ever happens during a
/// run, so the watch lists only change through the operations under test.
const LONG_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long to wait for something that happens in the background (a compensating cancel, a
/// watchdog tick) before calling it missing. Generous: only a broken protocol waits it out.
const PATIENCE: Duration = Duration::from_secs(5);

/// One step of a program.
#[derive(Debug, Clone)]
pub enum Step {
    /// Slot `h` takes the lock as a new holder: `acquire()` when the model says it is free
    /// (`wait`), else `try_acquire()`.
    Acquire { h: usize, wait: bool },
    /// Slot `h` re-enters through its newest guard.
    Reenter(usize),
    /// Slot `h` releases one of its guards, picked by `pick` (out of order allowed).
    Release { h: usize, pick: usize },
    /// Slot `h` extends its lease.
    Extend(usize),
    /// The lock disappears behind everyone's back (`DEL`, or `PEXPIRE 1`).
    Expire { by_delete: bool },
    /// A guard pushes to the fenced resource with its token: guard number `pick` (modulo their
    /// number) among every live guard, including those of holders that lost the lock.
    Write(usize),
    /// Slot `h`'s process dies: its guards are forgotten (no release, no drop).
    Crash(usize),
    /// `CLIENT KILL TYPE normal`: every client connection is cut.
    KillConnections,
    /// The server restarts with its data (`wipe`: comes back empty, as without persistence).
    Restart { wipe: bool },
    /// Slot `h` (odd: behind the proxy) re-enters or releases, the reply is lost after the
    /// script ran, and the client re-sends the same operation.
    Retried { h: usize, release: bool },
    /// Slot `h` starts an acquire and drops it right after sending it.
    CancelledAcquire(usize),
    /// Slot `h` (behind the proxy) acquires with a 5 s lease of its own over a slow network,
    /// and its deadline must end before the server's lease; then extends it to a long lease.
    ShortLease(usize),
    /// A holder of a watchdog-renewed client has its lock deleted and taken over; its next
    /// renewal must tell it that it lost the lock.
    Takeover,
    /// A write to the fenced resource with a token right at its edge: the resource's mark
    /// plus `offset` (-1, 0 or +1). Issued tokens come from the server clock in microseconds,
    /// so two holders almost never present adjacent tokens; this step presents them on purpose
    /// (equal: accepted, one holder writes many times with one token; one below: refused; one
    /// above: accepted).
    EdgeWrite { offset: i8 },
    /// The lock's fence counter is lost (`DEL`, as by an operator or a restart without
    /// persistence of that key alone): the next token must still exceed every earlier one.
    LoseCounter,
    /// The fence counter runs ahead of the server clock by `ms` (as after tokens issued by a
    /// primary whose clock was ahead, within the documented bound): the next token must exceed
    /// the counter.
    CounterAhead { ms: u16 },
}

/// Relative weights of the steps (0 leaves a step out).
#[derive(Debug, Clone, Copy)]
pub struct Weights {
    pub acquire: u32,
    pub reenter: u32,
    pub release: u32,
    pub extend: u32,
    pub expire: u32,
    pub write: u32,
    pub crash: u32,
    pub kill: u32,
    pub restart: u32,
    pub retried: u32,
    pub cancelled: u32,
    pub short_lease: u32,
    pub takeover: u32,
    pub edge_write: u32,
    pub lose_counter: u32,
    pub counter_ahead: u32,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            acquire: 6,
            reenter: 4,
            release: 6,
            extend: 2,
            expire: 2,
            write: 4,
            crash: 1,
            kill: 1,
            restart: 1,
            retried: 2,
            cancelled: 1,
            short_lease: 1,
            takeover: 0,
            edge_write: 3,
            lose_counter: 1,
            counter_ahead: 1,
        }
    }
}

pub fn program(w: Weights, len: std::ops::Range<usize>) -> BoxedStrategy<Vec<Step>> {
    let h = 0..HOLDERS;
    let odd = prop_oneof![Just(1usize), Just(3usize)];
    let options: Vec<(u32, BoxedStrategy<Step>)> = vec![
        (
            w.acquire,
            (h.clone(), any::<bool>())
                .prop_map(|(h, wait)| Step::Acquire { h, wait })
                .boxed(),
        ),
        (w.reenter, h.clone().prop_map(Step::Reenter).boxed()),
        (
            w.release,
            (h.clone(), 0..4usize)
                .prop_map(|(h, pick)| Step::Release { h, pick })
                .boxed(),
        ),
        (w.extend, h.clone().prop_map(Step::Extend).boxed()),
        (
            w.expire,
            any::<bool>()
                .prop_map(|by_delete| Step::Expire { by_delete })
                .boxed(),
        ),
        (w.write, (0..8usize).prop_map(Step::Write).boxed()),
        (w.crash, h.clone().prop_map(Step::Crash).boxed()),
        (w.kill, Just(Step::KillConnections).boxed()),
        (
            w.restart,
            any::<bool>()
                .prop_map(|wipe| Step::Restart { wipe })
                .boxed(),
        ),
        (
            w.retried,
            (odd.clone(), any::<bool>())
                .prop_map(|(h, release)| Step::Retried { h, release })
                .boxed(),
        ),
        (w.cancelled, h.prop_map(Step::CancelledAcquire).boxed()),
        (w.short_lease, odd.prop_map(Step::ShortLease).boxed()),
        (w.takeover, Just(Step::Takeover).boxed()),
        (
            w.edge_write,
            (-1i8..=1)
                .prop_map(|offset| Step::EdgeWrite { offset })
                .boxed(),
        ),
        (w.lose_counter, Just(Step::LoseCounter).boxed()),
        (
            w.counter_ahead,
            (1u16..=300)
                .prop_map(|ms| Step::CounterAhead { ms })
                .boxed(),
        ),
    ];
    // proptest refuses zero weights: a left-out step is simply not offered.
    let step = proptest::strategy::Union::new_weighted(
        options.into_iter().filter(|(w, _)| *w > 0).collect(),
    );
    prop::collection::vec(step, len).boxed()
}

/// What the lock and the resource should look like.
#[derive(Default, Debug)]
struct Model {
    /// The holder id and slot holding the lock, and its entry count.
    owner: Option<(String, usize, u64)>,
    token: Option<u64>,
    highest_issued: Option<u64>,
    /// The value the fence counter was set to by [`Step::CounterAhead`]: the next token must
    /// be above it.
    counter_floor: Option<u64>,
    /// The resource's high-water mark and list length.
    mark: Option<u64>,
    items: u64,
}

/// One slot's guards (all of one holder); `lost` once the lock went away under it.
#[derive(Default)]
struct Slot {
    guards: Vec<LockGuard>,
    lost: bool,
}

/// A server (with persistence), a proxy in front of it, the clients, and the runtime.
pub struct World {
    pub fx: Fixture,
    proxy: FaultProxy,
    /// `[direct, behind the proxy]`.
    clients: [LockClient; 2],
    /// Renews every 100 ms; used by [`Step::Takeover`].
    watched: LockClient,
    /// Loads the scripts after a restart (see [`World::warm_up`]).
    warm: LockClient,
    runtime: tokio::runtime::Runtime,
    /// Crashed (forgotten) watched holders per client: they stay on the watch lists.
    leaked: [usize; 2],
    /// How long an abandoned acquire may take to be undone in the background.
    pub patience: Duration,
    /// The lock of the program running now ([`lock_name`]).
    name: String,
    /// Programs run so far.
    programs: u64,
}

impl World {
    pub fn new(control: Option<Control>) -> World {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let fx = Fixture::with_persistence();
        let proxy = FaultProxy::start(fx.server.addr()).unwrap();
        let connect = |url: String, lease: Duration| {
            let mut builder = LockClient::builder(url).default_lease(lease);
            if let Some(control) = control {
                builder = builder.negative_control(control);
            }
            builder.connect()
        };
        let (direct, proxied, watched) = runtime.block_on(async {
            (
                connect(fx.server.url(), LONG_LEASE).await.unwrap(),
                connect(proxy.url(), LONG_LEASE).await.unwrap(),
                connect(fx.server.url(), Duration::from_millis(300))
                    .await
                    .unwrap(),
            )
        });
        let warm = runtime.block_on(async {
            let mut builder = LockClient::builder(fx.server.url()).prefix("warm-up:");
            if let Some(control) = control {
                builder = builder.negative_control(control);
            }
            builder.connect().await.unwrap()
        });
        let world = World {
            fx,
            proxy,
            clients: [direct, proxied],
            watched,
            warm,
            runtime,
            leaked: [0, 0],
            patience: PATIENCE,
            name: lock_name(0),
            programs: 0,
        };
        world.runtime.block_on(world.warm_up());
        world
    }

    /// Loads every script the clients run (the same variant, under another prefix), so that
    /// a reply lost on purpose is never a `NOSCRIPT` the client would need to see.
    async fn warm_up(&self) {
        let lock = self.warm.lock("warm-up").unwrap();
        if let Ok(guard) = lock.acquire().await {
            if let Ok(inner) = guard.reenter().await {
                let _ = inner.release().await;
            }
            let _ = guard.extend(Duration::from_secs(1)).await;
            let _ = guard.release().await;
        }
    }

    /// Runs one program from an empty server.
    pub fn run(&mut self, steps: &[Step]) -> Result<(), Violation> {
        self.programs += 1;
        self.name = lock_name(self.programs);
        let _: () = redis::cmd("FLUSHALL").query(&mut self.fx.raw()).unwrap();
        let runtime = std::mem::replace(
            &mut self.runtime,
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap(),
        );
        let outcome = runtime.block_on(Program::new(self).run(steps));
        self.runtime = runtime;
        outcome
    }
}

fn violation(property: Property, i: usize, step: &Step, what: impl std::fmt::Display) -> Violation {
    Violation::new(property, format!("step {i} {step:?}: {what}"))
}

struct Program<'w> {
    world: &'w mut World,
    model: Model,
    slots: Vec<Slot>,
    /// Guards of earlier holders of a slot that acquired again; released at the end.
    zombies: Vec<LockGuard>,
    /// Holders with a lease of their own (not watched).
    unwatched: HashSet<String>,
    /// Holder ids of crashed holders.
    crashed: HashSet<String>,
}

impl<'w> Program<'w> {
    fn new(world: &'w mut World) -> Self {
        Program {
            world,
            model: Model::default(),
            slots: (0..HOLDERS).map(|_| Slot::default()).collect(),
            zombies: Vec::new(),
            unwatched: HashSet::new(),
            crashed: HashSet::new(),
        }
    }

    fn client(&self, h: usize) -> &LockClient {
        &self.world.clients[h % 2]
    }

    fn fx(&self) -> &Fixture {
        &self.world.fx
    }

    fn owns(&self, h: usize) -> bool {
        !self.slots[h].lost
            && self.model.owner.as_ref().is_some_and(|(_, s, _)| *s == h)
            && self.slots[h].guards.first().is_some_and(|g| {
                self.model
                    .owner
                    .as_ref()
                    .is_some_and(|(id, _, _)| id == g.holder_id())
            })
    }

    /// The lock went away under its owner (expiry, delete, wipe).
    fn lose_owner(&mut self) {
        if let Some((_, slot, _)) = self.model.owner.take() {
            self.slots[slot].lost = true;
        }
        self.model.token = None;
    }

    /// A fresh grant to slot `h`.
    fn granted(&mut self, h: usize, guard: LockGuard) -> Result<(), (Property, String)> {
        if self.model.owner.is_some() {
            return Err((Property::MutualExclusion, "acquired a held lock".into()));
        }
        let token = guard.token().get();
        if let Some(prev) = self.model.highest_issued.filter(|t| token <= *t) {
            return Err((
                Property::TokensMonotonic,
                format!("token {token} after {prev} was issued"),
            ));
        }
        if let Some(counter) = self.model.counter_floor.take().filter(|c| token <= *c) {
            return Err((
                Property::TokensMonotonic,
                format!("token {token} with the fence counter at {counter}"),
            ));
        }
        self.zombies.append(&mut self.slots[h].guards);
        self.model.owner = Some((guard.holder_id().to_owned(), h, 1));
        self.model.token = Some(token);
        self.model.highest_issued = Some(token);
        self.slots[h] = Slot {
            guards: vec![guard],
            lost: false,
        };
        Ok(())
    }

    async fn run(mut self, steps: &[Step]) -> Result<(), Violation> {
        for (i, step) in steps.iter().enumerate() {
            let fail = |(p, what): (Property, String)| violation(p, i, step, what);
            self.step(step).await.map_err(fail)?;
            let after = match step {
                Step::Retried { .. } => Property::RetriesApplyOnce,
                Step::CancelledAcquire(_) => Property::CountsReturnToZero,
                _ => Property::ModelAgreement,
            };
            self.check_redis(after).map_err(fail)?;
            self.check_watched().map_err(fail)?;
        }
        self.finish()
            .await
            .map_err(|(p, what)| Violation::new(p, format!("after the program: {what}")))
    }

    async fn step(&mut self, step: &Step) -> Result<(), (Property, String)> {
        let unexpected = |e: Error| (Property::ModelAgreement, format!("unexpected error: {e}"));
        match *step {
            Step::Acquire { h, wait } => {
                let lock = self.client(h).lock(&self.world.name).unwrap();
                let got = if wait && self.model.owner.is_none() {
                    match tokio::time::timeout(PATIENCE, lock.acquire()).await {
                        Ok(got) => Some(got.map_err(unexpected)?),
                        Err(_) => None,
                    }
                } else {
                    lock.try_acquire().await.map_err(unexpected)?
                };
                match got {
                    Some(guard) => self.granted(h, guard)?,
                    None if self.model.owner.is_none() => {
                        return Err((Property::ModelAgreement, "a free lock was refused".into()))
                    }
                    None => {}
                }
            }
            Step::Reenter(h) => self.reenter(h).await?,
            Step::Release { h, pick } => self.release(h, pick).await?,
            Step::Extend(h) => {
                let Some(guard) = self.slots[h].guards.last() else {
                    return Ok(());
                };
                let held = self.owns(h);
                match guard.extend(Duration::from_secs(600)).await {
                    Ok(()) if held => {}
                    Ok(()) => {
                        return Err((
                            Property::MutualExclusion,
                            "a holder that lost the lock extended it".into(),
                        ))
                    }
                    Err(e) if e.is_not_held() && !held => {}
                    Err(e) => return Err(unexpected(e)),
                }
            }
            Step::Expire { by_delete } => {
                if let Some(key) = self.fx().lock_key(&self.world.name) {
                    if by_delete {
                        let _: () = self.fx().raw().del(&key).unwrap();
                    } else {
                        let _: () = self.fx().raw().pexpire(&key, 1).unwrap();
                        let (fx, name) = (self.fx(), &self.world.name);
                        eventually(PATIENCE, || fx.lock_key(name).is_none()).await;
                    }
                }
                self.lose_owner();
            }
            Step::Write(h) => self.write(h).await?,
            Step::EdgeWrite { offset } => self.edge_write(offset).await?,
            Step::LoseCounter => {
                self.wait_past_issued().await;
                let counters = self.fx().keys("fencelock:{*}fence");
                for counter in counters {
                    let _: i64 = redis::cmd("DEL")
                        .arg(counter)
                        .query(&mut self.fx().raw())
                        .unwrap();
                }
            }
            Step::CounterAhead { ms } => {
                // The lock's counter exists once it was acquired (the one lock of the model).
                let Some(key) = self.fx().keys("fencelock:{*}fence").pop() else {
                    return Ok(());
                };
                let ahead = self.server_now_us() + u64::from(ms) * 1_000;
                let current: Option<u64> = redis::cmd("GET")
                    .arg(&key)
                    .query(&mut self.fx().raw())
                    .unwrap();
                // Raised only: a counter is never lowered.
                let value = current.unwrap_or(0).max(ahead);
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(value)
                    .query(&mut self.fx().raw())
                    .unwrap();
                self.model.counter_floor = Some(value);
            }
            Step::Crash(h) => {
                let guards = std::mem::take(&mut self.slots[h].guards);
                if let Some(first) = guards.first() {
                    let id = first.holder_id().to_owned();
                    if !self.unwatched.contains(&id) {
                        self.world.leaked[h % 2] += 1;
                    }
                    self.crashed.insert(id);
                }
                for guard in guards {
                    std::mem::forget(guard);
                }
            }
            Step::KillConnections => {
                let _: i64 = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .query(&mut self.fx().raw())
                    .unwrap();
            }
            Step::Restart { wipe } => {
                if wipe {
                    // A lost counter keeps tokens increasing only through the clock floor, and
                    // only when the clock has passed every token issued (the documented bound).
                    self.wait_past_issued().await;
                    let _: () = redis::cmd("FLUSHALL").query(&mut self.fx().raw()).unwrap();
                    self.lose_owner();
                    self.model.mark = None;
                    self.model.items = 0;
                }
                self.world.fx.server.restart().unwrap();
                self.world.warm_up().await;
            }
            Step::Retried { h, release } => {
                if !self.owns(h) {
                    return if release {
                        self.release(h, 0).await
                    } else {
                        self.reenter(h).await
                    };
                }
                let (id, _, count) = self.model.owner.clone().unwrap();
                let expected = if release { count - 1 } else { count + 1 };
                let proxy = &self.world.proxy;
                let fx = &self.world.fx;
                let name = &self.world.name;
                // When the request ran and its connection was reset, from its first send: a
                // failure says so, as the re-sends' window is counted from there.
                let sent = std::time::Instant::now();
                let ran = move || async move {
                    let ran = eventually(PATIENCE, || match fx.lock_state(name) {
                        None => expected == 0,
                        Some((holders, _)) => holders == vec![(id.clone(), expected)],
                    })
                    .await;
                    let seen = sent.elapsed();
                    proxy.reset_all();
                    proxy.heal();
                    (ran, seen, sent.elapsed())
                };
                // After a CLIENT KILL or a restart the client reconnects on its next command;
                // a handshake whose replies were blackholed would never finish.
                let client = &self.world.clients[1];
                let online = async {
                    for _ in 0..50 {
                        if client.eviction_risk().await.is_ok() {
                            return true;
                        }
                    }
                    false
                }
                .await;
                assert!(online, "the proxied client did not reconnect");
                proxy.blackhole(Direction::Downstream);
                if release {
                    let guard = self.slots[h].guards.pop().unwrap();
                    let (out, timing) = tokio::join!(guard.release(), ran());
                    out.map_err(|e| {
                        (
                            Property::RetriesApplyOnce,
                            retried_failure("release", &e, timing, sent),
                        )
                    })?;
                    self.after_release(h, count)?;
                } else {
                    let outer = self.slots[h].guards.last().unwrap();
                    let (out, timing) = tokio::join!(outer.reenter(), ran());
                    let inner = out.map_err(|e| {
                        (
                            Property::RetriesApplyOnce,
                            retried_failure("reenter", &e, timing, sent),
                        )
                    })?;
                    self.model.owner.as_mut().unwrap().2 += 1;
                    self.slots[h].guards.push(inner);
                }
            }
            Step::CancelledAcquire(h) => {
                let lock = self.client(h).lock(&self.world.name).unwrap();
                let cancels = cancel_records(self.fx());
                let mut acquire = Box::pin(lock.try_acquire());
                match (&mut acquire).now_or_never() {
                    None => drop(acquire),
                    // Finished without waiting (an error before sending): nothing to undo.
                    Some(outcome) => {
                        drop(acquire);
                        if let Some(guard) = outcome.map_err(unexpected)? {
                            self.granted(h, guard)?;
                        }
                        return Ok(());
                    }
                }
                let fx = self.fx();
                if !eventually(self.world.patience, || cancel_records(fx) > cancels).await {
                    return Err((
                        Property::CountsReturnToZero,
                        "an abandoned acquisition was never undone".into(),
                    ));
                }
            }
            Step::ShortLease(h) => {
                if self.model.owner.is_some() {
                    return Ok(());
                }
                let lock = self.client(h).lock(&self.world.name).unwrap();
                let lock = lock.with_lease(Duration::from_secs(5)).unwrap();
                self.world
                    .proxy
                    .delay(Direction::Downstream, Duration::from_millis(100));
                let got = lock.try_acquire().await;
                self.world.proxy.heal();
                let Some(guard) = got.map_err(unexpected)? else {
                    return Err((Property::ModelAgreement, "a free lock was refused".into()));
                };
                let pttl: i64 = self
                    .fx()
                    .raw()
                    .pttl(self.fx().lock_key(&self.world.name).unwrap())
                    .unwrap();
                let server_end = Instant::now() + Duration::from_millis(pttl as u64 + 1);
                if guard.valid_until() > server_end {
                    return Err((
                        Property::ValidityWithinLease,
                        format!(
                            "the holder trusts its lease {:?} past the server's",
                            guard.valid_until() - server_end
                        ),
                    ));
                }
                guard
                    .extend(Duration::from_secs(600))
                    .await
                    .map_err(unexpected)?;
                self.unwatched.insert(guard.holder_id().to_owned());
                self.granted(h, guard)?;
            }
            Step::Takeover => self.takeover().await?,
        }
        Ok(())
    }

    async fn reenter(&mut self, h: usize) -> Result<(), (Property, String)> {
        let Some(outer) = self.slots[h].guards.last() else {
            return Ok(());
        };
        let held = self.owns(h);
        match outer.reenter().await {
            Ok(inner) => {
                if !held {
                    return Err((
                        Property::MutualExclusion,
                        "a holder that lost the lock re-entered it".into(),
                    ));
                }
                if Some(inner.token().get()) != self.model.token {
                    return Err((
                        Property::ReentrySameToken,
                        "re-entry changed the token".into(),
                    ));
                }
                self.model.owner.as_mut().unwrap().2 += 1;
                self.slots[h].guards.push(inner);
            }
            Err(e) if e.is_not_held() && !held => {}
            Err(Error::Protocol(what)) if what.contains("re-entry returned token") => {
                return Err((Property::ReentrySameToken, what))
            }
            Err(e) => return Err((Property::ModelAgreement, format!("reenter: {e}"))),
        }
        Ok(())
    }

    async fn release(&mut self, h: usize, pick: usize) -> Result<(), (Property, String)> {
        if self.slots[h].guards.is_empty() {
            return Ok(());
        }
        let held = self.owns(h);
        let index = pick % self.slots[h].guards.len();
        let guard = self.slots[h].guards.remove(index);
        let count = self.model.owner.as_ref().map_or(0, |o| o.2);
        let publishes = self.fx().calls("publish");
        match guard.release().await {
            Ok(()) if held => self.after_release(h, count)?,
            Ok(()) => {
                return Err((
                    Property::MutualExclusion,
                    "a holder that lost the lock released it".into(),
                ))
            }
            Err(e) if e.is_not_held() && !held => {}
            Err(e) => return Err((Property::ModelAgreement, format!("release: {e}"))),
        }
        if held && count == 1 && self.fx().calls("publish") == publishes {
            return Err((
                Property::ReleaseWakesWaiters,
                "the release that freed the lock published nothing".into(),
            ));
        }
        Ok(())
    }

    fn after_release(&mut self, _h: usize, count: u64) -> Result<(), (Property, String)> {
        if count > 1 {
            self.model.owner.as_mut().unwrap().2 = count - 1;
        } else {
            self.model.owner = None;
            self.model.token = None;
        }
        Ok(())
    }

    async fn write(&mut self, pick: usize) -> Result<(), (Property, String)> {
        let guards: Vec<&LockGuard> = self
            .slots
            .iter()
            .flat_map(|s| s.guards.iter())
            .chain(&self.zombies)
            .collect();
        if guards.is_empty() {
            return Ok(());
        }
        let token = guards[pick % guards.len()].token();
        let resource = self.client(pick).resource(RESOURCE).unwrap();
        let fresh = self.model.mark.is_none_or(|m| token.get() >= m);
        match resource.push(token, &[b"w"]).await {
            Ok(len) if fresh => {
                self.model.items += 1;
                self.model.mark = Some(token.get().max(self.model.mark.unwrap_or(0)));
                if len != self.model.items {
                    return Err((
                        Property::RetriesApplyOnce,
                        format!(
                            "the list has {len} items, {} writes were accepted",
                            self.model.items
                        ),
                    ));
                }
            }
            Ok(_) => {
                return Err((
                    Property::StaleWriteRejected,
                    format!("token {token} was accepted after {:?}", self.model.mark),
                ))
            }
            Err(Error::StaleToken { latest, .. }) if !fresh => {
                if Some(latest.get()) != self.model.mark {
                    return Err((
                        Property::ModelAgreement,
                        format!("rejected for {latest}, the mark is {:?}", self.model.mark),
                    ));
                }
            }
            Err(Error::StaleToken { latest, .. }) => {
                return Err((
                    Property::ValidWriteAccepted,
                    format!("token {token} was rejected for {latest}"),
                ))
            }
            Err(e) => return Err((Property::ModelAgreement, format!("write: {e}"))),
        }
        Ok(())
    }

    /// A write with a token at the edge of the resource's mark: `mark + offset`.
    async fn edge_write(&mut self, offset: i8) -> Result<(), (Property, String)> {
        let Some(mark) = self.model.mark else {
            return Ok(());
        };
        let Some(token) = mark
            .checked_add_signed(i64::from(offset))
            .and_then(FencingToken::new)
        else {
            return Ok(());
        };
        let resource = self.client(0).resource(RESOURCE).unwrap();
        let fresh = token.get() >= mark;
        match resource.push(token, &[b"edge"]).await {
            Ok(len) if fresh => {
                self.model.items += 1;
                self.model.mark = Some(token.get());
                if len != self.model.items {
                    return Err((
                        Property::RetriesApplyOnce,
                        format!(
                            "the list has {len} items, {} writes were accepted",
                            self.model.items
                        ),
                    ));
                }
                Ok(())
            }
            Ok(_) => Err((
                Property::StaleWriteRejected,
                format!("token {token}, one below the mark {mark}, was accepted"),
            )),
            Err(Error::StaleToken { latest, .. }) if !fresh && latest.get() == mark => Ok(()),
            Err(Error::StaleToken { latest, .. }) => Err((
                Property::ValidWriteAccepted,
                format!("token {token} (mark {mark}) was rejected for {latest}"),
            )),
            Err(e) => Err((Property::ModelAgreement, format!("edge write: {e}"))),
        }
    }

    /// The server's clock (`TIME`), in microseconds.
    fn server_now_us(&self) -> u64 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut self.fx().raw()).unwrap();
        secs * 1_000_000 + micros
    }

    /// Waits until the server clock has passed every token issued and the counter: then losing
    /// the counter is within the documented bound (tokens stay increasing by the clock floor).
    async fn wait_past_issued(&self) {
        let past = self
            .model
            .highest_issued
            .max(self.model.counter_floor)
            .unwrap_or(0);
        while self.server_now_us() <= past {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn takeover(&mut self) -> Result<(), (Property, String)> {
        if self.model.owner.is_some() {
            return Ok(());
        }
        let unexpected = |e: Error| (Property::ModelAgreement, format!("takeover: {e}"));
        let lock = self.world.watched.lock(&self.world.name).unwrap();
        let first = lock.acquire().await.map_err(unexpected)?;
        let key = self.fx().lock_key(&self.world.name).unwrap();
        let _: () = self.fx().raw().del(&key).unwrap();
        let second = self.world.clients[0]
            .lock(&self.world.name)
            .unwrap()
            .try_acquire()
            .await
            .map_err(unexpected)?
            .ok_or((
                Property::ModelAgreement,
                "a deleted lock was refused".to_owned(),
            ))?;
        let calls = self.world.watched.renewal_calls();
        let watched = &self.world.watched;
        // The first renewal sent after the takeover has been answered once a second one is
        // sent (a tick awaits its batches); a correct watchdog has marked it lost by then.
        eventually(PATIENCE, || {
            !first.is_valid() || watched.renewal_calls() >= calls + 2
        })
        .await;
        let still_valid = first.is_valid();
        let _ = first.release().await;
        let token = second.token().get();
        second.release().await.map_err(unexpected)?;
        self.model.highest_issued = Some(token);
        if still_valid {
            return Err((
                Property::MutualExclusion,
                "a holder whose lock was taken over was renewed and still trusts its lease".into(),
            ));
        }
        Ok(())
    }

    fn check_redis(&self, property: Property) -> Result<(), (Property, String)> {
        let actual = self.fx().lock_state(&self.world.name);
        let ok = match (&self.model.owner, &actual) {
            (None, None) => true,
            (Some((id, _, count)), Some((holders, token))) => {
                if Some(*token) != self.model.token {
                    let p = if *holders == vec![(id.clone(), *count)] {
                        Property::ReentrySameToken
                    } else {
                        property
                    };
                    return Err((
                        p,
                        format!("redis token {token}, model {:?}", self.model.token),
                    ));
                }
                *holders == vec![(id.clone(), *count)]
            }
            _ => false,
        };
        if !ok {
            return Err((
                property,
                format!("redis has {actual:?}, the model {:?}", self.model.owner),
            ));
        }
        Ok(())
    }

    /// Every holder with a live (or forgotten) guard is on its client's watch list, and no
    /// other: the watchdog renews exactly the locks that are held.
    fn check_watched(&self) -> Result<(), (Property, String)> {
        for c in 0..2 {
            let mut live: HashSet<&str> = HashSet::new();
            for (h, slot) in self.slots.iter().enumerate() {
                if h % 2 == c {
                    live.extend(slot.guards.iter().map(|g| g.holder_id()));
                }
            }
            for guard in &self.zombies {
                if self.world.clients[c].id() == guard.holder_id().split(':').next().unwrap_or("") {
                    live.insert(guard.holder_id());
                }
            }
            let expected = live
                .iter()
                .filter(|id| !self.unwatched.contains(**id))
                .count()
                + self.world.leaked[c];
            let actual = self.world.clients[c].watched_locks();
            if actual != expected {
                return Err((
                    Property::CountsReturnToZero,
                    format!("client {c} watches {actual} holders, {expected} hold guards"),
                ));
            }
        }
        Ok(())
    }

    async fn finish(mut self) -> Result<(), (Property, String)> {
        let mut guards = std::mem::take(&mut self.zombies);
        for slot in &mut self.slots {
            guards.append(&mut slot.guards);
        }
        for guard in guards {
            let _ = guard.release().await;
        }
        self.check_watched()?;
        // A crashed holder's lock stays until its lease ends; end it now.
        if self
            .model
            .owner
            .as_ref()
            .is_some_and(|(id, _, _)| self.crashed.contains(id))
        {
            if let Some(key) = self.fx().lock_key(&self.world.name) {
                let _: () = self.fx().raw().del(key).unwrap();
            }
        }
        let residue = check::residue(&mut self.fx().raw(), "fencelock:").unwrap();
        if !residue.locks.is_empty() {
            return Err((
                Property::CountsReturnToZero,
                format!(
                    "the lock is still held after every guard was released: {:?}",
                    residue.locks
                ),
            ));
        }
        if !residue.stray.is_empty() {
            return Err((
                Property::NoResidue,
                format!("left behind: {:?}", residue.stray),
            ));
        }
        Ok(())
    }
}

/// Operation records that `cancel.lua` wrote (value "c").
fn cancel_records(fx: &Fixture) -> usize {
    fx.keys("fencelock:{*}op:*")
        .into_iter()
        .filter(|k| fx.raw().get::<_, Option<String>>(k).unwrap().as_deref() == Some("c"))
        .count()
}

/// The shrunk failing program and the property it violated.
#[derive(Debug)]
pub struct Failure {
    pub steps: Vec<Step>,
    pub violation: Violation,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.violation)?;
        writeln!(f, "shrunk program ({} steps):", self.steps.len())?;
        for (i, step) in self.steps.iter().enumerate() {
            writeln!(f, "  {i}: {step:?}")?;
        }
        Ok(())
    }
}

/// Runs `cases` random programs; the shrunk counterexample if one fails.
pub fn run_cases(
    world: &mut World,
    weights: Weights,
    len: std::ops::Range<usize>,
    cases: u32,
    regressions: Option<&'static str>,
) -> Result<(), Failure> {
    let config = super::runner_config(cases, 256, regressions);
    let mut runner = TestRunner::new(config);
    let last = Mutex::new(None);
    let world = Mutex::new(world);
    // Long runs report progress (every N programs, shrinking included) on stderr.
    let progress = env_cases("FENCELOCK_PROPTEST_PROGRESS", 0);
    let ran = std::sync::atomic::AtomicU32::new(0);
    let started = Instant::now();
    let result = runner.run(&program(weights, len), |steps| {
        let n = ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if progress > 0 && n.is_multiple_of(progress) {
            eprintln!("progress: {n} programs in {:.0?}", started.elapsed());
        }
        let outcome = world.lock().unwrap_or_else(|e| e.into_inner()).run(&steps);
        outcome.map_err(|v| {
            let reason = v.to_string();
            *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
            TestCaseError::fail(reason)
        })
    });
    match result {
        Ok(()) => Ok(()),
        Err(TestError::Fail(_, steps)) => Err(Failure {
            steps,
            violation: last.into_inner().unwrap().expect("a failure was recorded"),
        }),
        Err(TestError::Abort(why)) => panic!("proptest aborted: {why}"),
    }
}

pub use crate::common::env_cases;

/// The failure of a [`Step::Retried`] operation, with when its effect was seen in Redis and its
/// connection reset, and when it returned, all from its first send.
fn retried_failure(
    op: &str,
    err: &fencelock::Error,
    (ran, seen, reset): (bool, Duration, Duration),
    sent: std::time::Instant,
) -> String {
    format!(
        "{op}: {err} (returned {:?} after its first send; its effect was {} in Redis after \
         {seen:?}; its connection was reset after {reset:?})",
        sent.elapsed(),
        if ran { "seen" } else { "not seen" },
    )
}
