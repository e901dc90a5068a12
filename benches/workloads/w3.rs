//! W3: 16 tasks contending for one key on one client.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::admin::Admin;
use crate::common::{self, Contenders, Kind};
use crate::contention::{cdf_series, contended_table, Contended};
use crate::measure::{per_unit, raw_rtt};
use crate::stats::{fmt_us, percentile, us, PEER_NOTE};
use crate::{Cfg, Report};

// ---------------------------------------------------------------------------------------------
// W3: 16 tasks, one key, one client.

struct Shared {
    inside: AtomicUsize,
    overlaps: AtomicU64,
    counter: AtomicU64,
    /// When the last holder started its release, and which task it was.
    last_release: parking_lot::Mutex<Option<(Instant, usize)>>,
    /// (task, acquire called, acquire returned), in grant order.
    grants: parking_lot::Mutex<Vec<(usize, Instant, Instant)>>,
    /// (handoff µs, went to another task)
    handoffs: parking_lot::Mutex<Vec<(f64, bool)>>,
}

pub async fn w3(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let mut admin = Admin::new(&server).await;
    let tasks = 16;
    let mut runs = Vec::new();
    let mut longest = Vec::new();
    for kind in [Kind::Ours, Kind::OursFair, Kind::Rslock, Kind::Distkit] {
        let rtt_cycles = cfg.pick(300, 10);
        let rtt_before = raw_rtt(&contenders.limit, rtt_cycles).await;
        let shared = Arc::new(Shared {
            inside: AtomicUsize::new(0),
            overlaps: AtomicU64::new(0),
            counter: AtomicU64::new(0),
            last_release: parking_lot::Mutex::new(None),
            grants: parking_lot::Mutex::new(Vec::new()),
            handoffs: parking_lot::Mutex::new(Vec::new()),
        });
        let duration = if kind.is_ours() {
            cfg.secs(3.0, 0.3)
        } else {
            cfg.secs(4.0, 0.3)
        };
        admin.reset_stats().await;
        let started = Instant::now();
        let end = started + duration;
        let mut set = JoinSet::new();
        for task in 0..tasks {
            let locker = contenders.locker(kind, &format!("w3-{}", kind.slug()));
            let shared = shared.clone();
            set.spawn(async move {
                let (mut acquisitions, mut waits) = (0u64, Vec::new());
                while Instant::now() < end {
                    let called = Instant::now();
                    let held = locker.acquire().await;
                    let acquired = Instant::now();
                    if shared.inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        shared.overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    // The critical section: a deliberately non-atomic increment, so an overlap
                    // would show up as a lost update.
                    let value = shared.counter.load(Ordering::Relaxed);
                    shared.counter.store(value + 1, Ordering::Relaxed);
                    acquisitions += 1;
                    shared.grants.lock().push((task, called, acquired));
                    waits.push(us(acquired - called));
                    if let Some((released, by)) = shared.last_release.lock().take() {
                        shared
                            .handoffs
                            .lock()
                            .push((us(acquired - released), by != task));
                    }
                    shared.inside.fetch_sub(1, Ordering::SeqCst);
                    *shared.last_release.lock() = Some((Instant::now(), task));
                    locker.release(held).await;
                }
                (acquisitions, waits)
            });
        }
        let mut run = Contended {
            kind,
            acquisitions: 0,
            elapsed: Duration::ZERO,
            handoffs: Vec::new(),
            cross: Vec::new(),
            waits: Vec::new(),
            round_trips: String::new(),
            owners: Vec::new(),
            rtt: Duration::ZERO,
        };
        while let Some(joined) = set.join_next().await {
            let (acquisitions, waits) = joined.expect("w3 task");
            run.acquisitions += acquisitions;
            run.waits.extend(waits);
        }
        run.elapsed = started.elapsed();
        let grants = std::mem::take(&mut *shared.grants.lock());
        run.owners = grants.iter().map(|g| g.0).collect();
        // Who got the lock while the longest waiter waited: at most the 15 others if the
        // queue is FIFO, so a long wait with few grants in it is a stall, not unfairness.
        if let Some(&(task, called, acquired)) = grants.iter().max_by_key(|g| g.2 - g.1) {
            let during = grants
                .iter()
                .filter(|g| g.2 > called && g.2 < acquired)
                .count();
            let mut gaps: Vec<Duration> = grants
                .windows(2)
                .filter(|w| w[1].2 > called && w[1].2 <= acquired)
                .map(|w| w[1].2 - w[0].2)
                .collect();
            gaps.sort();
            longest.push(format!(
                "{}: the longest wait ({}, task {task}) saw {during} grants to other tasks; the \
                 longest gap between two grants in it was {}",
                kind.label(),
                fmt_us(us(acquired - called)),
                fmt_us(gaps.last().map_or(f64::NAN, |g| us(*g)))
            ));
        }
        for (handoff, cross) in shared.handoffs.lock().drain(..) {
            run.handoffs.push(handoff);
            if cross {
                run.cross.push(handoff);
            }
        }
        let counts = admin.round_trips(kind).await;
        run.round_trips = per_unit(&counts, run.acquisitions as f64).1;
        let rtt_after = raw_rtt(&contenders.limit, rtt_cycles).await;
        run.rtt = (rtt_before + rtt_after) / 2;

        assert_eq!(
            shared.overlaps.load(Ordering::SeqCst),
            0,
            "W3 {kind:?}: two holders inside at once"
        );
        assert_eq!(
            shared.counter.load(Ordering::SeqCst),
            run.acquisitions,
            "W3 {kind:?}: counter != acquisitions (lost update)"
        );
        assert!(run.acquisitions > 0, "W3 {kind:?}: no acquisition");
        runs.push(run);
    }
    let ours_keys = admin.scan("fencelock:{*}lock:*").await;
    assert!(ours_keys.is_empty(), "W3: a lock was left held");

    let mut text = contended_table(
        "W3: 16 tasks, one key, one client (critical section: a counter increment)",
        "task",
        &runs,
    );
    let _ = writeln!(
        text,
        "\nHandoff: the holder starts its release → the next holder's acquire returns. Wait: \
         acquire called → returned. Raw RTT: one acquire-shaped EVALSHA on the limit's \
         connection, measured right before and after each contender. Peers run with their \
         defaults: rslock retries after a random 0–200 ms, distkit polls every 50 ms.\n"
    );
    for line in &longest {
        let _ = writeln!(text, "- {line}");
    }
    let _ = writeln!(text, "\n{PEER_NOTE}\n");
    report.section(text);
    let ours = &runs[0];
    let p50 = ours.in_rtt(percentile(&ours.handoffs, 50.0));
    report.target(
        "W3a",
        "≥ 0.5 acquisitions per two raw RTT",
        format!("{:.2}", ours.per_two_rtt()),
        ours.per_two_rtt() >= 0.5,
    );
    report.target(
        "W3b",
        "handoff p50 ≤ 3 raw RTT",
        format!("{p50:.1} RTT"),
        p50 <= 3.0,
    );
    report.target(
        "W3c",
        "max wait < 10 × mean wait",
        format!("{:.1}×", ours.wait_ratio()),
        ours.wait_ratio() < 10.0,
    );
    report.target(
        "C-W3",
        "cost: ≥ 1.6 acquisitions per two raw RTT",
        format!("{:.2}", ours.per_two_rtt()),
        ours.per_two_rtt() >= 1.6,
    );
    report.cdfs.push((
        "W3: 16 tasks, one client".into(),
        us(ours.rtt),
        cdf_series(&runs, "task"),
    ));
}
