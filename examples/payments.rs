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
//! key's record. Each outcome is answered as a payment API answers it, with the README's
//! mapping (`http_answer`: 200 charged, 402 declined for good, 409 in progress and 503 not
//! charged, both retried by the client with the same key), never an empty success. One request
//! reuses a payment id for another amount and is refused with 422.
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
    let answers = Arc::new(Mutex::new(Vec::<(String, u16, String)>::new()));
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (payments, queue, answers) = (payments.clone(), queue.clone(), answers.clone());
        let mut db = ledger::connect(&postgres.url()).await?;
        workers.push(tokio::spawn(async move {
            loop {
                let Some(request) = queue.lock().await.pop() else {
                    return Ok::<(), BoxError>(());
                };
                match process(&payments, &mut db, &request).await? {
                    // Answered: charged, or declined for good.
                    (status @ (200 | 402), body) => {
                        let answer = String::from_utf8(body)?;
                        answers.lock().await.push((request.id, status, answer));
                    }
                    // Not charged (timed out), or still running elsewhere: the client sends
                    // it again with the same key.
                    (503 | 409, _) => queue.lock().await.insert(
                        0,
                        Request {
                            times_out: false,
                            ..request
                        },
                    ),
                    (status, body) => {
                        let body = String::from_utf8_lossy(&body).into_owned();
                        return Err(format!("{}: answered {status} {body}", request.id).into());
                    }
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
    let (status, _) = http_answer(reused)?;
    let refused = status == 422;
    println!("payments: pay-001 reused for another amount: answered {status}");

    let (applied, balance) = ledger::totals(&db, ACCOUNT).await?;
    let expected_total: i64 = (1..=i64::try_from(PAYMENTS)?).sum();
    let mut consistent = true;
    let answers = answers.lock().await;
    let mut per_payment: HashMap<&str, usize> = HashMap::new();
    for (id, status, answer) in answers.iter() {
        *per_payment.entry(id).or_default() += 1;
        if ledger::stored_result(&db, id).await?.as_deref() != Some(answer.as_str()) {
            println!("payments: {id} was answered {status} {answer:?}, unlike the database");
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

/// One delivery of a request, answered as an HTTP service answers it ([`http_answer`]).
async fn process(
    payments: &fencelock::Idempotency,
    db: &mut tokio_postgres::Client,
    request: &Request,
) -> Result<(u16, Vec<u8>), Error> {
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
        .await;
    http_answer(outcome)
}

/// How a payment API answers each outcome of its idempotency key (the README's mapping): the
/// status code and the body. Never an empty success: a run that left the key to a retry
/// charged nothing and says so.
fn http_answer<E>(outcome: Result<Processed<E>, Error>) -> Result<(u16, Vec<u8>), Error> {
    let answer = |status, body: &[u8]| Ok((status, body.to_vec()));
    match outcome {
        // Charged, by this call or an earlier one: the stored answer.
        Ok(Processed::Ran {
            output: Ok(body), ..
        }) => answer(200, &body),
        Ok(Processed::Completed(record)) if !record.is_final_failure() => {
            answer(200, record.result().unwrap_or_default())
        }
        // A failure stored as the key's answer (`Failure::Final`: a declined payment).
        Ok(Processed::Ran {
            output: Err(Failure::Final { result, .. }),
            ..
        }) => answer(402, &result),
        Ok(Processed::Completed(record)) => answer(402, record.result().unwrap_or_default()),
        // Not charged, and the key is free for the client's retry with the same key.
        Ok(Processed::Ran {
            output: Err(Failure::Retry(_)),
            ..
        }) => answer(503, b"{\"status\":\"not charged, retry\"}"),
        // Another call is running it: the client retries later and gets its answer.
        Ok(Processed::InProgress(_)) => answer(409, b"{\"status\":\"processing\"}"),
        // Its runner died and `OnRunnerDeath::GiveUp` keeps it for an operator.
        Ok(Processed::Abandoned(_)) => answer(500, b"{\"status\":\"needs an operator\"}"),
        // The key was used for another request: the client's mistake.
        Err(Error::KeyReused { .. }) => answer(422, b"{\"status\":\"key reused\"}"),
        // An outcome a later version adds: answered as an error until handled here.
        Ok(_) => answer(500, b"{\"status\":\"unknown outcome\"}"),
        Err(err) => Err(err),
    }
}
