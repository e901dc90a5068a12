//! Leadership election against real servers: terms, exclusion of leaders, handoff on
//! resignation, reads of the leader, followers, fencing of a deposed leader and bad input. The
//! topology tests run on one server and on a 3-primary cluster.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::cancel::CancelPoints;
use crate::common::child::ChildProcess;
use crate::common::deadline::{within, woken, Progress, HANDOFF};
use crate::common::{Env, Fixture};
use fencelock::{Error, LeaderGuard, LockClient, MAX_METADATA_LEN, MAX_NAME_LEN};
use fencelock_testing::{send_signal, Signal};
use redis::Commands;

/// The one key of election `name` under the default prefix, while it exists.
fn election_key(fx: &Env, name: &str) -> Vec<u8> {
    let mut found = fx.keys(&format!("fencelock:{{*}}leader:{name}"));
    assert_eq!(found.len(), 1, "keys of election {name}: {found:?}");
    found.pop().unwrap()
}

/// Subscribers of `channel` (classic and sharded) over every data node.
fn subscribers(fx: &Env, channel: &[u8]) -> u64 {
    fx.data_nodes()
        .into_iter()
        .map(|node| {
            let mut con = node.client().get_connection().expect("raw connection");
            let count = |kind: &str, con: &mut redis::Connection| -> u64 {
                let reply: (Vec<u8>, u64) = redis::cmd("PUBSUB")
                    .arg(kind)
                    .arg(channel)
                    .query(con)
                    .expect("PUBSUB");
                reply.1
            };
            // Servers without sharded pub/sub (Redis 6.2) have no SHARDNUMSUB either.
            let sharded = fencelock_testing::ServerBinary::current()
                .expect("the server binary under test")
                .lacks(fencelock_testing::Feature::ShardedPubSub)
                .is_none();
            count("NUMSUB", &mut con)
                + if sharded {
                    count("SHARDNUMSUB", &mut con)
                } else {
                    0
                }
        })
        .sum()
}

/// A leader that dies without resigning: its guard is never dropped, so nothing releases the
/// election's lock and no watchdog renews it (an election with a lease of its own); only the
/// lease ends it, as after a crash.
fn crash(leader: LeaderGuard) {
    std::mem::forget(leader);
}

on_topologies! {
    async fn terms_increase_across_resignation_expiry_and_a_deleted_fence_counter(fx) {
        let (a, b) = (fx.client().await, fx.client().await);
        let (ea, eb) = (a.election("term").unwrap(), b.election("term").unwrap());
        let mut terms = Vec::new();

        let first = ea.campaign(b"a").await.unwrap();
        terms.push(first.term());
        first.resign().await.unwrap();

        // A leader whose lease ran out behind it.
        let lease = Duration::from_millis(300);
        let second = eb.with_lease(lease).unwrap().campaign(b"b").await.unwrap();
        terms.push(second.term());
        crash(second);
        let third = woken(
            "a candidate after the crashed leader's lease ended",
            ea.campaign(b"a"),
        )
        .await
        .unwrap();
        terms.push(third.term());
        third.resign().await.unwrap();

        // Even deleting every fence counter cannot make terms go back.
        for counter in fx.keys("fencelock:{*}fence") {
            let _: () = fx.raw().del(counter).unwrap();
        }
        let fourth = eb.campaign(b"b").await.unwrap();
        terms.push(fourth.term());
        fourth.resign().await.unwrap();

        assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
    }
}

on_topologies_multi_thread! {
    async fn at_most_one_valid_leader_among_four_candidates_taking_turns(fx) {
        const CANDIDATES: usize = 4;
        const ROUNDS: usize = 3;
        let lease = Duration::from_millis(400);
        let terms_seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let progress = Progress::new();
        let mut tasks = Vec::new();
        for candidate in 0..CANDIDATES {
            let client = fx.client().await;
            let election = client.election("turns").unwrap().with_lease(lease).unwrap();
            let storage = client.resource("turns-state").unwrap();
            let (terms_seen, progress) = (terms_seen.clone(), progress.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let meta = format!("candidate-{candidate}");
                    let leader = election.campaign(meta.as_bytes()).await.unwrap();
                    let (start, term) = (Instant::now(), leader.term());
                    progress.tick();
                    // Every leader writes with its term: no earlier leader's term was newer.
                    storage.set(leader.term(), meta.as_bytes()).await.unwrap();
                    let end = match (candidate + round) % 3 {
                        0 => {
                            // Leads until it resigns.
                            let end = Instant::now();
                            leader.resign().await.unwrap();
                            end
                        }
                        1 => {
                            let end = leader.valid_until();
                            crash(leader);
                            end
                        }
                        _ => {
                            within(
                                lease + HANDOFF,
                                "a leader with a fixed lease learns it ended",
                                leader.lost(),
                            )
                            .await;
                            assert!(!leader.is_valid());
                            leader.valid_until()
                        }
                    };
                    terms_seen.lock().push((start, end.max(start), term));
                }
            }));
        }
        progress.join("4 candidates taking turns", tasks).await;

        let mut terms = terms_seen.lock().clone();
        assert_eq!(terms.len(), CANDIDATES * ROUNDS);
        terms.sort_by_key(|(start, _, _)| *start);
        for pair in terms.windows(2) {
            let ((_, end, _), (next_start, _, _)) = (pair[0], pair[1]);
            assert!(
                end <= next_start,
                "two leaders were valid at once: one until {end:?}, the next from {next_start:?}"
            );
        }
        let by_start: Vec<_> = terms.iter().map(|(_, _, term)| *term).collect();
        assert!(by_start.windows(2).all(|w| w[0] < w[1]), "{by_start:?}");
    }
}

on_topologies! {
    async fn resign_wakes_the_next_candidate_at_once(fx) {
        let (a, b) = (fx.client().await, fx.client().await);
        // The default lease: 30 s, renewed by the watchdog. Only the resignation's message
        // can wake the candidate within the handoff deadline.
        let leader = a.election("handoff").unwrap().campaign(b"a").await.unwrap();
        let candidate = b.election("handoff").unwrap();
        let waiting = tokio::spawn(async move { candidate.campaign(b"b").await });
        let channel = election_key(&fx, "handoff");
        assert!(
            crate::common::eventually(HANDOFF, || subscribers(&fx, &channel) == 1).await,
            "the candidate never subscribed to the election's channel"
        );
        let (first_term, resigned) = (leader.term(), Instant::now());
        leader.resign().await.unwrap();
        let next = woken("the candidate after the leader resigned", waiting)
            .await
            .unwrap()
            .unwrap();
        let handoff = resigned.elapsed();
        assert!(next.term() > first_term);
        assert!(handoff < HANDOFF, "{handoff:?}");
        eprintln!("resignation handed over in {handoff:?}");
        next.resign().await.unwrap();
    }
}

on_topologies! {
    async fn leader_shows_the_current_leader_and_try_campaign_yields_to_it(fx) {
        let (a, b) = (fx.client().await, fx.client().await);
        let (ea, eb) = (a.election("read").unwrap(), b.election("read").unwrap());
        assert_eq!(eb.leader().await.unwrap(), None, "nobody leads a fresh election");

        let leader = ea.campaign(b"10.0.0.7:8080").await.unwrap();
        let seen = eb.leader().await.unwrap().expect("a leads");
        assert_eq!(seen.id(), leader.id());
        assert!(seen.id().starts_with(a.id()));
        assert_eq!(seen.term(), leader.term());
        assert_eq!(seen.metadata(), b"10.0.0.7:8080");
        assert_eq!(leader.metadata(), b"10.0.0.7:8080");

        assert!(eb.try_campaign(b"b").await.unwrap().is_none());
        let err = eb
            .campaign_timeout(b"b", Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(err.is_timeout(), "{err}");
        assert_eq!(eb.leader().await.unwrap(), Some(seen), "yielding changed nothing");

        leader.resign().await.unwrap();
        assert_eq!(eb.leader().await.unwrap(), None, "nobody leads after a resignation");
        let next = eb.try_campaign(b"b").await.unwrap().expect("the election is free");
        assert_eq!(ea.leader().await.unwrap().unwrap().metadata(), b"b");
        next.resign().await.unwrap();
        assert!(fx.keys("fencelock:{*}leader:*").is_empty());
    }
}

on_topologies! {
    async fn observers_see_election_resignation_and_expiry_within_a_bound(fx) {
        let (a, b, follower) = (fx.client().await, fx.client().await, fx.client().await);
        let (ea, eb) = (a.election("observed").unwrap(), b.election("observed").unwrap());
        let mut observer = follower.election("observed").unwrap().observe().await.unwrap();
        assert_eq!(observer.current(), None);

        let leader = ea.campaign(b"a").await.unwrap();
        let elected = Instant::now();
        let seen = within(HANDOFF, "the observer sees a elected", observer.changed())
            .await
            .unwrap()
            .expect("a leader");
        let elected_after = elected.elapsed();
        assert_eq!((seen.id(), seen.term()), (leader.id(), leader.term()));
        assert_eq!(seen.metadata(), b"a");
        assert_eq!(observer.current(), Some(&seen));

        let resigned = Instant::now();
        leader.resign().await.unwrap();
        let seen = within(HANDOFF, "the observer sees a resign", observer.changed()).await;
        let resigned_after = resigned.elapsed();
        assert_eq!(seen.unwrap(), None);

        // A leader that dies silently: no message, only its lease's end. The observer's
        // fallback without a leader is 30 s, so seeing it within the handoff deadline means
        // the observer's timer followed the lease.
        let lease = Duration::from_millis(800);
        let doomed = eb.with_lease(lease).unwrap().campaign(b"b").await.unwrap();
        let seen = within(HANDOFF, "the observer sees b elected", observer.changed())
            .await
            .unwrap()
            .expect("b leads");
        assert_eq!(seen.term(), doomed.term());
        let valid_until = doomed.valid_until();
        crash(doomed);
        let seen = within(
            lease + HANDOFF,
            "the observer sees b's lease expire",
            observer.changed(),
        )
        .await;
        let expired_after = Instant::now().saturating_duration_since(valid_until);
        assert_eq!(seen.unwrap(), None);
        for delay in [elected_after, resigned_after, expired_after] {
            assert!(delay < HANDOFF, "{delay:?}");
        }
        eprintln!(
            "observer delays: elected {elected_after:?}, resigned {resigned_after:?}, \
             expired {expired_after:?} after the leader's own validity ended"
        );
    }
}

on_topologies! {
    async fn an_observer_dropped_during_its_read_still_reports_the_change(fx) {
        let (a, follower) = (fx.client().await, fx.client().await);
        let mut observer = follower.election("dropped-read").unwrap().observe().await.unwrap();
        let leader = a.election("dropped-read").unwrap().campaign(b"a").await.unwrap();
        // Let the election's message reach the follower's client.
        tokio::time::sleep(Duration::from_millis(200)).await;
        // One poll takes the wake-up and sends the read; dropping the call there must not
        // lose the change (nobody leads before, so nothing else would wake the observer for
        // 30 s).
        let polled_once = tokio::select! {
            biased;
            seen = observer.changed() => Some(seen),
            () = std::future::ready(()) => None,
        };
        assert!(polled_once.is_none(), "a read finished within one poll");
        let seen = within(HANDOFF, "the observer after a dropped read", observer.changed())
            .await
            .unwrap()
            .expect("a leads");
        assert_eq!(seen.term(), leader.term());
        leader.resign().await.unwrap();
    }
}

on_topologies! {
    async fn a_deposed_leaders_fenced_write_is_refused_after_the_next_leader_wrote(fx) {
        let (a, b) = (fx.client().await, fx.client().await);
        let (ea, eb) = (a.election("deposed").unwrap(), b.election("deposed").unwrap());
        let state = a.resource("deposed-state").unwrap();

        // The election's key deleted behind the leader.
        let old = ea.campaign(b"a").await.unwrap();
        state.set(old.term(), "a1").await.unwrap();
        let _: () = fx.raw().del(election_key(&fx, "deposed")).unwrap();
        let new = eb.try_campaign(b"b").await.unwrap().expect("free after the DEL");
        assert!(new.term() > old.term());
        state.set(new.term(), "b1").await.unwrap();
        let err = state.set(old.term(), "a2").await.unwrap_err();
        assert!(err.is_stale_token(), "{err}");
        assert!(old.resign().await.unwrap_err().is_not_held());
        assert_eq!(ea.leader().await.unwrap().unwrap().id(), new.id(), "the old leader's resignation touched the new one");
        new.resign().await.unwrap();

        // A fixed lease that ran out behind the leader.
        let lease = Duration::from_millis(300);
        let old = ea.with_lease(lease).unwrap().campaign(b"a").await.unwrap();
        state.set(old.term(), "a3").await.unwrap();
        let new = woken("the candidate after the leader's lease ended", eb.campaign(b"b"))
            .await
            .unwrap();
        assert!(!old.is_valid());
        state.set(new.term(), "b2").await.unwrap();
        let err = state.set(old.term(), "a4").await.unwrap_err();
        assert!(err.is_stale_token(), "{err}");
        assert_eq!(state.peek().await.unwrap().as_deref(), Some(&b"b2"[..]));
        new.resign().await.unwrap();
        drop(old);
    }
}

on_topologies! {
    async fn fair_clients_hand_the_leadership_to_the_queued_candidate(fx) {
        let fair = || fx.builder().fair_handoff(Duration::from_secs(2)).connect();
        let (a, b) = (fair().await.unwrap(), fair().await.unwrap());
        let leader = a.election("fair").unwrap().campaign(b"a").await.unwrap();
        let candidate = b.election("fair").unwrap();
        let waiting = tokio::spawn(async move { candidate.campaign(b"b").await });
        // The candidate's client queues under the election's own queue key.
        assert!(
            crate::common::eventually(HANDOFF, || !fx.keys("fencelock:{*}leader-queue:fair").is_empty())
                .await,
            "the candidate was never queued for the election"
        );
        assert!(fx.keys("fencelock:{*}queue:fair").is_empty(), "queued as a lock");
        let first_term = leader.term();
        leader.resign().await.unwrap();
        let next = woken("the queued candidate after the resignation", waiting)
            .await
            .unwrap()
            .unwrap();
        assert!(next.term() > first_term);
        let seen = a.election("fair").unwrap().leader().await.unwrap().expect("b leads");
        assert_eq!((seen.id(), seen.metadata()), (next.id(), &b"b"[..]));
        next.resign().await.unwrap();
        assert!(
            crate::common::eventually(HANDOFF, || fx.keys("fencelock:{*}leader*").is_empty()).await,
            "the election left keys behind: {:?}",
            fx.keys("fencelock:{*}leader*")
        );
    }
}

on_topologies! {
    async fn an_election_and_a_lock_of_one_name_are_unrelated(fx) {
        let client = fx.client().await;
        let lock = client.lock("shared-name").unwrap().acquire().await.unwrap();
        let leader = client
            .election("shared-name")
            .unwrap()
            .try_campaign(b"m")
            .await
            .unwrap()
            .expect("the lock of the same name does not block the election");
        assert!(fx.lock_state("shared-name").is_some());
        leader.resign().await.unwrap();
        assert!(fx.lock_state("shared-name").is_some(), "resigning released the lock");
        lock.release().await.unwrap();
    }
}

on_topologies! {
    async fn a_campaign_dropped_at_any_point_leaves_nobody_leading(fx) {
        const CASES: u64 = 100;
        let (a, b) = (fx.client().await, fx.client().await);
        let election = a.election("dropped").unwrap();
        let mut points = CancelPoints::new(0x5eed_e1ec).with_sleeps_up_to(Duration::from_micros(1500));
        for case in 0..CASES {
            // Every third case another candidate leads and resigns inside the drop window, so
            // drops also land while waiting and right after the wake-up.
            let resigning = if case % 3 == 0 {
                let other = b.election("dropped").unwrap().campaign(b"b").await.unwrap();
                let delay = Duration::from_micros((case * 31) % 1500);
                Some(tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    other.resign().await
                }))
            } else {
                None
            };
            // Drops land before, during and after the acquisition's and the announcement's
            // round trips; the occasional sleep lets the campaign finish first.
            if let Some(leader) = points.run(election.campaign(b"a")).await {
                leader.unwrap().resign().await.unwrap();
            }
            if let Some(resigning) = resigning {
                within(HANDOFF, "the other leader resigns", resigning)
                    .await
                    .unwrap()
                    .unwrap();
            }
            assert!(
                crate::common::eventually(HANDOFF, || fx.keys("fencelock:{*}leader:dropped").is_empty())
                    .await,
                "case {case}: a dropped campaign left the election held"
            );
        }
        points.assert_both_outcomes();
        assert_eq!(b.election("dropped").unwrap().leader().await.unwrap(), None);
    }
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_leaves_nothing_behind() {
    let fx = Fixture::start();
    let client = fx.client().await;
    assert!(matches!(
        client.election(""),
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        client.election(vec![b'n'; MAX_NAME_LEN + 1]),
        Err(Error::InvalidName { .. })
    ));
    let election = client.election("input").unwrap();
    // The handle names itself and the lease its leaders get.
    assert_eq!(election.name(), b"input");
    assert_eq!(election.lease(), client.default_lease());
    let fixed = election.with_lease(Duration::from_millis(1500)).unwrap();
    assert_eq!(fixed.lease(), Duration::from_millis(1500));
    let shown = format!("{election:?}");
    assert!(
        shown.starts_with("Election") && shown.contains("\"input\""),
        "{shown}"
    );
    assert!(election
        .with_lease(Duration::ZERO)
        .unwrap_err()
        .is_invalid_input());
    let oversize = vec![b'm'; MAX_METADATA_LEN + 1];
    let refusals = [
        election.campaign(&oversize).await.unwrap_err(),
        election.try_campaign(&oversize).await.unwrap_err(),
        election
            .campaign_timeout(&oversize, Duration::from_secs(1))
            .await
            .unwrap_err(),
    ];
    for err in refusals {
        assert!(
            matches!(err, Error::InvalidMetadata { len, max } if len == MAX_METADATA_LEN + 1 && max == MAX_METADATA_LEN),
            "{err}"
        );
        assert!(err.is_invalid_input());
    }
    assert!(fx.keys("*").is_empty(), "a refused campaign sent something");

    // The largest metadata is accepted and read back whole.
    let largest = vec![b'm'; MAX_METADATA_LEN];
    let leader = election.campaign(&largest).await.unwrap();
    assert_eq!(
        election.leader().await.unwrap().unwrap().metadata(),
        largest
    );
    let key = fx
        .keys("fencelock:{*}leader:input")
        .pop()
        .expect("the election's key");
    leader.resign().await.unwrap();

    // Foreign data at the election's key: typed, and left as it was.
    let _: () = fx.raw().set(&key, "foreign").unwrap();
    assert!(election
        .try_campaign(b"m")
        .await
        .unwrap_err()
        .is_wrong_type());
    assert!(election.leader().await.unwrap_err().is_wrong_type());
    assert!(election.observe().await.unwrap_err().is_wrong_type());
    let value: String = fx.raw().get(&key).unwrap();
    assert_eq!(value, "foreign");
}

/// Set by the parent of the process test: a child campaigns against this server.
const CHILD_ENV: &str = "FENCELOCK_ELECTION_CHILD_URL";
/// The children's lease: a frozen leader is replaced this long after its last renewal.
const CHILD_LEASE: Duration = Duration::from_secs(1);
/// The children's fenced log, and the refusals they met.
const CHILD_LOG: &str = "processes-log";
const CHILD_REFUSED: &str = "processes-refused";

/// Set by the parent for a child that should resign: the key `processes-resign:<pid>`.
const CHILD_RESIGN: &str = "processes-resign";

/// The child's work, a no-op unless the parent started this binary as a child: lead, then
/// append `pid:term` to a fenced log every 20 ms until the log refuses the term (recorded in
/// `CHILD_REFUSED` before it exits) or the parent asks it to resign (it resigns and exits).
#[tokio::test]
async fn election_child_leads_and_writes_until_fenced_off() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let client = LockClient::builder(&url)
        .default_lease(CHILD_LEASE)
        .connect()
        .await
        .unwrap();
    let pid = std::process::id();
    let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
    let campaign = client
        .election("processes")
        .unwrap()
        .campaign(format!("pid:{pid}").as_bytes())
        .await;
    let leader = match campaign {
        Ok(leader) => leader,
        // Frozen after its announcement landed but before it read the reply: the re-sent
        // announcement finds the successor, and the candidate learns it lost before it led.
        Err(err) if err.is_not_held() => {
            let _: () = raw.rpush(CHILD_REFUSED, format!("{pid}:not-held")).unwrap();
            return;
        }
        Err(err) => panic!("child {pid}: {err}"),
    };
    let log = client.resource(CHILD_LOG).unwrap();
    let entry = format!("{pid}:{}", leader.term());
    loop {
        let asked: bool = raw.exists(format!("{CHILD_RESIGN}:{pid}")).unwrap();
        if asked {
            leader.resign().await.unwrap();
            return;
        }
        match log.push(leader.term(), &[entry.as_bytes()]).await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(err) if err.is_stale_token() => {
                let _: () = raw.rpush(CHILD_REFUSED, &entry).unwrap();
                return;
            }
            Err(err) => panic!("child {pid}: {err}"),
        }
    }
}

/// The next leader an observer sees, skipping a vacancy in between.
async fn next_leader(observer: &mut fencelock::Observer) -> fencelock::Leader {
    loop {
        if let Some(leader) = observer.changed().await.unwrap() {
            return leader;
        }
    }
}

/// The candidate process that leads, found by the metadata an observer reads.
fn leading<'a>(
    candidates: &'a mut [ChildProcess],
    leader: &fencelock::Leader,
) -> &'a mut ChildProcess {
    candidates
        .iter_mut()
        .find(|child| leader.metadata() == format!("pid:{}", child.pid()).as_bytes())
        .expect("the leader is one of the candidate processes")
}

#[tokio::test]
async fn four_candidate_processes_hand_over_on_freeze_crash_and_resignation() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let mut observer = client
        .election("processes")
        .unwrap()
        .observe()
        .await
        .unwrap();
    let test = "election_child_leads_and_writes_until_fenced_off";
    let mut candidates: Vec<ChildProcess> = (0..4)
        .map(|_| ChildProcess::start(module_path!(), test, CHILD_ENV, &url))
        .collect();
    let first = within(HANDOFF, "a candidate leads", next_leader(&mut observer)).await;
    let mut terms = vec![first.term()];

    // 1. Frozen (SIGSTOP): no renewal, no write; a waiting candidate takes over when the
    // lease ends, and the thawed leader's next write is refused.
    let frozen_pid = leading(&mut candidates, &first).pid();
    send_signal(frozen_pid, Signal::Stop).unwrap();
    let frozen_at = Instant::now();
    let second = within(
        CHILD_LEASE + HANDOFF,
        "another candidate leads after the frozen leader's lease",
        next_leader(&mut observer),
    )
    .await;
    let seen_after_freeze = frozen_at.elapsed();
    terms.push(second.term());
    let log = client.resource(CHILD_LOG).unwrap();
    let second_entry = format!(
        "{}:{}",
        leading(&mut candidates, &second).pid(),
        second.term()
    );
    within(HANDOFF, "the new leader writes", async {
        while !log
            .peek_items()
            .await
            .unwrap()
            .contains(&second_entry.clone().into_bytes())
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    send_signal(frozen_pid, Signal::Cont).unwrap();
    let thawed = candidates
        .iter_mut()
        .find(|c| c.pid() == frozen_pid)
        .unwrap();
    assert!(
        thawed
            .exited(HANDOFF, "the thawed leader meets the fence and stops")
            .await,
        "the thawed leader failed"
    );
    // Its next write is refused; or, frozen before it read its announcement's reply, the
    // re-sent announcement told it that it had lost already.
    let refused: Vec<String> = fx.raw().lrange(CHILD_REFUSED, 0, -1).unwrap();
    let fenced = [format!("{frozen_pid}:{}", first.term())];
    let lost_first = [format!("{frozen_pid}:not-held")];
    assert!(refused == fenced || refused == lost_first, "{refused:?}");

    // 2. Crashed (SIGKILL): the next candidate leads when the lease ends.
    let killed_at = Instant::now();
    send_signal(leading(&mut candidates, &second).pid(), Signal::Kill).unwrap();
    let third = within(
        CHILD_LEASE + HANDOFF,
        "a candidate leads after the crashed leader's lease",
        next_leader(&mut observer),
    )
    .await;
    let seen_after_kill = killed_at.elapsed();
    terms.push(third.term());

    // 3. Resigned: the last candidate leads at once.
    let resigning = leading(&mut candidates, &third).pid();
    let asked_at = Instant::now();
    let _: () = fx
        .raw()
        .set(format!("{CHILD_RESIGN}:{resigning}"), 1)
        .unwrap();
    let fourth = within(
        HANDOFF,
        "the last candidate leads after the resignation",
        next_leader(&mut observer),
    )
    .await;
    let seen_after_resign = asked_at.elapsed();
    terms.push(fourth.term());
    let resigned = candidates
        .iter_mut()
        .find(|c| c.pid() == resigning)
        .unwrap();
    assert!(resigned.exited(HANDOFF, "the resigned leader exits").await);

    // Four leaders, four distinct processes, terms strictly increasing.
    let pids: std::collections::HashSet<&[u8]> = [&first, &second, &third, &fourth]
        .iter()
        .map(|leader| leader.metadata())
        .collect();
    assert_eq!(pids.len(), 4, "each candidate led once");
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
    // At most one leader wrote at a time: the fenced log's terms never go back.
    let logged: Vec<u64> = log
        .peek_items()
        .await
        .unwrap()
        .iter()
        .map(|item| {
            let item = String::from_utf8_lossy(item);
            item.split(':').nth(1).unwrap().parse().unwrap()
        })
        .collect();
    assert!(
        logged.windows(2).all(|w| w[0] <= w[1]),
        "an old term was written after a newer one: {logged:?}"
    );
    eprintln!(
        "observer saw the change: {seen_after_freeze:?} after the freeze, {seen_after_kill:?} \
         after the kill (lease {CHILD_LEASE:?}), {seen_after_resign:?} after the resignation was \
         asked for"
    );
    // The bounds the observer kept: the lease plus one handoff for a silent leader, one
    // handoff for a resignation.
    assert!(seen_after_freeze < CHILD_LEASE + HANDOFF);
    assert!(seen_after_kill < CHILD_LEASE + HANDOFF);
    assert!(seen_after_resign < HANDOFF);
    let last = leading(&mut candidates, &fourth).pid();
    send_signal(last, Signal::Kill).unwrap();
}

#[tokio::test]
async fn an_idle_follower_reads_the_leader_only_when_its_lease_could_have_ended() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let election = client.election("quiet").unwrap();
    let leader = election
        .with_lease(Duration::from_secs(3))
        .unwrap()
        .campaign(b"a")
        .await
        .unwrap();
    let mut observer = election.observe().await.unwrap();
    let before = fx.calls("evalsha");
    // Nothing changes for a second: the follower waits for a message or the lease's end
    // (3 s away), and reads nothing meanwhile.
    let quiet = tokio::time::timeout(Duration::from_secs(1), observer.changed()).await;
    assert!(quiet.is_err(), "no change happened: {quiet:?}");
    let reads = fx.calls("evalsha") - before;
    assert!(
        reads <= 1,
        "an idle follower read {reads} times in a second"
    );
    // When the fixed lease runs out, the follower sees nobody leading.
    let vacancy = within(
        Duration::from_secs(3) + HANDOFF,
        "the follower sees the lease end",
        observer.changed(),
    )
    .await;
    assert_eq!(vacancy.unwrap(), None);
    drop(leader);
}

#[tokio::test]
async fn a_leader_knows_it_leads_and_handles_describe_themselves() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let election = client.election("shown").unwrap();
    let leader = election.campaign(b"me").await.unwrap();
    assert!(leader.is_valid() && leader.valid_until() > Instant::now());
    let observer = election.observe().await.unwrap();
    let shown = format!("{observer:?}");
    assert!(
        shown.starts_with("Observer") && shown.contains("current"),
        "{shown}"
    );
    let shown = format!("{leader:?}");
    assert!(
        shown.contains("\"shown\"") && shown.contains("valid: true"),
        "{shown}"
    );
    leader.resign().await.unwrap();
}
