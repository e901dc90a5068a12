//! Replica acknowledgement (`WAIT`) on a real primary with real replicas: a shortfall rolls the
//! acquisition back and is a typed error (or, by choice, an unreplicated guard); an
//! acknowledged acquisition survives a failover with its holder and token; and a `WAIT` never
//! stalls the client's shared connection.

use std::time::Duration;

use crate::common::{eventually, Fixture};
use fencelock::{Error, LockClient, OnShortfall};
use fencelock_testing::{RedisServer, RedisServerBuilder};
use redis::Commands;

/// Long enough for a healthy replica on a loaded machine; the tests that must see a shortfall
/// pause the replicas, so they never depend on this being short.
const HEALTHY_ACK: Duration = Duration::from_secs(10);

fn node() -> RedisServerBuilder {
    // Without this the primary waits 5 s before every full sync of a new replica.
    RedisServer::builder().config("repl-diskless-sync-delay", "0")
}

/// A primary and `n` replicas that have completed their first sync.
fn topology(n: usize) -> (Fixture, Vec<Fixture>) {
    let primary = Fixture {
        server: node().start().expect("start the primary"),
    };
    let replicas: Vec<Fixture> = (0..n)
        .map(|_| Fixture {
            server: node()
                .replica_of(primary.server.addr())
                .start()
                .expect("start a replica"),
        })
        .collect();
    let offset = primary.server.replication_offset().unwrap();
    for replica in &replicas {
        replica
            .server
            .wait_for_replication(offset, Duration::from_secs(30))
            .expect("replica in sync");
    }
    (primary, replicas)
}

/// `CLIENT LIST` lines of the clients blocked in `WAIT` right now.
fn blocked_in_wait(fx: &Fixture) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut fx.raw())
        .expect("CLIENT LIST");
    list.lines()
        .filter(|line| line.contains(" cmd=wait ") && line.contains(" flags=b "))
        .count()
}

/// Closes, from the server side, the connection whose last command was `WAIT` (blocked in it,
/// or idle in the pool after it).
fn kill_wait_connection(fx: &Fixture) {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut fx.raw())
        .expect("CLIENT LIST");
    let id = list
        .lines()
        .find(|line| line.contains(" cmd=wait "))
        .and_then(|line| line.strip_prefix("id="))
        .and_then(|rest| rest.split(' ').next())
        .expect("a connection whose last command was WAIT")
        .to_owned();
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(&id)
        .query(&mut fx.raw())
        .expect("CLIENT KILL");
}

/// Every key fencelock left under its prefix, with the op records' values.
fn residue(fx: &Fixture) -> (Vec<String>, Vec<String>) {
    let mut con = fx.raw();
    let mut kinds = Vec::new();
    let mut ops = Vec::new();
    for key in fx.keys("fencelock:*") {
        let key = String::from_utf8(key).unwrap();
        if key.contains("}op:") {
            ops.push(con.get::<_, String>(&key).unwrap());
        } else {
            kinds.push(
                key.split('}')
                    .nth(1)
                    .unwrap()
                    .split(':')
                    .next()
                    .unwrap()
                    .to_owned(),
            );
        }
    }
    (kinds, ops)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shortfall_rolls_the_acquisition_back_and_leaves_the_lock_free() {
    let (primary, mut replicas) = topology(2);
    let client = primary.client().await;
    let other = primary.client().await;

    // One of two replicas frozen: requiring both cannot be met.
    replicas[1].server.pause().unwrap();
    let lock = client
        .lock("acked")
        .unwrap()
        .with_replica_ack(2, Duration::from_millis(200))
        .unwrap();
    let err = lock.acquire().await.unwrap_err();
    assert!(err.is_replication_timeout(), "{err}");
    assert!(
        err.to_string().starts_with("acquisition of acked reached"),
        "{err}"
    );
    // The healthy replica normally makes it 1 of 2; on a loaded machine it may miss the
    // timeout too, which is a shortfall all the same.
    assert!(
        matches!(
            err,
            Error::ReplicationTimeout {
                acked: 0 | 1,
                required: 2,
                ..
            }
        ),
        "{err}"
    );
    // Free at once for anyone, and nothing of the rolled-back holder is left but the record
    // that cancels it (so a late copy of its request cannot take the lock again).
    assert!(primary.lock_state("acked").is_none());
    let (kinds, ops) = residue(&primary);
    assert_eq!(kinds, vec!["fence"], "{kinds:?}");
    assert_eq!(ops, vec!["c"], "{ops:?}");
    let taken = other.lock("acked").unwrap().try_acquire().await.unwrap();
    taken
        .expect("free right after the rollback")
        .release()
        .await
        .unwrap();

    // Both frozen: even one replica cannot acknowledge.
    replicas[0].server.pause().unwrap();
    let one = lock
        .with_replica_ack(1, Duration::from_millis(200))
        .unwrap();
    let err = one.try_acquire().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::ReplicationTimeout {
                acked: 0,
                required: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(primary.lock_state("acked").is_none());

    // The same for a whole multi-lock set: every member is rolled back.
    let set = client
        .multi_lock(["acked", "acked:2"])
        .unwrap()
        .with_replica_ack(1, Duration::from_millis(200))
        .unwrap();
    let err = set.try_acquire().await.unwrap_err();
    assert!(err.is_replication_timeout(), "{err}");
    assert!(primary.lock_state("acked").is_none() && primary.lock_state("acked:2").is_none());
    // The member-by-member path (a cluster's) waits for the replicas once for the whole set,
    // and rolls the whole set back just the same.
    let ordered = set.force_ordered_acquisition();
    let err = ordered.try_acquire().await.unwrap_err();
    assert!(err.is_replication_timeout(), "{err}");
    assert!(primary.lock_state("acked").is_none() && primary.lock_state("acked:2").is_none());
    // By choice, a set comes back marked instead, on either path, and holds its members.
    for set in [&set, &ordered] {
        let lenient = set.on_replica_shortfall(OnShortfall::ReturnUnreplicated);
        let guard = lenient.acquire().await.unwrap();
        assert!(!guard.replicated());
        assert!(guard.guards().iter().all(|g| g.replica_acks() == Some(0)));
        assert!(primary.lock_state("acked").is_some() && primary.lock_state("acked:2").is_some());
        guard.release().await.unwrap();
    }

    // By choice, the guard comes back marked instead, and holds the lock.
    let lenient = one.on_replica_shortfall(OnShortfall::ReturnUnreplicated);
    let guard = lenient.acquire().await.unwrap();
    assert!(!guard.replicated());
    assert_eq!(guard.replica_acks(), Some(0));
    assert_eq!(
        primary.lock_state("acked").unwrap().0[0].0,
        guard.holder_id()
    );
    guard.release().await.unwrap();

    // Healthy again: both replicas acknowledge.
    replicas[0].server.resume().unwrap();
    replicas[1].server.resume().unwrap();
    let both = lock.with_replica_ack(2, HEALTHY_ACK).unwrap();
    let guard = both.acquire().await.unwrap();
    assert!(guard.replicated());
    assert_eq!(guard.replica_acks(), Some(2));
    guard.release().await.unwrap();
    let plain = client.lock("plain").unwrap().acquire().await.unwrap();
    assert_eq!(plain.replica_acks(), None);
    assert!(plain.replicated());
    plain.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_acquisition_survives_a_failover_with_its_token() {
    let (mut primary, replicas) = topology(1);
    let replica = &replicas[0];
    // Every lock of this client requires the replica; a short lease so that the new primary
    // frees the lock by itself once the old holder (cut off with the old primary) stops
    // renewing.
    let client = LockClient::builder(primary.server.url())
        .replica_ack(1, HEALTHY_ACK)
        .connect()
        .await
        .unwrap();
    let lock = client
        .lock("failover")
        .unwrap()
        .with_lease(Duration::from_secs(2))
        .unwrap();
    assert_eq!(lock.replica_ack(), Some((1, HEALTHY_ACK)));
    let guard = lock.acquire().await.unwrap();
    assert!(guard.replicated());
    assert_eq!(guard.replica_acks(), Some(1));

    // The primary dies the moment the guard is returned; the replica is promoted.
    primary.server.kill();
    replica.server.promote().unwrap();
    let (holders, token) = replica
        .lock_state("failover")
        .expect("the promoted replica has the acknowledged lock");
    assert_eq!(holders, vec![(guard.holder_id().to_owned(), 1)]);
    assert_eq!(token, guard.token().get());

    // Still exclusive on the new primary, and the next holder's token is higher.
    let after = replica.client().await;
    let again = after.lock("failover").unwrap();
    assert!(again.try_acquire().await.unwrap().is_none());
    let next = again
        .acquire_timeout(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(next.token() > guard.token());
    next.release().await.unwrap();
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_replicas_does_not_stall_the_shared_connection() {
    let (primary, mut replicas) = topology(1);
    let client = primary.client().await;
    replicas[0].server.pause().unwrap();

    let replicated = client
        .lock("slow")
        .unwrap()
        .with_replica_ack(1, Duration::from_secs(60))
        .unwrap();
    let waiting = tokio::spawn(async move { replicated.acquire().await });
    assert!(
        eventually(Duration::from_secs(30), || blocked_in_wait(&primary) == 1).await,
        "the replicated acquisition never reached WAIT"
    );

    // While that WAIT blocks its connection, the same client's other work goes on.
    let plain = client.lock("fast").unwrap();
    let guard = plain.try_acquire().await.unwrap().expect("free");
    guard.extend(Duration::from_secs(5)).await.unwrap();
    let inner = guard.reenter().await.unwrap();
    inner.release().await.unwrap();
    guard.release().await.unwrap();
    assert_eq!(
        blocked_in_wait(&primary),
        1,
        "the WAIT ended before the plain work did"
    );
    assert!(!waiting.is_finished());

    // The replica wakes up, acknowledges, and the replicated acquisition completes.
    replicas[0].server.resume().unwrap();
    let guard = waiting.await.unwrap().unwrap();
    assert!(guard.replicated());
    assert_eq!(guard.replica_acks(), Some(1));
    guard.release().await.unwrap();
    assert!(client.replica_ack_connections() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_acknowledgement_settings_are_typed_errors() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let lock = client.lock("cfg").unwrap();
    for (n, timeout) in [
        (0, Duration::from_secs(1)),
        (1, Duration::ZERO),
        (1, Duration::from_micros(1500)),
        (1, Duration::from_secs(61)),
    ] {
        let err = lock.with_replica_ack(n, timeout).unwrap_err();
        assert!(
            matches!(err, Error::InvalidConfig { .. }),
            "{n} {timeout:?}: {err}"
        );
        let err = LockClient::builder(fx.server.url())
            .replica_ack(n, timeout)
            .connect()
            .await
            .unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
    }
    // A server with no replicas: the shortfall is immediate, and nothing stays held.
    let lonely = lock.with_replica_ack(1, Duration::from_millis(50)).unwrap();
    let err = lonely.try_acquire().await.unwrap_err();
    assert!(matches!(
        err,
        Error::ReplicationTimeout {
            acked: 0,
            required: 1,
            ..
        }
    ));
    assert!(fx.lock_state("cfg").is_none());
    let opted_out = LockClient::builder(fx.server.url())
        .replica_ack(1, Duration::from_millis(50))
        .on_replica_shortfall(OnShortfall::ReturnUnreplicated)
        .connect()
        .await
        .unwrap();
    let guard = opted_out.lock("cfg").unwrap().acquire().await.unwrap();
    assert!(!guard.replicated());
    guard.release().await.unwrap();
    let plain = opted_out.lock("cfg").unwrap().without_replica_ack();
    assert_eq!(plain.replica_ack(), None);
    assert!(plain.acquire().await.unwrap().replicated());
}

/// Pauses `replica` (the only one) and starts a replicated acquisition of `name` at `primary`,
/// returning once its script has run and its `WAIT` is blocked. The task drops the guard if
/// it ever gets one.
async fn acquire_blocked_in_wait(
    primary: &Fixture,
    replica: &mut Fixture,
    name: &str,
) -> (
    LockClient,
    fencelock::Lock,
    tokio::task::JoinHandle<Result<(), Error>>,
) {
    let client = primary.client().await;
    replica.server.pause().unwrap();
    let lock = client
        .lock(name)
        .unwrap()
        .with_replica_ack(1, Duration::from_secs(60))
        .unwrap();
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire().await.map(drop) }
    });
    assert!(eventually(Duration::from_secs(30), || blocked_in_wait(primary) == 1).await);
    (client, lock, waiting)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_acquire_dropped_during_its_wait_leaves_nothing_held() {
    let (primary, mut replicas) = topology(1);
    let (client, lock, waiting) =
        acquire_blocked_in_wait(&primary, &mut replicas[0], "dropped").await;
    // The script ran (the lock is held) and its WAIT is blocked: the caller gives up.
    assert!(primary.lock_state("dropped").is_some());
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    // The acquisition is undone in the background, and the connection that was blocked in
    // WAIT is closed rather than put back in the pool.
    assert!(
        eventually(Duration::from_secs(30), || primary
            .lock_state("dropped")
            .is_none())
        .await,
        "the abandoned acquisition was not undone"
    );
    assert!(eventually(Duration::from_secs(30), || blocked_in_wait(&primary) == 0).await);
    assert_eq!(client.replica_ack_connections(), 0);
    replicas[0].server.resume().unwrap();
    let guard = lock
        .with_replica_ack(1, HEALTHY_ACK)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert!(guard.replicated());
    guard.release().await.unwrap();
}

/// A `WAIT` whose connection is cut counts no acknowledgement: the acquisition is a
/// shortfall (rolled back, `ReplicationTimeout`), not a connection error that would hide
/// that the lock was taken and is being undone, nor a permission error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_cut_off_by_a_lost_connection_is_a_shortfall() {
    let (primary, mut replicas) = topology(1);
    let (_client, _lock, waiting) =
        acquire_blocked_in_wait(&primary, &mut replicas[0], "cut").await;
    kill_wait_connection(&primary);
    let err = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the acquisition ended")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ReplicationTimeout {
                acked: 0,
                required: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        eventually(Duration::from_secs(30), || primary
            .lock_state("cut")
            .is_none())
        .await,
        "the shortfall was not rolled back"
    );
    replicas[0].server.resume().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_acquisitions_wait_for_replicas_and_a_set_waits_once() {
    let (primary, _replicas) = topology(1);
    let client = LockClient::builder(primary.server.url())
        .replica_ack(1, HEALTHY_ACK)
        .connect()
        .await
        .unwrap();
    let waits = || primary.calls("wait");

    let before = waits();
    let guard = client.lock("counted").unwrap().acquire().await.unwrap();
    assert_eq!(waits() - before, 1);
    // Re-entry, extension and release change neither holder nor token: no WAIT.
    let inner = guard.reenter().await.unwrap();
    guard.extend(Duration::from_secs(20)).await.unwrap();
    inner.release().await.unwrap();
    guard.release().await.unwrap();
    assert_eq!(waits() - before, 1);

    // A multi-lock set acquired in one script waits once for all its members.
    let set = client
        .multi_lock(["counted:a", "counted:b", "counted:c"])
        .unwrap();
    let guard = set.acquire().await.unwrap();
    assert!(guard.replicated());
    assert_eq!(waits() - before, 2);
    guard.release().await.unwrap();
    // A lock that opts out does not wait at all.
    let plain = client.lock("counted").unwrap().without_replica_ack();
    plain.acquire().await.unwrap().release().await.unwrap();
    assert_eq!(waits() - before, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_re_sent_on_a_new_connection_is_still_acknowledged_by_a_wait_that_covers_it()
{
    let (primary, _replicas) = topology(1);
    let client = LockClient::builder(primary.server.url())
        .replica_ack(1, HEALTHY_ACK)
        .connect()
        .await
        .unwrap();
    let guard = client.lock("resent").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
    assert_eq!(client.replica_ack_connections(), 1);

    // The server drops the pool's idle connection (the one whose last command was WAIT): the
    // next acquisition fails on it with its outcome unknown and is re-sent on a new one.
    kill_wait_connection(&primary);

    let (waits, bumps) = (primary.calls("wait"), primary.calls("incrby"));
    let guard = client.lock("resent").unwrap().acquire().await.unwrap();
    // The re-send may have been a replay that wrote nothing on the new connection, so a write
    // of ours (INCRBY of the fence counter by 0) comes first, and the WAIT covers both.
    assert!(guard.replicated());
    assert_eq!(guard.replica_acks(), Some(1));
    assert_eq!(primary.calls("incrby"), bumps + 1);
    assert_eq!(primary.calls("wait"), waits + 1);
    let (holders, token) = primary.lock_state("resent").unwrap();
    assert_eq!(holders, vec![(guard.holder_id().to_owned(), 1)]);
    assert_eq!(token, guard.token().get());
    guard.release().await.unwrap();
}
