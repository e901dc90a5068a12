//! Flash sale: many buyers race for the last items of one SKU, and many payers draw on one
//! account, each purchase and each payment inside a fencelock lock and read and written with
//! the lock's fencing token. The program then checks the data in Redis and prints whether every
//! invariant held. With `--chaos`, holders stall past their lease in the middle of a purchase,
//! as in a GC pause, and the fenced ledger refuses their late writes.
//!
//! # The scenario
//!
//! Several [`LockClient`]s (think: several app servers) each run many tasks (think: request
//! handlers). They share one Redis, which is both the lock service and the storage: the ledger
//! of each scenario is one [`FencedResource`], a Redis hash that accepts a read or write only
//! when it carries a fencing token at least as new as every token the ledger has seen before.
//!
//! 1. **Flash sale.** Ledger `demo:sale:<sku>`: field `stock` starts at `--items`, and field
//!    `order:<n>` = `buyer,token` records the item sold when `n` items were already gone.
//!    Every buyer loops: take lock `sku:<sku>`, read `stock`, and if it is above zero write
//!    `stock - 1` together with `order:<items - stock>` in one fenced write; release. A buyer
//!    stops when it finds the stock at zero, so the sale ends exactly when the last item is
//!    gone.
//! 2. **Balance deduction.** Ledger `demo:account:<account>`: field `balance` starts at
//!    `--balance` cents, field `payments` counts the records `payment:<n>` =
//!    `payer,token,amount,approved|declined`. Every payer makes `--payments` payments of a
//!    random 1..=100 cents: take lock `account:<account>`, read `balance` and `payments`, then
//!    in one fenced write deduct and record `approved` when the money is there, or record
//!    `declined` when it is not; release.
//!
//! Both critical sections are a deliberately *non-atomic* read-modify-write (read a field, then
//! write the value read minus something). Only the lock and the fence keep two buyers from
//! selling the same item twice; an atomic `HINCRBY` would hide a broken lock. Each purchase
//! and each payment is still *one* fenced write, so its stock (or balance) change and its
//! ledger record land together or not at all.
//!
//! # Fencing
//!
//! Every read and write under the lock carries the guard's token. A write whose token is older
//! than the newest one the ledger has seen writes nothing and fails with `Error::StaleToken`:
//! its holder lost the lock mid-way. The buyer or payer counts a stale write and starts that
//! purchase or payment over with a new acquisition; the refused attempt is not counted as sold
//! or paid.
//!
//! The reads carry the token too (`get_field(token, field)`) because a fenced read *claims* the
//! ledger: it raises the ledger's high-water mark to the reader's token, so from then on every
//! older holder's write is refused, and every write accepted before is in what was read. A
//! token-less read (`peek_field`, used only by the checks) would leave a gap: a stalled holder's
//! late write would still be accepted after the next holder read (nobody newer had written
//! yet), and that holder's write, computed from its earlier read, would overwrite it. (With
//! token-less reads, full-size `--chaos` runs lose a record now and then: the gap opens when the
//! next holder is itself stalled between its read and its write.) The reads and the write of
//! one holder share a token, which the ledger accepts because it fences with `>=`.
//!
//! # Chaos
//!
//! With `--chaos` the locks get a short explicit lease (200 ms, not renewed by the watchdog),
//! and a holder that is about to write stalls for 300 to 400 ms between its read and its write
//! with probability 1 in 8 (drawn from `--seed`), like a GC pause or `SIGSTOP`. The first
//! holder about to write in each phase always stalls, while every other task is queued for the
//! lock, so every chaos run has at least one overtaken holder. The stalled holder's lease runs
//! out, the next holder takes the lock and reads the ledger (claiming it), and the stalled
//! holder wakes up believing it still holds the lock: its write must be refused. Meanwhile two
//! tasks are inside the critical section at once; under chaos that is reported, not a failure.
//!
//! # The checks
//!
//! Everything sold and nothing oversold, no value ever read below zero, every unit taken (every
//! cent paid, every payment made) accounted for by exactly one ledger record, the tokens in
//! ledger order strictly increasing (each record written by a later holder than the one
//! before), and every accepted write from the newest token: the ledger holds exactly the writes
//! the store acknowledged and none that it refused. Without `--chaos` also: at most one task
//! inside a critical section at a time, and no release that found its lock already gone. (The
//! tokens look like timestamps because fencelock issues `max(last token + 1, server time in
//! µs)`, so they keep rising even if Redis loses its counter.)
//!
//! # Running it
//!
//! ```text
//! scripts/demo                    # installs redis-server if needed, then runs this
//! cargo run --release --example flash_sale
//! cargo run --release --example flash_sale -- --quick
//! cargo run --release --example flash_sale -- --chaos
//! cargo run --release --example flash_sale -- --quick --chaos --seed 7
//! cargo run --release --example flash_sale -- --items 500 --clients 8 --tasks 32
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --release --example flash_sale
//! ```
//!
//! Without `REDIS_URL` the demo starts its own throwaway `redis-server` on a free loopback
//! port (never 6379) and stops it at the end. With `REDIS_URL` it uses that server, puts every
//! key (locks and ledgers) under a fresh prefix `fencelock-demo-<uuid>:` so it cannot touch
//! anything else there, and deletes its keys when it is done.
//!
//! Exit status: 0 when every invariant held, 1 when one was violated or the run broke off,
//! 2 for a usage error or when no Redis could be had. Stale writes are never a failure: they
//! are the fence doing its job.

use std::collections::{BTreeMap, HashSet};
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::{FencedResource, FencingToken, Lock, LockClient, LockGuard};
use fencelock_testing::RedisServer;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `println!` that ignores a closed stdout (`flash_sale | head`), so the run still removes its
/// keys and stops its server instead of panicking half-way.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

const SKU: &str = "FLASH-001";
const ACCOUNT: &str = "acct-42";
/// Far above the few milliseconds a critical section takes, so a lease that runs out mid-way
/// means a real stall; short enough that a crashed buyer blocks the sale only briefly.
const LEASE: Duration = Duration::from_secs(5);
/// How long one buyer waits before giving up and trying again, like a shopper clicking "buy"
/// once more. Timeouts are reported, not fatal: they measure the lock, not the invariants.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
const MAX_PAYMENT_CENTS: u64 = 100;
/// `--chaos`: the locks' explicit lease, not renewed, so a stalled holder loses the lock soon.
/// Still far above an unstalled critical section (well under 10 ms even in a debug build).
const CHAOS_LEASE: Duration = Duration::from_millis(200);
/// `--chaos`: a stalled holder sleeps this long plus up to [`CHAOS_STALL_JITTER_MS`], always
/// past its lease.
const CHAOS_STALL_MS: u64 = 300;
const CHAOS_STALL_JITTER_MS: u64 = 100;
/// `--chaos`: one holder about to write in this many stalls.
const CHAOS_ONE_IN: u64 = 8;

const USAGE: &str = "\
usage: flash_sale [--items N] [--clients C] [--tasks T] [--balance CENTS] [--payments P]
                  [--chaos] [--seed S] [--quick]

  --items N        items of the SKU in stock                  (default 100, quick 20)
  --clients C      LockClients, each with its own connections (default 4,   quick 2)
  --tasks T        concurrent buyers/payers per client        (default 16,  quick 4)
  --balance CENTS  starting balance of the account            (default 10000, quick 1000)
  --payments P     payments each payer task makes             (default 8,   quick 4)
  --chaos          holders pause past their lease: locks get a 200 ms lease (no watchdog),
                   and 1 in 8 holders (always the first writer of each phase) sleeps
                   300-400 ms between its read and its write; the fenced ledger must refuse
                   those late writes, and every invariant must still hold
  --seed S         seed for payment amounts and chaos pauses  (default random, printed)
  --quick          small numbers for a CI smoke run; explicit flags still win

Every ledger read and write under the lock carries the lock's token (FencedResource); a
refused (stale) write is counted and its purchase or payment retried with a new acquisition.

Set REDIS_URL to use an existing Redis (keys go under a unique prefix and are removed
afterwards); otherwise a throwaway redis-server is started on a free port.";

// ---------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Options {
    items: i64,
    clients: usize,
    tasks: usize,
    balance: i64,
    payments: usize,
    chaos: bool,
    seed: u64,
    quick: bool,
}

/// The flags as given; anything not given comes from the default or the `--quick` preset,
/// whichever applies, so `--quick --items 50` is a quick run that sells 50.
#[derive(Default)]
struct Flags {
    items: Option<i64>,
    clients: Option<usize>,
    tasks: Option<usize>,
    balance: Option<i64>,
    payments: Option<usize>,
    chaos: bool,
    seed: Option<u64>,
    quick: bool,
}

/// Parses the arguments after the program name; `Ok(None)` means help was asked for.
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Option<Options>, String> {
    let mut flags = Flags::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        // Both `--items 5` and `--items=5`.
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg, None),
        };
        let mut value = || inline.clone().or_else(|| args.next());
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--quick" => flags.quick = true,
            "--chaos" => flags.chaos = true,
            "--items" => flags.items = Some(number(&flag, value())?),
            "--clients" => flags.clients = Some(number(&flag, value())?),
            "--tasks" => flags.tasks = Some(number(&flag, value())?),
            "--balance" => flags.balance = Some(number(&flag, value())?),
            "--payments" => flags.payments = Some(number(&flag, value())?),
            "--seed" => flags.seed = Some(number(&flag, value())?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let quick = flags.quick;
    let pick = |given: Option<usize>, normal: usize, small: usize| {
        given.unwrap_or(if quick { small } else { normal })
    };
    let options = Options {
        items: flags.items.unwrap_or(if quick { 20 } else { 100 }),
        clients: pick(flags.clients, 4, 2),
        tasks: pick(flags.tasks, 16, 4),
        balance: flags.balance.unwrap_or(if quick { 1_000 } else { 10_000 }),
        payments: pick(flags.payments, 8, 4),
        chaos: flags.chaos,
        seed: flags
            .seed
            .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0),
        quick,
    };
    if options.items < 0 || options.balance < 0 {
        return Err("--items and --balance must not be negative".into());
    }
    if options.clients == 0 || options.tasks == 0 {
        return Err("--clients and --tasks must be at least 1".into());
    }
    Ok(Some(options))
}

fn number<T: FromStr>(flag: &str, value: Option<String>) -> Result<T, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    value
        .parse()
        .map_err(|_| format!("{flag}: {value:?} is not a valid number"))
}

// ---------------------------------------------------------------------------------------------
// Where Redis comes from
// ---------------------------------------------------------------------------------------------

/// The Redis the demo runs against. An own server lives exactly as long as this value.
enum Target {
    Own(Box<RedisServer>),
    External(String),
}

impl Target {
    fn from_env() -> Result<Target, String> {
        match std::env::var("REDIS_URL") {
            Ok(url) if !url.trim().is_empty() => Ok(Target::External(url.trim().to_owned())),
            _ => RedisServer::start()
                .map(|server| Target::Own(Box::new(server)))
                .map_err(|err| {
                    format!(
                        "could not start a throwaway redis-server: {err}\n\
                     Run scripts/demo (it installs redis-server on Debian), install it yourself \
                     (apt-get install -y redis-server), or set REDIS_URL to a server to use."
                    )
                }),
        }
    }

    fn url(&self) -> String {
        match self {
            Target::Own(server) => server.url(),
            Target::External(url) => url.clone(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Target::Own(server) => format!(
                "throwaway redis-server started on 127.0.0.1:{} (pid {}), stopped at exit",
                server.port(),
                server.pid()
            ),
            Target::External(url) => format!("at REDIS_URL={}", redact(url)),
        }
    }
}

/// The URL without its password, which has no business in a log.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// The fleet: one lock client per simulated app server, plus the back office
// ---------------------------------------------------------------------------------------------

struct Fleet {
    prefix: String,
    /// One per simulated app server, each with its own connection, as separate processes
    /// would have. Locks and ledgers go through the same client.
    clients: Vec<LockClient>,
    /// The back office: opens the ledgers (under the lock, with a token like anyone else)
    /// and reads them back for the checks.
    office: LockClient,
    /// For the server version and the clean-up, outside any lock.
    admin: MultiplexedConnection,
}

impl Fleet {
    async fn connect(url: &str, clients: usize) -> Result<Fleet, BoxError> {
        // A fresh prefix per run: the demo cannot collide with other data on a shared server,
        // nor with an earlier run's leftovers.
        let prefix = format!("fencelock-demo-{}:", uuid::Uuid::new_v4().simple());
        let admin = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let connect = || {
            LockClient::builder(url)
                .prefix(&prefix)
                .default_lease(LEASE)
                .connect()
        };
        let office = connect().await?;
        let mut members = Vec::with_capacity(clients);
        for _ in 0..clients {
            members.push(connect().await?);
        }
        Ok(Fleet {
            prefix,
            clients: members,
            office,
            admin,
        })
    }

    async fn server_version(&self) -> Result<String, BoxError> {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut self.admin.clone())
            .await?;
        Ok(info
            .lines()
            .find_map(|line| line.strip_prefix("redis_version:"))
            .unwrap_or("unknown")
            .trim()
            .to_owned())
    }

    /// Deletes every key of this run: the ledgers with their high-water marks, and what the
    /// locks left behind (fence counters, operation records). The prefix is unique to this
    /// run, so everything under it is ours. Returns how many keys were deleted.
    async fn cleanup(&self) -> Result<usize, BoxError> {
        let mut conn = self.admin.clone();
        let pattern = format!("{}*", self.prefix);
        let mut cursor: u64 = 0;
        let mut removed = 0;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                removed += conn.del::<_, usize>(&keys).await?;
            }
            if next == 0 {
                return Ok(removed);
            }
            cursor = next;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Watching the critical sections from outside
// ---------------------------------------------------------------------------------------------

/// What the referee sees of one phase, independent of what ends up in Redis.
struct Referee {
    inside: AtomicUsize,
    max_inside: AtomicUsize,
    /// Entries into the critical section so far; numbers them.
    entries: AtomicU64,
    /// Tasks that were still inside when a newer one entered. Without chaos that is a broken
    /// lock; under `--chaos` it is a holder stalled past its lease, still running.
    overtaken: AtomicU64,
    /// Releases that found the lock no longer ours: the critical section may have overlapped.
    lost_locks: AtomicU64,
    timeouts: AtomicU64,
    /// Holders that stalled past their lease (`--chaos`).
    stalls: AtomicU64,
    /// The lowest stock or balance any task read inside the lock.
    min_seen: AtomicI64,
}

impl Referee {
    fn new() -> Referee {
        Referee {
            inside: AtomicUsize::new(0),
            max_inside: AtomicUsize::new(0),
            entries: AtomicU64::new(0),
            overtaken: AtomicU64::new(0),
            lost_locks: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
            min_seen: AtomicI64::new(i64::MAX),
        }
    }

    /// Marks a task as inside the critical section until the returned value is dropped. All
    /// clients live in this process, so a plain counter sees any overlap between them.
    fn enter(&self) -> Inside<'_> {
        let entry = self.entries.fetch_add(1, Ordering::SeqCst);
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inside.fetch_max(now, Ordering::SeqCst);
        Inside {
            referee: self,
            entry,
        }
    }

    fn saw(&self, value: i64) {
        self.min_seen.fetch_min(value, Ordering::SeqCst);
    }
}

struct Inside<'a> {
    referee: &'a Referee,
    /// This task's entry number.
    entry: u64,
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        let referee = self.referee;
        if referee.entries.load(Ordering::SeqCst) > self.entry + 1 {
            // Someone entered after us while we were still inside.
            referee.overtaken.fetch_add(1, Ordering::SeqCst);
        }
        referee.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The `--chaos` stalls of one phase.
struct Chaos {
    on: bool,
    /// The first holder about to write in a phase always stalls: every other task is queued
    /// for the lock then, so it is sure to be overtaken and the chaos bites every run.
    first_pending: AtomicBool,
}

impl Chaos {
    fn new(on: bool) -> Chaos {
        Chaos {
            on,
            first_pending: AtomicBool::new(on),
        }
    }

    /// Whether the holder about to write stalls first, and for how long (always longer than
    /// [`CHAOS_LEASE`]). Draws from the task's own generator, so with `--seed` each task makes
    /// the same choices again.
    fn stall(&self, rng: &mut SplitMix64) -> Option<Duration> {
        if !self.on {
            return None;
        }
        let (roll, jitter) = (rng.next(), rng.next());
        let first = self.first_pending.swap(false, Ordering::SeqCst);
        (first || roll % CHAOS_ONE_IN == 0)
            .then(|| Duration::from_millis(CHAOS_STALL_MS + jitter % (CHAOS_STALL_JITTER_MS + 1)))
    }
}

/// What the workers of one phase share.
struct Shared {
    referee: Referee,
    chaos: Chaos,
    opts: Options,
}

impl Shared {
    fn new(opts: &Options) -> Arc<Shared> {
        Arc::new(Shared {
            referee: Referee::new(),
            chaos: Chaos::new(opts.chaos),
            opts: opts.clone(),
        })
    }

    /// The handle a worker acquires through: under `--chaos` a short lease of its own that
    /// nobody renews, otherwise the client's default lease, kept alive by the watchdog.
    fn lock(&self, client: &LockClient, name: String) -> Result<Lock, BoxError> {
        let lock = client.lock(name)?;
        Ok(if self.opts.chaos {
            lock.with_lease(CHAOS_LEASE)?
        } else {
            lock
        })
    }

    /// Between a read and the write that depends on it: a stall past the lease, sometimes,
    /// under `--chaos`. The task sleeps; the lock's lease runs out meanwhile.
    async fn maybe_stall(&self, rng: &mut SplitMix64) {
        if let Some(pause) = self.chaos.stall(rng) {
            self.referee.stalls.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(pause).await;
        }
    }
}

/// One task's own numbers, merged after the phase.
#[derive(Default)]
struct Tally {
    /// From calling `acquire_timeout` to holding the guard.
    waits: Vec<Duration>,
    /// From holding the guard to starting the release.
    holds: Vec<Duration>,
    /// Items bought, payments approved.
    succeeded: u64,
    /// Buyers turned away (sold out), payments declined.
    refused: u64,
    /// The token of every ledger write the store accepted: one per purchase or payment.
    written: Vec<u64>,
    /// Every read or write the ledger refused as stale.
    stale: Vec<Refused>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.waits.extend(other.waits);
        self.holds.extend(other.holds);
        self.succeeded += other.succeeded;
        self.refused += other.refused;
        self.written.extend(other.written);
        self.stale.extend(other.stale);
    }
}

/// Takes `lock`, trying again after each timeout, and records how long the successful call
/// waited.
async fn acquire(lock: &Lock, referee: &Referee, tally: &mut Tally) -> Result<LockGuard, BoxError> {
    loop {
        let asked = Instant::now();
        match lock.acquire_timeout(ACQUIRE_TIMEOUT).await {
            Ok(guard) => {
                tally.waits.push(asked.elapsed());
                return Ok(guard);
            }
            Err(err) if err.is_timeout() => {
                referee.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// Releases, counting a lock that was already gone instead of aborting: that is exactly the
/// event the report must show.
async fn release(guard: LockGuard, referee: &Referee) -> Result<(), BoxError> {
    match guard.release().await {
        Err(err) if err.is_not_held() => {
            referee.lost_locks.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        other => Ok(other?),
    }
}

/// How one critical section ended.
enum Section<T> {
    /// It ran to the end; `T` says what it did, the token is the one it wrote with.
    Done(T, FencingToken),
    /// The ledger refused a read or write as stale: a newer holder took over while this one
    /// still ran. Nothing was written; the caller starts over with a new acquisition.
    Stale,
}

/// Runs `body` under `lock` with the referee watching, and keeps the numbers.
async fn locked<T, F, Fut>(
    lock: &Lock,
    referee: &Referee,
    tally: &mut Tally,
    body: F,
) -> Result<Section<T>, BoxError>
where
    F: FnOnce(FencingToken) -> Fut,
    Fut: std::future::Future<Output = Result<T, BoxError>>,
{
    let guard = acquire(lock, referee, tally).await?;
    let token = guard.token();
    let held = Instant::now();
    let outcome = {
        let _inside = referee.enter();
        body(token).await
    };
    tally.holds.push(held.elapsed());
    // On an error the guard is released here too (by `release` or, after `?`, by drop).
    release(guard, referee).await?;
    match outcome {
        Ok(value) => Ok(Section::Done(value, token)),
        Err(err) => match err.downcast::<Refused>() {
            Ok(refusal) => {
                tally.stale.push(*refusal);
                Ok(Section::Stale)
            }
            Err(err) => Err(err),
        },
    }
}

/// A read or write the ledger refused with `Error::StaleToken`: a newer holder has claimed it,
/// so this holder lost the lock mid-way. Nothing was read or written.
#[derive(Debug)]
struct Refused {
    write: bool,
    presented: u64,
    latest: u64,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stale {}: token {}, the ledger has seen {}",
            if self.write { "write" } else { "read" },
            self.presented,
            self.latest
        )
    }
}

impl std::error::Error for Refused {}

/// `err` as a [`Refused`] when it is a stale-token refusal, so [`locked`] can tell it apart.
fn refusal(write: bool, err: fencelock::Error) -> BoxError {
    match err {
        fencelock::Error::StaleToken {
            presented, latest, ..
        } => Box::new(Refused {
            write,
            presented: presented.get(),
            latest: latest.get(),
        }),
        other => other.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Ledgers: one fenced Redis hash per scenario
// ---------------------------------------------------------------------------------------------

fn sale_ledger() -> String {
    format!("demo:sale:{SKU}")
}

fn account_ledger() -> String {
    format!("demo:account:{ACCOUNT}")
}

/// One fenced write of `fields` (name, value) to `ledger`: all of them or, when a newer
/// holder has claimed the ledger, none ([`Refused`]).
async fn write(
    ledger: &FencedResource,
    token: FencingToken,
    fields: &[(&str, &str)],
) -> Result<(), BoxError> {
    let fields: Vec<(&[u8], &[u8])> = fields
        .iter()
        .map(|(field, value)| (field.as_bytes(), value.as_bytes()))
        .collect();
    ledger
        .set_fields(token, &fields)
        .await
        .map_err(|err| refusal(true, err))
}

/// Reads a field under the lock, as the holder of `token`: an integer, absent counting as 0.
/// The read claims the ledger for `token`, so from here on every older holder's write is
/// refused, and whatever one wrote before is in what this returns. [`Refused`] when a newer
/// holder has claimed it already.
async fn read_int(
    ledger: &FencedResource,
    token: FencingToken,
    field: &str,
) -> Result<i64, BoxError> {
    let raw = ledger
        .get_field(token, field)
        .await
        .map_err(|err| refusal(false, err))?;
    parse_int(field, raw)
}

/// Reads a field without a token, as an observer (the checks after a phase).
async fn peek_text(ledger: &FencedResource, field: &str) -> Result<Option<String>, BoxError> {
    match ledger.peek_field(field).await? {
        Some(raw) => {
            Ok(Some(String::from_utf8(raw).map_err(|err| {
                format!("ledger field {field} is not UTF-8: {err}")
            })?))
        }
        None => Ok(None),
    }
}

/// [`peek_text`] as an integer, absent counting as 0.
async fn peek_int(ledger: &FencedResource, field: &str) -> Result<i64, BoxError> {
    parse_int(field, ledger.peek_field(field).await?)
}

fn parse_int(field: &str, raw: Option<Vec<u8>>) -> Result<i64, BoxError> {
    let Some(raw) = raw else { return Ok(0) };
    let text = String::from_utf8_lossy(&raw);
    Ok(text
        .parse()
        .map_err(|_| format!("ledger field {field} holds {text:?}, not an integer"))?)
}

/// Opens a ledger the way every writer must: under its lock, with the lock's token.
async fn open_ledger(
    office: &LockClient,
    lock_name: &str,
    ledger: &FencedResource,
    fields: &[(&str, &str)],
) -> Result<(), BoxError> {
    let guard = office.lock(lock_name)?.acquire().await?;
    write(ledger, guard.token(), fields).await?;
    guard.release().await?;
    Ok(())
}

/// The records `<kind>:0`, `<kind>:1`, ... of a ledger, probing indices `0..=last`; each with
/// its index.
async fn records(
    ledger: &FencedResource,
    kind: &str,
    last: i64,
) -> Result<Vec<(i64, String)>, BoxError> {
    let mut found = Vec::new();
    for n in 0..=last {
        if let Some(record) = peek_text(ledger, &format!("{kind}:{n}")).await? {
            found.push((n, record));
        }
    }
    Ok(found)
}

/// `None` when the records' indices (ascending, as [`records`] returns them) are exactly
/// `0..indices.len()`, else the first one missing.
fn gaps(indices: &[i64]) -> Option<String> {
    let have: HashSet<i64> = indices.iter().copied().collect();
    (0..indices.len() as i64)
        .find(|n| !have.contains(n))
        .map(|missing| format!("record {missing} is missing"))
}

/// The fencing invariant as the ledger shows it: the records are exactly the writes the store
/// acknowledged (none lost or overwritten), no refused write is among them, and every refusal
/// named a newer token than the one presented. `Ok` holds the detail line, `Err` the failure.
fn fence_check(ledger: &[u64], written: &[u64], stale: &[(u64, u64)]) -> Result<String, String> {
    let (mut have, mut want) = (ledger.to_vec(), written.to_vec());
    have.sort_unstable();
    want.sort_unstable();
    if have != want {
        let missing: Vec<&u64> = want.iter().filter(|t| !have.contains(t)).take(3).collect();
        let unexpected: Vec<&u64> = have.iter().filter(|t| !want.contains(t)).take(3).collect();
        return Err(format!(
            "{} records for {} accepted writes: lost or overwritten {missing:?}, \
             never acknowledged {unexpected:?}",
            have.len(),
            want.len(),
        ));
    }
    let in_ledger: HashSet<u64> = have.iter().copied().collect();
    if let Some((presented, _)) = stale.iter().find(|(p, _)| in_ledger.contains(p)) {
        return Err(format!("refused token {presented} is in the ledger"));
    }
    if let Some((presented, latest)) = stale.iter().find(|(p, l)| l <= p) {
        return Err(format!(
            "token {presented} refused although the newest was {latest}"
        ));
    }
    Ok(format!(
        "{} accepted, all in the ledger; {} stale, none in it",
        have.len(),
        stale.len()
    ))
}

// ---------------------------------------------------------------------------------------------
// Phase 1: the flash sale
// ---------------------------------------------------------------------------------------------

/// One buyer: buys one item at a time until it finds the stock at zero. A purchase refused as
/// stale is started over with a new acquisition.
async fn buyer(
    client: LockClient,
    shared: Arc<Shared>,
    name: String,
    seed: u64,
) -> Result<Tally, BoxError> {
    let lock = shared.lock(&client, format!("sku:{SKU}"))?;
    let ledger = client.resource(sale_ledger())?;
    let mut rng = SplitMix64(seed);
    let mut tally = Tally::default();
    loop {
        let (ledger, shared_ref, name, rng) = (&ledger, &*shared, &name, &mut rng);
        let section = locked(&lock, &shared.referee, &mut tally, |token| async move {
            buy_one(ledger, shared_ref, name, rng, token).await
        })
        .await?;
        match section {
            Section::Done(true, token) => {
                tally.succeeded += 1;
                tally.written.push(token.get());
            }
            Section::Done(false, _) => {
                tally.refused += 1;
                return Ok(tally);
            }
            Section::Stale => {}
        }
    }
}

/// The critical section of a purchase: read the stock, then (not HINCRBY) write it one
/// lower with the order record, in one fenced write. A second holder that got past the lock
/// and the fence would show up as an oversold or double-sold item.
async fn buy_one(
    ledger: &FencedResource,
    shared: &Shared,
    buyer: &str,
    rng: &mut SplitMix64,
    token: FencingToken,
) -> Result<bool, BoxError> {
    let stock = read_int(ledger, token, "stock").await?;
    shared.referee.saw(stock);
    if stock <= 0 {
        return Ok(false);
    }
    shared.maybe_stall(rng).await;
    let sold_before = shared.opts.items - stock;
    write(
        ledger,
        token,
        &[
            ("stock", &(stock - 1).to_string()),
            (&format!("order:{sold_before}"), &format!("{buyer},{token}")),
        ],
    )
    .await?;
    Ok(true)
}

async fn flash_sale(fleet: &Fleet, opts: &Options) -> Result<PhaseReport, BoxError> {
    let lock_name = format!("sku:{SKU}");
    let ledger = fleet.office.resource(sale_ledger())?;
    open_ledger(
        &fleet.office,
        &lock_name,
        &ledger,
        &[("stock", &opts.items.to_string())],
    )
    .await?;

    let shared = Shared::new(opts);
    let started = Instant::now();
    let tally = run_workers(fleet, opts, 1, |client, name, seed| {
        buyer(client, shared.clone(), name, seed)
    })
    .await?;
    let elapsed = started.elapsed();

    let final_stock = peek_int(&ledger, "stock").await?;
    let found = records(&ledger, "order", opts.items).await?;
    let indices: Vec<i64> = found.iter().map(|(n, _)| *n).collect();
    let orders = found
        .iter()
        .map(|(_, record)| parse_order(record))
        .collect::<Result<Vec<_>, _>>()?;
    let tokens: Vec<u64> = orders.iter().map(|(_, token)| *token).collect();

    let mut report = PhaseReport::new("flash sale", elapsed, tally, &shared);
    report.fact(
        "purchases",
        format!(
            "{} items sold, {} buyers turned away once sold out",
            report.tally.succeeded, report.tally.refused
        ),
    );
    report.fact("orders per client", per_client(&orders, opts.clients));
    let buyers_served = orders
        .iter()
        .map(|(buyer, _)| buyer.as_str())
        .collect::<HashSet<_>>()
        .len();
    report.fact(
        "buyers served",
        format!(
            "{buyers_served} of {} got at least one item",
            opts.clients * opts.tasks
        ),
    );
    report.tokens(&tokens);
    report.fencing_facts();

    let n = opts.items;
    let sold = orders.len() as i64;
    let min_seen = report.min_seen;
    report.check(
        sold == n,
        format!("items sold == {n}"),
        format!("{sold} orders"),
    );
    report.check(
        final_stock == 0,
        "final stock == 0",
        format!("stock is {final_stock}"),
    );
    report.check(
        min_seen >= 0 && final_stock >= 0,
        "stock never negative",
        format!("lowest read under the lock: {min_seen}, final: {final_stock}"),
    );
    let gap = gaps(&indices);
    report.check(
        sold == n - final_stock && report.tally.succeeded as i64 == sold && gap.is_none(),
        "every unit taken in exactly one order",
        format!(
            "{sold} orders{}, {} taken from stock, {} purchases reported by buyers",
            match &gap {
                Some(gap) => format!(" ({gap})"),
                None if sold > 0 => format!(" (order:0..{})", sold - 1),
                None => String::new(),
            },
            n - final_stock,
            report.tally.succeeded
        ),
    );
    report.token_check("order tokens strictly increasing", &tokens);
    report.fence_check(&tokens);
    report.exclusion_checks();
    Ok(report)
}

fn parse_order(entry: &str) -> Result<(String, u64), BoxError> {
    let (buyer, token) = entry
        .split_once(',')
        .ok_or_else(|| format!("malformed order record {entry:?}"))?;
    Ok((buyer.to_owned(), token.parse()?))
}

/// "c0 27 | c1 24 | ...": how evenly the lock spread the items over the clients.
fn per_client(orders: &[(String, u64)], clients: usize) -> String {
    let mut counts: BTreeMap<usize, usize> = (0..clients).map(|c| (c, 0)).collect();
    for (buyer, _) in orders {
        let client = buyer
            .strip_prefix('c')
            .and_then(|rest| rest.split('-').next())
            .and_then(|c| c.parse().ok());
        if let Some(count) = client.and_then(|c| counts.get_mut(&c)) {
            *count += 1;
        }
    }
    counts
        .iter()
        .map(|(client, count)| format!("c{client} {count}"))
        .collect::<Vec<_>>()
        .join(" | ")
}

// ---------------------------------------------------------------------------------------------
// Phase 2: balance deduction
// ---------------------------------------------------------------------------------------------

/// One payer: `--payments` payments of random amounts, each approved or declined under the
/// lock. A payment refused as stale is started over (same amount) with a new acquisition.
async fn payer(
    client: LockClient,
    shared: Arc<Shared>,
    name: String,
    seed: u64,
) -> Result<Tally, BoxError> {
    let lock = shared.lock(&client, format!("account:{ACCOUNT}"))?;
    let ledger = client.resource(account_ledger())?;
    let mut rng = SplitMix64(seed);
    let mut tally = Tally::default();
    for _ in 0..shared.opts.payments {
        let amount = 1 + (rng.next() % MAX_PAYMENT_CENTS) as i64;
        loop {
            let (ledger, shared_ref, name, rng) = (&ledger, &*shared, &name, &mut rng);
            let section = locked(&lock, &shared.referee, &mut tally, |token| async move {
                pay_one(ledger, shared_ref, name, rng, token, amount).await
            })
            .await?;
            if let Section::Done(approved, token) = section {
                if approved {
                    tally.succeeded += 1;
                } else {
                    tally.refused += 1;
                }
                tally.written.push(token.get());
                break;
            }
        }
    }
    Ok(tally)
}

/// The critical section of a payment: read, then approve and deduct only when the
/// balance covers it; the balance, the count and the record go in one fenced write.
async fn pay_one(
    ledger: &FencedResource,
    shared: &Shared,
    payer: &str,
    rng: &mut SplitMix64,
    token: FencingToken,
    amount: i64,
) -> Result<bool, BoxError> {
    let balance = read_int(ledger, token, "balance").await?;
    let made_before = read_int(ledger, token, "payments").await?;
    shared.referee.saw(balance);
    let approved = balance >= amount;
    shared.maybe_stall(rng).await;
    let outcome = if approved { "approved" } else { "declined" };
    let (count, field) = (
        (made_before + 1).to_string(),
        format!("payment:{made_before}"),
    );
    let record = format!("{payer},{token},{amount},{outcome}");
    let left = (balance - amount).to_string();
    let mut fields = vec![("payments", count.as_str()), (&field, &record)];
    if approved {
        fields.push(("balance", &left));
    }
    write(ledger, token, &fields).await?;
    Ok(approved)
}

struct Payment {
    token: u64,
    amount: i64,
    approved: bool,
}

fn parse_payment(entry: &str) -> Result<Payment, BoxError> {
    let malformed = || format!("malformed payment record {entry:?}");
    let fields: Vec<&str> = entry.split(',').collect();
    let [_payer, token, amount, outcome] = fields[..] else {
        return Err(malformed().into());
    };
    let approved = match outcome {
        "approved" => true,
        "declined" => false,
        _ => return Err(malformed().into()),
    };
    Ok(Payment {
        token: token.parse()?,
        amount: amount.parse()?,
        approved,
    })
}

async fn balance_deduction(fleet: &Fleet, opts: &Options) -> Result<PhaseReport, BoxError> {
    let lock_name = format!("account:{ACCOUNT}");
    let ledger = fleet.office.resource(account_ledger())?;
    open_ledger(
        &fleet.office,
        &lock_name,
        &ledger,
        &[("balance", &opts.balance.to_string()), ("payments", "0")],
    )
    .await?;

    let shared = Shared::new(opts);
    let started = Instant::now();
    let tally = run_workers(fleet, opts, 2, |client, name, seed| {
        payer(client, shared.clone(), name, seed)
    })
    .await?;
    let elapsed = started.elapsed();

    let attempted = opts.clients * opts.tasks * opts.payments;
    let final_balance = peek_int(&ledger, "balance").await?;
    let count = peek_int(&ledger, "payments").await?;
    let found = records(&ledger, "payment", count.max(attempted as i64)).await?;
    let indices: Vec<i64> = found.iter().map(|(n, _)| *n).collect();
    let payments = found
        .iter()
        .map(|(_, record)| parse_payment(record))
        .collect::<Result<Vec<_>, _>>()?;
    let tokens: Vec<u64> = payments.iter().map(|p| p.token).collect();
    let approved: Vec<&Payment> = payments.iter().filter(|p| p.approved).collect();
    let paid: i64 = approved.iter().map(|p| p.amount).sum();
    let declined = payments.len() - approved.len();

    let mut report = PhaseReport::new("balance deduction", elapsed, tally, &shared);
    report.fact(
        "payments",
        format!(
            "{attempted} attempted: {} approved ({} paid), {declined} declined",
            approved.len(),
            money(paid)
        ),
    );
    report.fact(
        "balance",
        format!("{} -> {}", money(opts.balance), money(final_balance)),
    );
    report.tokens(&tokens);
    report.fencing_facts();

    let min_seen = report.min_seen;
    report.check(
        min_seen >= 0 && final_balance >= 0,
        "balance never negative",
        format!(
            "lowest read under the lock: {}, final: {}",
            money(min_seen),
            money(final_balance)
        ),
    );
    report.check(
        paid == opts.balance - final_balance,
        "sum of payments == initial - final",
        format!(
            "{} {} {} - {}",
            money(paid),
            if paid == opts.balance - final_balance {
                "=="
            } else {
                "!="
            },
            money(opts.balance),
            money(final_balance)
        ),
    );
    let gap = gaps(&indices);
    report.check(
        payments.len() == attempted
            && count == attempted as i64
            && gap.is_none()
            && approved.len() as u64 == report.tally.succeeded
            && declined as u64 == report.tally.refused,
        "every payment logged exactly once",
        format!(
            "{} records{} (count {count}) for {attempted} payments",
            payments.len(),
            gap.map(|gap| format!(", {gap}")).unwrap_or_default()
        ),
    );
    report.token_check("payment tokens strictly increasing", &tokens);
    report.fence_check(&tokens);
    report.exclusion_checks();
    Ok(report)
}

/// Cents as "123.45".
fn money(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let abs = cents.unsigned_abs();
    format!("{sign}{}.{:02}", abs / 100, abs % 100)
}

/// A tiny PRNG (SplitMix64) for payment amounts and chaos stalls, so the demo needs no extra
/// dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The seed of worker `index` in phase `phase`: a function of the run's `--seed` alone.
fn task_seed(run_seed: u64, phase: u64, index: u64) -> u64 {
    SplitMix64(run_seed ^ ((phase << 32) | index).wrapping_mul(0xD6E8_FEB8_6659_FD93)).next()
}

// ---------------------------------------------------------------------------------------------
// Running a phase's tasks
// ---------------------------------------------------------------------------------------------

/// Spawns `--tasks` workers on every client (named `c<client>-t<task>`, seeded from `--seed`
/// and `phase`), waits for all of them and merges their tallies. The first worker error fails
/// the phase.
async fn run_workers<F, Fut>(
    fleet: &Fleet,
    opts: &Options,
    phase: u64,
    spawn: F,
) -> Result<Tally, BoxError>
where
    F: Fn(LockClient, String, u64) -> Fut,
    Fut: std::future::Future<Output = Result<Tally, BoxError>> + Send + 'static,
{
    let mut handles = Vec::new();
    for (c, client) in fleet.clients.iter().enumerate() {
        for t in 0..opts.tasks {
            let seed = task_seed(opts.seed, phase, handles.len() as u64);
            handles.push(tokio::spawn(spawn(
                client.clone(),
                format!("c{c}-t{t:02}"),
                seed,
            )));
        }
    }
    let mut total = Tally::default();
    let mut first_error = None;
    for handle in handles {
        match handle.await {
            Ok(Ok(tally)) => total.merge(tally),
            Ok(Err(err)) => {
                first_error.get_or_insert(err);
            }
            Err(join) => {
                first_error.get_or_insert(join.into());
            }
        }
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(total),
    }
}

// ---------------------------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------------------------

struct Check {
    ok: bool,
    what: String,
    detail: String,
}

struct PhaseReport {
    /// Names the phase in the list of failures at the end.
    phase: &'static str,
    chaos: bool,
    elapsed: Duration,
    tally: Tally,
    max_inside: usize,
    overtaken: u64,
    stalls: u64,
    lost_locks: u64,
    timeouts: u64,
    min_seen: i64,
    facts: Vec<(String, String)>,
    checks: Vec<Check>,
}

impl PhaseReport {
    fn new(
        phase: &'static str,
        elapsed: Duration,
        mut tally: Tally,
        shared: &Shared,
    ) -> PhaseReport {
        tally.waits.sort_unstable();
        tally.holds.sort_unstable();
        let referee = &shared.referee;
        let mut report = PhaseReport {
            phase,
            chaos: shared.opts.chaos,
            elapsed,
            tally,
            max_inside: referee.max_inside.load(Ordering::SeqCst),
            overtaken: referee.overtaken.load(Ordering::SeqCst),
            stalls: referee.stalls.load(Ordering::SeqCst),
            lost_locks: referee.lost_locks.load(Ordering::SeqCst),
            timeouts: referee.timeouts.load(Ordering::SeqCst),
            min_seen: referee.min_seen.load(Ordering::SeqCst),
            facts: Vec::new(),
            checks: Vec::new(),
        };
        let acquisitions = report.tally.waits.len();
        report.fact(
            "lock acquisitions",
            format!(
                "{acquisitions} in {:.2} s = {:.0}/s, {}",
                elapsed.as_secs_f64(),
                per_second(acquisitions, elapsed),
                match report.timeouts {
                    0 => "no timeouts".to_owned(),
                    n => format!("{n} timed out after {ACQUIRE_TIMEOUT:?} and retried"),
                }
            ),
        );
        report.fact("lock wait", latency_line(&report.tally.waits));
        report.fact("lock held", latency_line(&report.tally.holds));
        report
    }

    fn fact(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.facts.push((name.into(), value.into()));
    }

    fn check(&mut self, ok: bool, what: impl Into<String>, detail: impl Into<String>) {
        self.checks.push(Check {
            ok,
            what: what.into(),
            detail: detail.into(),
        });
    }

    fn tokens(&mut self, tokens: &[u64]) {
        let range = match (tokens.iter().min(), tokens.iter().max()) {
            (Some(min), Some(max)) => format!("{min}..{max} ({} logged)", tokens.len()),
            _ => "none logged".to_owned(),
        };
        self.fact("fencing tokens", range);
    }

    /// What the fence refused and, under `--chaos`, what the stalls did to the lock.
    fn fencing_facts(&mut self) {
        let stale = self.tally.stale.iter().filter(|r| r.write).count();
        let mut line = match (self.chaos, stale) {
            (false, n) => format!("{n} stale writes rejected"),
            (true, 0) => "0 stale writes rejected: the chaos did not bite (no stalled holder \
                          was overtaken; too few tasks?)"
                .to_owned(),
            (true, n) => {
                format!("{n} stale writes rejected (holders that paused past their lease), retried")
            }
        };
        let reads = self.tally.stale.len() - stale;
        if reads > 0 {
            line.push_str(&format!("; {reads} stale reads refused"));
        }
        self.fact("fencing", line);
        if self.chaos {
            self.fact(
                "stalled holders",
                format!(
                    "{} slept {}-{} ms past their {} ms lease; {} releases found the lock gone",
                    self.stalls,
                    CHAOS_STALL_MS,
                    CHAOS_STALL_MS + CHAOS_STALL_JITTER_MS,
                    CHAOS_LEASE.as_millis(),
                    self.lost_locks
                ),
            );
            self.fact(
                "overlaps",
                format!(
                    "{} lease-expired holders still running when a newer one entered (expected \
                     under chaos)",
                    self.overtaken
                ),
            );
        }
    }

    /// Tokens in ledger order must rise strictly: each record was written by a later holder
    /// than the one before it (every purchase or payment is its own acquisition).
    fn token_check(&mut self, what: &str, tokens: &[u64]) {
        let detail = match tokens.windows(2).position(|w| w[1] <= w[0]) {
            None => format!("{} records in order", tokens.len()),
            Some(i) => format!(
                "record {} has token {} after {}",
                i + 1,
                tokens[i + 1],
                tokens[i]
            ),
        };
        let ok = tokens.windows(2).all(|w| w[0] < w[1]);
        self.check(ok, what, detail);
    }

    /// The ledger holds exactly the writes the store accepted, and none it refused.
    fn fence_check(&mut self, ledger_tokens: &[u64]) {
        let stale: Vec<(u64, u64)> = self
            .tally
            .stale
            .iter()
            .map(|r| (r.presented, r.latest))
            .collect();
        let (ok, detail) = match fence_check(ledger_tokens, &self.tally.written, &stale) {
            Ok(detail) => (true, detail),
            Err(detail) => (false, detail),
        };
        self.check(ok, "every accepted write from the newest token", detail);
    }

    /// What the referee saw: never two tasks inside, never a lock lost before its release.
    /// Under `--chaos` both happen by design (the stalls), so they are facts, not checks; the
    /// ledger checks above are what must hold.
    fn exclusion_checks(&mut self) {
        if self.chaos {
            return;
        }
        let (max_inside, lost) = (self.max_inside, self.lost_locks);
        self.check(
            max_inside <= 1,
            "one holder at a time",
            format!("at most {max_inside} task(s) inside the critical section"),
        );
        self.check(
            lost == 0,
            "every release found the lock still held",
            format!("{lost} lost lock(s)"),
        );
    }

    fn print(&self) {
        for (name, value) in &self.facts {
            say!("  {name:<20} {value}");
        }
        say!("  checks");
        for check in &self.checks {
            let mark = if check.ok { "ok  " } else { "FAIL" };
            say!("    [{mark}] {:<42} {}", check.what, check.detail);
        }
    }
}

fn per_second(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// Nearest-rank percentile of sorted durations.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn latency_line(sorted: &[Duration]) -> String {
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    format!(
        "p50 {}   p99 {}   max {}",
        ms(percentile(sorted, 0.50)),
        ms(percentile(sorted, 0.99)),
        ms(sorted.last().copied().unwrap_or_default())
    )
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

fn main() -> ExitCode {
    let opts = match parse_args(std::env::args().skip(1)) {
        Ok(Some(opts)) => opts,
        Ok(None) => {
            say!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("flash_sale: {err}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let target = match Target::from_env() {
        Ok(target) => target,
        Err(err) => {
            eprintln!("flash_sale: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("flash_sale: cannot start the async runtime: {err}");
            return ExitCode::from(2);
        }
    };
    let code = runtime.block_on(run(&opts, &target));
    // The runtime (and the clients' background work) goes first, then our redis-server, so
    // nothing reconnects to a server that is being stopped.
    drop(runtime);
    drop(target);
    code
}

async fn run(opts: &Options, target: &Target) -> ExitCode {
    let url = target.url();
    let fleet = match Fleet::connect(&url, opts.clients).await {
        Ok(fleet) => fleet,
        Err(err) => {
            eprintln!("flash_sale: cannot connect to {}: {err}", redact(&url));
            return ExitCode::from(2);
        }
    };
    print_header(opts, target, &fleet).await;

    let mut reports = Vec::new();
    let mut broke_off = None;
    say!(
        "\n1. Flash sale: {} x {SKU}, lock \"sku:{SKU}\", ledger \"{}\"",
        opts.items,
        sale_ledger()
    );
    match flash_sale(&fleet, opts).await {
        Ok(report) => {
            report.print();
            reports.push(report);
        }
        Err(err) => broke_off = Some(format!("flash sale: {err}")),
    }
    if broke_off.is_none() {
        say!(
            "\n2. Balance deduction: account {ACCOUNT} starts at {}, lock \"account:{ACCOUNT}\", \
             ledger \"{}\"",
            money(opts.balance),
            account_ledger()
        );
        match balance_deduction(&fleet, opts).await {
            Ok(report) => {
                report.print();
                reports.push(report);
            }
            Err(err) => broke_off = Some(format!("balance deduction: {err}")),
        }
    }

    // Clean up whatever happened above: on a shared server nothing of ours may stay behind.
    match fleet.cleanup().await {
        Ok(keys) => say!(
            "\ncleanup: deleted {keys} keys (ledgers, fence marks and counters, operation \
             records) under {}",
            fleet.prefix
        ),
        Err(err) => eprintln!(
            "\ncleanup failed: {err}; keys under {} remain",
            fleet.prefix
        ),
    }
    verdict(&reports, broke_off)
}

async fn print_header(opts: &Options, target: &Target, fleet: &Fleet) {
    let version = fleet
        .server_version()
        .await
        .unwrap_or_else(|err| format!("unknown ({err})"));
    say!("fencelock demo: flash sale and balance deduction");
    say!("  redis      redis {version}, {}", target.describe());
    say!("  keys       {}*", fleet.prefix);
    say!(
        "  load       {} clients x {} tasks = {} concurrent workers{}",
        opts.clients,
        opts.tasks,
        opts.clients * opts.tasks,
        if opts.quick { " (--quick)" } else { "" }
    );
    if opts.chaos {
        say!(
            "  locks      lease {} ms, not renewed (--chaos), acquire timeout {} s",
            CHAOS_LEASE.as_millis(),
            ACQUIRE_TIMEOUT.as_secs()
        );
        say!(
            "  chaos      1 in {CHAOS_ONE_IN} holders (and the first writer of each phase) \
             stalls {}-{} ms between read and write",
            CHAOS_STALL_MS,
            CHAOS_STALL_MS + CHAOS_STALL_JITTER_MS
        );
    } else {
        say!(
            "  locks      lease {} s renewed by the watchdog, acquire timeout {} s",
            LEASE.as_secs(),
            ACQUIRE_TIMEOUT.as_secs()
        );
    }
    say!("  ledgers    fenced reads and writes (FencedResource), each with the holder's token");
    say!(
        "  seed       {} (--seed {} repeats every task's amounts{})",
        opts.seed,
        opts.seed,
        if opts.chaos { " and stalls" } else { "" }
    );
}

/// The overall numbers and the PASS/FAIL line.
fn verdict(reports: &[PhaseReport], broke_off: Option<String>) -> ExitCode {
    let mut waits: Vec<Duration> = reports
        .iter()
        .flat_map(|r| r.tally.waits.iter().copied())
        .collect();
    waits.sort_unstable();
    let elapsed: Duration = reports.iter().map(|r| r.elapsed).sum();
    let stale: usize = reports
        .iter()
        .flat_map(|r| &r.tally.stale)
        .filter(|r| r.write)
        .count();
    say!(
        "\noverall: {} lock acquisitions in {:.2} s = {:.0}/s; wait {}; {stale} stale writes \
         rejected",
        waits.len(),
        elapsed.as_secs_f64(),
        per_second(waits.len(), elapsed),
        latency_line(&waits)
    );

    let checks: Vec<(&str, &Check)> = reports
        .iter()
        .flat_map(|r| r.checks.iter().map(move |c| (r.phase, c)))
        .collect();
    let failed: Vec<&(&str, &Check)> = checks.iter().filter(|(_, c)| !c.ok).collect();
    if let Some(reason) = broke_off {
        say!("FAIL: the run broke off ({reason})");
        return ExitCode::FAILURE;
    }
    if failed.is_empty() {
        say!("PASS: all {} invariants held", checks.len());
        ExitCode::SUCCESS
    } else {
        say!(
            "FAIL: {} of {} invariants violated",
            failed.len(),
            checks.len()
        );
        for (phase, check) in failed {
            say!("  - {phase}: {}: {}", check.what, check.detail);
        }
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn defaults_quick_and_overrides() {
        let o = parse_args(args(&[])).unwrap().unwrap();
        assert_eq!(
            (o.items, o.clients, o.tasks, o.balance, o.chaos),
            (100, 4, 16, 10_000, false)
        );
        let o = parse_args(args(&["--items=7", "--quick", "--tasks", "3"]))
            .unwrap()
            .unwrap();
        assert_eq!((o.items, o.clients, o.tasks, o.balance), (7, 2, 3, 1_000));
        let o = parse_args(args(&["--chaos", "--quick", "--seed=42"]))
            .unwrap()
            .unwrap();
        assert_eq!((o.chaos, o.quick, o.seed, o.items), (true, true, 42, 20));
        assert!(parse_args(args(&["--help"])).unwrap().is_none());
        assert!(parse_args(args(&["--items"])).is_err());
        assert!(parse_args(args(&["--clients", "0"])).is_err());
        assert!(parse_args(args(&["--seed", "-1"])).is_err());
        assert!(parse_args(args(&["--bogus"])).is_err());
    }

    #[test]
    fn helpers() {
        assert_eq!(money(10_000), "100.00");
        assert_eq!(money(-5), "-0.05");
        assert_eq!(redact("redis://u:pw@h:1/"), "redis://***@h:1/");
        assert_eq!(redact("redis://h:1/"), "redis://h:1/");
        let d = |ms| Duration::from_millis(ms);
        let sorted: Vec<_> = (1..=100).map(d).collect();
        assert_eq!(percentile(&sorted, 0.5), d(50));
        assert_eq!(percentile(&sorted, 0.99), d(99));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
        assert_ne!(task_seed(1, 1, 0), task_seed(1, 1, 1));
        assert_ne!(task_seed(1, 1, 0), task_seed(1, 2, 0));
        assert_eq!(task_seed(9, 2, 3), task_seed(9, 2, 3));
    }

    #[test]
    fn chaos_stalls_the_first_writer_then_about_one_in_eight_and_always_past_the_lease() {
        let mut rng = SplitMix64(7);
        assert_eq!(Chaos::new(false).stall(&mut rng), None);
        let chaos = Chaos::new(true);
        let stalls: Vec<Option<Duration>> = (0..8_000).map(|_| chaos.stall(&mut rng)).collect();
        assert!(stalls[0].is_some(), "the first writer always stalls");
        let count = stalls.iter().flatten().count();
        assert!((850..1_150).contains(&count), "{count} stalls in 8000");
        for pause in stalls.iter().flatten() {
            assert!(*pause > CHAOS_LEASE);
            assert!(*pause <= Duration::from_millis(CHAOS_STALL_MS + CHAOS_STALL_JITTER_MS));
        }
    }

    #[test]
    fn ledger_checks_catch_gaps_lost_updates_and_leaked_stale_writes() {
        assert_eq!(gaps(&[0, 1, 2]), None);
        assert_eq!(gaps(&[]), None);
        assert_eq!(gaps(&[0, 2]).unwrap(), "record 1 is missing");
        assert_eq!(gaps(&[1, 2, 3]).unwrap(), "record 0 is missing");

        assert!(fence_check(&[10, 12], &[12, 10], &[(11, 12)]).is_ok());
        // A lost update: two purchases acknowledged, one record left (overwritten).
        assert!(fence_check(&[12], &[11, 12], &[]).is_err());
        // A refused write whose record is in the ledger anyway.
        assert!(fence_check(&[10, 11], &[10, 11], &[(11, 12)]).is_err());
        // A refusal that did not name a newer token.
        assert!(fence_check(&[10], &[10], &[(11, 11)]).is_err());
    }

    #[test]
    fn stale_refusals_are_recognised_through_the_box() {
        let token = |raw| FencingToken::new(raw).unwrap();
        // A stale refusal as fenced SQL storage reports one.
        let stale = fencelock::sql::FenceOutcome::Stale {
            presented: token(3),
            latest: token(5),
        }
        .into_result()
        .unwrap_err();
        let refused = *refusal(true, stale).downcast::<Refused>().unwrap();
        assert_eq!(
            (refused.write, refused.presented, refused.latest),
            (true, 3, 5)
        );
        assert!(refusal(false, fencelock::Error::Cancelled)
            .downcast::<Refused>()
            .is_err());
        assert!(parse_order("c0-t01,17").is_ok());
        assert!(parse_payment("c0-t01,17,5,declined").is_ok());
        assert!(parse_payment("c0-t01,17,5,maybe").is_err());
    }
}
