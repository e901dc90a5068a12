//! Account transfers with a multi-lock: 16 tasks move money between two accounts, half of them
//! from Alice to Bob and half from Bob to Alice, at the same time. Each transfer locks *both*
//! accounts as one (`LockClient::multi_lock`), reads both balances with the locks' fencing
//! tokens (claiming them), and writes both with fenced increments: two writes, not one
//! transaction (see `transfer` below for what that means when a lock is lost in between).
//!
//! ```text
//! cargo run --example transfer
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --example transfer
//! ```
//!
//! Taking two locks one after the other in "from, to" order is the classic deadlock: one task
//! holds Alice and waits for Bob while the other holds Bob and waits for Alice. A multi-lock
//! takes both or neither, always in one global order, so opposite transfers cannot deadlock;
//! every acquire here has a deadline, and a single timeout fails the run.
//!
//! Without `REDIS_URL` it starts a throwaway `redis-server` on a free loopback port; with it,
//! it uses that server under a fresh key prefix and deletes its keys at the end. Exit status 0
//! when every transfer completed and no money was created or lost, 1 otherwise.

mod support;

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::{Error, LockClient};
use support::{BoxError, ExampleRedis};

const ACCOUNTS: [&str; 2] = ["alice", "bob"];
const OPENING_BALANCE: i64 = 10_000;
const TASKS_PER_DIRECTION: usize = 8;
const TRANSFERS_PER_TASK: usize = 25;
/// A deadlock would show up as a timeout; contention alone stays far below this.
const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let redis = ExampleRedis::from_env()?;
    let (url, prefix) = (redis.url().to_owned(), redis.prefix().to_owned());
    // Two clients, as two app servers would have.
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(
            LockClient::builder(url.clone())
                .prefix(&prefix)
                .connect()
                .await?,
        );
    }

    // Opening balances, written under the locks like everything else.
    let both = clients[0].multi_lock(ACCOUNTS.map(account_lock))?;
    let guard = both.acquire_timeout(DEADLINE).await?;
    for account in ACCOUNTS {
        let token = guard.token(account_lock(account)).expect("member");
        clients[0]
            .resource(balance(account))?
            .set(token, OPENING_BALANCE.to_string())
            .await?;
    }
    guard.release().await?;
    println!(
        "alice and bob open with {OPENING_BALANCE} each; {TASKS_PER_DIRECTION} tasks send \
         alice->bob and {TASKS_PER_DIRECTION} bob->alice, {TRANSFERS_PER_TASK} transfers each"
    );

    let started = Instant::now();
    let done = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..2 * TASKS_PER_DIRECTION {
        let client = clients[task % 2].clone();
        let (from, to) = if task < TASKS_PER_DIRECTION {
            (ACCOUNTS[0], ACCOUNTS[1])
        } else {
            (ACCOUNTS[1], ACCOUNTS[0])
        };
        let (done, refused) = (done.clone(), refused.clone());
        tasks.spawn(async move {
            for n in 0..TRANSFERS_PER_TASK {
                let amount = (task * 7 + n) as i64 % 50 + 1;
                if transfer(&client, from, to, amount).await? {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<_, Error>(())
        });
    }
    let mut failures = 0;
    while let Some(joined) = tasks.join_next().await {
        if let Err(err) = joined? {
            eprintln!("a transfer task failed: {err}");
            failures += 1;
        }
    }

    let mut total = 0;
    for account in ACCOUNTS {
        let cents = clients[0]
            .resource(balance(account))?
            .peek_i64()
            .await?
            .unwrap_or(0);
        println!("{account}: {cents}");
        total += cents;
    }
    let (done, refused) = (
        done.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    println!(
        "{done} transfers done, {refused} refused for lack of funds, in {:.2?}; total {total}",
        started.elapsed()
    );

    redis.cleanup()?;
    let expected = (2 * TASKS_PER_DIRECTION * TRANSFERS_PER_TASK) as u64;
    let ok = failures == 0
        && done + refused == expected
        && total == OPENING_BALANCE * ACCOUNTS.len() as i64;
    println!("{}", if ok { "PASS" } else { "FAIL" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Moves `amount` from `from` to `to` if `from` has it; `false` when it has not.
async fn transfer(client: &LockClient, from: &str, to: &str, amount: i64) -> Result<bool, Error> {
    // The order the names are given in does not matter: the set is taken in one global order.
    let both = client.multi_lock([account_lock(from), account_lock(to)])?;
    let guard = both.acquire_timeout(DEADLINE).await?;
    let from_token = guard.token(account_lock(from)).expect("member");
    let to_token = guard.token(account_lock(to)).expect("member");
    let (from_balance, to_balance) = (
        client.resource(balance(from))?,
        client.resource(balance(to))?,
    );

    // Reading with the tokens claims both balances: no older holder can write after this.
    let have = from_balance.get_i64(from_token).await?.unwrap_or(0);
    to_balance.claim(to_token).await?;
    let moved = have >= amount;
    if moved {
        // Two calls, not one transaction: a lock lost between them (a pause past the lease, an
        // operator's eviction) leaves the debit applied and the credit refused, and this run
        // then reports money lost. Money that must move in one step is written in one
        // database transaction, each row fenced (examples/sql_fencing.rs).
        from_balance.incr_by(from_token, -amount).await?;
        to_balance.incr_by(to_token, amount).await?;
    }
    guard.release().await?;
    Ok(moved)
}

fn account_lock(account: &str) -> String {
    format!("account:{account}")
}

fn balance(account: &str) -> String {
    format!("balance:{account}")
}
