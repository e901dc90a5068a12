//! The blocking fenced resource.

use std::sync::Arc;

use super::LockClient;
use crate::{Error, FencingToken};

/// A blocking [`crate::FencedResource`]: a value, number, hash or list in Redis whose writes
/// are refused when they carry a token older than one it has already accepted. Every method
/// blocks the calling thread on the client's runtime and behaves as its async namesake, whose
/// docs give the errors and what a refusal means.
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
#[derive(Clone, Debug)]
pub struct FencedResource {
    pub(super) inner: crate::FencedResource,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
}

impl LockClient {
    /// A fenced resource called `name`; see [`crate::LockClient::resource`].
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name.
    pub fn resource(&self, name: impl AsRef<[u8]>) -> Result<FencedResource, Error> {
        Ok(FencedResource {
            inner: self.inner.resource(name)?,
            runtime: self.runtime.clone(),
        })
    }
}

impl FencedResource {
    /// The resource's name.
    pub fn name(&self) -> &[u8] {
        self.inner.name()
    }

    /// This resource, kept for `retention` after its last fenced call; see
    /// [`crate::FencedResource::with_retention`] for what expiry means for fencing.
    ///
    /// # Errors
    /// As [`crate::FencedResource::with_retention`].
    pub fn with_retention(&self, retention: std::time::Duration) -> Result<FencedResource, Error> {
        Ok(FencedResource {
            inner: self.inner.with_retention(retention)?,
            runtime: self.runtime.clone(),
        })
    }

    /// The retention, if any; see [`crate::FencedResource::retention`].
    pub fn retention(&self) -> Option<std::time::Duration> {
        self.inner.retention()
    }

    /// Sets the string value; see [`crate::FencedResource::set`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::set`].
    pub fn set(&self, token: FencingToken, value: impl AsRef<[u8]>) -> Result<(), Error> {
        self.runtime.block_on(self.inner.set(token, value))
    }

    /// Adds `delta` to the number; see [`crate::FencedResource::incr_by`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::incr_by`].
    pub fn incr_by(&self, token: FencingToken, delta: i64) -> Result<i64, Error> {
        self.runtime.block_on(self.inner.incr_by(token, delta))
    }

    /// Sets hash fields; see [`crate::FencedResource::set_fields`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::set_fields`].
    pub fn set_fields(&self, token: FencingToken, fields: &[(&[u8], &[u8])]) -> Result<(), Error> {
        self.runtime.block_on(self.inner.set_fields(token, fields))
    }

    /// Appends to the list; see [`crate::FencedResource::push`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::push`].
    pub fn push(&self, token: FencingToken, items: &[&[u8]]) -> Result<u64, Error> {
        self.runtime.block_on(self.inner.push(token, items))
    }

    /// Deletes the data (the marks stay); see [`crate::FencedResource::delete`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::delete`].
    pub fn delete(&self, token: FencingToken) -> Result<(), Error> {
        self.runtime.block_on(self.inner.delete(token))
    }

    /// Claims the resource for `token`; see [`crate::FencedResource::claim`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::claim`].
    pub fn claim(&self, token: FencingToken) -> Result<(), Error> {
        self.runtime.block_on(self.inner.claim(token))
    }

    /// Reads the string value and claims the resource; see [`crate::FencedResource::get`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::get`].
    pub fn get(&self, token: FencingToken) -> Result<Option<Vec<u8>>, Error> {
        self.runtime.block_on(self.inner.get(token))
    }

    /// Reads the number and claims the resource; see [`crate::FencedResource::get_i64`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::get_i64`].
    pub fn get_i64(&self, token: FencingToken) -> Result<Option<i64>, Error> {
        self.runtime.block_on(self.inner.get_i64(token))
    }

    /// Reads one hash field and claims the resource; see [`crate::FencedResource::get_field`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::get_field`].
    pub fn get_field(
        &self,
        token: FencingToken,
        field: impl AsRef<[u8]>,
    ) -> Result<Option<Vec<u8>>, Error> {
        self.runtime.block_on(self.inner.get_field(token, field))
    }

    /// Reads the list and claims the resource; see [`crate::FencedResource::items`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::items`].
    pub fn items(&self, token: FencingToken) -> Result<Vec<Vec<u8>>, Error> {
        self.runtime.block_on(self.inner.items(token))
    }

    /// Reads the string value as a holder that shares its hold (a reader of a read-write
    /// lock); see [`crate::FencedResource::get_shared`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::get_shared`].
    pub fn get_shared(&self, token: FencingToken) -> Result<Option<Vec<u8>>, Error> {
        self.runtime.block_on(self.inner.get_shared(token))
    }

    /// Reads the number as a holder that shares its hold; see
    /// [`crate::FencedResource::get_i64_shared`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::get_i64_shared`].
    pub fn get_i64_shared(&self, token: FencingToken) -> Result<Option<i64>, Error> {
        self.runtime.block_on(self.inner.get_i64_shared(token))
    }

    /// Reads one hash field as a holder that shares its hold; see
    /// [`crate::FencedResource::get_field_shared`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::get_field_shared`].
    pub fn get_field_shared(
        &self,
        token: FencingToken,
        field: impl AsRef<[u8]>,
    ) -> Result<Option<Vec<u8>>, Error> {
        self.runtime
            .block_on(self.inner.get_field_shared(token, field))
    }

    /// Reads the list as a holder that shares its hold; see
    /// [`crate::FencedResource::items_shared`].
    ///
    /// # Errors
    /// As [`crate::FencedResource::items_shared`].
    pub fn items_shared(&self, token: FencingToken) -> Result<Vec<Vec<u8>>, Error> {
        self.runtime.block_on(self.inner.items_shared(token))
    }

    /// The string value, read without a token, for observers; see
    /// [`crate::FencedResource::peek`].
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis could not be reached.
    pub fn peek(&self) -> Result<Option<Vec<u8>>, Error> {
        self.runtime.block_on(self.inner.peek())
    }

    /// The number, read without a token; see [`crate::FencedResource::peek_i64`].
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis could not be reached, or the value is not a number.
    pub fn peek_i64(&self) -> Result<Option<i64>, Error> {
        self.runtime.block_on(self.inner.peek_i64())
    }

    /// One hash field, read without a token; see [`crate::FencedResource::peek_field`].
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis could not be reached.
    pub fn peek_field(&self, field: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, Error> {
        self.runtime.block_on(self.inner.peek_field(field))
    }

    /// The list, read without a token; see [`crate::FencedResource::peek_items`].
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis could not be reached.
    pub fn peek_items(&self) -> Result<Vec<Vec<u8>>, Error> {
        self.runtime.block_on(self.inner.peek_items())
    }

    /// The highest token the resource has accepted; see
    /// [`crate::FencedResource::high_water_mark`].
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis could not be reached.
    pub fn high_water_mark(&self) -> Result<Option<FencingToken>, Error> {
        self.runtime.block_on(self.inner.high_water_mark())
    }
}
