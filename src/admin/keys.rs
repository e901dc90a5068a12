//! The idempotency keys under the prefix: each key's state, runner, token and age; one key's
//! record; forgetting one.

use std::fmt;
use std::time::{Duration, SystemTime};

use super::{display_bytes, format_duration, item, run_state, Admin};
use crate::protocol::keys::Listing;
use crate::protocol::{self, KeyReadMode, LockKeys};
use crate::{Error, FencingToken, RunRecord};

/// One idempotency key's record, as [`Idempotency::record`](crate::Idempotency::record) reads
/// it, and whether its runner still holds the key.
///
/// ```no_run
/// # async fn demo(admin: fencelock::admin::Admin) -> Result<(), fencelock::Error> {
/// for key in admin.idempotency_keys(Some(b"payments")).await? {
///     println!("{}: {} by {} with token {}", key.display_key(), key.state(),
///         key.record.runner(), key.record.token());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyInfo {
    /// The namespace (arbitrary bytes without `:`).
    pub namespace: Vec<u8>,
    /// The key within it.
    pub key: Vec<u8>,
    /// The Redis key of the record.
    pub redis_key: Vec<u8>,
    /// The newest run: who ran it, with which token, when, and its stored result.
    pub record: RunRecord,
    /// Whether that runner holds the key's lock now. A record that is not finished and not
    /// held is a run whose runner lost its hold before finishing.
    pub runner_holds: bool,
    /// How long ago the newest run began, by the server's clock.
    pub age: Duration,
    /// The time the record is kept for; `None` when it has no expiry (an operator's doing).
    pub retained_for: Option<Duration>,
    /// The name the runner's client registered
    /// ([`LockClientBuilder::client_name`](crate::LockClientBuilder::client_name)); `None`
    /// when that client registered none that is still kept.
    pub runner_client_name: Option<String>,
    /// The label of the runner's hold of the key
    /// ([`Idempotency::with_label`](crate::Idempotency::with_label): say, the request's method
    /// and path), while it holds the key and gave one.
    pub runner_label: Option<String>,
}

impl KeyInfo {
    /// `namespace:key` for display: UTF-8 as is, other bytes escaped.
    pub fn display_key(&self) -> String {
        let (namespace, key) = (display_bytes(&self.namespace), display_bytes(&self.key));
        format!("{namespace}:{key}")
    }

    /// The key's state in one word: `running`, `done` (its result is stored), `failed` (its
    /// run failed and the key waits for a retry) or `abandoned` (its runner lost its hold
    /// before finishing; the next run decides by its policy).
    pub fn state(&self) -> &'static str {
        let record = &self.record;
        run_state(record.finished(), record.failed(), self.runner_holds)
    }

    /// The runner and the place of its client's name, for [`Admin::name_rows`].
    fn runner(&mut self) -> (Option<&str>, &mut Option<String>) {
        (Some(self.record.runner()), &mut self.runner_client_name)
    }
}

impl fmt::Display for KeyInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}  {}  runner {}  token {}  age {}",
            self.display_key(),
            self.state(),
            self.record.runner(),
            self.record.token(),
            format_duration(self.age)
        )?;
        item(f, "client", self.runner_client_name.as_ref(), "")?;
        item(f, "label", self.runner_label.as_ref(), "")?;
        if let Some(result) = self.record.result() {
            let kind = if self.record.is_final_failure() {
                "final failure"
            } else {
                "result"
            };
            write!(f, "  {kind} {} bytes", result.len())?;
        }
        let kept = self.retained_for.map(format_duration);
        item(f, "kept", kept, "no expiry")
    }
}

/// What [`Admin::forget_idempotency_key`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forgotten {
    /// The record was deleted: the next run with the key runs the request as new.
    Deleted(Box<KeyInfo>),
    /// No record: nothing to forget.
    NoRecord,
    /// A runner holds the key now: nothing was deleted (its finish would write the record
    /// again). Try once it has finished, or after its `at_most_for`.
    Held(Box<KeyInfo>),
    /// The record is another run's than the one expected (a run took the key over since it
    /// was looked at): nothing was deleted. Look again.
    OtherRun(Box<KeyInfo>),
}

impl Admin {
    /// Every idempotency key under the prefix with a record (of `namespace` only, if given),
    /// sorted by namespace and key: its state, runner, token, age and stored result. Uses
    /// `SCAN` (never `KEYS`) for the keys `{*}idem-rec:*`, then reads each key the way its
    /// runs do (`idem_read.lua`, one `EVALSHA`), so the record and the lock's holder come
    /// from one atomic read. A record that expired between the scan and the read is left
    /// out.
    ///
    /// # Errors
    /// [`Error::WrongType`] when a key of the namespace holds foreign data;
    /// [`Error::PermissionDenied`] when the Redis user may not run `EVALSHA` or read the key;
    /// [`Error::Redis`] when the connection fails.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only (`TIME`, `SCAN`, then one read-only script and one `PTTL` per
    /// key).
    pub async fn idempotency_keys(&self, namespace: Option<&[u8]>) -> Result<Vec<KeyInfo>, Error> {
        let start = namespace.map_or_else(Vec::new, |namespace| [namespace, b":"].concat());
        let now = self.server_time().await?;
        let mut found = self
            .rows(Listing::IDEMPOTENCY_RECORDS, &start, async |name, _| {
                let Some(split) = name.iter().position(|b| *b == b':') else {
                    return Ok(None);
                };
                let (namespace, key) = (&name[..split], &name[split + 1..]);
                Ok(self
                    .read_key(namespace, key, now, KeyReadMode::Read)
                    .await?
                    .0)
            })
            .await?;
        found.sort_by(|a, b| (&a.namespace, &a.key).cmp(&(&b.namespace, &b.key)));
        self.name_rows(&mut found, KeyInfo::runner).await?;
        Ok(found)
    }

    /// One idempotency key's record, or `None` when it has none.
    ///
    /// # Errors
    /// As [`Admin::idempotency_keys`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn idempotency_key(
        &self,
        namespace: &[u8],
        key: &[u8],
    ) -> Result<Option<KeyInfo>, Error> {
        let (mut info, _) = self
            .read_key(namespace, key, self.server_time().await?, KeyReadMode::Read)
            .await?;
        self.name_rows(info.as_mut_slice(), KeyInfo::runner).await?;
        Ok(info)
    }

    /// Deletes an idempotency key's record when no runner holds the key, so that the next run
    /// with it runs the request as new (an operator's repair: a key given up after its runner
    /// died, a stored result known to be wrong). Never under a holder: the record is kept and
    /// [`Forgotten::Held`] answered.
    ///
    /// The record's fencing history is not lost: the next run's token comes from the slot's
    /// fence counter, which only grows, so a late write of any earlier run is still refused by
    /// fenced storage once the next run has written.
    ///
    /// With `expected`, the record is deleted only while it is still the run with that token
    /// (the one an operator was shown, [`RunRecord::token`]); a run that took the key over
    /// since (a retry that ran the request and stored its result) is kept:
    /// [`Forgotten::OtherRun`]. Forgetting that one would let a duplicate run the request
    /// again.
    ///
    /// # Errors
    /// As [`Admin::idempotency_keys`].
    ///
    /// # Cancel safety
    /// Cancel safe: one script, which deletes or not atomically.
    pub async fn forget_idempotency_key(
        &self,
        namespace: &[u8],
        key: &[u8],
        expected: Option<FencingToken>,
    ) -> Result<Forgotten, Error> {
        let mode = KeyReadMode::Forget(expected);
        let now = self.server_time().await?;
        let (info, held) = self.read_key(namespace, key, now, mode).await?;
        Ok(match info {
            None => Forgotten::NoRecord,
            Some(info) if held => Forgotten::Held(Box::new(info)),
            Some(info) if expected.is_some_and(|t| t != info.record.token()) => {
                Forgotten::OtherRun(Box::new(info))
            }
            Some(info) => Forgotten::Deleted(Box::new(info)),
        })
    }

    /// One idempotency key's record as `idem_read.lua` reads it in `mode` (`None` without
    /// one), and whether anyone holds the key, its age from the server time `now`. A read (not
    /// a forget) adds the record's retention; the runner's client name is left to the caller.
    async fn read_key(
        &self,
        namespace: &[u8],
        key: &[u8],
        now: SystemTime,
        mode: KeyReadMode,
    ) -> Result<(Option<KeyInfo>, bool), Error> {
        let keys = LockKeys::idempotency(&self.prefix, &[namespace, b":", key].concat());
        let read = protocol::idem_read(&mut self.conn.clone(), &keys, mode).await?;
        let held = read.lock_token.is_some();
        let Some(record) = read.record.map(RunRecord::from) else {
            return Ok((None, held));
        };
        let redis_key = keys.idem_record();
        let retained_for = match mode {
            KeyReadMode::Read => self.ttl(&redis_key).await?,
            KeyReadMode::Forget(_) => None,
        };
        let runner_holds = read.lock_token == Some(record.token());
        let runner = runner_holds.then_some(record.runner());
        let runner_label = self.hold_label(&keys.lock, runner).await;
        let info = KeyInfo {
            namespace: namespace.to_vec(),
            key: key.to_vec(),
            redis_key,
            runner_holds,
            runner_label,
            age: now.duration_since(record.started()).unwrap_or_default(),
            record,
            retained_for,
            runner_client_name: None,
        };
        Ok((Some(info), held))
    }
}
