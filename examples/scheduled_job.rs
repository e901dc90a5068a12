//! A job that must run once per tick although every instance of the service schedules it:
//! `Job::run_exclusive` from plain threads (the blocking API), with clocks that disagree.
//!
//! ```text
//! cargo run --example scheduled_job
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --example scheduled_job
//! ```
//!
//! Four instances (threads, each with its own client, as separate processes would have) fire
//! for each of five ticks of an hourly schedule, each by its own clock (up to 3 s apart) and
//! with its own delay. One instance runs each tick; the others skip and say why. The job writes
//! its report with the run's fencing token, so a runner that froze past its hold could not
//! write over a newer run.
//!
//! Exit status 0 when every tick ran exactly once, 1 otherwise.

mod support;

use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, UNIX_EPOCH};

use fencelock::blocking::LockClient;
use fencelock::{JobOptions, JobOutcome};
use support::{BoxError, ExampleRedis};

const INSTANCES: u64 = 4;
const TICKS: u32 = 5;
const HOUR: Duration = Duration::from_secs(3600);

fn instance(id: u64, client: LockClient, start: Arc<Barrier>) -> Result<Vec<String>, BoxError> {
    // The longest the job may hold the schedule; a crashed runner frees it after this.
    let options = JobOptions::new(HOUR, Duration::from_secs(60));
    let job = client.job("hourly-report", options)?;
    // Fenced storage for the reports.
    let reports = client.resource("hourly-report:out")?;
    let mut lines = Vec::new();
    for hour in 0..TICKS {
        start.wait(); // every instance's scheduler fires for the same hour...
        let late = (u64::from(hour) * 3 + id) % INSTANCES; // ...each a little late, the
        thread::sleep(Duration::from_millis(late * 7)); // first one differing from hour to hour
        let my_clock = UNIX_EPOCH + HOUR * (500_000 + hour) + Duration::from_secs(id);
        let outcome = job.run_exclusive(my_clock, |run| {
            let report = format!("report for hour {hour} by instance {id}");
            reports.push(run.token(), &[report.as_bytes()])
        })?;
        lines.push(match outcome {
            JobOutcome::Ran { token, output } => {
                output?; // the fenced write of the report
                format!("hour {hour}: instance {id} ran it with token {token}")
            }
            JobOutcome::SkippedRunning { .. } => {
                format!("hour {hour}: instance {id} skipped, running elsewhere")
            }
            JobOutcome::SkippedDone { record } => {
                format!(
                    "hour {hour}: instance {id} skipped, done by {}",
                    record.runner()
                )
            }
            other => format!("hour {hour}: instance {id} skipped: {other:?}"),
        });
    }
    Ok(lines)
}

fn run() -> Result<bool, BoxError> {
    let redis = ExampleRedis::from_env()?;
    println!(
        "scheduled_job: {INSTANCES} instances, {TICKS} hourly ticks, {}",
        redis.describe()
    );
    let start = Arc::new(Barrier::new(INSTANCES as usize));
    let mut threads = Vec::new();
    for id in 0..INSTANCES {
        let builder = fencelock::LockClient::builder(redis.url()).prefix(redis.prefix());
        let client = LockClient::connect_with(builder)?;
        let start = start.clone();
        threads.push(thread::spawn(move || instance(id, client, start)));
    }
    let mut ran = 0;
    for thread in threads {
        for line in thread.join().map_err(|_| "an instance panicked")?? {
            ran += usize::from(line.contains(" ran it "));
            println!("  {line}");
        }
    }
    let builder = fencelock::LockClient::builder(redis.url()).prefix(redis.prefix());
    let last = LockClient::connect_with(builder)?
        .job(
            "hourly-report",
            JobOptions::new(HOUR, Duration::from_secs(60)),
        )?
        .last_tick()?;
    let last_done = last.is_some_and(|record| record.finished().is_some());
    redis.cleanup()?;
    Ok(ran == TICKS as usize && last_done)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => {
            println!("PASS: every tick ran exactly once");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("FAIL: a tick ran twice or not at all");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("scheduled_job: {err}");
            ExitCode::FAILURE
        }
    }
}
