//! A cache rebuild under a read-write lock: many readers serve the cache at once; the rebuild
//! takes the write side, and readers never see half a rebuild.
//!
//! ```text
//! cargo run --example cache_rebuild
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --example cache_rebuild
//! ```
//!
//! 1. Readers on two instances serve the cached price list together.
//! 2. A rebuild waits for the readers inside; readers arriving meanwhile wait behind it
//!    (writer preference), so a stream of reads cannot starve it.
//! 3. The rebuild writes both halves of the cache with its fencing token, then downgrades to
//!    a read to check its own work while readers come back in, with no other rebuild between.
//! 4. Every read saw both halves of the same version: never half a rebuild. Readers read with
//!    their hold's token (`get_shared`), which fences any writer older than them and is never
//!    refused because of another reader: no read is refused, although every reader presents a
//!    token of its own.
//!
//! Exit status 0 when all of that happened as described, 1 otherwise.

mod support;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock::LockClient;
use support::{BoxError, ExampleRedis};

/// How long any one step may take before the example calls it a failure.
const STEP: Duration = Duration::from_secs(10);

async fn run() -> Result<Vec<String>, BoxError> {
    let redis = ExampleRedis::from_env()?;
    println!("cache_rebuild: {}", redis.describe());
    let connect = || {
        LockClient::builder(redis.url())
            .prefix(redis.prefix())
            .connect()
    };
    let instances = [connect().await?, connect().await?];
    let mut failures = Vec::new();
    // The cache: two halves that must always come from the same rebuild.
    let head = instances[0].resource("prices:head")?;
    let tail = instances[0].resource("prices:tail")?;
    let first = instances[0].rwlock("prices")?.write().await?;
    head.set(first.token(), "v1").await?;
    tail.set(first.token(), "v1").await?;
    first.release().await?;

    // 1. Readers serve the cache until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for reader in 0..6usize {
        let client = instances[reader % 2].clone();
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            let (lock, head, tail) = (
                client.rwlock("prices")?,
                client.resource("prices:head")?,
                client.resource("prices:tail")?,
            );
            let mut torn = 0;
            let mut reads = 0;
            while !stop.load(Ordering::SeqCst) {
                let read = lock.read().await?;
                let (h, t) = (
                    head.get_shared(read.token()).await?,
                    tail.get_shared(read.token()).await?,
                );
                tokio::time::sleep(Duration::from_millis(10)).await; // serving
                if h != t {
                    torn += 1;
                }
                reads += 1;
                read.release().await?;
            }
            Ok::<(u32, u32), fencelock::Error>((reads, torn))
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // 2. The rebuild gets in through the stream of readers.
    let lock = instances[1].rwlock("prices")?;
    let rebuild = tokio::time::timeout(STEP, lock.write()).await??;
    println!("rebuilding with token {}", rebuild.token());
    let (head, tail) = (
        instances[1].resource("prices:head")?,
        instances[1].resource("prices:tail")?,
    );
    head.set(rebuild.token(), "v2").await?;
    tokio::time::sleep(Duration::from_millis(50)).await; // a slow rebuild
    tail.set(rebuild.token(), "v2").await?;

    // 3. Downgrade: check the rebuild as a reader, while the others come back in.
    let check = rebuild.downgrade().await?;
    let (h, t) = (
        head.get_shared(check.token()).await?,
        tail.get_shared(check.token()).await?,
    );
    if h != Some(b"v2".to_vec()) || t != Some(b"v2".to_vec()) {
        failures.push("the rebuild's own check failed".to_owned());
    }
    check.release().await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::SeqCst);

    // 4. No reader ever saw half a rebuild.
    let (mut reads, mut torn) = (0, 0);
    for reader in readers {
        let (r, t) = tokio::time::timeout(STEP, reader).await???;
        reads += r;
        torn += t;
    }
    println!("{reads} reads by 6 readers on 2 instances, {torn} saw half a rebuild");
    if torn > 0 {
        failures.push(format!("{torn} reads saw half a rebuild"));
    }
    redis.cleanup()?;
    Ok(failures)
}

#[tokio::main]
async fn main() -> ExitCode {
    support::exit_status("cache_rebuild", run().await)
}
