//! W5: the watchdog renewing thousands of held locks, against distkit's refresh tasks.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::admin::Admin;
use crate::common::{self, Contenders, Held, Kind, Locker};
use crate::measure::{hold_many, release_many};
use crate::stats::{fmt_us, process_cpu, us, PEER_NOTE};
use crate::{Cfg, Report};

// ---------------------------------------------------------------------------------------------
// W5: the watchdog at scale.

/// Waits until the server has run everything sent so far: its EVALSHA count stands still.
async fn settle(admin: &mut Admin) {
    let mut last = u64::MAX;
    loop {
        let now = admin
            .command_stats()
            .await
            .get("evalsha")
            .map_or(0, |s| s.0);
        if now == last {
            return;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the watchdog finished a tick: its call count moved and then stood still.
async fn next_tick(client: &LockClient, after: u64, expected: u64) -> u64 {
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < give_up,
            "W5: the watchdog did not renew for a minute"
        );
        let calls = client.renewal_calls();
        if calls >= after + expected {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let settled = client.renewal_calls();
            if settled == calls {
                return calls;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

pub async fn w5(cfg: &Cfg, report: &mut Report) {
    let locks: usize = cfg.pick(10_000, 300);
    // 3 s in the smoke run too: it asserts that every guard stayed valid, and with 1.5 s a
    // loaded machine slowing one tick of a few hundred locks could let leases run out.
    let lease = cfg.secs(3.0, 3.0);
    let period = lease / 3;
    let ticks = cfg.pick(5u32, 2);
    let batch = 100; // the default renew_batch
    let bound = locks.div_ceil(batch) as u64;

    // fencelock: one client, its watchdog renews everything every lease/3.
    let server = common::start_server();
    let mut admin = Admin::new(&server).await;
    let client = LockClient::builder(server.url())
        .default_lease(lease)
        .connect()
        .await
        .expect("connect");
    let lockers = (0..locks)
        .map(|i| Locker::Ours(client.lock(format!("w5-{i}")).expect("name")))
        .collect();
    let held = hold_many(lockers).await;
    assert_eq!(client.watched_locks(), locks);
    let c0 = next_tick(&client, client.renewal_calls(), 1).await;
    settle(&mut admin).await;
    admin.reset_stats().await;
    let (cpu0, rcpu0, t0) = (process_cpu(), admin.cpu().await, Instant::now());
    let mut calls = c0;
    for _ in 0..ticks {
        calls = next_tick(&client, calls, bound).await;
    }
    settle(&mut admin).await;
    let (cpu1, rcpu1, elapsed) = (process_cpu(), admin.cpu().await, t0.elapsed());
    let stats = admin.command_stats().await;
    let evalsha = stats.get("evalsha").map_or(0, |s| s.0);
    let ours_calls = (calls - c0) as f64 / f64::from(ticks);
    let ours_evalsha = evalsha as f64 / f64::from(ticks);
    let ours_cpu = us(cpu1 - cpu0) / f64::from(ticks);
    let ours_rcpu = us(rcpu1.saturating_sub(rcpu0)) / f64::from(ticks);
    assert!(
        held.iter().all(|(_, h)| match h {
            Held::Ours(g) => g.is_valid(),
            _ => false,
        }),
        "W5: a held lock was lost while the watchdog renewed"
    );
    release_many(held).await;
    assert_eq!(client.watched_locks(), 0);
    drop(client);
    drop(server);

    // distkit: one refresh task per guard, each its own script call every ttl/3.
    let server = common::start_server();
    let mut admin = Admin::new(&server).await;
    let contenders = Contenders::connect(&server.url()).await;
    let lockers = (0..locks)
        .map(|i| {
            let key = distkit::DistkitRedisKey::try_from(format!("w5-{i}")).expect("key");
            let options = distkit::lock::LockOptions::builder(key, contenders.distkit.clone())
                .ttl(lease)
                .build();
            Locker::Distkit(distkit::lock::Mutex::new(options))
        })
        .collect();
    let held = hold_many(lockers).await;
    tokio::time::sleep(period).await;
    admin.reset_stats().await;
    let (cpu0, rcpu0) = (process_cpu(), admin.cpu().await);
    tokio::time::sleep(period * ticks).await;
    let (cpu1, rcpu1) = (process_cpu(), admin.cpu().await);
    let stats = admin.command_stats().await;
    let dk_evalsha = stats.get("evalsha").map_or(0, |s| s.0) as f64 / f64::from(ticks);
    let dk_cpu = us(cpu1 - cpu0) / f64::from(ticks);
    let dk_rcpu = us(rcpu1.saturating_sub(rcpu0)) / f64::from(ticks);
    release_many(held).await;

    let mut text = format!(
        "### W5: watchdog at scale ({locks} held locks, lease {lease:?}, renewal every {period:?})\n\n\
         | contender | script calls / tick (client count) | EVALSHA / tick (server) | bound ceil(n / batch) | client CPU / tick | Redis CPU / tick |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n"
    );
    let _ = writeln!(
        text,
        "| {} | {ours_calls:.1} | {ours_evalsha:.1} | {bound} | {} | {} |",
        Kind::Ours.label(),
        fmt_us(ours_cpu),
        fmt_us(ours_rcpu)
    );
    let _ = writeln!(
        text,
        "| {} | – | {dk_evalsha:.1} | – | {} | {} |",
        Kind::Distkit.label(),
        fmt_us(dk_cpu),
        fmt_us(dk_rcpu)
    );
    let _ = writeln!(
        text,
        "\nfencelock measured over {ticks} ticks ({:.1} s, tick boundaries from \
         `LockClient::renewal_calls()`), distkit over {ticks} renewal periods. Client CPU: \
         the sum of this process' threads' on-CPU time (/proc/self/task/*/schedstat); Redis \
         CPU: `INFO cpu` used_cpu_user + used_cpu_sys. rslock has no watchdog (its `using` \
         extends one lock at a time). Every fencelock guard was still valid after the ticks.\n\n\
         {PEER_NOTE}\n",
        elapsed.as_secs_f64()
    );
    report.section(text);
    report.target(
        "W5",
        format!("≤ ceil({locks} / {batch}) = {bound} script calls per tick"),
        format!("{ours_calls:.1} (server saw {ours_evalsha:.1})"),
        ours_calls <= bound as f64 && ours_evalsha <= bound as f64,
    );
}
