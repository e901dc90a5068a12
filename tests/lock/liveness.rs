//! Waiting, renewal, the lost-lease signal and cancellation, against real redis-servers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::deadline::{woken, Progress, HANDOFF};
use crate::common::{eventually, quiet_renewal_calls, Fixture};
use fencelock::LockClient;
use redis::Commands;

const LONG: Duration = Duration::from_secs(60);

async fn client_with_lease(builder: fencelock::LockClientBuilder, lease: Duration) -> LockClient {
    builder.default_lease(lease).connect().await.unwrap()
}

on_topologies! {
    async fn a_waiter_is_woken_by_the_release_not_by_polling(fx) {
        // Its wait records (sent beside its attempts, for operators) off: the script calls
        // counted here are the waiting protocol's own.
        let holder_client = fx.client().await;
        let waiter_client = fx.builder().record_waits(false).connect().await.unwrap();
        fx.warm_up(&holder_client).await;
        fx.warm_up(&waiter_client).await;
        let lock = holder_client
            .lock("wake")
            .unwrap()
            .with_lease(LONG)
            .unwrap();
        let guard = lock.acquire().await.unwrap();

        let waiting = waiter_client
            .lock("wake")
            .unwrap()
            .with_lease(LONG)
            .unwrap();
        let base = fx.calls("evalsha");
        let waiter = tokio::spawn(async move {
            let guard = waiting.acquire().await.unwrap();
            let acquired_at = Instant::now();
            guard.release().await.unwrap();
            acquired_at
        });
        // The waiter asks twice (fast path, then once subscribed), then sleeps on the channel.
        assert!(
            eventually(Duration::from_secs(30), || fx.calls("evalsha") - base == 2).await,
            "the waiter did not make its two attempts"
        );
        let before_hold = fx.calls("evalsha");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(fx.calls("evalsha"), before_hold, "a waiter must not poll");

        let released_at = Instant::now();
        guard.release().await.unwrap();
        let acquired_at = woken("the holder's release", waiter).await.unwrap();
        // Woken by the message: long before the holder's 60 s lease would have freed the lock.
        assert!(acquired_at.duration_since(released_at) < Duration::from_secs(5));
        // The holder's release, the waiter's single attempt, and its release.
        assert_eq!(fx.calls("evalsha"), before_hold + 3);
    }
}

on_topologies! {
    async fn a_waiter_gets_a_vanished_holders_lock_when_its_lease_ends(fx) {
        let client = fx.client().await;
        let lease = Duration::from_millis(300);
        let lock = client.lock("vanished").unwrap();
        // Before the request: the server starts the lease while the request is in flight, so
        // no one can get the lock before a whole lease after this.
        let acquired_at = Instant::now();
        let guard = lock.with_lease(lease).unwrap().acquire().await.unwrap();
        // The holder dies without releasing: no message will ever come.
        std::mem::forget(guard);
        let other = fx.client().await;
        let next = other
            .lock("vanished")
            .unwrap()
            .acquire_timeout(Duration::from_secs(10))
            .await
            .unwrap();
        let waited = acquired_at.elapsed();
        assert!(waited >= lease, "the lock changed hands {waited:?} after a {lease:?} lease began");
        next.release().await.unwrap();
    }
}

on_topologies! {
    async fn an_acquire_deadline_is_honoured(fx) {
        let client = fx.client().await;
        let lock = client.lock("deadline").unwrap();
        let guard = lock.acquire().await.unwrap();
        let started = Instant::now();
        let err = lock
            .acquire_timeout(Duration::from_millis(200))
            .await
            .unwrap_err();
        let waited = started.elapsed();
        assert!(err.is_timeout(), "{err}");
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        // The one waiter that timed out left its queue: a new waiter goes straight to Redis.
        guard.release().await.unwrap();
        lock.try_acquire()
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
        assert!(fx.lock_key("deadline").is_none());
    }
}

on_topologies_multi_thread! {
    async fn local_waiters_are_served_in_fifo_order_with_one_attempt_per_release(fx) {
        const WAITERS: usize = 32;
        // Wait records off: the calls counted are the attempts (see the test above).
        let holder_client = fx.client().await;
        let waiter_client = fx.builder().record_waits(false).connect().await.unwrap();
        fx.warm_up(&holder_client).await;
        fx.warm_up(&waiter_client).await;
        let guard = holder_client
            .lock("fifo")
            .unwrap()
            .with_lease(LONG)
            .unwrap()
            .acquire()
            .await
            .unwrap();

        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let progress = Progress::new();
        let mut tasks = Vec::new();
        let base = fx.calls("evalsha");
        for i in 0..WAITERS {
            let lock = waiter_client
                .lock("fifo")
                .unwrap()
                .with_lease(LONG)
                .unwrap();
            let (order, progress) = (order.clone(), progress.clone());
            let (polled_tx, polled_rx) = tokio::sync::oneshot::channel();
            tasks.push(tokio::spawn(async move {
                let mut acquire = std::pin::pin!(lock.acquire());
                // One poll by hand, then tell the test: a waiter behind others joins the queue
                // in its first poll (it skips the fast path and queues before any await).
                let first = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(std::future::Future::poll(acquire.as_mut(), cx))
                })
                .await;
                let _ = polled_tx.send(());
                let guard = match first {
                    std::task::Poll::Ready(outcome) => outcome,
                    std::task::Poll::Pending => acquire.await,
                }
                .unwrap();
                progress.tick();
                order.lock().push(i);
                guard.release().await.unwrap();
            }));
            // Let each waiter take its place in the queue before the next arrives.
            polled_rx.await.unwrap();
            if i == 0 {
                // The first one queues once its fast-path attempt came back busy, and then
                // asks once more (it is the head and just subscribed): two script calls.
                assert!(
                    eventually(Duration::from_secs(30), || fx.calls("evalsha") - base == 2)
                        .await,
                    "the first waiter did not queue"
                );
            }
        }
        let before = fx.calls("evalsha");
        progress.tick();
        guard.release().await.unwrap();
        progress.join("32 local waiters served one per release", tasks).await;
        assert_eq!(
            *order.lock(),
            (0..WAITERS).collect::<Vec<_>>(),
            "FIFO order"
        );
        // One release by the holder, then per waiter one release and at most one attempt: a
        // waiter that sat in its wait when the release before it freed the lock was handed
        // the lock in that release's call (`handoff.lua`) and makes none. The first waiter
        // always makes one (the holder is another client, which hands nothing on).
        let calls = fx.calls("evalsha") - before;
        let waiters = WAITERS as u64;
        assert!(
            (2 + waiters..=1 + 2 * waiters).contains(&calls),
            "{calls} calls for {WAITERS} waiters"
        );
    }
}

on_topologies! {
    async fn the_watchdog_keeps_a_default_lease_lock_alive(fx) {
        // Renewals a second apart: a loaded machine delaying one by a few hundred ms must not
        // let the lock expire. The test outlives the lease, which only renewals can explain.
        let lease = Duration::from_secs(3);
        let client = client_with_lease(fx.builder(), lease).await;
        let other = fx.client().await;
        let guard = client.lock("kept").unwrap().acquire().await.unwrap();
        assert_eq!(client.watched_locks(), 1);
        tokio::time::sleep(lease + lease / 6).await;
        assert!(guard.is_valid(), "the watchdog did not keep the lock alive past its lease");
        assert!(other
            .lock("kept")
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none());
        let pttl: i64 = fx.raw().pttl(fx.lock_key("kept").unwrap()).unwrap();
        assert!(pttl > 0 && pttl <= 3000, "{pttl}");
        assert!(client.renewal_calls() >= 2, "{}", client.renewal_calls());
        guard.release().await.unwrap();
        assert_eq!(client.watched_locks(), 0);
    }
}

on_topologies! {
    async fn an_explicit_lease_is_not_renewed(fx) {
        let client = client_with_lease(fx.builder(), Duration::from_millis(300)).await;
        let guard = client
            .lock("fixed")
            .unwrap()
            .with_lease(Duration::from_millis(300))
            .unwrap()
            .acquire()
            .await
            .unwrap();
        assert_eq!(client.watched_locks(), 0);
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("an explicit lease ends");
        assert!(!guard.is_valid());
        assert!(eventually(Duration::from_secs(2), || fx.lock_key("fixed").is_none()).await);
        assert!(guard.release().await.unwrap_err().is_not_held());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_held_locks_are_renewed_in_batches() {
    const HELD: usize = 1000;
    const BATCH: usize = 100;
    let fx = Fixture::start();
    // Ticks a second apart: a thousand locks stay valid even when a loaded machine slows one.
    let lease = Duration::from_secs(3);
    let client = LockClient::builder(fx.server.url())
        .default_lease(lease)
        .renew_batch(BATCH)
        .connect()
        .await
        .unwrap();
    let mut guards = Vec::with_capacity(HELD);
    for i in 0..HELD {
        guards.push(
            client
                .lock(format!("held:{i}"))
                .unwrap()
                .acquire()
                .await
                .unwrap(),
        );
    }
    // Watch whole ticks: each one renews all 1000 locks with exactly ceil(1000/100) calls.
    // The client's count is snapshot between ticks; the server's is read after the client's at
    // the start and before it at the end, so it cannot count a call the client did not.
    let per_tick = HELD.div_ceil(BATCH) as u64;
    let calls_before = quiet_renewal_calls(&client).await;
    let server_before = fx.calls("evalsha");
    assert!(
        eventually(lease + HANDOFF, || client.renewal_calls()
            >= calls_before + 2 * per_tick)
        .await,
        "two ticks did not run within a lease (one every third of it) and a handoff's slack: \
         the watchdog stopped renewing"
    );
    let server = fx.calls("evalsha") - server_before;
    let calls = quiet_renewal_calls(&client).await - calls_before;
    // A tick in flight at the first snapshot may have reached the server after it.
    assert!(
        server <= calls + per_tick,
        "server saw {server} script calls for {calls} renewals"
    );
    assert!(
        calls.is_multiple_of(per_tick),
        "{calls} renewal calls are not whole ticks of {per_tick}"
    );
    assert!(guards.iter().all(|g| g.is_valid()));
    for guard in guards {
        guard.release().await.unwrap();
    }
}

on_topologies! {
    async fn a_dropped_guard_is_not_renewed_again(fx) {
        let client = client_with_lease(fx.builder(), Duration::from_millis(300)).await;
        fx.warm_up(&client).await;
        let guard = client.lock("dropped").unwrap().acquire().await.unwrap();
        assert_eq!(client.watched_locks(), 1);
        drop(guard);
        assert!(eventually(Duration::from_secs(2), || fx.lock_key("dropped").is_none()).await);
        assert!(eventually(Duration::from_secs(2), || client.watched_locks() == 0).await);
        let renewals = client.renewal_calls();
        let server = fx.calls("evalsha");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(client.renewal_calls(), renewals);
        assert_eq!(fx.calls("evalsha"), server);
    }
}

on_topologies! {
    async fn a_deleted_lock_fires_the_lost_signal_at_the_next_renewal(fx) {
        // Renewals a second apart, and two more seconds of lease after the one that notices.
        let client = client_with_lease(fx.builder(), Duration::from_secs(3)).await;
        let guard = client.lock("deleted").unwrap().acquire().await.unwrap();
        assert!(!futures_ready(&guard).await, "not lost while held");
        let _: () = fx.raw().del(fx.lock_key("deleted").unwrap()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("lost signal");
        // The renewal noticed, not the lease timer: the lease had time left by our clock.
        assert!(
            Instant::now() < guard.valid_until(),
            "the loss was seen only when the lease ran out: no renewal noticed it"
        );
        assert!(!guard.is_valid());
        assert_eq!(client.watched_locks(), 0);
        // The new holder is untouched by the old guard's release.
        let next = client.lock("deleted").unwrap().acquire().await.unwrap();
        assert!(guard.release().await.unwrap_err().is_not_held());
        assert!(next.is_valid());
        next.release().await.unwrap();
    }
}

/// Whether `lost()` is already resolved, without waiting.
async fn futures_ready(guard: &fencelock::LockGuard) -> bool {
    tokio::select! {
        biased;
        () = guard.lost() => true,
        () = std::future::ready(()) => false,
    }
}

/// While renewals fail the watchdog backs off (doubling from 50 ms up to a third of the lease)
/// instead of hammering the server: over three lease periods of failures that come back at
/// once it makes a handful of attempts, not thousands. (A count over a window, never a timing.)
#[tokio::test]
async fn the_watchdog_backs_off_while_renewals_fail() {
    let fx = Fixture::start();
    let client = LockClient::builder(fx.server.url())
        .default_lease(Duration::from_millis(3_000))
        .connect()
        .await
        .unwrap();
    let guard = client.lock("backoff").unwrap().acquire().await.unwrap();
    // Renewals now fail at once (NOPERM), unlike a server that is down, where every attempt
    // waits for the reconnect and the back-off hardly shows.
    let mut raw = fx.raw();
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "default", "-evalsha", "-eval"])
        .query(&mut raw)
        .unwrap();
    let before = client.renewal_calls();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let attempts = client.renewal_calls() - before;
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "default", "+@all"])
        .query(&mut raw)
        .unwrap();
    // The first failing tick is at most one period (1 s) away; then 50+100+200+400+800 ms and
    // the 1 s cap: under a dozen attempts in 3 s however the ticks fall. A back-off that
    // shrank instead would make thousands.
    assert!(attempts >= 1, "the watchdog gave up renewing: {attempts}");
    assert!(
        attempts <= 12,
        "{attempts} renewal attempts in 3 s of failures"
    );
    drop(guard);
}

fn active_channels(fx: &Fixture) -> Vec<Vec<u8>> {
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query(&mut fx.raw())
        .unwrap()
}

/// The fast path is the whole story when nobody waits: one script call per operation, no
/// subscription (which would cost a round trip and a server-side channel per lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_never_subscribes() {
    let fx = Fixture::start();
    let client = fx.client().await;
    fx.warm_up(&client).await;
    let lock = client.lock("quiet").unwrap();
    let (subscribes, scripts) = (fx.calls("subscribe"), fx.calls("evalsha"));
    for _ in 0..3 {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    assert_eq!(fx.calls("evalsha") - scripts, 6);
    assert_eq!(
        fx.calls("subscribe"),
        subscribes,
        "nobody waited, nothing to subscribe to"
    );
    assert!(active_channels(&fx).is_empty());
}

/// A client subscribes to a lock's channel only while it has waiters for that lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscription_ends_with_the_last_waiter() {
    let fx = Fixture::start();
    let (holder_client, client) = (fx.client().await, fx.client().await);
    let guard = holder_client.lock("sub").unwrap().acquire().await.unwrap();
    let lock = client.lock("sub").unwrap();
    let progress = Progress::new();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let (lock, progress) = (lock.clone(), progress.clone());
            tokio::spawn(async move {
                let guard = lock.acquire().await.unwrap();
                progress.tick();
                guard.release().await.unwrap();
            })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(30), || active_channels(&fx).len() == 1).await,
        "the waiters' client subscribes to the lock's channel"
    );
    progress.tick();
    guard.release().await.unwrap();
    progress.join("three waiters of one client", waiters).await;
    assert!(
        eventually(Duration::from_secs(30), || active_channels(&fx).is_empty()).await,
        "still subscribed after the last waiter left: {:?}",
        active_channels(&fx)
    );
}

/// Within a client the lock is FIFO: a newcomer does not take a lock that looks free while an
/// earlier waiter of its client is queued (here the lock vanished without a release message,
/// so the queued head sleeps until its lease timer and the lock stays free meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_does_not_barge_past_a_queued_waiter() {
    let fx = Fixture::start();
    // Wait records off: the calls counted are the attempts.
    let holder_client = fx.client().await;
    let client = fx.builder().record_waits(false).connect().await.unwrap();
    fx.warm_up(&client).await;
    let _held = holder_client
        .lock("barge")
        .unwrap()
        .with_lease(LONG)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let first = client.lock("barge").unwrap().with_lease(LONG).unwrap();
    let scripts = fx.calls("evalsha");
    let queued = tokio::spawn(async move { first.acquire().await.map(|g| g.token()) });
    // Its two attempts: the fast path, then once more as head after subscribing.
    assert!(
        eventually(Duration::from_secs(30), || fx.calls("evalsha") - scripts
            == 2)
        .await
    );
    assert!(eventually(Duration::from_secs(30), || active_channels(&fx).len() == 1).await);

    let key = fx.lock_key("barge").unwrap();
    let _: () = fx.raw().del(&key).unwrap();
    let newcomer = client.lock("barge").unwrap().with_lease(LONG).unwrap();
    let err = newcomer
        .acquire_timeout(Duration::from_millis(300))
        .await
        .expect_err("the newcomer must queue behind the first waiter");
    assert!(err.is_timeout(), "{err}");
    assert_eq!(
        fx.calls("evalsha") - scripts,
        2,
        "the newcomer never went to Redis"
    );
    assert!(fx.lock_key("barge").is_none(), "nobody took the lock");
    queued.abort();
}
