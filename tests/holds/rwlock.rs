//! The read-write lock against real servers: sixteen readers at once while a writer waits,
//! writer preference against a stream of readers, a downgrade, a reader killed with SIGKILL
//! and a writer frozen with SIGSTOP (as processes), cancellation at random points, and bad
//! input. The topology tests run on one server and on a 3-primary cluster.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::cancel::CancelPoints;
use crate::common::child::ChildProcess;
use crate::common::deadline::{within, woken, HANDOFF};
use crate::common::{eventually, Env, Fixture};
use fencelock::{LockClient, ReadGuard, MAX_NAME_LEN};
use fencelock_testing::{send_signal, Signal};
use redis::Commands;

/// Every key of the read-write lock `name` (hash, leases, waiting writers).
fn rw_keys(fx: &Env, name: &str) -> Vec<Vec<u8>> {
    ["rw", "rw-leases", "rw-writers"]
        .iter()
        .flat_map(|kind| fx.keys(&format!("fencelock:{{*}}{kind}:{name}")))
        .collect()
}

/// A hold of either kind.
enum Held {
    Read(ReadGuard),
    Write(fencelock::WriteGuard),
}

on_topologies_multi_thread! {
    /// Sixteen readers on four clients hold at once; a writer that arrives waits, and then
    /// gets a token greater than every reader's and every earlier writer's.
    async fn sixteen_readers_hold_at_once_and_the_waiting_writer_gets_a_greater_token(fx) {
        let clients = [fx.client().await, fx.client().await, fx.client().await, fx.client().await];
        let first_writer = clients[0].rwlock("catalogue").unwrap().write().await.unwrap();
        let first_token = first_writer.token();
        first_writer.release().await.unwrap();
        let mut readers: Vec<ReadGuard> = Vec::new();
        for i in 0..16 {
            let lock = clients[i % 4].rwlock("catalogue").unwrap();
            readers.push(within(HANDOFF, "a reader enters beside the others", lock.read()).await.unwrap());
        }
        assert!(readers.iter().all(|r| r.is_valid() && r.token() > first_token));
        let writer = tokio::spawn({
            let lock = clients[1].rwlock("catalogue").unwrap();
            async move { lock.write().await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!writer.is_finished(), "the writer got in beside sixteen readers");
        let newest_read = readers.iter().map(ReadGuard::token).max().unwrap();
        for reader in readers {
            reader.release().await.unwrap();
        }
        let writer = woken("the writer, after the last reader left", writer).await.unwrap();
        assert!(writer.token() > newest_read && writer.token() > first_token);
        writer.release().await.unwrap();
        assert!(rw_keys(&fx, "catalogue").is_empty(), "{:?}", rw_keys(&fx, "catalogue"));
    }

    /// Readers that keep coming (each enters as soon as it left, always overlapping another)
    /// do not starve a writer: once it waits, no new reader enters, and it gets the lock when
    /// the readers inside left, within a handoff of the longest read.
    async fn a_stream_of_readers_does_not_starve_a_waiting_writer(fx) {
        let clients = [fx.client().await, fx.client().await];
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU32::new(0));
        let mut streams = Vec::new();
        for i in 0..6usize {
            let lock = clients[i % 2].rwlock("feed").unwrap();
            let (stop, reads) = (stop.clone(), reads.clone());
            streams.push(tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let read = lock.read().await.unwrap();
                    reads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    read.release().await.unwrap();
                }
            }));
        }
        // The stream is running: readers overlap all the time.
        assert!(eventually(HANDOFF, || reads.load(Ordering::SeqCst) > 20).await);
        let writer = clients[0].rwlock("feed").unwrap();
        let started = Instant::now();
        let write = within(HANDOFF, "the writer gets in through a stream of readers", writer.write())
            .await
            .unwrap();
        let waited = started.elapsed();
        let during = reads.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(reads.load(Ordering::SeqCst), during, "a reader entered during the write");
        write.release().await.unwrap();
        stop.store(true, Ordering::SeqCst);
        within(HANDOFF, "the readers stop", async {
            for stream in streams {
                stream.await.unwrap();
            }
        })
        .await;
        eprintln!("the writer waited {waited:?} for readers holding 30 ms each");
    }

    /// A writer downgrades: readers waiting enter at once, and a writer waiting stays out until
    /// the downgraded reader leaves.
    async fn a_downgrade_admits_readers_and_no_writer(fx) {
        let (a, b) = (fx.client().await, fx.client().await);
        let write = a.rwlock("downgrade").unwrap().write().await.unwrap();
        let token = write.token();
        let reader = tokio::spawn({
            let lock = b.rwlock("downgrade").unwrap();
            async move { lock.read().await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!reader.is_finished());
        let read = write.downgrade().await.unwrap();
        assert_eq!(read.token(), token);
        let other = woken("a waiting reader, after the downgrade", reader).await.unwrap();
        assert!(b.rwlock("downgrade").unwrap().try_write().await.unwrap().is_none());
        read.release().await.unwrap();
        other.release().await.unwrap();
        let next = within(HANDOFF, "a writer after both readers", b.rwlock("downgrade").unwrap().write())
            .await
            .unwrap();
        assert!(next.token() > token);
        next.release().await.unwrap();
    }

    /// A write hold entered twice is not downgraded while the other guard is alive: that
    /// guard still writes, so readers must stay out. The refused guard is released, and the
    /// other keeps the write hold until it leaves.
    async fn a_downgrade_is_refused_while_another_guard_writes(fx) {
        let (a, b) = (fx.client().await, fx.client().await);
        let write = a.rwlock("downgrade-nested").unwrap().write().await.unwrap();
        let nested = write.reenter().await.unwrap();
        let err = write.downgrade().await.unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
        let reader = b.rwlock("downgrade-nested").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(reader.try_read().await.unwrap().is_none(), "a reader entered beside a writer");
        let read = nested.downgrade().await.unwrap();
        let other = within(HANDOFF, "a reader after the downgrade", reader.read()).await.unwrap();
        read.release().await.unwrap();
        other.release().await.unwrap();
    }

    /// Acquisitions of both kinds dropped at random points, with another holder of either
    /// kind letting go meanwhile: no share, write hold or waiting mark is left behind.
    async fn cancelled_acquisitions_never_leave_a_share_behind(fx) {
        let (a, b) = (fx.client().await, fx.client().await);
        let seed = 0x5e3a_0002;
        let mut points = CancelPoints::new(seed).with_sleeps_up_to(Duration::from_micros(1500));
        let cases = crate::common::env_cases("FENCELOCK_CANCEL_CASES", 500);
        for case in 0..cases {
            let lock = a.rwlock("cancel").unwrap();
            let other = b.rwlock("cancel").unwrap();
            let releaser = match points.rng().below(3) {
                0 => None,
                1 => Some(tokio::spawn({
                    let read = other.read().await.unwrap();
                    let delay = points.rng().below(2_000);
                    async move {
                        tokio::time::sleep(Duration::from_micros(delay)).await;
                        read.release().await.unwrap();
                    }
                })),
                _ => Some(tokio::spawn({
                    let write = other.write().await.unwrap();
                    let delay = points.rng().below(2_000);
                    async move {
                        tokio::time::sleep(Duration::from_micros(delay)).await;
                        write.release().await.unwrap();
                    }
                })),
            };
            let kind = points.rng().below(4);
            let acquire = async {
                match kind {
                    0 => Some(Held::Read(lock.read().await.unwrap())),
                    1 => lock.try_read().await.unwrap().map(Held::Read),
                    2 => Some(Held::Write(lock.write().await.unwrap())),
                    _ => lock.try_write().await.unwrap().map(Held::Write),
                }
            };
            if let Some(held) = points.run(acquire).await.flatten() {
                match held {
                    Held::Read(read) => read.release().await.unwrap(),
                    Held::Write(write) => write.release().await.unwrap(),
                }
            }
            if let Some(releaser) = releaser {
                releaser.await.unwrap();
            }
            assert!(
                eventually(HANDOFF, || rw_keys(&fx, "cancel").is_empty()).await,
                "case {case} (seed {seed:#x}): left behind: {:?}",
                rw_keys(&fx, "cancel")
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
        assert!(cancelled > 0, "no cancel ever ran against an in-flight request");
    }
}

on_topologies! {
    /// Readers of one hold read a fenced resource with their own tokens in any order and are
    /// never refused by each other; a writer older than the readers (one that paused past its
    /// lease) is refused under them; once a newer writer wrote, an old reader's token is
    /// refused, naming the writer's.
    async fn readers_share_fenced_reads_and_fence_older_writers(fx) {
        let client = fx.client().await;
        let lock = client.rwlock("prices").unwrap();
        let data = client.resource("prices-data").unwrap();
        let first = lock.write().await.unwrap();
        let paused_writer = first.token();
        data.set(paused_writer, "v1").await.unwrap();
        first.release().await.unwrap();

        let older = lock.read().await.unwrap();
        let newer = lock.read().await.unwrap();
        assert!(older.token() < newer.token());
        for reader in [&newer, &older, &newer, &older] {
            let value = data.get_shared(reader.token()).await.unwrap();
            assert_eq!(value.as_deref(), Some(&b"v1"[..]));
        }
        let late = data.set(paused_writer, "late").await.unwrap_err();
        assert!(
            matches!(late, fencelock::Error::StaleToken { latest, by: fencelock::Superseded::SharedRead, .. } if latest == newer.token()),
            "{late:?}"
        );
        assert!(late.to_string().contains("a newer reader read"), "{late}");
        assert_eq!(data.high_water_mark().await.unwrap(), Some(newer.token()));
        let (older_token, newer_token) = (older.token(), newer.token());
        older.release().await.unwrap();
        newer.release().await.unwrap();

        let writer = lock.write().await.unwrap();
        data.set(writer.token(), "v2").await.unwrap();
        for reader in [older_token, newer_token] {
            let refused = data.get_shared(reader).await.unwrap_err();
            assert!(
                matches!(refused, fencelock::Error::StaleToken { latest, by: fencelock::Superseded::WroteOrClaimed, .. } if latest == writer.token()),
                "{refused:?}"
            );
        }
        writer.release().await.unwrap();
        let reader = lock.read().await.unwrap();
        assert_eq!(data.get_shared(reader.token()).await.unwrap().as_deref(), Some(&b"v2"[..]));
        reader.release().await.unwrap();
    }
}

/// `read_timeout` and `write_timeout` wait for the lock up to their deadline and return the
/// guard when it comes within it.
#[tokio::test]
async fn timeouts_wait_for_a_release_within_them() {
    let fx = Fixture::start();
    let (a, b) = (fx.client().await, fx.client().await);
    let read = a.rwlock("bounded").unwrap().read().await.unwrap();
    let writer = tokio::spawn({
        let lock = b.rwlock("bounded").unwrap();
        async move { lock.write_timeout(HANDOFF).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    read.release().await.unwrap();
    let write = writer
        .await
        .unwrap()
        .expect("the writer within its timeout");
    let reader = tokio::spawn({
        let lock = a.rwlock("bounded").unwrap();
        async move { lock.read_timeout(HANDOFF).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    write.release().await.unwrap();
    reader
        .await
        .unwrap()
        .expect("the reader within its timeout")
        .release()
        .await
        .unwrap();
}

/// A writer that gives up waiting (timeout) takes its mark back: readers enter at once.
#[tokio::test]
async fn a_writer_that_times_out_lets_readers_in_at_once() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let lock = client.rwlock("patient").unwrap();
    let inside = lock.read().await.unwrap();
    let err = lock
        .write_timeout(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    let next = within(HANDOFF, "a reader after the writer gave up", lock.read())
        .await
        .unwrap();
    inside.release().await.unwrap();
    next.release().await.unwrap();
    assert!(fx.keys("fencelock:{*}rw*").is_empty());
}

/// Bad input is refused before anything is sent; foreign data is a typed error that leaves
/// the data as it was.
#[tokio::test]
async fn bad_input_is_refused_and_leaves_nothing_behind() {
    let fx = Fixture::start();
    let client = fx.client().await;
    assert!(client.rwlock("").unwrap_err().is_invalid_input());
    assert!(client
        .rwlock(vec![b'x'; MAX_NAME_LEN + 1])
        .unwrap_err()
        .is_invalid_input());
    let lock = client.rwlock("bad").unwrap();
    assert!(lock
        .with_lease(Duration::ZERO)
        .unwrap_err()
        .is_invalid_input());
    assert!(fx.keys("*").is_empty());
    let key = {
        let read = lock.read().await.unwrap();
        let key = fx.keys("fencelock:{*}rw:bad").pop().unwrap();
        read.release().await.unwrap();
        key
    };
    let _: () = fx.raw().set(&key, "foreign").unwrap();
    assert!(lock.try_read().await.unwrap_err().is_wrong_type());
    assert!(lock.try_write().await.unwrap_err().is_wrong_type());
    let value: String = fx.raw().get(&key).unwrap();
    assert_eq!(value, "foreign");
}

const CHILD_ENV: &str = "FENCELOCK_RWLOCK_CHILD";
const CHILD_REPORT: &str = "rwlock-child-report";
/// The child's lease: its watchdog renews it while the child runs.
const CHILD_LEASE: Duration = Duration::from_millis(1000);

/// A holder process, a no-op unless the parent started this binary as a child. `read URL`:
/// holds a read of `shared` until killed. `write URL`: holds the write of `shared` and writes
/// its token to the fenced resource `shared-data` every 50 ms, reporting each outcome.
#[tokio::test]
async fn rwlock_child_holds() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (role, url) = spec.split_once(' ').unwrap();
    let client = LockClient::builder(url)
        .default_lease(CHILD_LEASE)
        .connect()
        .await
        .unwrap();
    let lock = client.rwlock("shared").unwrap();
    let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
    if role == "read" {
        let read = lock.read().await.unwrap();
        let _: () = raw
            .rpush(CHILD_REPORT, format!("holds {}", read.holder_id()))
            .unwrap();
        tokio::time::sleep(Duration::from_secs(120)).await;
        drop(read);
        return;
    }
    let write = lock.write().await.unwrap();
    let data = client.resource("shared-data").unwrap();
    let _: () = raw
        .rpush(CHILD_REPORT, format!("holds {}", write.token()))
        .unwrap();
    for _ in 0..2400 {
        let outcome = match data
            .set(write.token(), format!("child {}", write.token()))
            .await
        {
            Ok(()) => "written".to_owned(),
            Err(err) if err.is_stale_token() => "refused".to_owned(),
            Err(err) => format!("error {err}"),
        };
        let _: () = raw.rpush(CHILD_REPORT, outcome).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for the child's first report line ("holds ...").
async fn child_holds(fx: &Fixture) -> String {
    within(Duration::from_secs(30), "the child takes its hold", async {
        loop {
            let report: Vec<String> = fx.raw().lrange(CHILD_REPORT, 0, 0).unwrap();
            if let Some(first) = report.first() {
                return first.clone();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// A reader killed with SIGKILL frees its share within its lease (after the child's watchdog
/// renewed it past the first lease), and the writer waiting for it gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_killed_with_sigkill_frees_its_share_within_its_lease() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let child = ChildProcess::start(
        module_path!(),
        "rwlock_child_holds",
        CHILD_ENV,
        &format!("read {}", fx.server.url()),
    );
    let holds = child_holds(&fx).await;
    tokio::time::sleep(CHILD_LEASE * 2).await;
    let lock = client.rwlock("shared").unwrap();
    assert!(
        lock.try_write().await.unwrap().is_none(),
        "the child's read ended at its first lease: its watchdog did not renew it"
    );
    let writer = tokio::spawn({
        let lock = lock.clone();
        async move { lock.write().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    send_signal(child.pid(), Signal::Kill).unwrap();
    let killed_at = Instant::now();
    let write = within(
        CHILD_LEASE + HANDOFF,
        "the writer gets the killed reader's lock",
        writer,
    )
    .await
    .unwrap();
    eprintln!(
        "the killed reader's share was freed {:?} after SIGKILL (lease {CHILD_LEASE:?}); it {holds}",
        killed_at.elapsed()
    );
    drop(child);
    write.release().await.unwrap();
    assert!(fx.keys("fencelock:{*}rw*").is_empty());
}

/// A writer frozen with SIGSTOP past its lease: another writer takes the lock with a greater
/// token and writes; after SIGCONT the frozen writer's next write is refused by the fenced
/// storage, and it never writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_frozen_with_sigstop_past_its_lease_is_fenced_off_after_sigcont() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let child = ChildProcess::start(
        module_path!(),
        "rwlock_child_holds",
        CHILD_ENV,
        &format!("write {}", fx.server.url()),
    );
    let holds = child_holds(&fx).await;
    let frozen_token: u64 = holds.trim_start_matches("holds ").parse().unwrap();
    // Let it write a few times, then freeze it.
    assert!(
        eventually(HANDOFF, || fx.raw().llen::<_, usize>(CHILD_REPORT).unwrap()
            > 3)
        .await,
        "the child writes"
    );
    send_signal(child.pid(), Signal::Stop).unwrap();
    let lock = client.rwlock("shared").unwrap();
    let write = within(
        CHILD_LEASE + HANDOFF,
        "a writer after the frozen writer's lease",
        lock.write(),
    )
    .await
    .unwrap();
    assert!(write.token().get() > frozen_token);
    client
        .resource("shared-data")
        .unwrap()
        .set(write.token(), "parent")
        .await
        .unwrap();
    let seen = fx.raw().llen::<_, usize>(CHILD_REPORT).unwrap();
    send_signal(child.pid(), Signal::Cont).unwrap();
    let after: Vec<String> = within(HANDOFF, "the thawed writer tries to write", async {
        loop {
            let report: Vec<String> = fx.raw().lrange(CHILD_REPORT, seen as isize, -1).unwrap();
            if report.len() >= 3 {
                return report;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        after.iter().all(|r| r == "refused"),
        "after SIGCONT: {after:?}"
    );
    let value = client
        .resource("shared-data")
        .unwrap()
        .peek()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(value, b"parent");
    drop(child);
    write.release().await.unwrap();
}

/// Re-entries of a read and of a write dropped at random points, each case ending with every
/// guard released: no entry is ever left behind (the lock is free after each case).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_reentries_never_leave_an_entry_behind() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let lock = client.rwlock("nested").unwrap();
    let mut points = CancelPoints::new(0x5e3a_0003);
    let cases = crate::common::env_cases("FENCELOCK_CANCEL_CASES", 500) / 2;
    for case in 0..cases {
        if points.rng().below(2) == 0 {
            let outer = lock.read().await.unwrap();
            if let Some(inner) = points.run(outer.reenter()).await {
                inner.unwrap().release().await.unwrap();
            }
            outer.release().await.unwrap();
        } else {
            let outer = lock.write().await.unwrap();
            let inner = points.run(outer.reenter()).await.map(Result::unwrap);
            assert!(inner.as_ref().is_none_or(|i| i.token() == outer.token()));
            if let Some(inner) = inner {
                inner.release().await.unwrap();
            }
            outer.release().await.unwrap();
        }
        assert!(
            eventually(HANDOFF, || fx.keys("fencelock:{*}rw*").is_empty()).await,
            "case {case}: an entry was left behind"
        );
    }
    points.assert_both_outcomes();
}

/// Handles and guards describe themselves.
#[tokio::test]
async fn handles_and_guards_describe_themselves() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let lock = client.rwlock("described").unwrap();
    assert_eq!(lock.name(), b"described");
    let shown = format!("{lock:?}");
    assert!(
        shown.contains("described") && shown.contains("lease"),
        "{shown}"
    );
    let write = lock.write().await.unwrap();
    let shown = format!("{write:?}");
    assert!(shown.starts_with("WriteGuard"), "{shown}");
    for part in [
        "described",
        write.holder_id(),
        &write.token().get().to_string(),
    ] {
        assert!(shown.contains(part), "{part} not in {shown}");
    }
    assert_eq!(write.lock_name(), b"described");
    assert!(write.is_valid() && write.valid_until() > Instant::now());
    let read = write.downgrade().await.unwrap();
    let shown = format!("{read:?}");
    assert!(
        shown.starts_with("ReadGuard") && shown.contains(read.holder_id()),
        "{shown}"
    );
    assert_eq!(read.lock_name(), b"described");
    assert!(read.is_valid() && read.valid_until() > Instant::now());
    read.release().await.unwrap();
}

/// An uncontended read or write is one script call each way and never subscribes; waiting
/// readers of one client all get in when the writer they wait behind leaves (each winner hands
/// the wake-up on); a hold whose lease ran out says so.
#[tokio::test]
async fn uncontended_holds_do_not_subscribe_and_waiting_readers_enter_together() {
    let fx = Fixture::start();
    let (a, b) = (fx.client().await, fx.client().await);
    let lock = a.rwlock("together").unwrap();
    lock.read().await.unwrap().release().await.unwrap();
    let subscribes = fx.calls("subscribe");
    let evalsha = fx.calls("evalsha");
    lock.read().await.unwrap().release().await.unwrap();
    lock.write().await.unwrap().release().await.unwrap();
    assert_eq!(
        fx.calls("subscribe"),
        subscribes,
        "an uncontended hold subscribed"
    );
    assert_eq!(fx.calls("evalsha"), evalsha + 4, "two round trips per hold");

    let write = b.rwlock("together").unwrap().write().await.unwrap();
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let lock = lock.clone();
            tokio::spawn(async move { lock.read().await.unwrap() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    write.release().await.unwrap();
    // All three hold at once before any leaves: a reader's release would wake the next.
    let mut reads = Vec::new();
    for reader in readers {
        reads.push(
            woken("every waiting reader, on the writer's one release", reader)
                .await
                .unwrap(),
        );
    }
    for read in reads {
        read.release().await.unwrap();
    }

    let short = lock.with_lease(Duration::from_millis(300)).unwrap();
    let read = short.read().await.unwrap();
    let live = tokio::time::timeout(Duration::from_millis(50), read.lost()).await;
    assert!(live.is_err(), "lost() resolved for a live read");
    within(HANDOFF, "the read's lost signal", read.lost()).await;
    assert!(!read.is_valid(), "a read whose lease ran out");
    // (The client counts the lease as over a margin before the server does.)
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(read.release().await.unwrap_err().is_not_held());
    let write = short.write().await.unwrap();
    let live = tokio::time::timeout(Duration::from_millis(50), write.lost()).await;
    assert!(live.is_err(), "lost() resolved for a live write");
    within(HANDOFF, "the write's lost signal", write.lost()).await;
    assert!(!write.is_valid(), "a write whose lease ran out");
}
