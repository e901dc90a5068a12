//! Fenced writes to SQL, end to end: a holder that pauses past its lease wakes up and tries to
//! debit an account that a newer holder has claimed meanwhile; the database refuses the write
//! because its fencing token is older. SQLite, so nothing needs installing but redis-server.
//!
//! ```text
//! cargo run --example sql_fencing
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --example sql_fencing
//! ```
//!
//! Without `REDIS_URL` it starts a throwaway `redis-server` on a free loopback port; with it,
//! it uses that server under a fresh key prefix and deletes its keys at the end. The pattern
//! (the `fence` column, the statements, reading the outcome) is documented in `fencelock::sql`.
//! Exit status 0 when the stale write was refused and the data is right, 1 otherwise.

mod support;

use std::process::ExitCode;
use std::time::Duration;

use fencelock::sql::{fence_param, fenced_outcome, FenceOutcome};
use fencelock::{FencingToken, LockClient};
use rusqlite::{params, Connection, OptionalExtension};
use support::{BoxError, ExampleRedis};

const ACCOUNT: i64 = 42;
/// Short, so that the pause below costs a fraction of a second.
const LEASE: Duration = Duration::from_millis(200);

/// Claims the account for `token` (raising its fence, so every older token is refused from
/// now on) and reads its balance, in one statement.
fn claim(db: &Connection, token: FencingToken) -> rusqlite::Result<Result<i64, FenceOutcome>> {
    let balance: Option<i64> = db
        .query_row(
            "UPDATE accounts SET fence = ?2 WHERE id = ?1 AND fence <= ?2 RETURNING balance",
            params![ACCOUNT, fence_param(token)],
            |row| row.get(0),
        )
        .optional()?;
    match balance {
        Some(balance) => Ok(Ok(balance)),
        None => Ok(Err(fenced_outcome(0, token, || read_fence(db))?)),
    }
}

/// Writes the new balance and appends the debit to the ledger, in one transaction whose first
/// statement is the fenced update; anything but `Applied` rolls it back.
fn debit(
    db: &mut Connection,
    new_balance: i64,
    amount: i64,
    token: FencingToken,
) -> rusqlite::Result<FenceOutcome> {
    let tx = db.transaction()?;
    let rows = tx.execute(
        "UPDATE accounts SET balance = ?2, fence = ?3 WHERE id = ?1 AND fence <= ?3",
        params![ACCOUNT, new_balance, fence_param(token)],
    )?;
    let outcome = fenced_outcome(rows as u64, token, || read_fence(&tx))?;
    if outcome.is_applied() {
        tx.execute(
            "INSERT INTO ledger (account, amount, token) VALUES (?1, ?2, ?3)",
            params![ACCOUNT, amount, fence_param(token)],
        )?;
        tx.commit()?;
    } // else: dropping `tx` rolls back
    Ok(outcome)
}

fn read_fence(db: &Connection) -> rusqlite::Result<Option<i64>> {
    db.query_row(
        "SELECT fence FROM accounts WHERE id = ?1",
        [ACCOUNT],
        |row| row.get(0),
    )
    .optional()
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    // The lock service: our own throwaway Redis, or REDIS_URL; a fresh prefix either way.
    let redis = ExampleRedis::from_env()?;
    let (url, prefix) = (redis.url().to_owned(), redis.prefix().to_owned());
    let client = LockClient::builder(url.clone())
        .prefix(&prefix)
        .connect()
        .await?;
    let lock = client.lock(format!("account:{ACCOUNT}"))?;

    // The database: two connections to one SQLite file, as two app servers would have.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bank.db");
    let mut db_a = Connection::open(&path)?;
    let mut db_b = Connection::open(&path)?;
    db_b.busy_timeout(Duration::from_secs(5))?;
    db_a.busy_timeout(Duration::from_secs(5))?;
    db_a.execute_batch(
        "CREATE TABLE accounts (
             id      BIGINT PRIMARY KEY,
             balance BIGINT NOT NULL,
             fence   BIGINT NOT NULL DEFAULT 0  -- the highest token that wrote this row
         );
         CREATE TABLE ledger (account BIGINT NOT NULL, amount BIGINT NOT NULL,
                              token BIGINT NOT NULL);
         INSERT INTO accounts (id, balance) VALUES (42, 1000);",
    )?;
    println!("account {ACCOUNT}: 1000 cents; fence column starts at 0");

    // A takes the lock with a short lease and reads the balance (claiming the row).
    let guard_a = lock.with_lease(LEASE)?.acquire().await?;
    let token_a = guard_a.token();
    let Ok(balance_a) = claim(&db_a, token_a)? else {
        return Err("A could not claim the account".into());
    };
    println!("A  token {token_a}: read {balance_a}, wants to debit 500");

    // A pauses (think: a long GC pause) until its lease is gone.
    guard_a.lost().await;
    println!("A  pauses past its {LEASE:?} lease; the lock is free again");

    // B takes over and claims the row before A wakes up.
    let guard_b = lock.acquire().await?;
    let token_b = guard_b.token();
    let Ok(balance_b) = claim(&db_b, token_b)? else {
        return Err("B could not claim the account".into());
    };
    println!("B  token {token_b}: read {balance_b}, wants to debit 300");

    // A wakes up, still believing it holds the lock, and writes. The database says no.
    let late = debit(&mut db_a, balance_a - 500, 500, token_a)?;
    match late.into_result() {
        Err(err) => println!("A  woke up and wrote: REFUSED ({err})"),
        Ok(_) => println!("A  woke up and wrote: {late:?} (it should have been refused!)"),
    }

    // B finishes its debit.
    let write_b = debit(&mut db_b, balance_b - 300, 300, token_b)?;
    println!("B  wrote: {write_b:?}");
    guard_b.release().await?;
    drop(guard_a);

    let (balance, fence): (i64, i64) = db_a.query_row(
        "SELECT balance, fence FROM accounts WHERE id = ?1",
        [ACCOUNT],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    let ledger: i64 = db_a.query_row("SELECT COUNT(*) FROM ledger", [], |row| row.get(0))?;
    println!("account {ACCOUNT}: {balance} cents, fence {fence}, {ledger} ledger entry");

    redis.cleanup()?; // the fence counter and operation records of this run

    let ok = late.is_stale()
        && write_b.is_applied()
        && balance == 700
        && fence == fence_param(token_b)
        && ledger == 1;
    println!("{}", if ok { "PASS" } else { "FAIL" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
