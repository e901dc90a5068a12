//! Idempotency keys: process a request once, however often it is sent.
//!
//! A key is a lock under keys of its own (`prefix{tag}idem:NAMESPACE:KEY`, see
//! `protocol::keys`) held for at most `at_most_for` (a fixed lease nobody renews, so a
//! crashed runner frees it), plus a record (`prefix{tag}idem-rec:NAMESPACE:KEY`) naming the
//! request's fingerprint, the newest run, its runner's fencing token and, once finished, the
//! stored result. The lock makes runs exclusive; the record makes the request run once and
//! answers its duplicates (`idem_begin.lua`, `idem_finish.lua`). A duplicate never runs the
//! request while another run holds the key: it is answered at once, or waits for that run's
//! outcome when asked to.

mod options;
mod outcome;

pub use options::IdempotencyOptions;
pub use outcome::{Failure, Processed, RunRecord};

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use super::client::LockClient;
use super::handle::Handle;
use super::job::run::{self, Began, Begun, RunHold, Started};
#[cfg(doc)]
use super::job::OnRunnerDeath;
use super::lock::Lock;
use crate::base::config::checked_label;
use crate::base::error::{display_bytes, Error};
use crate::base::metrics;
use crate::base::token::FencingToken;
use crate::protocol::keys::{validate_name, MAX_NAME_LEN};
use crate::protocol::{self, KeyReadMode, KeyResult, LockKeys, RunEnd};

/// The longest result a key's record stores, in bytes (1 MiB): a response body, not a
/// report. Every duplicate's answer carries it over the network.
pub const MAX_RESULT_LEN: usize = 1 << 20;
/// The longest fingerprint accepted, in bytes: pass a digest of the request (its parameters
/// hashed), not the request itself.
pub const MAX_FINGERPRINT_LEN: usize = 1024;
/// The longest namespace accepted, in bytes.
const MAX_NAMESPACE_LEN: usize = 256;
/// How many times a call tries to take a key it found held and then free (the hold ended
/// between its attempt and its read of the record) before it answers "in progress".
const BUSY_TRIES: u32 = 3;

/// The idempotency keys of one namespace (a kind of request: `payments`, `refunds`), made by
/// [`LockClient::idempotency`]: [`run`](Idempotency::run) a request under its key, and it
/// runs once; its duplicates get the stored result.
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// use std::time::Duration;
/// use fencelock::{Failure, IdempotencyOptions};
/// let payments = client.idempotency("payments", IdempotencyOptions::new(Duration::from_secs(30)))?;
/// let ledger = client.resource("ledger:acct-9")?;
/// // The request's key (from the caller, e.g. an Idempotency-Key header) and a digest of
/// // what it asks for: the same key with other parameters is refused, not run.
/// let outcome = payments.run("key-5f2c", "charge acct-9 500", |run| async move {
///     ledger.incr_by(run.token(), 500).await.map_err(Failure::Retry)?;
///     Ok(b"charged".to_vec())
/// }).await?;
/// println!("answer: {:?}, ran here: {}", outcome.result(), outcome.ran());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Idempotency {
    client: LockClient,
    namespace: Arc<[u8]>,
    options: IdempotencyOptions,
    /// What every run's hold of its key carries ([`Idempotency::with_label`]).
    label: Option<Arc<str>>,
}

debug_struct!(Idempotency(self) {
    namespace: String::from_utf8_lossy(&self.namespace),
    options: self.options,
} ..);

impl LockClient {
    /// A handle to the idempotency keys of `namespace`, run as `options` say. Nothing is sent
    /// to Redis until a run or read. Every instance should use the same options for a
    /// namespace.
    ///
    /// # Errors
    /// [`Error::InvalidIdempotency`] for an empty namespace, one over 256 bytes or one that
    /// contains `:` (it separates the namespace from the key in Redis), a retention shorter
    /// than `at_most_for` or over ten years, an outcome wait over a day, or a duration that is
    /// not a whole number of milliseconds; [`Error::InvalidLease`] for an unusable
    /// `at_most_for` (as a lock lease: 1 ms to 7 days, whole milliseconds).
    ///
    /// ```no_run
    /// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// use fencelock::IdempotencyOptions;
    /// let options = IdempotencyOptions::new(Duration::from_secs(30));
    /// let payments = client.idempotency("payments", options.clone())?;
    /// assert!(client.idempotency("pay:ments", options).unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn idempotency(
        &self,
        namespace: impl AsRef<[u8]>,
        options: IdempotencyOptions,
    ) -> Result<Idempotency, Error> {
        let namespace = namespace.as_ref();
        check_len("namespace", namespace, MAX_NAMESPACE_LEN)?;
        if namespace.contains(&b':') {
            return Err(Error::InvalidIdempotency {
                reason: format!(
                    "the namespace {} contains ':', which separates it from the key",
                    String::from_utf8_lossy(namespace)
                ),
            });
        }
        options.validate()?;
        Ok(Idempotency {
            client: self.clone(),
            namespace: namespace.into(),
            options,
            label: None,
        })
    }
}

/// What the request's run gets to know: the token to fence its writes with, and whether its
/// hold still stands.
///
/// ```no_run
/// # async fn demo(payments: fencelock::Idempotency, client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// use fencelock::Failure;
/// let balance = client.resource("balance:acct-9")?;
/// payments.run("key-5f2c", "debit 500", |run| async move {
///     if let Some(old) = run.took_over() {
///         println!("a runner with token {old} died mid-run: its writes may be half done");
///     }
///     // Refused with StaleToken once a newer run wrote: a frozen runner cannot write late.
///     let left = balance.incr_by(run.token(), -500).await.map_err(Failure::Retry)?;
///     Ok(left.to_string().into_bytes())
/// }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct KeyRun {
    key: Arc<[u8]>,
    run: RunHold,
}

debug_struct!(KeyRun(self) {
    key: String::from_utf8_lossy(&self.key),
    token: self.token(),
    took_over: self.run.took_over,
});

impl KeyRun {
    /// The key this run is for.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    run::run_view_accessors!();
}

/// A run this call has begun: the key's hold, the run as the request sees it, and what its
/// finish needs.
pub(crate) struct ActiveKeyRun {
    idempotency: Idempotency,
    run: Started,
    pub(crate) view: KeyRun,
    fingerprint: Vec<u8>,
}

impl Idempotency {
    /// The namespace, as given to [`LockClient::idempotency`].
    pub fn namespace(&self) -> &[u8] {
        &self.namespace
    }

    /// A handle to the same namespace whose runs' holds carry `label`: what operators see
    /// next to a running key (`fencelock keys`, the admin API's
    /// [`KeyInfo::runner_label`](crate::admin::KeyInfo::runner_label)), such as the request
    /// (`POST /payments`) or the deployment serving it. Stored with the run's hold of the
    /// key's lock by its own acquisition ([`Lock::with_label`](crate::Lock::with_label)), and
    /// gone when the hold ends; the key's record does not keep it.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a label that is empty, over 256 bytes, or has control
    /// characters.
    ///
    /// ```no_run
    /// # async fn demo(payments: fencelock::Idempotency) -> Result<(), fencelock::Error> {
    /// let labelled = payments.with_label("POST /payments")?;
    /// assert_eq!(labelled.label(), Some("POST /payments"));
    /// assert!(payments.with_label("two\nlines").unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<Idempotency, Error> {
        Ok(Idempotency {
            label: Some(checked_label(label.as_ref())?),
            ..self.clone()
        })
    }

    /// The label this handle's runs carry ([`Idempotency::with_label`]).
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// The options, as given to [`LockClient::idempotency`].
    pub fn options(&self) -> &IdempotencyOptions {
        &self.options
    }

    /// Runs the request `run` under `key` if no run has stored a result for the key and none
    /// holds it now; answers from the key's record otherwise.
    ///
    /// `fingerprint` says what the request asks for (a digest of its parameters, at most
    /// [`MAX_FINGERPRINT_LEN`] bytes): a key used again with another fingerprint is refused
    /// with [`Error::KeyReused`] and nothing runs. A run takes the key's lock for at most
    /// `at_most_for`, records itself as the key's runner with its fencing token, calls `run`
    /// with a [`KeyRun`], then stores what `run` returned (fenced by the token) and releases
    /// the key:
    /// - `Ok(result)`: stored; every later duplicate gets [`Processed::Completed`] with it;
    /// - `Err(Failure::Final { result, .. })`: stored the same way, marked as a failure;
    /// - `Err(Failure::Retry(_))`: nothing stored, the key is left to a retry: the next call
    ///   with it runs the request again, with a newer token.
    ///
    /// A duplicate that finds the key held answers [`Processed::InProgress`] (or waits for
    /// the outcome, [`IdempotencyOptions::wait_for_outcome`]). A key whose runner lost its
    /// hold before finishing (it crashed, froze past `at_most_for`, or the call was dropped)
    /// is run again by the next call, or given up ([`Processed::Abandoned`]), as the
    /// namespace's [`OnRunnerDeath`] policy says. Once a run per key, within the retention.
    ///
    /// # Errors
    /// [`Error::InvalidIdempotency`] for an empty key, a namespace and key together over
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes less one, or an empty or over-long
    /// fingerprint (nothing sent). [`Error::KeyReused`]: the key was used with another
    /// fingerprint. [`Error::ResultTooLarge`]: `run` returned more than [`MAX_RESULT_LEN`]
    /// bytes; it ran, nothing was stored, the key is left to a retry. [`Error::StaleToken`]:
    /// the request ran but another runner took the key over before the result was stored
    /// (this run's hold had ended: `at_most_for` is shorter than the run, or the process
    /// froze); the record stays the newer runner's. [`Error::NotHeld`]: the key's lock was
    /// lost between winning it and recording the run (deleted by an operator; nothing ran).
    /// [`Error::WrongType`]: a key of the namespace holds foreign data. [`Error::Redis`]:
    /// Redis could not be reached within the retry window; before the request ran, it did
    /// not run; after it ran, the key may stay recorded as running, the lock is kept until
    /// `at_most_for` ends, and the policy then decides.
    ///
    /// # Cancel safety
    /// Not cancel safe in the sense of "no effect": dropping the call stops the request where
    /// it is. Dropped while taking the key's lock (or waiting for a run's outcome): the
    /// acquisition is undone, nothing is recorded. Dropped after the run was recorded (while
    /// recording, during `run` or while storing its result): the lock is released in the
    /// background; if the result had not been stored, the key counts as one whose runner
    /// died, and the next call runs it again (or, under [`OnRunnerDeath::GiveUp`], gives it
    /// up). Either way the key is never left held for longer than `at_most_for`.
    pub async fn run<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        fingerprint: impl AsRef<[u8]>,
        run: F,
    ) -> Result<Processed<E>, Error>
    where
        F: FnOnce(KeyRun) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, Failure<E>>>,
    {
        match self.begin(key.as_ref(), fingerprint.as_ref()).await? {
            Begun::Answered(answer) => Ok(answer),
            Begun::Run(active) => {
                let output = run(active.view.clone()).await;
                active.finish(output).await
            }
        }
    }

    /// The key's record, read once: its newest run within the retention, who runs or ran it,
    /// with which token, and its stored result.
    ///
    /// # Errors
    /// [`Error::InvalidIdempotency`] for a key that cannot be one (as [`Idempotency::run`]);
    /// [`Error::WrongType`] when a key of the namespace holds foreign data; [`Error::Redis`]
    /// when Redis could not be reached within the retry window.
    ///
    /// # Cancel safety
    /// Cancel safe: one read-only script.
    pub async fn record(&self, key: impl AsRef<[u8]>) -> Result<Option<RunRecord>, Error> {
        let lock = self.lock_for(key.as_ref())?;
        Ok(self.read(&lock).await?.record.map(RunRecord::from))
    }

    async fn read(&self, lock: &Lock) -> Result<protocol::KeyRead, Error> {
        let keys = lock.keys();
        self.client
            .engine
            .retrying(|mut conn| async move {
                protocol::idem_read(&mut conn, keys, KeyReadMode::Read).await
            })
            .await
            .map_err(|err| err.named(lock.name()))
    }

    /// The lock of `key` in this namespace.
    fn lock_for(&self, key: &[u8]) -> Result<Lock, Error> {
        let invalid = |reason: String| Err(Error::InvalidIdempotency { reason });
        if key.is_empty() {
            return invalid("an idempotency key must not be empty".into());
        }
        let name = [&self.namespace[..], b":", key].concat();
        if validate_name(&name).is_err() {
            return invalid(format!(
                "a namespace and key have at most {} bytes together, these {}",
                MAX_NAME_LEN - 1,
                name.len() - 1
            ));
        }
        let handle = Handle::named(&self.client, &name, LockKeys::idempotency)?;
        let lock = Lock::of(handle).with_lease(self.options.at_most_for)?;
        match &self.label {
            Some(label) => lock.with_label(label),
            None => Ok(lock),
        }
    }

    /// Takes the key's lock and records the run as this call's, or finds why not.
    ///
    /// A call that finds the key held and then, reading its record, finds the lock free (the
    /// hold ended in between) tries again, up to [`BUSY_TRIES`] times in all: answering
    /// "in progress" for a key nobody holds would send the caller into a retry it need not
    /// make.
    pub(crate) async fn begin<E>(
        &self,
        key: &[u8],
        fingerprint: &[u8],
    ) -> Result<Begun<ActiveKeyRun, Processed<E>>, Error> {
        let lock = self.lock_for(key)?;
        check_len("fingerprint", fingerprint, MAX_FINGERPRINT_LEN)?;
        let mut tries = 0;
        let guard = loop {
            tries += 1;
            // A key seen free again is tried at once, without waiting for an outcome.
            let held = if self.options.wait.is_zero() || tries > 1 {
                lock.try_acquire().await
            } else {
                match lock.acquire_timeout(self.options.wait).await {
                    Err(Error::Timeout { .. }) => Ok(None),
                    other => other.map(Some),
                }
            };
            match held {
                Ok(Some(guard)) => break guard,
                Ok(None) => match self.busy(&lock, key, fingerprint).await {
                    // The hold this call met ended before its read of the record: the key
                    // is free (its runner finished without a result, died, or only just
                    // took it and let go), so this call takes it after all.
                    Ok(None) if tries < BUSY_TRIES => continue,
                    answer => {
                        let answer = answer.map(|a| a.unwrap_or(Processed::InProgress(None)));
                        return self.report_answer(key, answer);
                    }
                },
                Err(err) => return Err(self.report_error(key, err)),
            }
        };
        let options = &self.options;
        let began = run::begin::<KeyResult, _>(
            guard,
            fingerprint,
            options.retention,
            options.on_runner_death,
        );
        let answer = match began.await {
            Ok(Began::Run(run)) => {
                let view = KeyRun {
                    key: key.into(),
                    run: run.hold.clone(),
                };
                return Ok(Begun::Run(ActiveKeyRun {
                    idempotency: self.clone(),
                    run,
                    view,
                    fingerprint: fingerprint.to_vec(),
                }));
            }
            Ok(Began::Done(record)) => Ok(Processed::Completed(record)),
            Ok(Began::Abandoned(record)) => Ok(Processed::Abandoned(record)),
            Ok(Began::Refused(_)) => Err(self.reused(key)),
            Err(err) => Err(err),
        };
        self.report_answer(key, answer)
    }

    /// The answer for a key another run holds, from its record; `None` when the key's lock
    /// is free by now and no finished run answers for it (the caller takes the key).
    async fn busy<E>(
        &self,
        lock: &Lock,
        key: &[u8],
        fingerprint: &[u8],
    ) -> Result<Option<Processed<E>>, Error> {
        let read = self.read(lock).await?;
        let Some(record) = read.record else {
            return Ok(read.lock_token.map(|_| Processed::InProgress(None)));
        };
        if record.own.fingerprint != fingerprint {
            return Err(self.reused(key));
        }
        if record.finished_ms.is_some() {
            return Ok(Some(Processed::Completed(record.into())));
        }
        if read.lock_token.is_none() {
            return Ok(None);
        }
        let alive = read.lock_token == Some(record.token);
        Ok(Some(Processed::InProgress(alive.then(|| record.into()))))
    }

    fn report_answer<E>(
        &self,
        key: &[u8],
        answer: Result<Processed<E>, Error>,
    ) -> Result<Begun<ActiveKeyRun, Processed<E>>, Error> {
        let answer = answer.map_err(|err| self.report_error(key, err))?;
        let label = answer.label();
        metrics::idempotent(label);
        tracing::debug!(
            name: "fencelock.idempotent",
            namespace = %String::from_utf8_lossy(&self.namespace),
            key = %String::from_utf8_lossy(key),
            outcome = label,
            runner = answer.record().map(RunRecord::runner),
            runner_token = answer.record().map(|record| record.token().get()),
            "idempotency key answered without running"
        );
        Ok(Begun::Answered(answer))
    }

    /// [`Error::KeyReused`] for `key` of this namespace.
    fn reused(&self, key: &[u8]) -> Error {
        Error::KeyReused {
            key: display_bytes(key),
            namespace: display_bytes(&self.namespace),
        }
    }

    fn report_error(&self, key: &[u8], err: Error) -> Error {
        let namespace = String::from_utf8_lossy(&self.namespace);
        let key = String::from_utf8_lossy(key);
        if matches!(err, Error::KeyReused { .. }) {
            // The client's mistake, answered (a 422), not the service's: at WARN, every
            // ordinary refusal would be a warning in a production log.
            metrics::idempotent(metrics::KEY_REUSED);
            tracing::debug!(
                name: "fencelock.idempotent",
                %namespace, %key, outcome = metrics::KEY_REUSED, error = %err,
                "idempotency key reused for another request: refused"
            );
        } else {
            metrics::idempotent(metrics::ERROR);
            tracing::warn!(
                name: "fencelock.idempotent",
                %namespace, %key, outcome = metrics::ERROR, error = %err,
                "idempotency key run failed"
            );
        }
        err
    }
}

/// [`Error::InvalidIdempotency`] unless `value`, the `what` of a call, has 1 to `max` bytes.
fn check_len(what: &str, value: &[u8], max: usize) -> Result<(), Error> {
    if value.is_empty() || value.len() > max {
        return Err(Error::InvalidIdempotency {
            reason: format!("a {what} has 1 to {max} bytes, this one {}", value.len()),
        });
    }
    Ok(())
}

impl ActiveKeyRun {
    /// Stores what the run returned (or leaves the key to a retry), fenced by the token, and
    /// releases the key.
    pub(crate) async fn finish<E>(
        self,
        output: Result<Vec<u8>, Failure<E>>,
    ) -> Result<Processed<E>, Error> {
        let too_large = match &output {
            Ok(result) | Err(Failure::Final { result, .. }) if result.len() > MAX_RESULT_LEN => {
                Some(result.len())
            }
            _ => None,
        };
        let (end, result) = match (&output, too_large) {
            (_, Some(_)) | (Err(Failure::Retry(_)), _) => (RunEnd::Failed, &b""[..]),
            (Ok(result), None) => (RunEnd::Done, &result[..]),
            (Err(Failure::Final { result, .. }), None) => (RunEnd::Final, &result[..]),
        };
        let report = |err| self.idempotency.report_error(&self.view.key, err);
        let finish = self
            .run
            .finish::<KeyResult>(&self.fingerprint[..], end, Some(result), report);
        let (guard, run_ms) = finish.await?;
        // A failed release (the hold had ended, Redis is away) changes nothing: the record
        // is what answers duplicates.
        let _ = guard.release().await;
        if let Some(len) = too_large {
            let err = Error::ResultTooLarge {
                len,
                max: MAX_RESULT_LEN,
            };
            return Err(self.idempotency.report_error(&self.view.key, err));
        }
        let outcome = Processed::Ran {
            token: self.view.token(),
            output,
        };
        let label = outcome.label();
        metrics::idempotent(label);
        tracing::debug!(
            name: "fencelock.idempotent",
            namespace = %String::from_utf8_lossy(&self.idempotency.namespace),
            key = %String::from_utf8_lossy(&self.view.key),
            outcome = label,
            runner = self.view.run.holder.id.as_str(),
            token = self.view.token().get(),
            took_over = self.view.run.took_over.map(FencingToken::get),
            run_ms,
            "idempotency key ran"
        );
        Ok(outcome)
    }
}
