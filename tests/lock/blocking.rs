//! The blocking facade, from plain threads: the same exclusion, re-entry, tokens, leases and
//! errors as the async API.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::deadline::HANDOFF;
use crate::common::Fixture;
use fencelock::blocking::LockClient;

#[test]
fn threads_exclude_each_other_and_tokens_follow_the_grant_order() {
    let fx = Fixture::start();
    let clients: Vec<LockClient> = (0..2)
        .map(|_| LockClient::connect(&fx.server.url()).unwrap())
        .collect();
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let lock = clients[i % 2].lock("blocking").unwrap();
            let (inside, overlaps, tokens) = (inside.clone(), overlaps.clone(), tokens.clone());
            std::thread::spawn(move || {
                for _ in 0..30 {
                    // Each handoff takes milliseconds; a missing wake-up would wait out the
                    // holder's 30 s lease instead.
                    let guard = lock.acquire_timeout(HANDOFF).unwrap_or_else(|err| {
                        panic!("a release did not wake the next thread ({err}): missing wake-up?")
                    });
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokens.lock().push(guard.token());
                    std::thread::sleep(Duration::from_micros(100));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    let tokens = tokens.lock();
    assert_eq!(tokens.len(), 180);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]));
    assert!(fx.lock_key("blocking").is_none());
}

#[test]
fn reentry_leases_and_errors_work_from_threads() {
    let fx = Fixture::start();
    let client = LockClient::connect(&fx.server.url()).unwrap();
    let lock = client.lock("sync").unwrap();
    let outer = lock.acquire().unwrap();
    let inner = outer.reenter().unwrap();
    assert_eq!(inner.token(), outer.token());
    assert_eq!(
        fx.lock_state("sync").unwrap().0,
        vec![(outer.holder_id().to_owned(), 2)]
    );
    // Another thread cannot get in, and times out with the typed error.
    let other = lock.clone();
    let err = std::thread::spawn(move || other.acquire_timeout(Duration::from_millis(100)))
        .join()
        .unwrap()
        .unwrap_err();
    assert!(err.is_timeout());
    assert!(lock.try_acquire().unwrap().is_none());
    // A guard moved to another thread is released there.
    std::thread::spawn(move || inner.release().unwrap())
        .join()
        .unwrap();
    outer.release().unwrap();
    assert!(fx.lock_key("sync").is_none());

    // A fixed lease runs out; the lost guard's release is refused and touches nothing.
    let short = lock.with_lease(Duration::from_millis(50)).unwrap();
    let stale = short.acquire().unwrap();
    assert!(stale.wait_lost(Duration::from_secs(5)));
    assert!(!stale.is_valid());
    let fresh = lock.acquire().unwrap();
    assert!(fresh.token() > stale.token());
    assert!(stale.release().unwrap_err().is_not_held());
    // A dropped guard is released in the background.
    drop(fresh);
    let again = lock.acquire_timeout(Duration::from_secs(5)).unwrap();
    again.release().unwrap();
    assert!(client.lock("").is_err());
    assert!(lock.with_lease(Duration::ZERO).is_err());
}

/// Two groups of threads move money between two accounts in opposite directions, each transfer
/// under a blocking multi-lock of both accounts named in its own order. The set is taken all or
/// nothing in one global order, so nobody holds one account while waiting for the other: no
/// acquisition times out (no deadlock) and the read-modify-write updates, which would lose
/// money if two ran at once, add up to the starting total.
#[test]
fn opposite_transfers_with_the_blocking_multi_lock_never_deadlock_and_conserve_money() {
    const THREADS_PER_DIRECTION: usize = 3;
    const TRANSFERS: usize = 25;
    const START: i64 = 1_000;
    let fx = Fixture::start();
    let mut con = fx.raw();
    redis::cmd("MSET")
        .arg("balance:alice")
        .arg(START)
        .arg("balance:bob")
        .arg(START)
        .query::<()>(&mut con)
        .unwrap();
    let clients: Vec<LockClient> = (0..2)
        .map(|_| LockClient::connect(&fx.server.url()).unwrap())
        .collect();
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..2 * THREADS_PER_DIRECTION)
        .map(|i| {
            let client = clients[i % 2].clone();
            let (inside, overlaps) = (inside.clone(), overlaps.clone());
            let mut con = fx.raw();
            let (from, to) = if i % 2 == 0 {
                ("alice", "bob")
            } else {
                ("bob", "alice")
            };
            std::thread::spawn(move || {
                let set = client
                    .multi_lock([format!("account:{from}"), format!("account:{to}")])
                    .unwrap();
                for amount in 1..=TRANSFERS as i64 {
                    let guard = set.acquire_timeout(HANDOFF).unwrap_or_else(|err| {
                        panic!("a transfer was not woken by a release ({err}): deadlock or missing wake-up?")
                    });
                    assert!(guard.token(format!("account:{from}")).is_some());
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let (a, b): (i64, i64) = redis::cmd("MGET")
                        .arg(format!("balance:{from}"))
                        .arg(format!("balance:{to}"))
                        .query(&mut con)
                        .unwrap();
                    // Give another thread every chance to interleave its read-modify-write.
                    std::thread::yield_now();
                    redis::cmd("MSET")
                        .arg(format!("balance:{from}"))
                        .arg(a - amount)
                        .arg(format!("balance:{to}"))
                        .arg(b + amount)
                        .query::<()>(&mut con)
                        .unwrap();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a transfer thread failed");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    let (a, b): (i64, i64) = redis::cmd("MGET")
        .arg("balance:alice")
        .arg("balance:bob")
        .query(&mut con)
        .unwrap();
    assert_eq!(a + b, 2 * START, "money was created or destroyed");
    // Each direction moved the same amounts, so the balances are back where they started.
    assert_eq!((a, b), (START, START));
    assert!(fx.lock_key("account:alice").is_none());
    assert!(fx.lock_key("account:bob").is_none());
}

#[test]
fn the_blocking_multi_guard_gives_tokens_reentry_members_and_the_lost_signal() {
    let fx = Fixture::start();
    let client = LockClient::connect(&fx.server.url()).unwrap();
    assert!(client
        .multi_lock(["same", "same"])
        .unwrap_err()
        .is_invalid_input());
    assert!(client
        .multi_lock(Vec::<&str>::new())
        .unwrap_err()
        .is_invalid_input());
    let set = client.multi_lock(["b", "a"]).unwrap();
    assert_eq!(set.names().count(), 2);

    let guard = set.try_acquire().unwrap().expect("both free");
    assert!(guard.is_valid() && guard.replicated());
    assert_eq!(guard.tokens().count(), 2);
    assert!(guard.token("c").is_none());
    // Busy: a second set over one member gets nothing and takes nothing.
    let other = client.multi_lock(["a", "z"]).unwrap();
    assert!(other.try_acquire().unwrap().is_none());
    assert!(fx.lock_key("z").is_none());
    assert!(other
        .acquire_timeout(Duration::from_millis(100))
        .unwrap_err()
        .is_timeout());
    // Re-entry of one member, same token, its own count.
    let inner = guard.reenter("a").expect("a member").unwrap();
    assert_eq!(Some(inner.token()), guard.token("a"));
    assert_eq!(fx.lock_state("a").unwrap().0[0].1, 2);
    assert!(guard.reenter("c").is_none());
    inner.release().unwrap();
    // Members one by one.
    for member in guard.into_guards() {
        member.release().unwrap();
    }
    assert!(fx.lock_key("a").is_none() && fx.lock_key("b").is_none());

    // A fixed lease runs out: the lost signal as a blocking wait and as a check.
    let short = set.with_lease(Duration::from_millis(50)).unwrap();
    assert_eq!(short.lease(), Duration::from_millis(50));
    let stale = short.acquire().unwrap();
    assert!(stale.wait_lost(Duration::from_secs(5)));
    assert!(!stale.is_valid());
    let fresh = set.acquire().unwrap();
    assert!(fresh.token("a") > stale.token("a"));
    assert!(stale.release().unwrap_err().is_not_held());
    fresh.release().unwrap();
    assert!(set.with_lease(Duration::ZERO).is_err());
}

/// A primary with one replica that completed its first sync.
fn primary_with_replica() -> (Fixture, fencelock_testing::RedisServer) {
    // Without this the primary waits 5 s before the replica's first full sync.
    let builder =
        || fencelock_testing::RedisServer::builder().config("repl-diskless-sync-delay", "0");
    let primary = Fixture {
        server: builder().start().expect("start the primary"),
    };
    let replica = builder()
        .replica_of(primary.server.addr())
        .start()
        .expect("start the replica");
    let offset = primary.server.replication_offset().unwrap();
    replica
        .wait_for_replication(offset, Duration::from_secs(30))
        .expect("replica in sync");
    (primary, replica)
}

#[test]
fn blocking_replica_acknowledgement_succeeds_and_a_paused_replica_fails_it_leaving_the_lock_free() {
    // Long enough for a healthy replica on a loaded machine; the shortfall cases pause the
    // replica, so they never depend on it being short.
    const HEALTHY: Duration = Duration::from_secs(10);
    let (fx, mut replica) = primary_with_replica();
    let client = LockClient::connect(&fx.server.url()).unwrap();
    let lock = client.lock("acked").unwrap();
    assert_eq!(lock.replica_ack(), None);
    let acked = lock.with_replica_ack(1, HEALTHY).unwrap();
    assert_eq!(acked.replica_ack(), Some((1, HEALTHY)));
    assert!(lock
        .with_replica_ack(0, HEALTHY)
        .unwrap_err()
        .is_invalid_input());

    let guard = acked.acquire().unwrap();
    assert!(guard.replicated());
    assert_eq!(guard.replica_acks(), Some(1));
    guard.release().unwrap();
    let set = client
        .multi_lock(["acked:a", "acked:b"])
        .unwrap()
        .with_replica_ack(1, HEALTHY)
        .unwrap();
    let both = set.acquire().unwrap();
    assert!(both.replicated());
    both.release().unwrap();

    // The replica frozen: the acquisition is rolled back and the lock is free at once.
    replica.pause().unwrap();
    let short = lock
        .with_replica_ack(1, Duration::from_millis(200))
        .unwrap();
    let err = short.acquire().unwrap_err();
    assert!(
        matches!(
            err,
            fencelock::Error::ReplicationTimeout {
                acked: 0,
                required: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(fx.lock_state("acked").is_none());
    let free = lock.without_replica_ack().try_acquire().unwrap();
    free.expect("free right after the rollback")
        .release()
        .unwrap();
    // The same for a whole set: every member rolled back.
    let err = set
        .with_replica_ack(1, Duration::from_millis(200))
        .unwrap()
        .try_acquire()
        .unwrap_err();
    assert!(err.is_replication_timeout(), "{err:?}");
    assert!(fx.lock_key("acked:a").is_none() && fx.lock_key("acked:b").is_none());
    // By choice the guard comes back, marked unreplicated.
    let unreplicated = short
        .on_replica_shortfall(fencelock::OnShortfall::ReturnUnreplicated)
        .acquire()
        .unwrap();
    assert!(!unreplicated.replicated());
    assert_eq!(unreplicated.replica_acks(), Some(0));
    unreplicated.release().unwrap();
    let unreplicated_set = set
        .with_replica_ack(1, Duration::from_millis(200))
        .unwrap()
        .on_replica_shortfall(fencelock::OnShortfall::ReturnUnreplicated)
        .acquire()
        .unwrap();
    assert!(!unreplicated_set.replicated());
    unreplicated_set.release().unwrap();
    replica.resume().unwrap();
}

#[test]
fn an_election_from_threads_hands_over_and_a_follower_sees_each_leader() {
    let fx = Fixture::start();
    let (a, b) = (
        LockClient::connect(&fx.server.url()).unwrap(),
        LockClient::connect(&fx.server.url()).unwrap(),
    );
    let mut observer = a.election("sync-election").unwrap().observe().unwrap();
    assert_eq!(observer.current(), None);
    let leader = a
        .election("sync-election")
        .unwrap()
        .campaign(b"thread a")
        .unwrap();
    let seen = observer.changed_timeout(HANDOFF).unwrap().expect("a leads");
    assert_eq!((seen.id(), seen.term()), (leader.id(), leader.term()));
    assert_eq!(seen.metadata(), b"thread a");

    let candidate = b.election("sync-election").unwrap();
    assert!(candidate.try_campaign(b"thread b").unwrap().is_none());
    let waiting = std::thread::spawn(move || candidate.campaign_timeout(b"thread b", HANDOFF));
    // The candidate waits on the channel; the resignation hands over within the handoff
    // deadline (the leader's lease is 30 s).
    std::thread::sleep(Duration::from_millis(100));
    let first_term = leader.term();
    leader.resign().unwrap();
    let next = crate::common::deadline::join_within(HANDOFF, "the waiting candidate", waiting)
        .unwrap_or_else(|err| {
            panic!("the resignation did not hand over to the waiting candidate ({err}): missing wake-up?")
        });
    assert!(next.term() > first_term);
    let seen = loop {
        // The vacancy between the two may or may not be seen.
        match observer.changed_timeout(HANDOFF).unwrap() {
            Some(seen) => break seen,
            None => continue,
        }
    };
    assert_eq!(seen.term(), next.term());
    assert_eq!(
        b.election("sync-election").unwrap().leader().unwrap(),
        Some(seen)
    );
    next.resign().unwrap();
    assert_eq!(observer.changed_timeout(HANDOFF).unwrap(), None);
    let quiet = observer.changed_timeout(Duration::from_millis(200));
    assert!(quiet.unwrap_err().is_timeout(), "nothing changed");
}

#[test]
fn a_job_from_threads_runs_each_tick_once_on_the_calling_thread() {
    use std::time::UNIX_EPOCH;
    let fx = Fixture::start();
    let period = Duration::from_secs(60);
    let options = fencelock::JobOptions::new(period, Duration::from_secs(5));
    let runs = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let barrier = Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4u32)
        .map(|i| {
            let client = LockClient::connect(&fx.server.url()).unwrap();
            let job = client.job("blocking-job", options.clone()).unwrap();
            let (runs, barrier) = (runs.clone(), barrier.clone());
            std::thread::spawn(move || {
                let caller = std::thread::current().id();
                for tick in 0..5u32 {
                    barrier.wait();
                    // Clocks up to 3 s apart, far inside half a period.
                    let view = UNIX_EPOCH
                        + period * (30_000_000 + tick)
                        + Duration::from_secs(u64::from(i));
                    let outcome = job
                        .run_exclusive(view, |run| {
                            assert_eq!(std::thread::current().id(), caller);
                            std::thread::sleep(Duration::from_millis(20));
                            run.token()
                        })
                        .unwrap();
                    if let Some(token) = outcome.into_output() {
                        runs.lock().push((tick, token));
                    }
                }
                // Before the epoch: a typed error, nothing sent.
                let early = UNIX_EPOCH - Duration::from_secs(1);
                assert!(job
                    .run_exclusive(early, |_| ())
                    .unwrap_err()
                    .is_invalid_input());
            })
        })
        .collect();
    for thread in threads {
        crate::common::deadline::join_within(Duration::from_secs(60), "an instance thread", thread);
    }
    let runs = runs.lock();
    let ticks: Vec<u32> = {
        let mut ticks: Vec<u32> = runs.iter().map(|run| run.0).collect();
        ticks.sort_unstable();
        ticks
    };
    assert_eq!(ticks, [0, 1, 2, 3, 4], "each tick once: {runs:?}");
    let client = LockClient::connect(&fx.server.url()).unwrap();
    let last = client
        .job("blocking-job", options)
        .unwrap()
        .last_tick()
        .unwrap();
    let last = last.expect("the last tick's record");
    assert!(last.finished().is_some(), "{last:?}");
    assert_eq!(Some(last.token()), runs.iter().map(|run| run.1).max());
}

/// Threads share a semaphore's permits: never more holders than permits, a blocked thread is
/// let in by a release, and bad input is refused.
#[test]
fn threads_share_a_semaphores_permits() {
    let fx = Fixture::start();
    let client = LockClient::connect(&fx.server.url()).unwrap();
    assert!(client.semaphore("pool", 0).unwrap_err().is_invalid_input());
    let pool = client.semaphore("pool", 2).unwrap();
    assert_eq!((pool.name(), pool.limit()), (&b"pool"[..], 2));
    let in_use = Arc::new(AtomicU32::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (pool, in_use) = (pool.clone(), in_use.clone());
            std::thread::spawn(move || {
                for _ in 0..5 {
                    let permit = pool.acquire(1).unwrap();
                    assert!(permit.is_valid() && permit.permits() == 1 && permit.limit() == 2);
                    let now = in_use.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= 2, "{now} holders of 2 permits");
                    std::thread::sleep(Duration::from_millis(3));
                    in_use.fetch_sub(1, Ordering::SeqCst);
                    permit.release().unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let both = pool.acquire(2).unwrap();
    assert!(pool.try_acquire(1).unwrap().is_none());
    let err = pool
        .acquire_timeout(1, Duration::from_millis(100))
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(pool.try_acquire(3).unwrap_err().is_invalid_input());
    let short = pool.with_lease(Duration::from_millis(300)).unwrap();
    both.release().unwrap();
    let held = short.acquire(2).unwrap();
    assert!(held.valid_until() > std::time::Instant::now());
    let token = held.token();
    // Not released: the fixed lease gives the permits back.
    std::mem::forget(held);
    let next = pool.acquire_timeout(2, Duration::from_secs(5)).unwrap();
    assert!(next.token() > token);
    next.release().unwrap();
}

/// Threads share a read-write lock: readers together, a writer alone, a downgrade with no
/// writer between, a timeout.
#[test]
fn threads_read_together_and_write_alone() {
    let fx = Fixture::start();
    let client = LockClient::connect(&fx.server.url()).unwrap();
    let lock = client.rwlock("catalogue").unwrap();
    assert_eq!(lock.name(), b"catalogue");
    let reads = [lock.read().unwrap(), lock.read().unwrap()];
    assert!(reads.iter().all(|r| r.is_valid()));
    assert!(lock.try_write().unwrap().is_none());
    let err = lock.write_timeout(Duration::from_millis(100)).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    let writer = {
        let lock = lock.clone();
        std::thread::spawn(move || lock.write().unwrap())
    };
    std::thread::sleep(Duration::from_millis(100));
    let newest = reads.iter().map(|r| r.token()).max().unwrap();
    for read in reads {
        read.release().unwrap();
    }
    let write = writer.join().unwrap();
    assert!(write.is_valid() && write.token() > newest);
    assert!(lock.try_read().unwrap().is_none());
    let nested = write.reenter().unwrap();
    assert_eq!(nested.token(), write.token());
    nested.release().unwrap();
    assert!(
        lock.try_read().unwrap().is_none(),
        "one write entry remains"
    );
    let read = write.downgrade().unwrap();
    let nested_read = read.reenter().unwrap();
    nested_read.release().unwrap();
    let other = lock.read_timeout(HANDOFF).unwrap();
    assert!(lock.try_write().unwrap().is_none());
    read.release().unwrap();
    other.release().unwrap();
    let short = lock.with_lease(Duration::from_secs(5)).unwrap();
    short.try_write().unwrap().unwrap().release().unwrap();
}

/// The blocking fenced resource: writes with the newest token land, an older token is refused
/// with the newer one named, and readers of a read-write lock read it together.
#[test]
fn the_blocking_fenced_resource_refuses_older_tokens_and_lets_readers_share() {
    let fx = Fixture::start();
    let client = LockClient::connect(&fx.server.url()).unwrap();
    let lock = client.rwlock("catalog").unwrap();
    let prices = client.resource("catalog:prices").unwrap();
    let old = lock.write().unwrap();
    let old_token = old.token();
    prices.set(old_token, "v1").unwrap();
    old.release().unwrap();
    let first = lock.read().unwrap();
    let second = lock.read().unwrap();
    for reader in [&second, &first] {
        assert_eq!(
            prices.get_shared(reader.token()).unwrap().as_deref(),
            Some(&b"v1"[..])
        );
    }
    let refused = prices.set(old_token, "late").unwrap_err();
    assert!(
        matches!(refused, fencelock::Error::StaleToken { latest, by: fencelock::Superseded::SharedRead, .. } if latest == second.token()),
        "{refused:?}"
    );
    assert_eq!(prices.peek().unwrap().as_deref(), Some(&b"v1"[..]));
    assert_eq!(prices.high_water_mark().unwrap(), Some(second.token()));
    first.release().unwrap();
    second.release().unwrap();
}
