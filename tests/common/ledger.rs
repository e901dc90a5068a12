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
//! (fields `len`, `balance`, `e:<n>`). [`Backend::Sqlite`] and [`Backend::Postgres`] store it
//! as a row of `story_ledgers` (with the `fence` column of `fencelock::sql`) plus its rows in
//! `story_entries`, written with the statements `src/sql.rs` documents: a claiming
//! `UPDATE ... RETURNING`, and a transaction whose fenced update of the ledger row comes first.
//! The two SQL backends share that logic ([`SqlLedger`]) and differ only in the driver
//! ([`SqlConn`]). A backend implements [`Ledger`] and [`LedgerStore`], gets a [`Backend`]
//! variant that starts a throwaway server, and a scheme in [`connect`] so that child processes
//! can open it from a URL.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock::sql::{fence_param, fenced_outcome_async, FenceOutcome};
use fencelock::{Error, FencedResource, FencingToken, LockClient};
use fencelock_testing::{PostgresServer, RedisServer};

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
            Error::StaleToken {
                presented, latest, ..
            } => LedgerError::Stale {
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

/// Opens the storage at `url`: `redis://...`, `sqlite://<absolute path>` or `postgres://...`.
pub async fn connect(url: &str) -> Result<Box<dyn LedgerStore>, LedgerError> {
    if url.starts_with("redis://") {
        return Ok(Box::new(RedisLedgerStore::connect(url).await?));
    }
    if let Some(path) = url.strip_prefix(SQLITE_SCHEME) {
        let db = Sqlite {
            path: path.to_owned(),
        };
        return Ok(Box::new(SqlLedgerStore::connect(db).await?));
    }
    if url.starts_with("postgres://") {
        let db = Postgres {
            url: url.to_owned(),
        };
        return Ok(Box::new(SqlLedgerStore::connect(db).await?));
    }
    Err(LedgerError::Failed(format!("no ledger backend for {url}")))
}

/// The storages the suite knows how to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A separate `redis-server`, written through [`fencelock::FencedResource`].
    Redis,
    /// A SQLite database file in WAL mode, in a temporary directory, opened by every process
    /// that writes (no server, so no network address: a story that needs to delay the
    /// storage's traffic does not apply to it).
    Sqlite,
    /// A throwaway PostgreSQL server (`fencelock_testing::PostgresServer`).
    Postgres,
}

/// Names the backends the stories run against: `FENCELOCK_STORY_STORAGE=redis,...`.
pub const STORAGE_ENV: &str = "FENCELOCK_STORY_STORAGE";

impl Backend {
    pub const ALL: &'static [Backend] = &[Backend::Redis, Backend::Sqlite, Backend::Postgres];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }

    /// Whether the storage is reached over TCP, so that a [`fencelock_testing::FaultProxy`]
    /// can sit in front of it ([`Storage::addr`] is `Some`).
    pub fn has_network(self) -> bool {
        match self {
            Backend::Redis | Backend::Postgres => true,
            Backend::Sqlite => false,
        }
    }

    /// The backends named by [`STORAGE_ENV`], a comma-separated list of names (default, and
    /// `all`: every one, which is what CI runs).
    pub fn selected() -> Vec<Backend> {
        let Ok(list) = std::env::var(STORAGE_ENV) else {
            return Backend::ALL.to_vec();
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
            Backend::Sqlite => {
                // SQLite has no server to crash: the writers are the processes themselves, and
                // in WAL mode a commit has written its frames to the file before it returns, so
                // it survives a crash of any of them whatever `durable` says (`synchronous =
                // NORMAL` only gives up durability across a crash of the machine).
                let _ = durable;
                let dir = tempfile::Builder::new()
                    .prefix("fencelock-story-sqlite-")
                    .tempdir()
                    .expect("a temporary directory for the SQLite storage");
                let path = dir.path().join("ledgers.db");
                let db = rusqlite::Connection::open(&path).expect("create the SQLite storage");
                // Persistent in the file: every connection, in every process, uses the WAL.
                let mode: String = db
                    .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
                    .expect("switch the SQLite storage to WAL mode");
                assert_eq!(mode, "wal", "SQLite refused WAL mode");
                Storage {
                    backend: self,
                    url: sqlite_url(&path),
                    addr: None,
                    _server: Box::new(dir),
                }
            }
            Backend::Postgres => {
                let server = PostgresServer::start().unwrap_or_else(|err| {
                    panic!(
                        "could not start the storage PostgreSQL (scripts/ensure-postgres installs \
                         it; {STORAGE_ENV}=redis,sqlite runs the stories without it): {err}"
                    )
                });
                // The harness runs PostgreSQL with `fsync = off` and `synchronous_commit =
                // off`. A durable storage turns the latter back on for its sessions: a commit
                // then returns after its WAL reached the operating system, so it survives a
                // crash of the server (not of the machine).
                let url = if durable {
                    format!("{}?options=-c%20synchronous_commit%3Don", server.url())
                } else {
                    server.url()
                };
                Storage {
                    backend: self,
                    url,
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

    /// Where it listens, for a [`fencelock_testing::FaultProxy`] in front of it (`None` for a
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

// ---------------------------------------------------------------------------------------------
// SQL backends (SQLite, PostgreSQL): one ledger logic over a small driver trait.

const SQLITE_SCHEME: &str = "sqlite://";

/// `sqlite://` followed by the absolute path of the database file.
fn sqlite_url(path: &Path) -> String {
    format!("{SQLITE_SCHEME}{}", path.display())
}

/// One row per ledger, with the fence of `fencelock::sql` on it (the aggregate root: every
/// write of the ledger updates this row first), and one row per entry.
const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS story_ledgers (
        name    TEXT PRIMARY KEY,
        len     BIGINT NOT NULL DEFAULT 0,
        balance BIGINT NOT NULL DEFAULT 0,
        fence   BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE IF NOT EXISTS story_entries (
        name          TEXT NOT NULL,
        n             BIGINT NOT NULL,
        token         BIGINT NOT NULL,
        id            BIGINT NOT NULL,
        amount        BIGINT NOT NULL,
        balance_after BIGINT NOT NULL,
        PRIMARY KEY (name, n)
    );";

// Every statement takes the ledger's name as `$1` and integers after it. They are written with
// PostgreSQL's `$n`; the SQLite driver turns them into `?n` (in SQLite `$1` is a *named*
// parameter, numbered by first appearance, which would bind the wrong values).

/// `$1` name.
const OPEN: &str = "INSERT INTO story_ledgers (name) VALUES ($1) ON CONFLICT (name) DO NOTHING";
/// `$1` name, `$2` token: raises the fence and reads the state in one statement.
const CLAIM: &str = "UPDATE story_ledgers SET fence = $2 WHERE name = $1 AND fence <= $2 \
                     RETURNING len, balance";
/// `$1` name: the fence, read in its own statement after a fenced statement affected no row.
const READ_FENCE: &str = "SELECT fence FROM story_ledgers WHERE name = $1";
/// `$1` name, `$2` len, `$3` balance, `$4` token: the fenced update, first in a commit. It sets
/// the state computed from the writer's snapshot, as the Redis backend does, so a stale write
/// that got through would show as an overwrite.
const ADVANCE: &str = "UPDATE story_ledgers SET len = $2, balance = $3, fence = $4 \
                       WHERE name = $1 AND fence <= $4";
/// `$1` name, `$2` n, `$3` token, `$4` id, `$5` amount, `$6` balance after. An upsert rather
/// than a plain insert: an unfenced write to an existing entry would overwrite it (as the
/// Redis hash field would) instead of failing on the primary key, so the checker sees it.
const PUT_ENTRY: &str = "INSERT INTO story_entries (name, n, token, id, amount, balance_after) \
                         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name, n) DO UPDATE SET \
                         token = excluded.token, id = excluded.id, amount = excluded.amount, \
                         balance_after = excluded.balance_after";
/// `$1` name.
const PEEK: &str = "SELECT len, balance FROM story_ledgers WHERE name = $1";
/// `$1` name.
const ENTRIES: &str = "SELECT n, token, id, amount, balance_after FROM story_entries \
                       WHERE name = $1 ORDER BY n";

fn sql_failed(what: &str, err: impl std::fmt::Display) -> LedgerError {
    LedgerError::Failed(format!("{what}: {err}"))
}

/// An SQL integer as the unsigned number the ledger keeps.
fn unsigned(value: i64, what: &str) -> Result<u64, LedgerError> {
    u64::try_from(value).map_err(|_| LedgerError::Failed(format!("{what} is {value}")))
}

/// One connection of an SQL driver. `$1` of every statement is the ledger's name, `ints` are
/// `$2`, `$3`, ...; every column read is a `BIGINT`.
pub trait SqlConn: Send + 'static {
    /// Prepares `sql` ahead of its first use, so that no statement of a commit waits for a
    /// preparation round trip.
    fn prepare(&mut self, sql: &'static str) -> BoxFuture<'_, Result<(), LedgerError>>;

    /// Starts a write transaction and runs a statement in it, sent together where the driver
    /// can (so a delayed network holds back the statement itself, not just the `BEGIN`);
    /// returns the number of rows the statement affected.
    fn begin_and_execute(
        &mut self,
        sql: &'static str,
        name: &str,
        ints: &[i64],
    ) -> BoxFuture<'_, Result<u64, LedgerError>>;

    /// Runs a statement; returns the number of rows it affected.
    fn execute(
        &mut self,
        sql: &'static str,
        name: &str,
        ints: &[i64],
    ) -> BoxFuture<'_, Result<u64, LedgerError>>;

    /// Runs a statement; returns its rows.
    fn query(
        &mut self,
        sql: &'static str,
        name: &str,
        ints: &[i64],
    ) -> BoxFuture<'_, Result<Vec<Vec<i64>>, LedgerError>>;

    /// Runs statements without parameters (`COMMIT`, `ROLLBACK`, DDL).
    fn batch(&mut self, sql: &'static str) -> BoxFuture<'_, Result<(), LedgerError>>;
}

/// An SQL database that hands out connections.
pub trait SqlDb: Send + Sync + 'static {
    type Conn: SqlConn;

    /// Starts the transaction that creates the schema, serialised against other processes
    /// doing the same.
    const SCHEMA_BEGIN: &'static str;

    fn open(&self) -> BoxFuture<'_, Result<Self::Conn, LedgerError>>;
}

/// SQLite through rusqlite: each call runs on tokio's blocking pool.
pub struct Sqlite {
    path: String,
}

/// A rusqlite connection. It is moved to the blocking thread for each call; `None` only if a
/// call's future was dropped halfway, and such a connection is not used again.
pub struct SqliteConn(Option<rusqlite::Connection>);

/// How long a statement waits for another connection's (or process') write lock.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

impl SqliteConn {
    fn run<T: Send + 'static>(
        &mut self,
        what: &'static str,
        call: impl FnOnce(&mut rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> BoxFuture<'_, Result<T, LedgerError>> {
        Box::pin(async move {
            let mut conn = self
                .0
                .take()
                .ok_or_else(|| sql_failed(what, "the connection was lost by a cancelled call"))?;
            let (conn, result) = tokio::task::spawn_blocking(move || {
                let result = call(&mut conn);
                (conn, result)
            })
            .await
            .map_err(|err| sql_failed(what, err))?;
            self.0 = Some(conn);
            result.map_err(|err| sql_failed(what, err))
        })
    }
}

/// `$n` (PostgreSQL) to `?n` (SQLite's positional parameters).
fn sqlite_sql(sql: &str) -> String {
    sql.replace('$', "?")
}

fn sqlite_params(name: &str, ints: &[i64]) -> Vec<rusqlite::types::Value> {
    let mut params = vec![rusqlite::types::Value::Text(name.to_owned())];
    params.extend(ints.iter().map(|&i| rusqlite::types::Value::Integer(i)));
    params
}

impl SqlConn for SqliteConn {
    fn prepare(&mut self, sql: &'static str) -> BoxFuture<'_, Result<(), LedgerError>> {
        self.run(sql, move |conn| {
            conn.prepare_cached(&sqlite_sql(sql)).map(drop)
        })
    }

    fn begin_and_execute(
        &mut self,
        sql: &'static str,
        name: &str,
        ints: &[i64],
    ) -> BoxFuture<'_, Result<u64, LedgerError>> {
        let params = sqlite_params(name, ints);
        self.run(sql, move |conn| {
            // Takes the write lock at once (waiting for it under the busy timeout) rather than
            // at the first write, so the transaction never has to upgrade a read lock.
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let mut statement = conn.prepare_cached(&sqlite_sql(sql))?;
            let rows = statement.execute(rusqlite::params_from_iter(params))?;
            Ok(rows as u64)
        })
    }

    fn execute(
        &mut self,
        sql: &'static str,
        name: &str,
        ints: &[i64],
    ) -> BoxFuture<'_, Result<u64, LedgerError>> {
        let params = sqlite_params(name, ints);
        self.run(sql, move |conn| {
            let mut statement = conn.prepare_cached(&sqlite_sql(sql))?;
            let rows = statement.execute(rusqlite::params_from_iter(params))?;
            Ok(rows as u64)
        })
    }

    fn query(
        &mut self,
        sql: &'static str,
        name: &str,
        ints: &[i64],
    ) -> BoxFuture<'_, Result<Vec<Vec<i64>>, LedgerError>> {
        let params = sqlite_params(name, ints);
        self.run(sql, move |conn| {
            let mut statement = conn.prepare_cached(&sqlite_sql(sql))?;
            let columns = statement.column_count();
            let rows = statement.query_map(rusqlite::params_from_iter(params), |row| {
                (0..columns).map(|i| row.get(i)).collect()
            })?;
            rows.collect()
        })
    }

    fn batch(&mut self, sql: &'static str) -> BoxFuture<'_, Result<(), LedgerError>> {
        self.run(sql, move |conn| conn.execute_batch(sql))
    }
}

impl SqlDb for Sqlite {
    type Conn = SqliteConn;
    const SCHEMA_BEGIN: &'static str = "BEGIN IMMEDIATE";

    fn open(&self) -> BoxFuture<'_, Result<SqliteConn, LedgerError>> {
        let path = self.path.clone();
        Box::pin(async move {
            let what = "open the SQLite storage";
            let conn = tokio::task::spawn_blocking(move || {
                // Never creates the file: it must be the one `Backend::start` set up in WAL mode.
                let conn = rusqlite::Connection::open_with_flags(
                    &path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                conn.busy_timeout(SQLITE_BUSY_TIMEOUT)?;
                conn.pragma_update(None, "synchronous", "NORMAL")?;
                Ok::<_, rusqlite::Error>(conn)
            })
            .await
            .map_err(|err| sql_failed(what, err))?
            .map_err(|err| sql_failed(what, err))?;
            Ok(SqliteConn(Some(conn)))
        })
    }
}

/// PostgreSQL through tokio-postgres, with each connection's prepared statements cached.
pub struct Postgres {
    url: String,
}

pub struct PgConn {
    client: tokio_postgres::Client,
    statements: HashMap<&'static str, tokio_postgres::Statement>,
}

/// A driver error with its cause (`db error` alone says nothing).
fn pg_failed(what: &str, err: tokio_postgres::Error) -> LedgerError {
    match err.as_db_error() {
        Some(db) => sql_failed(what, format!("{err}: {db}")),
        None => sql_failed(what, format!("{err:?}")),
    }
}

impl PgConn {
    async fn statement(
        &mut self,
        sql: &'static str,
    ) -> Result<tokio_postgres::Statement, LedgerError> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self
            .client
            .prepare(sql)
            .await
            .map_err(|err| pg_failed(sql, err))?;
        self.statements.insert(sql, statement.clone());
        Ok(statement)
    }
}

fn pg_params<'a>(
    name: &'a String,
    ints: &'a [i64],
) -> Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)> {
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![name];
    params.extend(
        ints.iter()
            .map(|i| i as &(dyn tokio_postgres::types::ToSql + Sync)),
    );
    params
}

impl SqlConn for PgConn {
    fn prepare(&mut self, sql: &'static str) -> BoxFuture<'_, Result<(), LedgerError>> {
        Box::pin(async move { self.statement(sql).await.map(drop) })
    }

    fn begin_and_execute(
        &mut self,
        sql: &'static str,
        name: &str,
        ints: &[i64],
    ) -> BoxFuture<'_, Result<u64, LedgerError>> {
        let (name, ints) = (name.to_owned(), ints.to_vec());
        Box::pin(async move {
            let statement = self.statement(sql).await?;
            let params = pg_params(&name, &ints);
            // tokio-postgres sends a request when its future is first polled, and `join!`
            // polls in order: both go out together, pipelined, and are run in order.
            let (begin, rows) = tokio::join!(
                self.client.batch_execute("BEGIN"),
                self.client.execute(&statement, &params)
            );
            begin.map_err(|err| pg_failed("BEGIN", err))?;
            rows.map_err(|err| pg_failed(sql, err))
        })
    }

    fn execute(
        &mut self,
        sql: &'static str,
        name: &str,
        ints: &[i64],
    ) -> BoxFuture<'_, Result<u64, LedgerError>> {
        let (name, ints) = (name.to_owned(), ints.to_vec());
        Box::pin(async move {
            let statement = self.statement(sql).await?;
            self.client
                .execute(&statement, &pg_params(&name, &ints))
                .await
                .map_err(|err| pg_failed(sql, err))
        })
    }

    fn query(
        &mut self,
        sql: &'static str,
        name: &str,
        ints: &[i64],
    ) -> BoxFuture<'_, Result<Vec<Vec<i64>>, LedgerError>> {
        let (name, ints) = (name.to_owned(), ints.to_vec());
        Box::pin(async move {
            let statement = self.statement(sql).await?;
            let rows = self
                .client
                .query(&statement, &pg_params(&name, &ints))
                .await
                .map_err(|err| pg_failed(sql, err))?;
            rows.iter()
                .map(|row| {
                    (0..row.len())
                        .map(|i| row.try_get(i).map_err(|err| pg_failed(sql, err)))
                        .collect()
                })
                .collect()
        })
    }

    fn batch(&mut self, sql: &'static str) -> BoxFuture<'_, Result<(), LedgerError>> {
        Box::pin(async move {
            self.client
                .batch_execute(sql)
                .await
                .map_err(|err| pg_failed(sql, err))
        })
    }
}

impl SqlDb for Postgres {
    type Conn = PgConn;
    // `CREATE TABLE IF NOT EXISTS` is not safe against a concurrent one in PostgreSQL (both
    // can pass the check, one then fails on the catalog's unique index): an advisory lock
    // serialises them.
    const SCHEMA_BEGIN: &'static str = "BEGIN; SELECT pg_advisory_xact_lock(74666560)";

    fn open(&self) -> BoxFuture<'_, Result<PgConn, LedgerError>> {
        Box::pin(async move {
            let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
                .await
                .map_err(|err| pg_failed("connect to the PostgreSQL storage", err))?;
            // Ends by itself when the client is dropped.
            tokio::spawn(connection);
            Ok(PgConn {
                client,
                statements: HashMap::new(),
            })
        })
    }
}

/// Ledgers in an SQL database. Connections are pooled: an operation takes an idle one (or
/// opens one), so concurrent writers of one store run concurrently, each in its own session,
/// as separate processes would. A connection that failed is dropped (which also rolls back
/// whatever it had open), never reused.
pub struct SqlLedgerStore<D: SqlDb> {
    shared: Arc<SqlShared<D>>,
}

struct SqlShared<D: SqlDb> {
    db: D,
    idle: Mutex<Vec<D::Conn>>,
}

/// Every statement a ledger runs with parameters.
const STATEMENTS: &[&str] = &[OPEN, CLAIM, READ_FENCE, ADVANCE, PUT_ENTRY, PEEK, ENTRIES];

impl<D: SqlDb> SqlShared<D> {
    async fn checkout(&self) -> Result<D::Conn, LedgerError> {
        let idle = self.idle.lock().unwrap().pop();
        match idle {
            Some(conn) => Ok(conn),
            None => {
                let mut conn = self.db.open().await?;
                prepare_all(&mut conn).await?;
                Ok(conn)
            }
        }
    }

    /// Returns `conn` to the pool unless the operation failed (a refusal is not a failure).
    fn checkin<T>(&self, conn: D::Conn, result: &Result<T, LedgerError>) {
        if !matches!(result, Err(LedgerError::Failed(_))) {
            self.idle.lock().unwrap().push(conn);
        }
    }
}

impl<D: SqlDb> SqlLedgerStore<D> {
    /// Connects and creates the tables if they do not exist yet.
    pub async fn connect(db: D) -> Result<SqlLedgerStore<D>, LedgerError> {
        let shared = Arc::new(SqlShared {
            db,
            idle: Mutex::new(Vec::new()),
        });
        let mut conn = shared.db.open().await?;
        conn.batch(D::SCHEMA_BEGIN).await?;
        conn.batch(SCHEMA).await?;
        conn.batch("COMMIT").await?;
        prepare_all(&mut conn).await?;
        shared.checkin(conn, &Ok::<(), LedgerError>(()));
        Ok(SqlLedgerStore { shared })
    }
}

async fn prepare_all(conn: &mut impl SqlConn) -> Result<(), LedgerError> {
    for &sql in STATEMENTS {
        conn.prepare(sql).await?;
    }
    Ok(())
}

impl<D: SqlDb> LedgerStore for SqlLedgerStore<D> {
    fn open<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Box<dyn Ledger>, LedgerError>> {
        Box::pin(async move {
            let mut conn = self.shared.checkout().await?;
            let result = conn.execute(OPEN, name, &[]).await;
            self.shared.checkin(conn, &result);
            result?;
            Ok(Box::new(SqlLedger {
                shared: self.shared.clone(),
                name: name.to_owned(),
            }) as Box<dyn Ledger>)
        })
    }
}

/// One ledger: its row in `story_ledgers` and its rows in `story_entries`.
pub struct SqlLedger<D: SqlDb> {
    shared: Arc<SqlShared<D>>,
    name: String,
}

impl<D: SqlDb> SqlLedger<D> {
    /// Why a fenced statement that affected no row did not apply, read in a new statement
    /// (`fencelock::sql::fenced_outcome_async`): a stale token is refused exactly as on Redis,
    /// with [`Error::StaleToken`]; anything else (no such ledger) is a failure.
    async fn refusal(&self, conn: &mut D::Conn, token: FencingToken) -> LedgerError {
        let name = &self.name;
        let outcome = fenced_outcome_async(0, token, || async move {
            let rows = conn.query(READ_FENCE, name, &[]).await?;
            Ok::<_, LedgerError>(rows.first().map(|row| row[0]))
        })
        .await;
        match outcome.map(FenceOutcome::into_result) {
            Ok(Err(stale)) => stale.into(),
            Ok(Ok(_)) => LedgerError::Failed(format!(
                "fenced write to ledger {name} with token {token} matched no row, and the \
                 fence does not refuse it"
            )),
            Err(err) => err,
        }
    }

    async fn begin_on(
        &self,
        conn: &mut D::Conn,
        token: FencingToken,
    ) -> Result<Snapshot, LedgerError> {
        let rows = conn.query(CLAIM, &self.name, &[fence_param(token)]).await?;
        match rows.first() {
            Some(row) => Ok(Snapshot {
                len: unsigned(row[0], "len")?,
                balance: row[1],
            }),
            None => Err(self.refusal(conn, token).await),
        }
    }

    async fn commit_on(
        &self,
        conn: &mut D::Conn,
        token: FencingToken,
        next: Snapshot,
        id: u64,
        amount: i64,
    ) -> Result<(), LedgerError> {
        let (len, id) = (next.len as i64, id as i64);
        let rows = conn
            .begin_and_execute(
                ADVANCE,
                &self.name,
                &[len, next.balance, fence_param(token)],
            )
            .await?;
        if rows == 0 {
            let refusal = self.refusal(conn, token).await;
            conn.batch("ROLLBACK").await?;
            return Err(refusal);
        }
        conn.execute(
            PUT_ENTRY,
            &self.name,
            &[len, fence_param(token), id, amount, next.balance],
        )
        .await?;
        conn.batch("COMMIT").await
    }

    async fn peek_on(&self, conn: &mut D::Conn) -> Result<Snapshot, LedgerError> {
        let rows = conn.query(PEEK, &self.name, &[]).await?;
        let row = rows
            .first()
            .ok_or_else(|| LedgerError::Failed(format!("no ledger {}", self.name)))?;
        Ok(Snapshot {
            len: unsigned(row[0], "len")?,
            balance: row[1],
        })
    }

    /// The entries, which must be exactly numbers 1..=len.
    async fn entries_on(&self, conn: &mut D::Conn) -> Result<Vec<Entry>, LedgerError> {
        let len = self.peek_on(conn).await?.len;
        let rows = conn.query(ENTRIES, &self.name, &[]).await?;
        let numbers: Vec<i64> = rows.iter().map(|row| row[0]).collect();
        if numbers.len() as u64 != len || numbers.iter().zip(1..).any(|(&n, want)| n != want) {
            return Err(LedgerError::Failed(format!(
                "ledger {} has len {len} but entries numbered {numbers:?}",
                self.name
            )));
        }
        rows.iter()
            .map(|row| {
                Ok(Entry {
                    token: unsigned(row[1], "token")?,
                    id: unsigned(row[2], "id")?,
                    amount: row[3],
                    balance_after: row[4],
                })
            })
            .collect()
    }
}

impl<D: SqlDb> Ledger for SqlLedger<D> {
    fn begin(&self, token: FencingToken) -> BoxFuture<'_, Result<Snapshot, LedgerError>> {
        Box::pin(async move {
            let mut conn = self.shared.checkout().await?;
            let result = self.begin_on(&mut conn, token).await;
            self.shared.checkin(conn, &result);
            result
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
            let mut conn = self.shared.checkout().await?;
            let result = self.commit_on(&mut conn, token, next, id, amount).await;
            self.shared.checkin(conn, &result);
            result.map(|()| next)
        })
    }

    fn peek(&self) -> BoxFuture<'_, Result<Snapshot, LedgerError>> {
        Box::pin(async move {
            let mut conn = self.shared.checkout().await?;
            let result = self.peek_on(&mut conn).await;
            self.shared.checkin(conn, &result);
            result
        })
    }

    fn entries(&self) -> BoxFuture<'_, Result<Vec<Entry>, LedgerError>> {
        Box::pin(async move {
            let mut conn = self.shared.checkout().await?;
            let result = self.entries_on(&mut conn).await;
            self.shared.checkin(conn, &result);
            result
        })
    }
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
