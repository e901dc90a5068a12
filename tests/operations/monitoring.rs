//! Who holds what, for which request, since when: client names registered at connect, labels
//! stored with holds, and the held time the admin API derives from tokens, on real servers.

use std::time::{Duration, UNIX_EPOCH};

use crate::common::deadline::within;
use crate::common::Fixture;
use fencelock::admin::{Admin, HoldKind, HoldRelease};
use fencelock::{Failure, IdempotencyOptions, JobOptions, LockClient};
use redis::Commands;

/// Bound for a round trip or a few on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);

async fn admin(fx: &Fixture) -> Admin {
    within(PATIENCE, "admin connect", Admin::connect(&fx.server.url()))
        .await
        .expect("admin connect")
}

async fn named(fx: &Fixture, name: &str) -> LockClient {
    fx.builder().client_name(name).connect().await.unwrap()
}

/// The acceptance case: a labelled hold of a named client shows both, and after 3 s a held
/// time within 1 s of the truth; re-entry keeps the label and the release takes it away.
#[tokio::test]
async fn a_labelled_hold_of_a_named_client_shows_both_and_its_time_held() {
    let fx = Fixture::start();
    let client = named(&fx, "checkout-7f9c").await;
    assert_eq!(client.name(), "checkout-7f9c");
    let lock = client.lock("account:42").unwrap();
    let labelled = lock.with_label("order-8812").unwrap();
    assert_eq!(labelled.label(), Some("order-8812"));
    assert_eq!(lock.label(), None, "with_label returns a new handle");
    let sent = std::time::Instant::now();
    let guard = labelled.acquire().await.unwrap();
    let inner = guard.reenter().await.unwrap();

    let admin = admin(&fx).await;
    let locks = admin.locks().await.unwrap();
    assert_eq!(locks.len(), 1, "{locks:?}");
    let held = &locks[0];
    assert_eq!(held.label.as_deref(), Some("order-8812"));
    assert_eq!(held.holders.len(), 1, "the label is no holder: {held:?}");
    assert_eq!(held.holders[0].count, 2);
    assert_eq!(
        held.holders[0].client_name.as_deref(),
        Some("checkout-7f9c")
    );
    let line = held.to_string();
    assert!(
        line.contains("  client checkout-7f9c") && line.ends_with("  label order-8812"),
        "{line}"
    );

    tokio::time::sleep(Duration::from_secs(3)).await;
    let detail = admin.lock("account:42").await.unwrap();
    // Against the time truly passed since the acquisition was sent, not the 3 s asked of the
    // sleep, which a loaded machine may overshoot.
    let (held_for, truth) = (detail.lock.held_for.expect("held"), sent.elapsed());
    assert!(
        held_for >= Duration::from_secs(3) && held_for.abs_diff(truth) < Duration::from_secs(1),
        "held for {held_for:?}, truly {truth:?}"
    );
    let text = detail.to_string();
    assert!(text.contains("client      checkout-7f9c"), "{text}");
    assert!(text.contains("label       order-8812"), "{text}");

    inner.release().await.unwrap();
    guard.release().await.unwrap();
    assert_eq!(
        fx.lock_key("account:42"),
        None,
        "the label left with the hold"
    );
    // The next hold without a label shows none.
    let plain = lock.acquire().await.unwrap();
    assert_eq!(admin.lock("account:42").await.unwrap().lock.label, None);
    plain.release().await.unwrap();
}

/// A label rides the acquisition's own script call: a labelled acquisition sends exactly the
/// calls of an unlabelled one, in both modes, for a multi-lock, a semaphore and a read-write
/// lock, and only a labelled hold has it.
#[tokio::test]
async fn a_label_costs_no_server_call_and_is_stored_only_when_given() {
    let fx = Fixture::start();
    let default = fx.client().await;
    let fair = fx
        .builder()
        .fair_handoff(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    for client in [&default, &fair] {
        fx.warm_up(client).await;
        let lock = client.lock("counted").unwrap();
        let mut sent = Vec::new();
        for label in [None, Some("req-1")] {
            let handle = match label {
                Some(label) => lock.with_label(label).unwrap(),
                None => lock.clone(),
            };
            let before = fx.calls("evalsha");
            let guard = handle.acquire().await.unwrap();
            sent.push(fx.calls("evalsha") - before);
            let key = fx.lock_key("counted").unwrap();
            let stored: Option<String> = fx.raw().hget(&key, "~label").unwrap();
            assert_eq!(stored.as_deref(), label);
            guard.release().await.unwrap();
        }
        assert_eq!(
            sent,
            [1, 1],
            "script calls per acquisition, without and with"
        );
    }

    let set = default.multi_lock(["m1", "m2"]).unwrap();
    // Loads the set's scripts, so the counts below are exact.
    set.acquire().await.unwrap().release().await.unwrap();
    let before = fx.calls("evalsha");
    set.acquire().await.unwrap().release().await.unwrap();
    let unlabelled = fx.calls("evalsha") - before;
    let before = fx.calls("evalsha");
    let guards = set.with_label("batch-7").unwrap().acquire().await.unwrap();
    let acquired = fx.calls("evalsha") - before;
    guards.release().await.unwrap();
    let before = fx.calls("evalsha");
    set.with_label("batch-7")
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(
        fx.calls("evalsha") - before,
        unlabelled,
        "a set's cycle, labelled or not"
    );
    let guards = set.with_label("batch-7").unwrap().acquire().await.unwrap();
    assert!(
        acquired <= unlabelled,
        "{acquired} calls to acquire a labelled set"
    );
    assert_eq!(
        holds_cost_the_same_with_a_label(&fx, &default).await,
        [1, 1, 1, 1]
    );
    let admin = admin(&fx).await;
    let locks = admin.locks().await.unwrap();
    assert_eq!(locks.len(), 2);
    for lock in &locks {
        assert_eq!(lock.label.as_deref(), Some("batch-7"), "{lock:?}");
        assert_eq!(lock.holders[0].client_name.as_deref(), Some(default.name()));
    }
    guards.release().await.unwrap();
}

/// The script calls of an uncontended semaphore acquisition and of a read-write lock's write,
/// without and with a label (after one cycle of each, which loads their scripts and checks the
/// client's permissions); checks that a hold's field carries the label only when given.
async fn holds_cost_the_same_with_a_label(fx: &Fixture, client: &LockClient) -> Vec<u64> {
    let pool = client.semaphore("counted-pool", 4).unwrap();
    let lock = client.rwlock("counted-rw").unwrap();
    pool.acquire(1).await.unwrap().release().await.unwrap();
    lock.write().await.unwrap().release().await.unwrap();
    let mut sent = Vec::new();
    for label in [None, Some("req-2")] {
        let (pool, lock) = match label {
            Some(label) => (
                pool.with_label(label).unwrap(),
                lock.with_label(label).unwrap(),
            ),
            None => (pool.clone(), lock.clone()),
        };
        let suffix = label.map(|label| format!(":{label}")).unwrap_or_default();
        let before = fx.calls("evalsha");
        let permit = pool.acquire(2).await.unwrap();
        sent.push(fx.calls("evalsha") - before);
        let key = fx.keys("fencelock:{*}sem:counted-pool").pop().unwrap();
        let stored: String = fx.raw().hget(&key, permit.holder_id()).unwrap();
        assert_eq!(stored, format!("2:{}{suffix}", permit.token()));
        let before = fx.calls("evalsha");
        let write = lock.write().await.unwrap();
        sent.push(fx.calls("evalsha") - before);
        let key = fx.keys("fencelock:{*}rw:counted-rw").pop().unwrap();
        let stored: String = fx.raw().hget(&key, write.holder_id()).unwrap();
        assert_eq!(stored, format!("1000000000:{}{suffix}", write.token()));
        permit.release().await.unwrap();
        write.release().await.unwrap();
    }
    sent
}

/// Labelled semaphore and read-write lock holds of a named client show the label next to the
/// client's name in the admin listing, a downgraded writer keeps its label, unlabelled holds
/// show none, and an operator's release of a hold takes its label with it.
#[tokio::test]
async fn labelled_semaphore_and_read_write_holds_show_label_and_client() {
    let fx = Fixture::start();
    let client = named(&fx, "exporter-3").await;
    let admin = admin(&fx).await;
    let pool = client.semaphore("exports", 4).unwrap();
    let labelled_pool = pool.with_label("export-7731").unwrap();
    assert_eq!(labelled_pool.label(), Some("export-7731"));
    assert_eq!(pool.label(), None, "with_label returns a new handle");
    let permit = labelled_pool.acquire(2).await.unwrap();
    let plain = pool.acquire(1).await.unwrap();
    let catalogue = client.rwlock("catalogue").unwrap();
    let labelled_lock = catalogue.with_label("report:118").unwrap();
    assert_eq!(labelled_lock.label(), Some("report:118"));
    let write = labelled_lock.write().await.unwrap();

    let semaphores = admin.semaphores().await.unwrap();
    let holds = &semaphores[0].holds;
    let labelled = holds
        .iter()
        .find(|hold| hold.holder == permit.holder_id())
        .unwrap();
    assert_eq!(labelled.label.as_deref(), Some("export-7731"));
    assert_eq!(labelled.permits, 2);
    assert_eq!(labelled.token, Some(permit.token()));
    assert_eq!(labelled.client_name.as_deref(), Some("exporter-3"));
    let line = labelled.to_string();
    assert!(
        line.contains("  client exporter-3") && line.ends_with("  label export-7731"),
        "{line}"
    );
    let unlabelled = holds
        .iter()
        .find(|hold| hold.holder == plain.holder_id())
        .unwrap();
    assert_eq!(unlabelled.label, None);
    assert!(!unlabelled.to_string().contains("label"), "{unlabelled}");

    let writer = admin.rwlock("catalogue").await.unwrap().unwrap().writer;
    let writer = writer.expect("a writer");
    assert_eq!(writer.label.as_deref(), Some("report:118"));
    assert_eq!(writer.token, Some(write.token()));
    assert_eq!(writer.client_name.as_deref(), Some("exporter-3"));
    let read = write.downgrade().await.unwrap();
    let shown = admin.rwlock("catalogue").await.unwrap().unwrap();
    assert_eq!(shown.readers[0].label.as_deref(), Some("report:118"));
    assert!(shown.to_string().contains("  label report:118"), "{shown}");

    let released = admin
        .release_hold(HoldKind::Semaphore, "exports", permit.holder_id())
        .await
        .unwrap();
    assert_eq!(released, HoldRelease::Released);
    let left = admin.semaphore("exports").await.unwrap().unwrap();
    assert_eq!(left.holds.len(), 1, "{left}");
    assert_eq!(left.holds[0].label, None, "{left}");
    assert!(permit.release().await.is_err(), "the operator released it");
    plain.release().await.unwrap();
    read.release().await.unwrap();
    assert_eq!(fx.keys("fencelock:{*}sem:*"), Vec::<Vec<u8>>::new());
    assert_eq!(fx.keys("fencelock:{*}rw:*"), Vec::<Vec<u8>>::new());
}

/// The wait of a labelled semaphore acquisition and of a labelled writer is recorded with its
/// label, like a lock's.
#[tokio::test]
async fn a_labelled_semaphore_or_read_write_wait_is_recorded_with_its_label() {
    let fx = Fixture::start();
    let holder = named(&fx, "holder").await;
    let waiter = named(&fx, "waiter").await;
    let admin = admin(&fx).await;
    let permit = holder
        .semaphore("exports", 1)
        .unwrap()
        .acquire(1)
        .await
        .unwrap();
    let read = holder.rwlock("catalogue").unwrap().read().await.unwrap();
    let sem_wait = tokio::spawn({
        let pool = waiter
            .semaphore("exports", 1)
            .unwrap()
            .with_label("export-1")
            .unwrap();
        async move { pool.acquire(1).await.unwrap().release().await }
    });
    let write_wait = tokio::spawn({
        let lock = waiter
            .rwlock("catalogue")
            .unwrap()
            .with_label("report-2")
            .unwrap();
        async move { lock.write().await.unwrap().release().await }
    });
    within(PATIENCE, "both waits are recorded", async {
        while admin.waits().await.unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let mut labels: Vec<String> = admin
        .waits()
        .await
        .unwrap()
        .into_iter()
        .map(|wait| {
            assert_eq!(wait.client_name.as_deref(), Some("waiter"), "{wait}");
            wait.label.unwrap_or_default()
        })
        .collect();
    labels.sort();
    assert_eq!(labels, ["export-1", "report-2"]);
    permit.release().await.unwrap();
    read.release().await.unwrap();
    within(PATIENCE, "both waiters get in", async {
        sem_wait.await.unwrap().unwrap();
        write_wait.await.unwrap().unwrap();
    })
    .await;
}

/// A label or a client name that cannot be shown on one line is a typed error before anything
/// is sent: nothing held, nothing registered.
#[tokio::test]
async fn a_bad_label_or_client_name_is_refused_and_leaves_nothing() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let lock = client.lock("account:42").unwrap();
    let long = "x".repeat(257);
    for bad in ["", "two\nlines", "tab\there", long.as_str()] {
        let err = lock.with_label(bad).unwrap_err();
        assert!(err.is_invalid_input(), "{bad:?}: {err}");
        let err = client
            .multi_lock(["a", "b"])
            .unwrap()
            .with_label(bad)
            .unwrap_err();
        assert!(err.is_invalid_input(), "{bad:?}: {err}");
        let err = client.semaphore("pool", 2).unwrap().with_label(bad);
        assert!(err.unwrap_err().is_invalid_input(), "{bad:?}");
        let err = client.rwlock("catalogue").unwrap().with_label(bad);
        assert!(
            matches!(err, Err(fencelock::Error::InvalidConfig { .. })),
            "{bad:?}: {err:?}"
        );
        let err = fx.builder().client_name(bad).connect().await.unwrap_err();
        assert!(
            matches!(err, fencelock::Error::InvalidConfig { .. }),
            "{bad:?}: {err}"
        );
    }
    assert!(
        lock.with_label("x".repeat(256)).is_ok(),
        "256 bytes is the limit"
    );
    assert_eq!(fx.keys("*"), Vec::<Vec<u8>>::new());
    assert_eq!(fx.name_registrations().len(), 1, "only the good client's");
}

/// The registration: one key per client, the default name is the host and process, kept for a
/// day and refreshed while the client lives.
#[tokio::test]
async fn a_client_registers_its_name_once_for_a_day() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let pid = std::process::id().to_string();
    let (host, process) = client.name().rsplit_once(':').expect("host:pid");
    assert!(!host.is_empty() && process == pid, "{}", client.name());
    let keys = fx.name_registrations();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let key = &keys[0];
    assert!(
        key.ends_with(format!("client:{}", client.id()).as_bytes()),
        "{}",
        String::from_utf8_lossy(key)
    );
    let stored: String = fx.raw().get(key).unwrap();
    assert_eq!(stored, client.name());
    let ttl: i64 = fx.raw().pttl(key).unwrap();
    assert!(
        ttl > 23 * 3600 * 1000 && ttl <= 24 * 3600 * 1000,
        "kept {ttl} ms"
    );
    let admin = admin(&fx).await;
    assert_eq!(
        admin.client_name(client.id()).await.unwrap().as_deref(),
        Some(client.name())
    );
    assert_eq!(admin.client_name("gone:1").await.unwrap(), None);
}

/// Every primitive's listing names the holding client: semaphores, read-write locks,
/// elections, jobs and idempotency keys.
#[tokio::test]
async fn every_primitive_names_the_client_that_holds_it() {
    let fx = Fixture::start();
    let client = named(&fx, "billing-2").await;
    let admin = admin(&fx).await;

    let permit = client
        .semaphore("pool", 3)
        .unwrap()
        .acquire(2)
        .await
        .unwrap();
    let reader = client.rwlock("catalog").unwrap().read().await.unwrap();
    let leader = client
        .election("scheduler")
        .unwrap()
        .campaign(b"")
        .await
        .unwrap();
    let options = JobOptions::new(Duration::from_secs(60), Duration::from_secs(30));
    let tick = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    client
        .job("report", options)
        .unwrap()
        .run_exclusive(tick, |_run| async {})
        .await
        .unwrap();
    let paid = client
        .idempotency("payments", IdempotencyOptions::new(Duration::from_secs(30)))
        .unwrap()
        .run("p-1", "charge 5", |_run| async {
            Ok::<_, Failure<()>>(b"ok".to_vec())
        })
        .await
        .unwrap();
    assert!(paid.ran());

    let name = Some("billing-2");
    let semaphores = admin.semaphores().await.unwrap();
    assert_eq!(semaphores[0].holds[0].client_name.as_deref(), name);
    assert!(semaphores[0].holds[0]
        .to_string()
        .contains("  client billing-2"));
    let rwlocks = admin.rwlocks().await.unwrap();
    assert_eq!(rwlocks[0].readers[0].client_name.as_deref(), name);
    let elections = admin.elections().await.unwrap();
    assert_eq!(elections[0].leader_client_name.as_deref(), name);
    assert!(elections[0].to_string().contains("  client billing-2"));
    let jobs = admin.jobs().await.unwrap();
    assert_eq!(jobs[0].runner_client_name.as_deref(), name);
    assert!(jobs[0].to_string().contains("  client billing-2"));
    let keys = admin.idempotency_keys(None).await.unwrap();
    assert_eq!(keys[0].runner_client_name.as_deref(), name);
    assert!(keys[0].to_string().contains("  client billing-2"));

    leader.resign().await.unwrap();
    reader.release().await.unwrap();
    permit.release().await.unwrap();
}

/// A labelled campaign's leader and a labelled job's running tick show their label next to
/// the client's name; an unlabelled leader shows none.
#[tokio::test]
async fn labelled_leaders_and_job_runs_show_their_label() {
    let fx = Fixture::start();
    let client = named(&fx, "scheduler-1").await;
    let admin = admin(&fx).await;
    let election = client.election("scheduler").unwrap();
    let labelled = election.with_label("build-2026.12.5").unwrap();
    assert_eq!(labelled.label(), Some("build-2026.12.5"));
    assert_eq!(election.label(), None, "with_label returns a new handle");
    let leader = labelled.campaign(b"10.0.0.7").await.unwrap();
    let plain = client
        .election("reporting")
        .unwrap()
        .campaign(b"")
        .await
        .unwrap();
    let elections = admin.elections().await.unwrap();
    let shown = |name: &str| {
        elections
            .iter()
            .find(|e| e.display_name() == name)
            .unwrap()
            .clone()
    };
    let scheduler = shown("scheduler");
    assert_eq!(scheduler.leader_label.as_deref(), Some("build-2026.12.5"));
    assert!(
        scheduler
            .to_string()
            .contains("  client scheduler-1  label build-2026.12.5"),
        "{scheduler}"
    );
    assert_eq!(shown("reporting").leader_label, None);
    leader.resign().await.unwrap();
    plain.resign().await.unwrap();

    let options = JobOptions::new(Duration::from_secs(60), Duration::from_secs(30));
    let job = client
        .job("report", options.clone())
        .unwrap()
        .with_label("nightly-cron")
        .unwrap();
    assert_eq!(job.label(), Some("nightly-cron"));
    let tick = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let seen = job
        .run_exclusive(tick, |_run| {
            let admin = admin.clone();
            async move { admin.jobs().await.unwrap() }
        })
        .await
        .unwrap();
    let jobs = seen.into_output().expect("the tick ran here");
    assert!(jobs[0].runner_holds, "{}", jobs[0]);
    assert_eq!(jobs[0].runner_label.as_deref(), Some("nightly-cron"));
    assert!(
        jobs[0].to_string().contains("  label nightly-cron"),
        "{}",
        jobs[0]
    );
    let refused = client.job("report", options).unwrap().with_label("a\tb");
    assert!(refused.unwrap_err().is_invalid_input());
}

/// Set by the parent for a nesting child: `<url> <order>`, order `ab` or `ba`.
const NEST_ENV: &str = "FENCELOCK_NEST_CHILD";
/// Counts the children holding their outer lock (no prefix: a key of the test's own).
const NEST_READY: &str = "nest-ready";

/// The child's work, a no-op unless the parent started this binary as a child: take the outer
/// lock of its order, wait until the other child holds its own, then take the inner one (which
/// the other holds: neither can go on).
#[tokio::test]
async fn nesting_child_takes_two_locks_in_its_order() {
    let Ok(spec) = std::env::var(NEST_ENV) else {
        return;
    };
    let (url, order) = spec.rsplit_once(' ').unwrap();
    let (outer, inner) = if order == "ab" {
        ("A", "B")
    } else {
        ("B", "A")
    };
    let client = LockClient::builder(url)
        .client_name(format!("nest-{order}"))
        .connect()
        .await
        .unwrap();
    let label = format!("req-{order}");
    let _outer = client
        .lock(outer)
        .unwrap()
        .with_label(&label)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
    let _: i64 = raw.incr(NEST_READY, 1).unwrap();
    within(PATIENCE, "the other child holds its outer lock", async {
        while raw.get::<_, i64>(NEST_READY).unwrap() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let _ = client
        .lock(inner)
        .unwrap()
        .with_label(&label)
        .unwrap()
        .acquire_timeout(Duration::from_secs(120))
        .await;
}

/// The acceptance case: two processes nesting A then B and B then A wait for each other; the
/// admin API and the doctor report one possible deadlock naming both clients, both locks and
/// both labels, once the waits are older than the threshold, and not long after.
#[tokio::test]
async fn two_processes_nesting_in_opposite_orders_are_reported_as_a_possible_deadlock() {
    use crate::common::child::ChildProcess;
    let fx = Fixture::start();
    let url = fx.server.url();
    let test = "nesting_child_takes_two_locks_in_its_order";
    let _children: Vec<ChildProcess> = ["ab", "ba"]
        .iter()
        .map(|order| ChildProcess::start(module_path!(), test, NEST_ENV, &format!("{url} {order}")))
        .collect();
    let admin = admin(&fx).await;
    let threshold = Duration::from_secs(2);
    let found = within(PATIENCE, "the deadlock is reported", async {
        loop {
            let found = admin.possible_deadlocks(threshold).await.unwrap();
            if !found.is_empty() {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert_eq!(found.len(), 1, "{found:?}");
    let cycle = &found[0];
    assert_eq!(cycle.waits.len(), 2, "{cycle}");
    let mut seen: Vec<(String, String, String)> = cycle
        .waits
        .iter()
        .map(|w| {
            (
                w.client_name.clone().unwrap(),
                w.display_waits_for(),
                w.label.clone().unwrap(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("nest-ab".into(), "lock:B".into(), "req-ab".into()),
            ("nest-ba".into(), "lock:A".into(), "req-ba".into())
        ]
    );
    for (i, wait) in cycle.waits.iter().enumerate() {
        let next = &cycle.waits[(i + 1) % 2];
        assert!(next.holds.contains(&wait.waits_for), "{cycle}");
        // Reported within the threshold: found by the first look after it, not much later.
        assert!(
            wait.waited_for >= threshold && wait.waited_for < threshold + Duration::from_secs(5),
            "{wait}"
        );
    }
    let text = cycle.to_string();
    // The locks named as `list` names them, not by their keys' `lock:A`.
    let (a, b) = (" waits for A held by ", " waits for B held by ");
    for part in ["nest-ab", "nest-ba", a, b, "req-ab", "req-ba"] {
        assert!(text.contains(part), "{part}: {text}");
    }
    let check = admin.check_deadlocks(threshold).await.unwrap();
    assert_eq!(check.status, fencelock::admin::Status::Fail, "{check}");
    assert!(check.finding.contains("nest-ab"), "{check}");
    assert!(
        admin
            .possible_deadlocks(Duration::from_secs(3600))
            .await
            .unwrap()
            .is_empty(),
        "no wait is an hour old"
    );
}

/// 200 nested acquisitions of random pairs of locks, each task taking its pair in one global
/// order, from several clients at once: many waits, never a cycle, and no wait record left
/// once they are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_nested_acquisitions_in_one_order_report_no_deadlock() {
    let fx = Fixture::start();
    let admin = admin(&fx).await;
    let mut clients = Vec::new();
    for i in 0..4 {
        clients.push(named(&fx, &format!("worker-{i}")).await);
    }
    let names = ["n0", "n1", "n2", "n3", "n4"];
    let pairs: Vec<(&str, &str)> = names
        .iter()
        .enumerate()
        .flat_map(|(i, a)| names[i + 1..].iter().map(move |b| (*a, *b)))
        .collect();
    // One lock held for 1.5 s by a task that waits for nothing: the heads that wait for it
    // wait past the second after which a wait is recorded, so the run always has records to
    // judge (the nested waits alone pass a second only when the race makes them).
    let blocker = named(&fx, "blocker").await;
    let blocked = blocker.lock(names[4]).unwrap().acquire().await.unwrap();
    let unblock = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        blocked.release().await.unwrap();
    });
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = tokio::spawn({
        let admin = admin.clone();
        let done = done.clone();
        async move {
            let (mut looks, mut waits_seen) = (0, 0);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                waits_seen += admin.waits().await.unwrap().len();
                let found = admin.possible_deadlocks(Duration::ZERO).await.unwrap();
                assert!(found.is_empty(), "a cycle in ordered nesting: {found:?}");
                looks += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (looks, waits_seen)
        }
    });
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..200usize {
        let client = clients[n % clients.len()].clone();
        // Every pair of distinct names in turn, the lower name first (the global order).
        let (first, second) = pairs[n % pairs.len()];
        tasks.spawn(async move {
            let label = format!("req-{n}");
            let outer = client.lock(first).unwrap().with_label(&label).unwrap();
            let outer = outer.acquire().await.unwrap();
            let inner = client.lock(second).unwrap().with_label(&label).unwrap();
            let inner = inner.acquire().await.unwrap();
            // Long enough for some waits to pass the second after which they are recorded.
            tokio::time::sleep(Duration::from_millis(20)).await;
            inner.release().await.unwrap();
            outer.release().await.unwrap();
        });
    }
    within(Duration::from_secs(120), "200 nested acquisitions", async {
        while let Some(joined) = tasks.join_next().await {
            joined.unwrap();
        }
    })
    .await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    unblock.await.unwrap();
    let (looks, waits_seen) = watcher.await.unwrap();
    assert!(looks > 0);
    assert!(
        waits_seen > 0,
        "the run had contention to judge ({looks} looks)"
    );
    within(PATIENCE, "every wait record goes with its wait", async {
        while !admin.waits().await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(fx.keys("*wait:*").is_empty());
}

/// The false positive a client-level graph would make: client X's task holds A and waits for
/// B; client Y holds B in one task while another of its tasks waits for A. X and Y wait for
/// each other as clients, but B's holder is not waiting, so there is no cycle of tasks, and
/// none is reported; when B is released every task goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_of_one_client_are_not_taken_for_a_cycle() {
    let fx = Fixture::start();
    let admin = admin(&fx).await;
    let (x, y) = (named(&fx, "x").await, named(&fx, "y").await);
    let b = y.lock("B").unwrap().acquire().await.unwrap();
    let (a_held, a_taken) = tokio::sync::oneshot::channel();
    let x_task = tokio::spawn({
        let x = x.clone();
        async move {
            let a = x.lock("A").unwrap().acquire().await.unwrap();
            a_held.send(()).unwrap();
            let b = x.lock("B").unwrap().acquire().await.unwrap();
            b.release().await.unwrap();
            a.release().await.unwrap();
        }
    });
    a_taken.await.unwrap();
    let y_task = tokio::spawn({
        let y = y.clone();
        async move {
            y.lock("A")
                .unwrap()
                .acquire()
                .await
                .unwrap()
                .release()
                .await
        }
    });
    within(PATIENCE, "both waits are recorded", async {
        while admin.waits().await.unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let waits = admin.waits().await.unwrap();
    let x_wait = waits
        .iter()
        .find(|w| w.client_name.as_deref() == Some("x"))
        .unwrap();
    assert_eq!(x_wait.display_waits_for(), "lock:B");
    assert_eq!(x_wait.holds.len(), 1, "its task holds A: {x_wait}");
    let y_wait = waits
        .iter()
        .find(|w| w.client_name.as_deref() == Some("y"))
        .unwrap();
    assert!(
        y_wait.holds.is_empty(),
        "the waiting task of y holds nothing: {y_wait}"
    );
    assert!(admin
        .possible_deadlocks(Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
    b.release().await.unwrap();
    within(PATIENCE, "every task goes on", async {
        x_task.await.unwrap();
        y_task.await.unwrap().unwrap();
    })
    .await;
}

/// What a wait record costs: one background script call per wait of a waiting head that
/// lasts a second (a busy attempt refreshes it only when it could expire before the next
/// attempt), and a `DEL` when the wait ends; a shorter wait sends nothing; a client with
/// `record_waits(false)` sends nothing either, and its wait is invisible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_record_costs_one_call_per_wait_and_goes_with_the_wait() {
    let fx = Fixture::start();
    let admin = admin(&fx).await;
    let holder = fx.client().await;
    let recording = fx.client().await;
    let silent = fx.builder().record_waits(false).connect().await.unwrap();
    for client in [&holder, &recording, &silent] {
        fx.warm_up(client).await;
    }
    // One contended wait first, so that the record's script is loaded and the counts below
    // have no NOSCRIPT round trip in them.
    let guard = holder.lock("warm").unwrap().acquire().await.unwrap();
    let waiter = tokio::spawn({
        let lock = recording.lock("warm").unwrap();
        async move { lock.acquire().await.unwrap().release().await }
    });
    crate::common::eventually(PATIENCE, || !fx.keys("*wait:*").is_empty()).await;
    guard.release().await.unwrap();
    within(PATIENCE, "the warm-up waiter wins", waiter)
        .await
        .unwrap()
        .unwrap();
    for (client, records) in [(&recording, 1), (&silent, 0)] {
        let lease = Duration::from_secs(60);
        let guard = holder
            .lock("w")
            .unwrap()
            .with_lease(lease)
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let (scripts, dels) = (fx.calls("evalsha"), fx.calls("del"));
        let waiting = client.lock("w").unwrap().with_lease(lease).unwrap();
        let waiter = tokio::spawn(async move { waiting.acquire().await.unwrap().release().await });
        // The fast attempt and the head's attempt after subscribing, both busy; the first
        // writes the record, which the second finds good for longer than the lease.
        let expected = 2 + records;
        assert!(
            crate::common::eventually(PATIENCE, || fx.calls("evalsha") - scripts == expected).await,
            "{} script calls, expected {expected}",
            fx.calls("evalsha") - scripts
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            fx.calls("evalsha") - scripts,
            expected,
            "nothing more while it waits"
        );
        let waits = admin.waits().await.unwrap();
        assert_eq!(waits.len(), records as usize, "{waits:?}");
        guard.release().await.unwrap();
        within(PATIENCE, "the waiter wins", waiter)
            .await
            .unwrap()
            .unwrap();
        within(PATIENCE, "the record goes with the wait", async {
            while !admin.waits().await.unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let deleted = if records > 0 { 1 } else { 0 };
        assert!(fx.calls("del") - dels >= deleted);
    }
}
