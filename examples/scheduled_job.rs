//! A job that must run once per tick although every instance of the service schedules it:
//! aligned ticks and `Job::run_fallible`, from plain threads (the blocking API).
//!
//! ```text
//! cargo run --example scheduled_job
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --example scheduled_job
//! ```
//!
//! Four instances (threads, each with its own client, as separate processes would have) run
//! one scheduler loop each, the way a service does: [`Job::ticks`] names each tick by the
//! instant it was scheduled for (aligned to the Unix epoch, so the same on every instance
//! however late it wakes), never by the instance's own clock at wake-up, and each instance
//! hands that instant to `Job::run_fallible` a little late, by its own delay. One instance runs
//! each tick; the others skip and say why. The job writes its report to fenced storage with
//! the run's fencing token, so a runner that froze past its hold could not write over a newer
//! run. The third tick's first run fails (the report store "times out"): the tick is recorded
//! as failed and released at once, and the instance that ran it tries again, as
//! `OnFailure::Retry` (the default) intends.
//!
//! The schedule is a short one (a tick every 600 ms) so that the example ends in seconds; an
//! hourly job is the same code with another period.
//!
//! Exit status 0 when every tick that was scheduled ran to success exactly once, 1 otherwise.
//!
//! [`Job::ticks`]: fencelock::Job::ticks

mod support;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencelock::blocking::LockClient;
use fencelock::{JobOptions, JobOutcome};
use support::{BoxError, ExampleRedis};

const INSTANCES: u64 = 4;
const TICKS: usize = 5;
const PERIOD: Duration = Duration::from_millis(600);
/// The longest a run may hold the job; a crashed runner frees it after this.
const AT_MOST_FOR: Duration = Duration::from_millis(500);
/// A failed run is tried again this many times at most, by the instance that ran it.
const ATTEMPTS: usize = 3;

/// What one instance did for one tick.
struct Step {
    tick: SystemTime,
    /// How many of its runs succeeded (0 or 1) and how many failed.
    succeeded: usize,
    failed: usize,
    /// Skipped because a newer tick had begun (this instance woke that late): correct, the
    /// tick is over.
    late: bool,
    line: String,
}

fn instance(
    id: u64,
    client: LockClient,
    start: Arc<Barrier>,
    store_down: Arc<AtomicBool>,
) -> Result<Vec<Step>, BoxError> {
    let job = client.job("report", JobOptions::new(PERIOD, AT_MOST_FOR))?;
    // Fenced storage for the reports.
    let reports = client.resource("report:out")?;
    start.wait(); // the instances start together, as a rolling deploy would not need
    let mut ticks = job.ticks();
    let mut steps = Vec::new();
    for round in 0..TICKS {
        let tick = ticks.next_blocking(); // the instant scheduled, the same on every instance
                                          // Each instance wakes a little late, the first one differing from tick to tick.
        thread::sleep(Duration::from_millis(
            (round as u64 * 3 + id) % INSTANCES * 7,
        ));
        let at = time_of_day(tick)?;
        let mut step = Step {
            tick,
            succeeded: 0,
            failed: 0,
            late: false,
            line: String::new(),
        };
        for _attempt in 0..ATTEMPTS {
            let outcome = job.run_fallible(tick, |run| {
                if round == 2 && store_down.swap(false, Ordering::SeqCst) {
                    return Err(BoxError::from("the report store timed out"));
                }
                let report = format!("report for tick {at} by instance {id}");
                reports
                    .push(run.token(), &[report.as_bytes()])
                    .map_err(BoxError::from)
            })?;
            step.line = match outcome {
                JobOutcome::Ran {
                    token,
                    output: Ok(_),
                } => {
                    step.succeeded += 1;
                    format!("instance {id} ran it with token {token}")
                }
                JobOutcome::Ran {
                    output: Err(err), ..
                } => {
                    step.failed += 1;
                    println!("  tick {at}: instance {id}'s run failed ({err}); trying again");
                    continue; // recorded as failed and released: this tick may run again
                }
                JobOutcome::SkippedRunning { .. } => {
                    format!("instance {id} skipped, running elsewhere")
                }
                JobOutcome::SkippedDone { record } => {
                    format!("instance {id} skipped, done by {}", record.runner())
                }
                late @ JobOutcome::SkippedLate { .. } => {
                    step.late = true;
                    format!("instance {id} skipped: {late:?}")
                }
                other => format!("instance {id} skipped: {other:?}"),
            };
            break;
        }
        step.line = format!("tick {at}: {}", step.line);
        steps.push(step);
    }
    Ok(steps)
}

fn run() -> Result<bool, BoxError> {
    let redis = ExampleRedis::from_env()?;
    println!(
        "scheduled_job: {INSTANCES} instances, {TICKS} ticks {PERIOD:?} apart, {}",
        redis.describe()
    );
    let start = Arc::new(Barrier::new(INSTANCES as usize));
    let store_down = Arc::new(AtomicBool::new(true));
    let mut threads = Vec::new();
    for id in 0..INSTANCES {
        let builder = fencelock::LockClient::builder(redis.url()).prefix(redis.prefix());
        let client = LockClient::connect_with(builder)?;
        let (start, store_down) = (start.clone(), store_down.clone());
        threads.push(thread::spawn(move || {
            instance(id, client, start, store_down)
        }));
    }
    // Per tick, over every instance: the runs that succeeded, that failed, and the instances
    // that saw it and whether each found it over.
    let mut runs: BTreeMap<SystemTime, (usize, usize, Vec<bool>)> = BTreeMap::new();
    for thread in threads {
        for step in thread.join().map_err(|_| "an instance panicked")?? {
            let tick = runs.entry(step.tick).or_default();
            tick.0 += step.succeeded;
            tick.1 += step.failed;
            tick.2.push(step.late);
            println!("  {}", step.line);
        }
    }
    redis.cleanup()?;
    let failed: usize = runs.values().map(|(_, failed, _)| failed).sum();
    println!(
        "{} ticks seen, {failed} failed run(s) tried again",
        runs.len()
    );
    // Each tick ran to success once, but one that every instance saw only once it was over.
    let once = |(succeeded, _, late): &(usize, usize, Vec<bool>)| {
        *succeeded == 1 || (*succeeded == 0 && late.iter().all(|late| *late))
    };
    Ok(failed == 1 && runs.values().all(once))
}

/// A tick as the time of day it names (UTC), for the output.
fn time_of_day(tick: SystemTime) -> Result<String, BoxError> {
    let ms = tick.duration_since(UNIX_EPOCH)?.as_millis() % 86_400_000;
    let (h, m, s) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60);
    Ok(format!("{h:02}:{m:02}:{s:02}.{:03}", ms % 1000))
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => {
            println!("PASS: every tick ran to success exactly once");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("FAIL: a tick ran twice, or never succeeded");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("scheduled_job: {err}");
            ExitCode::FAILURE
        }
    }
}
