//! Security: identities, a least-privilege ACL user, passwords (and TLS with the `tls`
//! feature), each against a real redis-server.

use std::time::Duration;

use crate::common::deadline::woken;
use crate::common::{eventually, Fixture};
use fencelock::admin::Admin;
use fencelock::{LockClient, MAX_NAME_LEN};
use fencelock_testing::{RedisCluster, RedisServer};
use redis::Commands;

/// The ACL rules of a fencelock user, exactly as README.md and DESIGN.md give them: the keys and
/// channels under the default prefix, and only the commands fencelock sends (the scripts'
/// commands included: a script runs with its caller's permissions).
const FENCELOCK_ACL: &str = "resetkeys ~fencelock:* resetchannels &fencelock:* -@all \
    +evalsha +script|load +subscribe +unsubscribe \
    +get +hget +lrange \
    +set +del +type +time +pttl +pexpire +hset +hexists +hincrby +incrby +rpush +publish +exists";

/// A server with an `admin` user (the harness and the test's inspections), a `locks` user
/// with exactly [`FENCELOCK_ACL`], and the `default` user off.
fn acl_server() -> RedisServer {
    RedisServer::builder()
        .acl_lines([
            "user default off".to_owned(),
            "user admin on >admin-pw ~* &* +@all".to_owned(),
            format!("user locks on >locks-pw {FENCELOCK_ACL}"),
        ])
        .credentials("admin", "admin-pw")
        .start()
        .expect("start redis-server with ACL users")
}

fn locks_url(server: &RedisServer) -> String {
    format!("redis://locks:locks-pw@127.0.0.1:{}/", server.port())
}

/// Every key on the server, read as the admin, but the clients' name registrations (written
/// once at connect).
fn all_keys(server: &RedisServer) -> Vec<Vec<u8>> {
    let keys: Vec<Vec<u8>> = server.client().get_connection().unwrap().keys("*").unwrap();
    keys.into_iter()
        .filter(|key| !crate::common::fixture_is_name_registration(key))
        .collect()
}

fn is_uuid_v4_simple(id: &str) -> bool {
    let b = id.as_bytes();
    b.len() == 32
        && b.iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        && b[12] == b'4'
        && matches!(b[16], b'8' | b'9' | b'a' | b'b')
}

#[tokio::test]
async fn client_and_holder_ids_are_random_uuids() {
    let fx = Fixture::start();
    let (a, b) = (fx.client().await, fx.client().await);
    assert!(is_uuid_v4_simple(a.id()), "{}", a.id());
    assert!(is_uuid_v4_simple(b.id()), "{}", b.id());
    assert_ne!(a.id(), b.id());
    let guard = a.lock("ids").unwrap().acquire().await.unwrap();
    let (client_part, seq) = guard.holder_id().split_once(':').unwrap();
    assert_eq!(client_part, a.id());
    seq.parse::<u64>().unwrap();
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_former_holder_cannot_release_extend_or_reenter_the_new_holders_lock() {
    let fx = Fixture::start();
    let (a, b) = (fx.client().await, fx.client().await);
    // B's hold ends by its own short lease (not renewed), then A takes the lock.
    let stale = b
        .lock("shared")
        .unwrap()
        .with_lease(Duration::from_millis(100))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || fx
            .lock_state("shared")
            .is_none())
        .await
    );
    let current = a.lock("shared").unwrap().acquire().await.unwrap();
    let before = fx.lock_state("shared").unwrap();
    assert_eq!(before.0, [(current.holder_id().to_owned(), 1)]);

    assert!(stale
        .extend(Duration::from_secs(60))
        .await
        .unwrap_err()
        .is_not_held());
    assert!(stale.reenter().await.unwrap_err().is_not_held());
    assert!(stale.release().await.unwrap_err().is_not_held());
    // Another client has no guard for A's hold at all; all it can do is wait or give up.
    assert!(b
        .lock("shared")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .is_none());

    assert_eq!(fx.lock_state("shared").unwrap(), before);
    assert!(current.is_valid());
    current.release().await.unwrap();
    assert!(fx.lock_state("shared").is_none());
}

/// The permission check at connect leaves no trace: no key is created, and the fence counter of
/// the probe's bucket keeps its value. On Redis 6.2, where the check runs every command on probe
/// keys and undoes it in the same script, this is what makes it safe; elsewhere it only asks.
#[tokio::test]
async fn the_permission_check_leaves_no_trace() {
    // The probe's fence counter key: the one a lock called `permissions-probe` uses, learnt by
    // taking that lock once on a scratch server.
    let scratch = RedisServer::start().unwrap();
    let scratch_client = LockClient::connect(&scratch.url()).await.unwrap();
    let probe_lock = scratch_client.lock("permissions-probe").unwrap();
    probe_lock.acquire().await.unwrap().release().await.unwrap();
    let fences: Vec<Vec<u8>> = scratch
        .client()
        .get_connection()
        .unwrap()
        .keys("*fence")
        .unwrap();
    assert_eq!(fences.len(), 1, "{fences:?}");
    let probe_fence = fences[0].clone();

    let server = acl_server();
    let mut admin = server.client().get_connection().unwrap();
    drop(LockClient::connect(&locks_url(&server)).await.unwrap());
    assert!(all_keys(&server).is_empty(), "{:?}", all_keys(&server));
    // A counter in the probe's bucket, as real locks of that bucket would leave.
    let _: () = admin.set(&probe_fence, 12_345).unwrap();
    let client = LockClient::connect(&locks_url(&server)).await.unwrap();
    assert_eq!(all_keys(&server), vec![probe_fence.clone()]);
    let kept: u64 = admin.get(&probe_fence).unwrap();
    assert_eq!(kept, 12_345, "the check changed the bucket's fence counter");
    // The client works: the grant was checked, not just left alone.
    let guard = client.lock("after-check").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test]
async fn the_least_privilege_acl_user_runs_the_whole_flow() {
    let server = acl_server();
    let url = locks_url(&server);
    let a = LockClient::connect(&url).await.unwrap();
    let b = LockClient::connect(&url).await.unwrap();
    // The eviction check needs CONFIG, which this user lacks: a typed error when asked...
    assert!(a.eviction_risk().await.unwrap_err().is_permission_denied());

    let lock = a.lock("acct:1").unwrap();
    let guard = lock.acquire().await.unwrap();
    let inner = guard.reenter().await.unwrap();
    guard.extend(Duration::from_secs(20)).await.unwrap();
    let balance = a.resource("acct:1").unwrap();
    assert_eq!(balance.get_i64(guard.token()).await.unwrap(), None);
    assert_eq!(balance.incr_by(guard.token(), 100).await.unwrap(), 100);
    balance
        .set_fields(guard.token(), &[(b"owner".as_slice(), b"ann".as_slice())])
        .await
        .unwrap_err(); // a string value is not a hash: typed, not a permission problem
    let ledger = a.resource("ledger:1").unwrap();
    assert_eq!(ledger.push(guard.token(), &[b"+100"]).await.unwrap(), 1);
    assert_eq!(
        ledger.items(guard.token()).await.unwrap(),
        [b"+100".to_vec()]
    );
    assert_eq!(ledger.peek_items().await.unwrap(), [b"+100".to_vec()]);
    assert_eq!(balance.peek_i64().await.unwrap(), Some(100));
    let first_token = guard.token();

    // A waiter on another client is woken by the release's message: the lease (30 s) is far
    // longer than the waiter's deadline, so only the wake-up can get it the lock in time.
    let waiter = tokio::spawn({
        let lock = b.lock("acct:1").unwrap();
        async move { lock.acquire_timeout(Duration::from_secs(10)).await }
    });
    // Its wait is recorded for operators through the same user (wait_record.lua).
    assert!(
        eventually(Duration::from_secs(10), || {
            all_keys(&server)
                .iter()
                .any(|k| String::from_utf8_lossy(k).contains("}wait:"))
        })
        .await,
        "no wait record: {:?}",
        all_keys(&server)
    );
    inner.release().await.unwrap();
    assert!(b
        .lock("acct:1")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    guard.release().await.unwrap();
    let next = woken("the holder's release", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(next.token() > first_token);
    let balance_b = b.resource("acct:1").unwrap();
    assert_eq!(balance_b.incr_by(next.token(), -30).await.unwrap(), 70);
    assert!(balance
        .incr_by(first_token, -1)
        .await
        .unwrap_err()
        .is_stale_token());
    next.release().await.unwrap();

    // A multi-lock (its script checks operation records with EXISTS), both paths, labelled.
    let set = a.multi_lock(["acct:1", "acct:2"]).unwrap();
    set.acquire().await.unwrap().release().await.unwrap();
    let ordered = set
        .force_ordered_acquisition()
        .with_label("batch-1")
        .unwrap();
    ordered.acquire().await.unwrap().release().await.unwrap();

    // Each client registered its name with the same grant (SET under the prefix), and a
    // labelled acquisition needs nothing more.
    let labelled = lock.with_label("req-9").unwrap().acquire().await.unwrap();
    labelled.release().await.unwrap();
    let mut admin = server.client().get_connection().unwrap();
    for client in [&a, &b] {
        let registered: Vec<Vec<u8>> = admin
            .keys(format!("fencelock:{{*}}client:{}", client.id()))
            .unwrap();
        assert_eq!(registered.len(), 1, "{}", client.id());
        let name: String = admin.get(&registered[0]).unwrap();
        assert_eq!(name, client.name());
    }

    // Dropped guards release in the background through the same user.
    drop(lock.acquire().await.unwrap());
    assert!(
        eventually(Duration::from_secs(10), || {
            all_keys(&server)
                .iter()
                .all(|k| !String::from_utf8_lossy(k).contains("lock:acct:1"))
        })
        .await
    );
    for key in all_keys(&server) {
        assert!(
            key.starts_with(b"fencelock:"),
            "{}",
            String::from_utf8_lossy(&key)
        );
    }
}

/// Jobs and idempotency keys need no command beyond the lock's: their scripts read records
/// with `HGET` (no `HGETALL`), write them with `HSET`, `DEL` and `PEXPIRE`, and a duplicate
/// that waits for a run's outcome waits on the lock's channel.
#[tokio::test]
async fn the_least_privilege_acl_user_runs_jobs_and_idempotency_keys() {
    use fencelock::{Failure, IdempotencyOptions, JobOptions, Processed};
    use std::time::Duration;
    let server = acl_server();
    let client = LockClient::connect(&locks_url(&server)).await.unwrap();
    let job = client
        .job(
            "report",
            JobOptions::new(Duration::from_secs(60), Duration::from_secs(5)),
        )
        .unwrap();
    let ran = job
        .run_exclusive(std::time::SystemTime::now(), |_run| async {})
        .await
        .unwrap();
    assert!(ran.ran());
    assert!(job.last_tick().await.unwrap().unwrap().finished().is_some());
    let options =
        IdempotencyOptions::new(Duration::from_secs(5)).wait_for_outcome(Duration::from_secs(5));
    let payments = client.idempotency("payments", options).unwrap();
    let first = payments
        .run("k", "charge", |run| async move {
            Ok::<_, Failure<()>>(run.token().to_string().into_bytes())
        })
        .await
        .unwrap();
    let again = payments
        .run("k", "charge", |_run| async { Ok::<_, Failure<()>>(vec![]) })
        .await
        .unwrap();
    assert!(matches!(again, Processed::Completed(_)), "{again:?}");
    assert_eq!(again.result(), first.result());
    let failed = payments
        .run("f", "charge", |_run| async {
            Err::<Vec<u8>, _>(Failure::Retry(()))
        })
        .await
        .unwrap();
    assert!(failed.ran() && failed.result().is_none());
}

/// An election needs no command beyond the lock's: its scripts read the leader with `HGET`
/// (no `HGETALL`), and followers share the lock's subscription.
#[tokio::test]
async fn the_least_privilege_acl_user_runs_an_election() {
    use crate::common::deadline::{within, HANDOFF};
    let server = acl_server();
    let url = locks_url(&server);
    let (a, b) = (
        LockClient::connect(&url).await.unwrap(),
        LockClient::connect(&url).await.unwrap(),
    );
    let (ea, eb) = (
        a.election("primary").unwrap(),
        b.election("primary").unwrap(),
    );
    let mut observer = eb.observe().await.unwrap();
    let leader = ea.campaign(b"10.0.0.7:8080").await.unwrap();
    let seen = within(HANDOFF, "the follower sees the leader", observer.changed())
        .await
        .unwrap()
        .expect("a leader");
    assert_eq!((seen.id(), seen.term()), (leader.id(), leader.term()));
    assert_eq!(seen.metadata(), b"10.0.0.7:8080");
    assert_eq!(eb.leader().await.unwrap(), Some(seen));
    assert!(eb.try_campaign(b"b").await.unwrap().is_none());
    leader.resign().await.unwrap();
    let seen = within(
        HANDOFF,
        "the follower sees the resignation",
        observer.changed(),
    )
    .await;
    assert_eq!(seen.unwrap(), None);
}

#[tokio::test]
async fn another_prefix_is_refused_at_connect_with_a_typed_error_and_leaves_nothing() {
    let server = acl_server();
    let err = LockClient::builder(locks_url(&server))
        .prefix("other:")
        .connect()
        .await
        .unwrap_err();
    assert!(err.is_permission_denied(), "{err:?}");
    assert!(all_keys(&server).is_empty(), "{:?}", all_keys(&server));
    // The right prefix connects, and what it leaves is under it.
    let ok = LockClient::connect(&locks_url(&server)).await.unwrap();
    let guard = ok.lock("acct:1").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
    let keys = all_keys(&server);
    assert!(!keys.is_empty());
    for key in keys {
        assert!(
            key.starts_with(b"fencelock:"),
            "{}",
            String::from_utf8_lossy(&key)
        );
    }
}

/// The documented rules without one command each: `connect` refuses the user and names the
/// command, before anything is written. Without the check, a missing `PEXPIRE` let the acquire
/// script write the lock hash and then fail, leaving a lock that never expires.
#[tokio::test]
async fn a_partial_grant_is_refused_at_connect_naming_what_is_missing() {
    let missing = [
        ("+pexpire", "PEXPIRE"),
        ("+hset", "HSET"),
        ("+hincrby", "HINCRBY"),
        ("+exists", "EXISTS"),
        ("+publish", "PUBLISH"),
        ("+time", "TIME"),
    ];
    let users: Vec<String> = missing
        .iter()
        .enumerate()
        .map(|(i, (grant, _))| {
            let partial = FENCELOCK_ACL.replace(&format!(" {grant}"), "");
            assert_ne!(partial, FENCELOCK_ACL, "{grant}");
            format!("user partial{i} on >pw {partial}")
        })
        .collect();
    let server = RedisServer::builder()
        .acl_lines(
            [
                "user default off".to_owned(),
                "user admin on >admin-pw ~* &* +@all".to_owned(),
            ]
            .into_iter()
            .chain(users),
        )
        .credentials("admin", "admin-pw")
        .start()
        .unwrap();
    for (i, (_, command)) in missing.iter().enumerate() {
        let url = format!("redis://partial{i}:pw@127.0.0.1:{}/", server.port());
        let err = LockClient::connect(&url).await.unwrap_err();
        assert!(err.is_permission_denied(), "{command}: {err:?}");
        assert!(err.to_string().contains(command), "{command}: {err}");
    }
    assert!(all_keys(&server).is_empty(), "{:?}", all_keys(&server));
}

/// A grant taken away after connect is not seen by the connect-time check: the script refused
/// midway is still a typed permission error (and its partial write stays, as documented).
#[tokio::test]
async fn a_command_refused_inside_a_script_is_a_permission_error() {
    let server = acl_server();
    let client = LockClient::connect(&locks_url(&server)).await.unwrap();
    let mut admin = server.client().get_connection().unwrap();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locks")
        .arg("-pexpire")
        .query(&mut admin)
        .unwrap();
    let err = client.lock("x").unwrap().acquire().await.unwrap_err();
    assert!(err.is_permission_denied(), "{err:?}");
}

/// Fair handoff's queue needs `ZADD`, `ZREM` and `ZPOPMIN` on top of the base rules: a fair
/// client is refused at connect without them (a default client is not), and runs with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_handoff_needs_the_queue_commands_and_says_so() {
    let server = RedisServer::builder()
        .acl_lines([
            "user default off".to_owned(),
            "user admin on >admin-pw ~* &* +@all".to_owned(),
            format!("user locks on >locks-pw {FENCELOCK_ACL}"),
            format!("user fair on >fair-pw {FENCELOCK_ACL} +zadd +zrem +zpopmin"),
        ])
        .credentials("admin", "admin-pw")
        .start()
        .unwrap();
    let grace = Duration::from_millis(500);
    let err = LockClient::builder(locks_url(&server))
        .fair_handoff(grace)
        .connect()
        .await
        .unwrap_err();
    assert!(err.is_permission_denied(), "{err:?}");
    for command in ["ZADD", "ZREM", "ZPOPMIN"] {
        assert!(err.to_string().contains(command), "{command}: {err}");
    }
    LockClient::connect(&locks_url(&server)).await.unwrap();

    let url = format!("redis://fair:fair-pw@127.0.0.1:{}/", server.port());
    let connect = || LockClient::builder(&url).fair_handoff(grace).connect();
    let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
    let guard = a.lock("fair").unwrap().acquire().await.unwrap();
    let waiter = tokio::spawn({
        let lock = b.lock("fair").unwrap();
        async move { lock.acquire_timeout(Duration::from_secs(10)).await }
    });
    let queued = eventually(Duration::from_secs(10), || {
        all_keys(&server)
            .iter()
            .any(|k| String::from_utf8_lossy(k).contains("queue:fair"))
    })
    .await;
    assert!(queued, "the waiter never queued");
    let first = guard.token();
    guard.release().await.unwrap();
    let next = woken("the holder's release", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(next.token() > first);
    next.release().await.unwrap();
}

/// What semaphores and read-write locks need on top of [`FENCELOCK_ACL`], as README.md gives
/// it; on a server with hash-field expiry also [`HOLD_FIELDS_ACL_EXTRA`].
const HOLD_ACL_EXTRA: &str =
    "+hmget +mget +hdel +pexpireat +zadd +zrem +zrange +zrangebyscore +zremrangebyscore +zscore";
const HOLD_FIELDS_ACL_EXTRA: &str = "+hvals +hkeys +hlen +hpexpireat +hpexpiretime +pexpiretime";

/// The hold grants the server under test needs.
fn hold_grants() -> Vec<&'static str> {
    let binary = fencelock_testing::ServerBinary::current().unwrap();
    let mut grants: Vec<&str> = HOLD_ACL_EXTRA.split(' ').collect();
    if binary
        .lacks(fencelock_testing::Feature::HashFieldExpiry)
        .is_none()
    {
        grants.extend(HOLD_FIELDS_ACL_EXTRA.split(' '));
    }
    grants
}

/// Semaphores and read-write locks need the hold commands: a user with the lock's rules only
/// connects and locks, but its first semaphore or read-write lock acquisition is refused with
/// a typed error naming what is missing, before anything is written; a user missing any one
/// hold grant is refused naming it; a user with them all runs both primitives, renewals,
/// re-entry and downgrade included, and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_read_write_locks_need_the_hold_commands_and_say_so() {
    let server = acl_server();
    let locks = LockClient::connect(&locks_url(&server)).await.unwrap();
    let err = locks
        .semaphore("pool", 2)
        .unwrap()
        .acquire(1)
        .await
        .unwrap_err();
    assert!(err.is_permission_denied(), "{err:?}");
    assert!(err.to_string().contains("ZADD"), "{err}");
    let err = locks.rwlock("doc").unwrap().read().await.unwrap_err();
    assert!(err.is_permission_denied(), "{err:?}");
    assert!(all_keys(&server).is_empty(), "{:?}", all_keys(&server));
    let guard = locks.lock("still-fine").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();

    let grants = hold_grants();
    let mut admin = server.client().get_connection().unwrap();
    for missing in &grants {
        let rules: Vec<&str> = grants.iter().filter(|g| *g != missing).copied().collect();
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("partial")
            .arg("reset")
            .arg("on")
            .arg(">partial-pw")
            .arg(FENCELOCK_ACL.split_whitespace().collect::<Vec<_>>())
            .arg(rules)
            .query(&mut admin)
            .unwrap();
        let url = format!("redis://partial:partial-pw@127.0.0.1:{}/", server.port());
        let client = LockClient::connect(&url).await.unwrap();
        let err = client
            .semaphore("partial", 1)
            .unwrap()
            .try_acquire(1)
            .await
            .unwrap_err();
        let command = missing.trim_start_matches('+').to_uppercase();
        assert!(err.is_permission_denied(), "{missing}: {err:?}");
        assert!(err.to_string().contains(&command), "{missing}: {err}");
    }

    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("holds")
        .arg("on")
        .arg(">holds-pw")
        .arg(FENCELOCK_ACL.split_whitespace().collect::<Vec<_>>())
        .arg(&grants)
        .query(&mut admin)
        .unwrap();
    let url = format!("redis://holds:holds-pw@127.0.0.1:{}/", server.port());
    let short = Duration::from_millis(300);
    let holds = LockClient::builder(&url)
        .default_lease(short)
        .connect()
        .await
        .unwrap();
    let pool = holds.semaphore("pool", 2).unwrap();
    let (a, b) = (
        pool.acquire(1).await.unwrap(),
        pool.acquire(1).await.unwrap(),
    );
    assert!(pool.try_acquire(1).await.unwrap().is_none());
    // Past two leases: the watchdog renewed both holds.
    tokio::time::sleep(short * 2).await;
    assert!(a.is_valid() && b.is_valid());
    a.release().await.unwrap();
    b.release().await.unwrap();
    let doc = holds.rwlock("doc").unwrap();
    let write = doc.write().await.unwrap();
    write.reenter().await.unwrap().release().await.unwrap();
    let read = write.downgrade().await.unwrap();
    let other = doc.read().await.unwrap();
    read.release().await.unwrap();
    other.release().await.unwrap();
    let left: Vec<String> = all_keys(&server)
        .iter()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .filter(|k| k.contains("sem:") || k.contains("rw"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// An operator whose Redis user may not read hashes gets a permission error from `Admin`, not
/// a claim that the lock key holds foreign data; foreign data is still named as such.
#[tokio::test]
async fn admin_tells_a_refused_read_from_foreign_data() {
    let server = RedisServer::builder()
        .acl_lines([
            "user default off".to_owned(),
            "user admin on >admin-pw ~* &* +@all".to_owned(),
            "user viewer on >viewer-pw ~* &* +@all -hgetall".to_owned(),
        ])
        .credentials("admin", "admin-pw")
        .start()
        .unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let guard = client.lock("seen").unwrap().acquire().await.unwrap();
    let mut raw = server.client().get_connection().unwrap();
    let lock_key: Vec<Vec<u8>> = raw.keys("fencelock:*lock:seen").unwrap();
    assert_eq!(lock_key.len(), 1, "{lock_key:?}");
    let viewer_url = format!("redis://viewer:viewer-pw@127.0.0.1:{}/", server.port());
    let admin = Admin::connect(&viewer_url).await.unwrap();

    let err = admin.lock("seen").await.unwrap_err();
    assert!(err.is_permission_denied(), "{err:?}");
    // The refusal's own words, found among the aborted transaction's errors.
    assert!(err.to_string().contains("'hgetall'"), "{err}");
    assert!(guard.is_valid(), "a refused read touches nothing");
    guard.release().await.unwrap();

    let _: () = raw.set(&lock_key[0], "foreign").unwrap();
    let err = admin.lock("seen").await.unwrap_err();
    assert!(matches!(err, fencelock::Error::WrongType { .. }), "{err:?}");
}

#[tokio::test]
async fn no_lock_name_reaches_a_key_outside_the_prefix() {
    let server = acl_server();
    let client = LockClient::connect(&locks_url(&server)).await.unwrap();
    let long = vec![b'}'; MAX_NAME_LEN];
    let names: Vec<&[u8]> = vec![
        b"}",
        b"{",
        b"}other:x",
        b"{other}:x",
        b"*",
        b"../../other:x",
        b"..",
        b"line\nbreak\r\n",
        b"\0nul",
        b"fencelock:{x}lock:y",
        &long,
    ];
    for name in &names {
        let guard = client.lock(name).unwrap().acquire().await.unwrap();
        let resource = client.resource(name).unwrap();
        resource.set(guard.token(), *name).await.unwrap();
        assert_eq!(resource.peek().await.unwrap().as_deref(), Some(*name));
        guard.release().await.unwrap();
    }
    let keys = all_keys(&server);
    assert!(!keys.is_empty());
    for key in keys {
        assert!(
            key.starts_with(b"fencelock:"),
            "{}",
            String::from_utf8_lossy(&key)
        );
    }
}

#[tokio::test]
async fn passwords_are_required_and_used() {
    let server = RedisServer::builder()
        .password("s3cret/with:odd@chars")
        .start()
        .unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    client
        .lock("pw")
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let anonymous = format!("redis://127.0.0.1:{}/", server.port());
    let err = LockClient::connect(&anonymous).await.unwrap_err();
    assert!(matches!(err, fencelock::Error::Redis(_)), "{err:?}");
    let wrong = format!("redis://:wrong@127.0.0.1:{}/", server.port());
    let err = LockClient::connect(&wrong).await.unwrap_err();
    assert!(matches!(err, fencelock::Error::Redis(_)), "{err:?}");
}

#[cfg(feature = "tls")]
mod tls {
    use super::*;

    /// redis-rs has no per-client root certificates for cluster and Sentinel connections, so
    /// the option is refused there instead of being ignored (standalone clients use it above).
    #[tokio::test]
    async fn a_root_certificate_is_refused_for_cluster_and_sentinel_clients() {
        if !fencelock_testing::requires(
            fencelock_testing::Feature::Tls,
            "a_root_certificate_is_refused_for_cluster_and_sentinel_clients",
        ) {
            return;
        }
        let server = RedisServer::builder().tls(true).start().unwrap();
        let url = server.tls_url().unwrap();
        let pem = server.tls_ca_cert_pem().unwrap();
        for builder in [
            LockClient::cluster_builder([url.clone()]),
            LockClient::sentinel_builder([url.clone()], "mymaster"),
        ] {
            let err = builder
                .tls_root_ca(pem.clone())
                .connect()
                .await
                .unwrap_err();
            assert!(
                matches!(err, fencelock::Error::InvalidConfig { .. }),
                "{err:?}"
            );
        }
    }

    #[tokio::test]
    async fn locks_work_over_tls_with_the_servers_ca() {
        if !fencelock_testing::requires(
            fencelock_testing::Feature::Tls,
            "locks_work_over_tls_with_the_servers_ca",
        ) {
            return;
        }
        let server = RedisServer::builder().tls(true).start().unwrap();
        let url = server.tls_url().unwrap();
        assert!(url.starts_with("rediss://127.0.0.1:"), "{url}");
        let client = LockClient::builder(&url)
            .tls_root_ca(server.tls_ca_cert_pem().unwrap())
            .connect()
            .await
            .unwrap();
        let other = LockClient::builder(&url)
            .tls_root_ca(server.tls_ca_cert_pem().unwrap())
            .connect()
            .await
            .unwrap();
        let guard = client.lock("tls").unwrap().acquire().await.unwrap();
        let first_token = guard.token();
        let inner = guard.reenter().await.unwrap();
        // A waiter over TLS is woken by the release message (the lease is 30 s).
        let waiter = tokio::spawn({
            let lock = other.lock("tls").unwrap();
            async move { lock.acquire_timeout(Duration::from_secs(10)).await }
        });
        inner.release().await.unwrap();
        guard.release().await.unwrap();
        let next = woken("the holder's release", waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(next.token() > first_token);
        next.release().await.unwrap();

        // The port the clients used speaks only TLS: plain RESP to it gets no answer.
        let plain = format!("redis://127.0.0.1:{}/", server.tls_port().unwrap());
        let err = LockClient::builder(plain)
            .connection_timeout(Duration::from_millis(500))
            .connect()
            .await
            .unwrap_err();
        assert!(err.is_connection(), "{err:?}");
    }

    #[tokio::test]
    async fn a_tls_server_with_an_unknown_ca_is_refused() {
        if !fencelock_testing::requires(
            fencelock_testing::Feature::Tls,
            "a_tls_server_with_an_unknown_ca_is_refused",
        ) {
            return;
        }
        let server = RedisServer::builder().tls(true).start().unwrap();
        let url = server.tls_url().unwrap();
        // Without the CA: the system roots do not know the throwaway CA.
        let err = LockClient::connect(&url).await.unwrap_err();
        assert!(err.is_connection(), "{err:?}");
        // With another server's CA.
        let stranger = RedisServer::builder().tls(true).start().unwrap();
        let err = LockClient::builder(&url)
            .tls_root_ca(stranger.tls_ca_cert_pem().unwrap())
            .connect()
            .await
            .unwrap_err();
        assert!(err.is_connection(), "{err:?}");
        // A CA for a plain URL, and garbage for a CA, are configuration errors.
        let err = LockClient::builder(server.url())
            .tls_root_ca(server.tls_ca_cert_pem().unwrap())
            .connect()
            .await
            .unwrap_err();
        assert!(err.is_invalid_input(), "{err:?}");
        let err = LockClient::builder(&url)
            .tls_root_ca(b"not a certificate".to_vec())
            .connect()
            .await
            .unwrap_err();
        assert!(err.is_invalid_input(), "{err:?}");
    }

    #[tokio::test]
    async fn tls_with_an_acl_user_and_password() {
        if !fencelock_testing::requires(
            fencelock_testing::Feature::Tls,
            "tls_with_an_acl_user_and_password",
        ) {
            return;
        }
        let server = RedisServer::builder()
            .tls(true)
            .acl_lines([
                "user default off".to_owned(),
                "user admin on >admin-pw ~* &* +@all".to_owned(),
                format!("user locks on >locks-pw {FENCELOCK_ACL}"),
            ])
            .credentials("admin", "admin-pw")
            .start()
            .unwrap();
        let url = format!(
            "rediss://locks:locks-pw@127.0.0.1:{}/",
            server.tls_port().unwrap()
        );
        let client = LockClient::builder(&url)
            .tls_root_ca(server.tls_ca_cert_pem().unwrap())
            .connect()
            .await
            .unwrap();
        let guard = client.lock("acct").unwrap().acquire().await.unwrap();
        let resource = client.resource("acct").unwrap();
        assert_eq!(resource.incr_by(guard.token(), 5).await.unwrap(), 5);
        guard.release().await.unwrap();
        assert!(server
            .tls_url()
            .unwrap()
            .starts_with("rediss://admin:admin-pw@"));
    }
}

/// What a cluster client needs on top of [`FENCELOCK_ACL`], as README.md gives it: sharded
/// pub/sub (releases publish with `SPUBLISH`, waiters listen with `SSUBSCRIBE`) and the
/// topology query of redis-rs' cluster client (`CLUSTER SLOTS`; without it the connect fails
/// with `Error::PermissionDenied`).
const CLUSTER_ACL_EXTRA: &str = "+spublish +ssubscribe +sunsubscribe +cluster|slots";

/// Creates `user` with password `pw` and `rules` on every node of `cluster` (a cluster's ACL is
/// per node).
fn cluster_user(cluster: &RedisCluster, user: &str, rules: &str) {
    for node in cluster.nodes() {
        let mut con = node.client().get_connection().unwrap();
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(user)
            .arg("on")
            .arg(">pw")
            .arg(rules.split_whitespace().collect::<Vec<_>>())
            .query(&mut con)
            .unwrap();
    }
}

/// The least-privilege rules on a cluster: the whole flow (blocking acquire woken by a sharded
/// release message, re-entry, fenced write, a multi-lock) through exactly the documented
/// rules, and a user without the sharded pub/sub grant refused at connect, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_privilege_acl_user_runs_on_a_cluster() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "the_least_privilege_acl_user_runs_on_a_cluster",
    ) {
        return;
    }
    let cluster = RedisCluster::builder()
        .replicas_per_primary(0)
        .start()
        .unwrap();
    cluster_user(
        &cluster,
        "locks",
        &format!("{FENCELOCK_ACL} {CLUSTER_ACL_EXTRA}"),
    );
    cluster_user(
        &cluster,
        "unsharded",
        &format!("{FENCELOCK_ACL} +cluster|slots"),
    );
    let urls = |user: &str| -> Vec<String> {
        cluster
            .nodes()
            .iter()
            .map(|node| format!("redis://{user}:pw@127.0.0.1:{}/", node.port()))
            .collect()
    };

    let err = LockClient::connect_cluster(urls("unsharded"))
        .await
        .unwrap_err();
    assert!(err.is_permission_denied(), "{err:?}");
    assert!(err.to_string().contains("SPUBLISH"), "{err}");

    let a = LockClient::connect_cluster(urls("locks")).await.unwrap();
    let b = LockClient::connect_cluster(urls("locks")).await.unwrap();
    let guard = a.lock("acct:1").unwrap().acquire().await.unwrap();
    let inner = guard.reenter().await.unwrap();
    let balance = a.resource("acct:1").unwrap();
    assert_eq!(balance.incr_by(inner.token(), 5).await.unwrap(), 5);
    // The waiter's deadline is far shorter than the lease (30 s): only the release's message
    // can get it the lock in time.
    let waiter = tokio::spawn({
        let lock = b.lock("acct:1").unwrap();
        async move { lock.acquire_timeout(Duration::from_secs(10)).await }
    });
    inner.release().await.unwrap();
    guard.release().await.unwrap();
    let next = woken("the holder's release", waiter)
        .await
        .unwrap()
        .unwrap();
    next.release().await.unwrap();

    let set = a.multi_lock(["acct:1", "acct:2", "acct:3"]).unwrap();
    set.acquire().await.unwrap().release().await.unwrap();

    for node in cluster.nodes() {
        let keys: Vec<Vec<u8>> = node.client().get_connection().unwrap().keys("*").unwrap();
        for key in keys {
            assert!(
                key.starts_with(b"fencelock:"),
                "{}",
                String::from_utf8_lossy(&key)
            );
        }
    }
}

#[test]
fn the_documented_acl_is_the_tested_one() {
    let line = format!("user fencelock on >PASSWORD {FENCELOCK_ACL}");
    assert!(
        include_str!("../../README.md").contains(&line),
        "README.md: {line}"
    );
    assert!(
        include_str!("../../DESIGN.md").contains(&line),
        "DESIGN.md: {line}"
    );
    for doc in [
        include_str!("../../README.md"),
        include_str!("../../DESIGN.md"),
    ] {
        assert!(doc.contains(CLUSTER_ACL_EXTRA), "{CLUSTER_ACL_EXTRA}");
    }
}

/// Replica acknowledgement needs `WAIT` on top of [`FENCELOCK_ACL`] (README). Without it the
/// acquisition fails with `PermissionDenied`, not with a replication timeout that would blame
/// the replicas, and the lock it took is undone; with it, a server without replicas is an
/// ordinary shortfall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledgement_needs_wait_in_the_acl_and_says_so() {
    let server = RedisServer::builder()
        .acl_lines([
            "user default off".to_owned(),
            "user admin on >admin-pw ~* &* +@all".to_owned(),
            format!("user locks on >locks-pw {FENCELOCK_ACL}"),
            format!("user acked on >acked-pw {FENCELOCK_ACL} +wait"),
        ])
        .credentials("admin", "admin-pw")
        .start()
        .expect("start redis-server with ACL users");
    let without_wait = LockClient::builder(locks_url(&server))
        .replica_ack(1, Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let err = without_wait
        .lock("acked")
        .unwrap()
        .acquire()
        .await
        .unwrap_err();
    assert!(err.is_permission_denied(), "{err:?}");
    let undone = eventually(Duration::from_secs(10), || {
        all_keys(&server)
            .iter()
            .all(|key| !key.ends_with(b"lock:acked"))
    })
    .await;
    assert!(undone, "the refused acquisition stayed held");

    let with_wait = LockClient::builder(format!(
        "redis://acked:acked-pw@127.0.0.1:{}/",
        server.port()
    ))
    .replica_ack(1, Duration::from_millis(100))
    .connect()
    .await
    .unwrap();
    let err = with_wait
        .lock("acked")
        .unwrap()
        .acquire()
        .await
        .unwrap_err();
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
}
