//! Measurement helpers the workloads share: round trips counted by MONITOR, raw round trips,
//! interleaved rounds, throughput windows, and holding many locks at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_testing::RedisServer;
use tokio::task::JoinSet;

use crate::admin::Admin;
use crate::common::{Held, Locker, Raw};
use crate::stats::{now_ns, us};

/// Round trips the server received from clients while `work` ran, by command, from
/// `MONITOR` (which marks the commands scripts run inside as `lua`, so they are left out).
/// Not used while timing: MONITOR slows the server down.
pub async fn monitored<F: std::future::Future<Output = ()>>(
    server: &RedisServer,
    admin: &mut Admin,
    work: F,
) -> BTreeMap<String, u64> {
    use futures_util::StreamExt;
    let monitor = server
        .client()
        .get_async_monitor()
        .await
        .expect("MONITOR connection");
    let marker = format!("fencelock-bench-marker-{}", now_ns());
    let collector = {
        let marker = marker.clone();
        tokio::spawn(async move {
            let mut stream = monitor.into_on_message::<String>();
            let (mut counts, mut started) = (BTreeMap::new(), false);
            while let Some(line) = stream.next().await {
                if line.contains(&marker) {
                    if started {
                        break;
                    }
                    started = true;
                    continue;
                }
                let Some((origin, command)) = line.split_once("] ") else {
                    continue;
                };
                if !started || origin.ends_with(" lua") {
                    continue;
                }
                let name = command
                    .split('"')
                    .nth(1)
                    .unwrap_or("?")
                    .to_ascii_lowercase();
                *counts.entry(name).or_insert(0u64) += 1;
            }
            counts
        })
    };
    let echo = redis::cmd("ECHO").arg(&marker).to_owned();
    let _: String = admin.query(&echo).await;
    work.await;
    let _: String = admin.query(&echo).await;
    collector.await.expect("monitor collector")
}

/// "2.00 (evalsha 2.00)": commands per unit of work, with the breakdown.
pub fn per_unit(counts: &BTreeMap<String, u64>, units: f64) -> (f64, String) {
    let total = counts.values().sum::<u64>() as f64 / units;
    let parts: Vec<String> = counts
        .iter()
        .filter(|(_, &c)| c > 0)
        .map(|(name, &c)| format!("{name} {:.2}", c as f64 / units))
        .collect();
    (total, format!("{total:.2} ({})", parts.join(", ")))
}

/// One raw round trip (half of a limit acquire + release cycle), averaged over `cycles`.
pub async fn raw_rtt(limit: &Raw, cycles: u32) -> Duration {
    let keys = limit.keys("rtt");
    let started = Instant::now();
    for _ in 0..cycles {
        let holder = limit.acquire(&keys).await;
        limit.release(&keys, &holder).await;
    }
    started.elapsed() / (2 * cycles)
}

/// Acquires `names` with up to 64 acquisitions in flight; returns what is held, in order.
pub async fn hold_many(lockers: Vec<Locker>) -> Vec<(Locker, Held)> {
    let lockers = Arc::new(parking_lot::Mutex::new(
        lockers.into_iter().enumerate().collect::<Vec<_>>(),
    ));
    let mut set = JoinSet::new();
    for _ in 0..64 {
        let lockers = lockers.clone();
        set.spawn(async move {
            let mut held = Vec::new();
            loop {
                let next = lockers.lock().pop();
                let Some((i, locker)) = next else {
                    return held;
                };
                let h = locker.acquire().await;
                held.push((i, locker, h));
            }
        });
    }
    let mut all = Vec::new();
    while let Some(joined) = set.join_next().await {
        all.extend(joined.expect("hold task"));
    }
    all.sort_by_key(|(i, _, _)| *i);
    all.into_iter().map(|(_, l, h)| (l, h)).collect()
}

pub async fn release_many(held: Vec<(Locker, Held)>) {
    let held = Arc::new(parking_lot::Mutex::new(held));
    let mut set = JoinSet::new();
    for _ in 0..64 {
        let held = held.clone();
        set.spawn(async move {
            loop {
                let next = held.lock().pop();
                let Some((locker, h)) = next else { return };
                locker.release(h).await;
            }
        });
    }
    while let Some(joined) = set.join_next().await {
        joined.expect("release task");
    }
}

/// `n` cycles of `ours` and `n` of `limit` per round, in alternating order from round to round
/// (so warm-up and drift hit both alike): the per-cycle times of each, and per-round ratios.
pub async fn interleaved(
    rounds: usize,
    n: u32,
    mut ours: impl AsyncFnMut(),
    mut limit: impl AsyncFnMut(),
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut ours_us, mut limit_us, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut pair = [0.0; 2];
        for i in 0..2 {
            let which = (i + round) % 2;
            let started = Instant::now();
            for _ in 0..n {
                if which == 0 {
                    ours().await;
                } else {
                    limit().await;
                }
            }
            pair[which] = us(started.elapsed()) / f64::from(n);
        }
        ours_us.push(pair[0]);
        limit_us.push(pair[1]);
        ratios.push(pair[0] / pair[1]);
    }
    (ours_us, limit_us, ratios)
}

/// Calls per second of `tasks` tasks each running `cycle` in a loop for `window`.
pub async fn throughput<F, Fut>(tasks: usize, window: Duration, cycle: F) -> f64
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + window;
    let mut running = Vec::new();
    for task in 0..tasks {
        let (cycle, done) = (cycle.clone(), done.clone());
        running.push(tokio::spawn(async move {
            while Instant::now() < until {
                cycle(task).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in running {
        task.await.expect("throughput task");
    }
    done.load(Ordering::Relaxed) as f64 / window.as_secs_f64()
}
