//! The election scripts' contracts (`announce.lua`, `leader.lua`) against a real redis-server,
//! and the lock scripts on a hash that carries a leader's `~leader` and `~meta` fields: every one of them must
//! treat it as the plain lock it is.

use redis::AsyncCommands;

use fencelock_testing::RedisServer;

use super::contract_tests::{
    contract_checks, election_keys, setup_for, undo, Checked, Conn, LEASE, OP_TTL,
};
use super::*;

/// A server of its own with the election held by `leader` that recorded `meta`.
async fn led_by(leader: &str, meta: &[u8]) -> (RedisServer, Conn, LockKeys, FencingToken) {
    let (server, mut conn, keys) = setup_for(election_keys()).await;
    let AcquireReply::Acquired { token, .. } = acquire(&mut conn, &keys, leader, LEASE, OP_TTL)
        .await
        .unwrap()
    else {
        panic!("free election not won")
    };
    let announced = announce(&mut conn, &keys, leader, token, meta, PubSub::Classic).await;
    assert_eq!(announced.unwrap(), OwnerReply::Done { remaining: 0 });
    (server, conn, keys, token)
}

async fn publishes(conn: &mut Conn) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_publish:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn announce_records_metadata_for_the_holder_of_that_term_only() {
    let (_server, mut conn, keys, term) = led_by("h", b"10.0.0.7:8080").await;
    let meta: Vec<u8> = conn.hget(&keys.lock, "~meta").await.unwrap();
    assert_eq!(meta, b"10.0.0.7:8080");

    let before = publishes(&mut conn).await;
    // A replay writes the same bytes and publishes again.
    let again = announce(
        &mut conn,
        &keys,
        "h",
        term,
        b"10.0.0.7:8080",
        PubSub::Classic,
    )
    .await;
    assert_eq!(again.unwrap(), OwnerReply::Done { remaining: 0 });
    assert_eq!(publishes(&mut conn).await, before + 1);

    // Another holder, or the holder with another term: refused, nothing written or published.
    let other_term = FencingToken::new(term.get() + 1).unwrap();
    for (holder, term) in [("other", term), ("h", other_term)] {
        let reply = announce(&mut conn, &keys, holder, term, b"x", PubSub::Classic).await;
        assert_eq!(reply.unwrap(), OwnerReply::NotHeld, "{holder} {term}");
    }
    let meta: Vec<u8> = conn.hget(&keys.lock, "~meta").await.unwrap();
    assert_eq!(meta, b"10.0.0.7:8080");
    assert_eq!(publishes(&mut conn).await, before + 1);

    // After the release the field is gone with the hash, and a late announce cannot bring
    // it back.
    let released = release(&mut conn, &keys, "h", "r", OP_TTL, PubSub::Classic, false).await;
    assert_eq!(released.unwrap(), OwnerReply::Done { remaining: 0 });
    let late = announce(&mut conn, &keys, "h", term, b"late", PubSub::Classic).await;
    assert_eq!(late.unwrap(), OwnerReply::NotHeld);
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!exists, "a late announce recreated the hash");
}

#[tokio::test]
async fn leader_reads_nobody_a_winner_not_yet_announced_and_the_leader() {
    let (_server, mut conn, keys) = setup_for(election_keys()).await;
    let free = leader(&mut conn, &keys).await.unwrap();
    assert_eq!(
        free,
        LeaderReply {
            leader: None,
            lease_left: None
        }
    );

    let AcquireReply::Acquired { token, .. } =
        acquire(&mut conn, &keys, "h", LEASE, OP_TTL).await.unwrap()
    else {
        panic!("free election not won")
    };
    let won = leader(&mut conn, &keys).await.unwrap();
    assert_eq!(
        won.leader, None,
        "a winner leads once its metadata is recorded"
    );
    assert!(matches!(won.lease_left, Some(Some(left)) if left <= LEASE));

    // Empty metadata is metadata too.
    announce(&mut conn, &keys, "h", token, b"", PubSub::Classic)
        .await
        .unwrap();
    let led = leader(&mut conn, &keys).await.unwrap();
    assert_eq!(
        led.leader,
        Some(LeaderRecord {
            holder: "h".into(),
            term: token,
            metadata: Vec::new(),
        })
    );
    assert!(matches!(led.lease_left, Some(Some(left)) if left <= LEASE));

    // "~leader" must name a holder of the hash, or nobody leads.
    let _: () = conn.hset(&keys.lock, "~leader", "ghost").await.unwrap();
    assert_eq!(leader(&mut conn, &keys).await.unwrap().leader, None);
    // A fair-handoff reservation: held by nobody, so led by nobody.
    let _: () = conn.del(&keys.lock).await.unwrap();
    let _: () = conn.hset(&keys.lock, "~reserved", "client").await.unwrap();
    let _: () = conn.pexpire(&keys.lock, 5000).await.unwrap();
    let reserved = leader(&mut conn, &keys).await.unwrap();
    assert_eq!(reserved.leader, None);
    assert!(matches!(reserved.lease_left, Some(Some(_))));

    let _: () = conn.set(&keys.lock, "foreign").await.unwrap();
    let err = leader(&mut conn, &keys).await.unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let err = announce(&mut conn, &keys, "h", token, b"x", PubSub::Classic)
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let value: String = conn.get(&keys.lock).await.unwrap();
    assert_eq!(value, "foreign");
}

#[tokio::test]
async fn the_lock_scripts_treat_a_leaders_hash_as_a_plain_lock() {
    let (_server, mut conn, keys, term) = led_by("h", b"meta").await;
    // Another candidate finds it held; the leader's replay finds its own token.
    assert!(matches!(
        acquire(&mut conn, &keys, "h2", LEASE, OP_TTL)
            .await
            .unwrap(),
        AcquireReply::Held { pttl: Some(_) }
    ));
    assert!(matches!(
        acquire(&mut conn, &keys, "h", LEASE, OP_TTL).await.unwrap(),
        AcquireReply::Acquired {
            token,
            count: 1,
            lease_left: Some(left),
        } if token == term && left <= LEASE
    ));
    // Owner-checked scripts: the holder's work, a non-holder's is refused.
    assert_eq!(
        reenter(&mut conn, &keys, "h", "e", OP_TTL).await.unwrap(),
        EnterReply::Entered {
            token: term,
            count: 2
        }
    );
    assert_eq!(
        extend(&mut conn, &keys, "h2", LEASE).await.unwrap(),
        OwnerReply::NotHeld
    );
    assert_eq!(
        extend(&mut conn, &keys, "h", LEASE).await.unwrap(),
        OwnerReply::Done { remaining: 0 }
    );
    assert_eq!(
        renew(&mut conn, &[(&keys, "h"), (&keys, "h2")], LEASE)
            .await
            .unwrap(),
        vec![true, false]
    );
    let undone = undo(&mut conn, &keys, "h", "e", CancelKind::Reenter).await;
    assert_eq!(undone.unwrap(), CancelReply::Undone { remaining: 1 });
    // A forced release names the holder, not the metadata field, however the hash orders
    // its fields.
    assert_eq!(
        force_release(&mut conn, &keys, Some(term), PubSub::Classic)
            .await
            .unwrap(),
        ForceReleaseReply::Evicted {
            token: Some(term),
            fence: term.get(),
            holder: b"h".to_vec(),
            count: 1,
        }
    );
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!exists, "the metadata outlived the forced release");

    // The release of a leader takes the metadata with the hash.
    let (_server, mut conn, keys, _) = led_by("h", b"meta").await;
    let released = release(&mut conn, &keys, "h", "r", OP_TTL, PubSub::Classic, false).await;
    assert_eq!(released.unwrap(), OwnerReply::Done { remaining: 0 });
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!exists, "the metadata outlived the release");
}

/// The term `holder` wins a free election with (its acquisition, not yet announced).
async fn won(conn: &mut Conn, keys: &LockKeys, holder: &str) -> Result<FencingToken, String> {
    match acquire(conn, keys, holder, LEASE, OP_TTL).await.unwrap() {
        AcquireReply::Acquired { token, .. } => Ok(token),
        other => Err(format!("{holder} did not win a free election: {other:?}")),
    }
}

/// A deposed leader's late announcement (a re-send, or a copy delayed past its lease) changes
/// nothing: the new leader is read with its own metadata.
async fn a_late_announcement_leaves_the_new_leader_alone(
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    let old = won(conn, keys, "old").await?;
    announce(conn, keys, "old", old, b"old", PubSub::Classic)
        .await
        .unwrap();
    let _: () = conn.del(&keys.lock).await.unwrap();
    let new = won(conn, keys, "new").await?;
    announce(conn, keys, "new", new, b"new", PubSub::Classic)
        .await
        .unwrap();
    let late = announce(conn, keys, "old", old, b"late", PubSub::Classic).await;
    let read = leader(conn, keys).await.unwrap().leader;
    let expected = LeaderRecord {
        holder: "new".into(),
        term: new,
        metadata: b"new".to_vec(),
    };
    match (late, read) {
        (Ok(OwnerReply::NotHeld), Some(read)) if read == expected => Ok(()),
        (late, read) => Err(format!(
            "the late announcement answered {late:?} and the leader reads as {read:?}"
        )),
    }
}

/// An announcement publishes `elected` once, so followers read the new leader at once.
async fn an_announcement_tells_the_followers(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let token = won(conn, keys, "h").await?;
    let before = publishes(conn).await;
    announce(conn, keys, "h", token, b"h", PubSub::Classic)
        .await
        .unwrap();
    match publishes(conn).await - before {
        1 => Ok(()),
        n => Err(format!("the announcement published {n} messages, not one")),
    }
}

/// A `~leader` that names no holder of the hash (not the one who holds the lock) reads as
/// nobody leading, never as that id with the holder's term.
async fn a_record_naming_no_holder_is_nobody(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let token = won(conn, keys, "h").await?;
    announce(conn, keys, "h", token, b"h", PubSub::Classic)
        .await
        .unwrap();
    let _: () = conn.hset(&keys.lock, "~leader", "ghost").await.unwrap();
    match leader(conn, keys).await.unwrap().leader {
        None => Ok(()),
        Some(read) => Err(format!("a record naming no holder reads as {read:?}")),
    }
}

contract_checks! {
    /// Each election control breaks exactly the contract check that names it (which holds on
    /// the production scripts: [`the_election_contract_checks_hold`]), each on a fresh server.
    the_election_contract_checks_hold, the_election_scripts_negative_controls_are_caught, election_keys;
    a_late_announcement_leaves_the_new_leader_alone => [Control::AnnounceWithoutOwnerCheck],
    an_announcement_tells_the_followers => [Control::AnnounceDoesNotPublish],
    a_record_naming_no_holder_is_nobody => [Control::LeaderTrustsRecord],
}
