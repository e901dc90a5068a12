//! Keeps the leases of held locks alive while (and only while) their holders hold them.
//!
//! One task per client renews every watched holder, in batches of up to `renew_batch` locks per
//! script call, every third of the default lease. A holder leaves the watch list the moment its
//! last guard starts releasing (or is dropped), when a renewal finds the lock gone or taken
//! over, or when renewals kept failing until its lease ran out by our clock; in the last two
//! cases it is marked lost, which wakes [`LockGuard::lost`](crate::LockGuard::lost).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::task::JoinSet;

use crate::client::Inner;
use crate::holder::Holder;
use crate::protocol;

/// After a failed renewal, how soon to try again (then doubling, up to a third of the lease).
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(50);

/// The client's watch list.
#[derive(Default)]
pub(crate) struct Watchdog {
    holders: Mutex<HashMap<String, Weak<Holder>>>,
    /// Renewal script calls sent so far (each renews up to one batch).
    calls: AtomicU64,
}

impl Watchdog {
    pub(crate) fn watch(&self, holder: &Arc<Holder>) {
        self.holders
            .lock()
            .insert(holder.id.clone(), Arc::downgrade(holder));
    }

    /// Holders to renew now. Drops from the list every holder that is gone, released, or lost,
    /// and marks lost those whose lease ran out while renewals failed.
    fn due(&self) -> Vec<Arc<Holder>> {
        let now = Instant::now();
        let mut due = Vec::new();
        self.holders.lock().retain(|_, weak| {
            let Some(holder) = weak.upgrade() else {
                return false;
            };
            if !holder.wants_renewal() {
                return false;
            }
            if now >= holder.deadline() {
                holder.mark_lost();
                return false;
            }
            due.push(holder);
            true
        });
        due
    }

    pub(crate) fn forget(&self, holder: &Holder) {
        self.holders.lock().remove(&holder.id);
    }

    /// How many holders are on the watch list.
    pub(crate) fn len(&self) -> usize {
        self.holders.lock().len()
    }

    /// Renewal script calls sent since the client connected.
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

/// The watchdog task of one client; it ends when the client is gone.
pub(crate) async fn run(client: Weak<Inner>) {
    let mut retry = RETRY_AFTER_FAILURE;
    loop {
        let Some(inner) = client.upgrade() else {
            return;
        };
        let period = inner.config.default_lease / 3;
        let all_renewed = tick(&inner).await;
        drop(inner);
        let pause = if all_renewed {
            retry = RETRY_AFTER_FAILURE;
            period
        } else {
            let pause = retry.min(period);
            retry = (retry * 2).min(period);
            pause
        };
        tokio::time::sleep(pause).await;
    }
}

/// Renews every due holder once; `false` if some batch failed and should be retried soon.
async fn tick(inner: &Arc<Inner>) -> bool {
    let due = inner.watchdog.due();
    if due.is_empty() {
        return true;
    }
    let lease = inner.config.default_lease;
    tracing::trace!(locks = due.len(), "renewing leases");
    let mut batches = JoinSet::new();
    for batch in due.chunks(inner.config.renew_batch) {
        let batch = batch.to_vec();
        let mut conn = inner.conn.clone();
        inner.watchdog.calls.fetch_add(1, Ordering::Relaxed);
        let client = batch[0].client.clone();
        batches.spawn(async move {
            let sent_at = Instant::now();
            let pairs: Vec<_> = batch.iter().map(|h| (&*h.keys, h.id.as_str())).collect();
            let outcome = client
                .controlled(protocol::renew(&mut conn, &pairs, lease))
                .await;
            (batch, sent_at, outcome)
        });
    }
    let mut all_renewed = true;
    while let Some(joined) = batches.join_next().await {
        let Ok((batch, sent_at, outcome)) = joined else {
            all_renewed = false;
            continue;
        };
        match outcome {
            Ok(renewed) => {
                for (holder, renewed) in batch.iter().zip(renewed) {
                    if renewed {
                        holder.lease_renewed(sent_at, lease);
                    } else {
                        // Gone or taken over: renewing it again could only ever fail, and the
                        // holder must stop trusting its lease now, not when it runs out.
                        holder.mark_lost();
                        inner.watchdog.forget(holder);
                    }
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, locks = batch.len(), "lease renewal failed; retrying");
                all_renewed = false;
            }
        }
    }
    all_renewed
}
