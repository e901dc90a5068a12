//! When an acquisition's send leaves an op record (`acquire.lua` ARGV[4], `acquire_fair.lua`
//! ARGV[7], `sem_acquire.lua` ARGV[9], `rw_acquire.lua` ARGV[8]) against a real redis-server: a
//! first send records nothing, a re-send records what it did, and a copy of an earlier send
//! that arrives after the hold ended finds that record and does nothing, for every kind of
//! hold.

use redis::AsyncCommands;

use super::contract_tests::{
    contract_checks, hold_field_expiry, lock_keys, released_by, rw_keys, sem_keys, sem_take, setup,
    undo, Checked, Conn, LEASE, OP_TTL,
};
use super::rwlock::{RwAcquireReply, RwMode};
use super::semaphore::SemAcquireReply;
use super::*;
use crate::protocol::semaphore::HoldAcquire;

/// A fair-mode waiter's attempt.
fn fair_waiter() -> FairAttempt<'static> {
    FairAttempt {
        client: "c",
        enqueue: true,
        queue_slack: Duration::from_secs(1),
    }
}

async fn record(conn: &mut Conn, keys: &LockKeys, holder: &str) -> Option<String> {
    conn.get(keys.op(holder)).await.unwrap()
}

/// The uncontended acquisition's one send writes the hold and nothing else; a re-send that
/// finds its own hold (the first send ran, its reply was lost) answers with the same token and
/// records the acquisition, so that a copy still on its way finds it after the hold ends.
#[tokio::test]
async fn a_first_send_records_nothing_and_a_re_send_records_its_acquisition() {
    let (_server, mut conn, keys) = setup().await;
    for fair in [None, Some(fair_waiter())] {
        let holder = if fair.is_some() { "c:1" } else { "h" };
        let first = acquire_attempt(&mut conn, &keys, holder, LEASE, OP_TTL, fair, None, false)
            .await
            .unwrap();
        let AcquireReply::Acquired {
            token,
            count: 1,
            lease_left: None,
        } = first
        else {
            panic!("{first:?}");
        };
        assert_eq!(record(&mut conn, &keys, holder).await, None, "{fair:?}");
        let again = acquire_attempt(&mut conn, &keys, holder, LEASE, OP_TTL, fair, None, true)
            .await
            .unwrap();
        assert!(
            matches!(again, AcquireReply::Acquired { token: t, count: 1, lease_left: Some(left) }
                if t == token && left <= LEASE),
            "{again:?}"
        );
        assert_eq!(
            record(&mut conn, &keys, holder).await.as_deref(),
            Some("a"),
            "{fair:?}"
        );
        let ttl: i64 = conn.pttl(keys.op(holder)).await.unwrap();
        assert!(ttl > 0 && ttl <= 10_000, "the record expires: {ttl}");
        released_by(&mut conn, &keys, holder, "rel").await;
        assert_eq!(
            record(&mut conn, &keys, holder).await.as_deref(),
            Some("r:rel"),
            "the freeing release marks the record"
        );
    }
}

/// A lease that has passed by the time the late copy arrives (after [`PAST`]).
const SHORT: Duration = Duration::from_millis(20);
const PAST: Duration = Duration::from_millis(60);

/// A lock's re-send that acquires records it: the first send, arriving after that hold
/// expired, is a late copy and does nothing (`fair`: through `acquire_fair.lua`).
async fn late_lock_copy(
    conn: &mut Conn,
    keys: &LockKeys,
    fair: Option<FairAttempt<'_>>,
) -> Checked {
    let holder = if fair.is_some() { "c:1" } else { "h" };
    let resent = acquire_attempt(conn, keys, holder, SHORT, OP_TTL, fair, None, true)
        .await
        .map_err(|e| e.to_string())?;
    if !matches!(resent, AcquireReply::Acquired { count: 1, .. }) {
        return Err(format!("the re-send answered {resent:?}"));
    }
    tokio::time::sleep(PAST).await;
    let late = acquire_attempt(conn, keys, holder, LEASE, OP_TTL, fair, None, false)
        .await
        .map_err(|e| e.to_string())?;
    let held: bool = conn.exists(&keys.lock).await.map_err(|e| e.to_string())?;
    if late != AcquireReply::Cancelled || held {
        return Err(format!(
            "the late first send answered {late:?}; lock held after it: {held}"
        ));
    }
    Ok(())
}

async fn a_late_first_send_of_a_lock_finds_the_record_of_its_re_send(
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    late_lock_copy(conn, keys, None).await
}

async fn a_late_first_send_of_a_fair_lock_finds_the_record_of_its_re_send(
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    late_lock_copy(conn, keys, Some(fair_waiter())).await
}

/// What a send of an acquisition answered, as far as a late copy's check tells replies apart.
#[derive(Debug, PartialEq)]
enum Sent {
    Acquired,
    Cancelled,
    Other(String),
}

/// The holds whose acquisition records a re-send: a lock (`acquire.lua`), a semaphore's
/// permit (`sem_acquire.lua`) and a read-write lock's write (`rw_acquire.lua`), each on its own
/// keys.
#[derive(Clone, Copy)]
enum Hold {
    Lock,
    Permit,
    Write,
}

impl Hold {
    /// The keys the hold's acquisition takes, and its holder id.
    fn keys_and_holder(self) -> (LockKeys, &'static str) {
        match self {
            Hold::Lock => (lock_keys(), "late"),
            Hold::Permit => (sem_keys(), "s"),
            Hold::Write => (rw_keys(), "w"),
        }
    }

    /// A send of the acquisition with `lease`; `recorded`: it is a re-send.
    async fn send(self, conn: &mut Conn, lease: Duration, recorded: bool) -> Result<Sent, String> {
        let expiry = hold_field_expiry();
        let (pubsub, fair) = (PubSub::Classic, None);
        let sent = match self {
            Hold::Lock => {
                let (keys, holder) = self.keys_and_holder();
                let reply =
                    acquire_attempt(conn, &keys, holder, lease, OP_TTL, None, None, recorded).await;
                match reply {
                    Ok(AcquireReply::Acquired { .. }) => Ok(Sent::Acquired),
                    Ok(AcquireReply::Cancelled) => Ok(Sent::Cancelled),
                    other => other.map(|reply| Sent::Other(format!("{reply:?}"))),
                }
            }
            Hold::Permit => {
                let (keys, holder) = self.keys_and_holder();
                let reply = sem_take(conn, &keys, holder, (1, 3), lease, fair, recorded).await;
                match reply {
                    Ok(SemAcquireReply::Acquired { .. }) => Ok(Sent::Acquired),
                    Ok(SemAcquireReply::Cancelled) => Ok(Sent::Cancelled),
                    other => other.map(|reply| Sent::Other(format!("{reply:?}"))),
                }
            }
            Hold::Write => {
                let (keys, holder) = self.keys_and_holder();
                let (mode, wait) = (RwMode::Write, false);
                let reply =
                    HoldAcquire::of(&keys, holder, lease, OP_TTL, pubsub, expiry, None, recorded)
                        .rw_acquire(conn, mode, wait)
                        .await;
                match reply {
                    Ok(RwAcquireReply::Acquired { .. }) => Ok(Sent::Acquired),
                    Ok(RwAcquireReply::Cancelled) => Ok(Sent::Cancelled),
                    other => other.map(|reply| Sent::Other(format!("{reply:?}"))),
                }
            }
        };
        sent.map_err(|e| e.to_string())
    }
}

/// As for a lock, a semaphore's permits and a read-write lock's write hold: the re-send that
/// acquires records it, and the first send, arriving after that hold expired, is a late copy
/// and is cancelled.
async fn a_late_first_send_finds_the_record_of_its_re_send(
    hold: Hold,
    conn: &mut Conn,
    _keys: &LockKeys,
) -> Checked {
    let resent = hold.send(conn, SHORT, true).await?;
    if resent != Sent::Acquired {
        return Err(format!("the re-send answered {resent:?}"));
    }
    tokio::time::sleep(PAST).await;
    let late = hold.send(conn, LEASE, false).await?;
    if late != Sent::Cancelled {
        return Err(format!("the late first send answered {late:?}"));
    }
    Ok(())
}

/// An acquisition whose cancel arrived first (sent on another connection while the first send
/// was still on its way) finds the cancel's record and takes nothing, though the lock,
/// semaphore or read-write lock is free: each free path reads the op record whenever one
/// exists.
async fn a_first_send_arriving_after_its_cancel_takes_nothing(
    hold: Hold,
    conn: &mut Conn,
    _keys: &LockKeys,
) -> Checked {
    let (keys, holder) = hold.keys_and_holder();
    let cancel = undo(conn, &keys, holder, holder, CancelKind::Acquire).await;
    if cancel.as_ref().ok() != Some(&CancelReply::NotRun) {
        return Err(format!("the cancel answered {cancel:?}"));
    }
    let late = hold.send(conn, LEASE, false).await?;
    if late != Sent::Cancelled {
        return Err(format!("the first send after its cancel answered {late:?}"));
    }
    let taken: bool = conn.exists(&keys.lock).await.map_err(|e| e.to_string())?;
    if taken {
        return Err("it was taken for nobody".into());
    }
    Ok(())
}

/// A lock key that holds another type is refused, and kept as it was: the holder's read is the
/// type check, now that the free path looks at the key with `EXISTS` alone.
async fn a_foreign_value_at_the_lock_key_is_refused_and_kept(
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    let _: () = conn
        .rpush(&keys.lock, "foreign")
        .await
        .map_err(|e| e.to_string())?;
    let answer = acquire(conn, keys, "h", LEASE, OP_TTL).await;
    if !answer.as_ref().is_err_and(Error::is_wrong_type) {
        return Err(format!("the acquisition answered {answer:?}"));
    }
    let kept: Vec<String> = conn
        .lrange(&keys.lock, 0, -1)
        .await
        .map_err(|e| e.to_string())?;
    if kept != ["foreign"] {
        return Err(format!("the foreign list became {kept:?}"));
    }
    Ok(())
}

contract_checks! {
    /// Acquire scripts that record no re-send let the late first send take the hold again,
    /// for nobody, and a lock's acquire that skips its op record or its key's type takes a lock
    /// it must not: each is caught by the check of its script.
    the_acquire_record_contract_checks_hold,
    the_acquire_record_negative_control_is_caught,
    lock_keys;
    a_late_first_send_of_a_lock_finds_the_record_of_its_re_send => [Control::ResendLeavesNoRecord],
    a_first_send_arriving_after_its_cancel_takes_nothing(Hold::Lock) =>
        [Control::AcquireIgnoresOpRecord],
    a_foreign_value_at_the_lock_key_is_refused_and_kept =>
        [Control::AcquireOverwritesForeignData],
    a_late_first_send_of_a_fair_lock_finds_the_record_of_its_re_send =>
        [Control::FairResendLeavesNoRecord],
    a_late_first_send_finds_the_record_of_its_re_send(Hold::Permit) =>
        [Control::SemResendLeavesNoRecord],
    a_late_first_send_finds_the_record_of_its_re_send(Hold::Write) =>
        [Control::RwResendLeavesNoRecord],
    a_first_send_arriving_after_its_cancel_takes_nothing(Hold::Permit) =>
        [Control::SemAcquireIgnoresOpRecord],
    a_first_send_arriving_after_its_cancel_takes_nothing(Hold::Write) =>
        [Control::RwAcquireIgnoresOpRecord],
}
