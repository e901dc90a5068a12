//! What a holder sees when its lock goes away under it: the watchdog keeping a short lease
//! alive, re-entry with the same token, the lost signal, and the fenced write that saves the
//! data when the holder does not listen.
//!
//! ```text
//! cargo run --example lost_lease
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --example lost_lease
//! ```
//!
//! 1. A holder takes `order:7` with a 1 s lease and works for three seconds: the client's
//!    watchdog renews the lease, so nobody else gets in.
//! 2. It re-enters for a nested step: same token.
//! 3. An operator deletes the lock key (as an eviction or a failover would lose it). The
//!    watchdog notices at its next renewal and `guard.lost()` resolves; a second holder gets
//!    the lock with a higher token and claims the order record.
//! 4. The first holder, which ignores the signal, tries to write anyway: the record refuses
//!    its older token (`Error::StaleToken`).
//!
//! Exit status 0 when all of that happened as described, 1 otherwise.

mod support;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use fencelock::{Error, LockClient};
use support::{BoxError, ExampleRedis};

/// Short, so that the work below outlives it several times; long enough that a loaded machine
/// delaying a renewal (they come every third of it) does not lose the lock.
const LEASE: Duration = Duration::from_secs(1);

async fn run() -> Result<Vec<String>, BoxError> {
    let redis = ExampleRedis::from_env()?;
    println!("lost_lease: {}", redis.describe());
    let connect = || {
        LockClient::builder(redis.url())
            .prefix(redis.prefix())
            .default_lease(LEASE)
            .connect()
    };
    let (first, second) = (connect().await?, connect().await?);
    let mut failures = Vec::new();

    // 1. The watchdog keeps the lease alive while the guard lives.
    let guard = first.lock("order:7")?.acquire().await?;
    let token = guard.token();
    println!("holder 1 acquired order:7 with token {token}, lease {LEASE:?}");
    let started = Instant::now();
    while started.elapsed() < LEASE * 3 {
        if second.lock("order:7")?.try_acquire().await?.is_some() {
            failures.push("holder 2 got in while holder 1's watchdog was renewing".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "after {:?} (over 3 leases) holder 1 still holds it: {}",
        started.elapsed(),
        guard.is_valid()
    );

    // 2. Re-entry: the same holder, the same token.
    let nested = guard.reenter().await?;
    if nested.token() != token {
        failures.push(format!(
            "re-entry saw token {} instead of {token}",
            nested.token()
        ));
    }
    println!("nested step re-entered with token {}", nested.token());
    nested.release().await?;

    // The record the lock protects; holder 1 claims it first.
    let order = first.resource("order:7:status")?;
    order.set(token, "paid").await?;

    // 3. The lock key disappears; the watchdog finds out and tells the holder.
    let key = redis.scan("*lock:order:7")?;
    redis::cmd("DEL")
        .arg(&key)
        .query::<()>(&mut redis.admin()?)?;
    println!(
        "operator deleted {}",
        String::from_utf8_lossy(&key.concat())
    );
    match tokio::time::timeout(Duration::from_secs(5), guard.lost()).await {
        Ok(()) => println!(
            "holder 1: lost() resolved, is_valid() = {}",
            guard.is_valid()
        ),
        Err(_) => failures.push("lost() did not resolve within 5 s".to_owned()),
    }
    let takeover = second
        .lock("order:7")?
        .acquire_timeout(Duration::from_secs(5))
        .await?;
    println!("holder 2 acquired order:7 with token {}", takeover.token());
    if takeover.token() <= token {
        failures.push("the new holder's token is not higher".to_owned());
    }
    let status = second.resource("order:7:status")?;
    let seen = status.get(takeover.token()).await?; // claims the record for holder 2
    println!(
        "holder 2 read status {:?}",
        seen.map(|v| String::from_utf8_lossy(&v).into_owned())
    );
    status.set(takeover.token(), "shipped").await?;

    // 4. Holder 1 ignores the signal and writes: refused.
    match order.set(token, "refunded").await {
        Err(Error::StaleToken { .. }) => println!("holder 1's late write was refused: stale token"),
        other => failures.push(format!("holder 1's late write was not refused: {other:?}")),
    }
    match guard.release().await {
        Err(err @ Error::NotHeld { .. }) => println!("holder 1's release: {err}"),
        other => failures.push(format!("holder 1's release said {other:?}")),
    }
    takeover.release().await?;
    let final_status = status.peek().await?.unwrap_or_default();
    if final_status != b"shipped" {
        failures.push(format!(
            "final status {:?}",
            String::from_utf8_lossy(&final_status)
        ));
    }
    redis.cleanup()?;
    Ok(failures)
}

#[tokio::main]
async fn main() -> ExitCode {
    support::exit_status("lost_lease", run().await)
}
