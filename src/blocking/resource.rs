//! The blocking fenced resource.

use std::time::Duration;

use crate::{Error, FencingToken};

blocking! {
    /// A blocking [`crate::FencedResource`]: a value, number, hash or list in Redis whose
    /// writes are refused when they carry a token older than one it has already accepted.
    /// Every method but `name`, `retention` and `with_retention` blocks the calling thread on
    /// the client's runtime and behaves as its async namesake, whose docs give the errors and
    /// what a refusal means.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let lock = client.lock("account:42")?;
    /// let balance = client.resource("balance:42")?;
    /// let guard = lock.acquire()?;
    /// // Reading with the token claims the resource: no older holder can write after this.
    /// let cents = balance.get_i64(guard.token())?.unwrap_or(0);
    /// if cents >= 500 {
    ///     balance.incr_by(guard.token(), -500)?; // StaleToken if a newer holder got there first
    /// }
    /// guard.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    #[derive(Clone)]
    pub struct FencedResource(crate::FencedResource) {
        fn name(&self) -> &[u8];
        fn with_retention(&self, retention: Duration) -> Result<FencedResource, Error> = wrap;
        fn retention(&self) -> Option<Duration>;
        fn set(&self, token: FencingToken, value: impl AsRef<[u8]>) -> Result<(), Error> = block;
        fn incr_by(&self, token: FencingToken, delta: i64) -> Result<i64, Error> = block;
        fn set_fields(
            &self,
            token: FencingToken,
            fields: &[(&[u8], &[u8])],
        ) -> Result<(), Error> = block;
        fn push(&self, token: FencingToken, items: &[&[u8]]) -> Result<u64, Error> = block;
        fn delete(&self, token: FencingToken) -> Result<(), Error> = block;
        fn claim(&self, token: FencingToken) -> Result<(), Error> = block;
        fn get | get_shared(&self, token: FencingToken) -> Result<Option<Vec<u8>>, Error> = block;
        fn get_i64 | get_i64_shared(&self, token: FencingToken) -> Result<Option<i64>, Error> = block;
        fn get_field | get_field_shared(
            &self,
            token: FencingToken,
            field: impl AsRef<[u8]>,
        ) -> Result<Option<Vec<u8>>, Error> = block;
        fn items | items_shared(&self, token: FencingToken) -> Result<Vec<Vec<u8>>, Error> = block;
        fn peek(&self) -> Result<Option<Vec<u8>>, Error> = block;
        fn peek_i64(&self) -> Result<Option<i64>, Error> = block;
        fn peek_field(&self, field: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, Error> = block;
        fn peek_items(&self) -> Result<Vec<Vec<u8>>, Error> = block;
        fn high_water_mark(&self) -> Result<Option<FencingToken>, Error> = block;
    }
}
