//! The metrics of the `metrics` feature (documented in `fencelock::observability`), counted
//! through a scripted scenario on a throwaway redis-server.
//!
//! The recorder is installed as the thread's default on a current-thread runtime, so the
//! library's background work (watchdog renewals, releases of dropped guards) records into it
//! too, and tests of this binary do not see each other's metrics.
#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::time::Duration;

use crate::common::{eventually, Fixture};
use fencelock::LockClient;
use fencelock_testing::{Direction, FaultProxy};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redis::Commands;

/// Counter and gauge totals and histogram sample counts by `name{label=value,...}`, accumulated over
/// snapshots (a snapshot drains the recorder).
#[derive(Default)]
struct Totals {
    counters: HashMap<String, u64>,
    samples: HashMap<String, Vec<f64>>,
    gauges: HashMap<String, f64>,
}

impl Totals {
    fn update(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<_> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let name = if labels.is_empty() {
                key.name().to_owned()
            } else {
                format!("{}{{{}}}", key.name(), labels.join(","))
            };
            match value {
                DebugValue::Counter(n) => *self.counters.entry(name).or_default() += n,
                DebugValue::Histogram(values) => self
                    .samples
                    .entry(name)
                    .or_default()
                    .extend(values.into_iter().map(|v| v.into_inner())),
                // Drained like a counter: the change since the last snapshot.
                DebugValue::Gauge(change) => {
                    *self.gauges.entry(name).or_default() += change.into_inner();
                }
            }
        }
    }

    fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    fn gauge(&self, name: &str) -> f64 {
        self.gauges.get(name).copied().unwrap_or(0.0)
    }

    fn samples(&self, name: &str) -> &[f64] {
        self.samples.get(name).map_or(&[], Vec::as_slice)
    }
}

#[tokio::test]
async fn a_scripted_scenario_is_counted_exactly() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let mut totals = Totals::default();

    let fx = Fixture::start();
    // Renewals every 2 s, so the scenario sees some, and a deleted lock is found by a renewal
    // well before its lease (6 s) runs out.
    let client = LockClient::builder(fx.server.url())
        .default_lease(Duration::from_secs(6))
        .connect()
        .await
        .unwrap();
    let lock = client.lock("account:1").unwrap();

    // 1. An uncontended acquisition, and a try that finds the lock busy.
    let first = lock.acquire().await.unwrap();
    let first_token = first.token();
    assert!(lock.try_acquire().await.unwrap().is_none());

    // 2. A contended acquisition: it queues, and gets the lock when the first holder leaves.
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire().await }
    });
    assert!(
        eventually(Duration::from_secs(10), || {
            totals.update(&snapshotter);
            totals.counter("fencelock_contended_total") == 1
        })
        .await
    );
    // The holder stays until the watchdog has renewed it at least once.
    assert!(
        eventually(Duration::from_secs(10), || client.renewal_calls() >= 1).await,
        "the watchdog never renewed the held lock"
    );
    first.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();

    // 3. A re-entry left (an exit, not a release of the lock).
    second.reenter().await.unwrap().release().await.unwrap();

    // 4. A stale write: the first holder's token after the second holder wrote.
    let resource = client.resource("balance:1").unwrap();
    resource.set(second.token(), "100").await.unwrap();
    assert!(resource
        .set(first_token, "0")
        .await
        .unwrap_err()
        .is_stale_token());
    second.release().await.unwrap();

    // 5. A lost lease: the key is deleted under a holder; the watchdog finds out.
    let third = lock.acquire().await.unwrap();
    let _: () = fx.raw().del(fx.lock_key("account:1").unwrap()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), third.lost())
        .await
        .expect("the watchdog reports the deleted lock");
    assert!(third.release().await.unwrap_err().is_not_held());

    totals.update(&snapshotter);
    assert_eq!(
        totals.counter("fencelock_acquisitions_total{outcome=acquired}"),
        3
    );
    assert_eq!(
        totals.counter("fencelock_acquisitions_total{outcome=busy}"),
        1
    );
    assert_eq!(
        totals.counter("fencelock_acquisitions_total{outcome=timeout}"),
        0
    );
    assert_eq!(totals.counter("fencelock_contended_total"), 1);
    // One wait sample per acquire call, whatever its outcome.
    assert_eq!(totals.samples("fencelock_wait_seconds").len(), 4);
    assert_eq!(totals.counter("fencelock_stale_writes_rejected_total"), 1);
    assert_eq!(totals.counter("fencelock_lost_leases_total"), 1);
    assert_eq!(
        totals.counter("fencelock_releases_total{outcome=released}"),
        2
    );
    assert_eq!(
        totals.counter("fencelock_releases_total{outcome=exited}"),
        1
    );
    assert_eq!(
        totals.counter("fencelock_releases_total{outcome=not_held}"),
        1
    );
    // One hold sample per holder that freed the lock itself.
    let holds = totals.samples("fencelock_hold_seconds");
    assert_eq!(holds.len(), 2, "{holds:?}");
    assert!(holds.iter().all(|s| *s >= 0.0));
    // The metric agrees with the client's own count of renewal calls, and each call renewed
    // the one lock held then, except the one that found it deleted.
    let calls = client.renewal_calls();
    assert!(
        calls >= 2,
        "at least the renewal before the release and the one that found the loss"
    );
    assert_eq!(totals.counter("fencelock_renewal_calls_total"), calls);
    assert_eq!(totals.counter("fencelock_renewals_total"), calls - 1);
}

/// The holds gauge follows the holds alive (a re-entry is no new hold), and every hold held
/// past `max_hold` is counted once, whether the watchdog renews it or it has a lease of its
/// own; a short hold is not.
#[tokio::test]
async fn holds_in_progress_and_long_holds_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let mut totals = Totals::default();
    let fx = Fixture::start();
    // The watchdog looks every second (a third of the default lease).
    let client = LockClient::builder(fx.server.url())
        .default_lease(Duration::from_secs(3))
        .max_hold(Duration::from_millis(1500))
        .connect()
        .await
        .unwrap();
    let renewed = client.lock("renewed").unwrap().acquire().await.unwrap();
    let own_lease = client
        .lock("own-lease")
        .unwrap()
        .with_lease(Duration::from_secs(20))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let inner = renewed.reenter().await.unwrap();
    let permit = client
        .semaphore("pool", 2)
        .unwrap()
        .acquire(1)
        .await
        .unwrap();
    totals.update(&snapshotter);
    assert_eq!(
        totals.gauge("fencelock_holds"),
        3.0,
        "a re-entry is no new hold"
    );
    assert_eq!(client.watched_locks(), 2, "only renewed holds are watched");
    client
        .lock("short")
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    assert!(
        eventually(Duration::from_secs(10), || {
            totals.update(&snapshotter);
            totals.counter("fencelock_long_holds_total") == 3
        })
        .await,
        "three holds past max_hold: {}",
        totals.counter("fencelock_long_holds_total")
    );
    // More watchdog rounds report nothing again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    totals.update(&snapshotter);
    assert_eq!(
        totals.counter("fencelock_long_holds_total"),
        3,
        "once per hold"
    );

    inner.release().await.unwrap();
    renewed.release().await.unwrap();
    own_lease.release().await.unwrap();
    permit.release().await.unwrap();
    totals.update(&snapshotter);
    assert_eq!(totals.gauge("fencelock_holds"), 0.0);
}

#[tokio::test]
async fn job_ticks_are_counted_by_outcome() {
    use fencelock::{JobOptions, OnRunnerDeath};
    use std::time::UNIX_EPOCH;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let mut totals = Totals::default();
    let fx = Fixture::start();
    let client = fx.client().await;
    let period = Duration::from_secs(60);
    let job = client
        .job("counted", JobOptions::new(period, Duration::from_secs(5)))
        .unwrap();
    let tick = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    assert!(job
        .run_exclusive(tick, |_run| async {})
        .await
        .unwrap()
        .ran());
    let done = job.run_exclusive(tick, |_run| async {}).await.unwrap();
    assert!(!done.ran());
    let late = job
        .run_exclusive(tick - period, |_run| async {})
        .await
        .unwrap();
    assert!(!late.ran());
    // A runner dropped mid-job: the next call under GiveUp finds its tick abandoned.
    let next = tick + period;
    let dropped = job.run_exclusive(next, |_run| std::future::pending::<()>());
    let _ = tokio::time::timeout(Duration::from_millis(200), dropped).await;
    let give_up = client
        .job(
            "counted",
            JobOptions::new(period, Duration::from_secs(5)).on_runner_death(OnRunnerDeath::GiveUp),
        )
        .unwrap();
    let abandoned = loop {
        // The dropped run's lock is released in the background.
        let outcome = give_up.run_exclusive(next, |_run| async {}).await.unwrap();
        if !matches!(outcome, fencelock::JobOutcome::SkippedRunning { .. }) {
            break outcome;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(
        matches!(abandoned, fencelock::JobOutcome::SkippedAbandoned { .. }),
        "{abandoned:?}"
    );

    totals.update(&snapshotter);
    assert_eq!(totals.counter("fencelock_job_ticks_total{outcome=ran}"), 1);
    assert_eq!(
        totals.counter("fencelock_job_ticks_total{outcome=skipped_done}"),
        1
    );
    assert_eq!(
        totals.counter("fencelock_job_ticks_total{outcome=skipped_late}"),
        1
    );
    assert_eq!(
        totals.counter("fencelock_job_ticks_total{outcome=skipped_abandoned}"),
        1
    );
}

#[tokio::test]
async fn leadership_changes_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let mut totals = Totals::default();
    let fx = Fixture::start();
    let client = fx.client().await;
    let election = client.election("counted").unwrap();
    for _ in 0..3 {
        election
            .campaign(b"x")
            .await
            .unwrap()
            .resign()
            .await
            .unwrap();
    }
    assert!(election
        .try_campaign(b"y")
        .await
        .unwrap()
        .is_some_and(|l| l.term().get() > 0));
    totals.update(&snapshotter);
    assert_eq!(
        totals.counter("fencelock_leadership_changes_total{change=elected}"),
        4
    );
    assert_eq!(
        totals.counter("fencelock_leadership_changes_total{change=resigned}"),
        3
    );
}

/// A release that fails goes on from the guard's drop as the same operation; the two are one
/// release, counted once, with the outcome it ends with.
#[tokio::test]
async fn a_failed_release_that_goes_on_in_the_background_counts_once() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let mut totals = Totals::default();
    let fx = Fixture::start();
    let proxy = FaultProxy::start(fx.server.addr()).unwrap();
    let client = LockClient::builder(proxy.url())
        .retry_window(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let guard = client.lock("cut-off").unwrap().acquire().await.unwrap();
    proxy.blackhole(Direction::Both);
    assert!(guard.release().await.is_err());
    // The background release fails the same way, within its own retry window: counted then,
    // and nothing more after it.
    let errors = |totals: &mut Totals| {
        totals.update(&snapshotter);
        totals.counter("fencelock_releases_total{outcome=error}")
    };
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while errors(&mut totals) == 0 && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    totals.update(&snapshotter);
    assert_eq!(totals.counter("fencelock_releases_total{outcome=error}"), 1);
    proxy.heal();
}

#[tokio::test]
async fn semaphore_acquisitions_are_counted_by_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let mut totals = Totals::default();
    let fx = Fixture::start();
    let client = fx.client().await;
    let pool = client.semaphore("counted", 2).unwrap();
    let held = pool.acquire(2).await.unwrap();
    assert!(pool.try_acquire(1).await.unwrap().is_none());
    let timed_out = pool.acquire_timeout(1, Duration::from_millis(50)).await;
    assert!(timed_out.unwrap_err().is_timeout());
    assert!(pool.try_acquire(0).await.is_err());
    held.release().await.unwrap();
    totals.update(&snapshotter);
    for (outcome, count) in [("acquired", 1), ("busy", 1), ("timeout", 1), ("error", 1)] {
        assert_eq!(
            totals.counter(&format!(
                "fencelock_semaphore_acquisitions_total{{outcome={outcome}}}"
            )),
            count,
            "{outcome}"
        );
    }
    // The permit's release counts as a release.
    assert_eq!(
        totals.counter("fencelock_releases_total{outcome=released}"),
        1
    );
}

#[tokio::test]
async fn rwlock_acquisitions_are_counted_by_mode_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let mut totals = Totals::default();
    let fx = Fixture::start();
    let client = fx.client().await;
    let lock = client.rwlock("counted").unwrap();
    let read = lock.read().await.unwrap();
    assert!(lock.try_write().await.unwrap().is_none());
    let timed_out = lock.write_timeout(Duration::from_millis(50)).await;
    assert!(timed_out.unwrap_err().is_timeout());
    read.release().await.unwrap();
    // A writer that waits behind another writer until its timeout.
    let write = lock.write().await.unwrap();
    let waited = lock.write_timeout(Duration::from_millis(100)).await;
    assert!(waited.unwrap_err().is_timeout());
    write.release().await.unwrap();
    // Foreign data at the lock's key: an error, not a timeout.
    let key = {
        let read = lock.read().await.unwrap();
        let key = fx.keys("fencelock:{*}rw:counted").pop().unwrap();
        read.release().await.unwrap();
        key
    };
    let _: () = redis::Commands::set(&mut fx.raw(), &key, "foreign").unwrap();
    assert!(lock.try_read().await.unwrap_err().is_wrong_type());
    totals.update(&snapshotter);
    for (labels, count) in [
        ("mode=read,outcome=acquired", 2),
        ("mode=read,outcome=error", 1),
        ("mode=write,outcome=acquired", 1),
        ("mode=write,outcome=busy", 1),
        ("mode=write,outcome=timeout", 2),
    ] {
        assert_eq!(
            totals.counter(&format!("fencelock_rwlock_acquisitions_total{{{labels}}}")),
            count,
            "{labels}"
        );
    }
}
