//! The seam between the connections and the waiters above them: a connection delivers what
//! arrives unasked (release messages, a lost connection, a dropped subscription, a new primary)
//! to a [`PushListener`], which the engine implements. The transport holds it weakly, so a
//! connection never keeps a dropped client's queues alive.

use std::sync::{Arc, Weak};

use redis::{PushInfo, PushKind, Value};

/// Receives what a connection is told without asking.
pub(crate) trait PushListener: Send + Sync + 'static {
    /// A message with `payload` arrived on `channel` (a lock's release channel).
    fn on_message(&self, channel: &[u8], payload: &[u8]);
    /// The connection dropped: messages published meanwhile are lost for good.
    fn on_disconnect(&self);
    /// The server dropped the sharded subscription to `channel` by itself (its slot moved to
    /// another node: resharding, failover).
    fn on_subscription_lost(self: Arc<Self>, channel: &[u8]);
    /// The client now talks to another server (a Sentinel failover), which has none of the
    /// old connection's subscriptions.
    fn on_new_primary(self: Arc<Self>);
}

/// The push handler of one redis-rs connection, routing to `listener` for as long as it lives.
pub(crate) fn push_handler(
    listener: Weak<dyn PushListener>,
) -> impl Fn(PushInfo) -> Result<(), ()> + Send + Sync {
    move |push: PushInfo| {
        let Some(listener) = listener.upgrade() else {
            return Err(());
        };
        let channel = match push.data.first() {
            Some(Value::BulkString(channel)) => Some(channel.as_slice()),
            _ => None,
        };
        match (push.kind, channel) {
            (PushKind::Message | PushKind::SMessage, Some(channel)) => {
                let payload = match push.data.get(1) {
                    Some(Value::BulkString(payload)) => payload.as_slice(),
                    _ => &[],
                };
                listener.on_message(channel, payload);
            }
            // A release published while we were disconnected is lost for good: every
            // waiting head goes back to Redis instead of waiting out the lease.
            (PushKind::Disconnection, _) => listener.on_disconnect(),
            // The server drops a sharded subscription by itself when the channel's slot moves
            // to another node (resharding, failover): subscribe again, now at the new owner.
            (PushKind::SUnsubscribe, Some(channel)) => listener.on_subscription_lost(channel),
            _ => {}
        }
        Ok(())
    }
}
