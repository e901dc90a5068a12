//! The operator's API (`fencelock::admin`) on real servers: what it reads from lock hashes,
//! how it pages through a large keyspace, what the doctor finds on servers configured in
//! each way it judges, and how it behaves on a slow or broken connection.

mod common;

use std::time::Duration;

use common::deadline::within;
use common::{key_slot_of_lock, Fixture};
use fencelock::admin::{Admin, Check, Status};
use fencelock_testing::{Direction, FaultProxy, RedisServer};
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
    let client = fx.client().await;
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
    let guard = client.lock("orders").unwrap().acquire().await.unwrap();
    let key = fx.lock_key("orders").unwrap();
    guard.release().await.unwrap();
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
        within(PATIENCE, "each queued candidate leads in turn", candidate)
            .await
            .unwrap();
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
    assert!(line.contains(&format!(" (finished {ms})  kept ")), "{line}");
    assert!(
        line.starts_with("report  tick 1800000000000  done  runner "),
        "{line}"
    );
}
