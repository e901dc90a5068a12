//! What every story needs: settings, seeded randomness, failure context, token bookkeeping,
//! lock-server inspection, bounded waiting, and child processes with a control channel.

use std::future::Future;
use std::pin::pin;
use std::process::Stdio;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use fencelock::FencingToken;
use fencelock_testing::{send_signal, RedisServer, Signal};
use redis::AsyncCommands;

use crate::common::ledger::{self, Backend, Journal, Ledger, Summary};

/// The tokio runtime a story runs on, as `#[tokio::test]` would build it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// `flavor = "multi_thread", worker_threads = 2`.
    MultiThread,
    /// `flavor = "current_thread"`.
    CurrentThread,
}

/// Runs `story` once for every selected storage backend ([`Backend::selected`]), all at the
/// same time, each on a thread of its own with a tokio `runtime` of its own and (as every story
/// starts its own) servers of its own: exactly as if each backend were a separate test, run in
/// parallel as the harness runs tests anyway. So one backend's blocking calls, timers and
/// scheduling cannot delay another's, and the suite takes about as long per story as its
/// slowest backend rather than their sum. Waits for all of them; then fails with the first
/// failure (each failure's message names its backend, and its thread is `story-<backend>`).
pub fn on_each_backend<F, Fut>(runtime: Runtime, story: F)
where
    F: Fn(Backend) -> Fut + Copy + Send + 'static,
    Fut: Future<Output = ()>,
{
    let runs: Vec<_> = Backend::selected()
        .into_iter()
        .map(|backend| {
            let thread = std::thread::Builder::new()
                .name(format!("story-{}", backend.name()))
                .spawn(move || {
                    let mut builder = match runtime {
                        Runtime::MultiThread => {
                            let mut builder = tokio::runtime::Builder::new_multi_thread();
                            builder.worker_threads(2);
                            builder
                        }
                        Runtime::CurrentThread => tokio::runtime::Builder::new_current_thread(),
                    };
                    builder
                        .enable_all()
                        .build()
                        .expect("a tokio runtime for the story")
                        .block_on(story(backend));
                })
                .expect("start a story thread");
            (backend, thread)
        })
        .collect();
    let mut failures = Vec::new();
    for (backend, thread) in runs {
        if let Err(panic) = thread.join() {
            failures.push((backend, panic));
        }
    }
    if !failures.is_empty() {
        let failed: Vec<_> = failures.iter().map(|(backend, _)| backend.name()).collect();
        eprintln!("the story failed on {failed:?}");
        std::panic::resume_unwind(failures.swap_remove(0).1);
    }
}

/// Iterations per story; CI runs the default.
pub const ITERATIONS_ENV: &str = "FENCELOCK_STORY_ITERATIONS";
/// Overrides the random base seed, to replay a failure.
pub const SEED_ENV: &str = "FENCELOCK_STORY_SEED";
const DEFAULT_ITERATIONS: u64 = 50;

/// A bound for things that must happen but whose timing is not the point (an acquisition
/// after a lease, a watchdog noticing a loss, a child starting). Never a measured duration.
pub const GENEROUS: Duration = Duration::from_secs(10);

/// A small, fast, seedable generator (xorshift64*), seeded through splitmix64.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(splitmix(seed) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi);
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(1, 100) <= percent
    }

    /// A ledger amount: a deposit or a withdrawal of 1..=500, never 0.
    pub fn amount(&mut self) -> i64 {
        let cents = self.range(1, 500) as i64;
        if self.chance(50) {
            cents
        } else {
            -cents
        }
    }
}

fn splitmix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One story's run: its name, base seed and iteration count.
pub struct Story {
    pub name: String,
    pub seed: u64,
    pub iterations: u64,
    started: Instant,
}

impl Story {
    /// Reads the settings and prints them, so a failure's output says how to replay it.
    pub fn new(name: impl Into<String>) -> Story {
        let name = name.into();
        let iterations = match std::env::var(ITERATIONS_ENV) {
            Ok(n) => n
                .parse()
                .unwrap_or_else(|_| panic!("{ITERATIONS_ENV}={n:?} is not a number")),
            Err(_) => DEFAULT_ITERATIONS,
        };
        let seed = match std::env::var(SEED_ENV) {
            Ok(s) => s
                .parse()
                .unwrap_or_else(|_| panic!("{SEED_ENV}={s:?} is not a number")),
            Err(_) => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64;
                splitmix(nanos ^ u64::from(std::process::id()))
            }
        };
        println!(
            "story {name}: {iterations} iterations, seed {seed} (replay with {SEED_ENV}={seed})"
        );
        Story {
            name,
            seed,
            iterations,
            started: Instant::now(),
        }
    }

    /// Iteration `index`: its own generator, derived from the base seed.
    pub fn iteration(&self, index: u64) -> Iteration {
        Iteration {
            rng: Rng::new(self.seed ^ splitmix(index.wrapping_add(1))),
            ctx: Ctx(format!(
                "[story {}, seed {} ({SEED_ENV}), iteration {index}]",
                self.name, self.seed
            )),
        }
    }

    /// Prints what the run did; called at the end of a passing story.
    pub fn done(&self, report: &str) {
        println!(
            "story {}: {} iterations passed in {:.1?}; {report}",
            self.name,
            self.iterations,
            self.started.elapsed()
        );
    }
}

pub struct Iteration {
    pub rng: Rng,
    pub ctx: Ctx,
}

/// Where a failure happened, for every assertion message.
#[derive(Debug, Clone)]
pub struct Ctx(pub String);

impl std::fmt::Display for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Every token a story's acquisitions got, in acquisition order: each must be greater than
/// all before it, across iterations, restarts and failovers.
#[derive(Debug, Default)]
pub struct Tokens {
    max: u64,
    count: u64,
}

impl Tokens {
    pub fn issued(&mut self, ctx: &Ctx, who: &str, token: FencingToken) {
        assert!(
            token.get() > self.max,
            "{ctx}: {who} got token {token}, not greater than the earlier token {} \
             (acquisition {} of the story)",
            self.max,
            self.count + 1
        );
        self.max = token.get();
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Polls `fut` once: whether it is already complete, without waiting.
pub fn poll_once<F: Future>(fut: F) -> Poll<F::Output> {
    let mut fut = pin!(fut);
    fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// Awaits `fut` for at most [`GENEROUS`]; panics naming `what` when it does not finish.
pub async fn within<T>(ctx: &Ctx, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(GENEROUS, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{ctx}: {what} did not happen within {GENEROUS:?}"),
    }
}

/// Polls `check` every 2 ms until it holds, for at most [`GENEROUS`].
pub async fn until<F, Fut>(ctx: &Ctx, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let limit = Instant::now() + GENEROUS;
    while !check().await {
        assert!(
            Instant::now() < limit,
            "{ctx}: {what} did not happen within {GENEROUS:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The ledger check, with the context in the failure message.
/// `who`, the holder of `token`, claims the ledger and commits one to `max_writes` entries of
/// random amounts, as every story's new holder does after a takeover.
pub async fn claim_and_write(
    journal: &Journal,
    ledger: &dyn Ledger,
    rng: &mut Rng,
    who: &str,
    token: FencingToken,
    max_writes: u64,
) {
    let mut snapshot = journal.begin(ledger, who, token).await.unwrap();
    for _ in 0..rng.range(1, max_writes) {
        let amount = rng.amount();
        snapshot = journal
            .commit(ledger, who, token, snapshot, amount)
            .await
            .unwrap();
    }
}

pub async fn check_ledger(ctx: &Ctx, ledger: &dyn Ledger, journal: &Journal) -> Summary {
    ledger::check_ledger(ledger, journal)
        .await
        .unwrap_or_else(|err| panic!("{ctx}: ledger check failed: {err}"))
}

/// A lock server as the stories inspect and tamper with it (default prefix only).
pub struct LockServer<'a>(pub &'a RedisServer);

impl LockServer<'_> {
    pub fn raw(&self) -> redis::Connection {
        let con = self
            .0
            .client()
            .get_connection_with_timeout(GENEROUS)
            .expect("raw connection to the lock server");
        con.set_read_timeout(Some(GENEROUS)).unwrap();
        con
    }

    /// The lock hash of `name`, if it exists.
    pub fn lock_key(&self, name: &str) -> Option<Vec<u8>> {
        let mut found: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(format!("fencelock:{{*}}lock:{name}"))
            .query(&mut self.raw())
            .expect("KEYS");
        assert!(found.len() <= 1, "several keys for one lock: {found:?}");
        found.pop()
    }

    /// The holders (id, count) of lock `name` and its token, if it is held.
    pub fn lock_state(&self, name: &str) -> Option<(Vec<(String, u64)>, u64)> {
        let key = self.lock_key(name)?;
        let fields: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(&key)
            .query(&mut self.raw())
            .expect("HGETALL");
        let mut holders = Vec::new();
        let mut token = 0;
        for (field, value) in fields {
            if field == "~token" {
                token = value.parse().expect("token");
            } else {
                holders.push((field, value.parse().expect("count")));
            }
        }
        Some((holders, token))
    }

    /// The remaining lease of lock `name` in ms, if it is held.
    pub fn pttl(&self, name: &str) -> Option<i64> {
        let key = self.lock_key(name)?;
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query(&mut self.raw())
            .expect("PTTL");
        (pttl >= 0).then_some(pttl)
    }

    /// The fence counter of the bucket `name` is in (there is one bucket in these servers).
    pub fn fence_counters(&self) -> Vec<u64> {
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg("fencelock:{*}fence")
            .query(&mut self.raw())
            .expect("KEYS");
        keys.iter()
            .map(|key| {
                redis::cmd("GET")
                    .arg(key)
                    .query(&mut self.raw())
                    .expect("GET")
            })
            .collect()
    }

    /// Asserts that `holder` alone holds `name` with `token`: nobody else's operation touched it.
    pub fn assert_held_by(&self, ctx: &Ctx, name: &str, holder: &str, token: FencingToken) {
        assert_eq!(
            self.lock_state(name),
            Some((vec![(holder.to_owned(), 1)], token.get())),
            "{ctx}: the lock should be held by {holder} alone with token {token}"
        );
    }

    pub fn assert_free(&self, ctx: &Ctx, name: &str) {
        assert_eq!(
            self.lock_state(name),
            None,
            "{ctx}: the lock should be free at the end"
        );
    }
}

/// Environment of a child process (the test binary re-run with one test selected).
pub const CHILD_ENV: &str = "FENCELOCK_STORY_CHILD";

/// What a child needs to know, passed as one environment variable of `key=value` lines.
#[derive(Debug, Clone, Default)]
pub struct ChildArgs {
    pub lock_url: String,
    pub storage_url: String,
    pub control_url: String,
    pub ledger: String,
    /// Key prefix of this child's control keys.
    pub channel: String,
    pub lock: String,
    pub lease_ms: u64,
    pub first_id: u64,
    pub seed: u64,
}

impl ChildArgs {
    fn encode(&self) -> String {
        format!(
            "lock_url={}\nstorage_url={}\ncontrol_url={}\nledger={}\nchannel={}\nlock={}\n\
             lease_ms={}\nfirst_id={}\nseed={}",
            self.lock_url,
            self.storage_url,
            self.control_url,
            self.ledger,
            self.channel,
            self.lock,
            self.lease_ms,
            self.first_id,
            self.seed
        )
    }

    /// The arguments if this process is a child started for `role`, else `None`.
    pub fn from_env(role: &str) -> Option<ChildArgs> {
        let text = std::env::var(CHILD_ENV).ok()?;
        let mut args = ChildArgs::default();
        let mut found_role = None;
        for line in text.lines() {
            let (key, value) = line.split_once('=').expect("key=value");
            let number = || value.parse::<u64>().expect("number");
            match key {
                "role" => found_role = Some(value.to_owned()),
                "lock_url" => args.lock_url = value.into(),
                "storage_url" => args.storage_url = value.into(),
                "control_url" => args.control_url = value.into(),
                "ledger" => args.ledger = value.into(),
                "channel" => args.channel = value.into(),
                "lock" => args.lock = value.into(),
                "lease_ms" => args.lease_ms = number(),
                "first_id" => args.first_id = number(),
                "seed" => args.seed = number(),
                other => panic!("unknown child argument {other}"),
            }
        }
        (found_role.as_deref() == Some(role)).then_some(args)
    }
}

/// A child process running one test of this binary as `role`. Killed (SIGKILL, which also
/// ends a stopped process) when dropped, so a failing story leaves nothing behind.
pub struct ChildProcess {
    child: Option<tokio::process::Child>,
    pub pid: u32,
}

impl ChildProcess {
    pub fn spawn(test: &str, role: &str, args: &ChildArgs) -> ChildProcess {
        let exe = std::env::current_exe().expect("current test binary");
        let child = tokio::process::Command::new(exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("role={role}\n{}", args.encode()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the child process");
        let pid = child.id().expect("child pid");
        ChildProcess {
            child: Some(child),
            pid,
        }
    }

    /// Sends `signal` (freeze, resume, crash).
    pub fn signal(&self, ctx: &Ctx, signal: Signal) {
        if let Err(err) = send_signal(self.pid, signal) {
            panic!("{ctx}: {signal:?} to {} failed: {err}", self.pid);
        }
    }

    /// Kills the child with SIGKILL, as a crash would, and reaps it.
    pub async fn kill(&mut self, ctx: &Ctx) {
        let child = self.child.as_mut().expect("child already finished");
        within(ctx, "killing the child", child.kill())
            .await
            .expect("SIGKILL the child");
    }

    /// Waits for the child to exit; returns whether it succeeded and its output.
    pub async fn finish(&mut self, ctx: &Ctx) -> (bool, String) {
        let child = self.child.take().expect("child already finished");
        let output = within(ctx, "the child's exit", child.wait_with_output())
            .await
            .expect("wait for the child");
        let text = format!(
            "--- child stdout ---\n{}\n--- child stderr ---\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), text)
    }

    /// Kills the child and returns its output, for a failure message.
    async fn abort(&mut self, ctx: &Ctx) -> String {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        self.finish(ctx).await.1
    }

    /// Whether the child has exited already (it should not have, while it works).
    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|child| matches!(child.try_wait(), Ok(Some(_))))
    }
}

/// A child process' holder after the start every child story shares: connected as `args`
/// says, holding the lock (reported as "held <token>"), with the ledger claimed (reported as
/// "claimed").
pub struct ChildHolder {
    pub ctl: Control,
    pub ledger: Box<dyn Ledger>,
    pub rng: Rng,
    pub guard: fencelock::LockGuard,
    pub snapshot: ledger::Snapshot,
    /// Kept for as long as the child runs, like the guard's own client.
    pub client: fencelock::LockClient,
    pub store: Box<dyn ledger::LedgerStore>,
}

impl ChildHolder {
    pub async fn start(args: &ChildArgs) -> ChildHolder {
        let ctl = Control::connect(&args.control_url, &args.channel).await;
        let client = fencelock::LockClient::builder(&args.lock_url)
            .default_lease(Duration::from_millis(args.lease_ms))
            .connect()
            .await
            .unwrap();
        let store = ledger::connect(&args.storage_url).await.unwrap();
        let ledger = store.open(&args.ledger).await.unwrap();
        let rng = Rng::new(args.seed);
        let guard = client
            .lock(&args.lock)
            .unwrap()
            .acquire_timeout(GENEROUS)
            .await
            .unwrap();
        ctl.send(format!("held {}", guard.token())).await;
        let snapshot = ledger.begin(guard.token()).await.unwrap();
        ctl.send("claimed").await;
        ChildHolder {
            ctl,
            ledger,
            rng,
            guard,
            snapshot,
            client,
            store,
        }
    }
}

/// A tiny message channel between a parent and its child, in keys of a Redis server:
/// `<channel>:events` (a list the child appends to) and `<channel>:go` (set by the parent).
#[derive(Clone)]
pub struct Control {
    con: redis::aio::MultiplexedConnection,
    channel: String,
}

impl Control {
    pub async fn connect(url: &str, channel: &str) -> Control {
        // The channel is the test's plumbing, not the system under test: a reply slowed by a
        // loaded machine must not fail the story, so it waits as long as the story's own
        // deadline (redis-rs' default response timeout, 500 ms, failed it under load).
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(GENEROUS));
        let con = redis::Client::open(url)
            .expect("control url")
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("control connection");
        Control {
            con,
            channel: channel.to_owned(),
        }
    }

    pub async fn send(&self, event: impl Into<String>) {
        let mut con = self.con.clone();
        let _: () = con
            .rpush(format!("{}:events", self.channel), event.into())
            .await
            .expect("RPUSH event");
    }

    pub async fn events(&self) -> Vec<String> {
        let mut con = self.con.clone();
        con.lrange(format!("{}:events", self.channel), 0, -1)
            .await
            .expect("LRANGE events")
    }

    pub async fn go(&self) {
        let mut con = self.con.clone();
        let _: () = con
            .set(format!("{}:go", self.channel), 1)
            .await
            .expect("SET go");
    }

    /// Waits (polling every 2 ms) until the parent said go.
    pub async fn wait_for_go(&self) {
        let mut con = self.con.clone();
        loop {
            let go: Option<u8> = con
                .get(format!("{}:go", self.channel))
                .await
                .expect("GET go");
            if go.is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Waits until the events so far satisfy `pred` and returns them; fails early, with the
    /// child's output, when the child exits first.
    pub async fn wait_for(
        &self,
        ctx: &Ctx,
        child: &mut ChildProcess,
        what: &str,
        pred: impl Fn(&[String]) -> bool,
    ) -> Vec<String> {
        let limit = Instant::now() + GENEROUS;
        loop {
            let events = self.events().await;
            if pred(&events) {
                return events;
            }
            if child.exited() || Instant::now() >= limit {
                let output = child.abort(ctx).await;
                panic!(
                    "{ctx}: waiting for the child to report {what}; events {events:?}\n{output}"
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}
