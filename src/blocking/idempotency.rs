//! The blocking idempotency keys.

use crate::api::job::run::Begun;
use crate::{Error, Failure, IdempotencyOptions, KeyRun, Processed, RunRecord};

blocking! {
    /// A blocking [`crate::Idempotency`]: [`run`](Idempotency::run) a request under its key,
    /// on the calling thread, and it runs once; its duplicates get the stored result.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::{blocking::LockClient, Failure, IdempotencyOptions};
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let payments = client.idempotency("payments", IdempotencyOptions::new(Duration::from_secs(30)))?;
    /// let outcome = payments.run("key-5f2c", "charge acct-9 500", |run| {
    ///     println!("charging with token {}", run.token()); // on this thread
    ///     Ok::<_, Failure<String>>(b"charged".to_vec())
    /// })?;
    /// println!("answer: {:?}", outcome.result());
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    #[derive(Clone)]
    pub struct Idempotency(crate::Idempotency) {
        fn namespace(&self) -> &[u8];
        fn with_label(&self, label: impl AsRef<str>) -> Result<Idempotency, Error> = wrap;
        fn label(&self) -> Option<&str>;
        fn options(&self) -> &IdempotencyOptions;
        fn record(&self, key: impl AsRef<[u8]>) -> Result<Option<RunRecord>, Error> = block;
    }
}

impl Idempotency {
    /// See [`crate::Idempotency::run`]; `run` runs on the calling thread, between the blocking
    /// calls that take the key's hold and record the run and the one that stores its result.
    /// A `run` that panics leaves the key as one whose runner died (the lock is released as the
    /// panic unwinds, and the policy decides).
    ///
    /// # Errors
    /// As [`crate::Idempotency::run`].
    pub fn run<E>(
        &self,
        key: impl AsRef<[u8]>,
        fingerprint: impl AsRef<[u8]>,
        run: impl FnOnce(KeyRun) -> Result<Vec<u8>, Failure<E>>,
    ) -> Result<Processed<E>, Error> {
        let begun = self
            .runtime
            .block_on(self.inner.begin(key.as_ref(), fingerprint.as_ref()))?;
        match begun {
            Begun::Answered(answer) => Ok(answer),
            Begun::Run(active) => {
                let output = run(active.view.clone());
                self.runtime.block_on(active.finish(output))
            }
        }
    }
}
