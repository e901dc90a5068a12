//! A history checker for concurrent lock users: record what each holder saw, then check the
//! lock's safety properties over the whole history.
//!
//! Tasks (or processes) that use a lock record [`Event`]s into one shared [`History`]: when a
//! holder was granted the lock and with which token, when it entered and left its critical
//! section (and whether its lease was still valid when it left), and every fenced write with
//! its outcome. After the run, [`check`] verifies the properties below and names the first one
//! that is violated ([`Property`]), with the events that show it.
//!
//! Timestamps are microseconds on one clock shared by every recorder: [`History::now_us`] (a
//! monotonic clock of this process) or, across processes, any clock all of them read in the
//! same real-time order, such as Redis `TIME` read inside the critical section
//! ([`History::record_at`]).
//!
//! ```no_run
//! # async fn demo(lock: fencelock::Lock, account: fencelock::FencedResource) -> Result<(), Box<dyn std::error::Error>> {
//! use fencelock_testing::check::{check, Event, History};
//!
//! let history = History::new();
//! let guard = lock.acquire().await?;
//! history.granted(&guard);
//! history.enter(&guard);
//! let sent = history.now_us();
//! match account.incr_by(guard.token(), 10).await {
//!     Ok(_) => history.write_accepted(&guard, sent, None),
//!     Err(fencelock::Error::StaleToken { latest, .. }) => {
//!         history.write_rejected(&guard, sent, latest)
//!     }
//!     Err(e) => return Err(e.into()),
//! }
//! history.exit(&guard);
//! history.record(Event::Released { holder: guard.holder_id().to_owned() });
//! guard.release().await?;
//! check(&history)?;
//! # Ok(()) }
//! ```
//!
//! # Reaching the edges of your storage's fence
//!
//! Tokens come from the server clock in microseconds, so the holders of a real run almost never
//! present a token equal to the storage's mark, or one away from it, and a fence that is off by
//! one passes every such run. Present the edges on purpose: after a real holder wrote, write
//! with `mark - 1` (must be refused), `mark` (accepted: one holder writes many times with one
//! token) and `mark + 1` (accepted), and record each write so [`check`] judges it with the
//! rest. The same for tokens after a lost fence counter (delete it, or restart the server
//! without persistence): the next holder's token still exceeds every earlier one, and your
//! storage must still refuse the old holder.
//!
//! ```no_run
//! # async fn demo(account: fencelock::FencedResource, history: fencelock_testing::check::History)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use fencelock::{Error, FencingToken};
//! use fencelock_testing::check::Event;
//!
//! let mark = account.high_water_mark().await?.expect("a holder wrote");
//! for offset in [-1i64, 0, 1] {
//!     let token = FencingToken::new(mark.get().saturating_add_signed(offset)).unwrap();
//!     let holder = format!("edge({offset:+})");
//!     let sent = history.now_us();
//!     match account.incr_by(token, 1).await {
//!         Ok(_) => history.record(Event::WriteAccepted { holder, token: token.get(), sent, seq: None }),
//!         Err(Error::StaleToken { latest, .. }) => history.record(Event::WriteRejected {
//!             holder, token: token.get(), sent, latest: latest.get(),
//!         }),
//!         Err(e) => return Err(e.into()),
//!     }
//! }
//! fencelock_testing::check::check(&history)?; // a fence off by one fails here
//! # Ok(()) }
//! ```
//!
//! fencelock's own model and interleaving tests do exactly this (their `EdgeWrite` steps), and
//! a fence that accepts one below the mark is caught by them.

use std::collections::HashMap;
use std::fmt;
use std::time::Instant;

use parking_lot::Mutex;

use fencelock::{FencingToken, LockGuard};

/// Something a holder saw. Holders are named by their holder id ([`LockGuard::holder_id`]),
/// which is unique across clients and processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A fresh acquisition was granted with `token`.
    Granted {
        /// The new holder.
        holder: String,
        /// Its fencing token.
        token: u64,
    },
    /// The holder re-entered and the nested guard carries `token`.
    ReenterGranted {
        /// The re-entering holder.
        holder: String,
        /// The token of the nested guard.
        token: u64,
    },
    /// The holder entered a critical section (recorded after the grant).
    Enter {
        /// The holder.
        holder: String,
    },
    /// The holder left a critical section; `valid` is whether its lease was still valid
    /// *after* the timestamp was taken. A section that ends invalid overstayed its lease: it
    /// may overlap another holder's, and fencing must then reject its writes.
    Exit {
        /// The holder.
        holder: String,
        /// Lease still valid when leaving.
        valid: bool,
    },
    /// A fenced write with `token` was accepted. `sent` is when the request was sent (the
    /// record's own time is when the reply arrived); `seq`, if known, is the write's position
    /// in the storage's order (for example the list length a push returned).
    WriteAccepted {
        /// The writer.
        holder: String,
        /// The token presented.
        token: u64,
        /// When the write was sent.
        sent: u64,
        /// Position in storage order.
        seq: Option<u64>,
    },
    /// A fenced write with `token` was rejected because the storage had seen `latest`.
    WriteRejected {
        /// The writer.
        holder: String,
        /// The token presented.
        token: u64,
        /// When the write was sent.
        sent: u64,
        /// The newer token the storage named.
        latest: u64,
    },
    /// One entry of the holder was released (or the release found it no longer held).
    Released {
        /// The holder.
        holder: String,
    },
    /// The holder learnt it lost the lock.
    Lost {
        /// The holder.
        holder: String,
    },
    /// The lock was taken away from the holder of `token` from outside the protocol (an
    /// operator's `DEL` or `PEXPIRE`, an eviction). That holder's lease was broken, not
    /// overstayed, so its sections are not judged for mutual exclusion; its writes still are
    /// judged for fencing.
    Expired {
        /// The token the lock held when it was expired.
        token: u64,
    },
}

/// One event and when it happened, in microseconds on the history's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Microseconds on the shared clock.
    pub at: u64,
    /// What happened.
    pub event: Event,
}

/// What is left in Redis after a run, as read by [`residue`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Residue {
    /// Lock hashes still present, with their `(holder, count)` entries.
    pub locks: Vec<(String, Vec<(String, u64)>)>,
    /// Keys under the prefix that are neither a fence counter, a high-water mark, resource
    /// data, nor an operation record with an expiry.
    pub stray: Vec<String>,
    /// Holders still on the clients' watch lists ([`LockClient::watched_locks`](fencelock::LockClient::watched_locks)).
    pub watched: usize,
}

/// The properties [`check`] verifies, and the ones the model test adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Property {
    /// At most one holder is inside the critical section at any time, among holders whose
    /// lease was valid for the whole section.
    MutualExclusion,
    /// Accepted writes carry non-decreasing tokens in storage order; no token is granted to
    /// two holders (the model test also checks that every grant's token is higher than all
    /// earlier ones).
    TokensMonotonic,
    /// A write with a token lower than one already accepted is always rejected.
    StaleWriteRejected,
    /// A write is only rejected in favour of a strictly newer token.
    ValidWriteAccepted,
    /// Every re-entry carries the token of its outer acquisition.
    ReentrySameToken,
    /// Every entry is released: per-holder counts, the lock hashes and the watch lists end at
    /// zero.
    CountsReturnToZero,
    /// Nothing is left in Redis but fence counters, high-water marks, resource data and
    /// expiring operation records.
    NoResidue,
    /// A re-sent operation (same operation id) applies once (model test).
    RetriesApplyOnce,
    /// A holder's own lease deadline never ends after the server's lease (model test).
    ValidityWithinLease,
    /// The release that frees a lock publishes, so waiters wake without waiting out a lease
    /// (model test).
    ReleaseWakesWaiters,
    /// The library's answers and the Redis state match the reference model (model test; a
    /// mismatch no sharper property explains).
    ModelAgreement,
}

/// A violated property, with the evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which property.
    pub property: Property,
    /// The events (or state) that show it.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} violated: {}", self.property, self.detail)
    }
}

impl std::error::Error for Violation {}

impl Violation {
    /// A violation of `property` shown by `detail`.
    pub fn new(property: Property, detail: impl Into<String>) -> Self {
        Violation {
            property,
            detail: detail.into(),
        }
    }
}

/// A shared, append-only history of events. `Sync`: share it by reference or in an `Arc`.
#[derive(Debug)]
pub struct History {
    start: Instant,
    records: Mutex<Vec<Record>>,
    residue: Mutex<Option<Residue>>,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> Self {
        History {
            start: Instant::now(),
            records: Mutex::new(Vec::new()),
            residue: Mutex::new(None),
        }
    }

    /// Microseconds since the history was created (monotonic).
    pub fn now_us(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Records `event` as happening now.
    pub fn record(&self, event: Event) {
        let at = self.now_us();
        self.record_at(at, event);
    }

    /// Records `event` at `at` microseconds on a clock of the caller's choice (for example
    /// Redis `TIME`, shared by several processes). Use one clock for the whole history.
    pub fn record_at(&self, at: u64, event: Event) {
        self.records.lock().push(Record { at, event });
    }

    /// `guard` was just granted by a fresh acquisition.
    pub fn granted(&self, guard: &LockGuard) {
        self.record(Event::Granted {
            holder: guard.holder_id().to_owned(),
            token: guard.token().get(),
        });
    }

    /// `inner` was just returned by a re-entry.
    pub fn reentered(&self, inner: &LockGuard) {
        self.record(Event::ReenterGranted {
            holder: inner.holder_id().to_owned(),
            token: inner.token().get(),
        });
    }

    /// The holder of `guard` enters its critical section.
    pub fn enter(&self, guard: &LockGuard) {
        self.record(Event::Enter {
            holder: guard.holder_id().to_owned(),
        });
    }

    /// The holder of `guard` leaves its critical section. The time is taken first and the
    /// lease checked after it, so a section recorded valid really ended inside the lease.
    pub fn exit(&self, guard: &LockGuard) {
        let at = self.now_us();
        let valid = guard.is_valid();
        self.record_at(
            at,
            Event::Exit {
                holder: guard.holder_id().to_owned(),
                valid,
            },
        );
    }

    /// A write by `guard`, sent at `sent` ([`History::now_us`] before sending), was accepted.
    pub fn write_accepted(&self, guard: &LockGuard, sent: u64, seq: Option<u64>) {
        self.record(Event::WriteAccepted {
            holder: guard.holder_id().to_owned(),
            token: guard.token().get(),
            sent,
            seq,
        });
    }

    /// A write by `guard`, sent at `sent`, was rejected in favour of `latest`.
    pub fn write_rejected(&self, guard: &LockGuard, sent: u64, latest: FencingToken) {
        self.record(Event::WriteRejected {
            holder: guard.holder_id().to_owned(),
            token: guard.token().get(),
            sent,
            latest: latest.get(),
        });
    }

    /// Sets what was left in Redis at the end (see [`residue`]); checked by [`check`].
    pub fn set_residue(&self, residue: Residue) {
        *self.residue.lock() = Some(residue);
    }

    /// The events so far, in recording order.
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().clone()
    }

    /// The residue set by [`History::set_residue`].
    pub fn residue(&self) -> Option<Residue> {
        self.residue.lock().clone()
    }
}

/// Reads what fencelock left in Redis under `prefix` (`"fencelock:"` by default) and which
/// of it is residue. Uses `SCAN`; meant for a test's own server.
///
/// # Errors
/// Any Redis error.
pub fn residue(conn: &mut redis::Connection, prefix: &str) -> redis::RedisResult<Residue> {
    let pattern = format!("{prefix}*");
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg(&pattern).query(conn)?;
    let mut residue = Residue::default();
    for key in keys {
        let text = String::from_utf8_lossy(&key).into_owned();
        let after_tag = text
            .get(prefix.len()..)
            .and_then(|rest| rest.find('}').map(|i| &rest[i + 1..]))
            .unwrap_or("");
        if after_tag.starts_with("lock:") {
            let fields: Vec<(String, String)> = redis::cmd("HGETALL").arg(&key).query(conn)?;
            // A fair-handoff reservation holds nobody and ends with its grace (a PEXPIRE set
            // by the same script); only one without expiry is residue.
            if fields.len() == 1 && fields[0].0 == "~reserved" {
                let ttl: i64 = redis::cmd("PTTL").arg(&key).query(conn)?;
                if ttl == -1 {
                    residue.stray.push(text);
                }
                continue;
            }
            let entries = fields
                .into_iter()
                .filter(|(f, _)| !f.starts_with('~'))
                .map(|(f, v)| (f, v.parse().unwrap_or(0)))
                .collect();
            residue.locks.push((text, entries));
        } else if after_tag == "fence"
            || after_tag.starts_with("mark:")
            || after_tag.starts_with("shared:")
            || after_tag.starts_with("data:")
        {
        } else if after_tag.starts_with("op:")
            || after_tag.starts_with("queue:")
            || after_tag.starts_with("client:")
        {
            // Op records, fair-handoff queues and clients' name registrations always carry an
            // expiry.
            let ttl: i64 = redis::cmd("PTTL").arg(&key).query(conn)?;
            // -2: expired between KEYS and PTTL.
            if ttl == -1 {
                residue.stray.push(text);
            }
        } else {
            residue.stray.push(text);
        }
    }
    Ok(residue)
}

/// Checks every property over `history`; the first violation found, by property in the order
/// of [`Property`]'s declaration.
///
/// # Errors
/// The [`Violation`], naming the property and the events that break it.
pub fn check(history: &History) -> Result<(), Violation> {
    check_records(&history.records(), history.residue().as_ref())
}

/// [`check`] over a list of records (for example parsed from several processes' output) and
/// an optional residue.
///
/// # Errors
/// As [`check`].
pub fn check_records(records: &[Record], residue: Option<&Residue>) -> Result<(), Violation> {
    let mut records = records.to_vec();
    // Stable: events with one timestamp keep their recording order.
    records.sort_by_key(|r| r.at);
    mutual_exclusion(&records)?;
    tokens_monotonic(&records)?;
    stale_write_rejected(&records)?;
    valid_write_accepted(&records)?;
    reentry_same_token(&records)?;
    counts_return_to_zero(&records, residue)?;
    no_residue(residue)
}

fn mutual_exclusion(records: &[Record]) -> Result<(), Violation> {
    // Each holder's outermost section: from the first Enter to the matching last Exit; valid
    // only if every exit of it was valid and no Lost came in between.
    struct Section {
        holder: String,
        from: u64,
        to: u64,
        valid: bool,
    }
    let mut open: HashMap<&str, (u64, u32, bool)> = HashMap::new();
    let mut sections = Vec::new();
    for r in records {
        match &r.event {
            Event::Enter { holder } => {
                let entry = open.entry(holder).or_insert((r.at, 0, true));
                entry.1 += 1;
            }
            Event::Exit { holder, valid } => {
                if let Some(entry) = open.get_mut(holder.as_str()) {
                    entry.2 &= *valid;
                    entry.1 -= 1;
                    if entry.1 == 0 {
                        let (from, _, valid) = open.remove(holder.as_str()).unwrap_or_default();
                        sections.push(Section {
                            holder: holder.clone(),
                            from,
                            to: r.at,
                            valid,
                        });
                    }
                }
            }
            Event::Lost { holder } => {
                if let Some(entry) = open.get_mut(holder.as_str()) {
                    entry.2 = false;
                }
            }
            _ => {}
        }
    }
    let expired: std::collections::HashSet<u64> = records
        .iter()
        .filter_map(|r| match r.event {
            Event::Expired { token } => Some(token),
            _ => None,
        })
        .collect();
    let broken: std::collections::HashSet<&str> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::Granted { holder, token } if expired.contains(token) => Some(holder.as_str()),
            _ => None,
        })
        .collect();
    let valid: Vec<&Section> = sections
        .iter()
        .filter(|s| s.valid && !broken.contains(s.holder.as_str()))
        .collect();
    for (i, a) in valid.iter().enumerate() {
        for b in &valid[i + 1..] {
            if a.holder != b.holder && a.from < b.to && b.from < a.to {
                return Err(Violation::new(
                    Property::MutualExclusion,
                    format!(
                        "{} was inside {}..{} us and {} inside {}..{} us, both with a valid lease",
                        a.holder, a.from, a.to, b.holder, b.from, b.to
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn tokens_monotonic(records: &[Record]) -> Result<(), Violation> {
    // Grants are recorded after their reply, so their recorded order is not the server's:
    // judge only that no token was granted twice. Storage order (below) is exact.
    let mut granted: HashMap<u64, &str> = HashMap::new();
    for r in records {
        if let Event::Granted { holder, token } = &r.event {
            if let Some(other) = granted.insert(*token, holder) {
                return Err(Violation::new(
                    Property::TokensMonotonic,
                    format!("token {token} was granted to {other} and again to {holder}"),
                ));
            }
        }
    }
    let mut writes: Vec<(u64, u64, &str)> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::WriteAccepted {
                holder,
                token,
                seq: Some(seq),
                ..
            } => Some((*seq, *token, holder.as_str())),
            _ => None,
        })
        .collect();
    writes.sort_by_key(|w| w.0);
    for pair in writes.windows(2) {
        let ((s1, t1, h1), (s2, t2, h2)) = (pair[0], pair[1]);
        if t2 < t1 {
            return Err(Violation::new(
                Property::TokensMonotonic,
                format!(
                    "storage accepted token {t2} ({h2}) at position {s2} after {t1} ({h1}) at {s1}"
                ),
            ));
        }
    }
    Ok(())
}

fn stale_write_rejected(records: &[Record]) -> Result<(), Violation> {
    // Accepted writes by reply time; a write sent after a newer token's write was accepted
    // must be rejected.
    let accepted: Vec<(u64, u64, u64, &str)> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::WriteAccepted {
                holder,
                token,
                sent,
                ..
            } => Some((r.at, *sent, *token, holder.as_str())),
            _ => None,
        })
        .collect();
    for &(_, sent, token, holder) in &accepted {
        if let Some(&(at, _, newer, newer_holder)) = accepted
            .iter()
            .find(|(done, _, t, _)| *done < sent && *t > token)
        {
            return Err(Violation::new(
                Property::StaleWriteRejected,
                format!(
                    "{holder}'s write with token {token}, sent at {sent} us, was accepted after \
                     {newer_holder}'s write with token {newer} was accepted at {at} us"
                ),
            ));
        }
    }
    Ok(())
}

fn valid_write_accepted(records: &[Record]) -> Result<(), Violation> {
    for r in records {
        if let Event::WriteRejected {
            holder,
            token,
            latest,
            ..
        } = &r.event
        {
            if latest <= token {
                return Err(Violation::new(
                    Property::ValidWriteAccepted,
                    format!("{holder}'s write with token {token} was rejected for {latest}"),
                ));
            }
        }
    }
    Ok(())
}

fn reentry_same_token(records: &[Record]) -> Result<(), Violation> {
    let mut tokens: HashMap<&str, u64> = HashMap::new();
    for r in records {
        match &r.event {
            Event::Granted { holder, token } => {
                tokens.insert(holder, *token);
            }
            Event::ReenterGranted { holder, token } => {
                if let Some(outer) = tokens.get(holder.as_str()).filter(|t| *t != token) {
                    return Err(Violation::new(
                        Property::ReentrySameToken,
                        format!("{holder} re-entered with token {token}, acquired with {outer}"),
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn counts_return_to_zero(records: &[Record], residue: Option<&Residue>) -> Result<(), Violation> {
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for r in records {
        match &r.event {
            Event::Granted { holder, .. } | Event::ReenterGranted { holder, .. } => {
                *counts.entry(holder).or_default() += 1;
            }
            Event::Released { holder } => *counts.entry(holder).or_default() -= 1,
            _ => {}
        }
    }
    let mut unbalanced: Vec<_> = counts.into_iter().filter(|(_, c)| *c != 0).collect();
    unbalanced.sort();
    if !unbalanced.is_empty() {
        return Err(Violation::new(
            Property::CountsReturnToZero,
            format!("entries minus releases per holder: {unbalanced:?}"),
        ));
    }
    if let Some(residue) = residue {
        if !residue.locks.is_empty() || residue.watched != 0 {
            return Err(Violation::new(
                Property::CountsReturnToZero,
                format!(
                    "after every release, locks still held: {:?}; holders still watched: {}",
                    residue.locks, residue.watched
                ),
            ));
        }
    }
    Ok(())
}

fn no_residue(residue: Option<&Residue>) -> Result<(), Violation> {
    match residue {
        Some(residue) if !residue.stray.is_empty() => Err(Violation::new(
            Property::NoResidue,
            format!("keys left behind: {:?}", residue.stray),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(at: u64, event: Event) -> Record {
        Record { at, event }
    }
    fn h(s: &str) -> String {
        s.to_owned()
    }

    #[test]
    fn overlapping_valid_sections_break_mutual_exclusion_but_overstayed_ones_do_not() {
        let run = |valid_a: bool| {
            check_records(
                &[
                    at(1, Event::Enter { holder: h("a") }),
                    at(2, Event::Enter { holder: h("b") }),
                    at(
                        3,
                        Event::Exit {
                            holder: h("a"),
                            valid: valid_a,
                        },
                    ),
                    at(
                        4,
                        Event::Exit {
                            holder: h("b"),
                            valid: true,
                        },
                    ),
                ],
                None,
            )
        };
        assert_eq!(run(true).unwrap_err().property, Property::MutualExclusion);
        assert_eq!(run(false), Ok(()));
    }

    #[test]
    fn nested_sections_of_one_holder_do_not_overlap_each_other() {
        let records = [
            at(1, Event::Enter { holder: h("a") }),
            at(2, Event::Enter { holder: h("a") }),
            at(
                3,
                Event::Exit {
                    holder: h("a"),
                    valid: true,
                },
            ),
            at(
                4,
                Event::Exit {
                    holder: h("a"),
                    valid: true,
                },
            ),
            at(5, Event::Enter { holder: h("b") }),
            at(
                6,
                Event::Exit {
                    holder: h("b"),
                    valid: true,
                },
            ),
        ];
        assert_eq!(check_records(&records, None), Ok(()));
    }

    #[test]
    fn each_write_property_is_named() {
        let write = |at_: u64, holder: &str, token: u64, sent: u64, seq: u64| {
            at(
                at_,
                Event::WriteAccepted {
                    holder: h(holder),
                    token,
                    sent,
                    seq: Some(seq),
                },
            )
        };
        let out_of_order = [write(2, "a", 4, 1, 2), write(4, "b", 5, 3, 1)];
        assert_eq!(
            check_records(&out_of_order, None).unwrap_err().property,
            Property::TokensMonotonic
        );
        let stale_unsequenced = [
            at(
                2,
                Event::WriteAccepted {
                    holder: h("b"),
                    token: 5,
                    sent: 1,
                    seq: None,
                },
            ),
            at(
                4,
                Event::WriteAccepted {
                    holder: h("a"),
                    token: 4,
                    sent: 3,
                    seq: None,
                },
            ),
        ];
        assert_eq!(
            check_records(&stale_unsequenced, None)
                .unwrap_err()
                .property,
            Property::StaleWriteRejected
        );
        let wrongly_rejected = [at(
            1,
            Event::WriteRejected {
                holder: h("a"),
                token: 5,
                sent: 0,
                latest: 5,
            },
        )];
        assert_eq!(
            check_records(&wrongly_rejected, None).unwrap_err().property,
            Property::ValidWriteAccepted
        );
    }

    #[test]
    fn tokens_counts_and_residue_are_named() {
        let reentry = [
            at(
                1,
                Event::Granted {
                    holder: h("a"),
                    token: 3,
                },
            ),
            at(
                2,
                Event::ReenterGranted {
                    holder: h("a"),
                    token: 4,
                },
            ),
        ];
        assert_eq!(
            check_records(&reentry, None).unwrap_err().property,
            Property::ReentrySameToken
        );
        let unreleased = [at(
            1,
            Event::Granted {
                holder: h("a"),
                token: 3,
            },
        )];
        assert_eq!(
            check_records(&unreleased, None).unwrap_err().property,
            Property::CountsReturnToZero
        );
        let repeated = [
            at(
                1,
                Event::Granted {
                    holder: h("a"),
                    token: 3,
                },
            ),
            at(2, Event::Released { holder: h("a") }),
            at(
                3,
                Event::Granted {
                    holder: h("b"),
                    token: 3,
                },
            ),
            at(4, Event::Released { holder: h("b") }),
        ];
        assert_eq!(
            check_records(&repeated, None).unwrap_err().property,
            Property::TokensMonotonic
        );
        let residue = Residue {
            stray: vec![h("fencelock:{x}op:1")],
            ..Residue::default()
        };
        assert_eq!(
            check_records(&[], Some(&residue)).unwrap_err().property,
            Property::NoResidue
        );
        assert_eq!(check_records(&[], Some(&Residue::default())), Ok(()));
    }
}
