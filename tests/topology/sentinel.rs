//! A primary with replicas under three Sentinels: the client, and its replica-acknowledgement
//! connections, follow a failover; data nodes may require a password.

use std::time::Duration;

use crate::common::eventually;
use fencelock::LockClient;
use fencelock_testing::{RedisSentinels, RedisServer};
use redis::Commands;

const LONG: Duration = Duration::from_secs(60);

fn con(node: &RedisServer) -> redis::Connection {
    node.client().get_connection().expect("node connection")
}

/// A connection for a check polled across a failover: Sentinel ends every normal client of a
/// node it reconfigures (`CLIENT KILL TYPE normal`), so a connection opened in that window may
/// be reset, which means "not yet", not a failure.
fn try_con(node: &RedisServer) -> Option<redis::Connection> {
    node.client()
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()
}

/// The clients' default lease: a failover may take more than one Sentinel election (a failed
/// one is retried after the failover timeout), and a held lock must outlast all of it.
const LEASE: Duration = Duration::from_secs(30);

/// Long enough for a healthy replica on a loaded machine.
const HEALTHY_ACK: Duration = Duration::from_secs(10);

fn builder(set: &RedisSentinels) -> fencelock::LockClientBuilder {
    LockClient::sentinel_builder(set.sentinel_urls(), set.master_name())
        .default_lease(LEASE)
        // A failover takes a few seconds (down-after 3 s, election, promotion): operations
        // caught in it are re-sent with their ids for longer than that.
        .retry_window(Duration::from_secs(15))
        .op_record_ttl(Duration::from_secs(30))
}

async fn client(set: &RedisSentinels) -> LockClient {
    builder(set).connect().await.unwrap()
}

/// Successful calls of `command` at `node` so far (`INFO commandstats`).
fn calls(node: &RedisServer, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con(node))
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Subscribers of `channel` on `node` (`PUBSUB NUMSUB`); 0 while `node` cannot be reached.
fn subscribers(node: &RedisServer, channel: &[u8]) -> u64 {
    try_con(node)
        .and_then(|mut con| {
            redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(channel)
                .query::<(Vec<u8>, u64)>(&mut con)
                .ok()
        })
        .map_or(0, |numsub| numsub.1)
}

/// How many replicas `node` has online (`INFO replication`); 0 while `node` cannot be reached.
fn online_replicas(node: &RedisServer) -> usize {
    try_con(node)
        .and_then(|mut con| {
            redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut con)
                .ok()
        })
        .map_or(0, |info| {
            info.lines()
                .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                .count()
        })
}

/// Whether `node` answers `ROLE` as a replica; false while it cannot be reached.
fn is_replica(node: &RedisServer) -> bool {
    try_con(node)
        .and_then(|mut con| redis::cmd("ROLE").query::<Vec<redis::Value>>(&mut con).ok())
        .is_some_and(|role| role.first() == Some(&redis::Value::BulkString(b"slave".to_vec())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_and_holders_waiters_and_tokens_carry_on() {
    let mut set = RedisSentinels::start(2).unwrap();
    // Every acquisition of the holder's client waits for both replicas, so whichever is
    // promoted has the lock.
    let holder_client = builder(&set)
        .replica_ack(2, HEALTHY_ACK)
        .connect()
        .await
        .unwrap();
    let waiter_client = client(&set).await;
    let first_primary = set.primary().unwrap();
    let waits_before = calls(first_primary, "wait");
    let guard = holder_client.lock("acct").unwrap().acquire().await.unwrap();
    assert!(guard.replicated());
    assert_eq!(guard.replica_acks(), Some(2));
    assert_eq!(calls(first_primary, "wait"), waits_before + 1);
    let token = guard.token();
    let waiter = tokio::spawn(async move {
        let lock = waiter_client
            .lock("acct")
            .unwrap()
            .with_lease(LONG)
            .unwrap();
        let guard = lock
            .acquire_timeout(Duration::from_secs(60))
            .await
            .expect("the waiter gets the lock after the failover and the release");
        let token = guard.token();
        guard.release().await.unwrap();
        token
    });

    let primary = set.primary().unwrap();
    let key: Vec<u8> = con(primary)
        .keys::<_, Vec<Vec<u8>>>("fencelock:{*}lock:acct")
        .unwrap()
        .pop()
        .expect("the lock is held");
    let subscribed = eventually(Duration::from_secs(10), || subscribers(primary, &key) >= 1).await;
    assert!(subscribed, "the waiter never subscribed");

    let old = set.kill_primary().unwrap();
    let new = set.wait_for_failover(old, Duration::from_secs(30)).unwrap();
    let new_primary = set.primary().unwrap();
    assert_eq!(new_primary.port(), new);
    // The waiter's client follows as well, and its new connection starts without
    // subscriptions: it subscribes again there, so the release below reaches the waiter as a
    // message instead of after the holder's lease.
    let resubscribed = eventually(Duration::from_secs(30), || {
        subscribers(new_primary, &key) >= 1
    })
    .await;
    assert!(
        resubscribed,
        "the waiter never subscribed at the new primary"
    );

    // The holder keeps its lock: the promoted replica has it with the same token, and the
    // watchdog renews it there: less than a second after a renewal, which the failover (over
    // three seconds: down-after alone is three) puts after the kill.
    let stored: u64 = con(new_primary).hget(&key, "~token").unwrap();
    assert_eq!(stored, token.get());
    let fresh = i64::try_from((LEASE - Duration::from_secs(1)).as_millis()).unwrap();
    let renewed_there = eventually(LONG, || {
        try_con(new_primary)
            .and_then(|mut con| con.pttl::<_, i64>(&key).ok())
            .is_some_and(|pttl| pttl > fresh)
    })
    .await;
    assert!(
        renewed_there,
        "the watchdog did not renew at the new primary"
    );
    assert!(guard.is_valid());

    // New replicated acquisitions work: the acknowledgement pool dropped its connections to
    // the dead primary and WAITs at the new one, for the replica the Sentinels moved there.
    set.wait_for_replicas_to_follow(Duration::from_secs(25))
        .unwrap();
    assert!(
        eventually(Duration::from_secs(30), || online_replicas(new_primary)
            >= 1)
        .await,
        "the remaining replica never followed the new primary :{}\n{}",
        new_primary.port(),
        set.diagnostics()
    );
    let waits_there = calls(new_primary, "wait");
    let other = holder_client
        .lock("other")
        .unwrap()
        .with_replica_ack(1, HEALTHY_ACK)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert!(other.replicated());
    assert_eq!(other.replica_acks(), Some(1));
    assert_eq!(calls(new_primary, "wait"), waits_there + 1);
    let held: Vec<Vec<u8>> = con(new_primary).keys("fencelock:{*}lock:other").unwrap();
    assert_eq!(held.len(), 1, "taken at the new primary");
    other.release().await.unwrap();
    // The connection to the dead primary was dropped, not kept next to the new one.
    assert_eq!(holder_client.replica_ack_connections(), 1);
    // The held lock goes to the waiter with a greater token.
    guard.release().await.unwrap();
    let next = waiter.await.unwrap();
    assert!(next > token, "tokens keep increasing across the failover");
    // One replica is left: the client-wide requirement of two is a shortfall now, rolled
    // back at the new primary.
    let err = holder_client
        .lock("acct")
        .unwrap()
        .with_replica_ack(2, Duration::from_millis(200))
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            fencelock::Error::ReplicationTimeout {
                acked: 0 | 1,
                required: 2,
                ..
            }
        ),
        "{err:?}"
    );
    let again = holder_client
        .lock("acct")
        .unwrap()
        .without_replica_ack()
        .try_acquire()
        .await
        .unwrap()
        .expect("the shortfall left the lock free");
    assert!(again.token() > next);
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_answering_readonly_sends_the_client_to_the_new_one() {
    let set = RedisSentinels::start(1).unwrap();
    let client = builder(&set)
        .replica_ack(1, HEALTHY_ACK)
        .connect()
        .await
        .unwrap();
    let first = client.lock("acct").unwrap().acquire().await.unwrap();
    assert!(first.replicated());
    let token = first.token();
    first.release().await.unwrap();
    let old_primary = set.primary().unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut con(old_primary))
        .unwrap();
    assert_eq!(acked, 1);

    // The old primary keeps running and becomes a replica: the client's connection to it may
    // stay open, and then its next write is answered READONLY.
    let old = set.failover().unwrap();
    let new = set.wait_for_failover(old, Duration::from_secs(30)).unwrap();
    let demoted = eventually(Duration::from_secs(30), || is_replica(old_primary)).await;
    assert!(demoted, "the old primary did not become a replica");

    // Nothing of this client has touched the new primary yet: its acknowledgement pool still
    // holds a connection to the demoted node, whose READONLY makes it ask the Sentinels.
    let new_primary = set.primary().unwrap();
    assert_eq!(new_primary.port(), new);
    assert!(
        eventually(Duration::from_secs(30), || online_replicas(new_primary)
            >= 1)
        .await,
        "the demoted primary never replicated from the new one"
    );
    let waits_there = calls(new_primary, "wait");
    let next = client.lock("acct").unwrap().acquire().await.unwrap();
    assert!(next.token() > token);
    assert!(next.replicated());
    assert_eq!(next.replica_acks(), Some(1));
    assert_eq!(calls(new_primary, "wait"), waits_there + 1);
    assert_eq!(
        client.replica_ack_connections(),
        1,
        "only the new primary's"
    );
    let held: Vec<Vec<u8>> = con(new_primary).keys("fencelock:{*}lock:acct").unwrap();
    assert_eq!(held.len(), 1, "the lock was taken at the new primary");
    next.release().await.unwrap();
}

/// 16 tasks of a client behind Sentinel take and release their own locks without pause while
/// the primary fails over (graceful: `SENTINEL FAILOVER`). Operations caught in it (their
/// replies lost with the connections Sentinel kills, or answered `READONLY` by the demoted
/// primary) are re-sent at the new primary and applied once: every acquisition and release
/// succeeds, tokens increase on every lock, and nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_caught_in_a_failover_are_applied_once() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let set = RedisSentinels::start(1).unwrap();
    let client = LockClient::sentinel_builder(set.sentinel_urls(), set.master_name())
        .record_waits(false)
        // A failover takes a few seconds: operations caught in it are re-sent for longer.
        .retry_window(Duration::from_secs(15))
        .op_record_ttl(Duration::from_secs(40))
        .connect()
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let lock = client
                .lock(format!("failover-{i}"))
                .unwrap()
                .with_lease(LEASE)
                .unwrap();
            let (stop, cycles) = (stop.clone(), cycles.clone());
            tokio::spawn(async move {
                let mut last = 0;
                while !stop.load(Ordering::Relaxed) {
                    let guard = lock.acquire().await.unwrap();
                    assert!(guard.token().get() > last, "tokens increase");
                    last = guard.token().get();
                    guard.release().await.unwrap();
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Writes stop at the primary (calls on the wire wait there, not run) and every write it
    // answered reaches the replica, so the failover loses none: a lock left held at the end
    // would be an operation applied twice (or a release lost by the client).
    let old_primary = set.primary().unwrap();
    let mut old_raw = con(old_primary);
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(20_000)
        .arg("WRITE")
        .query::<()>(&mut old_raw)
        .unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(10_000)
        .query(&mut old_raw)
        .unwrap();
    assert_eq!(acked, 1, "the replica has every answered write");
    let old = set.failover().unwrap();
    set.wait_for_failover(old, Duration::from_secs(30)).unwrap();
    // The demoted primary runs what waited there now: as a replica, it refuses (READONLY)
    // and the client sends it to the new primary.
    let demoted = eventually(Duration::from_secs(30), || is_replica(old_primary)).await;
    assert!(demoted, "the old primary did not become a replica");
    let _ = old_primary
        .client()
        .get_connection()
        .and_then(|mut con| redis::cmd("CLIENT").arg("UNPAUSE").query::<()>(&mut con));
    let at_failover = cycles.load(Ordering::Relaxed);
    // Going on at the new primary.
    let more = eventually(Duration::from_secs(30), || {
        cycles.load(Ordering::Relaxed) > at_failover + 200
    })
    .await;
    assert!(more, "the tasks did not carry on at the new primary");
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let held: Vec<Vec<u8>> = con(set.primary().unwrap())
        .keys("fencelock:{*}lock:*")
        .unwrap();
    assert!(held.is_empty(), "left held: {held:?}");
}

/// Data nodes that require a password: a Sentinel client without `sentinel_node_auth` cannot
/// use the primary the Sentinels name; with it, acquisitions (replicated ones too, whose
/// dedicated connections use the same credentials) work before and after a failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_node_auth_reaches_password_protected_data_nodes_across_a_failover() {
    const PASSWORD: &str = "node-s3cret";
    let set = RedisSentinels::start_with_password(1, PASSWORD).unwrap();
    // redis-rs checks the named primary with ROLE, which the server refuses without AUTH.
    let refused = builder(&set).connect().await;
    assert!(
        refused.is_err(),
        "connected to a protected primary without its password"
    );

    let client = builder(&set)
        .sentinel_node_auth(None, PASSWORD)
        .replica_ack(1, HEALTHY_ACK)
        .connect()
        .await
        .unwrap();
    let guard = client.lock("acct").unwrap().acquire().await.unwrap();
    assert!(guard.replicated());
    assert_eq!(guard.replica_acks(), Some(1));
    let token = guard.token();
    guard.release().await.unwrap();

    let old = set.failover().unwrap();
    let new = set.wait_for_failover(old, Duration::from_secs(30)).unwrap();
    let new_primary = set.primary().unwrap();
    assert_eq!(new_primary.port(), new);
    assert!(
        eventually(Duration::from_secs(30), || online_replicas(new_primary)
            >= 1)
        .await,
        "the demoted primary never replicated from the new one"
    );
    let next = client.lock("acct").unwrap().acquire().await.unwrap();
    assert!(next.replicated());
    assert!(next.token() > token);
    let held: Vec<Vec<u8>> = con(new_primary).keys("fencelock:{*}lock:acct").unwrap();
    assert_eq!(held.len(), 1, "taken at the new primary");
    next.release().await.unwrap();

    // The option belongs to Sentinel clients: elsewhere credentials go in the URL.
    let err = LockClient::builder(new_primary.url())
        .sentinel_node_auth(None, PASSWORD)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, fencelock::Error::InvalidConfig { .. }),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_instances_behind_sentinel_run_each_of_twenty_ticks_once() {
    use crate::common::ticks::{assert_each_tick_ran_once, drive, PERIOD};
    let set = RedisSentinels::start(1).unwrap();
    let mut clients = Vec::new();
    for _ in 0..5 {
        clients.push(client(&set).await);
    }
    let options = fencelock::JobOptions::new(PERIOD, Duration::from_secs(5));
    let calls = drive(
        &clients,
        |client| client.job("report", options.clone()).unwrap(),
        20,
        Duration::from_millis(120),
        Duration::from_millis(40),
        Duration::from_millis(30),
        "report-log",
    )
    .await;
    assert_each_tick_ran_once(&clients[0], &calls, 20, "report-log").await;
}

/// A semaphore behind Sentinel: three permits, six contenders on two clients, never more than
/// three held, and a waiter woken by each release (pub/sub through the discovered primary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_behind_sentinel_never_exceeds_its_permits() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let set = RedisSentinels::start(1).unwrap();
    let clients = [client(&set).await, client(&set).await];
    let in_use = std::sync::Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for contender in 0..6usize {
        let pool = clients[contender % 2].semaphore("pool", 3).unwrap();
        let in_use = in_use.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..6 {
                let permit = pool.acquire(1).await.unwrap();
                let now = in_use.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(now <= 3, "{now} permits held at once");
                tokio::time::sleep(Duration::from_millis(5)).await;
                in_use.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.unwrap();
            }
        }));
    }
    crate::common::deadline::within(Duration::from_secs(60), "six contenders finish", async {
        for task in tasks {
            task.await.unwrap();
        }
    })
    .await;
    let left: Vec<Vec<u8>> = con(set.primary().unwrap())
        .keys("fencelock:{*}sem*")
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// A read-write lock behind Sentinel: readers share, a writer waits for them and gets a
/// greater token, and readers waiting behind it are woken when it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_lock_behind_sentinel_orders_readers_and_writers() {
    let set = RedisSentinels::start(1).unwrap();
    let (a, b) = (client(&set).await, client(&set).await);
    let lock = a.rwlock("catalogue").unwrap();
    let reads = [lock.read().await.unwrap(), lock.read().await.unwrap()];
    let writer = tokio::spawn({
        let lock = b.rwlock("catalogue").unwrap();
        async move { lock.write().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let late_reader = tokio::spawn({
        let lock = b.rwlock("catalogue").unwrap();
        async move { lock.read().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!writer.is_finished() && !late_reader.is_finished());
    let newest = reads.iter().map(|r| r.token()).max().unwrap();
    for read in reads {
        read.release().await.unwrap();
    }
    let write = crate::common::deadline::woken("the writer after the readers", writer)
        .await
        .unwrap();
    assert!(write.token() > newest);
    assert!(
        !late_reader.is_finished(),
        "a reader entered during the write"
    );
    write.release().await.unwrap();
    let read = crate::common::deadline::woken("the late reader after the writer", late_reader)
        .await
        .unwrap();
    read.release().await.unwrap();
}

/// While the primary is frozen (no error, no reply) calls fail within their retry window, also
/// many at once: a request that meets a primary that may have moved does not wait for the
/// Sentinels' answer, nor queue behind the lookups of the others (which, one after the other,
/// each a role check of the frozen primary, once took five seconds for a half-second window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_against_a_frozen_primary_end_within_their_retry_window() {
    const WINDOW: Duration = Duration::from_millis(500);
    const RESPONSE_TIMEOUT: Duration = Duration::from_millis(200);
    let set = RedisSentinels::start(1).expect("start sentinels");
    let client = LockClient::sentinel_builder(set.sentinel_urls(), set.master_name())
        .response_timeout(RESPONSE_TIMEOUT)
        .retry_window(WINDOW)
        .connect()
        .await
        .unwrap();
    for name in 0..16 {
        let lock = client.lock(format!("frozen:{name}")).unwrap();
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    let primary = set.primary().expect("primary").pid();
    fencelock_testing::send_signal(primary, fencelock_testing::Signal::Stop).unwrap();
    let calls = (0..16).map(|name| {
        let lock = client.lock(format!("frozen:{name}")).unwrap();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let outcome = lock.try_acquire().await;
            (outcome.is_err(), started.elapsed())
        })
    });
    let outcomes = futures_util::future::join_all(calls).await;
    fencelock_testing::send_signal(primary, fencelock_testing::Signal::Cont).unwrap();
    for outcome in outcomes {
        let (failed, took) = outcome.unwrap();
        assert!(failed, "a call succeeded against a frozen primary");
        // The bound is the window plus one response timeout and a re-send's pause; far above
        // it for a loaded machine, and far below the queued lookups' five seconds.
        assert!(took < WINDOW * 5, "{took:?}");
    }
}
