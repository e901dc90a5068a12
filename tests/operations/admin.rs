//! The operator's API (`fencelock::admin`) on real servers: what it reads from lock hashes,
//! how it pages through a large keyspace, what the doctor finds on servers configured in
//! each way it judges, and how it behaves on a slow or broken connection.

use std::time::Duration;

use crate::common::deadline::{within, HANDOFF};
use crate::common::{key_slot_of_lock, Fixture};
use fencelock::admin::{
    Admin, Check, HoldEntry, HoldKind, HoldRelease, LockEvent, SemaphoreInfo, Status,
};
use fencelock::{Error, FencingToken, HoldExpiry, LockClient};
use fencelock_testing::{requires, Direction, FaultProxy, Feature, RedisServer};
use redis::Commands;

/// Bound for a round trip or a few on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);

async fn admin(server: &RedisServer) -> Admin {
    within(PATIENCE, "admin connect", Admin::connect(&server.url()))
        .await
        .expect("admin connect")
}

async fn doctor(admin: &Admin, pings: usize) -> Vec<Check> {
    within(PATIENCE, "doctor", admin.doctor(pings))
        .await
        .expect("doctor")
}

fn check<'a>(checks: &'a [Check], name: &str) -> &'a Check {
    checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no {name} check in {checks:?}"))
}

/// The key of lock `name`, learned by taking and releasing it once (the lock is free after).
async fn free_lock_key(fx: &Fixture, client: &LockClient, name: &str) -> Vec<u8> {
    let guard = client.lock(name).unwrap().acquire().await.unwrap();
    let key = fx.lock_key(name).unwrap();
    guard.release().await.unwrap();
    key
}

fn config_set(server: &RedisServer, key: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(key)
        .arg(value)
        .query(&mut server.client().get_connection().unwrap())
        .unwrap();
}

#[tokio::test]
async fn an_admin_reads_back_its_prefix_and_names_it_when_debugged() {
    let fx = Fixture::start();
    let admin = Admin::connect_with_prefix(&fx.server.url(), "billing:")
        .await
        .unwrap();
    assert_eq!(admin.prefix(), b"billing:");
    let shown = format!("{admin:?}");
    assert!(shown.starts_with("Admin"), "{shown}");
    assert!(shown.contains("\"billing:\""), "{shown}");
    assert_eq!(
        Admin::connect(&fx.server.url()).await.unwrap().prefix(),
        b"fencelock:"
    );
}

/// A server that wants a password refuses `HELLO` without one (`NOAUTH`): that is a missing
/// password, not a server too old for RESP3, and must not be retried over RESP2, where the
/// connection would open and every command fail later.
#[tokio::test]
async fn a_missing_password_is_refused_at_connect_and_not_retried_over_resp2() {
    let server = RedisServer::builder().password("s3cret").start().unwrap();
    let none = format!("redis://127.0.0.1:{}/", server.port());
    let err = within(PATIENCE, "connect", Admin::connect(&none))
        .await
        .unwrap_err();
    assert!(err.is_auth_refused(), "{err:?}");
    // With the password it gets in, over RESP3 (a watch needs it).
    let admin = admin(&server).await;
    let watch = admin
        .watch("orders", Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(watch.name(), b"orders");
    assert!(!watch.current().is_held());
}

/// `SCAN` returns a large keyspace in pages: every held lock is found, however many foreign
/// keys share the server, and a prefix is in use when one key under it is anywhere.
#[tokio::test]
async fn every_lock_is_found_among_many_foreign_keys() {
    let fx = Fixture::start();
    let mut fill = redis::pipe();
    for i in 0..20_000 {
        fill.set(format!("foreign:{i}"), i).ignore();
    }
    let _: () = fill.query(&mut fx.raw()).unwrap();
    let admin = admin(&fx.server).await;
    assert!(
        !admin.prefix_in_use().await.unwrap(),
        "nothing under it yet"
    );
    // A client that connected registered its name there: the prefix is in use.
    let client = fx.client().await;
    assert!(admin.prefix_in_use().await.unwrap());

    let mut guards = Vec::new();
    for i in 0..8 {
        guards.push(
            client
                .lock(format!("held:{i}"))
                .unwrap()
                .acquire()
                .await
                .unwrap(),
        );
    }
    let locks = within(PATIENCE, "locks", admin.locks()).await.unwrap();
    let names: Vec<String> = locks.iter().map(|l| l.display_name()).collect();
    let expected: Vec<String> = (0..8).map(|i| format!("held:{i}")).collect();
    assert_eq!(names, expected);
    for (lock, guard) in locks.iter().zip(&guards) {
        assert!(lock.is_held());
        assert_eq!(lock.token, Some(guard.token()));
    }
    assert!(admin.prefix_in_use().await.unwrap());
    let other = Admin::connect_with_prefix(&fx.server.url(), "other:")
        .await
        .unwrap();
    assert!(!other.prefix_in_use().await.unwrap());
    assert!(other.locks().await.unwrap().is_empty());
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// A hash written by hand (a holder without `~token`, no expiry) is still a held lock, and
/// both the line of `list` and the detail of `show` say what is missing.
#[tokio::test]
async fn a_hand_written_lock_without_token_or_expiry_is_held_and_says_so() {
    let fx = Fixture::start();
    let client = fx.client().await;
    // Let fencelock lay the key out, then replace its fields by hand.
    let key = free_lock_key(&fx, &client, "orders").await;
    let _: () = fx.raw().hset(&key, "someone:1", 2).unwrap();

    let admin = admin(&fx.server).await;
    let detail = admin.lock("orders").await.unwrap();
    let lock = &detail.lock;
    assert!(lock.is_held());
    assert_eq!(lock.token, None);
    assert_eq!(lock.ttl, None);
    assert_eq!(
        lock.to_string(),
        "orders  no token  no expiry  holder someone:1 x2"
    );
    let text = detail.to_string();
    for line in [
        "lock        orders\n",
        "state       held\n",
        "holder      someone:1 (entry count 2)\n",
        "token       none (the hash has no ~token field)\n",
        "lease left  no expiry (set by hand? it never frees itself)\n",
    ] {
        assert!(text.contains(line), "{line:?} in {text}");
    }
    assert_eq!(detail.slot, key_slot_of_lock("orders"));
    let listed = admin.locks().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0], *lock);
}

/// The slot is the name's hash bucket, below 16384, for names whose CRC16 is above it too.
#[tokio::test]
async fn the_detail_names_the_slot_and_fence_counter_of_the_bucket() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let admin = admin(&fx.server).await;
    for name in ["orders", "payments", "a", "zzzz-17"] {
        let guard = client.lock(name).unwrap().acquire().await.unwrap();
        let detail = admin.lock(name).await.unwrap();
        assert_eq!(detail.slot, key_slot_of_lock(name), "{name}");
        assert!(detail.slot < 16384);
        assert_eq!(detail.fence, Some(guard.token().get()), "{name}");
        guard.release().await.unwrap();
    }
}

/// The doctor's findings on each persistence setting: the status alone does not tell them
/// apart (all but the append-only file with fsync are WARN), the finding does.
#[tokio::test]
async fn the_doctor_tells_each_persistence_setting_apart() {
    let server = RedisServer::start().unwrap();
    config_set(&server, "appendonly", "no");
    config_set(&server, "save", "");
    let admin = admin(&server).await;
    let none = doctor(&admin, 1).await;
    let persistence = check(&none, "persistence");
    assert_eq!(persistence.status, Status::Warn);
    assert!(
        persistence.finding.starts_with("no persistence"),
        "{persistence}"
    );

    config_set(&server, "save", "900 1");
    let rdb = doctor(&admin, 1).await;
    let persistence = check(&rdb, "persistence");
    assert_eq!(persistence.status, Status::Warn);
    assert!(
        persistence
            .finding
            .starts_with("RDB snapshots only (save \"900 1\")"),
        "{persistence}"
    );

    config_set(&server, "appendonly", "yes");
    config_set(&server, "appendfsync", "no");
    let unsynced = doctor(&admin, 1).await;
    let persistence = check(&unsynced, "persistence");
    assert_eq!(persistence.status, Status::Warn);
    assert!(
        persistence
            .finding
            .starts_with("append-only file on but appendfsync no"),
        "{persistence}"
    );

    config_set(&server, "appendfsync", "everysec");
    let synced = doctor(&admin, 1).await;
    let persistence = check(&synced, "persistence");
    assert_eq!(persistence.status, Status::Ok, "{persistence}");
    assert_eq!(persistence.fix, None);
}

/// An evicting policy is a WARN while no `maxmemory` makes it act, and a FAIL once one does;
/// the finding says which.
#[tokio::test]
async fn an_evicting_policy_fails_once_a_maxmemory_is_set() {
    let server = RedisServer::builder()
        .config("maxmemory-policy", "allkeys-lru")
        .start()
        .unwrap();
    let admin = admin(&server).await;
    let checks = doctor(&admin, 1).await;
    let eviction = check(&checks, "maxmemory-policy");
    assert_eq!(eviction.status, Status::Warn, "{eviction}");
    assert!(
        eviction
            .finding
            .contains("(no maxmemory is set now, but the policy applies as soon as one is)"),
        "{eviction}"
    );
    config_set(&server, "maxmemory", "104857600");
    let checks = doctor(&admin, 1).await;
    let eviction = check(&checks, "maxmemory-policy");
    assert_eq!(eviction.status, Status::Fail, "{eviction}");
    assert!(
        eviction.finding.contains("(maxmemory is 104857600 bytes)"),
        "{eviction}"
    );
}

/// On this machine the server's clock is the test's own: the offset found is within the
/// uncertainty the doctor gives for it (half the round trip of its best sample), and both
/// are far below the drift it warns about. One PING is a median too.
#[tokio::test]
async fn the_doctor_measures_the_clock_within_its_stated_uncertainty() {
    let server = RedisServer::start().unwrap();
    let admin = admin(&server).await;
    for _ in 0..3 {
        let checks = doctor(&admin, 1).await;
        let clock = check(&checks, "clock");
        assert_eq!(clock.status, Status::Ok, "{clock}");
        // "server clock is +0.012 ms from this machine's (± 0.034 ms)"
        let numbers: Vec<f64> = clock
            .finding
            .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
            .filter_map(|part| part.parse().ok())
            .collect();
        let [offset, bound] = numbers[..] else {
            panic!("{clock}");
        };
        // One microsecond of the server's TIME resolution and one of the printed rounding.
        assert!(offset.abs() <= bound + 0.002, "{clock}");
        let latency = check(&checks, "latency");
        assert!(latency.finding.contains("over 1 PINGs"), "{latency}");
    }
}

/// Through a link that delays every reply: a round trip over 100 ms is a latency WARN, and
/// the admin's own response timeout (5 s) waits for replies that take a second.
#[tokio::test]
async fn a_slow_link_is_a_latency_warning_and_slow_replies_are_waited_for() {
    let server = RedisServer::start().unwrap();
    let direct = admin(&server).await;
    let checks = doctor(&direct, 3).await;
    assert_eq!(check(&checks, "latency").status, Status::Ok);

    let proxy = FaultProxy::start(server.addr()).unwrap();
    let admin = within(PATIENCE, "connect", Admin::connect(&proxy.url()))
        .await
        .unwrap();
    proxy.delay(Direction::Downstream, Duration::from_millis(150));
    let checks = doctor(&admin, 1).await;
    let latency = check(&checks, "latency");
    assert_eq!(latency.status, Status::Warn, "{latency}");
    assert!(latency.fix.is_some());

    proxy.delay(Direction::Downstream, Duration::from_millis(1000));
    let detail = within(PATIENCE, "show", admin.lock("orders"))
        .await
        .unwrap();
    assert!(!detail.lock.is_held());
}

/// A connection lost in the middle of the doctor is the caller's error, not a finding.
#[tokio::test]
async fn a_lost_connection_fails_the_doctor_instead_of_becoming_a_finding() {
    let server = RedisServer::start().unwrap();
    let admin = admin(&server).await;
    let mut raw = server.client().get_connection().unwrap();
    // Every normal client but this one: the admin's connection.
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut raw)
        .unwrap();
    assert!(killed >= 1, "the admin's connection was not killed");
    let err = within(PATIENCE, "doctor", admin.doctor(1))
        .await
        .unwrap_err();
    assert!(err.is_connection(), "{err:?}");
}

/// Every queued candidate is listed, in the order the queue serves them, and the line says
/// `queued` only when someone is.
#[tokio::test]
async fn every_queued_candidate_is_listed_in_turn_order() {
    let fx = Fixture::start();
    let fair = || async {
        fencelock::LockClient::builder(fx.server.url())
            .fair_handoff(Duration::from_millis(500))
            .connect()
            .await
            .unwrap()
    };
    let leading = fair().await;
    let leader = leading
        .election("fair")
        .unwrap()
        .campaign(b"a")
        .await
        .unwrap();
    let admin = admin(&fx.server).await;
    let alone = admin.elections().await.unwrap();
    assert_eq!(alone.len(), 1);
    assert!(alone[0].queued_candidates.is_empty());
    assert!(!alone[0].to_string().contains("queued"), "{}", alone[0]);

    let mut ids = Vec::new();
    let mut candidates = Vec::new();
    for _ in 0..3 {
        let client = fair().await;
        ids.push(client.id().to_owned());
        let election = client.election("fair").unwrap();
        candidates.push(tokio::spawn(async move {
            let guard = election.campaign(b"next").await.unwrap();
            guard.resign().await.unwrap();
            drop(client);
        }));
        // Queued before the next one campaigns, so the order is known.
        let queued = ids.len();
        within(PATIENCE, "the candidate queues", async {
            while admin.elections().await.unwrap()[0].queued_candidates.len() < queued {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
    let listed = admin.elections().await.unwrap();
    assert_eq!(listed[0].queued_candidates, ids);
    let line = listed[0].to_string();
    assert!(
        line.contains(&format!("  queued {}  ", ids.join(","))),
        "{line}"
    );

    leader.resign().await.unwrap();
    for candidate in candidates {
        // Each hands over on resigning: milliseconds, not the 30 s lease.
        let what = "each queued candidate leads in turn (a missing wake-up?)";
        within(HANDOFF, what, candidate).await.unwrap();
    }
}

/// A job's record is kept for its retention (twice the period by default), and its line
/// gives when the run finished.
#[tokio::test]
async fn a_jobs_record_shows_its_retention_and_when_it_finished() {
    use std::time::UNIX_EPOCH;
    let fx = Fixture::start();
    let client = fx.client().await;
    let options = fencelock::JobOptions::new(Duration::from_secs(60), Duration::from_secs(30));
    let tick = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let job = client.job("report", options).unwrap();
    job.run_exclusive(tick, |_run| async {}).await.unwrap();

    let admin = admin(&fx.server).await;
    let jobs = admin.jobs().await.unwrap();
    assert_eq!(jobs.len(), 1);
    let info = &jobs[0];
    assert_eq!(info.state(), "done");
    let kept = info.retained_for.expect("a retention");
    assert!(
        kept > Duration::from_secs(60) && kept <= Duration::from_secs(120),
        "{kept:?}"
    );
    let finished = info.last.finished().expect("finished");
    let ms = finished.duration_since(UNIX_EPOCH).unwrap().as_millis();
    let line = info.to_string();
    // Times read in UTC: the finish's time of day is its milliseconds' within their day.
    let of_day = ms % 86_400_000;
    let (h, m) = (of_day / 3_600_000, of_day / 60_000 % 60);
    let (s, ms) = (of_day / 1000 % 60, of_day % 1000);
    let clock = format!(" {h:02}:{m:02}:{s:02}.{ms:03} UTC)  kept ");
    assert!(
        line.contains(" (finished 20") && line.contains(&clock),
        "{line}"
    );
    assert!(
        line.starts_with("report  tick 2027-01-15 08:00:00.000 UTC  done  runner "),
        "{line}"
    );
}

/// A watch follows the holder, not the token: in a hash without `~token` (written by hand),
/// another holder replacing the first is an expiry and an acquisition, not the same hold.
#[tokio::test]
async fn a_watch_tells_holders_apart_in_a_hash_without_a_token() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let key = free_lock_key(&fx, &client, "orders").await;
    let _: () = fx.raw().hset(&key, "first:1", 1).unwrap();

    let admin = admin(&fx.server).await;
    let mut watch = admin
        .watch("orders", Duration::from_millis(20))
        .await
        .unwrap();
    assert_eq!(watch.current().holders[0].id, "first:1");
    let mut raw = fx.raw();
    let _: () = redis::pipe()
        .atomic()
        .del(&key)
        .hset(&key, "second:1", 1)
        .query(&mut raw)
        .unwrap();
    let gone = within(PATIENCE, "the first holder's end", watch.next())
        .await
        .unwrap();
    assert!(
        matches!(&gone, LockEvent::Expired { holder, token: None } if holder.id == "first:1"),
        "{gone:?}"
    );
    let came = within(PATIENCE, "the second holder", watch.next())
        .await
        .unwrap();
    assert!(
        matches!(&came, LockEvent::Acquired { holder, token: None } if holder.id == "second:1"),
        "{came:?}"
    );
}

/// A watch whose connection is closed under it ends with a connection error at once, not at
/// its next poll (an hour away here).
#[tokio::test]
async fn a_watch_whose_connection_is_killed_ends_with_an_error() {
    let fx = Fixture::start();
    let admin = admin(&fx.server).await;
    let mut watch = admin
        .watch("orders", Duration::from_secs(3600))
        .await
        .unwrap();
    // The watch's connection is the only one subscribed to a channel.
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut fx.raw())
        .unwrap();
    assert_eq!(killed, 1);
    let err = within(PATIENCE, "the watch notices", watch.next())
        .await
        .unwrap_err();
    assert!(err.is_connection(), "{err:?}");
}

/// Lets `watch` poll for `quiet` (many intervals) and fails on any event it reports: nothing
/// changed meanwhile.
async fn nothing_for(watch: &mut fencelock::admin::Watch, quiet: Duration) {
    if let Ok(event) = tokio::time::timeout(quiet, watch.next()).await {
        panic!("an event while nothing changed: {event:?}");
    }
}

/// Each change of a hold is one event, however long the hold sits still between changes
/// (the watch polls many times meanwhile, and reports nothing).
#[tokio::test]
async fn a_watch_reports_each_change_once_and_nothing_while_the_hold_sits_still() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let admin = admin(&fx.server).await;
    let mut watch = admin
        .watch("orders", Duration::from_millis(10))
        .await
        .unwrap();
    let guard = client.lock("orders").unwrap().acquire().await.unwrap();
    let id = guard.holder_id().to_owned();
    let event = within(PATIENCE, "acquired", watch.next()).await.unwrap();
    assert!(
        matches!(&event, LockEvent::Acquired { holder, token }
            if holder.id == id && holder.count == 1 && *token == Some(guard.token())),
        "{event:?}"
    );
    nothing_for(&mut watch, Duration::from_millis(200)).await;
    let nested = guard.reenter().await.unwrap();
    let event = within(PATIENCE, "reentered", watch.next()).await.unwrap();
    assert!(
        matches!(&event, LockEvent::Reentered { holder } if holder.count == 2),
        "{event:?}"
    );
    nothing_for(&mut watch, Duration::from_millis(200)).await;
    nested.release().await.unwrap();
    let event = within(PATIENCE, "exited", watch.next()).await.unwrap();
    assert!(
        matches!(&event, LockEvent::Exited { holder } if holder.count == 1),
        "{event:?}"
    );
    nothing_for(&mut watch, Duration::from_millis(200)).await;
    let token = guard.token();
    guard.release().await.unwrap();
    let event = within(PATIENCE, "released", watch.next()).await.unwrap();
    // A release is told from an expiry by the message the release publishes.
    assert!(
        matches!(&event, LockEvent::Released { holder: Some(holder), token: Some(t) }
            if holder.id == id && *t == token),
        "a release seen as {event:?}: did the release publish its wake-up?"
    );
}

/// Any hash at a lock key with a holder or a token is a hold, and its lease is read with it,
/// whether fencelock's scripts wrote it or someone else did.
#[tokio::test]
async fn a_hand_written_hold_with_an_expiry_shows_its_lease() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let key = free_lock_key(&fx, &client, "orders").await;
    let admin = admin(&fx.server).await;
    for (field, value) in [("someone:1", "1"), ("~token", "5")] {
        let _: () = redis::pipe()
            .atomic()
            .del(&key)
            .hset(&key, field, value)
            .pexpire(&key, 60_000)
            .query(&mut fx.raw())
            .unwrap();
        let lock = admin.lock("orders").await.unwrap().lock;
        assert!(lock.is_held(), "{field}: {lock:?}");
        let ttl = lock
            .ttl
            .unwrap_or_else(|| panic!("{field}: no lease in {lock:?}"));
        assert!(
            ttl > Duration::from_secs(30) && ttl <= Duration::from_secs(60),
            "{field}: {ttl:?}"
        );
    }
}

/// A stand-in for a server older than fencelock supports, which no test machine runs: it
/// speaks RESP2 only (no `HELLO`) and answers `INFO` with `version`, `PING`, `TIME` and an
/// empty `CONFIG GET`, which is all the doctor needs to judge it.
async fn old_server(version: &'static str) -> std::net::SocketAddr {
    fake_server(version, Duration::ZERO).await
}

/// The same stand-in with a clock `ahead` of this machine's, whose first `TIME` reply on a
/// connection takes 300 ms (a slow sample among fast ones).
async fn fake_server(version: &'static str, ahead: Duration) -> std::net::SocketAddr {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut times = 0;
                let (read, mut write) = socket.into_split();
                let mut read = BufReader::new(read);
                loop {
                    let mut line = String::new();
                    if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let count: usize = line.trim_start_matches('*').trim().parse().unwrap();
                    let mut args = Vec::with_capacity(count);
                    for _ in 0..count {
                        line.clear();
                        read.read_line(&mut line).await.unwrap();
                        let len: usize = line.trim_start_matches('$').trim().parse().unwrap();
                        let mut arg = vec![0; len + 2];
                        read.read_exact(&mut arg).await.unwrap();
                        arg.truncate(len);
                        args.push(String::from_utf8(arg).unwrap().to_ascii_uppercase());
                    }
                    let bulk = |text: String| format!("${}\r\n{text}\r\n", text.len());
                    let reply = match args[0].as_str() {
                        "PING" => "+PONG\r\n".to_owned(),
                        "CLIENT" => "+OK\r\n".to_owned(),
                        "CONFIG" => "*0\r\n".to_owned(),
                        "INFO" => bulk(format!(
                            "redis_version:{version}\r\nrole:master\r\nconnected_slaves:0\r\n\
                             cluster_enabled:0\r\n"
                        )),
                        "TIME" => {
                            times += 1;
                            if times == 1 {
                                tokio::time::sleep(Duration::from_millis(300)).await;
                            }
                            let now = std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .unwrap()
                                + ahead;
                            format!(
                                "*2\r\n{}{}",
                                bulk(now.as_secs().to_string()),
                                bulk(now.subsec_micros().to_string())
                            )
                        }
                        other => format!("-ERR unknown command '{other}'\r\n"),
                    };
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A Redis older than 6.2 is a FAIL (the scripts and RESP3 pushes need it); 6.2.0 itself is
/// supported for one server and Sentinel, and from 7.0 for a cluster too (sharded pub/sub).
#[tokio::test]
async fn the_doctor_fails_a_redis_older_than_6_2_and_says_what_6_2_serves() {
    let cluster = "not a cluster client (sharded pub/sub: Redis 7.0+)";
    for (version, status, says, not_said) in [
        (
            "5.0.14",
            Status::Fail,
            "Redis 5.0.14: fencelock needs Redis 6.2 or newer",
            cluster,
        ),
        ("6.2.0", Status::Ok, cluster, "needs Redis 6.2"),
        ("7.0.0", Status::Ok, "Redis 7.0.0 (tested on ", cluster),
    ] {
        let addr = old_server(version).await;
        let admin = within(
            PATIENCE,
            "connect",
            Admin::connect(&format!("redis://{addr}/")),
        )
        .await
        .unwrap();
        let checks = doctor(&admin, 1).await;
        assert_eq!(check(&checks, "protocol").status, Status::Fail);
        let found = check(&checks, "version");
        assert_eq!(found.status, status, "{found}");
        assert!(found.finding.contains(says), "{found}");
        assert!(!found.finding.contains(not_said), "{found}");
    }
}

/// The clock check trusts its fastest `TIME` sample (a slow one says little about the
/// offset), and warns about a server clock more than a second off.
#[tokio::test]
async fn the_doctor_judges_the_clock_by_its_fastest_sample_and_warns_when_it_is_off() {
    let numbers = |check: &Check| -> (f64, f64) {
        let found: Vec<f64> = check
            .finding
            .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
            .filter_map(|part| part.parse().ok())
            .collect();
        match found[..] {
            [offset, bound] => (offset, bound),
            _ => panic!("{check}"),
        }
    };
    for (ahead, status) in [(0, Status::Ok), (5, Status::Warn)] {
        let addr = fake_server("7.0.0", Duration::from_secs(ahead)).await;
        let admin = within(
            PATIENCE,
            "connect",
            Admin::connect(&format!("redis://{addr}/")),
        )
        .await
        .unwrap();
        let checks = doctor(&admin, 1).await;
        let clock = check(&checks, "clock");
        assert_eq!(clock.status, status, "{clock}");
        let (offset, bound) = numbers(clock);
        // Not the 300 ms sample: its uncertainty would be 150 ms.
        assert!(bound < 50.0, "{clock}");
        assert!(
            (offset - ahead as f64 * 1000.0).abs() <= bound + 0.002,
            "{clock}"
        );
    }
}

/// A client per way of keeping hold deadlines this server offers: the lease zset always, field
/// expiry where the server has it (said as a skip elsewhere). Each works under its own prefix,
/// so an admin with that prefix lists only what the client made.
async fn hold_clients(fx: &Fixture, test: &str) -> Vec<(HoldExpiry, LockClient)> {
    let mut ways = vec![HoldExpiry::LeaseZset];
    if requires(Feature::HashFieldExpiry, test) {
        ways.push(HoldExpiry::FieldExpiry);
    }
    let mut clients = Vec::new();
    for way in ways {
        let builder = fx.builder().prefix(format!("{way:?}:")).hold_expiry(way);
        let client = within(PATIENCE, "connect", builder.connect())
            .await
            .expect("connect");
        assert_eq!(client.hold_expiry(), way);
        clients.push((way, client));
    }
    clients
}

/// The server clock in milliseconds.
fn server_ms(raw: &mut redis::Connection) -> f64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(raw).unwrap();
    (secs * 1000) as f64 + micros as f64 / 1000.0
}

/// The deadline (server ms) Redis keeps for one hold, whichever way it is kept.
fn hold_deadline(raw: &mut redis::Connection, way: HoldExpiry, hash: &[u8], holder: &str) -> f64 {
    if way == HoldExpiry::FieldExpiry {
        let at: Vec<i64> = redis::cmd("HPEXPIRETIME")
            .arg(hash)
            .arg("FIELDS")
            .arg(1)
            .arg(holder)
            .query(raw)
            .unwrap();
        at[0] as f64
    } else {
        // `...}sem:NAME` -> `...}sem-leases:NAME`, `...}rw:NAME` -> `...}rw-leases:NAME`.
        let brace = hash.iter().position(|&b| b == b'}').unwrap();
        let colon = brace + hash[brace..].iter().position(|&b| b == b':').unwrap();
        let leases = [&hash[..colon], b"-leases", &hash[colon..]].concat();
        raw.zscore(leases, holder).unwrap()
    }
}

/// Each hold's lease left is its deadline less the server clock of the read: bracketed by the
/// clock read just before and just after it.
fn assert_lease_left(hold: &HoldEntry, deadline: f64, before_ms: f64, after_ms: f64) {
    let left = hold
        .lease_left
        .unwrap_or_else(|| panic!("{hold:?} shows no lease"))
        .as_secs_f64()
        * 1000.0;
    assert!(
        left <= deadline - before_ms + 1.0 && left >= deadline - after_ms - 1.0,
        "{hold:?}: {left} ms left, deadline {deadline}, read between {before_ms} and {after_ms}"
    );
}

#[tokio::test]
async fn holds_of_a_semaphore_are_read_with_permits_tokens_and_leases_oldest_first() {
    let fx = Fixture::start();
    let test = "holds_of_a_semaphore_are_read_with_permits_tokens_and_leases_oldest_first";
    for (way, client) in hold_clients(&fx, test).await {
        let prefix = format!("{way:?}:");
        let admin = Admin::connect_with_prefix(&fx.server.url(), &prefix)
            .await
            .unwrap();
        let words = match way {
            HoldExpiry::FieldExpiry => "deadlines as hash-field expiry",
            _ => "deadlines in a lease zset",
        };
        let pool = client.semaphore("pool", 5).unwrap();
        let two = pool.acquire(2).await.unwrap();
        let one = pool.acquire(1).await.unwrap();
        // Not renewed by the watchdog: its lease runs out while the others stay.
        let short = pool
            .with_lease(Duration::from_millis(700))
            .unwrap()
            .acquire(1)
            .await
            .unwrap();
        let other = client.semaphore("other", 1).unwrap();
        let other_held = other.acquire(1).await.unwrap();
        let _reader = client
            .rwlock("not-a-semaphore")
            .unwrap()
            .read()
            .await
            .unwrap();

        let mut raw = fx.raw();
        let hash = fx.keys(&format!("{prefix}{{*}}sem:pool")).pop().unwrap();
        let before = server_ms(&mut raw);
        let info = admin.semaphore("pool").await.unwrap().expect("in use");
        let after = server_ms(&mut raw);
        assert_eq!(info.name, b"pool");
        assert_eq!(
            (info.limit, info.used, info.expiry),
            (5, 4, way),
            "{way:?}: {info:?}"
        );
        // Oldest lease first (by the deadlines Redis keeps): the short one first.
        assert_eq!(info.holds.len(), 3, "{way:?}: {info:?}");
        assert_eq!(info.holds[0].holder, short.holder_id(), "{way:?}: {info:?}");
        let mut last_deadline = 0.0;
        for permit in [&short, &two, &one] {
            let hold = info
                .holds
                .iter()
                .find(|h| h.holder == permit.holder_id())
                .unwrap_or_else(|| panic!("{way:?}: no {} in {info:?}", permit.holder_id()));
            assert_eq!(hold.permits, permit.permits(), "{way:?}: {hold:?}");
            assert_eq!(hold.token, Some(permit.token()), "{way:?}: {hold:?}");
        }
        for hold in &info.holds {
            let deadline = hold_deadline(&mut raw, way, &hash, &hold.holder);
            assert!(
                deadline >= last_deadline,
                "{way:?}: not oldest first: {info:?}"
            );
            last_deadline = deadline;
            assert_lease_left(hold, deadline, before, after);
        }
        let text = info.to_string();
        let head = format!("pool  4 of 5 permits in use  ({words})");
        assert!(text.starts_with(&head), "{way:?}: {text}");
        let line = format!(
            "\n  {}  permits 2  token {}  held ",
            two.holder_id(),
            two.token()
        );
        assert!(text.contains(&line), "{way:?}: {text}");
        assert!(text.contains("  lease "), "{way:?}: {text}");
        let held = info
            .holds
            .iter()
            .find(|h| h.holder == two.holder_id())
            .unwrap();
        assert!(
            held.held_for.unwrap() < Duration::from_secs(60),
            "{way:?}: {held:?}"
        );
        assert_eq!(text.lines().count(), 4, "{way:?}: {text}");

        // The list: every semaphore under the prefix by name, and no read-write lock.
        let listed = admin.semaphores().await.unwrap();
        let names: Vec<&[u8]> = listed.iter().map(|s| &s.name[..]).collect();
        assert_eq!(names, [&b"other"[..], b"pool"], "{way:?}");
        // Read as one is read (the leases left aside: they shrink between the reads).
        let holders = |info: &SemaphoreInfo| -> Vec<(String, u32, Option<FencingToken>)> {
            let holds = info.holds.iter();
            holds
                .map(|h| (h.holder.clone(), h.permits, h.token))
                .collect()
        };
        let one_read = admin.semaphore("pool").await.unwrap().unwrap();
        assert_eq!(holders(&listed[1]), holders(&one_read));
        assert_eq!(
            (listed[1].limit, listed[1].used, listed[1].expiry),
            (5, 4, way)
        );
        assert_eq!(listed[0].holds[0].holder, other_held.holder_id());

        // The short lease runs out with no script run since: the zset way still has its field
        // and shows it expired, field expiry has dropped it; neither counts its permit.
        let lapsed = short.valid_until() + Duration::from_millis(300);
        tokio::time::sleep_until(lapsed.into()).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let info = admin.semaphore("pool").await.unwrap().unwrap();
        assert_eq!(info.used, 3, "{way:?}: {info:?}");
        let text = info.to_string();
        assert!(text.starts_with("pool  3 of 5 permits in use"), "{text}");
        if way == HoldExpiry::FieldExpiry {
            assert_eq!(info.holds.len(), 2, "{info:?}");
        } else {
            assert_eq!(info.holds[0].holder, short.holder_id());
            assert_eq!(info.holds[0].lease_left, None, "{info:?}");
            let line = format!(
                "\n  {}  permits 1  token {}  held ",
                short.holder_id(),
                short.token()
            );
            assert!(text.contains(&line), "{text}");
            let line = text
                .lines()
                .find(|l| l.contains(short.holder_id()))
                .unwrap();
            // Then the client's name, registered at connect.
            assert!(line.contains("  expired  client "), "{text}");
        }
        drop(short);

        // An operator's release frees one hold by its id, once, however often it was entered;
        // the holder learns it.
        let nested = one.reenter().await.unwrap();
        let released = admin
            .release_hold(HoldKind::Semaphore, "pool", one.holder_id())
            .await
            .unwrap();
        assert_eq!(released, HoldRelease::Released);
        assert!(nested.release().await.unwrap_err().is_not_held());
        let again = admin
            .release_hold(HoldKind::Semaphore, "pool", one.holder_id())
            .await
            .unwrap();
        assert_eq!(again, HoldRelease::NotHeld);
        // The semaphore's own fields are no holds: nothing is touched.
        for field in ["~limit", "~used", "~until", "~expiry"] {
            let released = admin.release_hold(HoldKind::Semaphore, "pool", field).await;
            assert_eq!(released.unwrap(), HoldRelease::NotHeld, "{field}");
        }
        assert_eq!(admin.semaphore("pool").await.unwrap().unwrap().limit, 5);
        // The same id under the other kind names another key: nothing there.
        let elsewhere = admin
            .release_hold(HoldKind::RwLock, "pool", two.holder_id())
            .await
            .unwrap();
        assert_eq!(elsewhere, HoldRelease::NotHeld);
        assert!(one.release().await.unwrap_err().is_not_held());
        let info = admin.semaphore("pool").await.unwrap().unwrap();
        assert_eq!(info.used, 2, "{info:?}");

        // The limit changes atomically and answers what it was; an idle one is left alone.
        assert_eq!(admin.set_semaphore_limit("pool", 7).await.unwrap(), Some(5));
        assert_eq!(admin.semaphore("pool").await.unwrap().unwrap().limit, 7);
        assert_eq!(admin.set_semaphore_limit("idle", 7).await.unwrap(), None);
        assert!(admin.semaphore("idle").await.unwrap().is_none());
        let zero = admin.set_semaphore_limit("pool", 0).await.unwrap_err();
        assert!(matches!(zero, Error::InvalidPermits { .. }), "{zero:?}");
        assert_eq!(admin.semaphore("pool").await.unwrap().unwrap().limit, 7);

        two.release().await.unwrap();
        other_held.release().await.unwrap();
        let gone = admin.semaphore("other").await.unwrap();
        assert!(
            gone.as_ref()
                .is_none_or(|s| s.holds.is_empty() && s.used == 0),
            "{way:?}: {gone:?}"
        );
    }
}

#[tokio::test]
async fn holds_of_a_read_write_lock_show_its_writer_readers_and_live_waiting_writers() {
    let fx = Fixture::start();
    let test = "holds_of_a_read_write_lock_show_its_writer_readers_and_live_waiting_writers";
    for (way, client) in hold_clients(&fx, test).await {
        let prefix = format!("{way:?}:");
        let admin = Admin::connect_with_prefix(&fx.server.url(), &prefix)
            .await
            .unwrap();
        let doc = client.rwlock("doc").unwrap();
        let _permit = client
            .semaphore("not-a-lock", 1)
            .unwrap()
            .acquire(1)
            .await
            .unwrap();
        let write = doc.write().await.unwrap();
        let mut raw = fx.raw();
        let hash = fx.keys(&format!("{prefix}{{*}}rw:doc")).pop().unwrap();
        let before = server_ms(&mut raw);
        let info = admin.rwlock("doc").await.unwrap().expect("in use");
        let after = server_ms(&mut raw);
        let writer = info.writer.clone().expect("a writer");
        assert_eq!(writer.holder, write.holder_id());
        assert_eq!(writer.token, Some(write.token()));
        assert_eq!(writer.permits, 1_000_000_000);
        let deadline = hold_deadline(&mut raw, way, &hash, &writer.holder);
        assert_lease_left(&writer, deadline, before, after);
        assert!(info.readers.is_empty() && info.waiting_writers.is_empty());
        assert_eq!(info.expiry, way);
        let text = info.to_string();
        assert!(
            text.starts_with("doc  0 readers  writer yes  0 waiting writers  (deadlines "),
            "{text}"
        );
        // A writer's line has no permit count: a billion is the layout's, not the writer's.
        assert!(
            text.contains(&format!("\n  writer {}  token ", write.holder_id())),
            "{text}"
        );

        // Downgraded and entered again (an entry count beside the hold, never a hold of its
        // own), plus another reader.
        let first = write.downgrade().await.unwrap();
        let again = first.reenter().await.unwrap();
        let second = doc.read().await.unwrap();
        let info = admin.rwlock("doc").await.unwrap().unwrap();
        assert!(info.writer.is_none(), "{way:?}: {info:?}");
        let readers: Vec<&str> = info.readers.iter().map(|r| r.holder.as_str()).collect();
        assert_eq!(readers, [first.holder_id(), second.holder_id()], "{way:?}");
        assert!(info.readers.iter().all(|r| r.permits == 1), "{info:?}");

        // Three writers wait; a mark whose time has passed (its writer long gone) is not shown.
        let writers: Vec<_> = (0..3)
            .map(|_| {
                let doc = doc.clone();
                tokio::spawn(async move {
                    let write = doc.write_timeout(Duration::from_secs(20)).await.unwrap();
                    let token = write.token();
                    write.release().await.unwrap();
                    token
                })
            })
            .collect();
        let writers_key = [&hash[..hash.len() - b"rw:doc".len()], b"rw-writers:doc"].concat();
        let seen = within(PATIENCE, "the waiting writers' marks", async {
            loop {
                let marks: Vec<String> = raw.zrange(&writers_key, 0, -1).unwrap();
                if marks.len() == 3 {
                    break marks;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        let _: () = raw.zadd(&writers_key, "ghost:1", 1).unwrap();
        let info = admin.rwlock("doc").await.unwrap().unwrap();
        assert_eq!(info.waiting_writers, seen, "{way:?}: {info:?}");
        let text = info.to_string();
        assert!(
            text.starts_with("doc  2 readers  writer no  3 waiting writers  ("),
            "{text}"
        );
        assert!(
            text.contains(&format!("\n  reader {}  token ", second.holder_id())),
            "{text}"
        );
        assert!(!text.contains("permits"), "{text}");
        for waiting in &seen {
            let line = format!("\n  waiting writer {waiting}");
            assert!(text.contains(&line), "{text}");
        }
        assert_eq!(text.lines().count(), 6, "{text}");

        // The list: every read-write lock under the prefix, and no semaphore.
        let listed = admin.rwlocks().await.unwrap();
        assert_eq!(listed.len(), 1, "{way:?}: {listed:?}");
        assert_eq!(listed[0].name, b"doc");

        // An operator frees the second reader; the first leaves entry by entry; the writers
        // get in, each after the readers' writes and the one before.
        let released = admin
            .release_hold(HoldKind::RwLock, "doc", second.holder_id())
            .await
            .unwrap();
        assert_eq!(released, HoldRelease::Released);
        again.release().await.unwrap();
        first.release().await.unwrap();
        let mut tokens = Vec::new();
        for writer in writers {
            tokens.push(
                within(PATIENCE, "a writer after the readers", writer)
                    .await
                    .unwrap(),
            );
        }
        tokens.sort();
        assert!(
            tokens[0] > second.token(),
            "{tokens:?} after {}",
            second.token()
        );
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
        drop(second);
        let _: () = raw.del(&writers_key).unwrap();
    }
}

/// Every call that takes a name refuses an unusable one before it reaches Redis.
#[tokio::test]
async fn holds_by_an_unusable_name_are_refused() {
    let fx = Fixture::start();
    let admin = admin(&fx.server).await;
    let name = "";
    let errors = [
        admin.semaphore(name).await.unwrap_err(),
        admin.rwlock(name).await.unwrap_err(),
        admin
            .release_hold(HoldKind::Semaphore, name, "someone:1")
            .await
            .unwrap_err(),
        admin.set_semaphore_limit(name, 3).await.unwrap_err(),
    ];
    for err in errors {
        assert!(matches!(err, Error::InvalidName { .. }), "{err:?}");
    }
    assert!(fx.keys("*").is_empty());
}

/// A hash whose `~expiry` names another way than field expiry keeps its deadlines in the lease
/// zset, as the scripts read it (`sem_mode`): the operator reads it so too.
#[tokio::test]
async fn holds_of_a_hash_that_names_another_way_are_read_from_the_lease_zset() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let permit = client
        .semaphore("pool", 2)
        .unwrap()
        .acquire(1)
        .await
        .unwrap();
    let hash = fx.keys("fencelock:{*}sem:pool").pop().unwrap();
    permit.release().await.unwrap();
    let leases = [&hash[..hash.len() - b"sem:pool".len()], b"sem-leases:pool"].concat();
    let mut raw = fx.raw();
    let deadline = server_ms(&mut raw) as u64 + 60_000;
    let _: () = redis::pipe()
        .atomic()
        .hset_multiple(
            &hash,
            &[
                ("~limit", "2"),
                ("~used", "1"),
                ("~expiry", "zset"),
                ("h:1", "1:7"),
            ],
        )
        .zadd(&leases, "h:1", deadline)
        .pexpire(&hash, 60_000)
        .pexpire(&leases, 60_000)
        .query(&mut raw)
        .unwrap();
    let admin = admin(&fx.server).await;
    let info = admin.semaphore("pool").await.unwrap().expect("in use");
    assert_eq!(info.expiry, HoldExpiry::LeaseZset, "{info:?}");
    assert_eq!(
        (info.limit, info.used, info.holds.len()),
        (2, 1, 1),
        "{info:?}"
    );
    assert_eq!(info.holds[0].token.map(|t| t.get()), Some(7));
    let left = info.holds[0].lease_left.expect("a lease");
    assert!(left > Duration::from_secs(50), "{left:?}");
}

/// An operator forgets the run they were shown: a retry that took the key over meanwhile and
/// stored its result is kept (forgetting it would let a duplicate run the request again).
#[tokio::test]
async fn forgetting_a_key_keeps_a_run_that_took_it_over_since_it_was_shown() {
    use fencelock::admin::Forgotten;
    use fencelock::{Failure, IdempotencyOptions};
    let fx = Fixture::start();
    let client = fx.client().await;
    let admin = admin(&fx.server).await;
    let options = IdempotencyOptions::new(Duration::from_secs(5));
    let payments = client.idempotency("payments", options).unwrap();
    let declined = async |_| Err::<Vec<u8>, _>(Failure::Retry("declined"));
    assert!(payments.run("pay-9", b"fp", declined).await.unwrap().ran());
    let shown = admin.idempotency_key(b"payments", b"pay-9").await.unwrap();
    let shown = shown.unwrap().record.token();
    let charged = async |_| Ok::<_, Failure<()>>(b"charged".to_vec());
    assert!(payments.run("pay-9", b"fp", charged).await.unwrap().ran());

    let forgotten = admin.forget_idempotency_key(b"payments", b"pay-9", Some(shown));
    let forgotten = forgotten.await.unwrap();
    assert!(matches!(forgotten, Forgotten::OtherRun(_)), "{forgotten:?}");
    let kept = admin.idempotency_key(b"payments", b"pay-9").await.unwrap();
    let now = kept.unwrap().record.token();
    assert!(now > shown);
    let forgotten = admin.forget_idempotency_key(b"payments", b"pay-9", Some(now));
    assert!(matches!(forgotten.await.unwrap(), Forgotten::Deleted(_)));
    assert!(admin
        .idempotency_key(b"payments", b"pay-9")
        .await
        .unwrap()
        .is_none());
}
