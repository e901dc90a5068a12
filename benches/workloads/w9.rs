//! W9: run-once scheduled jobs: a run on a free tick and the two skips.

use std::fmt::Write as _;
use std::time::Duration;

use fencelock::LockClient;

use crate::common::{self, Contenders};
use crate::measure::interleaved;
use crate::stats::{fmt_us, median};
use crate::{Cfg, Report};

// ---------------------------------------------------------------------------------------------
// W9: run-once scheduled jobs: a run on a free tick, and the two skips, against raw EVALSHA
// round trips measured interleaved with them.

pub async fn w9(cfg: &Cfg, report: &mut Report) {
    use fencelock::JobOptions;
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let other = LockClient::connect(&server.url())
        .await
        .expect("connect the other instance");
    let period = Duration::from_secs(60);
    let options = JobOptions::new(period, Duration::from_secs(30));
    let ours = contenders.ours.job("w9", options.clone()).expect("job");
    let limit = &contenders.limit;
    let keys = limit.keys("w9");
    let rounds = cfg.pick(40, 2);
    let n: u32 = cfg.pick(32, 2);
    let first = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let raw_trips = async |trips: usize| {
        let holder = limit.acquire(&keys).await;
        for _ in 2..trips {
            let _replay = limit.acquire(&keys).await;
        }
        limit.release(&keys, &holder).await;
    };

    // (a) a run on a free tick: acquire, begin, finish, release = 4 round trips.
    let mut tick = 0u32;
    let (run, run_limit, run_ratios) = interleaved(
        rounds,
        n,
        async || {
            tick += 1;
            let outcome = ours
                .run_exclusive(first + period * tick, |_run| async {})
                .await
                .expect("run");
            assert!(outcome.ran());
        },
        async || raw_trips(4).await,
    )
    .await;

    // (b) the tick is done and the job free (a late instance): acquire, begin (done),
    // release = 3 round trips.
    let done_tick = first + period * (tick + 1);
    assert!(ours
        .run_exclusive(done_tick, |_run| async {})
        .await
        .expect("run")
        .ran());
    let (done, done_limit, done_ratios) = interleaved(
        rounds,
        n,
        async || {
            let outcome = ours
                .run_exclusive(done_tick, |_run| async {})
                .await
                .expect("skip");
            assert!(matches!(outcome, fencelock::JobOutcome::SkippedDone { .. }));
        },
        async || raw_trips(3).await,
    )
    .await;

    // (c) another instance runs the tick: try_acquire (busy) and the record's read = 2 round
    // trips.
    let busy_tick = first + period * (tick + 2);
    let (began_tx, began_rx) = tokio::sync::oneshot::channel();
    let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
    let runner = other.job("w9", options).expect("job");
    let running = tokio::spawn(async move {
        runner
            .run_exclusive(busy_tick, |_run| async move {
                began_tx.send(()).expect("began");
                end_rx.await.expect("end");
            })
            .await
            .expect("the other instance's run")
    });
    began_rx.await.expect("the other instance began");
    let (busy, busy_limit, busy_ratios) = interleaved(
        rounds,
        n,
        async || {
            let outcome = ours
                .run_exclusive(busy_tick, |_run| async {})
                .await
                .expect("skip");
            assert!(matches!(
                outcome,
                fencelock::JobOutcome::SkippedRunning { record: Some(_) }
            ));
        },
        async || raw_trips(2).await,
    )
    .await;
    end_tx.send(()).expect("end");
    assert!(running.await.expect("runner task").ran());

    let mut text = String::from(
        "### W9: run-once scheduled jobs (`Job::run_exclusive`)\n\n\
         | what | round trips | fencelock | limit (same number of raw EVALSHA) | ratio |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
    );
    for (label, trips, ours, limit, ratios) in [
        (
            "ran: a free tick, an empty job",
            4,
            &run,
            &run_limit,
            &run_ratios,
        ),
        (
            "skipped: the tick is done, the job free",
            3,
            &done,
            &done_limit,
            &done_ratios,
        ),
        (
            "skipped: another instance runs it",
            2,
            &busy,
            &busy_limit,
            &busy_ratios,
        ),
    ] {
        let _ = writeln!(
            text,
            "| {label} | {trips} | {} | {} | {:.2} |",
            fmt_us(median(ours)),
            fmt_us(median(limit)),
            median(ratios),
        );
    }
    let _ = writeln!(
        text,
        "\n{rounds} interleaved rounds of {n} calls each; ratio = median of per-round ratios. \
         Peers have no scheduled job.\n"
    );
    report.section(text);
}
