//! Processing payments once, across processes: five processes of this test binary submit 200
//! payment ids, with random duplicates (the same request sent by several processes, or again
//! by one) and retries (a first try that fails before it reaches the database leaves the key
//! to a retry), through idempotency keys in Redis, into a PostgreSQL ledger behind them
//! (`examples/support/ledger.rs`: the payment row, its fence and the stored result in one
//! transaction, the payment id as the primary key). Each payment is applied exactly once, and
//! every answer any process got equals the result stored in the database.

#[path = "../../examples/support/ledger.rs"]
mod ledger;

use std::time::Duration;

use crate::common::child::ChildProcess;
use crate::common::Rng;
use fencelock::{Failure, IdempotencyOptions, LockClient, Processed};
use fencelock_testing::{PostgresServer, RedisServer};
use ledger::Applied;
use redis::Commands;

const CHILD_ENV: &str = "FENCELOCK_PAYMENTS_CHILD";
/// Where each process reports `id=answer` for every answer it got.
const ANSWERS: &str = "payments-answers";
const PROCESSES: u64 = 5;
const PAYMENTS: u64 = 200;
const ACCOUNT: i64 = 1;
const OPENING_BALANCE: i64 = 1_000_000;

fn amount(payment: u64) -> i64 {
    i64::try_from(payment % 97 + 1).unwrap()
}

/// One submitting process, a no-op unless the parent started this binary as a child. It
/// sends every payment `k` with `k % 5` equal to its number, and each other payment with
/// probability 2/5 (duplicates across processes), some twice (duplicates within one), in a
/// random order; a try fails before the database with probability 1/8 and is sent again.
#[tokio::test]
async fn payments_child_submits_its_share() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let (number, redis_url, pg_url, report) = (
        parts[0].parse::<u64>().unwrap(),
        parts[1],
        parts[2],
        parts[3],
    );
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((number + 1) * 0x1000_0000_01b3));
    let mut queue = Vec::new();
    for k in 0..PAYMENTS {
        if k % PROCESSES == number || rng.below(5) < 2 {
            queue.push(k);
            if rng.below(4) == 0 {
                queue.push(k);
            }
        }
    }
    for i in (1..queue.len()).rev() {
        let j = usize::try_from(rng.below(u64::try_from(i + 1).unwrap())).unwrap();
        queue.swap(i, j);
    }
    let client = LockClient::connect(redis_url).await.unwrap();
    let options =
        IdempotencyOptions::new(Duration::from_secs(10)).wait_for_outcome(Duration::from_secs(10));
    let payments = client.idempotency("payments", options).unwrap();
    let mut db = ledger::connect(pg_url).await.unwrap();
    let mut raw = redis::Client::open(report)
        .unwrap()
        .get_connection()
        .unwrap();
    for k in queue {
        let id = format!("pay-{k:03}");
        let fingerprint = format!("account={ACCOUNT} amount={}", amount(k));
        loop {
            let fails = rng.below(8) == 0;
            let db = &mut db;
            let id_ref = &id;
            let outcome = payments
                .run(&id, &fingerprint, |run| async move {
                    if fails {
                        return Err(Failure::Retry("the provider timed out".to_owned()));
                    }
                    match ledger::apply(db, id_ref, ACCOUNT, amount(k), run.token())
                        .await
                        .map_err(|err| Failure::Retry(err.to_string()))?
                    {
                        Applied::Now(result) | Applied::Before(result) => Ok(result.into_bytes()),
                        Applied::Declined(result) => Err(Failure::Final {
                            result: result.clone().into_bytes(),
                            error: result,
                        }),
                        Applied::Stale => Err(Failure::Retry("stale".to_owned())),
                    }
                })
                .await
                .unwrap();
            match outcome {
                Processed::Ran {
                    output: Err(Failure::Retry(_)),
                    ..
                }
                | Processed::InProgress(_) => {
                    tokio::time::sleep(Duration::from_millis(rng.below(20))).await;
                }
                Processed::Abandoned(record) => panic!("{id} was given up: {record:?}"),
                answered => {
                    let answer = String::from_utf8(answered.result().unwrap().to_vec()).unwrap();
                    let _: () = raw.rpush(ANSWERS, format!("{id}={answer}")).unwrap();
                    break;
                }
            }
        }
    }
}

#[tokio::test]
async fn five_processes_apply_each_of_200_payments_exactly_once() {
    let redis = RedisServer::start().unwrap();
    let report = RedisServer::start().unwrap();
    let postgres = PostgresServer::start().unwrap();
    let db = ledger::connect(&postgres.url()).await.unwrap();
    db.batch_execute(ledger::SCHEMA).await.unwrap();
    db.execute(
        "INSERT INTO accounts (id, balance) VALUES ($1, $2)",
        &[&ACCOUNT, &OPENING_BALANCE],
    )
    .await
    .unwrap();
    let mut children: Vec<ChildProcess> = (0..PROCESSES)
        .map(|number| {
            let spec = format!(
                "{number} {} {} {}",
                redis.url(),
                postgres.url(),
                report.url()
            );
            ChildProcess::start(
                module_path!(),
                "payments_child_submits_its_share",
                CHILD_ENV,
                &spec,
            )
        })
        .collect();
    for child in &mut children {
        assert!(
            child
                .exited(Duration::from_secs(180), "a submitting process finishes")
                .await,
            "a submitting process failed"
        );
    }
    let (applied, balance) = ledger::totals(&db, ACCOUNT).await.unwrap();
    let total: i64 = (0..PAYMENTS).map(amount).sum();
    assert_eq!(
        applied,
        i64::try_from(PAYMENTS).unwrap(),
        "payment rows applied"
    );
    assert_eq!(
        balance,
        OPENING_BALANCE - total,
        "each payment debited once"
    );
    let answers: Vec<String> = report
        .client()
        .get_connection()
        .unwrap()
        .lrange(ANSWERS, 0, -1)
        .unwrap();
    let mut answered = std::collections::BTreeSet::new();
    for line in &answers {
        let (id, answer) = line.split_once('=').unwrap();
        let stored = ledger::stored_result(&db, id).await.unwrap();
        assert_eq!(
            stored.as_deref(),
            Some(answer),
            "{id}: the answer differs from the ledger's"
        );
        answered.insert(id.to_owned());
    }
    assert_eq!(
        answered.len(),
        usize::try_from(PAYMENTS).unwrap(),
        "every payment answered"
    );
    assert!(
        answers.len() > answered.len(),
        "duplicates were sent: {}",
        answers.len()
    );
    eprintln!("{} answers to {} payments", answers.len(), answered.len());
}
