//! Criterion microbenchmarks: W1 (uncontended acquire + release) and W6 (re-entry depth),
//! each next to its physical limit measured in the same run, and the peers for W1.
//!
//! `cargo bench --bench micro` (the whole suite: `cargo bench`). Every group starts its own
//! throwaway redis-server. After the groups, the ratios against the limit are printed from the
//! samples criterion took in this run (mean time per iteration over all samples).
// A bench is a binary whose helpers are `pub` for the modules that share them.
#![allow(unreachable_pub)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Contenders, Kind, Locker};
use criterion::{BenchmarkId, Criterion};

/// Every sample's (iterations, elapsed) per benchmark id, recorded by the routines themselves
/// so the ratios below come from exactly the samples criterion analysed.
static SAMPLES: Mutex<BTreeMap<String, (u64, Duration)>> = Mutex::new(BTreeMap::new());

fn record(id: &str, iters: u64, elapsed: Duration) {
    let mut samples = SAMPLES.lock().unwrap();
    let entry = samples.entry(id.to_owned()).or_default();
    entry.0 += iters;
    entry.1 += elapsed;
}

fn per_iter(id: &str) -> Option<Duration> {
    let samples = SAMPLES.lock().unwrap();
    let (iters, elapsed) = samples.get(id)?;
    (*iters > 0).then(|| *elapsed / u32::try_from(*iters).unwrap_or(u32::MAX))
}

fn w1_uncontended(c: &mut Criterion) {
    let rt = common::runtime();
    let server = common::start_server();
    let contenders = rt.block_on(Contenders::connect(&server.url()));
    let mut group = c.benchmark_group("w1_uncontended");
    for kind in [
        Kind::Ours,
        Kind::Limit,
        Kind::OurScripts,
        Kind::Rslock,
        Kind::Distkit,
    ] {
        let locker = Arc::new(contenders.locker(kind, &format!("w1-{}", kind.slug())));
        let id = format!("w1/{}", kind.slug());
        group.bench_function(kind.slug(), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let (locker, id) = (locker.clone(), id.clone());
                async move {
                    let started = Instant::now();
                    for _ in 0..iters {
                        locker.cycle().await;
                    }
                    let elapsed = started.elapsed();
                    record(&id, iters, elapsed);
                    elapsed
                }
            });
        });
    }
    group.finish();
    drop(contenders);
    drop(rt);
    drop(server);
}

const DEPTHS: [usize; 3] = [1, 4, 16];

fn w6_reentry(c: &mut Criterion) {
    let rt = common::runtime();
    let server = common::start_server();
    let contenders = rt.block_on(Contenders::connect(&server.url()));
    let Locker::Ours(lock) = contenders.locker(Kind::Ours, "w6") else {
        unreachable!()
    };
    let lock = Arc::new(lock);
    let limit = contenders.limit.clone();
    let keys = Arc::new(limit.keys("w6"));
    let mut group = c.benchmark_group("w6_reentry");
    for depth in DEPTHS {
        let id = format!("w6/ours/{depth}");
        group.bench_with_input(BenchmarkId::new("ours", depth), &depth, |b, &depth| {
            b.to_async(&rt).iter_custom(|iters| {
                let (lock, id) = (lock.clone(), id.clone());
                async move {
                    let started = Instant::now();
                    for _ in 0..iters {
                        common::reentry_cycle(&lock, depth).await;
                    }
                    let elapsed = started.elapsed();
                    record(&id, iters, elapsed);
                    elapsed
                }
            });
        });
        let id = format!("w6/limit/{depth}");
        group.bench_with_input(BenchmarkId::new("limit", depth), &depth, |b, &depth| {
            b.to_async(&rt).iter_custom(|iters| {
                let (limit, keys, id) = (limit.clone(), keys.clone(), id.clone());
                async move {
                    let started = Instant::now();
                    for _ in 0..iters {
                        common::limit_reentry_cycle(&limit, &keys, depth).await;
                    }
                    let elapsed = started.elapsed();
                    record(&id, iters, elapsed);
                    elapsed
                }
            });
        });
    }
    group.finish();
    drop(contenders);
    drop(rt);
    drop(server);
}

fn print_ratios() {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!("\n## criterion ratios (same run; mean per iteration over all samples)\n");
    println!("| benchmark | time per cycle | ratio vs limit |");
    println!("| --- | ---: | ---: |");
    if let Some(limit) = per_iter("w1/limit") {
        for kind in [
            Kind::Ours,
            Kind::Limit,
            Kind::OurScripts,
            Kind::Rslock,
            Kind::Distkit,
        ] {
            if let Some(t) = per_iter(&format!("w1/{}", kind.slug())) {
                println!(
                    "| W1 {} | {:.1} µs | {:.3} |",
                    kind.label(),
                    us(t),
                    us(t) / us(limit)
                );
            }
        }
        if let (Some(ours), Some(rslock)) = (per_iter("w1/ours"), per_iter("w1/rslock")) {
            println!("| W1 fencelock / rslock | | {:.3} |", us(ours) / us(rslock));
        }
    }
    for depth in DEPTHS {
        if let (Some(ours), Some(limit)) = (
            per_iter(&format!("w6/ours/{depth}")),
            per_iter(&format!("w6/limit/{depth}")),
        ) {
            println!(
                "| W6 depth {depth} ({} round trips) | {:.1} µs | {:.3} |",
                2 * (depth + 1),
                us(ours),
                us(ours) / us(limit)
            );
        }
    }
    println!("\n(* peers: no re-entry, no fencing tokens)");
}

fn main() {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .configure_from_args();
    w1_uncontended(&mut criterion);
    w6_reentry(&mut criterion);
    criterion.final_summary();
    print_ratios();
}
