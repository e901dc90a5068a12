//! Who leads: every election under the prefix whose lock is held.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use super::inspect::name_laid_out;
use super::{display_bytes, format_duration, glob_escape, Admin};
use crate::protocol::{self, LockKeys};
use crate::{Error, Leader};

/// One election whose lock is held, as its followers read it.
///
/// ```no_run
/// # async fn demo(admin: fencelock::admin::Admin) -> Result<(), fencelock::Error> {
/// for election in admin.elections().await? {
///     match &election.leader {
///         Some(leader) => println!("{} led in term {}", election.display_name(), leader.term()),
///         None => println!("{} won, not announced yet", election.display_name()),
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ElectionInfo {
    /// The election name (arbitrary bytes).
    pub name: Vec<u8>,
    /// The Redis key of the election's lock hash, which is also its channel.
    pub key: Vec<u8>,
    /// The leader: its holder id, term and metadata. `None` while the winner has not recorded
    /// its metadata yet (or, with fair handoff, while the lock is reserved for a client).
    pub leader: Option<Leader>,
    /// The remaining lease; `None` when the key has no expiry (an operator's doing).
    pub ttl: Option<Duration>,
    /// Candidates waiting to lead, by client id, in the order they will be served: the
    /// election's fair-handoff queue (`LockClientBuilder::fair_handoff`). Empty without fair
    /// handoff, where each client keeps its waiting candidates in a local queue that only
    /// [`subscribers`](Self::subscribers) shows.
    pub queued_candidates: Vec<String>,
    /// The name the leader's client registered
    /// ([`LockClientBuilder::client_name`](crate::LockClientBuilder::client_name)); `None`
    /// without a leader or when its client registered none that is still kept.
    pub leader_client_name: Option<String>,
    /// The label the leader's campaign was given
    /// ([`Election::with_label`](crate::Election::with_label)); `None` without a leader or a
    /// label.
    pub leader_label: Option<String>,
    /// Connections subscribed to the election's channel (`PUBSUB NUMSUB`): each is a client
    /// with at least one waiting candidate or follower.
    pub subscribers: u64,
}

impl ElectionInfo {
    /// The election name for display: UTF-8 as is, other bytes escaped.
    pub fn display_name(&self) -> String {
        display_bytes(&self.name)
    }
}

impl fmt::Display for ElectionInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.display_name())?;
        match &self.leader {
            Some(leader) => write!(
                f,
                "  term {}  leader {}  metadata {}",
                leader.term(),
                leader.id(),
                display_bytes(leader.metadata())
            )?,
            None => write!(f, "  held, no leader announced")?,
        }
        if let Some(name) = &self.leader_client_name {
            write!(f, "  client {name}")?;
        }
        if let Some(label) = &self.leader_label {
            write!(f, "  label {label}")?;
        }
        match self.ttl {
            Some(ttl) => write!(f, "  lease {}", format_duration(ttl))?,
            None => write!(f, "  no expiry")?,
        }
        if !self.queued_candidates.is_empty() {
            write!(f, "  queued {}", self.queued_candidates.join(","))?;
        }
        write!(f, "  subscribed connections {}", self.subscribers)
    }
}

impl Admin {
    /// Every election under the prefix whose lock is held, sorted by name: its leader (id,
    /// term, metadata), remaining lease and candidates. Uses `SCAN` (never `KEYS`) for the keys
    /// `{*}leader:*`, then reads each election the way its followers do (`leader.lua`, one
    /// `EVALSHA`), so the id, term and metadata always belong to one leader, then its fair
    /// queue (`ZRANGE`) and its channel's subscribers (`PUBSUB NUMSUB`). An election resigned
    /// between the scan and the read is left out.
    ///
    /// # Errors
    /// [`Error::WrongType`] when an election's key holds foreign data;
    /// [`Error::PermissionDenied`] when the Redis user may not run `EVALSHA` or read the key;
    /// [`Error::Redis`] when the connection fails.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only (`SCAN`, then one read-only script per election).
    pub async fn elections(&self) -> Result<Vec<ElectionInfo>, Error> {
        let pattern = [glob_escape(&self.prefix), b"{*}leader:*".to_vec()].concat();
        let keys = self.scan(&pattern, Some("hash"), usize::MAX).await?;
        let mut elections = Vec::new();
        for key in keys {
            let layout = |prefix: &[u8], name: &[u8]| LockKeys::election(prefix, name).lock;
            let Some(name) = name_laid_out(&self.prefix, &key, b"leader:", layout) else {
                continue;
            };
            let election = LockKeys::election(&self.prefix, &name);
            let read = protocol::leader(&mut self.conn.clone(), &election).await?;
            // `None`: resigned or expired since the scan.
            let Some(ttl) = read.lease_left else {
                continue;
            };
            let mut conn = self.conn.clone();
            let queued_candidates: Vec<String> = redis::cmd("ZRANGE")
                .arg(election.queue())
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .map_err(Error::from_reply)?;
            let subscribers: HashMap<Vec<u8>, u64> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&key)
                .query_async(&mut conn)
                .await?;
            let leader = read.leader.map(Leader::from);
            let (leader_client_name, leader_label) = match &leader {
                Some(leader) => (
                    self.client_name(leader.id()).await?,
                    self.hold_label(&key, leader.id()).await,
                ),
                None => (None, None),
            };
            elections.push(ElectionInfo {
                subscribers: subscribers.get(&key).copied().unwrap_or(0),
                name,
                key,
                leader,
                leader_client_name,
                leader_label,
                ttl,
                queued_candidates,
            });
        }
        elections.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(elections)
    }
}
