//! A job that must run once per period although every instance of the service schedules it:
//! the blocking API from plain threads, and a "done" marker written with the fencing token.
//!
//! ```text
//! cargo run --features testing --example scheduled_job
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --features testing --example scheduled_job
//! ```
//!
//! Four instances (threads, each with its own client and connection, as separate processes
//! would have) wake up for each of five periods at nearly the same moment. Whoever gets the lock
//! checks the job's record and runs the job only if the period is not done yet. The lock alone
//! is not enough: an instance that gets the lock just after the winner released it would run the
//! job again; the "done" marker in storage is what makes it once, and the fencing token on that
//! marker is what keeps a paused winner from writing over a newer one.
//!
//! Exit status 0 when every period ran exactly once, 1 otherwise.

mod support;

use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use fencelock::blocking::LockClient;
use fencelock::FencingToken;
use parking_lot::Mutex;
use support::{BoxError, ExampleRedis};

const INSTANCES: usize = 4;
const PERIODS: u64 = 5;

/// Stands in for the job's own storage (a table, a bucket): it remembers the highest token it
/// has seen and refuses writes with older ones, like `fencelock::sql` shows for SQL.
#[derive(Default)]
struct JobRecord {
    fence: Option<FencingToken>,
    last_done_period: Option<u64>,
    runs: Vec<(u64, usize, FencingToken)>,
}

impl JobRecord {
    /// Reads the last finished period, claiming the record for `token`.
    fn claim(&mut self, token: FencingToken) -> Result<Option<u64>, &'static str> {
        if self.fence.is_some_and(|seen| seen > token) {
            return Err("stale token");
        }
        self.fence = Some(token);
        Ok(self.last_done_period)
    }

    fn mark_done(
        &mut self,
        token: FencingToken,
        period: u64,
        instance: usize,
    ) -> Result<(), &'static str> {
        if self.fence.is_some_and(|seen| seen > token) {
            return Err("stale token");
        }
        self.fence = Some(token);
        self.last_done_period = Some(period);
        self.runs.push((period, instance, token));
        Ok(())
    }
}

fn instance(
    id: usize,
    client: LockClient,
    record: Arc<Mutex<JobRecord>>,
    start: Arc<Barrier>,
) -> Result<usize, BoxError> {
    let lock = client.lock("job:nightly-report")?;
    let mut ran = 0;
    for period in 1..=PERIODS {
        start.wait(); // every instance's scheduler fires at the same moment
        let Some(guard) = lock.try_acquire()? else {
            continue; // another instance has it; it will do the job
        };
        let token = guard.token();
        let done = record.lock().claim(token)?;
        if done < Some(period) {
            thread::sleep(Duration::from_millis(20)); // the job itself
            record.lock().mark_done(token, period, id)?;
            ran += 1;
        }
        guard.release()?;
    }
    Ok(ran)
}

fn run() -> Result<bool, BoxError> {
    let redis = ExampleRedis::from_env()?;
    println!(
        "scheduled_job: {} instances, {} periods, {}",
        INSTANCES,
        PERIODS,
        redis.describe()
    );
    let record = Arc::new(Mutex::new(JobRecord::default()));
    let start = Arc::new(Barrier::new(INSTANCES));
    let mut threads = Vec::new();
    for id in 0..INSTANCES {
        let builder = fencelock::LockClient::builder(redis.url()).prefix(redis.prefix());
        let client = LockClient::connect_with(builder)?;
        let (record, start) = (record.clone(), start.clone());
        threads.push(thread::spawn(move || instance(id, client, record, start)));
    }
    let mut total = 0;
    for thread in threads {
        total += thread.join().map_err(|_| "an instance panicked")??;
    }
    let record = record.lock();
    for (period, instance, token) in &record.runs {
        println!("  period {period}: run by instance {instance} with token {token}");
    }
    let once_each =
        record.runs.iter().map(|run| run.0).eq(1..=PERIODS) && total == PERIODS as usize;
    redis.cleanup()?;
    Ok(once_each)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => {
            println!("PASS: every period ran exactly once");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("FAIL: a period ran twice or not at all");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("scheduled_job: {err}");
            ExitCode::FAILURE
        }
    }
}
