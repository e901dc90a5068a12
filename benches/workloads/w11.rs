//! W11: a semaphore's two ways of keeping its holds' deadlines (hash-field expiry, lease zset).

use std::fmt::Write as _;
use std::time::Duration;

use fencelock::{HoldExpiry, LockClient};

use crate::admin::Admin;
use crate::common;
use crate::measure::{interleaved, throughput};
use crate::stats::{fmt_us, median};
use crate::{Cfg, Report};

// ---------------------------------------------------------------------------------------------
// W11: the two ways a semaphore keeps its holds' deadlines (hash-field expiry, lease zset), on
// one server that has both, each against the other in the same run.

pub async fn w11(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let connect = async |expiry: HoldExpiry| {
        LockClient::builder(server.url())
            .hold_expiry(expiry)
            .connect()
            .await
            .expect("connect")
    };
    let probe = connect(HoldExpiry::Auto).await;
    if probe.hold_expiry() != HoldExpiry::FieldExpiry {
        report.section(format!(
            "### W11: hash-field expiry against the lease zset: skipped ({} has no hash-field \
             expiry; set FENCELOCK_REDIS_SERVER to a Redis 7.4+ or Valkey 9.0+ binary)\n",
            probe.server()
        ));
        return;
    }
    let ways = [HoldExpiry::FieldExpiry, HoldExpiry::LeaseZset];
    let mut clients = Vec::new();
    for way in ways {
        let mut four = Vec::new();
        for _ in 0..4 {
            four.push(connect(way).await);
        }
        clients.push(four);
    }
    // (a) uncontended read + release, 2 round trips each way.
    let (fields_rw, zset_rw) = (
        clients[0][0].rwlock("w11-free-f").expect("rwlock"),
        clients[1][0].rwlock("w11-free-z").expect("rwlock"),
    );
    let (free_fields, free_zset, free_ratios) = interleaved(
        cfg.pick(40, 2),
        cfg.pick(32, 2),
        async || read_release_owned(fields_rw.clone()).await,
        async || read_release_owned(zset_rw.clone()).await,
    )
    .await;
    // (b) 64 readers of one lock and (c) a semaphore of 4 permits with 16 contenders, each
    // way, on locks of their own.
    let window = cfg.pick(Duration::from_secs(3), Duration::from_millis(300));
    let mut readers = Vec::new();
    let mut sems = Vec::new();
    for (way, four) in ways.iter().zip(&clients) {
        let four = four.clone();
        let name = format!("w11-readers-{way:?}");
        readers.push(
            throughput(64, window, move |task| {
                let lock = four[task % 4].rwlock(&name).expect("rwlock");
                async move { read_release_owned(lock).await }
            })
            .await,
        );
    }
    for (way, four) in ways.iter().zip(&clients) {
        let four = four.clone();
        let name = format!("w11-sem-{way:?}");
        sems.push(
            throughput(16, window, move |task| {
                let pool = four[task % 4].semaphore(&name, 4).expect("semaphore");
                async move {
                    pool.acquire(1)
                        .await
                        .expect("permit")
                        .release()
                        .await
                        .expect("release");
                }
            })
            .await,
        );
    }
    // (d) memory with 1 and 101 readers, each way.
    let mut admin = Admin::new(&server).await;
    let mut bytes = Vec::new();
    for (way, four) in ways.iter().zip(&clients) {
        let mut sizes = Vec::new();
        for holders in [1usize, 101] {
            let name = format!("w11-mem-{way:?}-{holders}");
            let mut reads = Vec::new();
            for _ in 0..holders {
                reads.push(
                    four[0]
                        .rwlock(&name)
                        .expect("rwlock")
                        .read()
                        .await
                        .expect("read"),
                );
            }
            let mut total = 0;
            for key in admin.scan(&format!("fencelock:{{*}}rw*:{name}")).await {
                total += admin.memory_usage(&key).await;
            }
            sizes.push(total);
            for read in reads {
                read.release().await.expect("release");
            }
        }
        bytes.push((sizes[0], (sizes[1] - sizes[0]) as f64 / 100.0));
    }

    let mut text = format!(
        "### W11: hash-field expiry against the lease zset ({})\n\n\
         | what | field expiry | lease zset | ratio (field expiry / lease zset) |\n\
         | --- | ---: | ---: | ---: |\n",
        probe.server()
    );
    let _ = writeln!(
        text,
        "| read-write lock: read + release, free | {} | {} | {:.2} |",
        fmt_us(median(&free_fields)),
        fmt_us(median(&free_zset)),
        median(&free_ratios),
    );
    let _ = writeln!(
        text,
        "| 64 readers of one read-write lock, 4 clients, calls/s ({:.1} s windows) | {:.0} | {:.0} | {:.2} |",
        window.as_secs_f64(),
        readers[0],
        readers[1],
        readers[0] / readers[1],
    );
    let _ = writeln!(
        text,
        "| semaphore of 4 permits, 16 contenders, 4 clients, calls/s | {:.0} | {:.0} | {:.2} |",
        sems[0],
        sems[1],
        sems[0] / sems[1],
    );
    let _ = writeln!(
        text,
        "| Redis memory, read-write lock with 1 reader | {} B | {} B | {:.2} |",
        bytes[0].0,
        bytes[1].0,
        bytes[0].0 as f64 / bytes[1].0 as f64,
    );
    let _ = writeln!(
        text,
        "| Redis memory per further reader | {:.0} B | {:.0} B | {:.2} |\n",
        bytes[0].1,
        bytes[1].1,
        bytes[0].1 / bytes[1].1,
    );
    report.section(text);
}

/// One read of `lock`, released at once.
async fn read_release_owned(lock: fencelock::RwLock) {
    lock.read()
        .await
        .expect("read")
        .release()
        .await
        .expect("release");
}
