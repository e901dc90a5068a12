//! W2: 64 tasks on one client, each its own key: throughput against pipelined raw EVALSHA.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinSet;

use crate::admin::Admin;
use crate::common::{self, Contenders, Kind};
use crate::stats::{median, process_cpu, us, PEER_NOTE, REDISSON_NOTE};
use crate::{Cfg, Report};

// ---------------------------------------------------------------------------------------------
// W2: 64 tasks on one client, each its own key.

pub async fn w2(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let mut admin = Admin::new(&server).await;
    let tasks = 64;
    let kinds = [
        Kind::Ours,
        Kind::Limit,
        Kind::OurScripts,
        Kind::Redisson,
        Kind::Rslock,
        Kind::Distkit,
    ];
    let rounds = cfg.pick(5, 1);
    let window = cfg.secs(1.0, 0.1);
    let mut rates: BTreeMap<Kind, Vec<f64>> = BTreeMap::new();
    let mut cpu: BTreeMap<Kind, Vec<(f64, f64)>> = BTreeMap::new();
    for round in 0..rounds {
        for i in 0..kinds.len() {
            let kind = kinds[(i + round) % kinds.len()];
            let done = Arc::new(AtomicU64::new(0));
            let end = Instant::now() + window;
            let mut set = JoinSet::new();
            for t in 0..tasks {
                let locker = contenders.locker(kind, &format!("w2-{}-{t}", kind.slug()));
                let done = done.clone();
                set.spawn(async move {
                    while Instant::now() < end {
                        locker.cycle().await;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            let (started, cpu0, rcpu0) = (Instant::now(), process_cpu(), admin.cpu().await);
            while let Some(joined) = set.join_next().await {
                joined.expect("w2 task");
            }
            let (cpu1, rcpu1) = (process_cpu(), admin.cpu().await);
            let cycles = done.load(Ordering::Relaxed) as f64;
            rates
                .entry(kind)
                .or_default()
                .push(cycles / started.elapsed().as_secs_f64());
            cpu.entry(kind).or_default().push((
                us(cpu1 - cpu0) / cycles,
                us(rcpu1.saturating_sub(rcpu0)) / cycles,
            ));
        }
    }
    let paired_with = |a: Kind, b: Kind| {
        let ratios: Vec<f64> = rates[&a]
            .iter()
            .zip(&rates[&b])
            .map(|(x, y)| x / y)
            .collect();
        median(&ratios)
    };
    let paired = |a: Kind| paired_with(a, Kind::Limit);
    let mut text = format!(
        "### W2: {tasks} tasks on one client, each its own key\n\n\
         | contender | acquire+release cycles/s (median of rounds) | ratio vs limit (pipelined raw EVALSHA) | client CPU / cycle | Redis CPU / cycle |\n\
         | --- | ---: | ---: | ---: | ---: |\n"
    );
    for kind in kinds {
        let client: Vec<f64> = cpu[&kind].iter().map(|c| c.0).collect();
        let redis: Vec<f64> = cpu[&kind].iter().map(|c| c.1).collect();
        let _ = writeln!(
            text,
            "| {} | {:.0} | {:.2} | {:.1} µs | {:.1} µs |",
            kind.label(),
            median(&rates[&kind]),
            paired(kind),
            median(&client),
            median(&redis)
        );
    }
    let redis_cpu = |kind: Kind| median(&cpu[&kind].iter().map(|c| c.1).collect::<Vec<_>>());
    let _ = writeln!(
        text,
        "\nfencelock / Redisson fenced lock (paired): throughput {:.2}, Redis CPU per cycle \
         {:.1} µs against {:.1} µs.",
        paired_with(Kind::Ours, Kind::Redisson),
        redis_cpu(Kind::Ours),
        redis_cpu(Kind::Redisson)
    );
    let _ = writeln!(
        text,
        "\n{rounds} interleaved rounds of {:.1} s per contender. The limit is the same 64 tasks \
         each sending acquire-shaped then release-shaped EVALSHAs on one multiplexed connection \
         (redis-rs pipelines them). With 64 requests in flight the two cores are \
         saturated, so throughput is set by CPU per cycle (client + Redis).\n\n{PEER_NOTE}\n\n\
         {REDISSON_NOTE}\n",
        window.as_secs_f64()
    );
    report.section(text);
    let vs_rslock = paired_with(Kind::Ours, Kind::Rslock);
    report.target(
        "C-W2",
        "cost: throughput ≥ 1.0 × rslock's",
        format!("{vs_rslock:.2}×"),
        vs_rslock >= 1.0,
    );
    let (ours_cpu, rslock_cpu) = (redis_cpu(Kind::Ours), redis_cpu(Kind::Rslock));
    report.target(
        "C-W2 CPU",
        "cost: Redis CPU per cycle ≤ rslock's",
        format!("{ours_cpu:.1} µs vs {rslock_cpu:.1} µs"),
        ours_cpu <= rslock_cpu,
    );
    let ratio = paired(Kind::Ours);
    report.target(
        "W2",
        "throughput ≥ 0.8 × raw pipelined",
        format!("{ratio:.2}×"),
        ratio >= 0.8,
    );
    // The fair second baseline, as W1c: our own scripts pipelined without the library.
    let vs_scripts = paired_with(Kind::Ours, Kind::OurScripts);
    report.target(
        "W2b",
        "throughput ≥ 0.8 × our scripts called raw, pipelined (library overhead)",
        format!("{vs_scripts:.2}×"),
        vs_scripts >= 0.8,
    );
}
