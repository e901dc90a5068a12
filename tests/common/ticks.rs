//! A schedule driven by several instances at once: each instance's scheduler fires for every
//! tick with its own clock offset and a small late wake-up, and calls the same job.
#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencelock::{FencingToken, Job, JobOutcome, LockClient};

use super::deadline::within;

/// The schedule's period as the job knows it. The ticks are fired faster than this (the test
/// does not wait ten real seconds per tick); the ticks it passes are ten seconds apart.
pub const PERIOD: Duration = Duration::from_secs(10);

/// Each instance's clock offset, in ms: up to ±2 s, as the instances' ticks see them.
pub const OFFSETS_MS: [i64; 5] = [-2000, -700, 0, 900, 2000];

/// The first tick of the schedule (any instant does: ticks are compared by distance).
pub fn first_tick() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// The tick `index` as an instance whose clock is `offset_ms` off sees it.
pub fn tick_view(index: u64, offset_ms: i64) -> SystemTime {
    let on_time = first_tick() + PERIOD * u32::try_from(index).unwrap();
    if offset_ms >= 0 {
        on_time + Duration::from_millis(offset_ms.unsigned_abs())
    } else {
        on_time - Duration::from_millis(offset_ms.unsigned_abs())
    }
}

/// What one instance got for one tick.
#[derive(Debug)]
pub struct Call {
    pub tick: u64,
    pub instance: usize,
    pub outcome: JobOutcome<()>,
}

/// Fires `ticks` ticks on one job handle per client (instance `i` with
/// `OFFSETS_MS[i % 5]`); for each tick every instance calls `run_exclusive` after a late
/// wake-up of up to `jitter` (a fixed pseudo-random spread), the ticks `spacing` apart in real
/// time. The job takes `job_time` and appends `tick:token` to the fenced list `log` with its
/// token. Returns every call's outcome.
pub async fn drive(
    clients: &[LockClient],
    job: impl Fn(&LockClient) -> Job,
    ticks: u64,
    spacing: Duration,
    jitter: Duration,
    job_time: Duration,
    log: &str,
) -> Vec<Call> {
    let mut calls = Vec::new();
    for tick in 0..ticks {
        let fired = tokio::time::Instant::now();
        let mut tasks = Vec::new();
        for (instance, client) in clients.iter().enumerate() {
            let job = job(client);
            let log = client.resource(log).unwrap();
            // A spread that differs per tick and instance, without a random source: the
            // winner changes from tick to tick.
            let late = jitter.mul_f64(((tick * 7 + instance as u64 * 13) % 10) as f64 / 10.0);
            let view = tick_view(tick, OFFSETS_MS[instance % OFFSETS_MS.len()]);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(late).await;
                let outcome = job
                    .run_exclusive(view, |run| async move {
                        tokio::time::sleep(job_time).await;
                        let entry = format!("{tick}:{}", run.token());
                        log.push(run.token(), &[entry.as_bytes()]).await.unwrap();
                    })
                    .await
                    .unwrap();
                Call {
                    tick,
                    instance,
                    outcome,
                }
            }));
        }
        for task in tasks {
            calls.push(
                within(Duration::from_secs(30), "an instance's call", task)
                    .await
                    .unwrap(),
            );
        }
        tokio::time::sleep_until(fired + spacing).await;
    }
    calls
}

/// Checks that every tick of `0..ticks` ran exactly once among `calls`, and that the fenced
/// log holds each tick once (see [`assert_log_has_each_tick_once`]); panics naming the first
/// breach.
pub async fn assert_each_tick_ran_once(client: &LockClient, calls: &[Call], ticks: u64, log: &str) {
    for tick in 0..ticks {
        let ran: Vec<_> = calls
            .iter()
            .filter(|call| call.tick == tick && call.outcome.ran())
            .collect();
        assert_eq!(ran.len(), 1, "tick {tick} ran {} times: {ran:?}", ran.len());
    }
    assert_log_has_each_tick_once(client, log, ticks).await;
}

/// Checks that the fenced list `log` (entries `tick:token`) holds each tick of `0..ticks` once,
/// in order, with increasing tokens.
pub async fn assert_log_has_each_tick_once(client: &LockClient, log: &str, ticks: u64) {
    let entries: Vec<(u64, FencingToken)> = client
        .resource(log)
        .unwrap()
        .peek_items()
        .await
        .unwrap()
        .iter()
        .map(|item| {
            let item = String::from_utf8_lossy(item);
            let (tick, token) = item.split_once(':').unwrap();
            (
                tick.parse().unwrap(),
                FencingToken::new(token.parse().unwrap()).unwrap(),
            )
        })
        .collect();
    let logged: Vec<u64> = entries.iter().map(|entry| entry.0).collect();
    assert_eq!(logged, (0..ticks).collect::<Vec<_>>(), "the job's log");
    assert!(
        entries.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens must increase from run to run: {entries:?}"
    );
}
