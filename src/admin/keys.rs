//! The idempotency keys under the prefix: each key's state, runner, token and age; one key's
//! record; forgetting one.

use std::fmt;
use std::time::{Duration, SystemTime};

use super::inspect::name_laid_out;
use super::{display_bytes, format_duration, glob_escape, Admin};
use crate::protocol::{self, KeyReadMode, LockKeys};
use crate::{Error, RunRecord};

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
}

impl KeyInfo {
    /// `namespace:key` for display: UTF-8 as is, other bytes escaped.
    pub fn display_key(&self) -> String {
        format!(
            "{}:{}",
            display_bytes(&self.namespace),
            display_bytes(&self.key)
        )
    }

    /// The key's state in one word: `running`, `done` (its result is stored), `failed` (its
    /// run failed and the key waits for a retry) or `abandoned` (its runner lost its hold
    /// before finishing; the next run decides by its policy).
    pub fn state(&self) -> &'static str {
        match (
            self.record.finished().is_some(),
            self.record.failed().is_some(),
            self.runner_holds,
        ) {
            (true, _, _) => "done",
            (false, true, _) => "failed",
            (false, false, true) => "running",
            (false, false, false) => "abandoned",
        }
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
        if let Some(name) = &self.runner_client_name {
            write!(f, "  client {name}")?;
        }
        if let Some(result) = self.record.result() {
            let kind = if self.record.is_final_failure() {
                "final failure"
            } else {
                "result"
            };
            write!(f, "  {kind} {} bytes", result.len())?;
        }
        match self.retained_for {
            Some(ttl) => write!(f, "  kept {}", format_duration(ttl)),
            None => write!(f, "  no expiry"),
        }
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
        let mut pattern = [glob_escape(&self.prefix), b"{*}idem-rec:".to_vec()].concat();
        if let Some(namespace) = namespace {
            pattern.extend(glob_escape(namespace));
            pattern.push(b':');
        }
        pattern.push(b'*');
        let keys = self.scan(&pattern, Some("hash"), usize::MAX).await?;
        let now = self.server_time().await?;
        let mut found = Vec::new();
        for redis_key in keys {
            let layout =
                |prefix: &[u8], name: &[u8]| LockKeys::idempotency(prefix, name).idem_record();
            let Some(name) = name_laid_out(&self.prefix, &redis_key, b"idem-rec:", layout) else {
                continue;
            };
            let Some(split) = name.iter().position(|b| *b == b':') else {
                continue;
            };
            let (namespace, key) = (&name[..split], &name[split + 1..]);
            if let Some(info) = self
                .key_info(namespace, key, now, KeyReadMode::Read)
                .await?
            {
                found.push(info);
            }
        }
        found.sort_by(|a, b| (&a.namespace, &a.key).cmp(&(&b.namespace, &b.key)));
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
        let now = self.server_time().await?;
        self.key_info(namespace, key, now, KeyReadMode::Read).await
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
    /// # Errors
    /// As [`Admin::idempotency_keys`].
    ///
    /// # Cancel safety
    /// Cancel safe: one script, which deletes or not atomically.
    pub async fn forget_idempotency_key(
        &self,
        namespace: &[u8],
        key: &[u8],
    ) -> Result<Forgotten, Error> {
        let now = self.server_time().await?;
        let read = self.read_key(namespace, key, KeyReadMode::Forget).await?;
        let runner_holds = read.lock_token.is_some();
        let Some(info) = self.info_from(namespace, key, now, read, None) else {
            return Ok(Forgotten::NoRecord);
        };
        Ok(if runner_holds {
            Forgotten::Held(Box::new(info))
        } else {
            Forgotten::Deleted(Box::new(info))
        })
    }

    async fn read_key(
        &self,
        namespace: &[u8],
        key: &[u8],
        mode: KeyReadMode,
    ) -> Result<protocol::KeyRead, Error> {
        let keys = LockKeys::idempotency(&self.prefix, &[namespace, b":", key].concat());
        protocol::idem_read(&mut self.conn.clone(), &keys, mode).await
    }

    async fn key_info(
        &self,
        namespace: &[u8],
        key: &[u8],
        now: SystemTime,
        mode: KeyReadMode,
    ) -> Result<Option<KeyInfo>, Error> {
        let read = self.read_key(namespace, key, mode).await?;
        let keys = LockKeys::idempotency(&self.prefix, &[namespace, b":", key].concat());
        let retained_for = self.record_ttl(&keys.idem_record()).await?;
        let mut info = self.info_from(namespace, key, now, read, retained_for);
        if let Some(info) = &mut info {
            info.runner_client_name = self.client_name(info.record.runner()).await?;
        }
        Ok(info)
    }

    fn info_from(
        &self,
        namespace: &[u8],
        key: &[u8],
        now: SystemTime,
        read: protocol::KeyRead,
        retained_for: Option<Duration>,
    ) -> Option<KeyInfo> {
        let record = RunRecord::from(read.record?);
        let keys = LockKeys::idempotency(&self.prefix, &[namespace, b":", key].concat());
        Some(KeyInfo {
            namespace: namespace.to_vec(),
            key: key.to_vec(),
            redis_key: keys.idem_record(),
            runner_holds: read.lock_token == Some(record.token()),
            age: now.duration_since(record.started()).unwrap_or_default(),
            record,
            retained_for,
            runner_client_name: None,
        })
    }
}
