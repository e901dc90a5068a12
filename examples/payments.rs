//! Process a payment once: idempotency keys in Redis, a PostgreSQL ledger behind them.
//!
//! ```text
//! cargo run --example payments
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --example payments
//! ```
//!
//! Four workers take 60 payment requests from a queue that delivers many of them twice or
//! three times (a client's retry after a timeout, a redelivered message), and some first tries
//! fail on the way (a timeout to the payment provider: the key is left to a retry). Each
//! request runs under its payment id as the idempotency key, with a fingerprint of what it
//! asks for; the run applies the payment in PostgreSQL in one transaction fenced by the run's
//! token (`examples/support/ledger.rs`), and its result is stored with the key. Duplicates
//! that arrive while the payment runs wait for its outcome; later ones are answered from the
//! key's record. One request reuses a payment id for another amount and is refused.
//!
//! PostgreSQL is a throwaway server on a free loopback port (its binaries are found as
//! `fencelock_testing::PostgresServer` says; `scripts/ensure-postgres` installs them). Redis
//! is a throwaway `redis-server` unless `REDIS_URL` is set (then a fresh key prefix, deleted
//! at the end). Exit status 0 when every payment was applied exactly once and every answer
//! equals the result stored in the database, 1 otherwise.

#[path = "support/ledger.rs"]
mod ledger;
mod support;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use fencelock::{Error, Failure, IdempotencyOptions, LockClient, Processed};
use fencelock_testing::PostgresServer;
use ledger::Applied;
use support::{BoxError, ExampleRedis};
use tokio::sync::Mutex;

const ACCOUNT: i64 = 7;
const PAYMENTS: u64 = 60;
const WORKERS: usize = 4;

/// One request as it arrives: the payment id (the idempotency key), its amount, and whether
/// this delivery's call to the provider times out.
#[derive(Clone, Debug)]
struct Request {
    id: String,
    amount: i64,
    times_out: bool,
}

/// 60 payments of 1..=60, each delivered 1 to 3 times in a shuffled order; every fifth
/// payment's first delivery times out.
fn deliveries() -> Vec<Request> {
    let mut queue = Vec::new();
    for n in 1..=PAYMENTS {
        let copies = 1 + n % 3;
        for copy in 0..copies {
            queue.push(Request {
                id: format!("pay-{n:03}"),
                amount: i64::try_from(n).unwrap_or(0),
                times_out: n % 5 == 0 && copy == 0,
            });
        }
    }
    // A fixed shuffle (a linear congruential walk): the same run every time.
    let len = queue.len();
    let mut state = 17usize;
    for i in (1..len).rev() {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345) % 2_147_483_648;
        queue.swap(i, state % (i + 1));
    }
    queue
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("payments: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, BoxError> {
    let redis = ExampleRedis::from_env()?;
    let postgres = PostgresServer::start()
        .map_err(|err| format!("could not start a throwaway PostgreSQL: {err}"))?;
    println!(
        "payments: {} and PostgreSQL on 127.0.0.1:{}",
        redis.describe(),
        postgres.port()
    );
    let db = ledger::connect(&postgres.url()).await?;
    db.batch_execute(ledger::SCHEMA).await?;
    db.execute(
        "INSERT INTO accounts (id, balance) VALUES ($1, 100000)",
        &[&ACCOUNT],
    )
    .await?;

    let client = LockClient::builder(redis.url())
        .prefix(redis.prefix())
        .connect()
        .await?;
    // A run holds its key for at most 10 s; a duplicate waits up to 5 s for a run's outcome.
    let options =
        IdempotencyOptions::new(Duration::from_secs(10)).wait_for_outcome(Duration::from_secs(5));
    let payments = client.idempotency("payments", options)?;

    let queue = Arc::new(Mutex::new(deliveries()));
    let answers = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (payments, queue, answers) = (payments.clone(), queue.clone(), answers.clone());
        let mut db = ledger::connect(&postgres.url()).await?;
        workers.push(tokio::spawn(async move {
            loop {
                let Some(request) = queue.lock().await.pop() else {
                    return Ok::<(), BoxError>(());
                };
                let answer = process(&payments, &mut db, &request).await?;
                match answer {
                    Some(answer) => answers.lock().await.push((request.id, answer)),
                    // Timed out, or still running elsewhere: the client sends it again.
                    None => queue.lock().await.insert(
                        0,
                        Request {
                            times_out: false,
                            ..request
                        },
                    ),
                }
            }
        }));
    }
    for worker in workers {
        worker.await??;
    }

    // A payment id reused for another amount: refused, nothing runs.
    let reused = payments
        .run("pay-001", "account=7 amount=999", |_run| async {
            Ok::<_, Failure<String>>(b"must not run".to_vec())
        })
        .await;
    let refused = matches!(reused, Err(Error::KeyReused { .. }));
    println!("payments: pay-001 reused for another amount: refused ({refused})");

    let (applied, balance) = ledger::totals(&db, ACCOUNT).await?;
    let expected_total: i64 = (1..=i64::try_from(PAYMENTS)?).sum();
    let mut consistent = true;
    let answers = answers.lock().await;
    let mut per_payment: HashMap<&str, usize> = HashMap::new();
    for (id, answer) in answers.iter() {
        *per_payment.entry(id).or_default() += 1;
        if ledger::stored_result(&db, id).await?.as_deref() != Some(answer.as_str()) {
            println!("payments: {id} was answered {answer:?}, unlike the database");
            consistent = false;
        }
    }
    println!(
        "payments: {} answers to {} payments; {applied} applied in the ledger, balance {balance} \
         (100000 - {expected_total} expected)",
        answers.len(),
        per_payment.len()
    );
    let once = applied == i64::try_from(PAYMENTS)? && balance == 100_000 - expected_total;
    println!(
        "payments: each payment applied exactly once: {once}; every answer equals the stored \
         result: {consistent}"
    );
    redis.cleanup()?;
    Ok(once && consistent && refused)
}

/// One delivery of a request: its answer, or `None` when the client must send it again (the
/// provider timed out, or another worker's run of it was still going after the wait).
async fn process(
    payments: &fencelock::Idempotency,
    db: &mut tokio_postgres::Client,
    request: &Request,
) -> Result<Option<String>, BoxError> {
    let fingerprint = format!("account={ACCOUNT} amount={}", request.amount);
    let outcome = payments
        .run(&request.id, fingerprint, |run| async move {
            if request.times_out {
                return Err(Failure::Retry("the payment provider timed out".to_owned()));
            }
            let applied = ledger::apply(db, &request.id, ACCOUNT, request.amount, run.token())
                .await
                .map_err(|err| Failure::Retry(err.to_string()))?;
            match applied {
                Applied::Now(result) | Applied::Before(result) => Ok(result.into_bytes()),
                Applied::Declined(result) => Err(Failure::Final {
                    result: result.clone().into_bytes(),
                    error: result,
                }),
                Applied::Stale => Err(Failure::Retry("a newer run holds the payment".into())),
            }
        })
        .await?;
    Ok(match outcome {
        Processed::Ran {
            output: Err(Failure::Retry(_)),
            ..
        }
        | Processed::InProgress(_) => None,
        Processed::Abandoned(record) => {
            return Err(format!("payment {} was given up: {record:?}", request.id).into())
        }
        other => Some(String::from_utf8(
            other.result().unwrap_or_default().to_vec(),
        )?),
    })
}
