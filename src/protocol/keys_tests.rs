//! The key layout's own checks: slot tags, one slot per lock, no two kinds' keys meeting.

use super::*;

#[test]
fn crc16_matches_the_redis_cluster_spec_vector() {
    // The reference value from the Redis Cluster specification.
    assert_eq!(crc16(b"123456789"), 0x31C3);
}

#[test]
fn every_slot_has_a_tag_that_maps_to_it() {
    for slot in 0..SLOTS {
        let tag = slot_tag(slot);
        assert!(tag.len() <= 3 && !tag.contains('}'));
        assert_eq!(usize::from(crc16(tag.as_bytes())) % SLOTS, slot);
    }
}

#[test]
fn a_locks_keys_share_one_slot_and_stay_under_the_prefix() {
    for name in [
        &b"a"[..],
        b"{x}",
        b"}{",
        b"\xff\x00",
        "caf\u{e9}".as_bytes(),
    ] {
        let keys = LockKeys::new(b"app:", name);
        let slot = redis_key_slot(&keys.lock);
        assert_eq!(usize::from(keys.slot), slot);
        assert_eq!(redis_key_slot(&keys.fence), slot);
        assert_eq!(redis_key_slot(&keys.op("c1-1")), slot);
        assert_eq!(redis_key_slot(&keys.queue()), slot);
        assert!(keys.queue().starts_with(b"app:{"));
        assert!(keys.queue().ends_with(name));
        assert_ne!(keys.queue(), keys.lock);
        assert!(keys.lock.starts_with(b"app:{"));
        assert!(keys.lock.ends_with(name));
    }
}

#[test]
fn an_elections_keys_share_its_slot_and_never_meet_a_locks() {
    for name in [&b"a"[..], b"{x}", b"}{", b"lock:a", b"\xff\x00"] {
        let election = LockKeys::election(b"app:", name);
        let lock = LockKeys::new(b"app:", name);
        let slot = redis_key_slot(&election.lock);
        assert_eq!(usize::from(election.slot), slot);
        assert_eq!(redis_key_slot(&election.queue()), slot);
        assert!(election.lock.ends_with(name) && election.queue().ends_with(name));
        assert_eq!(election.fence, lock.fence, "one counter per slot bucket");
        for other in [&lock.lock, &lock.queue()] {
            assert_ne!(&election.lock, other);
            assert_ne!(&election.queue(), other);
        }
    }
    // No user lock name reaches an election's hash: after the tag, a lock key starts with
    // `lock:` and an election's with `leader:`.
    let election = LockKeys::election(b"p:", b"x");
    let tagged = election.lock.iter().position(|b| *b == b'}').unwrap() + 1;
    assert!(election.lock[tagged..].starts_with(b"leader:"));
    assert_ne!(election.lock, LockKeys::new(b"p:", b"leader:x").lock);
}

#[test]
fn a_jobs_keys_share_its_slot_and_never_meet_a_locks_or_an_elections() {
    for name in [&b"a"[..], b"{x}", b"}{", b"lock:a", b"\xff\x00"] {
        let job = LockKeys::job(b"app:", name);
        let (lock, election) = (
            LockKeys::new(b"app:", name),
            LockKeys::election(b"app:", name),
        );
        let slot = redis_key_slot(&job.lock);
        assert_eq!(usize::from(job.slot), slot);
        assert_eq!(redis_key_slot(&job.job_record()), slot);
        assert!(job.lock.ends_with(name) && job.job_record().ends_with(name));
        assert_eq!(job.fence, lock.fence, "one counter per slot bucket");
        let others = [lock.queue(), lock.lock, election.queue(), election.lock];
        for key in [&job.lock, &job.job_record(), &job.queue()] {
            assert!(!others.contains(key));
        }
        assert_ne!(job.lock, job.job_record());
    }
    let job = LockKeys::job(b"p:", b"x");
    let tagged = job.lock.iter().position(|b| *b == b'}').unwrap() + 1;
    assert!(job.lock[tagged..].starts_with(b"job:"));
    assert!(job.job_record()[tagged..].starts_with(b"job-tick:"));
}

#[test]
fn an_idempotency_keys_keys_share_its_slot_and_never_meet_another_kinds() {
    for name in [
        &b"pay:a"[..],
        b"pay:{x}",
        b"pay:}{",
        b"pay:lock:a",
        b"p:\xff\x00",
    ] {
        let idem = LockKeys::idempotency(b"app:", name);
        let slot = redis_key_slot(&idem.lock);
        assert_eq!(usize::from(idem.slot), slot);
        assert_eq!(redis_key_slot(&idem.idem_record()), slot);
        assert_eq!(idem.fence, LockKeys::new(b"app:", name).fence);
        let job = LockKeys::job(b"app:", name);
        let others = [
            LockKeys::new(b"app:", name).lock,
            LockKeys::election(b"app:", name).lock,
            job.job_record(),
            job.lock,
        ];
        for key in [&idem.lock, &idem.idem_record(), &idem.queue()] {
            assert!(!others.contains(key));
        }
    }
    let idem = LockKeys::idempotency(b"p:", b"x");
    let tagged = idem.lock.iter().position(|b| *b == b'}').unwrap() + 1;
    assert!(idem.lock[tagged..].starts_with(b"idem:"));
    assert!(idem.idem_record()[tagged..].starts_with(b"idem-rec:"));
}

#[test]
fn names_that_look_alike_get_distinct_keys() {
    let a = LockKeys::new(b"p:", b"a}lock:b");
    let b = LockKeys::new(b"p:", b"a");
    assert_ne!(a.lock, b.lock);
    assert_ne!(
        LockKeys::new(b"p:", b"x").lock,
        LockKeys::new(b"p:x", b"").lock
    );
}

#[test]
fn bad_names_and_prefixes_are_rejected() {
    assert!(validate_name(b"").is_err());
    assert!(validate_name(&vec![b'a'; MAX_NAME_LEN + 1]).is_err());
    assert!(validate_name(&vec![b'a'; MAX_NAME_LEN]).is_ok());
    assert!(validate_prefix(b"a{b").is_err());
    assert!(validate_prefix(b"ok:").is_ok());
}
