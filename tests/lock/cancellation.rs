//! Cancelled acquires and re-entries never leave the lock held or a stray entry count: the
//! futures are dropped at random points (before sending, while the request is on the wire,
//! after it ran), hundreds of times. `FENCELOCK_CANCEL_CASES` raises the count (default 500).

use std::time::Duration;

use crate::common::cancel::CancelPoints;
use crate::common::{eventually, Env};
use fencelock::{Lock, LockGuard};

fn cases() -> u64 {
    std::env::var("FENCELOCK_CANCEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

/// Operation records that `cancel.lua` wrote in the last few seconds (value "c").
fn cancel_records(fx: &Env) -> usize {
    use redis::Commands;
    let mut raw = fx.raw();
    fx.keys("fencelock:{*}op:*")
        .into_iter()
        .filter(|k| raw.get::<_, Option<String>>(k).unwrap().as_deref() == Some("c"))
        .count()
}

async fn release_all(guards: Vec<LockGuard>) {
    for guard in guards {
        guard.release().await.unwrap();
    }
}

on_topologies_multi_thread! {
    async fn cancelled_acquires_never_leave_the_lock_held(fx) {
        let (a, b) = (fx.client().await, fx.client().await);
        let seed = 0x5eed_0001;
        let mut points = CancelPoints::new(seed).with_sleeps_up_to(Duration::from_micros(1500));
        for case in 0..cases() {
            let lock: Lock = a.lock("cancel-acquire").unwrap();
            // Half the time someone else holds it and lets go at a random moment.
            let other = if points.rng().below(2) == 0 {
                Some(b.lock("cancel-acquire").unwrap().acquire().await.unwrap())
            } else {
                None
            };
            let releaser = other.map(|guard| {
                let delay = points.rng().below(2_000);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_micros(delay)).await;
                    guard.release().await.unwrap();
                })
            });
            let outcome = if points.rng().below(2) == 0 {
                points.run(lock.acquire()).await.map(|r| Some(r.unwrap()))
            } else {
                points.run(lock.try_acquire()).await.map(|r| r.unwrap())
            };
            if let Some(Some(guard)) = outcome {
                release_all(vec![guard]).await;
            }
            if let Some(releaser) = releaser {
                releaser.await.unwrap();
            }
            assert!(
                eventually(Duration::from_secs(3), || fx
                    .lock_key("cancel-acquire")
                    .is_none())
                .await,
                "case {case} (seed {seed:#x}): the lock stayed held: {:?}",
                fx.lock_state("cancel-acquire")
            );
        }
        // Both outcomes were exercised, and some cancels hit a request already on its way.
        points.assert_both_outcomes();
        assert!(
            cancel_records(&fx) > 0,
            "no cancel ever ran against an in-flight request"
        );
    }
}

on_topologies_multi_thread! {
    async fn cancelled_reentries_never_leave_a_stray_count(fx) {
        let client = fx.client().await;
        let seed = 0x5eed_0002;
        let mut points = CancelPoints::new(seed);
        let lock = client.lock("cancel-reenter").unwrap();
        for case in 0..cases() {
            let outer = lock.acquire().await.unwrap();
            if let Some(inner) = points.run(outer.reenter()).await {
                inner.unwrap().release().await.unwrap();
            }
            let holder = outer.holder_id().to_owned();
            assert!(
                eventually(Duration::from_secs(3), || {
                    fx.lock_state("cancel-reenter").map(|s| s.0) == Some(vec![(holder.clone(), 1)])
                })
                .await,
                "case {case} (seed {seed:#x}): {:?}",
                fx.lock_state("cancel-reenter")
            );
            outer.release().await.unwrap();
            assert!(fx.lock_key("cancel-reenter").is_none(), "case {case}");
        }
        points.assert_both_outcomes();
        assert!(
            cancel_records(&fx) > 0,
            "no cancel ever ran against an in-flight request"
        );
    }
}
