//! The release channel of a lock: how its messages travel, and what they say.
//!
//! The channel is the lock key's own name, so on a cluster it lives in the lock's slot. The
//! scripts publish on it when a lock becomes free (or reserved for a fair-handoff client);
//! waiters treat every message on it as "the lock may be free", whatever it says.

/// How release messages travel: classic pub/sub on one server, sharded pub/sub on a cluster
/// (`SPUBLISH` reaches only the nodes of the channel's slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PubSub {
    Classic,
    Sharded,
}

impl PubSub {
    /// The scripts' argument that picks `PUBLISH` or `SPUBLISH`.
    pub(crate) fn script_arg(self) -> &'static str {
        match self {
            PubSub::Classic => "classic",
            PubSub::Sharded => "sharded",
        }
    }
}

/// What a message on a lock's release channel says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseMessage {
    /// `released`: the holder released (`release.lua`, `release_fair.lua`, `cancel.lua`).
    Released,
    /// `force-released`: an operator evicted the holder (`force_release.lua`).
    ForceReleased,
    /// `elected`: a new leader recorded its metadata (`announce.lua`); the lock is held.
    Elected,
}

impl ReleaseMessage {
    /// Reads a message's payload; anything else is taken for a plain release.
    pub(crate) fn parse(payload: &[u8]) -> ReleaseMessage {
        match payload {
            b"force-released" => ReleaseMessage::ForceReleased,
            b"elected" => ReleaseMessage::Elected,
            _ => ReleaseMessage::Released,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_publish_what_the_readers_parse() {
        assert_eq!(
            ReleaseMessage::parse(b"force-released"),
            ReleaseMessage::ForceReleased
        );
        assert_eq!(ReleaseMessage::parse(b"released"), ReleaseMessage::Released);
        for script in [
            include_str!("../../lua/lib/release.lua"),
            include_str!("../../lua/cancel.lua"),
        ] {
            assert!(script.contains("'released'"));
        }
        assert!(include_str!("../../lua/force_release.lua").contains("'force-released'"));
        assert_eq!(ReleaseMessage::parse(b"elected"), ReleaseMessage::Elected);
        assert!(include_str!("../../lua/announce.lua").contains("'elected'"));
        assert_eq!(PubSub::Sharded.script_arg(), "sharded");
        assert_eq!(PubSub::Classic.script_arg(), "classic");
    }
}
