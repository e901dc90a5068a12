//! Server processes sharing nothing but Redis (and the database their handler writes): this
//! test binary started again as a payment server, its rows fenced in PostgreSQL; killed with
//! SIGKILL or frozen with SIGSTOP mid-handler.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Extension, Router};
use fencelock::sql::fence_param;
use fencelock::{Idempotency, IdempotencyOptions, LockClient, RunRecord};
use fencelock_http::{stored_key, IdempotencyLayer, IdempotencyRun};
use fencelock_testing::{send_signal, PostgresServer, RedisServer, Signal};
use tokio::sync::{Mutex, Semaphore};

use crate::support::{namespace, pay, serve, Reply};

/// The environment variable that makes [`serve_as_child`] serve: the Redis URL, the
/// PostgreSQL URL, the namespace and `at_most_for` in ms, separated by spaces.
const SERVE_ENV: &str = "FENCELOCK_HTTP_TEST_SERVE";

const SCHEMA: &str = "CREATE TABLE payments (
    id     BYTEA PRIMARY KEY,  -- the key in its scope: IdempotencyRun::stored_key
    amount BIGINT NOT NULL,
    fence  BIGINT NOT NULL,
    writes INT NOT NULL DEFAULT 1
);
CREATE TABLE refused (id BYTEA NOT NULL, token BIGINT NOT NULL);
CREATE TABLE waiting (id BYTEA NOT NULL, token BIGINT NOT NULL)";

/// Connections to the database, reused by the handler's calls.
type Pool = Arc<(String, Mutex<Vec<tokio_postgres::Client>>)>;

/// The child servers' handler: waits `x-delay-ms` (having recorded in `waiting` that it does),
/// then writes the payment row fenced by the run's token (the `fencelock::sql`
/// insert-or-update); 201 when written, 503 when a newer run's token is on the row (stale: the
/// key is left to a retry; the refusal is recorded).
async fn pay_handler(
    State(pool): State<Pool>,
    Extension(run): Extension<IdempotencyRun>,
    headers: HeaderMap,
    amount: String,
) -> (StatusCode, String) {
    let delay = headers
        .get("x-delay-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let amount: i64 = amount.parse().unwrap();
    let taken = pool.1.lock().await.pop();
    let db = match taken {
        Some(db) => db,
        None => {
            let (db, connection) = tokio_postgres::connect(&pool.0, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            db
        }
    };
    if let Some(ms) = delay {
        db.execute(
            "INSERT INTO waiting (id, token) VALUES ($1, $2)",
            &[&run.stored_key(), &fence_param(run.token())],
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let written = db
        .query_opt(
            "INSERT INTO payments (id, amount, fence) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO UPDATE SET amount = excluded.amount, fence = excluded.fence, \
             writes = payments.writes + 1 WHERE payments.fence <= excluded.fence RETURNING id",
            &[&run.stored_key(), &amount, &fence_param(run.token())],
        )
        .await
        .unwrap();
    if written.is_none() {
        // What the test checks: this run's write reached the database and the fence refused it.
        db.execute(
            "INSERT INTO refused (id, token) VALUES ($1, $2)",
            &[&run.stored_key(), &fence_param(run.token())],
        )
        .await
        .unwrap();
    }
    pool.1.lock().await.push(db);
    match written {
        Some(_) => (
            StatusCode::CREATED,
            format!(
                "paid {amount} as {} by {} with token {}",
                run.key(),
                std::process::id(),
                run.token()
            ),
        ),
        None => (StatusCode::SERVICE_UNAVAILABLE, "superseded".into()),
    }
}

/// The child server of the multi-process tests: with [`SERVE_ENV`] set (they start this binary
/// again with it), prints `listening on ADDR` and serves until it is killed. Run as a test, it
/// checks exactly that: a child it starts says where it listens, runs a keyed payment, and
/// replays it.
#[test]
fn serve_as_child() {
    let Ok(settings) = std::env::var(SERVE_ENV) else {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        return runtime.block_on(a_child_serves_and_replays_a_payment());
    };
    let [redis, postgres, namespace, at_most_for] = settings.split(' ').collect::<Vec<_>>()[..]
    else {
        panic!("{SERVE_ENV} has four fields");
    };
    let at_most_for = Duration::from_millis(at_most_for.parse().unwrap());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = LockClient::builder(redis).connect().await.unwrap();
        let keys = client
            .idempotency(namespace, IdempotencyOptions::new(at_most_for))
            .unwrap();
        let pool: Pool = Arc::new((postgres.to_owned(), Mutex::new(Vec::new())));
        let app = Router::new()
            .route("/payments", post(pay_handler))
            .with_state(pool)
            .layer(IdempotencyLayer::new(keys).require_key(true));
        let (addr, task) = serve(app).await;
        println!("listening on {addr}");
        task.await.unwrap();
    });
}

/// What [`serve_as_child`] checks when run as a test.
async fn a_child_serves_and_replays_a_payment() {
    let redis = RedisServer::start().unwrap();
    let postgres = PostgresServer::start().unwrap();
    database(&postgres)
        .await
        .batch_execute(SCHEMA)
        .await
        .unwrap();
    let servers = Servers::start(
        1,
        &redis,
        &postgres,
        &namespace("child"),
        Duration::from_secs(10),
    );
    let first = pay(servers.addrs[0], "child-1", "100", &[]).await;
    assert_eq!(first.status, 201, "{first:?}");
    let again = pay(servers.addrs[0], "child-1", "100", &[]).await;
    assert_eq!(again.answer(), first.answer(), "{again:?}");
    assert!(again.replayed(), "{again:?}");
}

/// Child servers, killed (and reaped) when dropped, whatever the test did to them.
struct Servers {
    children: Vec<Child>,
    addrs: Vec<SocketAddr>,
}

impl Servers {
    fn start(
        count: usize,
        redis: &RedisServer,
        postgres: &PostgresServer,
        namespace: &str,
        at_most_for: Duration,
    ) -> Servers {
        let mut servers = Servers {
            children: Vec::new(),
            addrs: Vec::new(),
        };
        let settings = format!(
            "{} {} {namespace} {}",
            redis.url(),
            postgres.url(),
            at_most_for.as_millis()
        );
        for _ in 0..count {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "processes::serve_as_child", "--nocapture"])
                .env(SERVE_ENV, &settings)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let stdout = child.stdout.take().unwrap();
            servers.children.push(child);
            let addr = BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .find_map(|line| {
                    line.strip_prefix("listening on ")
                        .map(|addr| addr.parse().unwrap())
                })
                .expect("the child server says where it listens");
            servers.addrs.push(addr);
        }
        servers
    }

    fn pid(&self, server: usize) -> u32 {
        self.children[server].id()
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A small deterministic random walk (xorshift), seeded per run and printed, so that a failing
/// schedule can be run again.
struct Random(u64);

impl Random {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn seed() -> u64 {
    let seed = std::env::var("FENCELOCK_HTTP_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            u64::from(
                std::time::SystemTime::UNIX_EPOCH
                    .elapsed()
                    .unwrap()
                    .subsec_nanos(),
            ) | 1
        });
    println!("seed {seed} (FENCELOCK_HTTP_TEST_SEED)");
    seed
}

async fn database(postgres: &PostgresServer) -> tokio_postgres::Client {
    let (db, connection) = tokio_postgres::connect(&postgres.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    db
}

/// The row of the payment sent with the key `key` (no scope): its amount, fence and how many
/// writes it took.
async fn row(db: &tokio_postgres::Client, key: &str) -> Option<(i64, i64, i32)> {
    let row = db
        .query_opt(
            "SELECT amount, fence, writes FROM payments WHERE id = $1",
            &[&fencelock_http::stored_key(b"", key)],
        )
        .await
        .unwrap()?;
    Some((row.get(0), row.get(1), row.get(2)))
}

/// The token the child's handler named in its body.
fn token_of(reply: &Reply) -> u64 {
    reply.text().rsplit(' ').next().unwrap().parse().unwrap()
}

const PAYMENTS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_servers_sharing_only_redis_run_each_of_200_payments_once() {
    let redis = RedisServer::start().unwrap();
    let postgres = PostgresServer::start().unwrap();
    let db = database(&postgres).await;
    db.batch_execute(SCHEMA).await.unwrap();
    let servers = Servers::start(
        4,
        &redis,
        &postgres,
        &namespace("multi"),
        Duration::from_secs(10),
    );
    let mut random = Random(seed());
    // At most 32 payments in flight: each sends three at once, then a fourth.
    let in_flight = Arc::new(Semaphore::new(32));
    let mut payments = Vec::new();
    for n in 0..PAYMENTS {
        let plan: Vec<(SocketAddr, u64, u64)> = (0..4)
            .map(|_| {
                (
                    servers.addrs[usize::try_from(random.below(4)).unwrap()],
                    random.below(15),
                    random.below(20),
                )
            })
            .collect();
        let in_flight = in_flight.clone();
        payments.push(tokio::spawn(async move {
            let _permit = in_flight.acquire().await.unwrap();
            let (key, amount) = (format!("pay-{n}"), (n + 1).to_string());
            let sends: Vec<_> = plan[..3]
                .iter()
                .map(|&(addr, wait, work)| {
                    let (key, amount) = (key.clone(), amount.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                        let work = work.to_string();
                        pay(addr, &key, &amount, &[("x-delay-ms", &work)]).await
                    })
                })
                .collect();
            let mut replies = Vec::new();
            for send in sends {
                replies.push(send.await.unwrap());
            }
            let (addr, wait, _) = plan[3];
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let after = pay(addr, &key, &amount, &[]).await;
            (key, replies, after)
        }));
    }
    let mut conflicts = 0;
    let mut replays = 0;
    for payment in payments {
        let (key, replies, after) = payment.await.unwrap();
        // The one run's reply: the first answer, which every other reply to the key repeats.
        let ran: Vec<&Reply> = replies
            .iter()
            .filter(|r| r.status == 201 && !r.replayed())
            .collect();
        assert_eq!(ran.len(), 1, "{key}: exactly one send ran it: {replies:?}");
        let first = ran[0];
        for reply in &replies {
            match reply.status {
                409 => {
                    assert!(reply.headers.contains_key("retry-after"));
                    conflicts += 1;
                }
                _ => assert_eq!(reply.answer(), first.answer(), "{key}"),
            }
            replays += usize::from(reply.replayed());
        }
        assert!(
            after.replayed(),
            "{key}: the send after completion is a replay"
        );
        assert_eq!(
            after.answer(),
            first.answer(),
            "{key}: byte-identical to the first"
        );
        let (amount, fence, writes) = row(&db, &key).await.expect("the payment's row");
        assert_eq!(
            (amount, writes),
            (
                i64::try_from(key[4..].parse::<usize>().unwrap() + 1).unwrap(),
                1
            )
        );
        assert_eq!(u64::try_from(fence).unwrap(), token_of(first));
    }
    let rows: i64 = db
        .query_one("SELECT COUNT(*) FROM payments", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, i64::try_from(PAYMENTS).unwrap());
    println!(
        "{PAYMENTS} payments: of their concurrent duplicates {conflicts} answered 409 and \
         {replays} were replays; {PAYMENTS} replays after"
    );
    drop(servers);
}

/// Sends `key` to `addr` in the background, with the handler waiting `delay_ms` first; the
/// reply, or `None` when the connection broke (the server was killed).
fn send_in_background(
    addr: SocketAddr,
    key: &'static str,
    delay_ms: u64,
) -> tokio::task::JoinHandle<Option<Reply>> {
    tokio::spawn(async move {
        let delay = delay_ms.to_string();
        let sent =
            tokio::spawn(async move { pay(addr, key, "7", &[("x-delay-ms", &delay)]).await });
        sent.await.ok()
    })
}

#[tokio::test]
async fn a_server_killed_mid_handler_leaves_the_key_to_a_retry_with_a_greater_token() {
    let redis = RedisServer::start().unwrap();
    let postgres = PostgresServer::start().unwrap();
    let db = database(&postgres).await;
    db.batch_execute(SCHEMA).await.unwrap();
    // Long enough that the retry right after the kill still meets the dead run's hold on a
    // loaded machine.
    let (namespace, at_most_for) = (namespace("kill"), Duration::from_millis(2500));
    let servers = Servers::start(2, &redis, &postgres, &namespace, at_most_for);
    let keys = LockClient::builder(redis.url())
        .connect()
        .await
        .unwrap()
        .idempotency(&namespace, IdempotencyOptions::new(at_most_for))
        .unwrap();
    let stored = stored_key(b"", "k");
    let killed = send_in_background(servers.addrs[0], "k", 30_000);
    let first = begun(&keys, &stored).await;
    send_signal(servers.pid(0), Signal::Kill).unwrap();
    assert_eq!(
        killed.await.unwrap(),
        None,
        "the killed server never answered"
    );
    // The dead run's hold stands until `at_most_for` ends: a retry now is told to come back.
    let early = pay(servers.addrs[1], "k", "7", &[]).await;
    assert_eq!(early.status, 409, "{}", early.text());
    tokio::time::sleep(at_most_for).await;
    let retried = pay(servers.addrs[1], "k", "7", &[]).await;
    assert_eq!(retried.status, 201, "{}", retried.text());
    assert!(token_of(&retried) > first.token().get());
    let (_, fence, writes) = row(&db, "k").await.unwrap();
    assert_eq!(
        (u64::try_from(fence).unwrap(), writes),
        (token_of(&retried), 1)
    );
    assert_eq!(
        pay(servers.addrs[1], "k", "7", &[]).await.answer(),
        retried.answer()
    );
}

#[tokio::test]
async fn a_server_frozen_past_at_most_for_has_its_late_write_refused_by_the_fence() {
    let redis = RedisServer::start().unwrap();
    let postgres = PostgresServer::start().unwrap();
    let db = database(&postgres).await;
    db.batch_execute(SCHEMA).await.unwrap();
    let (namespace, at_most_for) = (namespace("stop"), Duration::from_millis(1000));
    let servers = Servers::start(2, &redis, &postgres, &namespace, at_most_for);
    let keys = LockClient::builder(redis.url())
        .connect()
        .await
        .unwrap()
        .idempotency(&namespace, IdempotencyOptions::new(at_most_for))
        .unwrap();
    let stored = stored_key(b"", "s");
    // The frozen server's handler waits 1.5 s before its write; it is stopped meanwhile, and
    // writes once it runs again.
    let frozen = send_in_background(servers.addrs[0], "s", 1500);
    let stale = begun(&keys, &stored).await.token();
    // Stopped in its handler's wait, not before: a server stopped while its run's begin was on
    // the way back could find the run taken over when it runs again, and then rightly never
    // calls the handler, which leaves no late write to refuse.
    in_handler_wait(&db, "s").await;
    send_signal(servers.pid(0), Signal::Stop).unwrap();
    assert_eq!(row(&db, "s").await, None, "stopped before its write");
    tokio::time::sleep(at_most_for + Duration::from_millis(200)).await;
    let newer = pay(servers.addrs[1], "s", "7", &[]).await;
    assert_eq!(newer.status, 201, "{}", newer.text());
    assert!(token_of(&newer) > stale.get());
    send_signal(servers.pid(0), Signal::Cont).unwrap();
    let late = tokio::time::timeout(Duration::from_secs(10), frozen)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // Its write was refused by the row's fence, and its answer is not a payment.
    assert_ne!(late.status, 201, "{late:?}");
    let refused = db
        .query("SELECT id, token FROM refused", &[])
        .await
        .unwrap();
    let refused: Vec<(Vec<u8>, i64)> = refused.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        refused,
        [(fencelock_http::stored_key(b"", "s"), fence_param(stale))],
        "{late:?}"
    );
    let (_, fence, writes) = row(&db, "s").await.unwrap();
    assert_eq!(
        (u64::try_from(fence).unwrap(), writes),
        (token_of(&newer), 1)
    );
    let replay = pay(servers.addrs[1], "s", "7", &[]).await;
    assert!(replay.replayed());
    assert_eq!(replay.answer(), newer.answer());
}

/// Once a child's handler for `key` has recorded that it waits (`x-delay-ms`; polled every
/// 10 ms, at most 5 s).
async fn in_handler_wait(db: &tokio_postgres::Client, key: &str) {
    let stored = fencelock_http::stored_key(b"", key);
    for _ in 0..500 {
        let waiting = db
            .query_opt("SELECT token FROM waiting WHERE id = $1", &[&stored])
            .await
            .unwrap();
        if waiting.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the handler never began its wait");
}

/// The key's record once its run has begun (polled every 10 ms, at most 5 s).
async fn begun(keys: &Idempotency, stored: &[u8]) -> RunRecord {
    for _ in 0..500 {
        if let Some(record) = keys.record(stored).await.unwrap() {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the run never began");
}
