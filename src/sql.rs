//! Fenced writes to SQL databases, and a guide to fencing any other storage.
//!
//! A lease cannot stop a holder that pauses (GC, page fault, `SIGSTOP`) past it and then writes
//! as if it still held the lock. The storage can: every acquisition gets a larger
//! [`FencingToken`], and a store that refuses writes carrying a token older than the newest it
//! has accepted turns the late writer away. This module is the guide to doing that in SQL, plus
//! a few dependency-free helpers that read the result for you. It works with any driver
//! (`rusqlite`, `tokio-postgres`, `sqlx`, `diesel`, ...): you run the statements, it tells you
//! what happened.
//!
//! # The guarantee
//!
//! A write to a row is applied only if its token is **greater than or equal to** the highest
//! token accepted so far for that row, and the check, the write and recording the new
//! high-water mark happen **in one statement**, so nothing can slip in between.
//!
//! # The schema
//!
//! Put a `fence` column on the row that the lock protects:
//!
//! ```sql
//! CREATE TABLE accounts (
//!     id      BIGINT PRIMARY KEY,
//!     balance BIGINT NOT NULL,
//!     fence   BIGINT NOT NULL DEFAULT 0   -- the highest fencing token that wrote this row
//! );
//! -- or, for an existing table (SQLite and PostgreSQL alike):
//! ALTER TABLE accounts ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
//! ```
//!
//! `BIGINT`, not `INTEGER`: PostgreSQL's `INTEGER` has 32 bits and tokens need 53 (they start
//! from the Redis server's clock in microseconds). Bind the token with [`fence_param`]: an
//! `i64`, exact for every token fencelock issues.
//!
//! # The statements
//!
//! A fenced update (PostgreSQL numbering; in SQLite write `?1`, `?2`, `?3`):
//!
//! ```sql
//! UPDATE accounts SET balance = $2, fence = $3 WHERE id = $1 AND fence <= $3
//! ```
//!
//! In SQLite use `?NNN` placeholders: there `$1` is a *named* parameter, numbered by first
//! appearance, so `SET balance = $2 ... WHERE id = $1` would bind your first value to `$2`.
//!
//! A fenced insert-or-update, for rows that may not exist yet (PostgreSQL, and SQLite since
//! 3.24):
//!
//! ```sql
//! INSERT INTO accounts (id, balance, fence) VALUES ($1, $2, $3)
//! ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, fence = excluded.fence
//! WHERE accounts.fence <= excluded.fence
//! ```
//!
//! A fenced read-modify-write. Reads are not checked, and a check at write time alone is not
//! enough: if the new holder reads *before* a paused holder's late write lands (the row's fence
//! is still the old token, so that write is accepted), the new holder's own write then
//! overwrites it, computed from data that did not include it, and an update is lost. So the
//! first statement of a critical section **claims** the row, raising its fence to your token,
//! and reads it in the same statement (`RETURNING`: PostgreSQL, SQLite since 3.35):
//!
//! ```sql
//! UPDATE accounts SET fence = $2 WHERE id = $1 AND fence <= $2 RETURNING balance
//! -- ... compute ...
//! UPDATE accounts SET balance = $3, fence = $2 WHERE id = $1 AND fence <= $2
//! ```
//!
//! From the claim on, every older token is refused, and everything accepted before it is in
//! what you read. (Doing the claim, the read and the write in one transaction works too.)
//!
//! Appending to a ledger (or writing other tables) under the lock: one transaction, the fenced
//! update of the guarded row **first**, the other writes only if it was applied, and a rollback
//! otherwise:
//!
//! ```sql
//! BEGIN;
//! UPDATE accounts SET balance = balance - $2, fence = $3 WHERE id = $1 AND fence <= $3;
//! -- 1 row: go on. 0 rows: ROLLBACK, and read the outcome (below).
//! INSERT INTO ledger (account, amount, token) VALUES ($1, $2, $3);
//! COMMIT;
//! ```
//!
//! Going first also makes the update take the row lock, so a concurrent transaction of an older
//! holder waits for yours and is then refused.
//!
//! # Reading the outcome
//!
//! The number of rows the statement affected (returned, for `RETURNING`) decides:
//!
//! - **1**: the write was applied ([`FenceOutcome::Applied`]).
//! - **0**: nothing was written. Read the row's fence in a *new* statement
//!   (`SELECT fence FROM accounts WHERE id = $1`, in the same transaction if there is one),
//!   and [`fenced_outcome`] tells apart:
//!   - [`FenceOutcome::Stale`]: a newer token has written. It carries both tokens;
//!     [`into_result`][`FenceOutcome::into_result`] turns it into [`Error::StaleToken`].
//!   - [`FenceOutcome::Missing`]: there is no such row.
//!   - [`FenceOutcome::NotMatched`]: the fence admits the token, but a condition of your own
//!     in the `WHERE` clause did not hold.
//!
//! The second read only classifies; it never decides whether to write, so it cannot race.
//!
//! ```
//! use fencelock::sql::{fence_param, fenced_outcome, FenceOutcome};
//! use fencelock::FencingToken;
//! use rusqlite::{params, Connection, OptionalExtension};
//!
//! fn set_balance(
//!     db: &Connection,
//!     id: i64,
//!     balance: i64,
//!     token: FencingToken,
//! ) -> rusqlite::Result<FenceOutcome> {
//!     let rows = db.execute(
//!         "UPDATE accounts SET balance = ?2, fence = ?3 WHERE id = ?1 AND fence <= ?3",
//!         params![id, balance, fence_param(token)],
//!     )?;
//!     fenced_outcome(rows as u64, token, || {
//!         db.query_row("SELECT fence FROM accounts WHERE id = ?1", [id], |row| row.get(0))
//!             .optional()
//!     })
//! }
//!
//! let db = Connection::open_in_memory()?;
//! db.execute_batch(
//!     "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL,
//!                             fence BIGINT NOT NULL DEFAULT 0);
//!      INSERT INTO accounts (id, balance) VALUES (42, 1000);",
//! )?;
//! let old = FencingToken::new(1_733_000_000_000_001).unwrap();
//! let new = FencingToken::new(1_733_000_000_000_002).unwrap();
//!
//! assert_eq!(set_balance(&db, 42, 900, new)?, FenceOutcome::Applied);
//! assert_eq!(set_balance(&db, 42, 800, new)?, FenceOutcome::Applied); // same token: fine
//! assert_eq!(
//!     set_balance(&db, 42, 1, old)?,              // a paused holder wakes up
//!     FenceOutcome::Stale { presented: old, latest: new },
//! );
//! assert_eq!(set_balance(&db, 7, 1, new)?, FenceOutcome::Missing);
//! assert!(set_balance(&db, 42, 1, old)?.into_result().unwrap_err().is_stale_token());
//! let balance: i64 =
//!     db.query_row("SELECT balance FROM accounts WHERE id = 42", [], |r| r.get(0))?;
//! assert_eq!(balance, 800);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With an async driver, [`fenced_outcome_async`] takes a closure that returns a future:
//!
//! ```no_run
//! use fencelock::sql::{fence_param, fenced_outcome_async, FenceOutcome};
//! use fencelock::FencingToken;
//!
//! async fn debit(
//!     tx: &tokio_postgres::Transaction<'_>,
//!     id: i64,
//!     cents: i64,
//!     token: FencingToken,
//! ) -> Result<FenceOutcome, tokio_postgres::Error> {
//!     let rows = tx
//!         .execute(
//!             "UPDATE accounts SET balance = balance - $2, fence = $3 \
//!              WHERE id = $1 AND fence <= $3",
//!             &[&id, &cents, &fence_param(token)],
//!         )
//!         .await?;
//!     fenced_outcome_async(rows, token, || async move {
//!         let row = tx.query_opt("SELECT fence FROM accounts WHERE id = $1", &[&id]).await?;
//!         Ok(row.map(|row| row.get(0)))
//!     })
//!     .await
//! }
//! ```
//!
//! The repository's `examples/sql_fencing.rs` runs the whole story with a real lock, and
//! `tests/storage/sql_fencing.rs` runs it on SQLite and PostgreSQL.
//!
//! # Pitfalls
//!
//! - **Never `fence < $token`.** An equal token must pass: one holder writes many times with
//!   the same token (and a re-entered guard has its outer guard's token). With `<` a holder's
//!   second write is refused.
//! - **Never compare in application code** (`SELECT fence`, compare, then `UPDATE`). Another
//!   holder can write between your check and your write; the comparison must be in the
//!   `WHERE` clause of the statement that writes.
//! - **Put the fence on the row you mutate**, or, when a write spans rows or tables, on one row
//!   (the aggregate root) that every such transaction updates first (the ledger pattern above).
//!   A fence in a separate table that is read but not updated in the transaction protects
//!   nothing.
//! - **One lock per row or aggregate.** Tokens are ordered per lock name only; a row written
//!   under two different lock names compares unrelated numbers.
//! - **Claim before you read** in a read-modify-write (above), or read and write in one
//!   transaction that starts with the fenced update.
//! - **Transactions**: everything a critical section writes goes into the transaction of the
//!   fenced update, and anything but [`FenceOutcome::Applied`] rolls back. In PostgreSQL's
//!   default `READ COMMITTED` an update that waited for a newer holder's transaction re-checks
//!   its `WHERE` against the committed row and is refused; under `REPEATABLE READ` or
//!   `SERIALIZABLE` it fails with SQLSTATE `40001` instead: roll back, and do not retry with
//!   the old token.
//! - **Read the fence in its own statement** after a 0, not in a CTE or subquery of the
//!   update: those see the snapshot from before a concurrent newer write, and a stale write
//!   would look like [`NotMatched`][`FenceOutcome::NotMatched`].
//! - **Do not delete fenced rows** if older holders may still be about: the high-water mark
//!   goes with the row, and a stale upsert would recreate it. Mark the row deleted instead
//!   (`SET deleted = true, fence = $t WHERE ... AND fence <= $t`).
//! - **MySQL** reports *changed* rows, not matched ones, so a fenced update that writes the
//!   values already there reports 0; connect with `CLIENT_FOUND_ROWS` to count matched rows.
//!
//! # Fencing any other storage
//!
//! The recipe is the same for every store; only the conditional write differs.
//!
//! 1. **Store** the highest accepted token next to the data, in the unit the store writes
//!    atomically (the row, the document, the key's record).
//! 2. **Compare** `presented >= stored` inside that atomic write (a conditional update, a
//!    compare-and-set, a transaction with a condition), and store the presented token with
//!    the data. Equal passes. Never check first and write second.
//! 3. **Return** a distinct "stale" result carrying the presented and the latest token, and
//!    make the writer stop: its lock is gone. In Rust, [`Error::StaleToken`].
//!
//! Examples:
//!
//! - **An HTTP API** that does the writes: the client sends its token in a request header
//!   (say `Fencing-Token: 1733145600123456`); the server runs the fenced statement above and
//!   answers `409 Conflict` with the latest token in the body when it was stale. Versions
//!   and `If-Match`/ETags are a different check (equality with the version you read, for
//!   optimistic concurrency): they do not stop a holder that paused before reading. Use the
//!   token for "who may write", the version for "based on what".
//! - **A message queue**: the queue is rarely where the effect lands, so fence where it does.
//!   The producer puts the token (and the lock name) into each message; the consumer that
//!   applies messages keeps the high-water mark per lock name in its own store and applies
//!   each message with the fenced statement (or drops it as stale). A late message from a
//!   paused producer is then refused even though the queue accepted it.
//! - **A key-value or document store** with conditional writes: condition on the stored
//!   token, for example `attribute_not_exists(fence) OR fence <= :token` in a DynamoDB
//!   `ConditionExpression`. A store that compares strings needs fixed-width tokens: pad to 16
//!   digits (every token is below 2<sup>53</sup>, which has 16).
//! - **Redis**: [`LockClient::resource`](crate::LockClient::resource) gives a
//!   [`FencedResource`](crate::FencedResource), which does this in a server-side script.
//!
//! [`fence_param`]: crate::sql::fence_param
//! [`fenced_outcome`]: crate::sql::fenced_outcome
//! [`fenced_outcome_async`]: crate::sql::fenced_outcome_async
//! [`FenceOutcome::Applied`]: crate::sql::FenceOutcome::Applied
//! [`FenceOutcome::Stale`]: crate::sql::FenceOutcome::Stale
//! [`FenceOutcome::Missing`]: crate::sql::FenceOutcome::Missing
//! [`FenceOutcome::NotMatched`]: crate::sql::FenceOutcome::NotMatched
//! [`FenceOutcome::into_result`]: crate::sql::FenceOutcome::into_result

use std::future::Future;

use crate::{Error, FencingToken, Superseded};

/// The token as the `BIGINT` to bind as the statement's token parameter and store in the
/// `fence` column.
///
/// Exact for every token fencelock issues (they are below 2<sup>53</sup>). A token built by
/// hand above `i64::MAX` saturates to `i64::MAX`, so it still compares as the largest.
///
/// ```
/// use fencelock::{sql::fence_param, FencingToken};
///
/// let token = FencingToken::new(1_733_145_600_123_456).unwrap();
/// assert_eq!(fence_param(token), 1_733_145_600_123_456_i64);
/// ```
pub fn fence_param(token: FencingToken) -> i64 {
    i64::try_from(token.get()).unwrap_or(i64::MAX)
}

/// A value read from a `fence` column as a token: `None` for 0 (the column's default: no
/// fenced write yet) and negative values.
///
/// ```
/// use fencelock::sql::token_from_fence;
///
/// assert_eq!(token_from_fence(42).map(|t| t.get()), Some(42));
/// assert_eq!(token_from_fence(0), None);
/// ```
pub fn token_from_fence(fence: i64) -> Option<FencingToken> {
    u64::try_from(fence).ok().and_then(FencingToken::new)
}

/// What a fenced SQL statement did, as told by [`fenced_outcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "a fenced write may have been refused; check the outcome"]
pub enum FenceOutcome {
    /// The write was applied and the row's fence is now the presented token.
    Applied,
    /// Nothing was written: a newer token has written to the row. The writer has lost its lock
    /// and must stop (roll back its transaction).
    Stale {
        /// The token the refused write carried.
        presented: FencingToken,
        /// The row's fence: the highest token it has accepted.
        latest: FencingToken,
    },
    /// Nothing was written: no row has this key. Insert it with the fenced upsert if that is
    /// what you meant.
    Missing,
    /// Nothing was written, although the row exists and its fence admits the token: another
    /// condition in the statement's `WHERE` clause did not hold (for example
    /// `AND balance >= $amount`), or the row was inserted by someone else just after the
    /// statement found none.
    NotMatched,
}

impl FenceOutcome {
    /// Reads the outcome from the number of rows the fenced statement affected and, when that
    /// is 0, the fence of the row read afterwards (`None` if there is no such row).
    ///
    /// Any number of rows above 0 counts as applied (MySQL reports 2 for an upsert that
    /// updated). `latest_fence` is ignored then, so pass `None` when you skipped the read.
    ///
    /// ```
    /// use fencelock::sql::FenceOutcome;
    /// use fencelock::FencingToken;
    ///
    /// let t = FencingToken::new(10).unwrap();
    /// assert_eq!(FenceOutcome::from_rows(1, t, None), FenceOutcome::Applied);
    /// assert_eq!(FenceOutcome::from_rows(0, t, None), FenceOutcome::Missing);
    /// assert_eq!(
    ///     FenceOutcome::from_rows(0, t, Some(11)),
    ///     FenceOutcome::Stale { presented: t, latest: FencingToken::new(11).unwrap() },
    /// );
    /// assert_eq!(FenceOutcome::from_rows(0, t, Some(10)), FenceOutcome::NotMatched);
    /// ```
    pub fn from_rows(
        rows_affected: u64,
        presented: FencingToken,
        latest_fence: Option<i64>,
    ) -> FenceOutcome {
        if rows_affected > 0 {
            return FenceOutcome::Applied;
        }
        match latest_fence {
            None => FenceOutcome::Missing,
            Some(fence) => match token_from_fence(fence) {
                Some(latest) if latest > presented => FenceOutcome::Stale { presented, latest },
                _ => FenceOutcome::NotMatched,
            },
        }
    }

    /// Whether the write was applied.
    pub fn is_applied(&self) -> bool {
        matches!(self, FenceOutcome::Applied)
    }

    /// Whether a newer token has written to the row.
    pub fn is_stale(&self) -> bool {
        matches!(self, FenceOutcome::Stale { .. })
    }

    /// The outcome in fencelock's error type, for `?`: `Ok(true)` when applied, `Ok(false)` when
    /// no row matched ([`Missing`](Self::Missing) or [`NotMatched`](Self::NotMatched): nothing
    /// written), and [`Error::StaleToken`] with both tokens when stale.
    ///
    /// ```
    /// use fencelock::sql::FenceOutcome;
    /// use fencelock::{Error, FencingToken};
    ///
    /// let (presented, latest) = (FencingToken::new(5).unwrap(), FencingToken::new(6).unwrap());
    /// assert!(FenceOutcome::Applied.into_result().unwrap());
    /// assert!(!FenceOutcome::Missing.into_result().unwrap());
    /// let err = FenceOutcome::Stale { presented, latest }.into_result().unwrap_err();
    /// assert!(matches!(err, Error::StaleToken { .. }));
    /// ```
    pub fn into_result(self) -> Result<bool, Error> {
        match self {
            FenceOutcome::Applied => Ok(true),
            FenceOutcome::Missing | FenceOutcome::NotMatched => Ok(false),
            // Unnamed: only the caller knows which row it wrote.
            FenceOutcome::Stale { presented, latest } => Err(Error::stale(
                b"",
                presented,
                latest,
                Superseded::WroteOrClaimed,
            )),
        }
    }
}

/// Reads the outcome of a fenced statement: `rows_affected` is what the driver reported for it
/// (rows returned, for `UPDATE ... RETURNING`), and `latest_fence` reads the row's fence
/// (`SELECT fence FROM t WHERE id = $1`, `Ok(None)` for no row). It is called only when no row
/// was affected, so the common case costs no second statement.
///
/// See the [module docs](self) for the statements and an example; [`fenced_outcome_async`]
/// is the same for async drivers.
///
/// # Errors
/// Whatever `latest_fence` returns.
pub fn fenced_outcome<E>(
    rows_affected: u64,
    presented: FencingToken,
    latest_fence: impl FnOnce() -> Result<Option<i64>, E>,
) -> Result<FenceOutcome, E> {
    let latest = if rows_affected > 0 {
        None
    } else {
        latest_fence()?
    };
    Ok(FenceOutcome::from_rows(rows_affected, presented, latest))
}

/// [`fenced_outcome`] for async drivers: `latest_fence` returns a future, which is run only
/// when no row was affected.
///
/// # Errors
/// Whatever the future returns.
///
/// # Cancel safety
/// As cancel safe as the future `latest_fence` returns, its only await: this function
/// changes nothing itself (the fenced statement ran before it was called).
pub async fn fenced_outcome_async<E, F>(
    rows_affected: u64,
    presented: FencingToken,
    latest_fence: impl FnOnce() -> F,
) -> Result<FenceOutcome, E>
where
    F: Future<Output = Result<Option<i64>, E>>,
{
    let latest = if rows_affected > 0 {
        None
    } else {
        latest_fence().await?
    };
    Ok(FenceOutcome::from_rows(rows_affected, presented, latest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(raw: u64) -> FencingToken {
        FencingToken::new(raw).unwrap()
    }

    #[test]
    fn rows_decide_first_and_the_fence_tells_zero_rows_apart() {
        let t = token(100);
        assert_eq!(
            FenceOutcome::from_rows(1, t, Some(500)),
            FenceOutcome::Applied
        );
        assert_eq!(FenceOutcome::from_rows(2, t, None), FenceOutcome::Applied);
        assert_eq!(FenceOutcome::from_rows(0, t, None), FenceOutcome::Missing);
        assert_eq!(
            FenceOutcome::from_rows(0, t, Some(101)),
            FenceOutcome::Stale {
                presented: t,
                latest: token(101)
            }
        );
        for fence in [100, 99, 0, -1, i64::MIN] {
            assert_eq!(
                FenceOutcome::from_rows(0, t, Some(fence)),
                FenceOutcome::NotMatched,
                "{fence}"
            );
        }
    }

    #[test]
    fn the_fence_is_read_only_when_nothing_was_written() {
        let t = token(7);
        let applied = fenced_outcome::<()>(1, t, || panic!("must not read")).unwrap();
        assert!(applied.is_applied());
        assert!(!applied.is_stale());
        let stale = fenced_outcome::<()>(0, t, || Ok(Some(8))).unwrap();
        assert!(stale.is_stale());
        assert!(!stale.is_applied());
        for not_written in [FenceOutcome::Missing, FenceOutcome::NotMatched] {
            assert!(!not_written.is_stale(), "{not_written:?}");
            assert!(!not_written.is_applied(), "{not_written:?}");
        }
        assert_eq!(fenced_outcome(0, t, || Err("db down")), Err("db down"));
    }

    #[tokio::test]
    async fn the_async_variant_reads_the_same_way() {
        let t = token(7);
        let applied =
            fenced_outcome_async::<(), _>(1, t, || async { panic!("must not read") }).await;
        assert_eq!(applied, Ok(FenceOutcome::Applied));
        let missing = fenced_outcome_async::<(), _>(0, t, || async { Ok(None) }).await;
        assert_eq!(missing, Ok(FenceOutcome::Missing));
    }

    #[test]
    fn outcomes_map_onto_the_crate_error() {
        assert!(FenceOutcome::Applied.into_result().unwrap());
        assert!(!FenceOutcome::NotMatched.into_result().unwrap());
        match (FenceOutcome::Stale {
            presented: token(1),
            latest: token(2),
        })
        .into_result()
        {
            Err(Error::StaleToken {
                presented, latest, ..
            }) => {
                assert_eq!((presented.get(), latest.get()), (1, 2));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tokens_convert_exactly_and_saturate_beyond_i64() {
        let max_issued = (1u64 << 53) - 1;
        assert_eq!(
            fence_param(token(max_issued)),
            i64::try_from(max_issued).unwrap()
        );
        assert_eq!(fence_param(token(u64::MAX)), i64::MAX);
        assert_eq!(
            token_from_fence(i64::try_from(max_issued).unwrap()),
            Some(token(max_issued))
        );
        assert_eq!(token_from_fence(-5), None);
    }
}
