//! Negative controls for the ledger checker: a checker that cannot fail proves nothing, so
//! each rule is shown to catch the history it exists for.

use std::time::{Duration, Instant};

use crate::common::ledger::{check, Attempt, Entry, Outcome, Write};

fn entry(token: u64, id: u64, amount: i64, balance_after: i64) -> Entry {
    Entry {
        token,
        id,
        amount,
        balance_after,
    }
}

fn attempt(who: &str, token: u64, write: Write, outcome: Outcome) -> Attempt {
    Attempt {
        who: who.into(),
        token,
        write,
        outcome,
        issued: None,
        done: None,
    }
}

fn write(id: u64, amount: i64) -> Write {
    Write::Entry { id, amount }
}

/// A correct history: A claims and writes, B takes over, A's late write is refused.
fn good() -> (Vec<Attempt>, Vec<Entry>, i64) {
    let attempts = vec![
        attempt("A", 10, Write::Claim, Outcome::Accepted),
        attempt("A", 10, write(1, 100), Outcome::Accepted),
        attempt("B", 20, Write::Claim, Outcome::Accepted),
        attempt("B", 20, write(2, -30), Outcome::Accepted),
        attempt("A", 10, write(3, -100), Outcome::Stale { latest: 20 }),
    ];
    let entries = vec![entry(10, 1, 100, 100), entry(20, 2, -30, 70)];
    (attempts, entries, 70)
}

#[test]
fn checker_accepts_a_fenced_history() {
    let (attempts, entries, balance) = good();
    let summary = check(&attempts, &entries, balance).unwrap();
    assert_eq!(
        (summary.entries, summary.accepted, summary.rejected),
        (2, 4, 1)
    );
}

#[test]
fn checker_catches_every_kind_of_broken_history() {
    let expect = |attempts: &[Attempt], entries: &[Entry], balance: i64, needle: &str| {
        let err = check(attempts, entries, balance).unwrap_err();
        assert!(err.contains(needle), "expected {needle:?} in: {err}");
    };
    let (attempts, entries, _) = good();

    // The stale write got through after B's entry: the token goes back in storage order.
    let mut late = entries.clone();
    late.push(entry(10, 3, -100, -30));
    let mut accepted = attempts.clone();
    accepted[4].outcome = Outcome::Accepted;
    expect(&accepted, &late, -30, "token went back");

    // The stale write overwrote B's entry (same slot, built on the old snapshot).
    let overwritten = vec![entry(10, 1, 100, 100), entry(10, 3, -100, 0)];
    expect(&accepted, &overwritten, 0, "lost update");

    // Refused, yet stored.
    let stored = vec![entry(10, 1, 100, 100), entry(20, 2, -30, 70)];
    let mut refused = attempts.clone();
    refused[1].outcome = Outcome::Stale { latest: 20 };
    expect(&refused, &stored, 70, "STALE WRITE ACCEPTED");

    // The balance does not follow from the entries.
    expect(&attempts, &entries, 71, "serial replay");
    let wrong_step = vec![entry(10, 1, 100, 100), entry(20, 2, -30, 60)];
    expect(&attempts, &wrong_step, 60, "serial replay");

    // An entry nobody wrote, and an entry stored twice.
    let mut phantom = entries.clone();
    phantom.push(entry(20, 99, 5, 75));
    expect(&attempts, &phantom, 75, "nobody wrote it");
    let twice = vec![entry(10, 1, 100, 100), entry(10, 1, 100, 200)];
    expect(&attempts[..2], &twice, 200, "stored twice");

    // A refusal must name a newer token that some write carried.
    let mut bogus = attempts;
    bogus[4].outcome = Outcome::Stale { latest: 5 };
    expect(&bogus, &entries, 70, "not newer");
    bogus[4].outcome = Outcome::Stale { latest: 15 };
    expect(&bogus, &entries, 70, "no accepted write carried");

    // Real-time order: A's write was issued after B's claim was acknowledged, with an older
    // token, and accepted, even though storage order alone looks fine (A's entry first).
    let t0 = Instant::now();
    let at = |ms: u64| Some(t0 + Duration::from_millis(ms));
    let timed = vec![
        Attempt {
            issued: at(0),
            done: at(1),
            ..attempt("B", 20, Write::Claim, Outcome::Accepted)
        },
        Attempt {
            issued: at(2),
            done: at(3),
            ..attempt("A", 10, write(1, 100), Outcome::Accepted)
        },
    ];
    expect(
        &timed,
        &[entry(10, 1, 100, 100)],
        100,
        "STALE WRITE ACCEPTED",
    );
    // The same write with an unknown outcome must not be in the ledger either.
    let mut unknown = timed;
    unknown[1].outcome = Outcome::Unknown;
    expect(
        &unknown,
        &[entry(10, 1, 100, 100)],
        100,
        "STALE WRITE ACCEPTED",
    );
    assert_eq!(check(&unknown, &[], 0).unwrap().stale_after_newer, 1);
}
