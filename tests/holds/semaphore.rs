//! The semaphore against real servers: never more holders than permits under contention,
//! waiters woken by releases in their client's order, a crashed holder's permits back within
//! its lease (a task that stops renewing, and a process killed with SIGKILL), cancellation at
//! random points, lost holds, and bad input. The topology tests run on one server and on a
//! 3-primary cluster.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::cancel::CancelPoints;
use crate::common::child::ChildProcess;
use crate::common::deadline::{within, woken, HANDOFF};
use crate::common::{eventually, Env, Fixture};
use fencelock::{LockClient, Semaphore, SemaphorePermit, MAX_NAME_LEN};
use fencelock_testing::{send_signal, Signal};
use redis::Commands;

/// The permits held right now by the semaphore `name`, as Redis counts them: the sum over its
/// holds' fields, which on the lease-zset path must equal its `~used` (0 when it has no
/// record).
fn used(fx: &Env, name: &str) -> u32 {
    used_in(
        &mut fx.raw(),
        fx.keys(&format!("fencelock:{{*}}sem:{name}")).pop(),
    )
}

/// The permits held by the semaphore hash `key`, as [`used`] counts them.
fn used_in(raw: &mut impl redis::ConnectionLike, key: Option<Vec<u8>>) -> u32 {
    let Some(key) = key else {
        return 0;
    };
    let hash: std::collections::HashMap<String, String> = raw.hgetall(key).unwrap();
    crate::common::permits_held(&hash).unwrap()
}

/// Every key of the semaphore `name` (its hash and its lease zset).
fn sem_keys(fx: &Env, name: &str) -> Vec<Vec<u8>> {
    let mut keys = fx.keys(&format!("fencelock:{{*}}sem:{name}"));
    keys.extend(fx.keys(&format!("fencelock:{{*}}sem-leases:{name}")));
    keys
}

on_topologies_multi_thread! {
    /// Three permits, ten contenders on three clients asking for one or two permits each: the
    /// permits held never exceed three, by the holders' own count and by Redis's, and every
    /// hold's token is new.
    async fn three_permits_and_ten_contenders_never_exceed_three(fx) {
        let clients = [fx.client().await, fx.client().await, fx.client().await];
        let in_use = Arc::new(AtomicU32::new(0));
        let peak = Arc::new(AtomicU32::new(0));
        let tokens = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for contender in 0..10u32 {
            let pool = clients[contender as usize % 3].semaphore("pool", 3).unwrap();
            let (in_use, peak, tokens) = (in_use.clone(), peak.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..8u32 {
                    let permits = 1 + (contender + round) % 2;
                    let permit = pool.acquire(permits).await.unwrap();
                    let now = in_use.fetch_add(permits, Ordering::SeqCst) + permits;
                    peak.fetch_max(now, Ordering::SeqCst);
                    assert!(now <= 3, "{now} permits held at once");
                    tokens.lock().push(permit.token());
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    in_use.fetch_sub(permits, Ordering::SeqCst);
                    permit.release().await.unwrap();
                }
            }));
        }
        let watcher = {
            let fx_used = || used(&fx, "pool");
            async move {
                let mut seen = 0;
                for _ in 0..50 {
                    seen = seen.max(fx_used());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                seen
            }
        };
        let redis_peak = watcher.await;
        within(Duration::from_secs(60), "ten contenders finish eight rounds each", async {
            for task in tasks {
                task.await.unwrap();
            }
        })
        .await;
        assert!(redis_peak <= 3, "Redis counted {redis_peak} permits in use");
        assert!(peak.load(Ordering::SeqCst) >= 2, "the permits were never shared");
        let mut tokens = tokens.lock().clone();
        let count = tokens.len();
        tokens.sort();
        tokens.dedup();
        assert_eq!(tokens.len(), count, "a token was issued twice");
        assert!(sem_keys(&fx, "pool").is_empty(), "the semaphore left keys behind");
    }

    /// A request for many permits waits at the head of its client's queue: a later request for
    /// one, from the same client, does not overtake it when one permit comes back; each
    /// waiter is woken by the release that lets it in.
    async fn waiters_are_woken_in_their_clients_order(fx) {
        let (holder, waiter) = (fx.client().await, fx.client().await);
        let held: Vec<SemaphorePermit> = {
            let pool = holder.semaphore("order", 3).unwrap();
            let mut held = Vec::new();
            for _ in 0..3 {
                held.push(pool.acquire(1).await.unwrap());
            }
            held
        };
        let pool = waiter.semaphore("order", 3).unwrap();
        let big = tokio::spawn({
            let pool = pool.clone();
            async move { pool.acquire(3).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let small = tokio::spawn({
            let pool = pool.clone();
            async move { pool.acquire(1).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut held = held.into_iter();
        held.next().unwrap().release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!small.is_finished(), "the small request overtook the big one");
        assert!(!big.is_finished());
        for permit in held {
            permit.release().await.unwrap();
        }
        let big = woken("the request for three, after three releases", big).await.unwrap();
        assert_eq!((big.permits(), big.limit()), (3, 3));
        assert!(!small.is_finished());
        big.release().await.unwrap();
        let small = woken("the request for one, after the big hold's release", small)
            .await
            .unwrap();
        small.release().await.unwrap();
    }

    /// A holder that stops renewing (a fixed lease, never released: a crash as the server sees
    /// it) gives its permits back when its lease ends; a waiter gets them then, and the dead
    /// holder's late release is refused.
    async fn a_dead_holders_permits_come_back_within_its_lease(fx) {
        let client = fx.client().await;
        let lease = Duration::from_millis(700);
        let pool = client.semaphore("crash", 2).unwrap();
        let dead = pool.with_lease(lease).unwrap().acquire(2).await.unwrap();
        let started = Instant::now();
        let next = within(lease + HANDOFF, "the waiter gets the dead holder's permits", pool.acquire(1))
            .await
            .unwrap();
        assert!(started.elapsed() >= lease / 2, "took permits a live hold had");
        assert!(!dead.is_valid());
        assert!(dead.release().await.unwrap_err().is_not_held());
        next.release().await.unwrap();
    }

    /// What a permit has of its guard (it dereferences to it) works on the semaphore's hold: a
    /// re-entry is the same hold with the same token and takes no permit, its release leaves
    /// the permits held until the permit's own release gives them back, and an extension moves
    /// a fixed lease.
    async fn a_permit_is_reentered_and_extended_as_its_guard(fx) {
        let client = fx.client().await;
        let pool = client.semaphore("nested", 3).unwrap();
        let fixed = pool.with_lease(Duration::from_secs(5)).unwrap();
        let permit = fixed.acquire(2).await.unwrap();
        let nested = permit.reenter().await.unwrap();
        assert_eq!(nested.token(), permit.token());
        assert_eq!(used(&fx, "nested"), 2, "a re-entry takes no permit");
        nested.release().await.unwrap();
        assert!(permit.is_valid());
        assert_eq!(used(&fx, "nested"), 2, "the inner release gives nothing back");
        assert!(pool.try_acquire(2).await.unwrap().is_none(), "two permits are still held");
        let before = permit.valid_until();
        permit.extend(Duration::from_secs(60)).await.unwrap();
        assert!(permit.valid_until() > before + Duration::from_secs(30), "the lease moved");
        permit.release().await.unwrap();
        assert_eq!(used(&fx, "nested"), 0);
        pool.try_acquire(3).await.unwrap().expect("every permit is free").release().await.unwrap();
    }

    /// A hold removed behind its holder's back (an operator) is reported lost by the next
    /// renewal.
    async fn a_hold_removed_in_redis_is_reported_lost(fx) {
        let client = fx.builder().default_lease(Duration::from_millis(600)).connect().await.unwrap();
        let permit = client.semaphore("gone", 1).unwrap().acquire(1).await.unwrap();
        for key in sem_keys(&fx, "gone") {
            let _: () = fx.raw().del(key).unwrap();
        }
        within(Duration::from_millis(600) + HANDOFF, "the lost hold is reported", permit.lost()).await;
        assert!(!permit.is_valid());
    }

    /// Acquisitions dropped at random points (before sending, in flight, after they ran),
    /// with and without another holder letting go meanwhile: no permit is ever left held.
    async fn cancelled_acquisitions_never_leave_a_permit_held(fx) {
        let (a, b) = (fx.client().await, fx.client().await);
        cancel_at_random_points(&fx, &a, &b, crate::common::env_cases("FENCELOCK_CANCEL_CASES", 500)).await;
    }

    /// The same with fair-handoff clients, whose waiters queue in Redis: no queue entry is left
    /// behind either.
    async fn cancelled_fair_acquisitions_never_leave_a_queue_entry(fx) {
        let fair = || fx.builder().fair_handoff(Duration::from_secs(30)).connect();
        let (a, b) = (fair().await.unwrap(), fair().await.unwrap());
        cancel_at_random_points(&fx, &a, &b, crate::common::env_cases("FENCELOCK_CANCEL_CASES", 500) / 2)
            .await;
    }
}

/// The recorded limit governs while the semaphore is in use; the next idle acquisition
/// records its own handle's limit. Releases and expiry leave nothing behind.
#[tokio::test]
async fn the_limit_in_force_is_the_one_recorded_while_in_use() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let three = client.semaphore("limits", 3).unwrap();
    let five = client.semaphore("limits", 5).unwrap();
    let first = three.acquire(2).await.unwrap();
    let second = five.try_acquire(1).await.unwrap().unwrap();
    assert_eq!((first.limit(), second.limit()), (3, 3));
    assert!(five.try_acquire(1).await.unwrap().is_none(), "3 of 3 held");
    let err = five.try_acquire(4).await.unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
    assert!(second.token() > first.token());
    first.release().await.unwrap();
    second.release().await.unwrap();
    let later = five.acquire(5).await.unwrap();
    assert_eq!(later.limit(), 5);
    later.release().await.unwrap();
    assert!(fx.keys("fencelock:{*}sem*").is_empty());
}

/// Bad input is refused before anything is sent; foreign data is a typed error that leaves
/// the data as it was.
#[tokio::test]
async fn bad_input_is_refused_and_leaves_nothing_behind() {
    let fx = Fixture::start();
    let client = fx.client().await;
    assert!(client.semaphore("", 1).unwrap_err().is_invalid_input());
    assert!(client
        .semaphore(vec![b'x'; MAX_NAME_LEN + 1], 1)
        .unwrap_err()
        .is_invalid_input());
    assert!(client.semaphore("zero", 0).unwrap_err().is_invalid_input());
    let pool = client.semaphore("bad", 2).unwrap();
    for permits in [0, 3] {
        assert!(pool
            .try_acquire(permits)
            .await
            .unwrap_err()
            .is_invalid_input());
        assert!(pool.acquire(permits).await.unwrap_err().is_invalid_input());
        assert!(pool
            .acquire_timeout(permits, Duration::from_millis(10))
            .await
            .unwrap_err()
            .is_invalid_input());
    }
    assert!(pool
        .with_lease(Duration::ZERO)
        .unwrap_err()
        .is_invalid_input());
    assert!(
        fx.keys("*").is_empty(),
        "a refused request wrote {:?}",
        fx.keys("*")
    );

    // Foreign data where the semaphore's hash goes (its key learnt from a hold).
    let real_key = {
        let permit = pool.acquire(1).await.unwrap();
        let key = fx.keys("fencelock:{*}sem:bad").pop().unwrap();
        permit.release().await.unwrap();
        key
    };
    let _: () = fx.raw().set(&real_key, "foreign").unwrap();
    let err = pool.try_acquire(1).await.unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let value: String = fx.raw().get(&real_key).unwrap();
    assert_eq!(value, "foreign");
}

/// `acquire_timeout` gives up at its deadline while the permits stay held, and leaves no
/// hold or queue entry behind.
#[tokio::test]
async fn acquire_timeout_gives_up_and_leaves_nothing() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let pool = client.semaphore("timeout", 1).unwrap();
    let held = pool.acquire(1).await.unwrap();
    let err = pool
        .acquire_timeout(1, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(err.to_string().ends_with(" waiting for timeout"), "{err}");
    let key = fx.keys("fencelock:{*}sem:timeout").pop();
    assert_eq!(used_in(&mut fx.raw(), key), 1);
    held.release().await.unwrap();
    assert!(fx.keys("fencelock:{*}sem*").is_empty());
}

const CHILD_ENV: &str = "FENCELOCK_SEMAPHORE_CHILD";
const CHILD_HOLDS: &str = "semaphore-child-holds";
/// The child's lease: its watchdog renews it while the child runs.
const CHILD_LEASE: Duration = Duration::from_millis(1000);

/// A permit holder process, a no-op unless the parent started this binary as a child: takes
/// one permit of `killed`, says so on a list, and holds it (renewed) until it is killed.
#[tokio::test]
async fn semaphore_child_holds_a_permit() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let client = LockClient::builder(url.as_str())
        .default_lease(CHILD_LEASE)
        .connect()
        .await
        .unwrap();
    let permit = client
        .semaphore("killed", 3)
        .unwrap()
        .acquire(1)
        .await
        .unwrap();
    let mut raw = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = raw.rpush(CHILD_HOLDS, permit.holder_id()).unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    drop(permit);
}

/// A permit holder killed with SIGKILL: its permit comes back within its lease (after it had
/// been renewed past the first lease, so the renewals were real), and a waiter gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_holder_killed_with_sigkill_gives_its_permit_back_within_its_lease() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let pool = client.semaphore("killed", 3).unwrap();
    let mine = [
        pool.acquire(1).await.unwrap(),
        pool.acquire(1).await.unwrap(),
    ];
    let child = ChildProcess::start(
        module_path!(),
        "semaphore_child_holds_a_permit",
        CHILD_ENV,
        &fx.server.url(),
    );
    let holder: String = within(
        Duration::from_secs(30),
        "the child takes its permit",
        async {
            loop {
                let holds: Vec<String> = fx.raw().lrange(CHILD_HOLDS, 0, -1).unwrap();
                if let Some(holder) = holds.first() {
                    return holder.clone();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    // Past its first lease: only the child's watchdog keeps the hold alive now.
    tokio::time::sleep(CHILD_LEASE * 2).await;
    assert!(
        pool.try_acquire(1).await.unwrap().is_none(),
        "the child's hold ended at its first lease: its watchdog did not renew it"
    );
    let waiter = tokio::spawn({
        let pool = pool.clone();
        async move { pool.acquire(1).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    send_signal(child.pid(), Signal::Kill).unwrap();
    let killed_at = Instant::now();
    let permit = within(
        CHILD_LEASE + HANDOFF,
        "the waiter gets the killed holder's permit",
        waiter,
    )
    .await
    .unwrap();
    let back_after = killed_at.elapsed();
    eprintln!(
        "the killed holder's permit came back {back_after:?} after SIGKILL (lease {CHILD_LEASE:?})"
    );
    let key = fx.keys("fencelock:{*}sem:killed").pop().unwrap();
    let field: Option<String> = fx.raw().hget(&key, &holder).unwrap();
    assert!(
        field.is_none(),
        "the killed holder's hold is still recorded"
    );
    drop(child);
    permit.release().await.unwrap();
    for permit in mine {
        permit.release().await.unwrap();
    }
    assert!(fx.keys("fencelock:{*}sem*").is_empty());
}

on_topologies_multi_thread! {
    /// With fair handoff, a request for every permit gets in although small requests from
    /// other clients keep the semaphore busy all the time (each re-acquires as soon as it
    /// left); once it is the oldest waiter, no small one is granted ahead of it.
    async fn with_fair_handoff_a_big_request_is_not_starved_by_small_ones(fx) {
        let fair = || async {
            fx.builder()
                .fair_handoff(Duration::from_secs(30))
                .connect()
                .await
                .unwrap()
        };
        let smalls = [fair().await, fair().await];
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cycles = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::new();
        for i in 0..6usize {
            let pool = smalls[i % 2].semaphore("fair", 4).unwrap();
            let (stop, cycles) = (stop.clone(), cycles.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let permit = pool.acquire(1).await.unwrap();
                    cycles.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    permit.release().await.unwrap();
                }
            }));
        }
        assert!(eventually(HANDOFF, || cycles.load(Ordering::SeqCst) > 20).await);
        let big = fair().await.semaphore("fair", 4).unwrap();
        let started = Instant::now();
        let all = within(HANDOFF, "the request for every permit gets in", big.acquire(4))
            .await
            .unwrap();
        let waited = started.elapsed();
        assert_eq!(all.permits(), 4);
        let during = cycles.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(cycles.load(Ordering::SeqCst), during, "a small request got in beside all 4");
        all.release().await.unwrap();
        stop.store(true, Ordering::SeqCst);
        within(HANDOFF, "the small requests stop", async {
            for task in tasks {
                task.await.unwrap();
            }
        })
        .await;
        eprintln!("the request for 4 permits waited {waited:?} among 6 requests for 1");
        assert!(sem_keys(&fx, "fair").is_empty(), "{:?}", sem_keys(&fx, "fair"));
        let queue = fx.keys("fencelock:{*}sem-*:fair");
        assert!(queue.is_empty(), "the fair queue left {queue:?}");
    }
}

/// `cases` acquisitions by `a` dropped at random points, half of them while `b` holds every
/// permit and lets go at a random moment; after each case nothing of the semaphore is left.
async fn cancel_at_random_points(fx: &Env, a: &LockClient, b: &LockClient, cases: u32) {
    let seed = 0x5e3a_0001;
    let mut points = CancelPoints::new(seed).with_sleeps_up_to(Duration::from_micros(1500));
    for case in 0..cases {
        let pool: Semaphore = a.semaphore("cancel", 2).unwrap();
        let other = if points.rng().below(2) == 0 {
            Some(b.semaphore("cancel", 2).unwrap().acquire(2).await.unwrap())
        } else {
            None
        };
        let releaser = other.map(|permit| {
            let delay = points.rng().below(2_000);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_micros(delay)).await;
                permit.release().await.unwrap();
            })
        });
        let permits = 1 + u32::try_from(points.rng().below(2)).unwrap();
        let waits = points.rng().below(2) == 0;
        let acquire = async {
            if waits {
                Some(pool.acquire(permits).await.unwrap())
            } else {
                pool.try_acquire(permits).await.unwrap()
            }
        };
        if let Some(permit) = points.run(acquire).await.flatten() {
            permit.release().await.unwrap();
        }
        if let Some(releaser) = releaser {
            releaser.await.unwrap();
        }
        assert!(
            eventually(HANDOFF, || sem_keys(fx, "cancel").is_empty()
                && fx.keys("fencelock:{*}sem-*:cancel").is_empty())
            .await,
            "case {case} (seed {seed:#x}): a permit or queue entry stayed: {} in use",
            used(fx, "cancel")
        );
    }
    points.assert_both_outcomes();
    // Some cancels hit a request already on its way (they leave a "c" op record).
    let mut raw = fx.raw();
    let cancelled = fx
        .keys("fencelock:{*}op:*")
        .into_iter()
        .filter(|k| raw.get::<_, Option<String>>(k).unwrap().as_deref() == Some("c"))
        .count();
    assert!(
        cancelled > 0,
        "no cancel ever ran against an in-flight request"
    );
}

/// Within one client, waiters are served in order: a newcomer asking for one permit does not
/// take a free permit ahead of a waiter for three; and a waiter that wins with permits left
/// hands the wake-up on, so the next waiter of its client gets in on the same release.
#[tokio::test]
async fn a_client_serves_its_waiters_in_order_and_hands_on_what_is_left() {
    let fx = Fixture::start();
    let (holder, waiter) = (fx.client().await, fx.client().await);
    let theirs = holder.semaphore("order", 3).unwrap();
    let two = theirs.acquire(2).await.unwrap();
    let pool = waiter.semaphore("order", 3).unwrap();
    let big = tokio::spawn({
        let pool = pool.clone();
        async move { pool.acquire(3).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // One permit is free, but the client's head waits for three.
    let err = pool
        .acquire_timeout(1, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        err.is_timeout(),
        "the newcomer overtook the waiting head: {err}"
    );
    two.release().await.unwrap();
    let big = woken("the waiter for three", big).await.unwrap();
    // Two waiters for one permit each; one release of all three frees both at once.
    let first = tokio::spawn({
        let pool = pool.clone();
        async move { pool.acquire(1).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = tokio::spawn({
        let pool = pool.clone();
        async move { pool.acquire(1).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    big.release().await.unwrap();
    let first = woken("the first waiter", first).await.unwrap();
    let second = woken("the second waiter, by the first one's hand-on", second)
        .await
        .unwrap();
    first.release().await.unwrap();
    second.release().await.unwrap();
}

/// Handles and permits describe themselves.
#[tokio::test]
async fn handles_and_permits_describe_themselves() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let pool = client.semaphore("described", 3).unwrap();
    let shown = format!("{pool:?}");
    assert!(
        shown.contains("described") && shown.contains("limit: 3"),
        "{shown}"
    );
    assert_eq!((pool.name(), pool.limit()), (&b"described"[..], 3));
    let permit = pool.acquire(2).await.unwrap();
    let shown = format!("{permit:?}");
    for part in [
        "described",
        permit.holder_id(),
        "permits: 2",
        "limit: 3",
        &permit.token().get().to_string(),
        "valid: true",
    ] {
        assert!(shown.contains(part), "{part} not in {shown}");
    }
    assert_eq!(permit.semaphore_name(), b"described");
    assert!(permit.valid_until() > Instant::now());
    permit.release().await.unwrap();
}
