//! Fenced writes to SQL (`fencelock::sql`), on SQLite and on a real PostgreSQL server, with
//! real tokens from a lock on a throwaway Redis.
//!
//! Every scenario is one generic body over the small [`Db`]/[`Conn`] traits below; the
//! `on_sqlite` and `on_postgres` modules run each body once per database. The statements are
//! the ones `src/sql.rs` documents, written with `$n` placeholders (PostgreSQL's), which the
//! SQLite connection rewrites to `?n`.

use crate::common::deadline;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadline::Progress;
use fencelock::sql::{fence_param, fenced_outcome_async, token_from_fence, FenceOutcome};
use fencelock::{FencingToken, LockClient};
use fencelock_testing::{PostgresServer, RedisServer};
use rusqlite::OptionalExtension;

type DbError = Box<dyn std::error::Error + Send + Sync>;

const SCHEMA: &str = "
    CREATE TABLE accounts (
        id      BIGINT PRIMARY KEY,
        balance BIGINT NOT NULL,
        fence   BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE ledger (
        account BIGINT NOT NULL,
        amount  BIGINT NOT NULL,
        token   BIGINT NOT NULL
    );";
/// $1 id, $2 balance, $3 token.
const SET_BALANCE: &str =
    "UPDATE accounts SET balance = $2, fence = $3 WHERE id = $1 AND fence <= $3";
/// $1 id, $2 amount, $3 token.
const DEBIT: &str =
    "UPDATE accounts SET balance = balance - $2, fence = $3 WHERE id = $1 AND fence <= $3";
/// As [`DEBIT`], refusing to overdraw: a condition of our own next to the fence.
const DEBIT_IF_COVERED: &str = "UPDATE accounts SET balance = balance - $2, fence = $3 \
     WHERE id = $1 AND fence <= $3 AND balance >= $2";
/// $1 id, $2 balance, $3 token.
const UPSERT: &str = "INSERT INTO accounts (id, balance, fence) VALUES ($1, $2, $3) \
     ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, fence = excluded.fence \
     WHERE accounts.fence <= excluded.fence";
/// $1 id, $2 token: raises the fence and reads the balance in one statement.
const CLAIM: &str =
    "UPDATE accounts SET fence = $2 WHERE id = $1 AND fence <= $2 RETURNING balance";
const READ_FENCE: &str = "SELECT fence FROM accounts WHERE id = $1";
const READ_BALANCE: &str = "SELECT balance FROM accounts WHERE id = $1";
/// $1 account, $2 amount, $3 token.
const APPEND_LEDGER: &str = "INSERT INTO ledger (account, amount, token) VALUES ($1, $2, $3)";
const COUNT_LEDGER: &str = "SELECT COUNT(*) FROM ledger WHERE account = $1";

/// A database the scenarios can open connections to.
trait Db: Send + Sync + 'static {
    type Conn: Conn;
    fn connect(&self) -> impl Future<Output = Self::Conn> + Send;
}

/// One connection; statements take only integer parameters, numbered `$1`, `$2`, ...
trait Conn: Send + 'static {
    /// Runs one statement and returns the number of rows it affected.
    fn execute(
        &mut self,
        sql: &'static str,
        params: Vec<i64>,
    ) -> impl Future<Output = Result<u64, DbError>> + Send;
    /// Runs one statement and returns the first column of its first row, if any.
    fn query(
        &mut self,
        sql: &'static str,
        params: Vec<i64>,
    ) -> impl Future<Output = Result<Option<i64>, DbError>> + Send;
    /// Runs statements without parameters (DDL, `BEGIN`, `COMMIT`, `ROLLBACK`).
    fn batch(&mut self, sql: &'static str) -> impl Future<Output = Result<(), DbError>> + Send;
}

// ---------------------------------------------------------------------------------------------
// SQLite: a database file in a temporary directory, one rusqlite connection per `connect`.

struct Sqlite {
    dir: tempfile::TempDir,
}

impl Sqlite {
    fn new() -> Sqlite {
        Sqlite {
            dir: tempfile::tempdir().expect("temporary directory"),
        }
    }
}

struct SqliteConn(rusqlite::Connection);

/// `$n` is a named parameter in SQLite, numbered by first appearance; `?n` is positional.
fn sqlite_sql(sql: &str) -> String {
    sql.replace('$', "?")
}

impl Db for Sqlite {
    type Conn = SqliteConn;
    fn connect(&self) -> impl Future<Output = SqliteConn> + Send {
        let conn = rusqlite::Connection::open(self.dir.path().join("bank.db")).expect("open");
        // Writers queue for the database lock instead of failing with SQLITE_BUSY.
        conn.busy_timeout(Duration::from_secs(30)).unwrap();
        std::future::ready(SqliteConn(conn))
    }
}

// rusqlite is synchronous: each call runs to completion before its future is even returned.
impl Conn for SqliteConn {
    fn execute(
        &mut self,
        sql: &'static str,
        params: Vec<i64>,
    ) -> impl Future<Output = Result<u64, DbError>> + Send {
        let result = self
            .0
            .execute(&sqlite_sql(sql), rusqlite::params_from_iter(params))
            .map(|rows| rows as u64)
            .map_err(DbError::from);
        std::future::ready(result)
    }

    fn query(
        &mut self,
        sql: &'static str,
        params: Vec<i64>,
    ) -> impl Future<Output = Result<Option<i64>, DbError>> + Send {
        let result = self
            .0
            .query_row(
                &sqlite_sql(sql),
                rusqlite::params_from_iter(params),
                |row| row.get(0),
            )
            .optional()
            .map_err(DbError::from);
        std::future::ready(result)
    }

    fn batch(&mut self, sql: &'static str) -> impl Future<Output = Result<(), DbError>> + Send {
        std::future::ready(self.0.execute_batch(sql).map_err(DbError::from))
    }
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL: a throwaway server from the harness, one tokio-postgres client per `connect`.

struct Postgres {
    server: PostgresServer,
}

impl Postgres {
    async fn start() -> Postgres {
        let server = tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .unwrap()
            .unwrap_or_else(|err| {
                panic!("could not start PostgreSQL (scripts/ensure-postgres installs it): {err}")
            });
        Postgres { server }
    }
}

struct PgConn(tokio_postgres::Client);

impl Db for Postgres {
    type Conn = PgConn;
    fn connect(&self) -> impl Future<Output = PgConn> + Send {
        let url = self.server.url();
        async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect to PostgreSQL");
            tokio::spawn(connection);
            PgConn(client)
        }
    }
}

fn pg_params(params: &[i64]) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
    params.iter().map(|p| p as _).collect()
}

impl Conn for PgConn {
    async fn execute(&mut self, sql: &'static str, params: Vec<i64>) -> Result<u64, DbError> {
        Ok(self.0.execute(sql, &pg_params(&params)).await?)
    }

    async fn query(&mut self, sql: &'static str, params: Vec<i64>) -> Result<Option<i64>, DbError> {
        let row = self.0.query_opt(sql, &pg_params(&params)).await?;
        Ok(row.map(|row| row.get(0)))
    }

    async fn batch(&mut self, sql: &'static str) -> Result<(), DbError> {
        Ok(self.0.batch_execute(sql).await?)
    }
}

// ---------------------------------------------------------------------------------------------
// The fenced operations, exactly as src/sql.rs documents them.

/// Reads the outcome of a fenced statement on account `id` that affected `rows` rows.
async fn outcome<C: Conn>(conn: &mut C, rows: u64, id: i64, token: FencingToken) -> FenceOutcome {
    fenced_outcome_async(rows, token, move || conn.query(READ_FENCE, vec![id]))
        .await
        .expect("read the fence")
}

/// Runs a fenced statement whose parameters are `$1` id, `$2` value, `$3` token.
async fn fenced<C: Conn>(
    conn: &mut C,
    sql: &'static str,
    id: i64,
    value: i64,
    token: FencingToken,
) -> FenceOutcome {
    let rows = conn
        .execute(sql, vec![id, value, fence_param(token)])
        .await
        .expect(sql);
    outcome(conn, rows, id, token).await
}

/// The first statement of a read-modify-write: raises the fence to `token` and returns the
/// balance, or the outcome that says why it could not.
async fn claim<C: Conn>(conn: &mut C, id: i64, token: FencingToken) -> Result<i64, FenceOutcome> {
    let balance = conn
        .query(CLAIM, vec![id, fence_param(token)])
        .await
        .expect("claim");
    match balance {
        Some(balance) => Ok(balance),
        None => Err(outcome(conn, 0, id, token).await),
    }
}

/// Debits `amount` and appends it to the ledger in one transaction, the fenced update first;
/// rolls back unless it was applied.
async fn debit_with_ledger<C: Conn>(
    conn: &mut C,
    id: i64,
    amount: i64,
    token: FencingToken,
) -> FenceOutcome {
    conn.batch("BEGIN").await.unwrap();
    let result = fenced(conn, DEBIT, id, amount, token).await;
    if result.is_applied() {
        conn.execute(APPEND_LEDGER, vec![id, amount, fence_param(token)])
            .await
            .unwrap();
        conn.batch("COMMIT").await.unwrap();
    } else {
        conn.batch("ROLLBACK").await.unwrap();
    }
    result
}

async fn create_account<C: Conn>(conn: &mut C, id: i64, balance: i64) {
    conn.execute(
        "INSERT INTO accounts (id, balance) VALUES ($1, $2)",
        vec![id, balance],
    )
    .await
    .unwrap();
}

/// The account's (balance, fence), if it exists.
async fn account<C: Conn>(conn: &mut C, id: i64) -> Option<(i64, i64)> {
    let balance = conn.query(READ_BALANCE, vec![id]).await.unwrap()?;
    let fence = conn.query(READ_FENCE, vec![id]).await.unwrap()?;
    Some((balance, fence))
}

async fn ledger_len<C: Conn>(conn: &mut C, id: i64) -> i64 {
    conn.query(COUNT_LEDGER, vec![id]).await.unwrap().unwrap()
}

fn stale(presented: FencingToken, latest: FencingToken) -> FenceOutcome {
    FenceOutcome::Stale { presented, latest }
}

// ---------------------------------------------------------------------------------------------
// The set-up: a database with the schema, a throwaway Redis and a lock client on it.

struct Env<D: Db> {
    db: Arc<D>,
    client: LockClient,
    redis: RedisServer,
}

impl<D: Db> Env<D> {
    async fn new(db: D) -> (Env<D>, D::Conn) {
        let redis = RedisServer::start().expect("start redis-server");
        let client = LockClient::connect(&redis.url()).await.expect("connect");
        let mut conn = db.connect().await;
        conn.batch(SCHEMA).await.unwrap();
        let env = Env {
            db: Arc::new(db),
            client,
            redis,
        };
        (env, conn)
    }

    /// Two real tokens of lock `name`, from two acquisitions one after the other.
    async fn older_and_newer(&self, name: &str) -> (FencingToken, FencingToken) {
        let lock = self.client.lock(name).unwrap();
        let first = lock.acquire().await.unwrap();
        let older = first.token();
        first.release().await.unwrap();
        let second = lock.acquire().await.unwrap();
        let newer = second.token();
        second.release().await.unwrap();
        assert!(newer > older);
        (older, newer)
    }
}

// ---------------------------------------------------------------------------------------------
// The scenarios.

async fn newer_and_equal_tokens_apply_an_older_one_changes_nothing<D: Db>(db: D) {
    let (env, mut conn) = Env::new(db).await;
    let (older, newer) = env.older_and_newer("account:1").await;
    create_account(&mut conn, 1, 100).await;

    assert_eq!(
        fenced(&mut conn, SET_BALANCE, 1, 90, older).await,
        FenceOutcome::Applied
    );
    // The same holder writes again with the same token.
    assert_eq!(
        fenced(&mut conn, SET_BALANCE, 1, 80, older).await,
        FenceOutcome::Applied
    );
    assert_eq!(
        fenced(&mut conn, SET_BALANCE, 1, 70, newer).await,
        FenceOutcome::Applied
    );
    assert_eq!(account(&mut conn, 1).await, Some((70, fence_param(newer))));

    let refused = fenced(&mut conn, SET_BALANCE, 1, 0, older).await;
    assert_eq!(refused, stale(older, newer));
    assert_eq!(
        account(&mut conn, 1).await,
        Some((70, fence_param(newer))),
        "a stale write changes nothing"
    );
    let err = refused.into_result().unwrap_err();
    assert!(err.is_stale_token(), "{err}");
    assert!(err.to_string().contains(&older.to_string()), "{err}");
}

async fn a_missing_row_a_stale_write_and_a_failed_condition_are_told_apart<D: Db>(db: D) {
    let (env, mut conn) = Env::new(db).await;
    let (older, newer) = env.older_and_newer("account:2").await;

    assert_eq!(
        fenced(&mut conn, SET_BALANCE, 2, 10, newer).await,
        FenceOutcome::Missing
    );
    assert_eq!(account(&mut conn, 2).await, None, "nothing was created");
    assert!(!FenceOutcome::Missing.into_result().unwrap());

    create_account(&mut conn, 2, 10).await;
    assert_eq!(
        fenced(&mut conn, DEBIT_IF_COVERED, 2, 25, newer).await,
        FenceOutcome::NotMatched,
        "the fence admits the token, the balance does not cover the debit"
    );
    assert_eq!(
        fenced(&mut conn, DEBIT_IF_COVERED, 2, 4, newer).await,
        FenceOutcome::Applied
    );
    assert_eq!(
        fenced(&mut conn, DEBIT_IF_COVERED, 2, 4, older).await,
        stale(older, newer),
        "stale wins over the other condition"
    );
    assert_eq!(account(&mut conn, 2).await, Some((6, fence_param(newer))));
}

async fn the_upsert_inserts_and_then_only_current_tokens_update<D: Db>(db: D) {
    let (env, mut conn) = Env::new(db).await;
    let (older, newer) = env.older_and_newer("account:3").await;

    assert_eq!(
        fenced(&mut conn, UPSERT, 3, 100, older).await,
        FenceOutcome::Applied,
        "inserted"
    );
    assert_eq!(account(&mut conn, 3).await, Some((100, fence_param(older))));
    assert_eq!(
        fenced(&mut conn, UPSERT, 3, 110, older).await,
        FenceOutcome::Applied
    );
    assert_eq!(
        fenced(&mut conn, UPSERT, 3, 120, newer).await,
        FenceOutcome::Applied
    );
    assert_eq!(
        fenced(&mut conn, UPSERT, 3, 999, older).await,
        stale(older, newer)
    );
    assert_eq!(account(&mut conn, 3).await, Some((120, fence_param(newer))));
}

async fn a_stale_ledger_transaction_rolls_back_entirely<D: Db>(db: D) {
    let (env, mut conn) = Env::new(db).await;
    let (older, newer) = env.older_and_newer("account:4").await;
    create_account(&mut conn, 4, 100).await;

    assert_eq!(
        debit_with_ledger(&mut conn, 4, 30, newer).await,
        FenceOutcome::Applied
    );
    assert_eq!(
        debit_with_ledger(&mut conn, 4, 20, older).await,
        stale(older, newer)
    );
    assert_eq!(account(&mut conn, 4).await, Some((70, fence_param(newer))));
    assert_eq!(ledger_len(&mut conn, 4).await, 1);

    // Even a ledger row written before the fenced update goes: the transaction is the unit.
    conn.batch("BEGIN").await.unwrap();
    conn.execute(APPEND_LEDGER, vec![4, 20, fence_param(older)])
        .await
        .unwrap();
    assert!(fenced(&mut conn, DEBIT, 4, 20, older).await.is_stale());
    conn.batch("ROLLBACK").await.unwrap();
    assert_eq!(ledger_len(&mut conn, 4).await, 1);
    assert_eq!(account(&mut conn, 4).await, Some((70, fence_param(newer))));
}

/// Holder A takes the lock with a short lease, reads, and pauses past its lease. B takes over
/// and claims the row. A wakes up and writes: refused, although B has not written yet; then
/// B's write lands. The result is B's, computed from data A never changed.
async fn a_holder_paused_past_its_lease_is_refused_after_the_next_holder_claims<D: Db>(db: D) {
    let (env, mut conn) = Env::new(db).await;
    create_account(&mut conn, 5, 100).await;
    let mut conn_b = env.db.connect().await;
    let lock = env.client.lock("account:5").unwrap();

    let guard_a = lock
        .with_lease(Duration::from_millis(300))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let token_a = guard_a.token();
    let balance_a = claim(&mut conn, 5, token_a).await.unwrap();
    assert_eq!(balance_a, 100);

    // The pause: A does nothing until its lease is gone.
    guard_a.lost().await;
    assert!(!guard_a.is_valid());

    let guard_b = lock.acquire().await.unwrap();
    let token_b = guard_b.token();
    assert!(token_b > token_a);
    let balance_b = claim(&mut conn_b, 5, token_b).await.unwrap();
    assert_eq!(balance_b, 100);

    // A wakes up and finishes its read-modify-write, and its ledger append.
    assert_eq!(
        fenced(&mut conn, SET_BALANCE, 5, balance_a - 30, token_a).await,
        stale(token_a, token_b)
    );
    assert_eq!(
        debit_with_ledger(&mut conn, 5, 30, token_a).await,
        stale(token_a, token_b)
    );
    assert_eq!(
        account(&mut conn, 5).await,
        Some((100, fence_param(token_b)))
    );

    assert_eq!(
        fenced(&mut conn_b, SET_BALANCE, 5, balance_b - 50, token_b).await,
        FenceOutcome::Applied
    );
    guard_b.release().await.unwrap();
    assert_eq!(
        account(&mut conn, 5).await,
        Some((50, fence_param(token_b)))
    );
    assert_eq!(ledger_len(&mut conn, 5).await, 0);
    drop(guard_a);
}

/// An older holder's transaction that has to wait for a newer holder's (the row is locked)
/// re-checks the fence once that commits, and is refused.
async fn a_stale_transaction_waiting_for_a_newer_one_is_refused_when_it_commits<D: Db>(db: D) {
    let (env, mut conn) = Env::new(db).await;
    let (older, newer) = env.older_and_newer("account:6").await;
    create_account(&mut conn, 6, 100).await;

    let mut newer_conn = env.db.connect().await;
    newer_conn.batch("BEGIN").await.unwrap();
    assert_eq!(
        fenced(&mut newer_conn, DEBIT, 6, 10, newer).await,
        FenceOutcome::Applied
    );
    let older_write = tokio::spawn(async move {
        let result = debit_with_ledger(&mut conn, 6, 99, older).await;
        (result, conn)
    });
    // Give the older transaction time to start waiting; either order gives the same result.
    tokio::time::sleep(Duration::from_millis(100)).await;
    newer_conn.batch("COMMIT").await.unwrap();

    let (result, mut conn) = older_write.await.unwrap();
    assert_eq!(result, stale(older, newer));
    assert_eq!(account(&mut conn, 6).await, Some((90, fence_param(newer))));
    assert_eq!(ledger_len(&mut conn, 6).await, 0);
}

/// Several tasks on two lock clients each take the lock and do a fenced read-modify-write
/// (claim and read, yield, write back one less, append to the ledger). Every write is applied
/// and the balance ends at the serial result.
async fn concurrent_fenced_read_modify_writes_end_with_the_serial_result<D: Db>(db: D) {
    const TASKS: i64 = 6;
    const ROUNDS: i64 = 5;
    let (env, mut conn) = Env::new(db).await;
    create_account(&mut conn, 7, 1_000).await;
    let second_client = LockClient::connect(&env.redis.url()).await.unwrap();

    let progress = Progress::new();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let client = if task % 2 == 0 {
            env.client.clone()
        } else {
            second_client.clone()
        };
        let db = Arc::clone(&env.db);
        let progress = Arc::clone(&progress);
        tasks.push(tokio::spawn(async move {
            let mut conn = db.connect().await;
            let lock = client.lock("account:7").unwrap();
            let mut tokens = Vec::new();
            for _ in 0..ROUNDS {
                let guard = lock.acquire().await.unwrap();
                progress.tick();
                let token = guard.token();
                let balance = claim(&mut conn, 7, token).await.unwrap();
                // Let the others run: without the lock, they would read the same balance.
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
                conn.batch("BEGIN").await.unwrap();
                let result = fenced(&mut conn, SET_BALANCE, 7, balance - 1, token).await;
                assert_eq!(result, FenceOutcome::Applied);
                conn.execute(APPEND_LEDGER, vec![7, 1, fence_param(token)])
                    .await
                    .unwrap();
                conn.batch("COMMIT").await.unwrap();
                guard.release().await.unwrap();
                tokens.push(token);
            }
            tokens
        }));
    }
    let mut tokens: Vec<FencingToken> = progress
        .join("the account's read-modify-writes", tasks)
        .await
        .into_iter()
        .flatten()
        .collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(
        tokens.len() as i64,
        TASKS * ROUNDS,
        "every acquisition has its own token"
    );

    let (balance, fence) = account(&mut conn, 7).await.unwrap();
    assert_eq!(balance, 1_000 - TASKS * ROUNDS);
    assert_eq!(token_from_fence(fence), tokens.last().copied());
    assert_eq!(ledger_len(&mut conn, 7).await, TASKS * ROUNDS);
}

macro_rules! on_every_database {
    ($($scenario:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Sqlite::new()).await;
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Postgres::start().await).await;
                }
            )*
        }
    };
}

on_every_database!(
    newer_and_equal_tokens_apply_an_older_one_changes_nothing,
    a_missing_row_a_stale_write_and_a_failed_condition_are_told_apart,
    the_upsert_inserts_and_then_only_current_tokens_update,
    a_stale_ledger_transaction_rolls_back_entirely,
    a_holder_paused_past_its_lease_is_refused_after_the_next_holder_claims,
    a_stale_transaction_waiting_for_a_newer_one_is_refused_when_it_commits,
    concurrent_fenced_read_modify_writes_end_with_the_serial_result,
);

/// The pitfall `src/sql.rs` warns about: in SQLite `$2` is a named parameter that takes the
/// first value if it appears first. `?2` is positional.
#[test]
fn sqlite_numbers_dollar_parameters_by_first_appearance() {
    let db = rusqlite::Connection::open_in_memory().unwrap();
    let dollar: (i64, i64) = db
        .query_row("SELECT $2, $1", [10, 20], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!(dollar, (10, 20), "$2 took the first value");
    let question: (i64, i64) = db
        .query_row("SELECT ?2, ?1", [10, 20], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!(question, (20, 10));
}
