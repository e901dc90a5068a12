//! Who leads: every election under the prefix whose lock is held.

use std::fmt;
use std::time::Duration;

use super::{display_bytes, format_duration, item, Admin};
use crate::protocol::keys::Listing;
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
        item(f, "client", self.leader_client_name.as_ref(), "")?;
        item(f, "label", self.leader_label.as_ref(), "")?;
        item(f, "lease", self.ttl.map(format_duration), "no expiry")?;
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
        let mut elections = self
            .rows(Listing::ELECTIONS, b"", async |name, key| {
                let election = LockKeys::election(&self.prefix, &name);
                let read = protocol::leader(&mut self.conn.clone(), &election).await?;
                // `None`: resigned or expired since the scan.
                let Some(ttl) = read.lease_left else {
                    return Ok(None);
                };
                let mut queue = redis::cmd("ZRANGE");
                queue.arg(election.queue()).arg(0).arg(-1);
                let queued_candidates: Vec<String> = self.query(&queue).await?;
                let leader = read.leader.map(Leader::from);
                let leader_id = leader.as_ref().map(Leader::id);
                let leader_label = self.hold_label(&key, leader_id).await;
                Ok(Some(ElectionInfo {
                    subscribers: self.subscribers(&key).await?,
                    name,
                    key,
                    leader,
                    leader_client_name: None,
                    leader_label,
                    ttl,
                    queued_candidates,
                }))
            })
            .await?;
        self.name_rows(&mut elections, |e| {
            (e.leader.as_ref().map(Leader::id), &mut e.leader_client_name)
        })
        .await?;
        Ok(elections)
    }
}
