//! What operators see: the `tracing` events of a contended lock, and the metrics the `metrics`
//! feature records, printed from an in-process recorder.
//!
//! ```text
//! cargo run --features metrics --example observability
//! RUST_LOG=fencelock=trace,observability=info cargo run --features metrics --example observability
//! ```
//!
//! Two tasks compete for one lock inside a request span carrying a `trace_id`; the acquire
//! events appear as children of that span. A fenced write with an overtaken token shows up as
//! `fencelock.stale_write` and in `fencelock_stale_writes_rejected_total`. Every name is
//! documented in `fencelock::observability`. Exit status 0 when the expected metrics were
//! recorded, 1 otherwise.

mod support;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use fencelock::{Error, LockClient};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::{BoxError, ExampleRedis};
use tracing::Instrument;
use tracing_subscriber::EnvFilter;

async fn run() -> Result<(), BoxError> {
    let redis = ExampleRedis::from_env()?;
    println!("observability: {}", redis.describe());
    let client = LockClient::builder(redis.url())
        .prefix(redis.prefix())
        .connect()
        .await?;
    let lock = client.lock("invoice:99")?;
    let first = lock.acquire().await?;
    let old_token = first.token();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(
            async move {
                let guard = lock.acquire_timeout(Duration::from_secs(60)).await?;
                let token = guard.token();
                guard.release().await?;
                Ok::<_, Error>(token)
            }
            .instrument(tracing::info_span!(
                "request",
                trace_id = "4bf92f3577b34da6"
            )),
        )
    };
    // Let the waiter queue up: it waits (contended) once it subscribed to the lock's release
    // channel, which is the lock's key.
    let key = redis
        .scan("*lock:invoice:99")?
        .pop()
        .ok_or("the lock's key is missing")?;
    let since = Instant::now();
    loop {
        let subscribers: Vec<(Vec<u8>, u64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&key)
            .query(&mut redis.admin()?)?;
        if subscribers.first().is_some_and(|(_, n)| *n >= 1) {
            break;
        }
        if since.elapsed() > Duration::from_secs(30) {
            return Err("the waiter never subscribed".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.release().await?;
    let new_token = waiter.await??;
    let invoice = client.resource("invoice:99:status")?;
    invoice.set(new_token, "paid").await?;
    if !matches!(
        invoice.set(old_token, "void").await,
        Err(Error::StaleToken { .. })
    ) {
        return Err("the overtaken token's write was not refused".into());
    }
    redis.cleanup()?;
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("fencelock=debug,observability=info")),
        )
        .with_target(false)
        .init();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    if recorder.install().is_err() {
        eprintln!("observability: a metrics recorder was already installed");
        return ExitCode::FAILURE;
    }
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    if let Err(err) = runtime.block_on(run()) {
        eprintln!("observability: {err}");
        return ExitCode::FAILURE;
    }
    println!("\nmetrics recorded:");
    let mut counters = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let labels: Vec<String> = key
            .key()
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.key().name(), labels.join(","));
        match value {
            DebugValue::Counter(n) => {
                println!("  {name:<55} {n}");
                counters.push((name, n));
            }
            DebugValue::Histogram(samples) => println!("  {name:<55} {} samples", samples.len()),
            DebugValue::Gauge(g) => println!("  {name:<55} {}", g.into_inner()),
        }
    }
    let count = |name: &str| counters.iter().find(|(n, _)| n == name).map_or(0, |c| c.1);
    let expected = [
        ("fencelock_acquisitions_total{outcome=acquired}", 2),
        ("fencelock_contended_total{}", 1),
        ("fencelock_stale_writes_rejected_total{}", 1),
        ("fencelock_releases_total{outcome=released}", 2),
    ];
    let mut ok = true;
    for (name, want) in expected {
        if count(name) != want {
            println!("FAIL: {name} = {}, expected {want}", count(name));
            ok = false;
        }
    }
    if ok {
        println!("PASS");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
