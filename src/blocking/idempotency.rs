//! The blocking idempotency keys.

use std::sync::Arc;

use crate::api::idempotency::KeyBegun;
use crate::{Error, Failure, IdempotencyOptions, KeyRun, Processed, RunRecord};

/// A blocking [`crate::Idempotency`]: [`run`](Idempotency::run) a request under its key, on
/// the calling thread, and it runs once; its duplicates get the stored result.
#[derive(Clone, Debug)]
pub struct Idempotency {
    pub(super) inner: crate::Idempotency,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
}

impl Idempotency {
    /// The namespace.
    pub fn namespace(&self) -> &[u8] {
        self.inner.namespace()
    }

    /// The options.
    pub fn options(&self) -> &IdempotencyOptions {
        self.inner.options()
    }

    /// Runs `run` on the calling thread under `key` if no run has stored a result for the key
    /// and none holds it now; answers from the key's record otherwise. See
    /// [`crate::Idempotency::run`] for the fingerprint, what is stored and each outcome. The
    /// key's hold is taken and the run recorded before `run` is called, and its result
    /// stored after it returns; a `run` that panics leaves the key as one whose runner died
    /// (the lock is released as the panic unwinds, and the policy decides).
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
            KeyBegun::Answered(answer) => Ok(answer.outcome()),
            KeyBegun::Run(active) => {
                let output = run(active.view());
                self.runtime.block_on(active.finish(output))
            }
        }
    }

    /// The key's record; see [`crate::Idempotency::record`].
    ///
    /// # Errors
    /// As [`crate::Idempotency::record`].
    pub fn record(&self, key: impl AsRef<[u8]>) -> Result<Option<RunRecord>, Error> {
        self.runtime.block_on(self.inner.record(key))
    }
}
