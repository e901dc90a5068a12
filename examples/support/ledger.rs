//! A payments ledger in PostgreSQL behind fencelock's idempotency keys: the second line of
//! defence. Shared by `examples/payments.rs` and `tests/storage/payments.rs` (each includes this file).
//!
//! The key makes a payment run once and answers its duplicates from Redis; the database makes
//! sure that even a run the key could not stop (a runner frozen past its hold, whose
//! successor ran the payment meanwhile) cannot apply it twice:
//!
//! - the payment row's primary key is the payment id, so a payment has at most one row;
//! - the row carries the fencing token of the run that wrote it last (`fence`), and the
//!   first statement of every run's transaction raises it, refusing a token older than the
//!   one there (the `fencelock::sql` pattern): a late run is refused before it touches
//!   anything;
//! - the row, the balance change and the stored result commit in one transaction, so a run
//!   that dies mid-way leaves nothing, and a payment found applied answers with the result
//!   stored next to it.
#![allow(dead_code, unreachable_pub)]

use fencelock::sql::fence_param;
use fencelock::FencingToken;

pub const SCHEMA: &str = "
    CREATE TABLE accounts (
        id      BIGINT PRIMARY KEY,
        balance BIGINT NOT NULL
    );
    CREATE TABLE payments (
        id      TEXT PRIMARY KEY,
        fence   BIGINT NOT NULL,
        account BIGINT,
        amount  BIGINT,
        result  TEXT
    );";

/// What one run of a payment did in the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// This run applied the payment; the result stored with it.
    Now(String),
    /// An earlier run had applied it (its result never reached the key's record): the result
    /// stored then.
    Before(String),
    /// The account does not cover the amount: nothing applied, the refusal is the result.
    Declined(String),
    /// A run with a newer token has claimed the payment: this one is stale and wrote nothing.
    Stale,
}

/// Applies payment `id` (debit `amount` from `account`) with `token`, once, in one
/// transaction.
pub async fn apply(
    db: &mut tokio_postgres::Client,
    id: &str,
    account: i64,
    amount: i64,
    token: FencingToken,
) -> Result<Applied, tokio_postgres::Error> {
    let tx = db.transaction().await?;
    // The fenced claim: insert the payment's row, or raise its fence; no row back means a
    // newer token holds it. It also locks the row until the commit, so two runs of one payment
    // never interleave here.
    let claimed = tx
        .query_opt(
            "INSERT INTO payments (id, fence) VALUES ($1, $2) \
             ON CONFLICT (id) DO UPDATE SET fence = excluded.fence \
             WHERE payments.fence <= excluded.fence RETURNING result",
            &[&id, &fence_param(token)],
        )
        .await?;
    let Some(row) = claimed else {
        tx.rollback().await?;
        return Ok(Applied::Stale);
    };
    if let Some(result) = row.get::<_, Option<String>>(0) {
        tx.commit().await?;
        return Ok(Applied::Before(result));
    }
    let debited = tx
        .execute(
            "UPDATE accounts SET balance = balance - $2 WHERE id = $1 AND balance >= $2",
            &[&account, &amount],
        )
        .await?;
    let applied = if debited == 1 {
        Applied::Now(format!("paid {amount} from {account} with token {token}"))
    } else {
        Applied::Declined(format!("declined: {account} does not cover {amount}"))
    };
    let (Applied::Now(result) | Applied::Declined(result)) = &applied else {
        unreachable!("set just above");
    };
    tx.execute(
        "UPDATE payments SET account = $2, amount = $3, result = $4 WHERE id = $1",
        &[&id, &account, &amount, result],
    )
    .await?;
    tx.commit().await?;
    Ok(applied)
}

/// Connects to `url` and drives the connection on its own task.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// How many payment rows were applied (carry a result), and the account's balance.
pub async fn totals(
    db: &tokio_postgres::Client,
    account: i64,
) -> Result<(i64, i64), tokio_postgres::Error> {
    let applied: i64 = db
        .query_one(
            "SELECT COUNT(*) FROM payments WHERE result IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    let balance: i64 = db
        .query_one("SELECT balance FROM accounts WHERE id = $1", &[&account])
        .await?
        .get(0);
    Ok((applied, balance))
}

/// The result stored with payment `id`, if it was applied.
pub async fn stored_result(
    db: &tokio_postgres::Client,
    id: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    Ok(db
        .query_opt("SELECT result FROM payments WHERE id = $1", &[&id])
        .await?
        .and_then(|row| row.get(0)))
}
