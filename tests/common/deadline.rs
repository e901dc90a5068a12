//! Deadlines for every wait of a test: a wait that another party must end (a release waking a
//! waiter, a renewal, a queue's turn) gets a bound derived from what the test is about, and a
//! message naming the step, so a missing wake-up fails in seconds with its name instead of
//! stalling for a lease.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::Duration;

/// A handoff that should take milliseconds (a release waking the next waiter, a renewal, a
/// script call): generous for a loaded 2-core CI machine, far below every lease the tests use
/// (30 s by default), so a missing wake-up cannot hide behind the lease's fallback timer.
pub const HANDOFF: Duration = Duration::from_secs(5);

/// Awaits `fut` for at most `limit`; panics naming `what` (and that it did not happen in time)
/// when it does not finish.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: did not happen within {limit:?}"),
    }
}

/// A waiter's acquisition that a release must end: [`HANDOFF`], and a message that says what
/// the likely cause is when it does not.
pub async fn woken<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(HANDOFF, fut).await {
        Ok(out) => out,
        Err(_) => panic!(
            "{what}: the waiter was not woken within {HANDOFF:?} of the release that should \
             wake it (a missing wake-up: no release message, or none acted on)"
        ),
    }
}

/// Joins a thread of the blocking facade, at most `limit`, naming `what` when it hangs.
pub fn join_within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    handle: std::thread::JoinHandle<T>,
) -> T {
    let until = std::time::Instant::now() + limit;
    while !handle.is_finished() {
        assert!(
            std::time::Instant::now() < until,
            "{what}: the thread did not finish within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    handle.join().expect("the thread panicked")
}

/// Progress of many contenders for one lock: every grant ticks it, and [`Progress::join`]
/// fails when no contender was granted for [`HANDOFF`] while some were still waiting. Bounds
/// the handoffs, not one contender's wait: an unfair lock may let one task wait behind many
/// quick sections, but a release that wakes nobody stops every grant.
pub struct Progress {
    last_grant: parking_lot::Mutex<std::time::Instant>,
}

impl Progress {
    pub fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::new(Progress {
            last_grant: parking_lot::Mutex::new(std::time::Instant::now()),
        })
    }

    /// A contender was granted the lock.
    pub fn tick(&self) {
        *self.last_grant.lock() = std::time::Instant::now();
    }

    /// Joins every task; panics naming `what` when no grant happened for [`HANDOFF`] before
    /// they all finished.
    pub async fn join<T>(&self, what: &str, tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
        let mut out = Vec::with_capacity(tasks.len());
        for mut task in tasks {
            loop {
                tokio::select! {
                    done = &mut task => {
                        out.push(done.expect("a contender panicked"));
                        break;
                    }
                    () = tokio::time::sleep(Duration::from_millis(100)) => {
                        let idle = self.last_grant.lock().elapsed();
                        assert!(
                            idle < HANDOFF,
                            "{what}: no contender was granted the lock for {idle:?} while \
                             others waited (a missing wake-up: a release that woke nobody; or \
                             a deadlock)"
                        );
                    }
                }
            }
        }
        out
    }
}
