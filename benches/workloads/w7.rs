//! W7: memory, server side (Redis keys) and client side (heap per held lock and per waiter).

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fencelock::{Failure, IdempotencyOptions, LockClient};
use fencelock_testing::RedisServer;
use tokio::task::JoinSet;

use crate::admin::Admin;
use crate::common::{self, Contenders, Kind, Locker};
use crate::heap::{live_bytes, COUNTING};
use crate::measure::{hold_many, release_many};
use crate::stats::PEER_NOTE;
use crate::{Cfg, Report};

// ---------------------------------------------------------------------------------------------
// W7: memory, server side and client side.

pub async fn w7(cfg: &Cfg, report: &mut Report) {
    let held_n: usize = cfg.pick(10_000, 300);
    let names_n: usize = cfg.pick(100_000, 2_000);
    let mut text = String::from("### W7: memory\n\n");

    // --- Redis: one lock, its fence counter and op record.
    let server = common::start_server();
    let mut admin = Admin::new(&server).await;
    let client = LockClient::connect(&server.url()).await.expect("connect");
    let guard = client
        .lock("account:42")
        .expect("name")
        .acquire()
        .await
        .expect("acquire");
    let lock_key = admin.scan("fencelock:{*}lock:account:42").await;
    let fence_key = admin.scan("fencelock:{*}fence").await;
    assert_eq!((lock_key.len(), fence_key.len()), (1, 1));
    let one_lock = admin.memory_usage(&lock_key[0]).await;
    let one_fence = admin.memory_usage(&fence_key[0]).await;
    guard.release().await.expect("release");
    let op_key = admin.scan("fencelock:{*}op:*").await;
    let one_op = admin.memory_usage(&op_key[0]).await;
    // The same lock held with a label (a request id shaped like a UUID, 36 bytes), and the
    // client's name registration (default name: host name and process id).
    let labelled = client
        .lock("account:42")
        .expect("name")
        .with_label("5f0c8a42-1b7e-4c55-9d3a-0e6f7c2b9a11")
        .expect("label")
        .acquire()
        .await
        .expect("acquire");
    let one_labelled = admin.memory_usage(&lock_key[0]).await;
    labelled.release().await.expect("release");
    let name_key = admin.scan("fencelock:{*}client:*").await;
    assert_eq!(name_key.len(), 1, "one registration per client");
    let one_name = admin.memory_usage(&name_key[0]).await;

    // --- Redis: used_memory over many held locks, counters already created and earlier op
    // records removed, so the delta is the lock hashes plus each acquire's own op record.
    let lockers = |client: &LockClient| -> Vec<Locker> {
        (0..held_n)
            .map(|i| Locker::Ours(client.lock(format!("mem-{i}")).expect("name")))
            .collect()
    };
    release_many(hold_many(lockers(&client)).await).await;
    for keys in admin.scan("fencelock:{*}op:*").await.chunks(500) {
        let _: i64 = admin.query(redis::cmd("UNLINK").arg(keys)).await;
    }
    let m0 = admin.used_memory().await;
    let held = hold_many(lockers(&client)).await;
    let m1 = admin.used_memory().await;
    let ours_per_lock = (m1 - m0) as f64 / held_n as f64;
    release_many(held).await;

    // --- Redisson's layout, built by hand: lock hash `name` {"<uuid>:<threadId>": 1} with the
    // 30 s watchdog lease, plus RFencedLock's `redisson_lock_token:{name}` counter (no TTL).
    let m2 = admin.used_memory().await;
    for chunk in (0..held_n).collect::<Vec<_>>().chunks(500) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            let name = format!("redisson-mem-{i}");
            pipe.cmd("HSET")
                .arg(&name)
                .arg(format!("{REDISSON_UUID}:{}", 1 + i % 64))
                .arg(1)
                .ignore()
                .cmd("PEXPIRE")
                .arg(&name)
                .arg(30_000)
                .ignore()
                .cmd("INCR")
                .arg(format!("redisson_lock_token:{{{name}}}"))
                .ignore();
        }
        let () = admin.query(&pipe).await;
    }
    let m3 = admin.used_memory().await;
    let redisson_per_lock = (m3 - m2) as f64 / held_n as f64;
    let r_hash = admin.memory_usage(b"redisson-mem-0").await;
    let r_token = admin
        .memory_usage(b"redisson_lock_token:{redisson-mem-0}")
        .await;

    // --- Fence counters left after many distinct lock names (under a prefix of their own).
    let names = LockClient::builder(server.url())
        .prefix("names:")
        .connect()
        .await
        .expect("connect");
    let distinct: Vec<Locker> = (0..names_n)
        .map(|i| Locker::Ours(names.lock(format!("name-{i}")).expect("name")))
        .collect();
    release_many(hold_many(distinct).await).await;
    let counters = admin.scan("names:{*}fence").await.len();
    assert!(
        counters <= 16_384,
        "W7: {counters} fence counters, more than one per slot"
    );
    assert!(
        admin.scan("*{*}lock:*").await.is_empty(),
        "W7: a lock was left held"
    );
    drop((client, names));

    let _ = writeln!(
        text,
        "| Redis memory | fencelock | Redisson layout (built by hand, same server) |\n\
         | --- | ---: | ---: |\n\
         | `MEMORY USAGE` of one held lock (`account:42`) | {one_lock} B (hash) | {r_hash} B (hash) + {r_token} B (token key, RFencedLock) |\n\
         | the same lock held with a 36-byte label (`with_label`) | {one_labelled} B (hash) | – |\n\
         | a client's name registration (one per client, its default name `host:pid`) | {one_name} B | – |\n\
         | `used_memory` delta per held lock, {held_n} held | {ours_per_lock:.0} B (hash; an acquisition sent once leaves no op record) | {redisson_per_lock:.0} B (hash + token key) |\n\
         | per lock name ever used (kept forever) | ≤ 16384 fence counters in all, {one_fence} B each | one token key per name, {r_token} B each |\n\
         | counter keys after {names_n} distinct lock names | {counters} | {names_n} (by construction) |\n\
         | op record, one per hold (written by the release that frees the lock; already by the acquisition when it was re-sent), kept for the op-record TTL (10 s) | {one_op} B each | – |\n"
    );
    // --- Redis: one idempotency key after its run, with a small and a larger result.
    let small = idempotency_key_memory(&server, &mut admin, 64).await;
    let large = idempotency_key_memory(&server, &mut admin, 1024).await;
    let _ = writeln!(
        text,
        "| Redis memory of one idempotency key after its run (fingerprint 32 B) | result 64 B | result 1 KiB | kept for |\n\
         | --- | ---: | ---: | --- |\n\
         | its record `idem-rec:NAMESPACE:KEY` (`MEMORY USAGE`, encoding) | {} B ({}) | {} B ({}) | the namespace's retention (default 24 h; PTTL read {:.0} s) |\n\
         | its lock `idem:NAMESPACE:KEY` | 0 B (deleted by the release) | 0 B (deleted by the release) | – |\n\
         | op records the acquire and the release leave | {} B ({} key{}) | {} B ({} key{}) | the op-record TTL (10 s; PTTL read {:.1} s) |\n\
         | the slot's fence counter | shared (above) | shared (above) | forever, one per slot |\n\
         | any other key | {} | {} | – |\n\
         | per key, for the retention | **{} B** | **{} B** | |\n\
         | per key, its first 10 s | {} B | {} B | |\n\n\
         The record stays a listpack while each of its values is at most the server's \
         `hash-max-listpack-value` (64 B by default); a longer result turns it into a hash \
         table.\n",
        small.record,
        small.encoding,
        large.record,
        large.encoding,
        small.record_ttl.as_secs_f64(),
        small.ops,
        small.op_keys,
        if small.op_keys == 1 { "" } else { "s" },
        large.ops,
        large.op_keys,
        if large.op_keys == 1 { "" } else { "s" },
        small.op_ttl.as_secs_f64(),
        small.others,
        large.others,
        small.record,
        large.record,
        small.record + small.ops,
        large.record + large.ops,
    );
    report.target(
        "W7",
        "fence counter keys bounded (≤ 16384)",
        format!("{counters} after {names_n} names"),
        counters <= 16_384,
    );
    report.target(
        "C-W7",
        "cost: Redis memory per held lock ≤ 352 B (`used_memory` delta)",
        format!("{ours_per_lock:.0} B"),
        ours_per_lock <= 352.0,
    );
    drop(admin);
    drop(server);

    // --- Client side: heap bytes per held lock and per waiter (counting allocator).
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let client_n: usize = cfg.pick(2_000, 100);
    let waiters_n: usize = cfg.pick(500, 20);
    let _ = writeln!(
        text,
        "\n| client heap (counting allocator) | per held lock | per waiting acquire (task included) |\n\
         | --- | ---: | ---: |"
    );
    COUNTING.store(true, Ordering::SeqCst);
    // An idle task parked on a future that never completes, as a reference for the waiters.
    let idle = {
        let before = live_bytes();
        let mut set = JoinSet::new();
        for _ in 0..waiters_n {
            set.spawn(std::future::pending::<()>());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let per = (live_bytes() - before) as f64 / waiters_n as f64;
        set.shutdown().await;
        per
    };
    for kind in [Kind::Ours, Kind::Rslock, Kind::Distkit] {
        // Held: the guards live in a vector allocated before the baseline, so the delta is what
        // the library keeps per lock on the heap (plus the guard's inline size, listed apart).
        let lockers: Vec<Locker> = (0..client_n)
            .map(|i| contenders.locker(kind, &format!("client-{}-{i}", kind.slug())))
            .collect();
        let mut held = Vec::with_capacity(client_n);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before = live_bytes();
        for locker in &lockers {
            held.push(locker.acquire().await);
        }
        let per_held = (live_bytes() - before) as f64 / client_n as f64;
        for (locker, h) in lockers.iter().zip(held) {
            locker.release(h).await;
        }

        // Waiting: one holder, many tasks blocked in acquire.
        let locker = Arc::new(contenders.locker(kind, &format!("client-wait-{}", kind.slug())));
        let holder = locker.acquire().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before = live_bytes();
        let mut set = JoinSet::new();
        for _ in 0..waiters_n {
            let waiter = Arc::new(contenders.locker(kind, &format!("client-wait-{}", kind.slug())));
            set.spawn(async move { waiter.acquire().await });
        }
        tokio::time::sleep(cfg.secs(0.5, 0.2)).await;
        let per_waiter = (live_bytes() - before) as f64 / waiters_n as f64;
        set.abort_all();
        while let Some(joined) = set.join_next().await {
            assert!(
                joined.is_err(),
                "W7 {kind:?}: a waiter acquired a held lock"
            );
        }
        locker.release(holder).await;
        let _ = writeln!(
            text,
            "| {} | {:.0} B heap + {} B guard | {:.0} B |",
            kind.label(),
            per_held,
            match kind {
                Kind::Ours => std::mem::size_of::<fencelock::LockGuard>(),
                Kind::Rslock => std::mem::size_of::<rslock::LockGuard>(),
                _ => std::mem::size_of::<distkit::lock::MutexGuard>(),
            },
            per_waiter
        );
    }
    COUNTING.store(false, Ordering::SeqCst);
    let _ = writeln!(
        text,
        "\nAn idle tokio task parked on `pending()` costs {idle:.0} B, for reference. The \
         waiting figure includes each waiter's spawned task, its `Lock`/mutex handle and the \
         acquire future. Redis figures from `MEMORY USAGE <key> SAMPLES 0` and `INFO memory` \
         used_memory deltas on a fresh server (Redis 7, jemalloc); the Redisson layout: \
         `HSET name <uuid>:<threadId> 1` + `PEXPIRE name 30000` + `INCR \
         redisson_lock_token:{{name}}`.\n\n{PEER_NOTE}\n"
    );
    report.section(text);
}

/// The Redisson client id in the hand-built Redisson layout (a UUID string, as Redisson's).
const REDISSON_UUID: &str = "4f3a1b2c-9d8e-4f7a-8b6c-5d4e3f2a1b0c";

/// What one idempotency key leaves in Redis once its run finished.
struct KeyMemory {
    /// `MEMORY USAGE` of the key's record.
    record: i64,
    /// The record's encoding (`OBJECT ENCODING`).
    encoding: String,
    record_ttl: Duration,
    /// `MEMORY USAGE` of the op records the run's acquire and release left, summed.
    ops: i64,
    op_keys: usize,
    /// The longest time to live among them.
    op_ttl: Duration,
    /// Keys of the run that are neither the record, an op record nor the fence counter.
    others: usize,
}

/// Runs one idempotency key whose request returns `result_len` bytes, under a prefix of its
/// own, and measures every key the run leaves.
async fn idempotency_key_memory(
    server: &RedisServer,
    admin: &mut Admin,
    result_len: usize,
) -> KeyMemory {
    let prefix = format!("idem-{result_len}:");
    let client = LockClient::builder(server.url())
        .prefix(&prefix)
        .connect()
        .await
        .expect("connect");
    let outcome = client
        .idempotency("payments", IdempotencyOptions::new(Duration::from_secs(30)))
        .expect("namespace")
        .run("key-5f2c", [0x5a; 32], |_run| async move {
            Ok::<_, Failure<Infallible>>(vec![b'r'; result_len])
        })
        .await
        .expect("run");
    assert!(
        outcome.ran(),
        "W7: the idempotency key's request did not run"
    );
    let record = admin
        .scan(&format!("{prefix}{{*}}idem-rec:payments:key-5f2c"))
        .await;
    assert_eq!(
        record.len(),
        1,
        "W7: the idempotency key's record is missing"
    );
    let ttl = async |admin: &mut Admin, key: &[u8]| {
        let ms: i64 = admin.query(redis::cmd("PTTL").arg(key)).await;
        Duration::from_millis(ms.max(0) as u64)
    };
    let mut memory = KeyMemory {
        record: admin.memory_usage(&record[0]).await,
        encoding: admin
            .query(redis::cmd("OBJECT").arg("ENCODING").arg(&record[0]))
            .await,
        record_ttl: ttl(admin, &record[0]).await,
        ops: 0,
        op_keys: 0,
        op_ttl: Duration::ZERO,
        others: 0,
    };
    for key in admin.scan(&format!("{prefix}*")).await {
        let name = String::from_utf8_lossy(&key).into_owned();
        let after_tag = name.split_once('}').map_or("", |(_, rest)| rest);
        if after_tag.starts_with("op:") {
            memory.ops += admin.memory_usage(&key).await;
            memory.op_keys += 1;
            memory.op_ttl = memory.op_ttl.max(ttl(admin, &key).await);
        } else if after_tag.starts_with("idem:") {
            panic!("W7: the idempotency key's lock was left held");
        } else if key != record[0] && after_tag != "fence" {
            memory.others += 1;
        }
    }
    memory
}
