//! W10: semaphores and read-write locks: free calls, throughput under contention, a writer's
//! handoff and memory per holder.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::admin::Admin;
use crate::common::{self, Contenders};
use crate::measure::{interleaved, throughput};
use crate::stats::{fmt_us, median, us};
use crate::{Cfg, Report};

// ---------------------------------------------------------------------------------------------
// W10: semaphores and read-write locks: the uncontended calls, throughput under contention and
// a writer's handoff, each against raw EVALSHA measured in the same run; memory per holder.

pub async fn w10(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let ours = &contenders.ours;
    let limit = contenders.limit.clone();
    let keys = limit.keys("w10");
    let rounds = cfg.pick(40, 2);
    let n: u32 = cfg.pick(32, 2);
    let raw_pair = async || {
        let holder = limit.acquire(&keys).await;
        limit.release(&keys, &holder).await;
    };

    // (a) uncontended: acquire + release, 2 round trips each.
    let pool = ours.semaphore("w10-pool", 4).expect("semaphore");
    let (sem, sem_limit, sem_ratios) = interleaved(
        rounds,
        n,
        async || {
            pool.acquire(1)
                .await
                .expect("permit")
                .release()
                .await
                .expect("release");
        },
        async || raw_pair().await,
    )
    .await;
    let rw = ours.rwlock("w10-rw").expect("rwlock");
    let (read, read_limit, read_ratios) = interleaved(
        rounds,
        n,
        async || {
            rw.read()
                .await
                .expect("read")
                .release()
                .await
                .expect("release");
        },
        async || raw_pair().await,
    )
    .await;
    let (write, write_limit, write_ratios) = interleaved(
        rounds,
        n,
        async || {
            rw.write()
                .await
                .expect("write")
                .release()
                .await
                .expect("release");
        },
        async || raw_pair().await,
    )
    .await;

    // (b) throughput under contention, against the same number of tasks doing raw
    // acquire + release pairs on keys of their own (nothing to wait for: the round-trip
    // limit of that concurrency).
    let window = cfg.pick(Duration::from_secs(3), Duration::from_millis(300));
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(LockClient::connect(&server.url()).await.expect("connect"));
    }
    let raw_limit = |tasks: usize| {
        let limit = limit.clone();
        async move {
            throughput(tasks, window, move |task| {
                let limit = limit.clone();
                async move {
                    let keys = limit.keys(&format!("w10-raw-{task}"));
                    let holder = limit.acquire(&keys).await;
                    limit.release(&keys, &holder).await;
                }
            })
            .await
        }
    };
    // 64 tasks over four clients reading one lock and releasing, over and over.
    let readers_of = |clients: Vec<LockClient>, name: &'static str| {
        throughput(64, window, move |task| {
            let lock = clients[task % 4].rwlock(name).expect("rwlock");
            async move {
                lock.read()
                    .await
                    .expect("read")
                    .release()
                    .await
                    .expect("release");
            }
        })
    };
    let readers = readers_of(clients.clone(), "w10-shared").await;
    // The same readers with clients that send each read and release alone.
    let mut alone = Vec::new();
    for _ in 0..4 {
        alone.push(
            LockClient::builder(server.url())
                .hold_batch(1)
                .connect()
                .await
                .expect("connect"),
        );
    }
    let lone_readers = readers_of(alone, "w10-alone").await;
    let readers_limit = raw_limit(64).await;
    let mut sem_rates = Vec::new();
    for permits in [4u32, 16] {
        let clients = clients.clone();
        let rate = throughput(16, window, move |task| {
            let pool = clients[task % 4]
                .semaphore(format!("w10-n{permits}"), permits)
                .expect("semaphore");
            async move {
                pool.acquire(1)
                    .await
                    .expect("permit")
                    .release()
                    .await
                    .expect("release");
            }
        })
        .await;
        sem_rates.push((permits, rate));
    }
    let sem_limit_rate = raw_limit(16).await;

    // (c) a writer's handoff with readers present: 8 readers hold, a writer waits; from the
    // start of the last reader's release to the writer's guard (release, publish, the
    // writer's attempt: 2 round trips), against 2 raw EVALSHA measured right after.
    let mut handoffs = Vec::new();
    let mut handoff_limits = Vec::new();
    let mut handoff_calls = Vec::new();
    let mut admin = Admin::new(&server).await;
    for _ in 0..cfg.pick(30, 2) {
        let shared = clients[0].rwlock("w10-handoff").expect("rwlock");
        let mut reads = Vec::new();
        for i in 0..8 {
            reads.push(
                clients[i % 4]
                    .rwlock("w10-handoff")
                    .expect("rwlock")
                    .read()
                    .await
                    .expect("read"),
            );
        }
        let writer = clients[1].rwlock("w10-handoff").expect("rwlock");
        let waiting = tokio::spawn(async move {
            let write = writer.write().await.expect("write");
            let at = Instant::now();
            write.release().await.expect("release");
            at
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let last = reads.pop().expect("a reader");
        admin.reset_stats().await;
        for read in reads {
            read.release().await.expect("release");
        }
        let started = Instant::now();
        last.release().await.expect("release");
        let granted = waiting.await.expect("writer");
        handoffs.push(us(granted - started));
        let calls = admin
            .command_stats()
            .await
            .get("evalsha")
            .map_or(0, |c| c.0);
        handoff_calls.push(calls as f64);
        let started = Instant::now();
        raw_pair().await;
        handoff_limits.push(us(started.elapsed()));
        drop(shared);
    }

    // (d) memory: the semaphore's and the read-write lock's keys with 1 and with 101 holds.
    let mut bytes = Vec::new();
    for (what, pattern) in [("permit holder", "sem"), ("reader", "rw")] {
        let mut sizes = Vec::new();
        for holders in [1usize, 101] {
            let name = format!("w10-mem-{holders}");
            let mut held_sems = Vec::new();
            let mut held_reads = Vec::new();
            for _ in 0..holders {
                if pattern == "sem" {
                    held_sems.push(
                        ours.semaphore(&name, 1000)
                            .expect("semaphore")
                            .acquire(1)
                            .await
                            .expect("permit"),
                    );
                } else {
                    held_reads.push(
                        ours.rwlock(&name)
                            .expect("rwlock")
                            .read()
                            .await
                            .expect("read"),
                    );
                }
            }
            let mut total = 0;
            for key in admin
                .scan(&format!("fencelock:{{*}}{pattern}*:{name}"))
                .await
            {
                total += admin.memory_usage(&key).await;
            }
            sizes.push(total);
            for permit in held_sems {
                permit.release().await.expect("release");
            }
            for read in held_reads {
                read.release().await.expect("release");
            }
        }
        bytes.push((what, sizes[0], (sizes[1] - sizes[0]) as f64 / 100.0));
    }

    // (e) the server's work per cycle, one task after another (nothing else runs): script
    // calls, the server commands they run, and the server µs spent inside the scripts and
    // inside those commands (`INFO commandstats`), for a read beside 8 readers that hold,
    // a permit and a lock.
    let cycles: u32 = cfg.pick(2000, 20);
    let mut work = Vec::new();
    {
        let rw = ours.rwlock("w10-work").expect("rwlock");
        let mut others = Vec::new();
        for _ in 0..8 {
            others.push(rw.read().await.expect("read"));
        }
        let pool = ours.semaphore("w10-work-pool", 4).expect("semaphore");
        let lock = ours.lock("w10-work-lock").expect("lock");
        enum Cycle {
            Read,
            Permit,
            Lock,
        }
        for (what, cycle) in [
            ("read + release, 8 other readers holding", Cycle::Read),
            ("semaphore: acquire(1) + release", Cycle::Permit),
            ("lock: acquire + release (for comparison)", Cycle::Lock),
        ] {
            // One cycle first, so that loading the scripts is not counted.
            for round in [1, cycles] {
                admin.reset_stats().await;
                for _ in 0..round {
                    match cycle {
                        Cycle::Read => rw
                            .read()
                            .await
                            .expect("read")
                            .release()
                            .await
                            .expect("release"),
                        Cycle::Permit => pool
                            .acquire(1)
                            .await
                            .expect("permit")
                            .release()
                            .await
                            .expect("release"),
                        Cycle::Lock => lock
                            .acquire()
                            .await
                            .expect("lock")
                            .release()
                            .await
                            .expect("release"),
                    }
                }
            }
            work.push((
                what,
                ServerWork::per_cycle(admin.command_stats().await, cycles),
            ));
        }
        for read in others {
            read.release().await.expect("release");
        }
    }

    let mut text = String::from(
        "### W10: semaphores and read-write locks\n\n\
         | what | round trips | fencelock | limit (same number of raw EVALSHA) | ratio |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
    );
    for (label, ours, limit, ratios) in [
        (
            "semaphore: acquire(1) + release, free",
            &sem,
            &sem_limit,
            &sem_ratios,
        ),
        (
            "read-write lock: read + release, free",
            &read,
            &read_limit,
            &read_ratios,
        ),
        (
            "read-write lock: write + release, free",
            &write,
            &write_limit,
            &write_ratios,
        ),
    ] {
        let _ = writeln!(
            text,
            "| {label} | 2 | {} | {} | {:.2} |",
            fmt_us(median(ours)),
            fmt_us(median(limit)),
            median(ratios),
        );
    }
    let _ = writeln!(
        text,
        "| a writer's handoff from 8 readers (last release to the writer's guard) | 2 | {} | {} | {:.2} |",
        fmt_us(median(&handoffs)),
        fmt_us(median(&handoff_limits)),
        median(&handoffs) / median(&handoff_limits),
    );
    let _ = writeln!(
        text,
        "\n{rounds} interleaved rounds of {n} calls each for the free calls; ratio = median of \
         per-round ratios. The handoff: median of {} handoffs, each followed by 2 raw EVALSHA; \
         the 8 releases and the writer's attempts and release made {:.0} script calls per \
         handoff (median).\n\n\
         | under contention ({:.1} s windows) | fencelock, calls/s | raw acquire + release pairs/s, same tasks | ratio |\n\
         | --- | ---: | ---: | ---: |",
        handoffs.len(),
        median(&handoff_calls),
        window.as_secs_f64(),
    );
    let _ = writeln!(
        text,
        "| 64 readers of one read-write lock, 4 clients | {readers:.0} | {readers_limit:.0} | {:.2} |",
        readers / readers_limit
    );
    let _ = writeln!(
        text,
        "| the same, each read and release by its own call (`hold_batch(1)`) | {lone_readers:.0} | {readers_limit:.0} | {:.2} |",
        lone_readers / readers_limit
    );
    for (permits, rate) in &sem_rates {
        let _ = writeln!(
            text,
            "| semaphore of {permits} permits, 16 contenders, 4 clients | {rate:.0} | {sem_limit_rate:.0} | {:.2} |",
            rate / sem_limit_rate
        );
    }
    let _ = writeln!(
        text,
        "\nThe raw pairs take keys of their own, so nothing waits: the concurrency's round-trip \
         limit. Waiting permits go through pub/sub.\n\n\
         | Redis memory (`MEMORY USAGE`, all keys of the name) | with 1 hold | per further hold |\n\
         | --- | ---: | ---: |"
    );
    for (what, one, per) in bytes {
        let _ = writeln!(text, "| {what} | {one} B | {per:.0} B |");
    }
    let _ = writeln!(
        text,
        "\n| the server's work per cycle ({cycles} cycles, one task) | script calls | server \
         commands | µs in the scripts | µs in their commands |\n\
         | --- | ---: | ---: | ---: | ---: |"
    );
    for (what, work) in &work {
        let _ = writeln!(
            text,
            "| {what} | {:.1} | {:.1} | {:.1} | {:.1} |",
            work.scripts, work.commands, work.script_us, work.command_us
        );
    }
    let _ = writeln!(text);
    report.section(text);
    let readers_ratio = readers / readers_limit;
    report.target(
        "C-W10",
        "cost: 64 readers of one read-write lock ≥ 0.6 × raw pipelined",
        format!("{readers_ratio:.2}×"),
        readers_ratio >= 0.6,
    );
}

/// What the server did per cycle, from `INFO commandstats` (which also counts the commands
/// scripts run).
struct ServerWork {
    scripts: f64,
    commands: f64,
    script_us: f64,
    command_us: f64,
}

impl ServerWork {
    fn per_cycle(stats: std::collections::BTreeMap<String, (u64, f64)>, cycles: u32) -> Self {
        let n = f64::from(cycles);
        let mut work = ServerWork {
            scripts: 0.0,
            commands: 0.0,
            script_us: 0.0,
            command_us: 0.0,
        };
        for (name, (calls, usec)) in stats {
            if name == "evalsha" {
                work.scripts += calls as f64 / n;
                work.script_us += usec / n;
            } else if !name.contains("subscribe") && name != "script|load" {
                work.commands += calls as f64 / n;
                work.command_us += usec / n;
            }
        }
        work
    }
}
