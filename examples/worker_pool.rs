//! A rate-limited worker pool: at most three calls to a partner's API at once, across every
//! worker of every instance, with permits that come back when a worker dies.
//!
//! ```text
//! cargo run --example worker_pool
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --example worker_pool
//! ```
//!
//! 1. Eight workers on two clients (two instances) share a semaphore of three permits; each
//!    call takes one permit. At most three calls run at once.
//! 2. A bulk export takes two permits at once, and waits until two are free.
//! 3. A worker that dies without giving its permit back (its lease is never renewed) frees it
//!    within its lease, and the next caller gets it.
//!
//! Exit status 0 when all of that happened as described, 1 otherwise.

mod support;

use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::LockClient;
use support::{BoxError, ExampleRedis};

/// How long any one step may take before the example calls it a failure.
const STEP: Duration = Duration::from_secs(10);

async fn run() -> Result<Vec<String>, BoxError> {
    let redis = ExampleRedis::from_env()?;
    println!("worker_pool: {}", redis.describe());
    let connect = || {
        LockClient::builder(redis.url())
            .prefix(redis.prefix())
            .connect()
    };
    let instances = [connect().await?, connect().await?];
    let mut failures = Vec::new();

    // 1. Eight workers, three permits.
    let in_flight = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let mut workers = Vec::new();
    for worker in 0..8usize {
        let api = instances[worker % 2].semaphore("partner-api", 3)?;
        let (in_flight, peak) = (in_flight.clone(), peak.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..3 {
                let permit = api.acquire(1).await?;
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await; // the API call
                in_flight.fetch_sub(1, Ordering::SeqCst);
                permit.release().await?;
            }
            Ok::<(), fencelock::Error>(())
        }));
    }
    for worker in workers {
        tokio::time::timeout(STEP, worker).await???;
    }
    let peak = peak.load(Ordering::SeqCst);
    println!("24 calls by 8 workers, at most {peak} at once");
    if peak > 3 {
        failures.push(format!("{peak} calls ran at once, the limit is 3"));
    }

    // 2. A bulk export needs two permits at once.
    let api = instances[0].semaphore("partner-api", 3)?;
    let call = api.acquire(1).await?;
    let other = instances[1].semaphore("partner-api", 3)?.acquire(1).await?;
    let export = tokio::spawn({
        let api = api.clone();
        async move { api.acquire(2).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    if export.is_finished() {
        failures.push("the export got two permits while only one was free".to_owned());
    }
    call.release().await?;
    let export = tokio::time::timeout(STEP, export).await???;
    println!(
        "the export holds {} permits (token {}) after a call finished",
        export.permits(),
        export.token()
    );
    other.release().await?;
    export.release().await?;

    // 3. A worker dies holding a permit: here, a hold with a fixed lease that is never
    //    released, as the server sees a crashed process.
    let lease = Duration::from_millis(800);
    let dying = api.with_lease(lease)?.acquire(3).await?;
    let died = Instant::now();
    std::mem::forget(dying);
    let next = tokio::time::timeout(STEP, api.acquire(1)).await??;
    println!(
        "the dead worker's permits came back after {:?} (its lease: {lease:?})",
        died.elapsed()
    );
    if died.elapsed() < lease / 2 {
        failures.push("a permit of a live hold was handed out".to_owned());
    }
    next.release().await?;
    redis.cleanup()?;
    Ok(failures)
}

#[tokio::main]
async fn main() -> ExitCode {
    support::exit_status("worker_pool", run().await)
}
