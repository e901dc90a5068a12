//! Flash sale: many buyers race for the last items of one SKU, and many payers draw on one
//! account, each purchase and each payment inside a fencelock lock. The program then checks
//! the data in Redis and prints whether every invariant held.
//!
//! # The scenario
//!
//! Several [`LockClient`]s (think: several app servers) each run many tasks (think: request
//! handlers). They share one Redis.
//!
//! 1. **Flash sale.** `demo:stock:<sku>` starts at `--items`. Every buyer loops: take lock
//!    `sku:<sku>`, read the stock, and if it is above zero write it back one lower and append
//!    `buyer,token` to `demo:orders:<sku>`; release. A buyer stops when it finds the stock at
//!    zero, so the sale ends exactly when the last item is gone.
//! 2. **Balance deduction.** `demo:balance:<account>` starts at `--balance` cents. Every payer
//!    makes `--payments` payments of a random 1..=100 cents: take lock `account:<account>`, read
//!    the balance, deduct and append `payer,token,amount,approved` to `demo:payments:<account>`
//!    when the money is there, or append `...,declined` when it is not; release.
//!
//! Both critical sections are a deliberately *non-atomic* read-modify-write (GET, then SET of
//! the value read minus something). Only the lock keeps two buyers from reading the same stock
//! and selling the same item twice; an atomic `DECR` would hide a broken lock.
//!
//! The checks: everything sold and nothing oversold, no value ever read below zero, every
//! unit taken is accounted for by exactly one log entry, the fencing tokens in each log rise
//! strictly in log order (what a fenced store would enforce), at most one task inside a
//! critical section at a time, and no release that found its lock already gone. (The tokens
//! look like timestamps because fencelock issues `max(last token + 1, server time in µs)`, so
//! they keep rising even if Redis loses its counter.)
//!
//! # Running it
//!
//! ```text
//! scripts/demo                                   # installs redis-server if needed, then runs this
//! cargo run --release --example flash_sale
//! cargo run --release --example flash_sale -- --quick
//! cargo run --release --example flash_sale -- --items 500 --clients 8 --tasks 32
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --release --example flash_sale
//! ```
//!
//! Without `REDIS_URL` the demo starts its own throwaway `redis-server` on a free loopback
//! port (never 6379) and stops it at the end. With `REDIS_URL` it uses that server, puts every
//! key (locks and data) under a fresh prefix `fencelock-demo-<uuid>:` so it cannot touch
//! anything else there, and deletes its keys when it is done.
//!
//! Exit status: 0 when every invariant held, 1 when one was violated or the run broke off,
//! 2 for a usage error or when no Redis could be had.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::testing::RedisServer;
use fencelock::{FencingToken, Lock, LockClient, LockGuard};
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

const USAGE: &str = "\
usage: flash_sale [--items N] [--clients C] [--tasks T] [--balance CENTS] [--payments P] [--quick]

  --items N        items of the SKU in stock                  (default 100, quick 20)
  --clients C      LockClients, each with its own connections (default 4,   quick 2)
  --tasks T        concurrent buyers/payers per client        (default 16,  quick 4)
  --balance CENTS  starting balance of the account            (default 10000, quick 1000)
  --payments P     payments each payer task makes             (default 8,   quick 4)
  --quick          small numbers for a CI smoke run; explicit flags still win

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
            "--items" => flags.items = Some(number(&flag, value())?),
            "--clients" => flags.clients = Some(number(&flag, value())?),
            "--tasks" => flags.tasks = Some(number(&flag, value())?),
            "--balance" => flags.balance = Some(number(&flag, value())?),
            "--payments" => flags.payments = Some(number(&flag, value())?),
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
// The fleet: one lock client plus one data connection per simulated app server
// ---------------------------------------------------------------------------------------------

#[derive(Clone)]
struct Member {
    locks: LockClient,
    /// Each member has its own data connection, as separate processes would.
    data: MultiplexedConnection,
}

struct Fleet {
    prefix: String,
    members: Vec<Member>,
    /// For seeding, verifying and cleaning up, outside any lock.
    admin: MultiplexedConnection,
}

impl Fleet {
    async fn connect(url: &str, clients: usize) -> Result<Fleet, BoxError> {
        // A fresh prefix per run: the demo cannot collide with other data on a shared server,
        // nor with an earlier run's leftovers.
        let prefix = format!("fencelock-demo-{}:", uuid::Uuid::new_v4().simple());
        let redis = redis::Client::open(url)?;
        let admin = redis.get_multiplexed_async_connection().await?;
        let mut members = Vec::with_capacity(clients);
        for _ in 0..clients {
            let locks = LockClient::builder(url)
                .prefix(&prefix)
                .default_lease(LEASE)
                .connect()
                .await?;
            let data = redis.get_multiplexed_async_connection().await?;
            members.push(Member { locks, data });
        }
        Ok(Fleet {
            prefix,
            members,
            admin,
        })
    }

    /// A data key of this run, under the same prefix as the locks.
    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
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

    /// Deletes every key of this run: the demo's data keys and what fencelock left behind
    /// (fence counters, operation records). The prefix is unique to this run, so everything
    /// under it is ours. Returns how many of each were deleted.
    async fn cleanup(&self) -> Result<(usize, usize), BoxError> {
        let mut conn = self.admin.clone();
        let pattern = format!("{}*", self.prefix);
        let data_prefix = self.key("demo:");
        let mut cursor: u64 = 0;
        let (mut data, mut removed) = (0, 0);
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
                data += keys
                    .iter()
                    .filter(|k| k.starts_with(data_prefix.as_bytes()))
                    .count();
                removed += conn.del::<_, usize>(&keys).await?;
            }
            if next == 0 {
                return Ok((data, removed.saturating_sub(data)));
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
    /// Releases that found the lock no longer ours: the critical section may have overlapped.
    lost_locks: AtomicU64,
    timeouts: AtomicU64,
    /// The lowest stock or balance any task read inside the lock.
    min_seen: AtomicI64,
}

impl Referee {
    fn new() -> Arc<Referee> {
        Arc::new(Referee {
            inside: AtomicUsize::new(0),
            max_inside: AtomicUsize::new(0),
            lost_locks: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            min_seen: AtomicI64::new(i64::MAX),
        })
    }

    /// Marks a task as inside the critical section until the returned value is dropped. All
    /// clients live in this process, so a plain counter sees any overlap between them.
    fn enter(&self) -> Inside<'_> {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inside.fetch_max(now, Ordering::SeqCst);
        Inside(self)
    }

    fn saw(&self, value: i64) {
        self.min_seen.fetch_min(value, Ordering::SeqCst);
    }
}

struct Inside<'a>(&'a Referee);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One task's own numbers, merged after the phase.
#[derive(Default)]
struct Tally {
    /// From calling `acquire_timeout` to holding the guard.
    waits: Vec<Duration>,
    /// From holding the guard to starting the release.
    holds: Vec<Duration>,
    succeeded: u64,
    refused: u64,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.waits.extend(other.waits);
        self.holds.extend(other.holds);
        self.succeeded += other.succeeded;
        self.refused += other.refused;
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

/// Runs `body` under `lock` with the referee watching, and keeps the numbers.
async fn locked<T, F, Fut>(
    lock: &Lock,
    referee: &Referee,
    tally: &mut Tally,
    body: F,
) -> Result<T, BoxError>
where
    F: FnOnce(FencingToken) -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    let guard = acquire(lock, referee, tally).await?;
    let held = Instant::now();
    let outcome = {
        let _inside = referee.enter();
        body(guard.token()).await
    };
    tally.holds.push(held.elapsed());
    // On a Redis error the guard is released here too (by `release` or, after `?`, by drop).
    release(guard, referee).await?;
    Ok(outcome?)
}

// ---------------------------------------------------------------------------------------------
// Phase 1: the flash sale
// ---------------------------------------------------------------------------------------------

struct SaleKeys {
    stock: String,
    orders: String,
}

/// One buyer: buys one item at a time until it finds the stock at zero.
async fn buyer(
    member: Member,
    keys: Arc<SaleKeys>,
    referee: Arc<Referee>,
    name: String,
) -> Result<Tally, BoxError> {
    let lock = member.locks.lock(format!("sku:{SKU}"))?;
    let mut tally = Tally::default();
    loop {
        let mut data = member.data.clone();
        let (keys, referee_ref, name) = (&keys, &*referee, &name);
        let bought = locked(&lock, &referee, &mut tally, |token| async move {
            buy_one(&mut data, keys, referee_ref, name, token).await
        })
        .await?;
        if !bought {
            tally.refused += 1;
            return Ok(tally);
        }
        tally.succeeded += 1;
    }
}

/// The critical section of a purchase. GET then SET (not DECR), so a second holder would
/// show up as an oversold or double-sold item.
async fn buy_one(
    data: &mut MultiplexedConnection,
    keys: &SaleKeys,
    referee: &Referee,
    buyer: &str,
    token: FencingToken,
) -> redis::RedisResult<bool> {
    let stock: i64 = data.get(&keys.stock).await?;
    referee.saw(stock);
    if stock <= 0 {
        return Ok(false);
    }
    // MULTI/EXEC: the stock change and its order record land together or not at all.
    redis::pipe()
        .atomic()
        .set(&keys.stock, stock - 1)
        .ignore()
        .rpush(&keys.orders, format!("{buyer},{token}"))
        .ignore()
        .query_async::<()>(data)
        .await?;
    Ok(true)
}

async fn flash_sale(fleet: &Fleet, opts: &Options) -> Result<PhaseReport, BoxError> {
    let keys = Arc::new(SaleKeys {
        stock: fleet.key(&format!("demo:stock:{SKU}")),
        orders: fleet.key(&format!("demo:orders:{SKU}")),
    });
    let mut admin = fleet.admin.clone();
    admin.set::<_, _, ()>(&keys.stock, opts.items).await?;

    let referee = Referee::new();
    let started = Instant::now();
    let tally = run_workers(fleet, opts.tasks, |member, name, _seed| {
        buyer(member, keys.clone(), referee.clone(), name)
    })
    .await?;
    let elapsed = started.elapsed();

    let final_stock: i64 = admin.get(&keys.stock).await?;
    let log: Vec<String> = admin.lrange(&keys.orders, 0, -1).await?;
    let orders = log
        .iter()
        .map(|entry| parse_order(entry))
        .collect::<Result<Vec<_>, _>>()?;
    let tokens: Vec<u64> = orders.iter().map(|(_, token)| *token).collect();

    let mut report = PhaseReport::new("flash sale", elapsed, tally, &referee);
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
        .collect::<std::collections::HashSet<_>>()
        .len();
    report.fact(
        "buyers served",
        format!(
            "{buyers_served} of {} got at least one item",
            opts.clients * opts.tasks
        ),
    );
    report.tokens(&tokens);

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
    report.check(
        sold == n - final_stock && report.tally.succeeded as i64 == sold,
        "orders == items taken from stock",
        format!(
            "{sold} orders, {} taken, {} purchases reported by buyers",
            n - final_stock,
            report.tally.succeeded
        ),
    );
    report.token_check("order tokens strictly increasing", &tokens);
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

struct AccountKeys {
    balance: String,
    payments: String,
}

/// One payer: `count` payments of random amounts, each approved or declined under the lock.
async fn payer(
    member: Member,
    keys: Arc<AccountKeys>,
    referee: Arc<Referee>,
    name: String,
    count: usize,
    seed: u64,
) -> Result<Tally, BoxError> {
    let lock = member.locks.lock(format!("account:{ACCOUNT}"))?;
    let mut rng = SplitMix64(seed);
    let mut tally = Tally::default();
    for _ in 0..count {
        let amount = 1 + (rng.next() % MAX_PAYMENT_CENTS) as i64;
        let mut data = member.data.clone();
        let (keys, referee_ref, name) = (&keys, &*referee, &name);
        let approved = locked(&lock, &referee, &mut tally, |token| async move {
            pay_one(&mut data, keys, referee_ref, name, token, amount).await
        })
        .await?;
        if approved {
            tally.succeeded += 1;
        } else {
            tally.refused += 1;
        }
    }
    Ok(tally)
}

/// The critical section of a payment: approve and deduct only when the balance covers it.
async fn pay_one(
    data: &mut MultiplexedConnection,
    keys: &AccountKeys,
    referee: &Referee,
    payer: &str,
    token: FencingToken,
    amount: i64,
) -> redis::RedisResult<bool> {
    let balance: i64 = data.get(&keys.balance).await?;
    referee.saw(balance);
    if balance < amount {
        let record = format!("{payer},{token},{amount},declined");
        data.rpush::<_, _, ()>(&keys.payments, record).await?;
        return Ok(false);
    }
    let record = format!("{payer},{token},{amount},approved");
    redis::pipe()
        .atomic()
        .set(&keys.balance, balance - amount)
        .ignore()
        .rpush(&keys.payments, record)
        .ignore()
        .query_async::<()>(data)
        .await?;
    Ok(true)
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
    let keys = Arc::new(AccountKeys {
        balance: fleet.key(&format!("demo:balance:{ACCOUNT}")),
        payments: fleet.key(&format!("demo:payments:{ACCOUNT}")),
    });
    let mut admin = fleet.admin.clone();
    admin.set::<_, _, ()>(&keys.balance, opts.balance).await?;

    let referee = Referee::new();
    let started = Instant::now();
    let tally = run_workers(fleet, opts.tasks, |member, name, seed| {
        payer(
            member,
            keys.clone(),
            referee.clone(),
            name,
            opts.payments,
            seed,
        )
    })
    .await?;
    let elapsed = started.elapsed();

    let final_balance: i64 = admin.get(&keys.balance).await?;
    let log: Vec<String> = admin.lrange(&keys.payments, 0, -1).await?;
    let payments = log
        .iter()
        .map(|entry| parse_payment(entry))
        .collect::<Result<Vec<_>, _>>()?;
    let tokens: Vec<u64> = payments.iter().map(|p| p.token).collect();
    let approved: Vec<&Payment> = payments.iter().filter(|p| p.approved).collect();
    let paid: i64 = approved.iter().map(|p| p.amount).sum();
    let declined = payments.len() - approved.len();
    let attempted = opts.clients * opts.tasks * opts.payments;

    let mut report = PhaseReport::new("balance deduction", elapsed, tally, &referee);
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
    report.check(
        payments.len() == attempted
            && approved.len() as u64 == report.tally.succeeded
            && declined as u64 == report.tally.refused,
        "every payment logged exactly once",
        format!("{} log entries for {attempted} payments", payments.len()),
    );
    report.token_check("payment tokens strictly increasing", &tokens);
    report.exclusion_checks();
    Ok(report)
}

/// Cents as "123.45".
fn money(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let abs = cents.unsigned_abs();
    format!("{sign}{}.{:02}", abs / 100, abs % 100)
}

/// A tiny PRNG (SplitMix64) for payment amounts, so the demo needs no extra dependency.
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

// ---------------------------------------------------------------------------------------------
// Running a phase's tasks
// ---------------------------------------------------------------------------------------------

/// Spawns `tasks` workers on every member (named `c<client>-t<task>`), waits for all of them
/// and merges their tallies. The first worker error fails the phase.
async fn run_workers<F, Fut>(fleet: &Fleet, tasks: usize, spawn: F) -> Result<Tally, BoxError>
where
    F: Fn(Member, String, u64) -> Fut,
    Fut: std::future::Future<Output = Result<Tally, BoxError>> + Send + 'static,
{
    let mut handles = Vec::new();
    for (c, member) in fleet.members.iter().enumerate() {
        for t in 0..tasks {
            let seed = uuid::Uuid::new_v4().as_u64_pair().0;
            handles.push(tokio::spawn(spawn(
                member.clone(),
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
    elapsed: Duration,
    tally: Tally,
    max_inside: usize,
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
        referee: &Referee,
    ) -> PhaseReport {
        tally.waits.sort_unstable();
        tally.holds.sort_unstable();
        let mut report = PhaseReport {
            phase,
            elapsed,
            tally,
            max_inside: referee.max_inside.load(Ordering::SeqCst),
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

    /// Tokens in log order must rise strictly: each entry was written by a later holder than
    /// the one before it, and a fenced store would reject anything else.
    fn token_check(&mut self, what: &str, tokens: &[u64]) {
        let detail = match tokens.windows(2).position(|w| w[1] <= w[0]) {
            None => format!("{} entries in order", tokens.len()),
            Some(i) => format!(
                "entry {} has token {} after {}",
                i + 1,
                tokens[i + 1],
                tokens[i]
            ),
        };
        let ok = tokens.windows(2).all(|w| w[0] < w[1]);
        self.check(ok, what, detail);
    }

    /// What the referee saw: never two tasks inside, never a lock lost before its release.
    fn exclusion_checks(&mut self) {
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
        "\n1. Flash sale: {} x {SKU}, lock \"sku:{SKU}\"",
        opts.items
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
            "\n2. Balance deduction: account {ACCOUNT} starts at {}, lock \"account:{ACCOUNT}\"",
            money(opts.balance)
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
        Ok((data, library)) => say!(
            "\ncleanup: deleted {data} data keys + {library} fencelock keys under {}",
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
    say!(
        "  locks      lease {} s, acquire timeout {} s",
        LEASE.as_secs(),
        ACQUIRE_TIMEOUT.as_secs()
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
    say!(
        "\noverall: {} lock acquisitions in {:.2} s = {:.0}/s; wait {}",
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
            (o.items, o.clients, o.tasks, o.balance),
            (100, 4, 16, 10_000)
        );
        let o = parse_args(args(&["--items=7", "--quick", "--tasks", "3"]))
            .unwrap()
            .unwrap();
        assert_eq!((o.items, o.clients, o.tasks, o.balance), (7, 2, 3, 1_000));
        assert!(parse_args(args(&["--help"])).unwrap().is_none());
        assert!(parse_args(args(&["--items"])).is_err());
        assert!(parse_args(args(&["--clients", "0"])).is_err());
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
    }
}
