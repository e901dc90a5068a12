//! Redis restarts and killed connections while locks are held and waiters wait.

use std::time::Duration;

use crate::common::deadline::{woken, HANDOFF};
use crate::common::{eventually, Fixture};
use fencelock::LockClient;
use fencelock_testing::FaultProxy;

async fn watched_client(fx: &Fixture, lease: Duration) -> LockClient {
    LockClient::builder(fx.server.url())
        .default_lease(lease)
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_persistence_keeps_the_holder_and_the_waiters_finish() {
    let mut fx = Fixture::with_persistence();
    // What is left of the lease at the restart must outlast the kill, the AOF load, the
    // reconnect and the watchdog's backoff on a loaded machine: at least two thirds of 10 s.
    let lease = Duration::from_secs(10);
    let holder_client = watched_client(&fx, lease).await;
    let waiter_client = fx.client().await;
    let guard = holder_client
        .lock("survivor")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let token = guard.token();
    let waiter_lock = waiter_client.lock("survivor").unwrap();
    let waiter = tokio::spawn(async move {
        let guard = waiter_lock
            .acquire_timeout(Duration::from_secs(30))
            .await
            .unwrap();
        let token = guard.token();
        guard.release().await.unwrap();
        token
    });
    let key = fx.lock_key("survivor").unwrap();
    assert!(
        eventually(Duration::from_secs(30), || fx.subscribers(&key) == 1).await,
        "the waiter never subscribed"
    );

    fx.server.restart().unwrap();
    let restarted = std::time::Instant::now();
    // The AOF brought the lock back; the watchdog reconnects and keeps renewing it. Without a
    // renewal by the restarted server, a third of a lease later less than two thirds of it
    // would be left.
    tokio::time::sleep_until((restarted + lease / 3 + Duration::from_millis(100)).into()).await;
    assert!(
        eventually(lease + HANDOFF, || {
            let pttl: i64 = redis::Commands::pttl(&mut fx.raw(), &key).unwrap();
            pttl > 7000
        })
        .await,
        "the watchdog did not renew the lease at the restarted server within a lease"
    );
    assert!(
        guard.is_valid(),
        "the holder kept its lock across the restart"
    );
    assert!(fx.lock_key("survivor").is_some());
    assert!(!waiter.is_finished(), "the waiter must still be waiting");

    guard.release().await.unwrap();
    let waiter_token = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter finished after the release")
        .unwrap();
    assert!(waiter_token > token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_tells_the_holder_it_lost_the_lock() {
    let mut fx = Fixture::start();
    let client = watched_client(&fx, Duration::from_millis(900)).await;
    let guard = client.lock("forgotten").unwrap().acquire().await.unwrap();
    let token = guard.token();
    fx.server.restart().unwrap();
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the holder learns it lost the lock");
    assert!(!guard.is_valid());
    // The next holder's token is still greater (the counter was lost, the clock floor was not).
    let next = client.lock("forgotten").unwrap().acquire().await.unwrap();
    assert!(next.token() > token);
    assert!(guard.release().await.unwrap_err().is_not_held());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_waiters_connection_does_not_strand_it() {
    let fx = Fixture::start();
    let holder_client = fx.client().await;
    let waiter_client = fx.client().await;
    let guard = holder_client
        .lock("killed")
        .unwrap()
        .with_lease(Duration::from_secs(60))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let waiter_lock = waiter_client.lock("killed").unwrap();
    let waiter = tokio::spawn(async move {
        let guard = waiter_lock
            .acquire_timeout(Duration::from_secs(30))
            .await
            .unwrap();
        guard.release().await.unwrap();
    });
    let key = fx.lock_key("killed").unwrap();
    assert!(
        eventually(Duration::from_secs(30), || fx.subscribers(&key) == 1).await,
        "the waiter never subscribed"
    );

    // Kill every connection that has subscriptions: the waiter's.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut fx.raw())
        .unwrap();
    assert!(killed >= 1, "the waiter's connection was subscribed");
    // It reconnects and subscribes again by itself.
    assert!(
        eventually(Duration::from_secs(5), || {
            let channels: Vec<Vec<u8>> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .query(&mut fx.raw())
                .unwrap();
            !channels.is_empty()
        })
        .await
    );
    guard.release().await.unwrap();
    woken(
        "the release after the waiter's connection was killed",
        waiter,
    )
    .await
    .unwrap();
    assert!(fx.lock_key("killed").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_every_connection_keeps_the_holder_and_the_watchdog_resumes() {
    let fx = Fixture::start();
    // Enough lease for three kills 400 ms apart plus the reconnects on a loaded machine.
    let lease = Duration::from_secs(3);
    let client = watched_client(&fx, lease).await;
    let guard = client.lock("resumed").unwrap().acquire().await.unwrap();
    for _ in 0..3 {
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query(&mut fx.raw())
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // A renewal that succeeds moves the guard's deadline to more than 98 % of a lease past
    // its send, so past this mark only by one sent at most 1 % of a lease (30 ms) before it:
    // well after the last kill.
    let killed = std::time::Instant::now();
    assert!(
        eventually(lease + HANDOFF, || guard.valid_until()
            > killed + lease * 49 / 50)
        .await,
        "renewal did not resume within a lease of the reconnects"
    );
    assert!(guard.is_valid(), "renewal resumed after the reconnects");
    assert!(fx.lock_key("resumed").is_some());
    guard.release().await.unwrap();
}

/// A release published while the waiter's connection is down reaches nobody. The
/// disconnection itself sends the waiting head back to Redis once it can reconnect, instead of
/// leaving it asleep until the holder's 60 s lease would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_missed_while_disconnected_does_not_strand_the_waiter() {
    let fx = Fixture::start();
    let proxy = FaultProxy::start(fx.server.addr()).unwrap();
    let waiter_client = LockClient::connect(&proxy.url()).await.unwrap();
    let (guard, waiter) = waiting_behind_a_long_hold(&fx, &waiter_client, "missed").await;

    // The waiter's connection goes down and stays down while the lock is released.
    proxy.refuse_new(true);
    proxy.reset_all();
    guard.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.refuse_new(false);

    let acquired = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter slept on although the release it missed freed the lock")
        .unwrap()
        .unwrap();
    acquired.release().await.unwrap();
}

/// A connection that stops answering (half-open: no error, no reply) is replaced after a
/// request times out on it, and a release published meanwhile went to the old connection's
/// subscription: the waiter must go back to Redis, not sleep out the holder's lease.
#[tokio::test]
async fn a_release_missed_on_a_connection_that_stopped_answering_does_not_strand_the_waiter() {
    let fx = Fixture::start();
    let proxy = FaultProxy::start(fx.server.addr()).unwrap();
    let waiter_client = short_window(proxy.url()).await;
    let (guard, waiter) = waiting_behind_a_long_hold(&fx, &waiter_client, "half-open").await;

    // Nothing comes back any more; a request of the waiter's client times out, which replaces
    // the connection without any push saying so. The release is published meanwhile.
    proxy.blackhole(fencelock_testing::Direction::Both);
    let other = waiter_client.lock("other").unwrap().try_acquire().await;
    assert!(other.is_err(), "{other:?}");
    guard.release().await.unwrap();
    proxy.heal();

    let acquired = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter slept on although the release it missed freed the lock")
        .unwrap()
        .unwrap();
    acquired.release().await.unwrap();
}

/// The retry window of the waiters that ride out outages longer than it.
const SHORT_WINDOW: Duration = Duration::from_millis(500);

/// A client of `url` with a [`SHORT_WINDOW`].
async fn short_window(url: String) -> LockClient {
    LockClient::builder(url)
        .retry_window(SHORT_WINDOW)
        .connect()
        .await
        .unwrap()
}

/// A lock `name` held with a 60 s lease by a client of `fx`'s server, and a waiter for it on
/// `waiter_client`, that waits up to 30 s and is subscribed (so waiting) when this returns.
async fn waiting_behind_a_long_hold(
    fx: &Fixture,
    waiter_client: &LockClient,
    name: &str,
) -> (
    fencelock::LockGuard,
    tokio::task::JoinHandle<Result<fencelock::LockGuard, fencelock::Error>>,
) {
    let holder_client = fx.client().await;
    let guard = holder_client
        .lock(name)
        .unwrap()
        .with_lease(Duration::from_secs(60))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let waiter_lock = waiter_client.lock(name).unwrap();
    let waiter =
        tokio::spawn(async move { waiter_lock.acquire_timeout(Duration::from_secs(30)).await });
    let key = fx.lock_key(name).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || fx.subscribers(&key) == 1).await,
        "the waiter never subscribed"
    );
    (guard, waiter)
}

/// A waiter waits for the lock, not for one request: an outage longer than the retry window
/// (here four of them, with every connection attempt accepted and reset, as a server that
/// is going away does) is ridden out until the waiter's own deadline, and the release that
/// happened meanwhile is found once the connection is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_an_outage_longer_than_the_retry_window() {
    let fx = Fixture::start();
    let proxy = FaultProxy::start(fx.server.addr()).unwrap();
    let waiter_client = short_window(proxy.url()).await;
    let (guard, waiter) = waiting_behind_a_long_hold(&fx, &waiter_client, "outage").await;

    proxy.refuse_new(true);
    proxy.reset_all();
    tokio::time::sleep(SHORT_WINDOW * 4).await;
    if waiter.is_finished() {
        panic!(
            "the waiter gave up during the outage: {:?}",
            waiter.await.unwrap().map(|guard| guard.token())
        );
    }
    guard.release().await.unwrap();
    proxy.refuse_new(false);

    let acquired = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter found the lock free once the connection was back")
        .unwrap()
        .unwrap();
    acquired.release().await.unwrap();
}

/// The same across a real server restart that lasts longer than the retry window: the server is
/// killed, stays down for four windows, and comes back empty. The waiter neither fails with a
/// transport error nor sleeps until the lost holder's 60 s lease would have ended: the lost
/// connection sends it back to Redis, it retries until the server answers, and it finds the
/// lock free, with a token still above the lost holder's (the clock floor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_a_server_restart_longer_than_the_retry_window() {
    let mut fx = Fixture::start();
    let url = fx.server.url();
    let waiter_client = short_window(url).await;
    let (guard, waiter) = waiting_behind_a_long_hold(&fx, &waiter_client, "restarted").await;
    let lost_token = guard.token();

    fx.server.kill();
    tokio::time::sleep(SHORT_WINDOW * 4).await;
    if waiter.is_finished() {
        panic!(
            "the waiter gave up while the server was down: {:?}",
            waiter.await.unwrap().map(|guard| guard.token())
        );
    }
    fx.server.start_again().unwrap();

    let acquired = woken("the waiter after the server came back empty", waiter)
        .await
        .unwrap()
        .expect("the waiter rode out the restart");
    assert!(acquired.token() > lost_token, "the clock floor holds");
    acquired.release().await.unwrap();
    drop(guard);
}
