//! Evicting a stuck holder (`force_release.lua`).

use super::inspect::HolderEntry;
use super::Admin;
use crate::protocol::keys::LockKeys;
use crate::protocol::{self, ForceReleaseReply};
use crate::{Error, FencingToken};

/// What [`Admin::force_release`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForceRelease {
    /// The holder was evicted: the hash is gone, waiters were woken.
    Evicted {
        /// The evicted holder's id and re-entry count.
        holder: HolderEntry,
        /// The evicted holder's token.
        token: Option<FencingToken>,
        /// The bucket's fence counter afterwards; the next token is greater.
        fence: u64,
    },
    /// Nobody held the lock; nothing changed.
    NotHeld,
    /// The lock is held with another token than the expected one (it changed hands); nothing
    /// changed.
    OtherToken {
        /// The token it is held with now.
        token: Option<FencingToken>,
    },
}

impl Admin {
    /// Evicts the holder of lock `name`: deletes the lock hash, raises the bucket's fence counter
    /// to at least the evicted token and wakes the waiters, in one script
    /// (`lua/force_release.lua`). With `expected`, only a holder with that token is evicted, so
    /// a lock that changed hands since it was looked at is left alone. See the
    /// [module documentation](crate::admin#what-a-force-release-guarantees) for what this guarantees
    /// about fenced writes of the evicted holder.
    ///
    /// ```no_run
    /// # async fn demo(admin: fencelock::admin::Admin) -> Result<(), fencelock::Error> {
    /// use fencelock::admin::ForceRelease;
    ///
    /// let seen = admin.lock("account:42").await?;
    /// if let Some(token) = seen.lock.token {
    ///     match admin.force_release("account:42", Some(token)).await? {
    ///         ForceRelease::Evicted { fence, .. } => println!("evicted; next token > {fence}"),
    ///         other => println!("nothing done: {other:?}"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::WrongType`] when the lock key or the fence counter holds
    /// foreign data (nothing is changed); [`Error::Redis`] when the connection fails (the script
    /// may or may not have run; look again with [`Admin::lock`]).
    ///
    /// # Cancel safety
    /// Not cancel safe in the sense of "nothing happened": the eviction is one script, which may
    /// have run when the future is dropped after sending it. It runs at most once per call (the
    /// script is atomic) and leaves the lock either untouched or evicted; look again with
    /// [`Admin::lock`] to learn which.
    pub async fn force_release(
        &self,
        name: impl AsRef<[u8]>,
        expected: Option<FencingToken>,
    ) -> Result<ForceRelease, Error> {
        let keys = self.keys_of(name.as_ref(), LockKeys::new)?;
        let reply =
            protocol::force_release(&mut self.conn.clone(), &keys, expected, self.pubsub).await?;
        Ok(match reply {
            ForceReleaseReply::Evicted {
                token,
                fence,
                holder,
                count,
            } => {
                let id = String::from_utf8_lossy(&holder).into_owned();
                ForceRelease::Evicted {
                    holder: HolderEntry {
                        client_name: self.client_name(&id).await?,
                        id,
                        count,
                    },
                    token,
                    fence,
                }
            }
            ForceReleaseReply::NotHeld => ForceRelease::NotHeld,
            ForceReleaseReply::OtherToken { token } => ForceRelease::OtherToken { token },
        })
    }
}
