//! Keeps the leases of held locks alive while (and only while) their holders hold them.
//!
//! One task per client renews every watched holder, in batches of up to `renew_batch` locks per
//! script call (on a cluster, per slot: one call cannot span slots), every third of the default
//! lease. A holder leaves the watch list the moment its
//! last guard starts releasing (or is dropped), when a renewal finds the lock gone or taken
//! over, or when renewals kept failing until its lease ran out by our clock; in the last two
//! cases it is marked lost, which wakes [`LockGuard::lost`](crate::LockGuard::lost).
//!
//! The list holds every live hold of the client, also those with a lease of their own, which
//! are never renewed: the same rounds check every hold's age against `max_hold`, and a waiting
//! task's wait record names the holds of its task from it ([`Watchdog::held_by`]).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::task::JoinSet;

use super::holder::{Holder, LostReason, Owner};
use super::Engine;
use crate::base::{metrics, retry};
use crate::protocol;

/// After a failed renewal, how soon to try again (then doubling, up to a third of the lease).
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(50);

/// The client's watch list, keyed by the address of each holder's shared allocation: the
/// `Weak` in the entry keeps that allocation (not the holder) alive, so the address cannot be
/// reused by another holder while the entry exists. Watching and forgetting are on every
/// uncontended acquire and release, so the key is a plain integer (no id clone) with a cheap
/// hash (no SipHash: the keys are our own addresses, not attacker-chosen).
#[derive(Default)]
pub(crate) struct Watchdog {
    holders: Mutex<HashMap<usize, Weak<Holder>, BuildHasherDefault<AddressHasher>>>,
    /// Renewal script calls sent so far (each renews up to one batch).
    calls: AtomicU64,
}

impl Watchdog {
    /// Lists `holder` for renewal. Only once a guard holds it: a renewal pass drops every
    /// holder that no guard holds, for good.
    pub(crate) fn watch(&self, holder: &Arc<Holder>) {
        debug_assert!(
            holder.guards() > 0,
            "a holder is watched once a guard holds it"
        );
        self.holders
            .lock()
            .insert(address(holder), Arc::downgrade(holder));
    }

    /// Holders to renew now. Drops from the list every holder that is gone, released, or lost,
    /// and marks lost those whose lease ran out while renewals failed.
    /// With `max_hold`, also reports each listed hold held that long (once per hold); holds
    /// listed only for that (a lease of their own) stay listed but are never due.
    fn due(&self, max_hold: Option<Duration>) -> Vec<Arc<Holder>> {
        let now = Instant::now();
        let mut due = Vec::new();
        self.holders.lock().retain(|_, weak| {
            let Some(holder) = weak.upgrade().filter(|h| h.wants_renewal()) else {
                return false;
            };
            if let Some(max) = max_hold {
                holder.check_age(max, now);
            }
            if !holder.watched {
                return true;
            }
            if now >= holder.deadline() {
                holder.mark_lost(LostReason::LeaseExpired);
                return false;
            }
            due.push(holder);
            true
        });
        due
    }

    /// The keys of the live holds `owner` acquired (a task's locks, semaphore permits and
    /// read-write lock holds), for its wait record.
    pub(crate) fn held_by(&self, owner: Owner) -> Vec<Vec<u8>> {
        let mut keys: Vec<Vec<u8>> = self
            .holders
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .filter(|holder| holder.owner == owner && holder.wants_renewal())
            .map(|holder| holder.keys.lock.clone())
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    pub(crate) fn forget(&self, holder: &Holder) {
        self.holders.lock().remove(&address(holder));
    }

    /// How many holders are on the watch list to be renewed: every entry but the live holds
    /// listed only for `max_hold` (an entry whose holder is gone counts until the next round
    /// drops it, as it did before that round).
    pub(crate) fn len(&self) -> usize {
        self.holders
            .lock()
            .values()
            .filter(|weak| weak.upgrade().is_none_or(|holder| holder.watched))
            .count()
    }

    /// Renewal script calls sent since the client connected.
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

/// The watch-list key of a holder: the address of its shared allocation.
fn address(holder: &Holder) -> usize {
    std::ptr::from_ref(holder) as usize
}

/// Hashes the one `usize` a watch-list key is with MurmurHash3's 64-bit finaliser. Allocations
/// are aligned, so an address's low bits are always zero; a plain multiplication would leave
/// them zero too (a product's low bits depend only on the factors' low bits), and hashbrown
/// takes the bucket index from the low bits. The finaliser mixes every bit into every bit.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_usize` is used by a `usize` key; fold anything else in byte by byte.
        for byte in bytes {
            self.write_usize(usize::from(*byte));
        }
    }

    fn write_usize(&mut self, n: usize) {
        let mut h = self.0 ^ n as u64;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        self.0 = h;
    }
}

/// The watchdog task of one client; it ends when the client is gone.
pub(crate) async fn run(engine: Weak<Engine>) {
    let mut failures = None;
    loop {
        let Some(engine_now) = engine.upgrade() else {
            return;
        };
        let period = engine_now.config.default_lease / 3;
        let all_renewed = tick(&engine_now).await;
        drop(engine_now);
        let pause = if all_renewed {
            failures = None;
            period
        } else {
            // Never longer than a period: the retries must fit in the lease they protect.
            failures
                .get_or_insert_with(|| retry::backoff(RETRY_AFTER_FAILURE, period))
                .next()
                .unwrap_or(period)
                .min(period)
        };
        tokio::time::sleep(pause).await;
    }
}

/// Renews every due holder once; `false` if some batch failed and should be retried soon.
async fn tick(engine: &Arc<Engine>) -> bool {
    // On a cluster one script call may only touch keys of one slot, so the batches are cut per
    // slot; on one server any locks can share a call. Lock holds and semaphore holds are
    // renewed by different scripts, so they never share a batch.
    let mut grouped: HashMap<(u16, bool), Vec<Arc<Holder>>> = HashMap::new();
    for holder in engine.watchdog.due(engine.config.max_hold) {
        let group = (engine.route(&holder.keys), holder.keys.has_hold_leases());
        grouped.entry(group).or_default().push(holder);
    }
    let mut batches = JoinSet::new();
    for group in grouped.into_values() {
        for batch in group.chunks(engine.config.renew_batch) {
            engine.watchdog.calls.fetch_add(1, Ordering::Relaxed);
            metrics::renewal_call();
            batches.spawn(renew(engine.clone(), batch.to_vec()));
        }
    }
    let mut all_renewed = true;
    while let Some(joined) = batches.join_next().await {
        all_renewed &= joined.unwrap_or(false);
    }
    all_renewed
}

/// Renews one batch of holders by one script call; `false` if the call failed.
async fn renew(engine: Arc<Engine>, batch: Vec<Arc<Holder>>) -> bool {
    let lease = engine.config.default_lease;
    // Dropped unanswered (the call failed: its outcome may be unknown), each may have run.
    let settings: Vec<_> = batch.iter().map(|h| h.lease_setting(lease)).collect();
    let pairs: Vec<_> = batch.iter().map(|h| (&*h.keys, h.id.as_str())).collect();
    let mut conn = engine.conn();
    let renew = engine.controlled(protocol::renew(&mut conn, &pairs, lease));
    let renewed = match renew.await {
        Ok(renewed) => renewed,
        Err(err) => {
            tracing::warn!(
                name: "fencelock.renew",
                locks = batch.len(),
                outcome = "error",
                error = %err,
                "lease renewal failed; retrying"
            );
            return false;
        }
    };
    let count = renewed.iter().filter(|r| **r).count();
    metrics::renewals(count as u64);
    tracing::debug!(
        name: "fencelock.renew",
        locks = batch.len(),
        renewed = count,
        lost = batch.len() - count,
        outcome = "ok",
        "renewed leases"
    );
    for ((holder, renewed), setting) in batch.iter().zip(renewed).zip(settings) {
        if renewed {
            setting.ran();
        } else {
            setting.refused();
            // Gone or taken over: renewing it again could only ever fail, and the holder must
            // stop trusting its lease now, not when it runs out. Off the list first, so
            // whoever wakes on the lost signal sees it gone. A holder whose release overtook
            // this renewal is gone by its own hand, not lost.
            let lost = holder.wants_renewal();
            engine.watchdog.forget(holder);
            if lost {
                holder.mark_lost(LostReason::RenewalRefused);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    /// Aligned addresses (multiples of 16 or more, as allocations are) must still spread over
    /// the low bits that pick a bucket, or a long watch list degrades into long probes: 4096
    /// keys in 1024 buckets leave ~19 empty when hashed at random; all in 64 buckets without
    /// mixing.
    #[test]
    fn aligned_addresses_spread_over_the_bucket_bits() {
        let build = BuildHasherDefault::<AddressHasher>::default();
        for align in [16usize, 64, 256] {
            let buckets: std::collections::HashSet<u64> = (0..4096usize)
                .map(|i| build.hash_one(0x5555_0000_0000 + i * align) & 1023)
                .collect();
            assert!(
                buckets.len() > 950,
                "alignment {align}: {} of 1024",
                buckets.len()
            );
        }
    }
}
