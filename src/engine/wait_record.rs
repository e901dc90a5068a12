//! The wait record of an acquisition that waits at the head of its client's queue for a key
//! (`wait_record.lua`): which key it waits for, with which label, and what its task holds, so
//! that operators see who waits for whom (`fencelock waits`) and wait-for cycles
//! (`Admin::possible_deadlocks`). Written on the contended path only, in the background (a
//! waiter never waits for its record), and only for a wait that lasts [`RECORD_AFTER`]: the
//! short waits of a busy lock's handoffs cost no server call. Refreshed at a busy attempt only
//! when it could expire before the next one, deleted when the wait ends, and expiring by itself
//! if its client is gone.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::holder::Owner;
use super::Engine;
use crate::protocol::{self, keys::wait_key, WaitArgs};

/// How long a wait goes unrecorded: waits behind a lock that changes hands every few
/// milliseconds are not what an operator looks for, and recording each would cost a server
/// call per handoff. A deadlock's waits last forever, so they are recorded after this.
pub(crate) const RECORD_AFTER: Duration = Duration::from_secs(1);

/// How long a record outlives the waiter's next attempt: the waiter refreshes it at that
/// attempt (a release's message, or its fallback timer at the holder's lease end).
const SLACK: Duration = Duration::from_secs(5);

/// What a wait reports: the client's engine and the acquisition's label.
#[derive(Clone, Copy)]
pub(crate) struct WaitReport<'a> {
    pub(crate) engine: &'a Engine,
    pub(crate) label: Option<&'a str>,
}

/// A flag of the state the waiter and its record's background writes share: the wait ended
/// (a write not yet sent is not sent).
const ENDED: u8 = 1;
/// The shared state's flag: a write was (or is being) sent (the wait's end deletes the record).
const SENT: u8 = 2;

/// One acquisition's wait record while it waits.
pub(crate) struct WaitRecord<'a> {
    report: WaitReport<'a>,
    key: Vec<u8>,
    awaited: Vec<u8>,
    owner: Owner,
    /// When the wait began (the record's `since`, by this process' clock).
    began: Instant,
    /// [`ENDED`] and [`SENT`], between the waiter and its record's background writes.
    shared: Arc<AtomicU8>,
    /// The write scheduled, in flight or done last: the delete goes after it, so a late write
    /// cannot bring the record back.
    last: Option<JoinHandle<()>>,
    /// When the last write is due, and until when it keeps the record.
    kept_until: Option<Instant>,
}

impl<'a> WaitRecord<'a> {
    /// The record of `holder`'s wait for `awaited`, unwritten. `None` for a key without a tag.
    pub(crate) fn new(report: WaitReport<'a>, holder: &str, awaited: &[u8]) -> Option<Self> {
        Some(WaitRecord {
            report,
            key: wait_key(awaited, holder)?,
            awaited: awaited.to_vec(),
            owner: Owner::current(),
            began: Instant::now(),
            shared: Arc::default(),
            last: None,
            kept_until: None,
        })
    }

    /// A busy attempt: schedules the record's first write for [`RECORD_AFTER`] into the wait,
    /// or refreshes it when it could expire before the waiter's next attempt (which comes by
    /// the holder's lease end at the latest); `remaining`: the holder's lease left, when the
    /// attempt saw one.
    pub(crate) fn busy(&mut self, remaining: Option<Duration>) {
        let engine = self.report.engine;
        let next_attempt = remaining.unwrap_or(engine.config.default_lease);
        let due = (self.began + RECORD_AFTER).max(Instant::now());
        if self
            .kept_until
            .is_some_and(|until| until >= due + next_attempt + SLACK / 2)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let lifetime = next_attempt + SLACK;
        self.kept_until = Some(due + lifetime);
        let holds = engine.watchdog.held_by(self.owner);
        let mut conn = engine.conn();
        let (key, awaited) = (self.key.clone(), self.awaited.clone());
        let label = self.report.label.map(str::to_owned);
        let (shared, began) = (self.shared.clone(), self.began);
        let previous = self.last.take();
        self.last = Some(runtime.spawn(async move {
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            tokio::time::sleep_until(due.into()).await;
            // Marked sent in the same step as the last look at `ended`: a wait that ends from
            // here on deletes the record after this write (see `Drop`).
            if shared.fetch_or(SENT, Ordering::SeqCst) & ENDED != 0 {
                return;
            }
            let args = WaitArgs {
                awaited: &awaited,
                label: label.as_deref(),
                holds: &holds,
                lifetime,
                waited: began.elapsed(),
            };
            // Advice for operators: a failure only leaves the record out (or to expire).
            let _ = protocol::record_wait(&mut conn, &key, args).await;
        }));
    }
}

impl Drop for WaitRecord<'_> {
    /// The wait ended (won, timed out, failed or dropped): a write not yet sent never is, and
    /// a record that was sent goes, after its last write.
    fn drop(&mut self) {
        let state = self.shared.fetch_or(ENDED, Ordering::SeqCst);
        let Some(last) = self.last.take() else {
            return;
        };
        if state & SENT == 0 {
            // The scheduled write would see `ended` and send nothing: no record, no delete.
            // Cancelled now rather than left asleep until it is due, so that the short waits
            // of a busy lock do not keep a sleeping task each for a second.
            last.abort();
            return;
        }
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
