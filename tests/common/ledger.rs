//! A fenced ledger: the storage side of a lock, seen the way an application sees it.
//!
//! A ledger is an account with a balance and the list of entries that made it. Every change is
//! a read-modify-write done by a lock holder with its fencing token:
//!
//! 1. [`Ledger::begin`]: a fenced write that raises the ledger's fence to the token (refused if a
//!    newer token got there first), then a read of the state ([`Snapshot`]). After it, no write
//!    with an older token can land, so the snapshot cannot be changed behind the holder's back
//!    by a holder that lost the lock.
//! 2. [`Ledger::commit`]: one fenced, atomic write of the next entry plus the new balance,
//!    computed from the snapshot.
//!
//! Both steps carry the token and are refused with [`LedgerError::Stale`] when the storage has
//! already accepted a newer token. Claiming before reading matters: fencing only refuses writes
//! that arrive *after* a newer token wrote, so a holder that read first could miss a late write
//! of its predecessor that lands between its read and its write.
//!
//! Because the entry and the balance are one write, "the ledger equals a serial execution of the
//! accepted writes" is checkable: [`check`] replays the entries in storage order and compares
//! every running balance and the stored balance, and compares the entries with what each writer
//! was told ([`Journal`]). A stale write that got through would overwrite an entry (its
//! snapshot is old), lose another writer's accepted entry, or break the replay.
//!
//! Backends: [`Backend::Redis`] stores a ledger as one [`fencelock::FencedResource`] hash
//! (fields `len`, `balance`, `e:<n>`). A backend implements [`Ledger`] and
//! [`LedgerStore`], gets a [`Backend`] variant that starts a throwaway server, and a scheme in
//! [`connect`] so that child processes can open it from a URL.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fencelock::testing::RedisServer;
use fencelock::{Error, FencedResource, FencingToken, LockClient};

/// A boxed future, so that [`Ledger`] and [`LedgerStore`] can be used as trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One accepted write, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The token the write carried.
    pub token: u64,
    /// The writer's id for the write, unique per ledger.
    pub id: u64,
    /// The change to the balance.
    pub amount: i64,
    /// The balance after this entry, as the writer computed it from its snapshot.
    pub balance_after: i64,
}

/// The state a holder read after claiming the ledger: what its next entry builds on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// Entries so far; the next one is number `len + 1`.
    pub len: u64,
    /// The balance.
    pub balance: i64,
}

impl Snapshot {
    /// The state after appending `amount`.
    pub fn after(self, amount: i64) -> Snapshot {
        Snapshot {
            len: self.len + 1,
            balance: self.balance + amount,
        }
    }
}

/// Why a ledger operation did not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerError {
    /// Refused: the ledger has accepted the newer token `latest`. Nothing was written.
    Stale { presented: u64, latest: u64 },
    /// Anything else (connection, protocol); the write may or may not have been applied.
    Failed(String),
}

impl LedgerError {
    pub fn is_stale(&self) -> bool {
        matches!(self, LedgerError::Stale { .. })
    }
}

impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LedgerError::Stale { presented, latest } => {
                write!(f, "stale token {presented} (ledger has accepted {latest})")
            }
            LedgerError::Failed(why) => write!(f, "ledger operation failed: {why}"),
        }
    }
}

impl From<Error> for LedgerError {
    fn from(err: Error) -> Self {
        match err {
            Error::StaleToken { presented, latest } => LedgerError::Stale {
                presented: presented.get(),
                latest: latest.get(),
            },
            other => LedgerError::Failed(other.to_string()),
        }
    }
}

/// One fenced ledger in some storage.
pub trait Ledger: Send + Sync {
    /// Raises the ledger's fence to `token` (a fenced write), then reads its state.
    fn begin(&self, token: FencingToken) -> BoxFuture<'_, Result<Snapshot, LedgerError>>;

    /// Appends entry `id` of `amount` on top of `at` and stores the new balance, in one fenced
    /// write; returns the state after it.
    fn commit(
        &self,
        token: FencingToken,
        at: Snapshot,
        id: u64,
        amount: i64,
    ) -> BoxFuture<'_, Result<Snapshot, LedgerError>>;

    /// Reads the state without claiming: what a careless holder (or a checker) sees.
    fn peek(&self) -> BoxFuture<'_, Result<Snapshot, LedgerError>>;

    /// Every accepted entry, in storage order.
    fn entries(&self) -> BoxFuture<'_, Result<Vec<Entry>, LedgerError>>;

    /// The stored balance.
    fn balance(&self) -> BoxFuture<'_, Result<i64, LedgerError>> {
        Box::pin(async move { Ok(self.peek().await?.balance) })
    }

    /// A whole fenced write: [`begin`](Self::begin), then [`commit`](Self::commit).
    fn apply(
        &self,
        token: FencingToken,
        id: u64,
        amount: i64,
    ) -> BoxFuture<'_, Result<Snapshot, LedgerError>> {
        Box::pin(async move {
            let at = self.begin(token).await?;
            self.commit(token, at, id, amount).await
        })
    }
}

/// A connection to one storage that holds many ledgers.
pub trait LedgerStore: Send + Sync {
    /// The ledger called `name`, created empty on first use. Use a fresh name per test run:
    /// a ledger's fence never goes back.
    fn open<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Box<dyn Ledger>, LedgerError>>;
}

/// Opens the storage at `url`: `redis://...` for now.
pub async fn connect(url: &str) -> Result<Box<dyn LedgerStore>, LedgerError> {
    if url.starts_with("redis://") {
        return Ok(Box::new(RedisLedgerStore::connect(url).await?));
    }
    Err(LedgerError::Failed(format!("no ledger backend for {url}")))
}

/// The storages the suite knows how to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A separate `redis-server`, written through [`fencelock::FencedResource`].
    Redis,
}

/// Names the backends the stories run against: `FENCELOCK_STORY_STORAGE=redis,...`.
pub const STORAGE_ENV: &str = "FENCELOCK_STORY_STORAGE";

impl Backend {
    pub const ALL: &'static [Backend] = &[Backend::Redis];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
        }
    }

    /// The backends named by [`STORAGE_ENV`] (default: redis; `all` for every one).
    pub fn selected() -> Vec<Backend> {
        let Ok(list) = std::env::var(STORAGE_ENV) else {
            return vec![Backend::Redis];
        };
        if list.trim() == "all" {
            return Backend::ALL.to_vec();
        }
        list.split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(|name| {
                Backend::ALL
                    .iter()
                    .copied()
                    .find(|b| b.name() == name)
                    .unwrap_or_else(|| {
                        let known: Vec<_> = Backend::ALL.iter().map(|b| b.name()).collect();
                        panic!("{STORAGE_ENV}: unknown backend {name:?}; known: {known:?}")
                    })
            })
            .collect()
    }

    /// Starts a throwaway storage server of this kind; `durable` asks for acknowledged writes
    /// to survive a crash of the storage itself.
    pub fn start(self, durable: bool) -> Storage {
        match self {
            Backend::Redis => {
                let server = RedisServer::builder()
                    .persistence(durable)
                    .start()
                    .expect("start the storage redis-server");
                Storage {
                    backend: self,
                    url: server.url(),
                    addr: Some(server.addr()),
                    _server: Box::new(server),
                }
            }
        }
    }
}

/// A running storage server; stopped when dropped.
pub struct Storage {
    backend: Backend,
    url: String,
    addr: Option<SocketAddr>,
    _server: Box<dyn std::any::Any + Send + Sync>,
}

impl Storage {
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL [`connect`] opens it with; children get this one.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where it listens, for a [`fencelock::testing::FaultProxy`] in front of it (`None` for a
    /// storage without a network, which a story that needs one skips).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// The URL that reaches it through a proxy listening on `proxy`.
    pub fn url_via(&self, proxy: SocketAddr) -> Option<String> {
        let addr = self.addr?;
        Some(self.url.replace(&addr.to_string(), &proxy.to_string()))
    }

    pub async fn connect(&self) -> Box<dyn LedgerStore> {
        connect(&self.url).await.expect("connect to the storage")
    }
}

/// Ledgers in Redis, each one [`FencedResource`] hash written with `set_fields`.
pub struct RedisLedgerStore {
    client: LockClient,
}

impl RedisLedgerStore {
    pub async fn connect(url: &str) -> Result<RedisLedgerStore, LedgerError> {
        // Generous: a story may hold a write in a delaying proxy for a while, and a timed-out
        // write would only be re-sent with the same operation id anyway.
        let client = LockClient::builder(url)
            .response_timeout(Duration::from_secs(5))
            .connect()
            .await?;
        Ok(RedisLedgerStore { client })
    }
}

impl LedgerStore for RedisLedgerStore {
    fn open<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Box<dyn Ledger>, LedgerError>> {
        Box::pin(async move {
            let resource = self.client.resource(format!("ledger:{name}"))?;
            Ok(Box::new(RedisLedger { resource }) as Box<dyn Ledger>)
        })
    }
}

/// Hash fields: `len`, `balance`, and `e:<n>` = `token:id:amount:balance_after` for entries
/// 1..=len. [`Ledger::begin`] claims with `FencedResource::claim` and reads with fenced reads.
pub struct RedisLedger {
    resource: FencedResource,
}

impl RedisLedger {
    /// Reads a field, as the holder of `token` (a fenced read, which claims) or without one.
    async fn field<T: std::str::FromStr>(
        &self,
        token: Option<FencingToken>,
        field: &str,
    ) -> Result<Option<T>, LedgerError> {
        let raw = match token {
            Some(token) => self.resource.get_field(token, field).await?,
            None => self.resource.peek_field(field).await?,
        };
        let Some(raw) = raw else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&raw);
        text.parse()
            .map(Some)
            .map_err(|_| LedgerError::Failed(format!("field {field} holds {text:?}")))
    }

    async fn read(&self, token: Option<FencingToken>) -> Result<Snapshot, LedgerError> {
        Ok(Snapshot {
            len: self.field(token, "len").await?.unwrap_or(0),
            balance: self.field(token, "balance").await?.unwrap_or(0),
        })
    }
}

impl Ledger for RedisLedger {
    fn begin(&self, token: FencingToken) -> BoxFuture<'_, Result<Snapshot, LedgerError>> {
        Box::pin(async move {
            self.resource.claim(token).await?;
            self.read(Some(token)).await
        })
    }

    fn commit(
        &self,
        token: FencingToken,
        at: Snapshot,
        id: u64,
        amount: i64,
    ) -> BoxFuture<'_, Result<Snapshot, LedgerError>> {
        Box::pin(async move {
            let next = at.after(amount);
            let field = format!("e:{}", next.len);
            let entry = format!("{}:{id}:{amount}:{}", token.get(), next.balance);
            let (len, balance) = (next.len.to_string(), next.balance.to_string());
            self.resource
                .set_fields(
                    token,
                    &[
                        (field.as_bytes(), entry.as_bytes()),
                        (b"len", len.as_bytes()),
                        (b"balance", balance.as_bytes()),
                    ],
                )
                .await?;
            Ok(next)
        })
    }

    fn peek(&self) -> BoxFuture<'_, Result<Snapshot, LedgerError>> {
        Box::pin(self.read(None))
    }

    fn entries(&self) -> BoxFuture<'_, Result<Vec<Entry>, LedgerError>> {
        Box::pin(async move {
            let len: u64 = self.field(None, "len").await?.unwrap_or(0);
            let mut entries = Vec::new();
            for n in 1..=len {
                let raw = self
                    .resource
                    .peek_field(format!("e:{n}"))
                    .await?
                    .ok_or_else(|| LedgerError::Failed(format!("entry {n} of {len} missing")))?;
                entries.push(parse_entry(&String::from_utf8_lossy(&raw))?);
            }
            Ok(entries)
        })
    }
}

fn parse_entry(text: &str) -> Result<Entry, LedgerError> {
    let bad = || LedgerError::Failed(format!("malformed entry {text:?}"));
    let mut parts = text.split(':');
    let mut next = || parts.next().ok_or_else(bad);
    let entry = Entry {
        token: next()?.parse().map_err(|_| bad())?,
        id: next()?.parse().map_err(|_| bad())?,
        amount: next()?.parse().map_err(|_| bad())?,
        balance_after: next()?.parse().map_err(|_| bad())?,
    };
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(entry)
}

/// What a writer tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// [`Ledger::begin`]'s fence-raising write.
    Claim,
    /// [`Ledger::commit`] of entry `id`.
    Entry { id: u64, amount: i64 },
}

/// What the writer was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    Stale {
        latest: u64,
    },
    /// No answer (error, crash): it may or may not have been applied.
    Unknown,
}

/// One write attempt as its writer saw it. `issued` and `done` are this process' clock when the
/// request was sent and its answer known; `None` when another process made it.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub who: String,
    pub token: u64,
    pub write: Write,
    pub outcome: Outcome,
    pub issued: Option<Instant>,
    pub done: Option<Instant>,
}

/// Every write attempt against one ledger, recorded as it happens. Shared by the writers.
#[derive(Debug)]
pub struct Journal {
    attempts: Mutex<Vec<Attempt>>,
    next_id: AtomicU64,
}

impl Journal {
    /// A journal whose entry ids start at `first_id` (other processes use other ranges).
    pub fn new(first_id: u64) -> Journal {
        Journal {
            attempts: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(first_id),
        }
    }

    pub fn record(&self, attempt: Attempt) {
        self.attempts.lock().unwrap().push(attempt);
    }

    pub fn attempts(&self) -> Vec<Attempt> {
        self.attempts.lock().unwrap().clone()
    }

    /// [`Ledger::begin`], recorded.
    pub async fn begin(
        &self,
        ledger: &dyn Ledger,
        who: &str,
        token: FencingToken,
    ) -> Result<Snapshot, LedgerError> {
        let issued = Instant::now();
        let result = ledger.begin(token).await;
        self.finish(who, token, Write::Claim, issued, &result);
        result
    }

    /// [`Ledger::commit`] of a new entry, recorded.
    pub async fn commit(
        &self,
        ledger: &dyn Ledger,
        who: &str,
        token: FencingToken,
        at: Snapshot,
        amount: i64,
    ) -> Result<Snapshot, LedgerError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let issued = Instant::now();
        let result = ledger.commit(token, at, id, amount).await;
        self.finish(who, token, Write::Entry { id, amount }, issued, &result);
        result
    }

    fn finish<T>(
        &self,
        who: &str,
        token: FencingToken,
        write: Write,
        issued: Instant,
        result: &Result<T, LedgerError>,
    ) {
        let outcome = match result {
            Ok(_) => Outcome::Accepted,
            Err(LedgerError::Stale { latest, .. }) => Outcome::Stale { latest: *latest },
            Err(LedgerError::Failed(_)) => Outcome::Unknown,
        };
        self.record(Attempt {
            who: who.to_owned(),
            token: token.get(),
            write,
            outcome,
            issued: Some(issued),
            done: Some(Instant::now()),
        });
    }
}

/// What [`check`] found, for the story to assert on and report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    pub entries: usize,
    pub accepted: usize,
    pub rejected: usize,
    pub unknown: usize,
    /// Attempts issued after a newer token's write was acknowledged (so they had to be refused).
    pub stale_after_newer: usize,
}

/// Checks a ledger against the attempts made on it:
///
/// 1. tokens never decrease in storage order (no accepted write older than an earlier one);
/// 2. replaying the entries serially gives every stored running balance and the stored
///    balance, and entry ids are unique;
/// 3. every entry is an attempt, with its token and amount: accepted attempts are there exactly
///    once, refused ones are not, unknown ones at most once;
/// 4. a refusal names a newer token (`latest > presented`) that some write carried;
/// 5. zero stale writes accepted: an attempt issued after a write with a newer token was
///    acknowledged (same-process clock) was refused, and is not in the ledger.
pub fn check(attempts: &[Attempt], entries: &[Entry], balance: i64) -> Result<Summary, String> {
    let mut summary = Summary {
        entries: entries.len(),
        ..Summary::default()
    };

    for (n, pair) in entries.windows(2).enumerate() {
        if pair[1].token < pair[0].token {
            return Err(format!(
                "token went back in storage order: entry {} has {} after entry {} with {}: {entries:?}",
                n + 2,
                pair[1].token,
                n + 1,
                pair[0].token
            ));
        }
    }

    let mut running = 0i64;
    let mut stored: BTreeMap<u64, &Entry> = BTreeMap::new();
    for (n, entry) in entries.iter().enumerate() {
        running += entry.amount;
        if entry.balance_after != running {
            return Err(format!(
                "entry {} ({entry:?}) stores balance {} but the serial replay gives {running}: \
                 {entries:?}",
                n + 1,
                entry.balance_after
            ));
        }
        if stored.insert(entry.id, entry).is_some() {
            return Err(format!("entry id {} stored twice: {entries:?}", entry.id));
        }
    }
    if running != balance {
        return Err(format!(
            "stored balance {balance} but the serial replay of {} entries gives {running}",
            entries.len()
        ));
    }

    let mut attempted: BTreeSet<u64> = BTreeSet::new();
    for attempt in attempts {
        match attempt.outcome {
            Outcome::Accepted => summary.accepted += 1,
            Outcome::Stale { .. } => summary.rejected += 1,
            Outcome::Unknown => summary.unknown += 1,
        }
        if let Outcome::Stale { latest } = attempt.outcome {
            if latest <= attempt.token {
                return Err(format!(
                    "{attempt:?} was refused as stale, but the ledger's token {latest} is not newer"
                ));
            }
            let carried = attempts.iter().any(|other| {
                other.token == latest && !matches!(other.outcome, Outcome::Stale { .. })
            });
            if !carried {
                return Err(format!(
                    "{attempt:?} was refused by token {latest}, which no accepted write carried"
                ));
            }
        }
        let Write::Entry { id, amount } = attempt.write else {
            continue;
        };
        attempted.insert(id);
        let found = stored.get(&id);
        match (attempt.outcome, found) {
            (Outcome::Accepted, None) => {
                return Err(format!(
                    "{attempt:?} was acknowledged but is not in the ledger (lost update): \
                     {entries:?}"
                ))
            }
            (Outcome::Stale { .. }, Some(entry)) => {
                return Err(format!(
                    "STALE WRITE ACCEPTED: {attempt:?} was refused yet stored as {entry:?}"
                ))
            }
            (_, Some(entry)) if entry.token != attempt.token || entry.amount != amount => {
                return Err(format!("{attempt:?} stored as {entry:?}"))
            }
            _ => {}
        }
    }
    if let Some(entry) = entries.iter().find(|e| !attempted.contains(&e.id)) {
        return Err(format!("{entry:?} is in the ledger but nobody wrote it"));
    }

    let mut must_fail = BTreeSet::new();
    for newer in attempts {
        let (Outcome::Accepted, Some(acked)) = (newer.outcome, newer.done) else {
            continue;
        };
        for (index, older) in attempts.iter().enumerate() {
            let after = older.issued.is_some_and(|issued| issued > acked);
            if !after || older.token >= newer.token {
                continue;
            }
            must_fail.insert(index);
            let stored_entry = match older.write {
                Write::Entry { id, .. } => stored.get(&id).copied(),
                Write::Claim => None,
            };
            if older.outcome == Outcome::Accepted || stored_entry.is_some() {
                return Err(format!(
                    "STALE WRITE ACCEPTED: {older:?} was issued after {newer:?} had been \
                     acknowledged, and was accepted (stored: {stored_entry:?})"
                ));
            }
        }
    }
    summary.stale_after_newer = must_fail.len();
    Ok(summary)
}

/// [`check`] on the ledger as it is now.
pub async fn check_ledger(ledger: &dyn Ledger, journal: &Journal) -> Result<Summary, String> {
    let entries = ledger.entries().await.map_err(|e| e.to_string())?;
    let balance = ledger.balance().await.map_err(|e| e.to_string())?;
    check(&journal.attempts(), &entries, balance)
}
