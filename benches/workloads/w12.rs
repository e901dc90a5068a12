//! W12: idempotency keys: a run on a new key and a duplicate answered from the key's record.

use std::cell::Cell;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::time::Duration;

use fencelock::{Failure, IdempotencyOptions, Processed};

use crate::admin::Admin;
use crate::common::{self, Contenders};
use crate::measure::{interleaved, monitored, per_unit};
use crate::stats::{fmt_us, median};
use crate::{Cfg, Report};

/// The fingerprint every request of the workload sends: as long as a SHA-256 digest of the
/// request's parameters.
const FINGERPRINT: [u8; 32] = [0x5a; 32];

/// The result a run stores: a small response body.
const RESULT_LEN: usize = 64;

// ---------------------------------------------------------------------------------------------
// W12: idempotency keys: a run on a new key (try_acquire, idem_begin.lua, the closure,
// idem_finish.lua, release) and a duplicate of a finished key (try_acquire, idem_begin.lua
// answering from the record, release), against raw EVALSHA round trips measured interleaved
// with them.

pub async fn w12(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let mut admin = Admin::new(&server).await;
    let payments = contenders
        .ours
        .idempotency("w12", IdempotencyOptions::new(Duration::from_secs(30)))
        .expect("namespace");
    let limit = &contenders.limit;
    let keys = limit.keys("w12");
    let rounds = cfg.pick(40, 2);
    let n: u32 = cfg.pick(32, 2);
    let result = vec![b'r'; RESULT_LEN];
    // How often a request's closure ran, and how many distinct keys were sent to run.
    let closures = Cell::new(0u64);
    let mut fresh = 0u64;
    let raw_trips = async |trips: usize| {
        let holder = limit.acquire(&keys).await;
        for _ in 2..trips {
            let _replay = limit.acquire(&keys).await;
        }
        limit.release(&keys, &holder).await;
    };
    // Every call sends a key no call sent before, so its request runs.
    let mut run_new = async || {
        fresh += 1;
        let outcome = payments
            .run(format!("new-{fresh}"), FINGERPRINT, |_run| async {
                closures.set(closures.get() + 1);
                Ok::<_, Failure<Infallible>>(result.clone())
            })
            .await
            .expect("run");
        assert!(outcome.ran(), "W12: a new key's request did not run");
    };
    // The key is finished: its duplicates are answered from the record, the closure never
    // runs.
    let duplicate = async || {
        let outcome = payments
            .run("done", FINGERPRINT, |_run| async {
                Ok::<_, Failure<Infallible>>(Vec::new())
            })
            .await
            .expect("duplicate");
        assert!(
            matches!(outcome, Processed::Completed(_)),
            "W12: a duplicate of a finished key was not answered from its record"
        );
        assert_eq!(
            outcome.result(),
            Some(&result[..]),
            "W12: a duplicate did not get the stored result"
        );
    };
    // The first run stores the result the duplicates get; it also loads the scripts, so the
    // counts below see no SCRIPT LOAD.
    let first = payments
        .run("done", FINGERPRINT, |_run| async {
            Ok::<_, Failure<Infallible>>(result.clone())
        })
        .await
        .expect("the first run");
    assert!(first.ran());
    run_new().await;
    duplicate().await;

    // Round trips each makes, counted by MONITOR (not while timing).
    let probe = cfg.pick(100u32, 3);
    let counts = monitored(&server, &mut admin, async {
        for _ in 0..probe {
            run_new().await;
        }
    })
    .await;
    let (run_trips, run_breakdown) = per_unit(&counts, f64::from(probe));
    let counts = monitored(&server, &mut admin, async {
        for _ in 0..probe {
            duplicate().await;
        }
    })
    .await;
    let (dup_trips, dup_breakdown) = per_unit(&counts, f64::from(probe));

    // (a) a run on a new key: 4 round trips; the limit is 4 raw EVALSHA.
    let (run, run_limit, run_ratios) = interleaved(
        rounds,
        n,
        async || run_new().await,
        async || raw_trips(4).await,
    )
    .await;

    // (b) a duplicate of a finished key: 3 round trips; the limit is 3 raw EVALSHA.
    let ran_before = closures.get();
    let (dup, dup_limit, dup_ratios) = interleaved(
        rounds,
        n,
        async || duplicate().await,
        async || raw_trips(3).await,
    )
    .await;

    // The invariants: every new key's request ran once, the duplicates ran nothing, and no
    // key is left held.
    assert_eq!(
        closures.get(),
        fresh,
        "W12: runs of new keys and closures run differ"
    );
    assert_eq!(
        closures.get(),
        ran_before,
        "W12: a duplicate ran the request"
    );
    assert!(
        admin.scan("fencelock:{*}idem:*").await.is_empty(),
        "W12: an idempotency key's lock was left held"
    );

    let mut text = String::from(
        "### W12: idempotency keys (`Idempotency::run`)\n\n\
         | what | round trips (MONITOR) | fencelock | one raw EVALSHA | fencelock / one raw EVALSHA | fencelock / as many raw EVALSHA |\n\
         | --- | --- | ---: | ---: | ---: | ---: |\n",
    );
    let mut ratios = Vec::new();
    for (label, trips, breakdown, ours, limit, per_round) in [
        (
            "ran: a new key, a result of 64 B",
            4,
            &run_breakdown,
            &run,
            &run_limit,
            &run_ratios,
        ),
        (
            "duplicate: the key is done, answered from the record",
            3,
            &dup_breakdown,
            &dup,
            &dup_limit,
            &dup_ratios,
        ),
    ] {
        let ratio = median(per_round);
        let _ = writeln!(
            text,
            "| {label} | {breakdown} | {} | {} | {:.2} | {ratio:.2} |",
            fmt_us(median(ours)),
            fmt_us(median(limit) / f64::from(trips)),
            ratio * f64::from(trips),
        );
        ratios.push((trips, ratio));
    }
    let _ = writeln!(
        text,
        "\n{rounds} interleaved rounds of {n} calls each against as many raw EVALSHA as the \
         call makes round trips (4 for a run, 3 for a duplicate); ratio = median of per-round \
         ratios, \"one raw EVALSHA\" = the limit's time / its round trips in the same rounds. \
         A run: `try_acquire` of the key's lock, `idem_begin.lua`, the closure (returns 64 B \
         at once), `idem_finish.lua`, the release; a duplicate: `try_acquire`, \
         `idem_begin.lua` answering with the stored result, the release. Fingerprints of \
         32 B. Round trips counted by MONITOR over {probe} calls of each. Peers have no \
         idempotency keys.\n"
    );
    report.section(text);
    let (run_ratio, dup_ratio) = (ratios[0].1, ratios[1].1);
    report.target(
        "W12a",
        "idempotency key, a run on a new key ≤ 1.5 × its 4 raw round trips",
        format!("{run_ratio:.2}× ({run_trips:.2} round trips)"),
        run_ratio <= 1.5,
    );
    report.target(
        "W12b",
        "idempotency key, a duplicate answered from the record ≤ 1.5 × its 3 raw round trips",
        format!("{dup_ratio:.2}× ({dup_trips:.2} round trips)"),
        dup_ratio <= 1.5,
    );
}
