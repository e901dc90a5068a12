//! The wait record of an acquisition that waits at the head of its client's queue for a key
//! (`wait_record.lua`): which key it waits for, with which label, and what its task holds, so
//! that operators see who waits for whom (`fencelock waits`) and wait-for cycles
//! (`Admin::possible_deadlocks`). Written on the contended path only, in the background (a
//! waiter never waits for its record), at the first busy attempt of a wait and again at a busy
//! attempt only when the record might expire before the next one, deleted when the wait ends,
//! and expiring by itself if its client is gone.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::holder::Owner;
use super::Engine;
use crate::protocol::{self, keys::wait_key, WaitArgs};

/// How long a record outlives the waiter's next attempt: the waiter refreshes it at that
/// attempt (a release's message, or its fallback timer at the holder's lease end).
const SLACK: Duration = Duration::from_secs(5);

/// What a wait reports: the client's engine and the acquisition's label.
#[derive(Clone, Copy)]
pub(crate) struct WaitReport<'a> {
    pub(crate) engine: &'a Engine,
    pub(crate) label: Option<&'a str>,
}

/// One acquisition's wait record while it waits.
pub(crate) struct WaitRecord<'a> {
    report: WaitReport<'a>,
    key: Vec<u8>,
    awaited: Vec<u8>,
    owner: Owner,
    /// The write in flight or done last: the delete goes after it, so a late write cannot
    /// bring the record back.
    last: Option<JoinHandle<()>>,
    /// When the last write was sent, and the lifetime it gave the record.
    written: Option<(Instant, Duration)>,
}

impl<'a> WaitRecord<'a> {
    /// The record of `holder`'s wait for `awaited`, unwritten. `None` for a key without a tag.
    pub(crate) fn new(report: WaitReport<'a>, holder: &str, awaited: &[u8]) -> Option<Self> {
        Some(WaitRecord {
            report,
            key: wait_key(awaited, holder)?,
            awaited: awaited.to_vec(),
            owner: Owner::current(),
            last: None,
            written: None,
        })
    }

    /// Writes the record after a busy attempt, or refreshes it when it might expire before
    /// the waiter's next attempt (which comes by the holder's lease end at the latest);
    /// `remaining`: the holder's lease left, when the attempt saw one. Heads competing for a
    /// busy key attempt often; this keeps their cost to about one write per wait.
    pub(crate) fn busy(&mut self, remaining: Option<Duration>) {
        let engine = self.report.engine;
        let next_attempt = remaining.unwrap_or(engine.config.default_lease);
        let now = Instant::now();
        if let Some((at, kept)) = self.written {
            if at + kept >= now + next_attempt + SLACK / 2 {
                return;
            }
        }
        let lifetime = next_attempt + SLACK;
        self.written = Some((now, lifetime));
        let holds = engine.watchdog.held_by(self.owner);
        let mut conn = engine.conn();
        let (key, awaited) = (self.key.clone(), self.awaited.clone());
        let label = self.report.label.map(str::to_owned);
        let previous = self.last.take();
        self.last = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            runtime.spawn(async move {
                if let Some(previous) = previous {
                    let _ = previous.await;
                }
                let args = WaitArgs {
                    awaited: &awaited,
                    label: label.as_deref(),
                    holds: &holds,
                    lifetime,
                };
                // Advice for operators: a failure only leaves the record out (or to expire).
                let _ = protocol::record_wait(&mut conn, &key, args).await;
            })
        });
    }
}

impl Drop for WaitRecord<'_> {
    /// The wait ended (won, timed out, failed or dropped): the record goes, after its last
    /// write.
    fn drop(&mut self) {
        let Some(last) = self.last.take() else {
            return;
        };
        let mut conn = self.report.engine.conn();
        let key = std::mem::take(&mut self.key);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = last.await;
                let _ = protocol::forget_wait(&mut conn, &key).await;
            });
        }
    }
}
