//! Following one lock as it changes hands.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{PushKind, Value};
use tokio::sync::mpsc;

use super::inspect::{read_lock, HolderEntry, LockInfo};
use super::{connection_config, Admin};
use crate::protocol::keys::LockKeys;
use crate::protocol::ReleaseMessage;
use crate::{Error, FencingToken};

/// A live view of one lock, from [`Admin::watch`]. Dropping it closes its connection.
#[derive(Debug)]
pub struct Watch {
    conn: MultiplexedConnection,
    /// Resolves a new holder's client name.
    admin: Admin,
    pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    /// The events of the release messages not yet matched with a disappearance, in arrival
    /// order: each makes the event of the hold it ended (`holder` is `None` when it was never
    /// seen).
    releases: VecDeque<Ended>,
    current: LockInfo,
    pending: VecDeque<LockEvent>,
    interval: Duration,
}

/// How a hold ended, as the lock's channel told: the event's constructor.
type Ended = fn(Option<HolderEntry>, Option<FencingToken>) -> LockEvent;

/// One change of a watched lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEvent {
    /// A new holder took the lock.
    Acquired {
        /// The new holder.
        holder: HolderEntry,
        /// Its token.
        token: Option<FencingToken>,
    },
    /// The holder entered again (`reenter`); `holder.count` is the new count.
    Reentered {
        /// The holder with its new count.
        holder: HolderEntry,
    },
    /// The holder left one level but still holds; `holder.count` is the new count.
    Exited {
        /// The holder with its new count.
        holder: HolderEntry,
    },
    /// The lock was released (a release message was published). `holder` is `None` for a hold
    /// that began and ended between two polls, which only its message revealed.
    Released {
        /// The holder that released, if it was seen.
        holder: Option<HolderEntry>,
        /// Its token, if it was seen.
        token: Option<FencingToken>,
    },
    /// An operator force-released the lock (`force_release.lua`).
    ForceReleased {
        /// The evicted holder, if it was seen.
        holder: Option<HolderEntry>,
        /// Its token, if it was seen.
        token: Option<FencingToken>,
    },
    /// The hold ended without a release message: the lease ran out, or the key was deleted or
    /// evicted behind fencelock's back.
    Expired {
        /// The holder whose hold ended.
        holder: HolderEntry,
        /// Its token.
        token: Option<FencingToken>,
    },
}

impl fmt::Display for LockEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use LockEvent::*;
        // What happened, to whom, with which token (for the events that have one).
        let (verb, holder, token) = match self {
            Acquired { holder, token } => ("acquired", Some(holder), Some(token)),
            Reentered { holder } => ("reentered", Some(holder), None),
            Exited { holder } => ("exited", Some(holder), None),
            Released { holder, token } => ("released", holder.as_ref(), Some(token)),
            ForceReleased { holder, token } => ("force-released", holder.as_ref(), Some(token)),
            Expired { holder, token } => ("expired", Some(holder), Some(token)),
        };
        let Some(holder) = holder else {
            return write!(f, "{verb} holder=? (a hold shorter than one poll interval)");
        };
        write!(f, "{verb} holder={}", holder.id)?;
        if let Some(token) = token {
            let token = token.map_or_else(|| "?".into(), |t| t.to_string());
            write!(f, " token={token}")?;
        }
        match self {
            Acquired { .. } | Reentered { .. } | Exited { .. } => {
                write!(f, " count={}", holder.count)
            }
            Expired { .. } => write!(f, " (lease ran out, or the key was deleted)"),
            Released { .. } | ForceReleased { .. } => Ok(()),
        }
    }
}

impl Watch {
    /// The lock's state as of the last poll.
    pub fn current(&self) -> &LockInfo {
        &self.current
    }

    /// The watched lock's name.
    pub fn name(&self) -> &[u8] {
        &self.current.name
    }

    /// Waits for the next change.
    ///
    /// # Errors
    /// [`Error::Redis`] when the watch's connection fails (it does not reconnect: a watch that
    /// missed time would report made-up events); [`Error::WrongType`] when the key is replaced
    /// by foreign data.
    ///
    /// # Cancel safety
    /// Cancel safe: an event found by a poll is queued before the next await point.
    pub async fn next(&mut self) -> Result<LockEvent, Error> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(event);
            }
            let due = tokio::select! {
                () = tokio::time::sleep(self.interval) => true,
                push = self.pushes.recv() => match push {
                    Some(push) => self.take_push(push)?,
                    None => return Err(disconnected()),
                },
            };
            if due {
                self.poll().await?;
            }
        }
    }

    /// Records a release message; `true` when it was one (a reason to look at the lock now),
    /// `false` for the other pushes (subscription confirmations).
    fn take_push(&mut self, push: redis::PushInfo) -> Result<bool, Error> {
        match push.kind {
            PushKind::Message => {
                let message = match push.data.get(1) {
                    Some(Value::BulkString(payload)) => ReleaseMessage::parse(payload),
                    _ => ReleaseMessage::Released,
                };
                self.releases.push_back(match message {
                    ReleaseMessage::ForceReleased => {
                        |holder, token| LockEvent::ForceReleased { holder, token }
                    }
                    ReleaseMessage::Released => {
                        |holder, token| LockEvent::Released { holder, token }
                    }
                    // Published on elections' channels only (announce.lua), which a watch of a
                    // lock never subscribes to; a new holder, not a release: just look again.
                    ReleaseMessage::Elected => return Ok(true),
                });
                Ok(true)
            }
            PushKind::Disconnection => Err(disconnected()),
            _ => Ok(false),
        }
    }

    /// Fills in the holders' client names: known ones from the current state, new ones with
    /// one read, so an unchanged lock costs no more than its poll.
    async fn name_new_holders(&self, next: &mut LockInfo) -> Result<(), Error> {
        let mut unknown = false;
        for holder in &mut next.holders {
            match self.current.holders.iter().find(|h| h.id == holder.id) {
                Some(known) => holder.client_name.clone_from(&known.client_name),
                None => unknown = true,
            }
        }
        if unknown {
            self.admin.name_holders(std::slice::from_mut(next)).await?;
        }
        Ok(())
    }

    async fn poll(&mut self) -> Result<(), Error> {
        let (name, key) = (self.current.name.clone(), self.current.key.clone());
        let mut next = read_lock(&mut self.conn, name, key).await?;
        self.name_new_holders(&mut next).await?;
        // Replies and pushes share the connection in server order, so a release published
        // before this read is in the channel by now.
        while let Ok(push) = self.pushes.try_recv() {
            self.take_push(push)?;
        }
        let before = std::mem::replace(&mut self.current, next);
        let after = &self.current;
        match (before.holders.first(), after.holders.first()) {
            (Some(a), Some(b)) if a.id == b.id && before.token == after.token => {
                let holder = b.clone();
                if b.count > a.count {
                    self.pending.push_back(LockEvent::Reentered { holder });
                } else if b.count < a.count {
                    self.pending.push_back(LockEvent::Exited { holder });
                }
                return Ok(());
            }
            _ => {}
        }
        if let Some(holder) = before.holders.first().cloned() {
            let token = before.token;
            self.pending.push_back(match self.releases.pop_front() {
                Some(ended) => ended(Some(holder), token),
                None => LockEvent::Expired { holder, token },
            });
        }
        // While someone holds, a leftover message may be the current holder's release that came
        // in just after the read; only a free lock proves the leftovers were unseen holds.
        if after.holders.is_empty() {
            let unseen = self.releases.drain(..).map(|ended| ended(None, None));
            self.pending.extend(unseen);
        }
        if let Some(holder) = after.holders.first() {
            self.pending.push_back(LockEvent::Acquired {
                holder: holder.clone(),
                token: after.token,
            });
        }
        Ok(())
    }
}

fn disconnected() -> Error {
    Error::Redis(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "the watch's connection to redis was closed",
    )))
}

impl Admin {
    /// Follows lock `name`: acquisitions, re-entries, releases, expiries. Polls the lock every
    /// `interval` (and at once when a release is published); see the
    /// [module documentation](crate::admin#how-watch-sees-acquisitions).
    ///
    /// ```no_run
    /// # async fn demo(admin: fencelock::admin::Admin) -> Result<(), fencelock::Error> {
    /// let mut watch = admin.watch("account:42", std::time::Duration::from_millis(100)).await?;
    /// println!("now: {}", watch.current());
    /// loop {
    ///     println!("{}", watch.next().await?);
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::InvalidConfig`] for a zero interval; [`Error::Redis`]
    /// when the second connection (the watch's own) cannot be opened.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call closes the watch's own connection (opened here) and changes
    /// nothing on the server.
    pub async fn watch(&self, name: impl AsRef<[u8]>, interval: Duration) -> Result<Watch, Error> {
        let name = name.as_ref();
        let keys = self.keys_of(name, LockKeys::new)?;
        if !self.resp3 {
            return Err(Error::InvalidConfig {
                reason: "watch needs RESP3 (HELLO 3), which this server refused".into(),
            });
        }
        if interval.is_zero() {
            return Err(Error::InvalidConfig {
                reason: "the watch interval must be above zero".into(),
            });
        }
        let (sender, pushes) = mpsc::unbounded_channel();
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(
                &connection_config().set_push_sender(sender),
            )
            .await?;
        // Subscribed before the first read: a release after that read is then always seen.
        conn.subscribe(&keys.lock).await?;
        let mut current = read_lock(&mut conn, name.to_vec(), keys.lock).await?;
        self.name_holders(std::slice::from_mut(&mut current))
            .await?;
        Ok(Watch {
            conn,
            admin: self.clone(),
            pushes,
            releases: VecDeque::new(),
            current,
            pending: VecDeque::new(),
            interval,
        })
    }
}
