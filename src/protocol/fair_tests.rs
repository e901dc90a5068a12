//! Fair handoff (`acquire_fair.lua`, `release_fair.lua`): the release that frees the lock
//! reserves it for the first queued client; nobody else can take it, nobody holds it, and the
//! claim is an ordinary fresh acquisition.

use super::*;
use crate::protocol::contract_tests::{assert_replay, cancelled_by, lock_keys};

const GRACE: Duration = Duration::from_secs(5);

fn waiter(client: &str) -> FairAttempt<'_> {
    FairAttempt {
        client,
        enqueue: true,
        queue_slack: Duration::from_secs(1),
    }
}

fn trying(client: &str) -> FairAttempt<'_> {
    FairAttempt {
        enqueue: false,
        ..waiter(client)
    }
}

async fn fair_acquire(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    fair: FairAttempt<'_>,
) -> AcquireReply {
    acquire_fair(conn, keys, holder, LEASE, OP_TTL, fair, None, false)
        .await
        .unwrap()
}

/// The fair acquisition of the waiter `1` of `client` ([`waiter`]), which must be refused: the
/// error.
async fn fair_refused(conn: &mut Conn, keys: &LockKeys, client: &str) -> Error {
    let holder = format!("{client}:1");
    acquire_fair(
        conn,
        keys,
        &holder,
        LEASE,
        OP_TTL,
        waiter(client),
        None,
        false,
    )
    .await
    .unwrap_err()
}

/// The lock taken by the client `ca`, with `cb` and then `cc` queued behind it.
async fn held_by_ca_with_cb_and_cc_queued(conn: &mut Conn, keys: &LockKeys) {
    token_of(fair_acquire(conn, keys, "ca:1", waiter("ca")).await);
    fair_acquire(conn, keys, "cb:1", waiter("cb")).await;
    fair_acquire(conn, keys, "cc:1", waiter("cc")).await;
}

async fn fair_release(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    op: &str,
    grace: Duration,
    requeue: Option<(&str, Duration)>,
) -> OwnerReply {
    release_fair(
        conn,
        keys,
        holder,
        op,
        OP_TTL,
        PubSub::Classic,
        grace,
        requeue,
    )
    .await
    .unwrap()
}

async fn queue(conn: &mut Conn, keys: &LockKeys) -> Vec<String> {
    conn.zrange(keys.queue(), 0, -1).await.unwrap()
}

async fn reserved(conn: &mut Conn, keys: &LockKeys) -> Vec<(String, String)> {
    conn.hgetall(&keys.lock).await.unwrap()
}

fn token_of(reply: AcquireReply) -> FencingToken {
    match reply {
        AcquireReply::Acquired {
            token,
            count: 1,
            lease_left: None,
        } => token,
        other => panic!("expected a fresh acquisition, got {other:?}"),
    }
}

#[tokio::test]
async fn a_release_reserves_the_lock_for_the_first_queued_client_only() {
    let (_server, mut conn, keys) = setup().await;
    let first = token_of(fair_acquire(&mut conn, &keys, "ca:1", waiter("ca")).await);
    // Waiters queue in the order of their first failed attempt; a try_acquire never does,
    // and a second failure of a queued client keeps its place.
    for (holder, fair) in [
        ("cb:1", waiter("cb")),
        ("cc:1", waiter("cc")),
        ("cd:1", trying("cd")),
        ("cb:1", waiter("cb")),
    ] {
        let reply = fair_acquire(&mut conn, &keys, holder, fair).await;
        assert!(
            matches!(reply, AcquireReply::Held { pttl: Some(_) }),
            "{reply:?}"
        );
    }
    assert_eq!(queue(&mut conn, &keys).await, ["cb", "cc"]);
    let ttl: i64 = conn.pttl(keys.queue()).await.unwrap();
    assert!(ttl > 0, "the queue has no expiry: {ttl}");

    assert_eq!(
        fair_release(&mut conn, &keys, "ca:1", "ca:2", GRACE, None).await,
        OwnerReply::Done { remaining: 0 }
    );
    let reservation = vec![("~reserved".to_owned(), "cb".to_owned())];
    assert_eq!(reserved(&mut conn, &keys).await, reservation);
    assert_eq!(queue(&mut conn, &keys).await, ["cc"]);
    // A re-sent copy of that release replays its reply and reserves nothing again.
    assert_eq!(
        fair_release(&mut conn, &keys, "ca:1", "ca:2", GRACE, None).await,
        OwnerReply::Done { remaining: 0 }
    );
    assert_eq!(queue(&mut conn, &keys).await, ["cc"]);

    // Held for everyone else: fair waiters, try_acquire, and a default-mode acquire.
    for reply in [
        fair_acquire(&mut conn, &keys, "cc:1", waiter("cc")).await,
        fair_acquire(&mut conn, &keys, "cd:2", trying("cd")).await,
        acquire(&mut conn, &keys, "x:1", LEASE, OP_TTL)
            .await
            .unwrap(),
    ] {
        match reply {
            AcquireReply::Held { pttl: Some(pttl) } => assert!(pttl <= GRACE),
            other => panic!("a reservation was taken by another client: {other:?}"),
        }
    }
    // Nobody holds it: every owner-checked script says so and changes nothing.
    // (Holder ids are `<client id>:<n>`; none can be the "~reserved" field.)
    for holder in ["ca:1", "cb:1"] {
        assert_eq!(
            released_by(&mut conn, &keys, holder, "r-x").await,
            OwnerReply::NotHeld
        );
        assert_eq!(
            fair_release(&mut conn, &keys, holder, "r-y", GRACE, None).await,
            OwnerReply::NotHeld
        );
        assert_eq!(
            extend(&mut conn, &keys, holder, LEASE).await.unwrap(),
            OwnerReply::NotHeld
        );
        assert_eq!(
            reenter(&mut conn, &keys, holder, "e-x", OP_TTL)
                .await
                .unwrap(),
            EnterReply::NotHeld
        );
        assert_eq!(
            renew(&mut conn, &[(&keys, holder)], LEASE).await.unwrap(),
            vec![false]
        );
        let undone = cancelled_by(&mut conn, &keys, holder, "c-x", CancelKind::Acquire).await;
        assert_eq!(undone, CancelReply::NotRun);
    }
    assert_eq!(reserved(&mut conn, &keys).await, reservation);
    let ttl: i64 = conn.pttl(&keys.lock).await.unwrap();
    assert!(ttl > 0 && ttl <= GRACE.as_millis() as i64, "{ttl}");

    // The reserved client claims with a fresh, higher token; a re-sent claim replays it.
    let claim = fair_acquire(&mut conn, &keys, "cb:7", waiter("cb")).await;
    let second = token_of(claim);
    assert!(second > first);
    let again = fair_acquire(&mut conn, &keys, "cb:7", waiter("cb")).await;
    assert_replay(&claim, &again);
    assert_eq!(count(&mut conn, &keys, "cb:7").await, Some(1));
    let fields = reserved(&mut conn, &keys).await;
    assert!(
        fields.iter().all(|(f, _)| f != "~reserved"),
        "the claim kept the reservation: {fields:?}"
    );
    let lease: i64 = conn.pttl(&keys.lock).await.unwrap();
    assert!(
        lease > GRACE.as_millis() as i64,
        "the claim kept the grace: {lease}"
    );

    // Next in line: cc. Then the queue is empty and the last release frees the lock.
    fair_release(&mut conn, &keys, "cb:7", "cb:8", GRACE, None).await;
    let third = token_of(fair_acquire(&mut conn, &keys, "cc:2", waiter("cc")).await);
    assert!(third > second);
    fair_release(&mut conn, &keys, "cc:2", "cc:3", GRACE, None).await;
    let left: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!left, "a release with an empty queue left the hash");
    let left: bool = conn.exists(keys.queue()).await.unwrap();
    assert!(!left, "the empty queue is still there");
}

#[tokio::test]
async fn a_winner_leaves_the_queue_and_an_unclaimed_reservation_ends_with_its_grace() {
    let (_server, mut conn, keys) = setup().await;
    held_by_ca_with_cb_and_cc_queued(&mut conn, &keys).await;
    // Reserved for cb, which never comes (crashed): after the grace anyone may take it.
    let grace = Duration::from_millis(20);
    fair_release(&mut conn, &keys, "ca:1", "ca:2", grace, None).await;
    let mut tries = 0;
    let won = loop {
        tries += 1;
        assert!(tries < 10_000, "the unclaimed reservation never ended");
        match fair_acquire(&mut conn, &keys, "cc:1", waiter("cc")).await {
            AcquireReply::Held { .. } => tokio::time::sleep(Duration::from_millis(5)).await,
            won => break won,
        }
    };
    token_of(won);
    // cc won without a reservation: its own entry left with it; cb's was consumed by the
    // reservation it never claimed.
    assert!(queue(&mut conn, &keys).await.is_empty());
    let left: bool = conn.exists(keys.queue()).await.unwrap();
    assert!(!left);
}

#[tokio::test]
async fn a_release_with_more_local_waiters_queues_its_client_again_behind_the_others() {
    let (_server, mut conn, keys) = setup().await;
    held_by_ca_with_cb_and_cc_queued(&mut conn, &keys).await;
    let requeue = Some(("ca", Duration::from_secs(10)));
    let released = fair_release(&mut conn, &keys, "ca:1", "ca:2", GRACE, requeue).await;
    assert_eq!(released, OwnerReply::Done { remaining: 0 });
    assert_eq!(queue(&mut conn, &keys).await, ["cc", "ca"]);
    // Its replay changes nothing, also not the queue.
    let again = fair_release(&mut conn, &keys, "ca:1", "ca:2", GRACE, requeue).await;
    assert_eq!(again, released);
    assert_eq!(queue(&mut conn, &keys).await, ["cc", "ca"]);
    let ttl: i64 = conn.pttl(keys.queue()).await.unwrap();
    assert!(ttl > 0, "{ttl}");
}

#[tokio::test]
async fn a_client_that_leaves_passes_its_reservation_on_and_leaves_others_alone() {
    let (_server, mut conn, keys) = setup().await;
    let leaver = conn.clone();
    let leave = |client: &'static str| {
        let (keys, mut conn) = (keys.clone(), leaver.clone());
        async move {
            leave_fair(&mut conn, &keys, client, GRACE, PubSub::Classic)
                .await
                .unwrap()
        }
    };
    token_of(fair_acquire(&mut conn, &keys, "ca:1", waiter("ca")).await);
    for client in ["cb", "cc", "cd"] {
        fair_acquire(&mut conn, &keys, &format!("{client}:1"), waiter(client)).await;
    }
    // A held lock is never touched; only the entry goes.
    assert_eq!(leave("cd").await, LeaveReply::Dequeued);
    assert_eq!(leave("cd").await, LeaveReply::Absent);
    assert_eq!(count(&mut conn, &keys, "ca:1").await, Some(1));
    fair_release(&mut conn, &keys, "ca:1", "ca:2", GRACE, None).await;
    // Reserved for cb; cc leaving does not touch cb's reservation.
    assert_eq!(leave("cc").await, LeaveReply::Dequeued);
    let reservation = vec![("~reserved".to_owned(), "cb".to_owned())];
    assert_eq!(reserved(&mut conn, &keys).await, reservation);
    // cb leaves: nobody is queued any more, so the lock is free at once.
    assert_eq!(leave("cb").await, LeaveReply::PassedOn);
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!exists);

    // With someone queued behind, the reservation passes to them.
    token_of(fair_acquire(&mut conn, &keys, "ca:3", waiter("ca")).await);
    fair_acquire(&mut conn, &keys, "cb:2", waiter("cb")).await;
    fair_acquire(&mut conn, &keys, "cc:2", waiter("cc")).await;
    fair_release(&mut conn, &keys, "ca:3", "ca:4", GRACE, None).await;
    assert_eq!(leave("cb").await, LeaveReply::PassedOn);
    let passed = vec![("~reserved".to_owned(), "cc".to_owned())];
    assert_eq!(reserved(&mut conn, &keys).await, passed);
    assert!(queue(&mut conn, &keys).await.is_empty());
    token_of(fair_acquire(&mut conn, &keys, "cc:2", waiter("cc")).await);

    // Foreign data: refused, nothing changed.
    let _: () = conn.set(keys.queue(), "foreign").await.unwrap();
    let err = leave_fair(&mut conn, &keys, "cc", GRACE, PubSub::Classic)
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    assert_eq!(count(&mut conn, &keys, "cc:2").await, Some(1));
}

#[tokio::test]
async fn a_release_that_reserves_for_its_own_client_does_not_queue_it_twice() {
    let (_server, mut conn, keys) = setup().await;
    token_of(fair_acquire(&mut conn, &keys, "ca:1", waiter("ca")).await);
    // Another waiter of the same client queues the client behind its own holder.
    fair_acquire(&mut conn, &keys, "ca:2", waiter("ca")).await;
    assert_eq!(queue(&mut conn, &keys).await, ["ca"]);
    let requeue = Some(("ca", Duration::from_secs(10)));
    let released = fair_release(&mut conn, &keys, "ca:1", "ca:3", GRACE, requeue).await;
    assert_eq!(released, OwnerReply::Done { remaining: 0 });
    let reservation = vec![("~reserved".to_owned(), "ca".to_owned())];
    assert_eq!(reserved(&mut conn, &keys).await, reservation);
    assert!(queue(&mut conn, &keys).await.is_empty());
    // The waiter claims; its release, with nobody left, frees the lock for good: no stale
    // entry of the client is left to be reserved for later.
    token_of(fair_acquire(&mut conn, &keys, "ca:2", waiter("ca")).await);
    fair_release(&mut conn, &keys, "ca:2", "ca:4", GRACE, None).await;
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(
        !exists,
        "the lock was reserved for a client nobody waits in"
    );
}

#[tokio::test]
async fn force_release_frees_a_reservation_and_reports_it() {
    let (_server, mut conn, keys) = setup().await;
    let first = token_of(fair_acquire(&mut conn, &keys, "ca:1", waiter("ca")).await);
    fair_acquire(&mut conn, &keys, "cb:1", waiter("cb")).await;
    fair_release(&mut conn, &keys, "ca:1", "ca:2", GRACE, None).await;
    let reply = force_release(&mut conn, &keys, None, PubSub::Classic)
        .await
        .unwrap();
    assert_eq!(
        reply,
        ForceReleaseReply::Evicted {
            token: None,
            fence: first.get(),
            holder: b"~reserved:cb".to_vec(),
            count: 0,
        }
    );
    let second = token_of(fair_acquire(&mut conn, &keys, "cc:1", waiter("cc")).await);
    assert!(second > first);
}

#[tokio::test]
async fn a_foreign_queue_key_is_refused_before_anything_is_written() {
    let (_server, mut conn, keys) = setup().await;
    let _: () = conn.set(keys.queue(), "foreign").await.unwrap();
    // Free lock: the winner's ZREM would fail; nothing is taken.
    let err = fair_refused(&mut conn, &keys, "ca").await;
    assert!(err.is_wrong_type(), "{err}");
    for key in [keys.lock.clone(), keys.fence.clone(), keys.op("ca:1")] {
        let exists: bool = conn.exists(&key).await.unwrap();
        assert!(!exists, "{} written", String::from_utf8_lossy(&key));
    }
    // Held lock: the waiter's ZADD fails; the release that frees it refuses too.
    let _: () = conn.del(keys.queue()).await.unwrap();
    token_of(fair_acquire(&mut conn, &keys, "ca:1", waiter("ca")).await);
    let _: () = conn.set(keys.queue(), "foreign").await.unwrap();
    let err = fair_refused(&mut conn, &keys, "cb").await;
    assert!(err.is_wrong_type(), "{err}");
    let err = release_fair(
        &mut conn,
        &keys,
        "ca:1",
        "ca:2",
        OP_TTL,
        PubSub::Classic,
        GRACE,
        None,
    )
    .await
    .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    assert_eq!(count(&mut conn, &keys, "ca:1").await, Some(1));
    let value: String = conn.get(keys.queue()).await.unwrap();
    assert_eq!(value, "foreign");
}

/// The claim's contract: a lock reserved for a client is claimed by one of its waiters,
/// and from then on it is held. Another waiter of the same client (a second task, its
/// `try_acquire`) finds it held like everyone else, and so do a re-sent claim's neighbours:
/// the claim must not leave the reservation in the held hash. Called by the scripts
/// directly, so it judges the scripts whatever the machine's load.
async fn a_claimed_reservation_is_held_for_the_clients_other_waiters_too(
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    token_of(fair_acquire(conn, keys, "ca:1", waiter("ca")).await);
    fair_acquire(conn, keys, "cb:1", waiter("cb")).await;
    fair_release(conn, keys, "ca:1", "ca:2", GRACE, None).await;
    let claimed = token_of(fair_acquire(conn, keys, "cb:1", waiter("cb")).await);
    for (holder, attempt) in [("cb:2", waiter("cb")), ("cb:3", trying("cb"))] {
        match fair_acquire(conn, keys, holder, attempt).await {
            AcquireReply::Held { .. } => {}
            other => {
                return Err(format!(
                    "{holder} of the reserved client got {other:?} while cb:1 held the \
                     lock it claimed with {claimed:?}"
                ))
            }
        }
    }
    if count(conn, keys, "cb:1").await != Some(1) {
        return Err("the claim's holder lost the lock to its own client".into());
    }
    Ok(())
}

contract_checks! {
    /// The fair-handoff control breaks the contract check above, on a fresh server,
    /// whatever the timing: the scripts are called directly.
    the_fair_handoff_contract_checks_hold, the_fair_handoff_negative_control_is_caught, lock_keys;
    a_claimed_reservation_is_held_for_the_clients_other_waiters_too =>
        [Control::ClaimKeepsReservation],
}
