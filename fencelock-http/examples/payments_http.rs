//! A payment API behind the `Idempotency-Key` layer, its writes fenced in PostgreSQL.
//!
//! ```text
//! cargo run -p fencelock-http --example payments_http
//! ```
//!
//! `POST /payments` takes an amount and records a payment row under the request's key in its
//! scope (`IdempotencyRun::stored_key`: two customers' equal keys are two rows), in
//! one statement fenced by the run's token (the `fencelock::sql` guide's insert-or-update):
//! a run the key gave up on (it froze past `at_most_for`) cannot write after its successor.
//! Clients send each of 20 payments three times at once and once more after it finished,
//! then one key again with another amount. The checks: one row per payment, every reply to a
//! key identical to the first, the duplicates after completion marked
//! `Idempotent-Replayed: true`, the reused key refused with 422.
//!
//! Redis and PostgreSQL are throwaway servers on free loopback ports (fencelock-testing;
//! `scripts/ensure-postgres` installs PostgreSQL). Exit status 0 when every check holds.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use fencelock::sql::fence_param;
use fencelock::{IdempotencyOptions, LockClient};
use fencelock_http::{IdempotencyLayer, IdempotencyRun};
use fencelock_testing::{PostgresServer, RedisServer};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio_postgres::NoTls;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const PAYMENTS: usize = 20;

const SCHEMA: &str = "CREATE TABLE payments (
    id     BYTEA PRIMARY KEY,  -- the key in its scope: IdempotencyRun::stored_key
    amount BIGINT NOT NULL,
    fence  BIGINT NOT NULL   -- the token of the run that wrote the row last
)";

// The handler: the run's token comes in the request's extensions.
async fn pay(
    State(db): State<Arc<tokio_postgres::Client>>,
    Extension(run): Extension<IdempotencyRun>,
    amount: String,
) -> (StatusCode, String) {
    let Ok(amount) = amount.trim().parse::<i64>() else {
        return (StatusCode::BAD_REQUEST, "the amount is not a number".into());
    };
    // Inserted, or written over by a run with a token at least as new; an older run's write
    // is refused (no row comes back).
    let written = db
        .query_opt(
            "INSERT INTO payments (id, amount, fence) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO UPDATE SET amount = excluded.amount, fence = excluded.fence \
             WHERE payments.fence <= excluded.fence RETURNING id",
            &[&run.stored_key(), &amount, &fence_param(run.token())],
        )
        .await;
    match written {
        Ok(Some(_)) => (
            StatusCode::CREATED,
            format!("paid {amount} as {} with token {}", run.key(), run.token()),
        ),
        // A newer run of this key wrote: this one is stale. A 5xx leaves the key to a retry.
        Ok(None) => (StatusCode::SERVICE_UNAVAILABLE, "superseded".into()),
        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, err.to_string()),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("payments_http: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, BoxError> {
    let redis = RedisServer::start()?;
    let postgres = PostgresServer::start()?;
    let (db, connection) = tokio_postgres::connect(&postgres.url(), NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(SCHEMA).await?;

    let client = LockClient::builder(redis.url()).connect().await?;
    let options = IdempotencyOptions::new(Duration::from_secs(10));
    let payments = client.idempotency("payments", options)?;
    let app = Router::new()
        .route("/payments", post(pay))
        .with_state(Arc::new(db))
        .layer(IdempotencyLayer::new(payments).require_key(true));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    println!(
        "payments_http: serving on {addr}; Redis on {}, PostgreSQL on {}",
        redis.port(),
        postgres.port()
    );

    let mut ok = true;
    let mut sends = Vec::new();
    for n in 1..=PAYMENTS {
        for _ in 0..3 {
            sends.push(tokio::spawn(send(
                addr,
                format!("pay-{n}"),
                (n * 100).to_string(),
            )));
        }
    }
    let mut first: Vec<Option<(u16, Bytes)>> = vec![None; PAYMENTS];
    let mut conflicts = 0;
    for (i, sent) in sends.into_iter().enumerate() {
        let (status, _, body) = sent.await??;
        match status {
            // The first answer, or a replay of it (a duplicate that came after it finished).
            201 => match &first[i / 3] {
                Some(answer) => ok &= answer == &(status, body),
                None => first[i / 3] = Some((status, body)),
            },
            // A duplicate that met the first still running.
            409 => conflicts += 1,
            other => {
                println!(
                    "payments_http: unexpected {other}: {}",
                    String::from_utf8_lossy(&body)
                );
                ok = false;
            }
        }
    }
    let mut replayed = 0;
    for (i, answer) in first.iter().enumerate() {
        let (status, marked, body) =
            send(addr, format!("pay-{}", i + 1), ((i + 1) * 100).to_string()).await?;
        if answer.as_ref() != Some(&(status, body)) || !marked {
            println!(
                "payments_http: pay-{} was not replayed as first answered",
                i + 1
            );
            ok = false;
        }
        replayed += usize::from(marked);
    }
    let (reused, _, _) = send(addr, "pay-1".into(), "999".into()).await?;
    let (check, connection) = tokio_postgres::connect(&postgres.url(), NoTls).await?;
    tokio::spawn(connection);
    let rows: i64 = check
        .query_one("SELECT COUNT(*) FROM payments", &[])
        .await?
        .get(0);
    println!(
        "payments_http: {PAYMENTS} payments sent 4 times each: {rows} rows, {conflicts} duplicates \
         answered 409 while running, {replayed} replays; the key reused for another amount: {reused}"
    );
    ok &= rows == i64::try_from(PAYMENTS)? && reused == 422;
    println!("payments_http: {}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}

/// `POST /payments` with `key` and `amount`: the status, whether it was a replay, the body.
async fn send(
    addr: SocketAddr,
    key: String,
    amount: String,
) -> Result<(u16, bool, Bytes), BoxError> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = http::Request::post("/payments")
        .header("host", addr.to_string())
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from(amount)))?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, replayed, body))
}
