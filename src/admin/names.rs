//! The names clients registered for operators
//! ([`LockClientBuilder::client_name`](crate::LockClientBuilder::client_name)), resolved from
//! the holder ids that the locks, holds, elections, jobs and idempotency keys record.

use std::collections::{BTreeSet, HashMap};

use super::Admin;
use crate::protocol::keys::client_key;
use crate::Error;

/// The client id inside a holder id (`<client id>:<sequence>`); a client id is returned as is.
fn client_id_of(holder: &str) -> &str {
    holder.split_once(':').map_or(holder, |(client, _)| client)
}

impl Admin {
    /// The registered name of the client behind `holder`: a holder id as the admin listings
    /// show it (`<client id>:<sequence>`) or a client id. `None` when that client registered no
    /// name that is still kept (it has been gone for a day, or it could not write the key).
    ///
    /// ```no_run
    /// # async fn demo(admin: fencelock::admin::Admin) -> Result<(), fencelock::Error> {
    /// for lock in admin.locks().await? {
    ///     for holder in &lock.holders {
    ///         let name = admin.client_name(&holder.id).await?;
    ///         println!("{} held by {}", lock.display_name(), name.as_deref().unwrap_or("?"));
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Redis`] when the connection fails.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only (one `GET`).
    pub async fn client_name(&self, holder: &str) -> Result<Option<String>, Error> {
        let mut row = (holder, None);
        self.name_rows(std::slice::from_mut(&mut row), |(holder, name)| {
            (Some(*holder), name)
        })
        .await?;
        Ok(row.1)
    }

    /// Fills in the registered name of the client behind each of `rows`, read in one pipelined
    /// round trip: `who` gives a row's holder id (if it has one) and the place of its client's
    /// name. A key that cannot be read (foreign data, another cluster node's slot, an ACL
    /// without it) only leaves that name out: names are advice, never a reason to fail a
    /// listing.
    pub(super) async fn name_rows<R>(
        &self,
        rows: &mut [R],
        who: impl Fn(&mut R) -> (Option<&str>, &mut Option<String>),
    ) -> Result<(), Error> {
        let clients: BTreeSet<String> = rows
            .iter_mut()
            .filter_map(|row| Some(client_id_of(who(row).0?).to_owned()))
            .collect();
        if clients.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for client in &clients {
            pipe.cmd("GET").arg(client_key(&self.prefix, client));
        }
        let replies: Vec<redis::Value> = pipe.query_async(&mut self.conn.clone()).await?;
        let names: HashMap<String, String> = clients
            .into_iter()
            .zip(replies)
            .filter_map(|(client, reply)| match reply {
                redis::Value::BulkString(bytes) => {
                    Some((client, String::from_utf8_lossy(&bytes).into_owned()))
                }
                _ => None,
            })
            .collect();
        for row in rows {
            let (holder, name) = who(row);
            *name = holder.and_then(|holder| names.get(client_id_of(holder)).cloned());
        }
        Ok(())
    }

    /// The label of `holder`'s hold of the lock hash at `lock_key` (the `~label` field that
    /// [`Lock::with_label`](crate::Lock::with_label) stores), read together with the holder's
    /// own field in one `HMGET`: `None` without a holder (nothing is read), when the hold
    /// carries no label or when it is no longer `holder`'s (ended or taken over since the caller
    /// read it). Like a name, a label is advice: a key that cannot be read only leaves it out.
    pub(super) async fn hold_label(&self, lock_key: &[u8], holder: Option<&str>) -> Option<String> {
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(lock_key).arg(holder?).arg("~label");
        match self.query::<(Option<String>, Option<String>)>(&hmget).await {
            Ok((Some(_count), label)) => label,
            _ => None,
        }
    }
}
