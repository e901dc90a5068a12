//! What the server's own settings mean for the locks: the one judgement of a
//! `maxmemory-policy`, shared by the warning `connect` logs and the operator's `doctor`.

use std::fmt;

/// A `maxmemory-policy` that can evict fencelock's keys, and what it can evict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EvictionRisk {
    /// The policy as the server reported it.
    pub(crate) policy: String,
    /// Whether the policy can also evict keys without a TTL (fence counters, high-water
    /// marks): then tokens can repeat, not only a second holder get in.
    pub(crate) evicts_counters: bool,
}

impl EvictionRisk {
    /// The risk of `policy`, or `None` for `noeviction` (the only safe policy). Every other
    /// policy can evict: the `volatile-*` policies pick exactly the keys with a TTL (held
    /// locks), the `allkeys-*` policies any key.
    pub(crate) fn of(policy: &str) -> Option<EvictionRisk> {
        (policy != "noeviction").then(|| EvictionRisk {
            policy: policy.to_owned(),
            evicts_counters: !policy.starts_with("volatile"),
        })
    }

    /// What the policy does to fencelock's keys, in words that follow the policy's name.
    pub(crate) fn evicts(&self) -> &'static str {
        if self.evicts_counters {
            "can evict any key under memory pressure: held locks, fence counters and fenced \
             resources' marks, so tokens can repeat"
        } else {
            "evicts keys with a TTL under memory pressure, which is exactly the held locks: a \
             second holder can get in"
        }
    }

    /// The remedy.
    pub(crate) const FIX: &'static str = "CONFIG SET maxmemory-policy noeviction (and in \
         redis.conf), or keep locks on a redis of their own without maxmemory";
}

impl fmt::Display for EvictionRisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "redis maxmemory-policy {} {}; fix: {}",
            self.policy,
            self.evicts(),
            EvictionRisk::FIX
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_noeviction_is_safe_and_volatile_policies_spare_the_counters() {
        assert_eq!(EvictionRisk::of("noeviction"), None);
        let volatile = EvictionRisk::of("volatile-lru").unwrap();
        assert!(!volatile.evicts_counters);
        let allkeys = EvictionRisk::of("allkeys-lfu").unwrap();
        assert!(allkeys.evicts_counters);
        let text = allkeys.to_string();
        assert!(
            text.contains("allkeys-lfu") && text.contains("noeviction"),
            "{text}"
        );
        assert!(text.contains("tokens can repeat"), "{text}");
    }
}
