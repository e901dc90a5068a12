//! Which semaphore scripts wake waiters, against a real redis-server: every release, an
//! acquisition whose purge left permits free, a queue head that wins with permits left, an
//! operator's new limit. (A read-write lock's release wakes nobody while holds stay:
//! `rwlock_tests.rs`.)

use super::*;
use crate::protocol::contract_tests::{hold_test, released_by};

hold_test! {
    /// Every release of a semaphore's hold publishes, also one that leaves other holds: the
    /// permits it frees may be what a waiter needs.
    async fn a_release_that_leaves_other_holds_wakes_waiters(server, conn, keys = sem_keys()) {
        let channel = keys.lock.clone();
        token_of(take(&mut conn, &keys, "a", 2, LEASE).await).unwrap();
        token_of(take(&mut conn, &keys, "b", 1, LEASE).await).unwrap();
        let waiting = take(&mut conn, &keys, "w", 2, LEASE).await;
        assert!(
            matches!(waiting, SemAcquireReply::Busy { .. }),
            "{waiting:?}"
        );
        let mut sub = subscriber(&server, std::slice::from_ref(&channel)).await;
        let reply = released_by(&mut conn, &keys, "a", "ra").await;
        assert_eq!(reply, OwnerReply::Done { remaining: 0 });
        assert_eq!(
            next_message(&mut sub).await,
            Some(channel.clone()),
            "a release that left b's hold"
        );
        token_of(take(&mut conn, &keys, "w", 2, LEASE).await).unwrap();
    }
}

hold_test! {
    /// Waiters are told when permits may have come back: by an acquisition whose purge of an
    /// expired hold left permits free (lease zset: with field expiry the server drops holds
    /// without any script, and waiters go by their timers), by a queue head that wins with
    /// permits left, and by an operator's new limit.
    async fn waiters_are_told_when_permits_may_have_come_back(server, conn, keys = sem_keys()) {
        use super::semaphore::sem_limit;
        let channel = keys.lock.clone();
        if !hold_field_expiry() {
            token_of(take(&mut conn, &keys, "crashed", 2, SHORT).await).unwrap();
            token_of(take(&mut conn, &keys, "alive", 1, LEASE).await).unwrap();
            tokio::time::sleep(SHORT * 2).await;
            let mut sub = subscriber(&server, std::slice::from_ref(&channel)).await;
            token_of(take(&mut conn, &keys, "next", 1, LEASE).await).unwrap();
            assert_eq!(
                next_message(&mut sub).await,
                Some(channel.clone()),
                "an acquisition that dropped an expired hold and left permits free"
            );
            for (holder, op) in [("next", "r0"), ("alive", "r00")] {
                released_by(&mut conn, &keys, holder, op).await;
            }
        }
        let fair = async |conn: &mut Conn, holder: &str, permits| {
            take_fair(conn, &keys, holder, permits, true, LEASE).await
        };
        token_of(fair(&mut conn, "held", 3).await).unwrap();
        let queued = fair(&mut conn, "head", 2).await;
        assert!(matches!(queued, SemAcquireReply::Busy { .. }), "{queued:?}");
        released_by(&mut conn, &keys, "held", "r1").await;
        let mut sub = subscriber(&server, std::slice::from_ref(&channel)).await;
        token_of(fair(&mut conn, "head", 2).await).unwrap();
        assert_eq!(
            next_message(&mut sub).await,
            Some(channel.clone()),
            "a queue head that won with permits left"
        );
        drop(sub);
        let mut sub = subscriber(&server, std::slice::from_ref(&channel)).await;
        assert_eq!(
            sem_limit(&mut conn, &keys, 6, PubSub::Classic)
                .await
                .unwrap(),
            Some(4)
        );
        assert_eq!(
            next_message(&mut sub).await,
            Some(channel.clone()),
            "an operator's new limit"
        );
    }
}
