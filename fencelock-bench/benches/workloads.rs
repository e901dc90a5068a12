//! The workload harness: every workload next to its physical limit and the peers,
//! measured in the same run, reported as ratios.
//!
//! ```text
//! cargo bench --bench workloads                # full run, ~3 minutes on 2 cores
//! cargo bench --bench workloads -- --smoke     # every workload tiny; asserts invariants only
//! cargo bench --bench workloads -- w3 w4       # a subset (w1..w11, callgrind)
//! cargo bench --bench workloads -- --callgrind # instructions per cycle only (needs valgrind)
//! ```
//!
//! Run without `--bench` (that is, by `cargo test --all-targets`) it does the smoke run.
//! The full run prints the markdown tables that `BENCHMARKS.md` is copied from, writes them to
//! `benches/results/results.md`, and draws the handoff CDFs to `benches/results/handoff.png`.
//! W4 re-executes this binary as child processes (`--child w4 ...`), and the callgrind
//! section runs it under valgrind (`--cycles ...`).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Contenders, Held, Kind, Locker, Raw};
use fencelock::{HoldExpiry, LockClient};
use fencelock_testing::RedisServer;
use tokio::task::JoinSet;

// ---------------------------------------------------------------------------------------------
// Client-side memory: a counting global allocator (live bytes), counting only while enabled so
// the other workloads pay one relaxed load per allocation and nothing else.

struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

fn count(delta: i64) {
    if COUNTING.load(Ordering::Relaxed) {
        LIVE_BYTES.fetch_add(delta, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter has no
// effect on the memory handed out.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            count(layout.size() as i64);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            count(layout.size() as i64);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            count(new_size as i64 - layout.size() as i64);
        }
        new
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Live heap bytes (allocations minus frees) since counting was switched on.
fn live_bytes() -> i64 {
    LIVE_BYTES.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------------
// Configuration.

struct Cfg {
    smoke: bool,
    only: Vec<String>,
    out_dir: PathBuf,
}

impl Cfg {
    fn runs(&self, workload: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|w| w == workload)
    }

    /// `full` in a real run, `smoke` in a smoke run.
    fn pick<T>(&self, full: T, smoke: T) -> T {
        if self.smoke {
            smoke
        } else {
            full
        }
    }

    fn secs(&self, full: f64, smoke: f64) -> Duration {
        Duration::from_secs_f64(self.pick(full, smoke))
    }
}

/// One target and whether this run met it.
struct Target {
    id: &'static str,
    what: String,
    measured: String,
    met: bool,
}

#[derive(Default)]
struct Report {
    sections: Vec<String>,
    targets: Vec<Target>,
    /// Handoff latencies per workload panel, for the plot.
    cdfs: Vec<Panel>,
}

impl Report {
    fn section(&mut self, text: String) {
        println!("{text}");
        self.sections.push(text);
    }

    fn target(&mut self, id: &'static str, what: impl Into<String>, measured: String, met: bool) {
        self.targets.push(Target {
            id,
            what: what.into(),
            measured,
            met,
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers: statistics, formatting, Redis administration, CPU clocks.

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn median(values: &[f64]) -> f64 {
    percentile(values, 50.0)
}

/// Nearest-rank percentile of unsorted values (NaN for none).
fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NAN, f64::max)
}

/// A duration in µs, as µs or ms, for tables.
fn fmt_us(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.2} ms", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0} µs")
    } else {
        format!("{v:.1} µs")
    }
}

fn yes_no(met: bool) -> &'static str {
    if met {
        "**met**"
    } else {
        "**missed**"
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

/// CPU time of this process: the sum of its threads' on-CPU time (ns resolution).
fn process_cpu() -> Duration {
    let mut total = 0u64;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
                total += stat
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Duration::from_nanos(total)
}

/// An administrative connection to the benchmark's server (never part of a measurement).
struct Admin {
    conn: redis::aio::MultiplexedConnection,
}

impl Admin {
    async fn new(server: &RedisServer) -> Admin {
        Admin {
            conn: server
                .client()
                .get_multiplexed_async_connection()
                .await
                .expect("admin connection"),
        }
    }

    async fn info(&mut self, section: &str) -> String {
        redis::cmd("INFO")
            .arg(section)
            .query_async(&mut self.conn)
            .await
            .expect("INFO")
    }

    async fn field(&mut self, section: &str, key: &str) -> String {
        let info = self.info(section).await;
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}:")))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    async fn reset_stats(&mut self) {
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut self.conn)
            .await
            .expect("CONFIG RESETSTAT");
    }

    /// Calls and server µs per command since the last reset, leaving out our own
    /// administration.
    async fn command_stats(&mut self) -> BTreeMap<String, (u64, f64)> {
        let info = self.info("commandstats").await;
        let mut stats = BTreeMap::new();
        for line in info.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            if [
                "info", "config", "hello", "client", "ping", "select", "scan", "memory",
            ]
            .iter()
            .any(|admin| name.starts_with(admin))
            {
                continue;
            }
            let field = |key: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            stats.insert(name.to_owned(), (field("calls") as u64, field("usec")));
        }
        stats
    }

    /// Round trips since the last reset: calls of the commands `kind` sends itself, by
    /// name. `INFO commandstats` also counts the commands scripts run inside (`SET` in
    /// acquire.lua, say), so only the commands that no contender's script calls are counted,
    /// plus `SET` for the peers, whose scripts never call it. W1 checks this against `MONITOR`.
    async fn round_trips(&mut self, kind: Kind) -> BTreeMap<String, u64> {
        let mut top_level = vec!["evalsha", "eval", "script|load", "subscribe", "unsubscribe"];
        if matches!(kind, Kind::Rslock | Kind::Distkit) {
            top_level.push("set");
        }
        self.command_stats()
            .await
            .into_iter()
            .filter(|(name, _)| top_level.contains(&name.as_str()))
            .map(|(name, (calls, _))| (name, calls))
            .collect()
    }

    async fn used_memory(&mut self) -> i64 {
        self.field("memory", "used_memory")
            .await
            .parse()
            .expect("used_memory")
    }

    /// Redis' own CPU time (user + system), from `INFO cpu`.
    async fn cpu(&mut self) -> Duration {
        let info = self.info("cpu").await;
        let get = |key: &str| -> f64 {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}:")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        };
        Duration::from_secs_f64(get("used_cpu_sys") + get("used_cpu_user"))
    }

    async fn scan(&mut self, pattern: &str) -> Vec<Vec<u8>> {
        let mut cursor = 0u64;
        let mut keys = Vec::new();
        loop {
            let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut self.conn)
                .await
                .expect("SCAN");
            keys.extend(batch);
            if next == 0 {
                return keys;
            }
            cursor = next;
        }
    }

    async fn memory_usage(&mut self, key: &[u8]) -> i64 {
        redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut self.conn)
            .await
            .expect("MEMORY USAGE")
    }

    async fn query<T: redis::FromRedisValue, C: AdminQuery>(&mut self, cmd: &C) -> T {
        cmd.run(&mut self.conn).await
    }
}

/// A command or a pipeline, for [`Admin::query`].
trait AdminQuery {
    async fn run<T: redis::FromRedisValue>(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> T;
}

impl AdminQuery for redis::Cmd {
    async fn run<T: redis::FromRedisValue>(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> T {
        self.query_async(conn).await.expect("admin command")
    }
}

impl AdminQuery for redis::Pipeline {
    async fn run<T: redis::FromRedisValue>(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> T {
        self.query_async(conn).await.expect("admin pipeline")
    }
}

/// The Redisson client id in the hand-built Redisson layout (a UUID string, as Redisson's).
const REDISSON_UUID: &str = "4f3a1b2c-9d8e-4f7a-8b6c-5d4e3f2a1b0c";

/// Round trips the server received from clients while `work` ran, by command, from
/// `MONITOR` (which marks the commands scripts run inside as `lua`, so they are left out).
/// Not used while timing: MONITOR slows the server down.
async fn monitored<F: std::future::Future<Output = ()>>(
    server: &RedisServer,
    admin: &mut Admin,
    work: F,
) -> BTreeMap<String, u64> {
    use futures_util::StreamExt;
    let monitor = server
        .client()
        .get_async_monitor()
        .await
        .expect("MONITOR connection");
    let marker = format!("fencelock-bench-marker-{}", now_ns());
    let collector = {
        let marker = marker.clone();
        tokio::spawn(async move {
            let mut stream = monitor.into_on_message::<String>();
            let (mut counts, mut started) = (BTreeMap::new(), false);
            while let Some(line) = stream.next().await {
                if line.contains(&marker) {
                    if started {
                        break;
                    }
                    started = true;
                    continue;
                }
                let Some((origin, command)) = line.split_once("] ") else {
                    continue;
                };
                if !started || origin.ends_with(" lua") {
                    continue;
                }
                let name = command
                    .split('"')
                    .nth(1)
                    .unwrap_or("?")
                    .to_ascii_lowercase();
                *counts.entry(name).or_insert(0u64) += 1;
            }
            counts
        })
    };
    let echo = redis::cmd("ECHO").arg(&marker).to_owned();
    let _: String = admin.query(&echo).await;
    work.await;
    let _: String = admin.query(&echo).await;
    collector.await.expect("monitor collector")
}

/// "2.00 (evalsha 2.00)": commands per unit of work, with the breakdown.
fn per_unit(counts: &BTreeMap<String, u64>, units: f64) -> (f64, String) {
    let total = counts.values().sum::<u64>() as f64 / units;
    let parts: Vec<String> = counts
        .iter()
        .filter(|(_, &c)| c > 0)
        .map(|(name, &c)| format!("{name} {:.2}", c as f64 / units))
        .collect();
    (total, format!("{total:.2} ({})", parts.join(", ")))
}

/// One raw round trip (half of a limit acquire + release cycle), averaged over `cycles`.
async fn raw_rtt(limit: &Raw, cycles: u32) -> Duration {
    let keys = limit.keys("rtt");
    let started = Instant::now();
    for _ in 0..cycles {
        let holder = limit.acquire(&keys).await;
        limit.release(&keys, &holder).await;
    }
    started.elapsed() / (2 * cycles)
}

/// Peers lack these; the tables say so next to their numbers.
const PEER_NOTE: &str = "\\* peers: no re-entry, no fencing tokens (and no cancel safety or \
                          idempotent retries).";

// ---------------------------------------------------------------------------------------------
// W1: uncontended sequential acquire + release, interleaved rounds, paired ratios.

async fn w1(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let mut admin = Admin::new(&server).await;
    let kinds = [
        Kind::Ours,
        Kind::Limit,
        Kind::OurScripts,
        Kind::Rslock,
        Kind::Distkit,
    ];
    let lockers: Vec<(Kind, Locker)> = kinds
        .iter()
        .map(|&k| (k, contenders.locker(k, &format!("w1-{}", k.slug()))))
        .collect();
    for (_, locker) in &lockers {
        for _ in 0..cfg.pick(200, 5) {
            locker.cycle().await;
        }
    }

    // Round trips per cycle, each contender alone, counted with MONITOR and checked against
    // the commandstats-based count that W3 and W4 use. (CPU per cycle: see the callgrind table;
    // on a multi-threaded runtime a wall-clock CPU figure is dominated by worker wake-ups.)
    let mut costs = BTreeMap::new();
    let probe_cycles = cfg.pick(500u32, 10);
    for (kind, locker) in &lockers {
        let n = f64::from(probe_cycles);
        admin.reset_stats().await;
        let counts = monitored(&server, &mut admin, async {
            for _ in 0..probe_cycles {
                locker.cycle().await;
            }
        })
        .await;
        let stats = admin.round_trips(*kind).await;
        let (monitor_total, breakdown) = per_unit(&counts, n);
        let (stats_total, _) = per_unit(&stats, n);
        assert!(
            (monitor_total - stats_total).abs() < 0.01,
            "W1 {kind:?}: MONITOR counted {monitor_total} round trips per cycle, \
             commandstats {stats_total}"
        );
        costs.insert(*kind, breakdown);
    }

    // Interleaved rounds: every round runs a block of each contender, in a rotating order;
    // ratios are taken within a round (paired), then the median over rounds.
    let rounds = cfg.pick(40, 2);
    let block = cfg.pick(60u32, 3);
    let mut times: BTreeMap<Kind, Vec<f64>> = BTreeMap::new();
    let mut server_cpu: BTreeMap<Kind, Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        for i in 0..lockers.len() {
            let (kind, locker) = &lockers[(i + round) % lockers.len()];
            // distkit's acquire costs a timer tick (~1 ms), so it gets fewer cycles per block.
            let n = if *kind == Kind::Distkit {
                block.div_ceil(6)
            } else {
                block
            };
            // Redis' CPU around the block (outside the timed part): how much of a cycle the
            // server spends working, so the gap to the limit can be priced in the same run.
            let cpu_before = admin.cpu().await;
            let started = Instant::now();
            for _ in 0..n {
                locker.cycle().await;
            }
            let elapsed = started.elapsed();
            let cpu_after = admin.cpu().await;
            times
                .entry(*kind)
                .or_default()
                .push(us(elapsed) / f64::from(n));
            server_cpu
                .entry(*kind)
                .or_default()
                .push(us(cpu_after.saturating_sub(cpu_before)) / f64::from(n));
        }
    }
    let paired = |a: Kind, b: Kind| {
        let ratios: Vec<f64> = times[&a]
            .iter()
            .zip(&times[&b])
            .map(|(x, y)| x / y)
            .collect();
        median(&ratios)
    };

    let mut text = String::from(
        "### W1: uncontended acquire + release (one task, one key)\n\n\
         | contender | cycle (median of rounds) | ratio vs limit (2 raw RTT) | Redis CPU / cycle | round trips / cycle |\n\
         | --- | ---: | ---: | ---: | --- |\n",
    );
    for kind in kinds {
        let _ = writeln!(
            text,
            "| {} | {} | {:.2} | {} | {} |",
            kind.label(),
            fmt_us(median(&times[&kind])),
            paired(kind, Kind::Limit),
            fmt_us(median(&server_cpu[&kind])),
            costs[&kind]
        );
    }
    // The gap to the limit, priced: the extra Redis CPU per cycle (the scripts' server-side
    // work; a single-threaded server does it while the client waits) against the extra time
    // per cycle. A share near 1 says the whole gap is server work, not round trips or client.
    let gap = |kind: Kind| {
        let time = median(&times[&kind]) - median(&times[&Kind::Limit]);
        let cpu = median(&server_cpu[&kind]) - median(&server_cpu[&Kind::Limit]);
        (time, cpu)
    };
    for kind in [Kind::Ours, Kind::OurScripts] {
        let (time, cpu) = gap(kind);
        let _ = writeln!(
            text,
            "\n{}: {} more per cycle than the limit, of which {} is extra Redis CPU ({:.0} %).",
            kind.label(),
            fmt_us(time),
            fmt_us(cpu),
            if time > 0.0 { 100.0 * cpu / time } else { 0.0 }
        );
    }
    let vs_limit = paired(Kind::Ours, Kind::Limit);
    let vs_rslock = paired(Kind::Ours, Kind::Rslock);
    let vs_scripts = paired(Kind::Ours, Kind::OurScripts);
    let _ = writeln!(
        text,
        "\nfencelock / rslock (paired): {vs_limit_rs:.2}; fencelock / our scripts, raw (paired): \
         {vs_scripts:.2}. {rounds} interleaved rounds of {block} \
         cycles (distkit {dk}). \"our scripts, raw\" calls lua/acquire.lua + lua/release.lua \
         directly through redis-rs on the same connection type: the gap between it and the \
         limit is server-side script work, the gap between fencelock and it is client-side \
         library work.\n\n{PEER_NOTE}\n",
        vs_limit_rs = vs_rslock,
        dk = block.div_ceil(6),
    );
    report.section(text);
    report.target(
        "W1a",
        "cycle ≤ 1.15 × two raw round trips",
        format!("{vs_limit:.2}×"),
        vs_limit <= 1.15,
    );
    report.target(
        "W1b",
        "cycle ≤ 1.10 × rslock's",
        format!("{vs_rslock:.2}×"),
        vs_rslock <= 1.10,
    );
    // The fair second baseline (not in the issue): the same protocol without the library, so
    // the library's own overhead is judged apart from the scripts' server-side work.
    report.target(
        "W1c",
        "cycle ≤ 1.05 × our scripts called raw (library overhead)",
        format!("{vs_scripts:.2}×"),
        vs_scripts <= 1.05,
    );
}

// ---------------------------------------------------------------------------------------------
// W2: 64 tasks on one client, each its own key.

async fn w2(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let mut admin = Admin::new(&server).await;
    let tasks = 64;
    let kinds = [
        Kind::Ours,
        Kind::Limit,
        Kind::OurScripts,
        Kind::Rslock,
        Kind::Distkit,
    ];
    let rounds = cfg.pick(5, 1);
    let window = cfg.secs(1.0, 0.1);
    let mut rates: BTreeMap<Kind, Vec<f64>> = BTreeMap::new();
    let mut cpu: BTreeMap<Kind, Vec<(f64, f64)>> = BTreeMap::new();
    for round in 0..rounds {
        for i in 0..kinds.len() {
            let kind = kinds[(i + round) % kinds.len()];
            let done = Arc::new(AtomicU64::new(0));
            let end = Instant::now() + window;
            let mut set = JoinSet::new();
            for t in 0..tasks {
                let locker = contenders.locker(kind, &format!("w2-{}-{t}", kind.slug()));
                let done = done.clone();
                set.spawn(async move {
                    while Instant::now() < end {
                        locker.cycle().await;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            let (started, cpu0, rcpu0) = (Instant::now(), process_cpu(), admin.cpu().await);
            while let Some(joined) = set.join_next().await {
                joined.expect("w2 task");
            }
            let (cpu1, rcpu1) = (process_cpu(), admin.cpu().await);
            let cycles = done.load(Ordering::Relaxed) as f64;
            rates
                .entry(kind)
                .or_default()
                .push(cycles / started.elapsed().as_secs_f64());
            cpu.entry(kind).or_default().push((
                us(cpu1 - cpu0) / cycles,
                us(rcpu1.saturating_sub(rcpu0)) / cycles,
            ));
        }
    }
    let paired_with = |a: Kind, b: Kind| {
        let ratios: Vec<f64> = rates[&a]
            .iter()
            .zip(&rates[&b])
            .map(|(x, y)| x / y)
            .collect();
        median(&ratios)
    };
    let paired = |a: Kind| paired_with(a, Kind::Limit);
    let mut text = format!(
        "### W2: {tasks} tasks on one client, each its own key\n\n\
         | contender | acquire+release cycles/s (median of rounds) | ratio vs limit (pipelined raw EVALSHA) | client CPU / cycle | Redis CPU / cycle |\n\
         | --- | ---: | ---: | ---: | ---: |\n"
    );
    for kind in kinds {
        let client: Vec<f64> = cpu[&kind].iter().map(|c| c.0).collect();
        let redis: Vec<f64> = cpu[&kind].iter().map(|c| c.1).collect();
        let _ = writeln!(
            text,
            "| {} | {:.0} | {:.2} | {:.1} µs | {:.1} µs |",
            kind.label(),
            median(&rates[&kind]),
            paired(kind),
            median(&client),
            median(&redis)
        );
    }
    let _ = writeln!(
        text,
        "\n{rounds} interleaved rounds of {:.1} s per contender. The limit is the same 64 tasks \
         each sending acquire-shaped then release-shaped EVALSHAs on one multiplexed connection \
         (redis-rs pipelines them). With 64 requests in flight the two cores are \
         saturated, so throughput is set by CPU per cycle (client + Redis).\n\n{PEER_NOTE}\n",
        window.as_secs_f64()
    );
    report.section(text);
    let ratio = paired(Kind::Ours);
    report.target(
        "W2",
        "throughput ≥ 0.8 × raw pipelined",
        format!("{ratio:.2}×"),
        ratio >= 0.8,
    );
    // The fair second baseline, as W1c: our own scripts pipelined without the library.
    let vs_scripts = paired_with(Kind::Ours, Kind::OurScripts);
    report.target(
        "W2b",
        "throughput ≥ 0.8 × our scripts called raw, pipelined (library overhead)",
        format!("{vs_scripts:.2}×"),
        vs_scripts >= 0.8,
    );
}

// ---------------------------------------------------------------------------------------------
// W3 and W4: contention on one key. Shared result shape.

/// What one contended run produced.
struct Contended {
    kind: Kind,
    acquisitions: u64,
    elapsed: Duration,
    /// Release started by one holder → acquire returned to the next, µs.
    handoffs: Vec<f64>,
    /// The handoffs whose next holder was another task (W3) or process (W4).
    cross: Vec<f64>,
    /// Acquire called → returned, µs.
    waits: Vec<f64>,
    /// Round trips per acquisition, with the breakdown by command.
    round_trips: String,
    /// Who held the lock, in grant order (task in W3, process in W4).
    owners: Vec<usize>,
    rtt: Duration,
}

impl Contended {
    fn rate(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64()
    }

    fn per_two_rtt(&self) -> f64 {
        self.rate() * 2.0 * self.rtt.as_secs_f64()
    }

    fn in_rtt(&self, v: f64) -> f64 {
        v / us(self.rtt)
    }

    fn wait_ratio(&self) -> f64 {
        max(&self.waits) / mean(&self.waits)
    }

    /// Fraction of handoffs that went back to the same owner (task or process).
    fn same_owner(&self) -> f64 {
        let same = self.owners.windows(2).filter(|w| w[0] == w[1]).count();
        same as f64 / self.owners.len().saturating_sub(1).max(1) as f64
    }

    /// The most consecutive acquisitions by one owner.
    fn longest_streak(&self) -> usize {
        let (mut best, mut run) = (0, 0);
        for (i, owner) in self.owners.iter().enumerate() {
            run = if i > 0 && self.owners[i - 1] == *owner {
                run + 1
            } else {
                1
            };
            best = best.max(run);
        }
        best
    }
}

/// Plot series: every handoff (solid), and, where many went back to the same owner, the
/// handoffs to another owner (dashed).
fn cdf_series(runs: &[Contended], owner: &str) -> Vec<Series> {
    let mut series = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        series.push(Series {
            label: run.kind.label().to_owned(),
            values: run.handoffs.clone(),
            color: i,
            dashed: false,
        });
        if run.same_owner() > 0.05 && !run.cross.is_empty() {
            series.push(Series {
                label: format!("{}, to another {owner}", run.kind.label()),
                values: run.cross.clone(),
                color: i,
                dashed: true,
            });
        }
    }
    series
}

fn contended_table(title: &str, owner: &str, runs: &[Contended]) -> String {
    let mut text = format!(
        "### {title}\n\n\
         | contender | acquisitions/s | per 2 raw RTT | handoff p50 | p50 in RTT | handoff p99 | p99 in RTT | p50 handoff to another {owner} | mean wait | p99 wait | max wait | max / mean wait | handoffs to the same {owner} | longest {owner} streak | round trips / acquisition | raw RTT |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n"
    );
    for run in runs {
        let p50 = percentile(&run.handoffs, 50.0);
        let p99 = percentile(&run.handoffs, 99.0);
        let _ = writeln!(
            text,
            "| {} | {:.0} | {:.2} | {} | {:.1} | {} | {:.1} | {} | {} | {} | {} | {:.1} | {:.0} % | {} | {} | {} |",
            run.kind.label(),
            run.rate(),
            run.per_two_rtt(),
            fmt_us(p50),
            run.in_rtt(p50),
            fmt_us(p99),
            run.in_rtt(p99),
            fmt_us(percentile(&run.cross, 50.0)),
            fmt_us(mean(&run.waits)),
            fmt_us(percentile(&run.waits, 99.0)),
            fmt_us(max(&run.waits)),
            run.wait_ratio(),
            100.0 * run.same_owner(),
            run.longest_streak(),
            run.round_trips,
            fmt_us(us(run.rtt)),
        );
    }
    text
}

// ---------------------------------------------------------------------------------------------
// W3: 16 tasks, one key, one client.

struct Shared {
    inside: AtomicUsize,
    overlaps: AtomicU64,
    counter: AtomicU64,
    /// When the last holder started its release, and which task it was.
    last_release: parking_lot::Mutex<Option<(Instant, usize)>>,
    /// (task, acquire called, acquire returned), in grant order.
    grants: parking_lot::Mutex<Vec<(usize, Instant, Instant)>>,
    /// (handoff µs, went to another task)
    handoffs: parking_lot::Mutex<Vec<(f64, bool)>>,
}

async fn w3(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let mut admin = Admin::new(&server).await;
    let tasks = 16;
    let mut runs = Vec::new();
    let mut longest = Vec::new();
    for kind in [Kind::Ours, Kind::OursFair, Kind::Rslock, Kind::Distkit] {
        let rtt_cycles = cfg.pick(300, 10);
        let rtt_before = raw_rtt(&contenders.limit, rtt_cycles).await;
        let shared = Arc::new(Shared {
            inside: AtomicUsize::new(0),
            overlaps: AtomicU64::new(0),
            counter: AtomicU64::new(0),
            last_release: parking_lot::Mutex::new(None),
            grants: parking_lot::Mutex::new(Vec::new()),
            handoffs: parking_lot::Mutex::new(Vec::new()),
        });
        let duration = if kind.is_ours() {
            cfg.secs(3.0, 0.3)
        } else {
            cfg.secs(4.0, 0.3)
        };
        admin.reset_stats().await;
        let started = Instant::now();
        let end = started + duration;
        let mut set = JoinSet::new();
        for task in 0..tasks {
            let locker = contenders.locker(kind, &format!("w3-{}", kind.slug()));
            let shared = shared.clone();
            set.spawn(async move {
                let (mut acquisitions, mut waits) = (0u64, Vec::new());
                while Instant::now() < end {
                    let called = Instant::now();
                    let held = locker.acquire().await;
                    let acquired = Instant::now();
                    if shared.inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        shared.overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    // The critical section: a deliberately non-atomic increment, so an overlap
                    // would show up as a lost update.
                    let value = shared.counter.load(Ordering::Relaxed);
                    shared.counter.store(value + 1, Ordering::Relaxed);
                    acquisitions += 1;
                    shared.grants.lock().push((task, called, acquired));
                    waits.push(us(acquired - called));
                    if let Some((released, by)) = shared.last_release.lock().take() {
                        shared
                            .handoffs
                            .lock()
                            .push((us(acquired - released), by != task));
                    }
                    shared.inside.fetch_sub(1, Ordering::SeqCst);
                    *shared.last_release.lock() = Some((Instant::now(), task));
                    locker.release(held).await;
                }
                (acquisitions, waits)
            });
        }
        let mut run = Contended {
            kind,
            acquisitions: 0,
            elapsed: Duration::ZERO,
            handoffs: Vec::new(),
            cross: Vec::new(),
            waits: Vec::new(),
            round_trips: String::new(),
            owners: Vec::new(),
            rtt: Duration::ZERO,
        };
        while let Some(joined) = set.join_next().await {
            let (acquisitions, waits) = joined.expect("w3 task");
            run.acquisitions += acquisitions;
            run.waits.extend(waits);
        }
        run.elapsed = started.elapsed();
        let grants = std::mem::take(&mut *shared.grants.lock());
        run.owners = grants.iter().map(|g| g.0).collect();
        // Who got the lock while the longest waiter waited: at most the 15 others if the
        // queue is FIFO, so a long wait with few grants in it is a stall, not unfairness.
        if let Some(&(task, called, acquired)) = grants.iter().max_by_key(|g| g.2 - g.1) {
            let during = grants
                .iter()
                .filter(|g| g.2 > called && g.2 < acquired)
                .count();
            let mut gaps: Vec<Duration> = grants
                .windows(2)
                .filter(|w| w[1].2 > called && w[1].2 <= acquired)
                .map(|w| w[1].2 - w[0].2)
                .collect();
            gaps.sort();
            longest.push(format!(
                "{}: the longest wait ({}, task {task}) saw {during} grants to other tasks; the \
                 longest gap between two grants in it was {}",
                kind.label(),
                fmt_us(us(acquired - called)),
                fmt_us(gaps.last().map_or(f64::NAN, |g| us(*g)))
            ));
        }
        for (handoff, cross) in shared.handoffs.lock().drain(..) {
            run.handoffs.push(handoff);
            if cross {
                run.cross.push(handoff);
            }
        }
        let counts = admin.round_trips(kind).await;
        run.round_trips = per_unit(&counts, run.acquisitions as f64).1;
        let rtt_after = raw_rtt(&contenders.limit, rtt_cycles).await;
        run.rtt = (rtt_before + rtt_after) / 2;

        assert_eq!(
            shared.overlaps.load(Ordering::SeqCst),
            0,
            "W3 {kind:?}: two holders inside at once"
        );
        assert_eq!(
            shared.counter.load(Ordering::SeqCst),
            run.acquisitions,
            "W3 {kind:?}: counter != acquisitions (lost update)"
        );
        assert!(run.acquisitions > 0, "W3 {kind:?}: no acquisition");
        runs.push(run);
    }
    let ours_keys = admin.scan("fencelock:{*}lock:*").await;
    assert!(ours_keys.is_empty(), "W3: a lock was left held");

    let mut text = contended_table(
        "W3: 16 tasks, one key, one client (critical section: a counter increment)",
        "task",
        &runs,
    );
    let _ = writeln!(
        text,
        "\nHandoff: the holder starts its release → the next holder's acquire returns. Wait: \
         acquire called → returned. Raw RTT: one acquire-shaped EVALSHA on the limit's \
         connection, measured right before and after each contender. Peers run with their \
         defaults: rslock retries after a random 0–200 ms, distkit polls every 50 ms.\n"
    );
    for line in &longest {
        let _ = writeln!(text, "- {line}");
    }
    let _ = writeln!(text, "\n{PEER_NOTE}\n");
    report.section(text);
    let ours = &runs[0];
    let p50 = ours.in_rtt(percentile(&ours.handoffs, 50.0));
    report.target(
        "W3a",
        "≥ 0.5 acquisitions per two raw RTT",
        format!("{:.2}", ours.per_two_rtt()),
        ours.per_two_rtt() >= 0.5,
    );
    report.target(
        "W3b",
        "handoff p50 ≤ 3 raw RTT",
        format!("{p50:.1} RTT"),
        p50 <= 3.0,
    );
    report.target(
        "W3c",
        "max wait < 10 × mean wait",
        format!("{:.1}×", ours.wait_ratio()),
        ours.wait_ratio() < 10.0,
    );
    report.cdfs.push((
        "W3: 16 tasks, one client".into(),
        us(ours.rtt),
        cdf_series(&runs, "task"),
    ));
}

// ---------------------------------------------------------------------------------------------
// W4: 4 processes x 4 tasks on one key. The parent re-executes this binary as children.

const CHILD_FLAG: &str = "--child";

/// One acquisition as a child saw it: wall-clock ns (comparable across processes).
struct Record {
    called: u64,
    acquired: u64,
    releasing: u64,
    token: u64,
    process: usize,
}

/// `--child w4 <kind> <url> <tasks>`: connect, print `READY`, read `GO <start> <end>` (unix
/// ns, the same for every child) from stdin, compete from start to end, then print one
/// `R called acquired releasing token` line per acquisition.
fn child_main(args: &[String]) {
    let [_, workload, kind, url, tasks] = args else {
        panic!("child arguments: {args:?}");
    };
    assert_eq!(workload, "w4");
    let kind = Kind::from_slug(kind).expect("kind");
    let tasks: usize = tasks.parse().expect("tasks");
    let rt = common::runtime();
    let records = rt.block_on(async {
        let contenders = Contenders::connect(url).await;
        // Connected (rslock connects lazily: make it connect now too).
        let warm = contenders.locker(kind, "w4-warm-up");
        warm.cycle().await;
        println!("READY");
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).expect("GO line");
        let times: Vec<u64> = go
            .strip_prefix("GO ")
            .expect("GO line")
            .split_whitespace()
            .map(|t| t.parse().expect("time"))
            .collect();
        let [start, end] = times[..] else {
            panic!("GO line: {go:?}")
        };
        let wait = start.saturating_sub(now_ns());
        tokio::time::sleep(Duration::from_nanos(wait)).await;
        let mut set = JoinSet::new();
        for _ in 0..tasks {
            let locker = contenders.locker(kind, "w4");
            set.spawn(async move {
                let mut records = Vec::new();
                let mut counter = 0u64;
                while now_ns() < end {
                    let called = now_ns();
                    let held = locker.acquire().await;
                    let acquired = now_ns();
                    counter += 1;
                    let token = held.token().unwrap_or(0);
                    let releasing = now_ns();
                    records.push((called, acquired, releasing, token));
                    locker.release(held).await;
                }
                assert_eq!(counter as usize, records.len());
                records
            });
        }
        let mut all = Vec::new();
        while let Some(joined) = set.join_next().await {
            all.extend(joined.expect("child task"));
        }
        all
    });
    let mut out = String::new();
    for (called, acquired, releasing, token) in records {
        let _ = writeln!(out, "R {called} {acquired} {releasing} {token}");
    }
    print!("{out}");
}

async fn w4(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let mut admin = Admin::new(&server).await;
    let (processes, tasks) = (4, 4);
    let exe = std::env::current_exe().expect("current exe");
    let mut runs = Vec::new();
    let mut windows = Vec::new();
    let mut starvation = Vec::new();
    for kind in [Kind::Ours, Kind::OursFair, Kind::Rslock, Kind::Distkit] {
        let rtt_cycles = cfg.pick(300, 10);
        let rtt_before = raw_rtt(&contenders.limit, rtt_cycles).await;
        let duration = cfg.secs(5.0, 0.5);
        let url = server.url();
        let mut stats_conn = server.client().get_connection().expect("connection");
        let exe = exe.clone();
        let records = tokio::task::spawn_blocking(move || {
            let mut children: Vec<_> = (0..processes)
                .map(|_| {
                    Command::new(&exe)
                        .args([CHILD_FLAG, "w4", kind.slug(), &url, &tasks.to_string()])
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .spawn()
                        .expect("spawn child")
                })
                .collect();
            // Every child has connected; they start and stop together (wall clock).
            let mut outputs = Vec::new();
            for child in &mut children {
                let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
                let mut ready = String::new();
                stdout.read_line(&mut ready).expect("READY");
                assert_eq!(ready.trim(), "READY", "W4 child did not start");
                outputs.push(stdout);
            }
            let () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query(&mut stats_conn)
                .expect("CONFIG RESETSTAT");
            let start = now_ns() + 50_000_000;
            let go = format!("GO {start} {}\n", start + duration.as_nanos() as u64);
            for child in &mut children {
                let mut stdin = child.stdin.take().expect("stdin");
                stdin.write_all(go.as_bytes()).expect("GO");
            }
            let mut records = Vec::new();
            for (process, (mut child, stdout)) in children.into_iter().zip(outputs).enumerate() {
                for line in stdout.lines() {
                    let line = line.expect("child output");
                    let fields: Vec<u64> = line
                        .strip_prefix("R ")
                        .map(|rest| rest.split(' ').map(|f| f.parse().expect("field")).collect())
                        .unwrap_or_default();
                    if let [called, acquired, releasing, token] = fields[..] {
                        records.push(Record {
                            called,
                            acquired,
                            releasing,
                            token,
                            process,
                        });
                    }
                }
                assert!(child.wait().expect("child").success(), "W4 child failed");
            }
            records
        })
        .await
        .expect("collect children");
        let counts = admin.round_trips(kind).await;
        let rtt_after = raw_rtt(&contenders.limit, rtt_cycles).await;

        let mut records = records;
        records.sort_by_key(|r| r.acquired);
        assert!(!records.is_empty(), "W4 {kind:?}: no acquisition");
        for pair in records.windows(2) {
            assert!(
                pair[1].acquired > pair[0].releasing,
                "W4 {kind:?}: holders overlapped (processes {} and {})",
                pair[0].process,
                pair[1].process
            );
            if kind.is_ours() {
                assert!(
                    pair[1].token > pair[0].token,
                    "W4: tokens not increasing in grant order"
                );
            }
        }
        for p in 0..processes {
            assert!(
                records.iter().any(|r| r.process == p),
                "W4 {kind:?}: process {p} never acquired"
            );
        }
        // Analyse only the window in which every process competed: a child that started late
        // (slow exec or connect on a loaded machine) or stopped early would otherwise show up as
        // another process' long streak.
        let from = (0..processes)
            .filter_map(|p| {
                records
                    .iter()
                    .filter(|r| r.process == p)
                    .map(|r| r.called)
                    .min()
            })
            .max()
            .unwrap_or(0);
        let to = (0..processes)
            .filter_map(|p| {
                records
                    .iter()
                    .filter(|r| r.process == p)
                    .map(|r| r.releasing)
                    .max()
            })
            .min()
            .unwrap_or(0);
        let all = records.len();
        records.retain(|r| r.called >= from && r.releasing <= to);
        // Who got the lock while the longest waiter waited.
        let longest = records
            .iter()
            .max_by_key(|r| r.acquired - r.called)
            .expect("records");
        let mut during = vec![0usize; processes];
        for r in &records {
            if r.acquired > longest.called && r.acquired < longest.acquired {
                during[r.process] += 1;
            }
        }
        starvation.push(format!(
            "{}: the longest wait ({}, a task of process {}) saw {} acquisitions by processes \
             0–3 while it waited",
            kind.label(),
            fmt_us((longest.acquired - longest.called) as f64 / 1000.0),
            longest.process,
            during
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" / ")
        ));
        windows.push((records.len(), all));
        let first = records.first().map_or(0, |r| r.called);
        let last = records.last().map_or(0, |r| r.releasing);
        runs.push(Contended {
            kind,
            acquisitions: records.len() as u64,
            elapsed: Duration::from_nanos(last.saturating_sub(first)),
            handoffs: records
                .windows(2)
                .map(|p| (p[1].acquired - p[0].releasing) as f64 / 1000.0)
                .collect(),
            cross: records
                .windows(2)
                .filter(|p| p[0].process != p[1].process)
                .map(|p| (p[1].acquired - p[0].releasing) as f64 / 1000.0)
                .collect(),
            waits: records
                .iter()
                .map(|r| (r.acquired - r.called) as f64 / 1000.0)
                .collect(),
            round_trips: per_unit(&counts, records.len() as f64).1,
            owners: records.iter().map(|r| r.process).collect(),
            rtt: (rtt_before + rtt_after) / 2,
        });
    }
    assert!(
        admin.scan("fencelock:{*}lock:*").await.is_empty(),
        "W4: a lock was left held"
    );

    let mut text = contended_table(
        "W4: 4 processes × 4 tasks, one key (this binary re-executed as children)",
        "process",
        &runs,
    );
    let _ = writeln!(
        text,
        "\nTimestamps are wall-clock (CLOCK_REALTIME, shared by the processes); the holder's \
         interval [acquired, release started] of consecutive acquisitions never overlapped, and \
         fencelock's tokens increased in grant order. \"fencelock (fair)\" is the same library \
         with `fair_handoff` (grace {} ms). Five processes (4 children + the \
         redis-server) share 2 cores. Statistics cover the window in which all four processes \
         competed ({}).\n",
        common::FAIR_GRACE.as_millis(),
        runs.iter()
            .zip(&windows)
            .map(|(r, (kept, all))| format!("{}: {kept} of {all} acquisitions", r.kind.label()))
            .collect::<Vec<_>>()
            .join("; ")
    );
    for line in &starvation {
        let _ = writeln!(text, "- {line}");
    }
    let _ = writeln!(text, "\n{PEER_NOTE}\n");
    report.section(text);
    let ours = &runs[0];
    let p50 = ours.in_rtt(percentile(&ours.handoffs, 50.0));
    report.target(
        "W4a",
        "handoff p50 ≤ 4 raw RTT",
        format!("{p50:.1} RTT"),
        p50 <= 4.0,
    );
    report.target(
        "W4b",
        "max wait < 10 × mean wait",
        format!("{:.1}×", ours.wait_ratio()),
        ours.wait_ratio() < 10.0,
    );
    let fair = runs
        .iter()
        .find(|r| r.kind == Kind::OursFair)
        .expect("fair run");
    report.target(
        "W4b fair",
        "max wait < 10 × mean wait, with `fair_handoff` (opt-in)",
        format!("{:.1}×", fair.wait_ratio()),
        fair.wait_ratio() < 10.0,
    );
    report.cdfs.push((
        "W4: 4 processes x 4 tasks".into(),
        us(ours.rtt),
        cdf_series(&runs, "process"),
    ));
}

// ---------------------------------------------------------------------------------------------
// W5: the watchdog at scale.

/// Acquires `names` with up to 64 acquisitions in flight; returns what is held, in order.
async fn hold_many(lockers: Vec<Locker>) -> Vec<(Locker, Held)> {
    let lockers = Arc::new(parking_lot::Mutex::new(
        lockers.into_iter().enumerate().collect::<Vec<_>>(),
    ));
    let mut set = JoinSet::new();
    for _ in 0..64 {
        let lockers = lockers.clone();
        set.spawn(async move {
            let mut held = Vec::new();
            loop {
                let next = lockers.lock().pop();
                let Some((i, locker)) = next else {
                    return held;
                };
                let h = locker.acquire().await;
                held.push((i, locker, h));
            }
        });
    }
    let mut all = Vec::new();
    while let Some(joined) = set.join_next().await {
        all.extend(joined.expect("hold task"));
    }
    all.sort_by_key(|(i, _, _)| *i);
    all.into_iter().map(|(_, l, h)| (l, h)).collect()
}

async fn release_many(held: Vec<(Locker, Held)>) {
    let held = Arc::new(parking_lot::Mutex::new(held));
    let mut set = JoinSet::new();
    for _ in 0..64 {
        let held = held.clone();
        set.spawn(async move {
            loop {
                let next = held.lock().pop();
                let Some((locker, h)) = next else { return };
                locker.release(h).await;
            }
        });
    }
    while let Some(joined) = set.join_next().await {
        joined.expect("release task");
    }
}

/// Waits until the server has run everything sent so far: its EVALSHA count stands still.
async fn settle(admin: &mut Admin) {
    let mut last = u64::MAX;
    loop {
        let now = admin
            .command_stats()
            .await
            .get("evalsha")
            .map_or(0, |s| s.0);
        if now == last {
            return;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the watchdog finished a tick: its call count moved and then stood still.
async fn next_tick(client: &LockClient, after: u64, expected: u64) -> u64 {
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < give_up,
            "W5: the watchdog did not renew for a minute"
        );
        let calls = client.renewal_calls();
        if calls >= after + expected {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let settled = client.renewal_calls();
            if settled == calls {
                return calls;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn w5(cfg: &Cfg, report: &mut Report) {
    let locks: usize = cfg.pick(10_000, 300);
    // 3 s in the smoke run too: it asserts that every guard stayed valid, and with 1.5 s a
    // loaded machine slowing one tick of a few hundred locks could let leases run out.
    let lease = cfg.secs(3.0, 3.0);
    let period = lease / 3;
    let ticks = cfg.pick(5u32, 2);
    let batch = 100; // the default renew_batch
    let bound = locks.div_ceil(batch) as u64;

    // fencelock: one client, its watchdog renews everything every lease/3.
    let server = common::start_server();
    let mut admin = Admin::new(&server).await;
    let client = LockClient::builder(server.url())
        .default_lease(lease)
        .connect()
        .await
        .expect("connect");
    let lockers = (0..locks)
        .map(|i| Locker::Ours(client.lock(format!("w5-{i}")).expect("name")))
        .collect();
    let held = hold_many(lockers).await;
    assert_eq!(client.watched_locks(), locks);
    let c0 = next_tick(&client, client.renewal_calls(), 1).await;
    settle(&mut admin).await;
    admin.reset_stats().await;
    let (cpu0, rcpu0, t0) = (process_cpu(), admin.cpu().await, Instant::now());
    let mut calls = c0;
    for _ in 0..ticks {
        calls = next_tick(&client, calls, bound).await;
    }
    settle(&mut admin).await;
    let (cpu1, rcpu1, elapsed) = (process_cpu(), admin.cpu().await, t0.elapsed());
    let stats = admin.command_stats().await;
    let evalsha = stats.get("evalsha").map_or(0, |s| s.0);
    let ours_calls = (calls - c0) as f64 / f64::from(ticks);
    let ours_evalsha = evalsha as f64 / f64::from(ticks);
    let ours_cpu = us(cpu1 - cpu0) / f64::from(ticks);
    let ours_rcpu = us(rcpu1.saturating_sub(rcpu0)) / f64::from(ticks);
    assert!(
        held.iter().all(|(_, h)| match h {
            Held::Ours(g) => g.is_valid(),
            _ => false,
        }),
        "W5: a held lock was lost while the watchdog renewed"
    );
    release_many(held).await;
    assert_eq!(client.watched_locks(), 0);
    drop(client);
    drop(server);

    // distkit: one refresh task per guard, each its own script call every ttl/3.
    let server = common::start_server();
    let mut admin = Admin::new(&server).await;
    let contenders = Contenders::connect(&server.url()).await;
    let lockers = (0..locks)
        .map(|i| {
            let key = distkit::DistkitRedisKey::try_from(format!("w5-{i}")).expect("key");
            let options = distkit::lock::LockOptions::builder(key, contenders.distkit.clone())
                .ttl(lease)
                .build();
            Locker::Distkit(distkit::lock::Mutex::new(options))
        })
        .collect();
    let held = hold_many(lockers).await;
    tokio::time::sleep(period).await;
    admin.reset_stats().await;
    let (cpu0, rcpu0) = (process_cpu(), admin.cpu().await);
    tokio::time::sleep(period * ticks).await;
    let (cpu1, rcpu1) = (process_cpu(), admin.cpu().await);
    let stats = admin.command_stats().await;
    let dk_evalsha = stats.get("evalsha").map_or(0, |s| s.0) as f64 / f64::from(ticks);
    let dk_cpu = us(cpu1 - cpu0) / f64::from(ticks);
    let dk_rcpu = us(rcpu1.saturating_sub(rcpu0)) / f64::from(ticks);
    release_many(held).await;

    let mut text = format!(
        "### W5: watchdog at scale ({locks} held locks, lease {lease:?}, renewal every {period:?})\n\n\
         | contender | script calls / tick (client count) | EVALSHA / tick (server) | bound ceil(n / batch) | client CPU / tick | Redis CPU / tick |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n"
    );
    let _ = writeln!(
        text,
        "| {} | {ours_calls:.1} | {ours_evalsha:.1} | {bound} | {} | {} |",
        Kind::Ours.label(),
        fmt_us(ours_cpu),
        fmt_us(ours_rcpu)
    );
    let _ = writeln!(
        text,
        "| {} | – | {dk_evalsha:.1} | – | {} | {} |",
        Kind::Distkit.label(),
        fmt_us(dk_cpu),
        fmt_us(dk_rcpu)
    );
    let _ = writeln!(
        text,
        "\nfencelock measured over {ticks} ticks ({:.1} s, tick boundaries from \
         `LockClient::renewal_calls()`), distkit over {ticks} renewal periods. Client CPU: \
         the sum of this process' threads' on-CPU time (/proc/self/task/*/schedstat); Redis \
         CPU: `INFO cpu` used_cpu_user + used_cpu_sys. rslock has no watchdog (its `using` \
         extends one lock at a time). Every fencelock guard was still valid after the ticks.\n\n\
         {PEER_NOTE}\n",
        elapsed.as_secs_f64()
    );
    report.section(text);
    report.target(
        "W5",
        format!("≤ ceil({locks} / {batch}) = {bound} script calls per tick"),
        format!("{ours_calls:.1} (server saw {ours_evalsha:.1})"),
        ours_calls <= bound as f64 && ours_evalsha <= bound as f64,
    );
}

/// `n` cycles of `ours` and `n` of `limit` per round, in alternating order from round to round
/// (so warm-up and drift hit both alike): the per-cycle times of each, and per-round ratios.
async fn interleaved(
    rounds: usize,
    n: u32,
    mut ours: impl AsyncFnMut(),
    mut limit: impl AsyncFnMut(),
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut ours_us, mut limit_us, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut pair = [0.0; 2];
        for i in 0..2 {
            let which = (i + round) % 2;
            let started = Instant::now();
            for _ in 0..n {
                if which == 0 {
                    ours().await;
                } else {
                    limit().await;
                }
            }
            pair[which] = us(started.elapsed()) / f64::from(n);
        }
        ours_us.push(pair[0]);
        limit_us.push(pair[1]);
        ratios.push(pair[0] / pair[1]);
    }
    (ours_us, limit_us, ratios)
}

// ---------------------------------------------------------------------------------------------
// W6: re-entry depth, interleaved with its limit.

async fn w6(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let Locker::Ours(lock) = contenders.locker(Kind::Ours, "w6") else {
        unreachable!()
    };
    let keys = contenders.limit.keys("w6");
    let rounds = cfg.pick(40, 2);
    let mut text = String::from(
        "### W6: re-entry depth (acquire, `reenter()` d times, release all d + 1 guards)\n\n\
         | depth d | round trips | fencelock | limit (same number of raw EVALSHA) | ratio | per re-entry + its release |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let mut base = f64::NAN;
    for depth in [0usize, 1, 4, 16] {
        let n = cfg.pick((64 / (depth + 1)).max(4) as u32, 2);
        let (ours, limit, ratios) = interleaved(
            rounds,
            n,
            async || common::reentry_cycle(&lock, depth).await,
            async || common::limit_reentry_cycle(&contenders.limit, &keys, depth).await,
        )
        .await;
        let t = median(&ours);
        if depth == 0 {
            base = t;
        }
        let per = if depth == 0 {
            "–".to_owned()
        } else {
            fmt_us((t - base) / depth as f64)
        };
        let _ = writeln!(
            text,
            "| {depth} | {} | {} | {} | {:.2} | {per} |",
            2 * (depth + 1),
            fmt_us(t),
            fmt_us(median(&limit)),
            median(&ratios),
        );
    }
    let _ = writeln!(
        text,
        "\n{rounds} interleaved rounds; ratio = median of per-round ratios. Peers have no \
         re-entry.\n"
    );
    report.section(text);
}

// ---------------------------------------------------------------------------------------------
// W8: leadership: a campaign on a free election, and a resignation's handoff to the next
// candidate, against raw EVALSHA round trips measured interleaved with them.

async fn w8(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let follower = LockClient::connect(&server.url())
        .await
        .expect("connect the candidate");
    let leading = contenders.ours.election("w8").expect("name");
    let waiting = follower.election("w8").expect("name");
    let limit = &contenders.limit;
    let keys = limit.keys("w8");
    let rounds = cfg.pick(40, 2);
    let n: u32 = cfg.pick(32, 2);

    // (a) campaign + resign on a free election: acquire, announce, release = 3 round trips;
    // the limit is 3 raw EVALSHA one after another.
    let (ours, raw, ratios) = interleaved(
        rounds,
        n,
        async || {
            let guard = leading.campaign(b"w8").await.expect("campaign");
            guard.resign().await.expect("resign");
        },
        async || {
            let first = limit.acquire(&keys).await;
            let _second = limit.acquire(&keys).await;
            limit.release(&keys, &first).await;
        },
    )
    .await;
    let (campaign, campaign_limit, campaign_ratio) = (median(&ours), median(&raw), median(&ratios));

    // (b) handoff: a candidate of another client waits in `campaign`; the time from the
    // leader's `resign()` call to the candidate's guard (release, the message, the candidate's
    // acquisition and announcement), against one raw EVALSHA measured right after it.
    let (mut handoffs, mut trips) = (Vec::new(), Vec::new());
    for _ in 0..rounds * 4 {
        let guard = leading.campaign(b"leader").await.expect("campaign");
        let candidate = waiting.clone();
        let next = tokio::spawn(async move { candidate.campaign(b"next").await });
        // Let the candidate try once and subscribe; if it has not yet, its first attempt
        // finds the election free, which only shortens this sample.
        tokio::time::sleep(Duration::from_millis(cfg.pick(20, 5))).await;
        let started = Instant::now();
        guard.resign().await.expect("resign");
        let next = next
            .await
            .expect("candidate task")
            .expect("candidate campaign");
        handoffs.push(us(started.elapsed()));
        next.resign().await.expect("resign");
        let started = Instant::now();
        let holder = limit.acquire(&keys).await;
        trips.push(us(started.elapsed()));
        limit.release(&keys, &holder).await;
    }
    let trip = median(&trips);
    let mut text = String::from(
        "### W8: leadership (campaign on a free election; resignation handoff)\n\n\
         | what | round trips | fencelock | limit | ratio |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
    );
    let _ = writeln!(
        text,
        "| campaign + resign, free election | 3 | {} | {} (3 raw EVALSHA) | {campaign_ratio:.2} |",
        fmt_us(campaign),
        fmt_us(campaign_limit),
    );
    for (label, p) in [("p50", 50.0), ("p99", 99.0)] {
        let h = percentile(&handoffs, p);
        let _ = writeln!(
            text,
            "| resign -> next leader's guard, {label} | 3 + a message | {} | {} (1 raw EVALSHA, p50) | {:.2} |",
            fmt_us(h),
            fmt_us(trip),
            h / trip,
        );
    }
    let _ = writeln!(
        text,
        "\n{rounds} interleaved rounds of {n} campaigns; {} handoffs, each followed by one raw \
         round trip. Peers have no election.\n",
        handoffs.len()
    );
    report.section(text);
}

// ---------------------------------------------------------------------------------------------
// W9: run-once scheduled jobs: a run on a free tick, and the two skips, against raw EVALSHA
// round trips measured interleaved with them.

async fn w9(cfg: &Cfg, report: &mut Report) {
    use fencelock::JobOptions;
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let other = LockClient::connect(&server.url())
        .await
        .expect("connect the other instance");
    let period = Duration::from_secs(60);
    let options = JobOptions::new(period, Duration::from_secs(30));
    let ours = contenders.ours.job("w9", options.clone()).expect("job");
    let limit = &contenders.limit;
    let keys = limit.keys("w9");
    let rounds = cfg.pick(40, 2);
    let n: u32 = cfg.pick(32, 2);
    let first = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let raw_trips = async |trips: usize| {
        let holder = limit.acquire(&keys).await;
        for _ in 2..trips {
            let _replay = limit.acquire(&keys).await;
        }
        limit.release(&keys, &holder).await;
    };

    // (a) a run on a free tick: acquire, begin, finish, release = 4 round trips.
    let mut tick = 0u32;
    let (run, run_limit, run_ratios) = interleaved(
        rounds,
        n,
        async || {
            tick += 1;
            let outcome = ours
                .run_exclusive(first + period * tick, |_run| async {})
                .await
                .expect("run");
            assert!(outcome.ran());
        },
        async || raw_trips(4).await,
    )
    .await;

    // (b) the tick is done and the job free (a late instance): acquire, begin (done),
    // release = 3 round trips.
    let done_tick = first + period * (tick + 1);
    assert!(ours
        .run_exclusive(done_tick, |_run| async {})
        .await
        .expect("run")
        .ran());
    let (done, done_limit, done_ratios) = interleaved(
        rounds,
        n,
        async || {
            let outcome = ours
                .run_exclusive(done_tick, |_run| async {})
                .await
                .expect("skip");
            assert!(matches!(outcome, fencelock::JobOutcome::SkippedDone { .. }));
        },
        async || raw_trips(3).await,
    )
    .await;

    // (c) another instance runs the tick: try_acquire (busy) and the record's read = 2 round
    // trips.
    let busy_tick = first + period * (tick + 2);
    let (began_tx, began_rx) = tokio::sync::oneshot::channel();
    let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
    let runner = other.job("w9", options).expect("job");
    let running = tokio::spawn(async move {
        runner
            .run_exclusive(busy_tick, |_run| async move {
                began_tx.send(()).expect("began");
                end_rx.await.expect("end");
            })
            .await
            .expect("the other instance's run")
    });
    began_rx.await.expect("the other instance began");
    let (busy, busy_limit, busy_ratios) = interleaved(
        rounds,
        n,
        async || {
            let outcome = ours
                .run_exclusive(busy_tick, |_run| async {})
                .await
                .expect("skip");
            assert!(matches!(
                outcome,
                fencelock::JobOutcome::SkippedRunning { record: Some(_) }
            ));
        },
        async || raw_trips(2).await,
    )
    .await;
    end_tx.send(()).expect("end");
    assert!(running.await.expect("runner task").ran());

    let mut text = String::from(
        "### W9: run-once scheduled jobs (`Job::run_exclusive`)\n\n\
         | what | round trips | fencelock | limit (same number of raw EVALSHA) | ratio |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
    );
    for (label, trips, ours, limit, ratios) in [
        (
            "ran: a free tick, an empty job",
            4,
            &run,
            &run_limit,
            &run_ratios,
        ),
        (
            "skipped: the tick is done, the job free",
            3,
            &done,
            &done_limit,
            &done_ratios,
        ),
        (
            "skipped: another instance runs it",
            2,
            &busy,
            &busy_limit,
            &busy_ratios,
        ),
    ] {
        let _ = writeln!(
            text,
            "| {label} | {trips} | {} | {} | {:.2} |",
            fmt_us(median(ours)),
            fmt_us(median(limit)),
            median(ratios),
        );
    }
    let _ = writeln!(
        text,
        "\n{rounds} interleaved rounds of {n} calls each; ratio = median of per-round ratios. \
         Peers have no scheduled job.\n"
    );
    report.section(text);
}

// ---------------------------------------------------------------------------------------------
// W10: semaphores and read-write locks: the uncontended calls, throughput under contention and
// a writer's handoff, each against raw EVALSHA measured in the same run; memory per holder.

/// Calls per second of `tasks` tasks each running `cycle` in a loop for `window`.
async fn throughput<F, Fut>(tasks: usize, window: Duration, cycle: F) -> f64
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + window;
    let mut running = Vec::new();
    for task in 0..tasks {
        let (cycle, done) = (cycle.clone(), done.clone());
        running.push(tokio::spawn(async move {
            while Instant::now() < until {
                cycle(task).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in running {
        task.await.expect("throughput task");
    }
    done.load(Ordering::Relaxed) as f64 / window.as_secs_f64()
}

async fn w10(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let ours = &contenders.ours;
    let limit = contenders.limit.clone();
    let keys = limit.keys("w10");
    let rounds = cfg.pick(40, 2);
    let n: u32 = cfg.pick(32, 2);
    let raw_pair = async || {
        let holder = limit.acquire(&keys).await;
        limit.release(&keys, &holder).await;
    };

    // (a) uncontended: acquire + release, 2 round trips each.
    let pool = ours.semaphore("w10-pool", 4).expect("semaphore");
    let (sem, sem_limit, sem_ratios) = interleaved(
        rounds,
        n,
        async || {
            pool.acquire(1)
                .await
                .expect("permit")
                .release()
                .await
                .expect("release")
        },
        async || raw_pair().await,
    )
    .await;
    let rw = ours.rwlock("w10-rw").expect("rwlock");
    let (read, read_limit, read_ratios) = interleaved(
        rounds,
        n,
        async || {
            rw.read()
                .await
                .expect("read")
                .release()
                .await
                .expect("release")
        },
        async || raw_pair().await,
    )
    .await;
    let (write, write_limit, write_ratios) = interleaved(
        rounds,
        n,
        async || {
            rw.write()
                .await
                .expect("write")
                .release()
                .await
                .expect("release")
        },
        async || raw_pair().await,
    )
    .await;

    // (b) throughput under contention, against the same number of tasks doing raw
    // acquire + release pairs on keys of their own (nothing to wait for: the round-trip
    // limit of that concurrency).
    let window = cfg.pick(Duration::from_secs(3), Duration::from_millis(300));
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(LockClient::connect(&server.url()).await.expect("connect"));
    }
    let raw_limit = |tasks: usize| {
        let limit = limit.clone();
        async move {
            throughput(tasks, window, move |task| {
                let limit = limit.clone();
                async move {
                    let keys = limit.keys(&format!("w10-raw-{task}"));
                    let holder = limit.acquire(&keys).await;
                    limit.release(&keys, &holder).await;
                }
            })
            .await
        }
    };
    let readers = {
        let clients = clients.clone();
        throughput(64, window, move |task| {
            let lock = clients[task % 4].rwlock("w10-shared").expect("rwlock");
            async move {
                lock.read()
                    .await
                    .expect("read")
                    .release()
                    .await
                    .expect("release")
            }
        })
        .await
    };
    let readers_limit = raw_limit(64).await;
    let mut sem_rates = Vec::new();
    for permits in [4u32, 16] {
        let clients = clients.clone();
        let rate = throughput(16, window, move |task| {
            let pool = clients[task % 4]
                .semaphore(format!("w10-n{permits}"), permits)
                .expect("semaphore");
            async move {
                pool.acquire(1)
                    .await
                    .expect("permit")
                    .release()
                    .await
                    .expect("release")
            }
        })
        .await;
        sem_rates.push((permits, rate));
    }
    let sem_limit_rate = raw_limit(16).await;

    // (c) a writer's handoff with readers present: 8 readers hold, a writer waits; from the
    // start of the last reader's release to the writer's guard (release, publish, the
    // writer's attempt: 2 round trips), against 2 raw EVALSHA measured right after.
    let mut handoffs = Vec::new();
    let mut handoff_limits = Vec::new();
    for _ in 0..cfg.pick(30, 2) {
        let shared = clients[0].rwlock("w10-handoff").expect("rwlock");
        let mut reads = Vec::new();
        for i in 0..8 {
            reads.push(
                clients[i % 4]
                    .rwlock("w10-handoff")
                    .expect("rwlock")
                    .read()
                    .await
                    .expect("read"),
            );
        }
        let writer = clients[1].rwlock("w10-handoff").expect("rwlock");
        let waiting = tokio::spawn(async move {
            let write = writer.write().await.expect("write");
            let at = Instant::now();
            write.release().await.expect("release");
            at
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let last = reads.pop().expect("a reader");
        for read in reads {
            read.release().await.expect("release");
        }
        let started = Instant::now();
        last.release().await.expect("release");
        let granted = waiting.await.expect("writer");
        handoffs.push(us(granted - started));
        let started = Instant::now();
        raw_pair().await;
        handoff_limits.push(us(started.elapsed()));
        drop(shared);
    }

    // (d) memory: the semaphore's and the read-write lock's keys with 1 and with 101 holds.
    let mut admin = Admin::new(&server).await;
    let mut bytes = Vec::new();
    for (what, pattern) in [("permit holder", "sem"), ("reader", "rw")] {
        let mut sizes = Vec::new();
        for holders in [1usize, 101] {
            let name = format!("w10-mem-{holders}");
            let mut held_sems = Vec::new();
            let mut held_reads = Vec::new();
            for _ in 0..holders {
                if pattern == "sem" {
                    held_sems.push(
                        ours.semaphore(&name, 1000)
                            .expect("semaphore")
                            .acquire(1)
                            .await
                            .expect("permit"),
                    );
                } else {
                    held_reads.push(
                        ours.rwlock(&name)
                            .expect("rwlock")
                            .read()
                            .await
                            .expect("read"),
                    );
                }
            }
            let mut total = 0;
            for key in admin
                .scan(&format!("fencelock:{{*}}{pattern}*:{name}"))
                .await
            {
                total += admin.memory_usage(&key).await;
            }
            sizes.push(total);
            for permit in held_sems {
                permit.release().await.expect("release");
            }
            for read in held_reads {
                read.release().await.expect("release");
            }
        }
        bytes.push((what, sizes[0], (sizes[1] - sizes[0]) as f64 / 100.0));
    }

    let mut text = String::from(
        "### W10: semaphores and read-write locks\n\n\
         | what | round trips | fencelock | limit (same number of raw EVALSHA) | ratio |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
    );
    for (label, ours, limit, ratios) in [
        (
            "semaphore: acquire(1) + release, free",
            &sem,
            &sem_limit,
            &sem_ratios,
        ),
        (
            "read-write lock: read + release, free",
            &read,
            &read_limit,
            &read_ratios,
        ),
        (
            "read-write lock: write + release, free",
            &write,
            &write_limit,
            &write_ratios,
        ),
    ] {
        let _ = writeln!(
            text,
            "| {label} | 2 | {} | {} | {:.2} |",
            fmt_us(median(ours)),
            fmt_us(median(limit)),
            median(ratios),
        );
    }
    let _ = writeln!(
        text,
        "| a writer's handoff from 8 readers (last release to the writer's guard) | 2 | {} | {} | {:.2} |",
        fmt_us(median(&handoffs)),
        fmt_us(median(&handoff_limits)),
        median(&handoffs) / median(&handoff_limits),
    );
    let _ = writeln!(
        text,
        "\n{rounds} interleaved rounds of {n} calls each for the free calls; ratio = median of \
         per-round ratios. The handoff: median of {} handoffs, each followed by 2 raw EVALSHA.\n\n\
         | under contention ({:.1} s windows) | fencelock, calls/s | raw acquire + release pairs/s, same tasks | ratio |\n\
         | --- | ---: | ---: | ---: |",
        handoffs.len(),
        window.as_secs_f64(),
    );
    let _ = writeln!(
        text,
        "| 64 readers of one read-write lock, 4 clients | {readers:.0} | {readers_limit:.0} | {:.2} |",
        readers / readers_limit
    );
    for (permits, rate) in &sem_rates {
        let _ = writeln!(
            text,
            "| semaphore of {permits} permits, 16 contenders, 4 clients | {rate:.0} | {sem_limit_rate:.0} | {:.2} |",
            rate / sem_limit_rate
        );
    }
    let _ = writeln!(
        text,
        "\nThe raw pairs take keys of their own, so nothing waits: the concurrency's round-trip \
         limit. Waiting permits go through pub/sub.\n\n\
         | Redis memory (`MEMORY USAGE`, all keys of the name) | with 1 hold | per further hold |\n\
         | --- | ---: | ---: |"
    );
    for (what, one, per) in bytes {
        let _ = writeln!(text, "| {what} | {one} B | {per:.0} B |");
    }
    let _ = writeln!(text);
    report.section(text);
}

// ---------------------------------------------------------------------------------------------
// W11: the two ways a semaphore keeps its holds' deadlines (hash-field expiry, lease zset), on
// one server that has both, each against the other in the same run.

async fn w11(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let connect = async |expiry: HoldExpiry| {
        LockClient::builder(server.url())
            .hold_expiry(expiry)
            .connect()
            .await
            .expect("connect")
    };
    let probe = connect(HoldExpiry::Auto).await;
    if probe.hold_expiry() != HoldExpiry::FieldExpiry {
        report.section(format!(
            "### W11: hash-field expiry against the lease zset: skipped ({} has no hash-field \
             expiry; set FENCELOCK_REDIS_SERVER to a Redis 7.4+ or Valkey 9.0+ binary)\n",
            probe.server()
        ));
        return;
    }
    let ways = [HoldExpiry::FieldExpiry, HoldExpiry::LeaseZset];
    let mut clients = Vec::new();
    for way in ways {
        let mut four = Vec::new();
        for _ in 0..4 {
            four.push(connect(way).await);
        }
        clients.push(four);
    }
    // (a) uncontended read + release, 2 round trips each way.
    let (fields_rw, zset_rw) = (
        clients[0][0].rwlock("w11-free-f").expect("rwlock"),
        clients[1][0].rwlock("w11-free-z").expect("rwlock"),
    );
    let (free_fields, free_zset, free_ratios) = interleaved(
        cfg.pick(40, 2),
        cfg.pick(32, 2),
        async || read_release_owned(fields_rw.clone()).await,
        async || read_release_owned(zset_rw.clone()).await,
    )
    .await;
    // (b) 64 readers of one lock and (c) a semaphore of 4 permits with 16 contenders, each
    // way, on locks of their own.
    let window = cfg.pick(Duration::from_secs(3), Duration::from_millis(300));
    let mut readers = Vec::new();
    let mut sems = Vec::new();
    for (way, four) in ways.iter().zip(&clients) {
        let four = four.clone();
        let name = format!("w11-readers-{way:?}");
        readers.push(
            throughput(64, window, move |task| {
                let lock = four[task % 4].rwlock(&name).expect("rwlock");
                async move { read_release_owned(lock).await }
            })
            .await,
        );
    }
    for (way, four) in ways.iter().zip(&clients) {
        let four = four.clone();
        let name = format!("w11-sem-{way:?}");
        sems.push(
            throughput(16, window, move |task| {
                let pool = four[task % 4].semaphore(&name, 4).expect("semaphore");
                async move {
                    pool.acquire(1)
                        .await
                        .expect("permit")
                        .release()
                        .await
                        .expect("release")
                }
            })
            .await,
        );
    }
    // (d) memory with 1 and 101 readers, each way.
    let mut admin = Admin::new(&server).await;
    let mut bytes = Vec::new();
    for (way, four) in ways.iter().zip(&clients) {
        let mut sizes = Vec::new();
        for holders in [1usize, 101] {
            let name = format!("w11-mem-{way:?}-{holders}");
            let mut reads = Vec::new();
            for _ in 0..holders {
                reads.push(
                    four[0]
                        .rwlock(&name)
                        .expect("rwlock")
                        .read()
                        .await
                        .expect("read"),
                );
            }
            let mut total = 0;
            for key in admin.scan(&format!("fencelock:{{*}}rw*:{name}")).await {
                total += admin.memory_usage(&key).await;
            }
            sizes.push(total);
            for read in reads {
                read.release().await.expect("release");
            }
        }
        bytes.push((sizes[0], (sizes[1] - sizes[0]) as f64 / 100.0));
    }

    let mut text = format!(
        "### W11: hash-field expiry against the lease zset ({})\n\n\
         | what | field expiry | lease zset | ratio (field expiry / lease zset) |\n\
         | --- | ---: | ---: | ---: |\n",
        probe.server()
    );
    let _ = writeln!(
        text,
        "| read-write lock: read + release, free | {} | {} | {:.2} |",
        fmt_us(median(&free_fields)),
        fmt_us(median(&free_zset)),
        median(&free_ratios),
    );
    let _ = writeln!(
        text,
        "| 64 readers of one read-write lock, 4 clients, calls/s ({:.1} s windows) | {:.0} | {:.0} | {:.2} |",
        window.as_secs_f64(),
        readers[0],
        readers[1],
        readers[0] / readers[1],
    );
    let _ = writeln!(
        text,
        "| semaphore of 4 permits, 16 contenders, 4 clients, calls/s | {:.0} | {:.0} | {:.2} |",
        sems[0],
        sems[1],
        sems[0] / sems[1],
    );
    let _ = writeln!(
        text,
        "| Redis memory, read-write lock with 1 reader | {} B | {} B | {:.2} |",
        bytes[0].0,
        bytes[1].0,
        bytes[0].0 as f64 / bytes[1].0 as f64,
    );
    let _ = writeln!(
        text,
        "| Redis memory per further reader | {:.0} B | {:.0} B | {:.2} |\n",
        bytes[0].1,
        bytes[1].1,
        bytes[0].1 / bytes[1].1,
    );
    report.section(text);
}

/// One read of `lock`, released at once.
async fn read_release_owned(lock: fencelock::RwLock) {
    lock.read()
        .await
        .expect("read")
        .release()
        .await
        .expect("release");
}

// ---------------------------------------------------------------------------------------------
// W7: memory, server side and client side.

async fn w7(cfg: &Cfg, report: &mut Report) {
    let held_n: usize = cfg.pick(10_000, 300);
    let names_n: usize = cfg.pick(100_000, 2_000);
    let mut text = String::from("### W7: memory\n\n");

    // --- Redis: one lock, its fence counter and op record.
    let server = common::start_server();
    let mut admin = Admin::new(&server).await;
    let client = LockClient::connect(&server.url()).await.expect("connect");
    let guard = client
        .lock("account:42")
        .expect("name")
        .acquire()
        .await
        .expect("acquire");
    let lock_key = admin.scan("fencelock:{*}lock:account:42").await;
    let fence_key = admin.scan("fencelock:{*}fence").await;
    assert_eq!((lock_key.len(), fence_key.len()), (1, 1));
    let one_lock = admin.memory_usage(&lock_key[0]).await;
    let one_fence = admin.memory_usage(&fence_key[0]).await;
    guard.release().await.expect("release");
    let op_key = admin.scan("fencelock:{*}op:*").await;
    let one_op = admin.memory_usage(&op_key[0]).await;

    // --- Redis: used_memory over many held locks, counters already created and earlier op
    // records removed, so the delta is the lock hashes plus each acquire's own op record.
    let lockers = |client: &LockClient| -> Vec<Locker> {
        (0..held_n)
            .map(|i| Locker::Ours(client.lock(format!("mem-{i}")).expect("name")))
            .collect()
    };
    release_many(hold_many(lockers(&client)).await).await;
    for keys in admin.scan("fencelock:{*}op:*").await.chunks(500) {
        let _: i64 = admin.query(redis::cmd("UNLINK").arg(keys)).await;
    }
    let m0 = admin.used_memory().await;
    let held = hold_many(lockers(&client)).await;
    let m1 = admin.used_memory().await;
    let ours_per_lock = (m1 - m0) as f64 / held_n as f64;
    release_many(held).await;

    // --- Redisson's layout, built by hand: lock hash `name` {"<uuid>:<threadId>": 1} with the
    // 30 s watchdog lease, plus RFencedLock's `redisson_lock_token:{name}` counter (no TTL).
    let m2 = admin.used_memory().await;
    for chunk in (0..held_n).collect::<Vec<_>>().chunks(500) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            let name = format!("redisson-mem-{i}");
            pipe.cmd("HSET")
                .arg(&name)
                .arg(format!("{REDISSON_UUID}:{}", 1 + i % 64))
                .arg(1)
                .ignore()
                .cmd("PEXPIRE")
                .arg(&name)
                .arg(30_000)
                .ignore()
                .cmd("INCR")
                .arg(format!("redisson_lock_token:{{{name}}}"))
                .ignore();
        }
        let () = admin.query(&pipe).await;
    }
    let m3 = admin.used_memory().await;
    let redisson_per_lock = (m3 - m2) as f64 / held_n as f64;
    let r_hash = admin.memory_usage(b"redisson-mem-0").await;
    let r_token = admin
        .memory_usage(b"redisson_lock_token:{redisson-mem-0}")
        .await;

    // --- Fence counters left after many distinct lock names (under a prefix of their own).
    let names = LockClient::builder(server.url())
        .prefix("names:")
        .connect()
        .await
        .expect("connect");
    let distinct: Vec<Locker> = (0..names_n)
        .map(|i| Locker::Ours(names.lock(format!("name-{i}")).expect("name")))
        .collect();
    release_many(hold_many(distinct).await).await;
    let counters = admin.scan("names:{*}fence").await.len();
    assert!(
        counters <= 16_384,
        "W7: {counters} fence counters, more than one per slot"
    );
    assert!(
        admin.scan("*{*}lock:*").await.is_empty(),
        "W7: a lock was left held"
    );
    drop((client, names));

    let _ = writeln!(
        text,
        "| Redis memory | fencelock | Redisson layout (built by hand, same server) |\n\
         | --- | ---: | ---: |\n\
         | `MEMORY USAGE` of one held lock (`account:42`) | {one_lock} B (hash) | {r_hash} B (hash) + {r_token} B (token key, RFencedLock) |\n\
         | `used_memory` delta per held lock, {held_n} held | {ours_per_lock:.0} B (hash + the acquire's op record) | {redisson_per_lock:.0} B (hash + token key) |\n\
         | per lock name ever used (kept forever) | ≤ 16384 fence counters in all, {one_fence} B each | one token key per name, {r_token} B each |\n\
         | counter keys after {names_n} distinct lock names | {counters} | {names_n} (by construction) |\n\
         | op record, one per hold (the release that frees the lock overwrites the acquisition's), kept for the op-record TTL (10 s) | {one_op} B each | – |\n"
    );
    report.target(
        "W7",
        "fence counter keys bounded (≤ 16384)",
        format!("{counters} after {names_n} names"),
        counters <= 16_384,
    );
    drop(admin);
    drop(server);

    // --- Client side: heap bytes per held lock and per waiter (counting allocator).
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let client_n: usize = cfg.pick(2_000, 100);
    let waiters_n: usize = cfg.pick(500, 20);
    let _ = writeln!(
        text,
        "\n| client heap (counting allocator) | per held lock | per waiting acquire (task included) |\n\
         | --- | ---: | ---: |"
    );
    COUNTING.store(true, Ordering::SeqCst);
    // An idle task parked on a future that never completes, as a reference for the waiters.
    let idle = {
        let before = live_bytes();
        let mut set = JoinSet::new();
        for _ in 0..waiters_n {
            set.spawn(std::future::pending::<()>());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let per = (live_bytes() - before) as f64 / waiters_n as f64;
        set.shutdown().await;
        per
    };
    for kind in [Kind::Ours, Kind::Rslock, Kind::Distkit] {
        // Held: the guards live in a vector allocated before the baseline, so the delta is what
        // the library keeps per lock on the heap (plus the guard's inline size, listed apart).
        let lockers: Vec<Locker> = (0..client_n)
            .map(|i| contenders.locker(kind, &format!("client-{}-{i}", kind.slug())))
            .collect();
        let mut held = Vec::with_capacity(client_n);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before = live_bytes();
        for locker in &lockers {
            held.push(locker.acquire().await);
        }
        let per_held = (live_bytes() - before) as f64 / client_n as f64;
        for (locker, h) in lockers.iter().zip(held) {
            locker.release(h).await;
        }

        // Waiting: one holder, many tasks blocked in acquire.
        let locker = Arc::new(contenders.locker(kind, &format!("client-wait-{}", kind.slug())));
        let holder = locker.acquire().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before = live_bytes();
        let mut set = JoinSet::new();
        for _ in 0..waiters_n {
            let waiter = Arc::new(contenders.locker(kind, &format!("client-wait-{}", kind.slug())));
            set.spawn(async move { waiter.acquire().await });
        }
        tokio::time::sleep(cfg.secs(0.5, 0.2)).await;
        let per_waiter = (live_bytes() - before) as f64 / waiters_n as f64;
        set.abort_all();
        while let Some(joined) = set.join_next().await {
            assert!(
                joined.is_err(),
                "W7 {kind:?}: a waiter acquired a held lock"
            );
        }
        locker.release(holder).await;
        let _ = writeln!(
            text,
            "| {} | {:.0} B heap + {} B guard | {:.0} B |",
            kind.label(),
            per_held,
            match kind {
                Kind::Ours => std::mem::size_of::<fencelock::LockGuard>(),
                Kind::Rslock => std::mem::size_of::<rslock::LockGuard>(),
                _ => std::mem::size_of::<distkit::lock::MutexGuard>(),
            },
            per_waiter
        );
    }
    COUNTING.store(false, Ordering::SeqCst);
    let _ = writeln!(
        text,
        "\nAn idle tokio task parked on `pending()` costs {idle:.0} B, for reference. The \
         waiting figure includes each waiter's spawned task, its `Lock`/mutex handle and the \
         acquire future. Redis figures from `MEMORY USAGE <key> SAMPLES 0` and `INFO memory` \
         used_memory deltas on a fresh server (Redis 7, jemalloc); the Redisson layout: \
         `HSET name <uuid>:<threadId> 1` + `PEXPIRE name 30000` + `INCR \
         redisson_lock_token:{{name}}`.\n\n{PEER_NOTE}\n"
    );
    report.section(text);
}

// ---------------------------------------------------------------------------------------------
// The plot: handoff latency CDFs.

fn load_font() -> bool {
    use plotters::style::FontStyle;
    let candidates = std::env::var("FENCELOCK_BENCH_FONT")
        .map(|f| vec![f])
        .unwrap_or_else(|_| {
            [
                "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                "/usr/share/fonts/TTF/DejaVuSans.ttf",
                "/usr/share/fonts/dejavu/DejaVuSans.ttf",
                "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
            ]
            .map(String::from)
            .to_vec()
        });
    for path in candidates {
        if let Ok(bytes) = std::fs::read(&path) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

/// One CDF line: handoff latencies in µs.
struct Series {
    label: String,
    values: Vec<f64>,
    color: usize,
    dashed: bool,
}

/// One plot panel: title, raw RTT in µs, lines.
type Panel = (String, f64, Vec<Series>);

fn plot(path: &Path, panels: &[Panel]) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let text = load_font();
    if !text {
        eprintln!(
            "no TrueType font found (set FENCELOCK_BENCH_FONT); drawing the plot without text"
        );
    }
    let (width, chart_height, legend_height) = (620u32, 440u32, 175u32);
    let root = BitMapBackend::new(
        path,
        (
            width * panels.len().max(1) as u32,
            chart_height + legend_height,
        ),
    )
    .into_drawing_area();
    root.fill(&WHITE)?;
    let colors = [
        RGBColor(0, 90, 181),
        RGBColor(220, 50, 32),
        RGBColor(0, 150, 60),
        RGBColor(140, 80, 160),
    ];
    for (panel_area, (title, rtt, series)) in root
        .split_evenly((1, panels.len().max(1)))
        .iter()
        .zip(panels)
    {
        // The chart on top, its legend below it (a legend inside would hide curves).
        let (area, legend) = panel_area.split_vertically(chart_height);
        let values = series.iter().flat_map(|s| s.values.iter().copied());
        let lo = values
            .clone()
            .filter(|v| *v > 0.0)
            .fold(f64::INFINITY, f64::min)
            .max(1.0)
            / 1000.0;
        let hi = values.fold(0.0, f64::max).max(1.0) / 1000.0 * 1.2;
        let lo = (lo * 0.8).min(hi / 10.0);
        let mut builder = ChartBuilder::on(&area);
        builder.margin(15);
        if text {
            builder
                .caption(title, ("sans-serif", 20))
                .x_label_area_size(45)
                .y_label_area_size(55);
        }
        let mut chart = builder.build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("handoff latency (ms, log scale)")
                .y_desc("fraction of handoffs ≤ x")
                .x_label_formatter(&|v| format!("{v}"))
                .label_style(("sans-serif", 13));
        } else {
            mesh.x_labels(0).y_labels(0);
        }
        mesh.draw()?;
        let rtt_ms = rtt / 1000.0;
        chart.draw_series(DashedLineSeries::new(
            vec![(rtt_ms, 0.0), (rtt_ms, 1.0)],
            4,
            4,
            BLACK.stroke_width(1),
        ))?;
        // (label, color, dashed, thin)
        let mut entries = vec![(
            format!("1 raw RTT ({rtt:.0} µs), measured in the same run"),
            BLACK,
            true,
            true,
        )];
        for line in series {
            if line.values.is_empty() {
                continue;
            }
            let mut sorted = line.values.clone();
            sorted.sort_by(f64::total_cmp);
            let n = sorted.len();
            let step = (n / 2000).max(1);
            let mut points: Vec<(f64, f64)> = sorted
                .iter()
                .enumerate()
                .filter(|(j, _)| j % step == 0 || *j == n - 1)
                .map(|(j, v)| ((v / 1000.0).max(lo), (j + 1) as f64 / n as f64))
                .collect();
            points.insert(0, (points[0].0, 0.0));
            let color = colors[line.color % colors.len()];
            if line.dashed {
                chart.draw_series(DashedLineSeries::new(points, 6, 4, color.stroke_width(2)))?;
            } else {
                chart.draw_series(LineSeries::new(points, color.stroke_width(2)))?;
            }
            entries.push((
                format!("{} (n = {n})", line.label),
                color,
                line.dashed,
                false,
            ));
        }
        if text {
            let rows = entries.len() as i32;
            legend.draw(&Text::new(
                "* peers: no re-entry, no fencing tokens",
                (70, 8 + 19 * rows - 7),
                ("sans-serif", 13).into_font().color(&BLACK.mix(0.6)),
            ))?;
            for (i, (label, color, dashed, thin)) in entries.into_iter().enumerate() {
                let (x, y) = (70, 8 + 19 * i as i32);
                let style = color.stroke_width(if thin { 1 } else { 2 });
                if dashed {
                    for dash in 0..3 {
                        let x0 = x + dash * 10;
                        legend.draw(&PathElement::new(vec![(x0, y), (x0 + 6, y)], style))?;
                    }
                } else {
                    legend.draw(&PathElement::new(vec![(x, y), (x + 26, y)], style))?;
                }
                legend.draw(&Text::new(label, (x + 36, y - 7), ("sans-serif", 14)))?;
            }
        }
    }
    root.present()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// --callgrind: instructions per uncontended cycle, client and server, counted by valgrind.
// Deterministic where time on a shared 2-core machine is not; this is the evidence for where the
// W1/W2 gaps come from. Needs `valgrind` on PATH; takes a few minutes.

const CYCLES_FLAG: &str = "--cycles";

/// `--cycles <kind> <url> <n>`: n uncontended acquire + release cycles on a current-thread
/// runtime (one thread: the least scheduling noise for callgrind). `<kind>` is a contender or
/// `variant:<i>`, our scripts with one call taken out (`common::script_variants`).
fn cycles_main(args: &[String]) {
    let [_, kind, url, n] = args else {
        panic!("cycles arguments: {args:?}");
    };
    let n: usize = n.parse().expect("n");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let locker = match kind.strip_prefix("variant:") {
                Some(i) => {
                    let variants = common::script_variants();
                    let (_, scripts) = &variants[i.parse::<usize>().expect("variant")];
                    let (acquire, release) = scripts.as_ref().expect("variant applies");
                    let raw = Raw::with_scripts(url, acquire, release).await;
                    let keys = raw.keys("callgrind");
                    Locker::Raw(Arc::new(raw), keys)
                }
                None => {
                    let contenders = Contenders::connect(url).await;
                    contenders.locker(Kind::from_slug(kind).expect("kind"), "callgrind")
                }
            };
            for _ in 0..n {
                locker.cycle().await;
            }
        });
}

/// The instructions callgrind counted (its `summary:` line).
fn callgrind_total(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).expect("callgrind output");
    text.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("callgrind summary")
}

/// Whether valgrind can be run here.
fn have_valgrind() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Counts instructions per cycle with callgrind, as the difference between two run lengths so
/// start-up and connection set-up cancel out.
struct Callgrind {
    exe: PathBuf,
    dir: PathBuf,
    redis: String,
    small: usize,
    large: usize,
}

impl Callgrind {
    fn new() -> Callgrind {
        let dir = std::env::temp_dir().join(format!("fencelock-callgrind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let redis = std::env::var("FENCELOCK_REDIS_SERVER").unwrap_or_else(|_| {
            std::env::var("PATH")
                .unwrap_or_default()
                .split(':')
                .map(|d| Path::new(d).join("redis-server"))
                .find(|p| p.exists())
                .expect("redis-server on PATH")
                .display()
                .to_string()
        });
        Callgrind {
            exe: std::env::current_exe().expect("current exe"),
            dir,
            redis,
            small: 200,
            large: 1200,
        }
    }

    fn cycles(&self, kind: &str, url: &str, n: usize, valgrind_out: Option<&Path>) {
        let mut command = match valgrind_out {
            Some(out) => {
                let mut c = Command::new("valgrind");
                c.arg("--tool=callgrind")
                    .arg(format!("--callgrind-out-file={}", out.display()))
                    .arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
        let status = command
            .args([CYCLES_FLAG, kind, url, &n.to_string()])
            .stderr(Stdio::null())
            .status()
            .expect("run cycles");
        assert!(status.success(), "cycles run failed");
    }

    fn per_cycle(&self, counts: [u64; 2]) -> f64 {
        (counts[1] - counts[0]) as f64 / (self.large - self.small) as f64
    }

    /// Client instructions per cycle: this binary under callgrind against a normal server.
    fn client(&self, kind: &str) -> f64 {
        let server = common::start_server();
        let mut counts = [0u64; 2];
        for (i, n) in [self.small, self.large].into_iter().enumerate() {
            let out = self
                .dir
                .join(format!("client-{kind}-{n}.out").replace(':', "-"));
            self.cycles(kind, &server.url(), n, Some(&out));
            counts[i] = callgrind_total(&out);
        }
        self.per_cycle(counts)
    }

    /// Server instructions per cycle: redis-server under callgrind (through a wrapper that the
    /// harness starts), shut down cleanly so that callgrind writes its counts.
    fn server(&self, kind: &str) -> f64 {
        let mut counts = [0u64; 2];
        for (i, n) in [self.small, self.large].into_iter().enumerate() {
            let name = format!("{kind}-{n}").replace(':', "-");
            let out = self.dir.join(format!("server-{name}.out"));
            let wrapper = self.dir.join(format!("redis-under-callgrind-{name}"));
            std::fs::write(
                &wrapper,
                format!(
                    "#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file={} {} \"$@\"\n",
                    out.display(),
                    self.redis
                ),
            )
            .expect("wrapper");
            let mut perms = std::fs::metadata(&wrapper).expect("wrapper").permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
            std::fs::set_permissions(&wrapper, perms).expect("chmod wrapper");
            let server = RedisServer::builder()
                .binary(&wrapper)
                .startup_timeout(Duration::from_secs(60))
                .start()
                .expect("redis-server under callgrind");
            self.cycles(kind, &server.url(), n, None);
            let mut conn = server.client().get_connection().expect("connection");
            let _ = redis::cmd("SHUTDOWN").arg("NOSAVE").query::<()>(&mut conn);
            let give_up = Instant::now() + Duration::from_secs(60);
            while server.is_running() && Instant::now() < give_up {
                std::thread::sleep(Duration::from_millis(100));
            }
            counts[i] = callgrind_total(&out);
        }
        self.per_cycle(counts)
    }
}

impl Drop for Callgrind {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn callgrind_section() -> String {
    let cg = Callgrind::new();
    let mut text = format!(
        "### Instructions per uncontended acquire + release (callgrind, {} cycles)\n\n\
         | contender | client instructions / cycle | server instructions / cycle | server vs limit |\n\
         | --- | ---: | ---: | ---: |\n",
        cg.large - cg.small
    );
    let mut limit = f64::NAN;
    let mut ours_scripts = f64::NAN;
    for kind in [
        Kind::Limit,
        Kind::OurScripts,
        Kind::Ours,
        Kind::Rslock,
        Kind::Distkit,
    ] {
        let (client, server) = (cg.client(kind.slug()), cg.server(kind.slug()));
        match kind {
            Kind::Limit => limit = server,
            Kind::OurScripts => ours_scripts = server,
            _ => {}
        }
        let _ = writeln!(
            text,
            "| {} | {client:.0} | {server:.0} | {:.2} |",
            kind.label(),
            server / limit
        );
        eprintln!("[callgrind {} done]", kind.slug());
    }
    let _ = writeln!(
        text,
        "\nEach figure is (count after {} cycles − count after {}) / {}, so start-up and \
         connection set-up cancel out. Client: this binary on a current-thread runtime under \
         `valgrind --tool=callgrind`; server: redis-server under callgrind (user-space \
         instructions; the kernel's share of a round trip is the same for every contender).\n\n\
         #### Where fencelock's server instructions go\n\n\
         Our scripts with one server call taken out at a time (the lock is always free when \
         acquired in this loop, so the lock key's type can be assumed), called raw:\n\n\
         | call taken out | server instructions / cycle | saved |\n| --- | ---: | ---: |\n\
         | (none: our scripts) | {ours_scripts:.0} | – |",
        cg.large,
        cg.small,
        cg.large - cg.small
    );
    for (i, (name, scripts)) in common::script_variants().into_iter().enumerate() {
        if scripts.is_none() {
            let _ = writeln!(text, "| {name} | n/a (the script changed) | |");
            continue;
        }
        let server = cg.server(&format!("variant:{i}"));
        let _ = writeln!(
            text,
            "| {name} | {server:.0} | {:.0} ({:.0} %) |",
            ours_scripts - server,
            100.0 * (ours_scripts - server) / ours_scripts
        );
        eprintln!("[callgrind variant {i} done]");
    }
    let _ = writeln!(
        text,
        "| (the limit's scripts) | {limit:.0} | {:.0} ({:.0} %) |",
        ours_scripts - limit,
        100.0 * (ours_scripts - limit) / ours_scripts
    );
    text
}

// ---------------------------------------------------------------------------------------------

fn machine(server_version: &str) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let commit = Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "describe",
            "--always",
            "--dirty",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let rustc = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!(
        "## Machine\n\n\
         - cores (nproc): {cores}\n\
         - CPU: {cpu}\n\
         - kernel: {}\n\
         - server: {server_version}\n\
         - {rustc}, release profile (`cargo bench`)\n\
         - fencelock at commit {commit}\n\
         - load average at start: {}\n",
        kernel.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some(CHILD_FLAG) => return child_main(&args[1..]),
        Some(CYCLES_FLAG) => return cycles_main(&args[1..]),
        _ => {}
    }
    if args.iter().any(|a| a == "--callgrind") {
        println!("{}", callgrind_section());
        return;
    }
    // `cargo bench` passes --bench; `cargo test --all-targets` passes nothing: smoke then.
    let smoke = args.iter().any(|a| a == "--smoke") || !args.iter().any(|a| a == "--bench");
    let only: Vec<String> = args
        .iter()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .cloned()
        .collect();
    let out_dir = if smoke {
        std::env::temp_dir().join(format!("fencelock-bench-smoke-{}", std::process::id()))
    } else if let Some(dir) = std::env::var_os("FENCELOCK_BENCH_RESULTS") {
        // Another server's run (BENCHMARKS.md: FENCELOCK_REDIS_SERVER and this variable)
        // keeps the main results as they are.
        PathBuf::from(dir)
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results")
    };
    std::fs::create_dir_all(&out_dir).expect("results directory");
    let cfg = Cfg {
        smoke,
        only,
        out_dir,
    };

    let rt = common::runtime();
    let mut report = Report::default();
    let started = Instant::now();
    rt.block_on(async {
        // The flavour and release as the binary names them (Valkey's INFO says 7.2.4).
        let version = fencelock_testing::ServerBinary::current()
            .expect("the server binary")
            .to_string();
        let mode = if cfg.smoke {
            " (SMOKE: tiny sizes, numbers meaningless)"
        } else {
            ""
        };
        report.section(format!(
            "# fencelock workloads{mode}\n\n{}",
            machine(&version)
        ));
        type Workload = for<'a> fn(
            &'a Cfg,
            &'a mut Report,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;
        let workloads: [(&str, Workload); 11] = [
            ("w1", |c, r| Box::pin(w1(c, r))),
            ("w2", |c, r| Box::pin(w2(c, r))),
            ("w3", |c, r| Box::pin(w3(c, r))),
            ("w4", |c, r| Box::pin(w4(c, r))),
            ("w5", |c, r| Box::pin(w5(c, r))),
            ("w6", |c, r| Box::pin(w6(c, r))),
            ("w7", |c, r| Box::pin(w7(c, r))),
            ("w8", |c, r| Box::pin(w8(c, r))),
            ("w9", |c, r| Box::pin(w9(c, r))),
            ("w10", |c, r| Box::pin(w10(c, r))),
            ("w11", |c, r| Box::pin(w11(c, r))),
        ];
        for (name, run) in workloads {
            if cfg.runs(name) {
                let t = Instant::now();
                run(&cfg, &mut report).await;
                eprintln!("[{name} done in {:.1} s]", t.elapsed().as_secs_f64());
            }
        }
    });
    drop(rt);
    if !cfg.smoke && cfg.runs("callgrind") {
        if have_valgrind() {
            let t = Instant::now();
            report.section(callgrind_section());
            eprintln!("[callgrind done in {:.1} s]", t.elapsed().as_secs_f64());
        } else {
            report.section("### Instructions per cycle: skipped (valgrind not installed)\n".into());
        }
    }

    let mut summary = format!(
        "## Targets (ratios against the limit measured in the same run)\n\n\
         Run took {:.0} s; load average at the end: {}.\n\n\
         | target | what | measured | |\n| --- | --- | ---: | --- |\n",
        started.elapsed().as_secs_f64(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    for t in &report.targets {
        let _ = writeln!(
            summary,
            "| {} | {} | {} | {} |",
            t.id,
            t.what,
            t.measured,
            yes_no(t.met)
        );
    }
    report.section(summary);

    if !report.cdfs.is_empty() {
        let png = cfg.out_dir.join("handoff.png");
        match plot(&png, &report.cdfs) {
            Ok(()) if cfg.smoke => {}
            Ok(()) => eprintln!("plot: {}", png.display()),
            Err(err) => panic!("plot failed: {err}"),
        }
    }
    let md = cfg.out_dir.join("results.md");
    std::fs::write(&md, report.sections.join("\n")).expect("write results");
    if cfg.smoke {
        // The smoke run only proves that everything runs (the plot included); its numbers are
        // meaningless, so nothing is left behind.
        let _ = std::fs::remove_dir_all(&cfg.out_dir);
        eprintln!(
            "smoke run passed in {:.0} s: every workload ran and its invariants held",
            started.elapsed().as_secs_f64()
        );
    } else {
        eprintln!(
            "results: {} ({:.0} s)",
            md.display(),
            started.elapsed().as_secs_f64()
        );
    }
}
