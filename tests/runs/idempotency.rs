//! Idempotency keys against real servers: a key runs once and its duplicates get the stored
//! result; a reused key is refused; failures are retried or stored by the caller's choice; a
//! duplicate waits for a run's outcome; runs dropped at random points leave every key done or
//! retryable; bad input; the blocking facade; and runners in other processes killed with
//! SIGKILL or frozen with SIGSTOP past their hold. The topology tests run on one server and on
//! a 3-primary cluster. The PostgreSQL ledger behind the keys is `tests/storage/payments.rs`.

use std::time::Duration;

use crate::common::child::ChildProcess;
use crate::common::deadline::{within, HANDOFF};
use crate::common::{Fixture, Rng};
use fencelock::{
    Error, Failure, Idempotency, IdempotencyOptions, LockClient, OnRunnerDeath, Processed,
    MAX_FINGERPRINT_LEN, MAX_NAME_LEN, MAX_RESULT_LEN,
};
use fencelock_testing::{send_signal, RedisServer, Signal};
use redis::Commands;

const FINGERPRINT: &str = "charge acct-9 500";

fn options() -> IdempotencyOptions {
    IdempotencyOptions::new(Duration::from_secs(30))
}

/// A run whose closure must not be called.
async fn never_runs(_run: fencelock::KeyRun) -> Result<Vec<u8>, Failure<String>> {
    panic!("a run that must not happen was called")
}

on_topologies_multi_thread! {
    async fn a_key_runs_once_and_its_duplicates_get_the_stored_result(fx) {
        let (a, b) = (fx.client().await, fx.client().await);
        let payments = a.idempotency("payments", options()).unwrap();
        let elsewhere = b.idempotency("payments", options()).unwrap();
        let first = payments
            .run("k1", FINGERPRINT, |run| async move {
                assert_eq!(run.key(), b"k1");
                assert_eq!(run.took_over(), None);
                Ok::<_, Failure<String>>(format!("paid with {}", run.token()).into_bytes())
            })
            .await
            .unwrap();
        let Processed::Ran { token, output: Ok(result) } = &first else {
            panic!("the first run: {first:?}");
        };
        assert_eq!(first.result(), Some(&result[..]));
        for handle in [&payments, &elsewhere] {
            let dup = handle.run("k1", FINGERPRINT, never_runs).await.unwrap();
            let Processed::Completed(record) = &dup else { panic!("a duplicate: {dup:?}") };
            assert_eq!((record.token(), record.result()), (*token, Some(&result[..])));
            assert_eq!(record.fingerprint(), FINGERPRINT.as_bytes());
            assert!(!dup.ran() && !record.is_final_failure());
        }
        let record = elsewhere.record("k1").await.unwrap().unwrap();
        assert!(record.finished().unwrap() >= record.started());

        // Another request under the same key: refused, nothing runs, the record stays.
        let err = elsewhere.run("k1", "refund acct-9 500", never_runs).await.unwrap_err();
        assert!(
            matches!(&err, Error::KeyReused { key, namespace, .. }
                if key == "k1" && namespace == "payments"),
            "{err}"
        );
        // Named readably in its text too (and in its Debug: strings, not byte arrays).
        assert!(err.to_string().starts_with("idempotency key k1 of payments was used"), "{err}");
        assert!(format!("{err:?}").contains(r#"key: "k1""#), "{err:?}");
        assert_eq!(elsewhere.record("k1").await.unwrap(), Some(record));

        // The same key in another namespace is another key.
        let refunds = a.idempotency("refunds", options()).unwrap();
        let other = refunds
            .run("k1", "refund acct-9 500", |_run| async { Ok::<_, Failure<()>>(vec![]) })
            .await
            .unwrap();
        assert!(other.ran() && other.result() == Some(&b""[..]));
    }

    async fn a_failure_is_retried_or_stored_as_the_caller_says(fx) {
        let client = fx.client().await;
        let payments = client.idempotency("payments", options()).unwrap();
        // Retry: nothing stored, the key runs again with a newer token that knows the old one.
        let failed = payments
            .run("k2", FINGERPRINT, |run| async move {
                Err::<Vec<u8>, _>(Failure::Retry(run.token()))
            })
            .await
            .unwrap();
        let Processed::Ran { token: failed_token, output: Err(Failure::Retry(_)) } = failed else {
            panic!("a retryable failure: {failed:?}");
        };
        assert_eq!(failed.result(), None);
        let record = payments.record("k2").await.unwrap().unwrap();
        assert!(record.failed().is_some() && record.result().is_none());
        let retried = payments
            .run("k2", FINGERPRINT, |run| async move {
                Ok::<_, Failure<()>>(run.took_over().unwrap().to_string().into_bytes())
            })
            .await
            .unwrap();
        let Processed::Ran { token, output: Ok(took_over) } = &retried else {
            panic!("the retry: {retried:?}");
        };
        assert!(*token > failed_token);
        assert_eq!(took_over, &failed_token.to_string().into_bytes());

        // Final: stored like a result, marked as a failure; duplicates get it.
        let declined = payments
            .run("k3", FINGERPRINT, |_run| async {
                Err::<Vec<u8>, _>(Failure::Final { error: "declined", result: b"no funds".to_vec() })
            })
            .await
            .unwrap();
        assert_eq!(declined.result(), Some(&b"no funds"[..]));
        let dup = payments.run("k3", FINGERPRINT, never_runs).await.unwrap();
        let Processed::Completed(record) = &dup else { panic!("{dup:?}") };
        assert!(record.is_final_failure());
        assert_eq!(dup.result(), Some(&b"no funds"[..]));
    }

    async fn a_duplicate_is_told_the_run_is_in_progress_or_waits_for_its_outcome(fx) {
        let (a, b) = (fx.client().await, fx.client().await);
        let payments = a.idempotency("payments", options()).unwrap();
        let (began_tx, began_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let runner = tokio::spawn({
            let payments = payments.clone();
            async move {
                payments
                    .run("k4", FINGERPRINT, |run| async move {
                        began_tx.send(run.token()).unwrap();
                        go_rx.await.unwrap();
                        Ok::<_, Failure<()>>(b"paid".to_vec())
                    })
                    .await
            }
        });
        let token = within(HANDOFF, "the run begins", began_rx).await.unwrap();
        let impatient = b.idempotency("payments", options()).unwrap();
        let busy = impatient.run("k4", FINGERPRINT, never_runs).await.unwrap();
        let Processed::InProgress(Some(record)) = &busy else { panic!("{busy:?}") };
        assert_eq!((record.token(), record.finished()), (token, None));
        let err = impatient.run("k4", "another request", never_runs).await.unwrap_err();
        assert!(matches!(err, Error::KeyReused { .. }), "{err}");

        let patient = b
            .idempotency("payments", options().wait_for_outcome(Duration::from_secs(20)))
            .unwrap();
        let waiting = tokio::spawn(async move { patient.run("k4", FINGERPRINT, never_runs).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "the waiting duplicate answered before the outcome");
        go_tx.send(()).unwrap();
        let ran = runner.await.unwrap().unwrap();
        assert!(ran.ran());
        let answered = within(HANDOFF, "the waiting duplicate is answered", waiting)
            .await
            .unwrap()
            .unwrap();
        let Processed::Completed(record) = &answered else { panic!("{answered:?}") };
        assert_eq!((record.token(), answered.result()), (token, Some(&b"paid"[..])));
    }

    async fn runs_dropped_at_random_points_leave_every_key_done_or_retryable(fx) {
        let client = fx.client().await;
        let at_most_for = Duration::from_secs(2);
        let payments = client
            .idempotency("dropped", IdempotencyOptions::new(at_most_for))
            .unwrap();
        let ledger = client.resource("dropped-ledger").unwrap();
        let seed = 0x1d3a_5eed_u64 ^ u64::from(std::process::id());
        eprintln!("seed {seed}");
        let mut rng = Rng(seed);
        // 500 runs over 100 keys, 50 at a time, each dropped after 0 to 4 ms: before the
        // acquire, between it and the begin, inside the run, while storing the result.
        for batch in 0..10u64 {
            let mut calls = Vec::new();
            for i in 0..50u64 {
                let key = format!("key-{}", (batch * 50 + i) % 100);
                let drop_after = Duration::from_micros(rng.below(4000));
                let work = Duration::from_micros(rng.below(1500));
                let (payments, ledger) = (payments.clone(), ledger.clone());
                calls.push(tokio::spawn(async move {
                    let run = payments.run(key.clone(), FINGERPRINT, |run| async move {
                        tokio::time::sleep(work).await;
                        ledger
                            .push(run.token(), &[key.as_bytes()])
                            .await
                            .map_err(Failure::Retry)?;
                        Ok(key.into_bytes())
                    });
                    let _ = tokio::time::timeout(drop_after, run).await;
                }));
            }
            for call in calls {
                call.await.unwrap();
            }
        }
        // Within at_most_for no key is held (a dropped run releases at once; one whose
        // release is lost is freed by its lease).
        within(at_most_for + HANDOFF, "every dropped run's hold ends", async {
            while !fx.keys("fencelock:{*}idem:dropped:*").is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        // Every key is done (answered from its record) or retryable (runs now).
        for k in 0..100 {
            let key = format!("key-{k}");
            let expected = key.clone().into_bytes();
            let outcome = payments
                .run(&key, FINGERPRINT, |_run| async move { Ok::<_, Failure<()>>(expected) })
                .await
                .unwrap();
            assert!(
                matches!(outcome, Processed::Ran { output: Ok(_), .. } | Processed::Completed(_)),
                "{key}: {outcome:?}"
            );
            assert_eq!(outcome.result(), Some(key.as_bytes()), "{key}");
        }
    }
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_leaves_nothing_behind() {
    let fx = Fixture::start();
    let client = fx.client().await;
    for namespace in [&b""[..], b"pay:ments", &[b'n'; 257]] {
        let err = client.idempotency(namespace, options()).unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
    }
    let thirty = Duration::from_secs(30);
    for bad in [
        IdempotencyOptions::new(Duration::ZERO),
        IdempotencyOptions::new(thirty).with_retention(Duration::from_secs(29)),
        IdempotencyOptions::new(thirty).with_retention(Duration::from_micros(3_600_000_500)),
        IdempotencyOptions::new(thirty).wait_for_outcome(Duration::from_secs(86_401)),
    ] {
        let err = client.idempotency("payments", bad.clone()).unwrap_err();
        assert!(err.is_invalid_input(), "{bad:?}: {err}");
    }
    let payments = client.idempotency("payments", options()).unwrap();
    let shown = format!("{payments:?}");
    assert!(
        shown.starts_with("Idempotency") && shown.contains("\"payments\""),
        "{shown}"
    );
    let long_key = vec![b'k'; MAX_NAME_LEN - "payments:".len() + 1];
    let long_print = vec![b'f'; MAX_FINGERPRINT_LEN + 1];
    for (key, fingerprint) in [
        (&b""[..], FINGERPRINT.as_bytes()),
        (&long_key[..], FINGERPRINT.as_bytes()),
        (b"k", b""),
        (b"k", &long_print[..]),
    ] {
        let err = payments
            .run(key, fingerprint, never_runs)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidIdempotency { .. }), "{err}");
    }
    // The longest key that fits is a key.
    let longest = &long_key[1..];
    let fits = payments
        .run(longest, FINGERPRINT, |_run| async {
            Ok::<_, Failure<()>>(vec![1])
        })
        .await
        .unwrap();
    assert!(fits.ran());
    let _: () = fx.raw().del(fx.keys("fencelock:*")).unwrap();
    assert!(fx.keys("*").is_empty());

    // A result over the bound: the run happened, nothing is stored, the key is retryable.
    let err = payments
        .run("big", FINGERPRINT, |_run| async {
            Ok::<_, Failure<()>>(vec![0; MAX_RESULT_LEN + 1])
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ResultTooLarge { len, max } if len == MAX_RESULT_LEN + 1 && max == MAX_RESULT_LEN),
        "{err}"
    );
    let exact = payments
        .run("big", FINGERPRINT, |run| async move {
            assert!(run.took_over().is_some(), "the oversized run is taken over");
            Ok::<_, Failure<()>>(vec![7; MAX_RESULT_LEN])
        })
        .await
        .unwrap();
    assert_eq!(exact.result().map(<[u8]>::len), Some(MAX_RESULT_LEN));
    assert!(
        fx.keys("fencelock:{*}idem:payments:big").is_empty(),
        "released"
    );

    // Foreign data at the record: a typed error, nothing run, the lock released, the data
    // untouched.
    let record_key = fx.keys("fencelock:{*}idem-rec:payments:big").pop().unwrap();
    let _: () = fx.raw().set(&record_key, "foreign").unwrap();
    let err = payments
        .run("big", FINGERPRINT, never_runs)
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    assert!(payments.record("big").await.unwrap_err().is_wrong_type());
    let value: String = fx.raw().get(&record_key).unwrap();
    assert_eq!(value, "foreign");
    within(HANDOFF, "the refused run's lock is released", async {
        while !fx.keys("fencelock:{*}idem:payments:big").is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// A duplicate whose busy attempt met a hold that ended before its read of the record (here
/// a runner frozen past `at_most_for`, met through a proxy that delays every message 200 ms:
/// the attempt reaches Redis while the hold lasts, the read after it ended) takes the key over
/// and runs it, instead of answering "in progress" for a key nobody holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_that_ends_between_the_attempt_and_the_read_leaves_the_key_to_the_call() {
    let fx = Fixture::start();
    let proxy = fencelock_testing::FaultProxy::start(fx.server.addr()).unwrap();
    let frozen = fx
        .client()
        .await
        .idempotency(
            "payments",
            IdempotencyOptions::new(Duration::from_millis(400)),
        )
        .unwrap();
    let far = fencelock::LockClient::connect(&proxy.url())
        .await
        .unwrap()
        .idempotency("payments", options())
        .unwrap();
    // Every script loaded, so that each call below is one round trip through the proxy.
    let warm = far
        .run("warm", FINGERPRINT, |_| async {
            Ok::<_, Failure<()>>(vec![])
        })
        .await
        .unwrap();
    assert!(warm.ran());
    let (began_tx, began_rx) = tokio::sync::oneshot::channel();
    let runner = tokio::spawn(async move {
        frozen
            .run("k", FINGERPRINT, |run| async move {
                began_tx.send(run.token()).unwrap();
                // Frozen well past its 400 ms hold.
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok::<_, Failure<()>>(b"late".to_vec())
            })
            .await
    });
    let dead = within(HANDOFF, "the run begins", began_rx).await.unwrap();
    proxy.delay(
        fencelock_testing::Direction::Both,
        Duration::from_millis(200),
    );
    let outcome = far
        .run("k", FINGERPRINT, |run| async move {
            Ok::<_, Failure<()>>(run.took_over().unwrap().to_string().into_bytes())
        })
        .await
        .unwrap();
    assert!(outcome.ran(), "{outcome:?}");
    assert_eq!(outcome.result(), Some(dead.to_string().as_bytes()));
    proxy.heal();
    // The frozen runner's late result is refused: the key is the newer run's.
    let late = runner.await.unwrap().unwrap_err();
    assert!(late.is_stale_token(), "{late}");
}

#[tokio::test]
async fn a_dead_runners_key_is_given_up_under_that_policy() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let careful = client
        .idempotency("careful", options().on_runner_death(OnRunnerDeath::GiveUp))
        .unwrap();
    let (began_tx, began_rx) = tokio::sync::oneshot::channel();
    let call = tokio::spawn({
        let careful = careful.clone();
        async move {
            careful
                .run("k", FINGERPRINT, |run| async move {
                    began_tx.send(run.token()).unwrap();
                    std::future::pending::<Result<Vec<u8>, Failure<()>>>().await
                })
                .await
        }
    });
    let dead = within(HANDOFF, "the run begins", began_rx).await.unwrap();
    call.abort();
    // Dropped mid-run: the key is released at once (not after 30 s), its record says running.
    within(HANDOFF, "the dropped run's hold is released", async {
        while !fx.keys("fencelock:{*}idem:careful:k").is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let given_up = careful.run("k", FINGERPRINT, never_runs).await.unwrap();
    let Processed::Abandoned(record) = &given_up else {
        panic!("{given_up:?}")
    };
    assert_eq!(record.token(), dead);
    // The default policy runs it again.
    let eager = client.idempotency("careful", options()).unwrap();
    let rerun = eager
        .run("k", FINGERPRINT, |run| async move {
            Ok::<_, Failure<()>>(run.took_over().unwrap().to_string().into_bytes())
        })
        .await
        .unwrap();
    assert_eq!(rerun.result(), Some(dead.to_string().as_bytes()));
}

#[test]
fn the_blocking_facade_runs_a_key_once() {
    let server = RedisServer::start().unwrap();
    let client = fencelock::blocking::LockClient::connect(&server.url()).unwrap();
    let payments = client.idempotency("payments", options()).unwrap();
    assert_eq!(payments.namespace(), b"payments");
    assert_eq!(payments.options().at_most_for(), Duration::from_secs(30));
    let first = payments
        .run("k", FINGERPRINT, |run| {
            Ok::<_, Failure<()>>(run.token().to_string().into_bytes())
        })
        .unwrap();
    assert!(first.ran());
    let dup = payments
        .run("k", FINGERPRINT, |_run| -> Result<Vec<u8>, Failure<()>> {
            panic!("a duplicate ran")
        })
        .unwrap();
    assert_eq!(dup.result(), first.result());
    let record = payments.record("k").unwrap().unwrap();
    assert_eq!(Some(record.token().to_string().as_bytes()), first.result());
}

// Separate processes: a runner process of this test binary begins a run and works on it for
// long; the parent kills or freezes it mid-run and runs the key itself.

const CHILD_ENV: &str = "FENCELOCK_KEY_CHILD";
/// Where the runner announces that its run began (its token), and what its call ended as.
const CHILD_BEGUN: &str = "keys-begun";
const CHILD_ENDED: &str = "keys-ended";
/// The key's fenced log: every run that wrote.
const KEY_LOG: &str = "keys-log";
const CHILD_AT_MOST: Duration = Duration::from_millis(800);
/// Long enough for the parent to strike the runner mid-run on a loaded machine.
const CHILD_WORK: Duration = Duration::from_millis(3000);

fn child_options() -> IdempotencyOptions {
    IdempotencyOptions::new(CHILD_AT_MOST)
}

/// The runner process, a no-op unless the parent started this binary as a child: runs the key
/// `pay-1` with a long run that writes to the fenced log, and reports what happened.
#[tokio::test]
async fn key_child_runs_one_payment() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (url, report) = spec.split_once(' ').unwrap();
    let client = LockClient::connect(url).await.unwrap();
    let payments = client.idempotency("payments", child_options()).unwrap();
    let log = client.resource(KEY_LOG).unwrap();
    let report = report.to_owned();
    let outcome = payments
        .run("pay-1", FINGERPRINT, |run| {
            let report = report.clone();
            async move {
                let mut raw = redis::Client::open(report)
                    .unwrap()
                    .get_connection()
                    .unwrap();
                let _: () = raw.rpush(CHILD_BEGUN, run.token().get()).unwrap();
                tokio::time::sleep(CHILD_WORK).await;
                log.push(run.token(), &[b"child"])
                    .await
                    .map_err(Failure::Retry)?;
                Ok(b"paid by the child".to_vec())
            }
        })
        .await;
    let label = match outcome {
        Ok(Processed::Ran { output: Ok(_), .. }) => "ran".to_owned(),
        Ok(Processed::Ran {
            output: Err(failure),
            ..
        }) => format!("write-refused {}", failure.error()),
        Ok(other) => format!("{other:?}"),
        Err(err) if err.is_stale_token() => "finish-refused".to_owned(),
        Err(err) => format!("error {err}"),
    };
    let mut raw = redis::Client::open(report.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = raw.rpush(CHILD_ENDED, label).unwrap();
}

/// The key's server, a report server, and the runner process with its token once it began.
struct StrickenRunner {
    server: RedisServer,
    report: RedisServer,
    child: ChildProcess,
    token: u64,
}

impl StrickenRunner {
    async fn start() -> StrickenRunner {
        let (server, report) = (RedisServer::start().unwrap(), RedisServer::start().unwrap());
        let spec = format!("{} {}", server.url(), report.url());
        let child = ChildProcess::start(
            module_path!(),
            "key_child_runs_one_payment",
            CHILD_ENV,
            &spec,
        );
        let mut raw = report.client().get_connection().unwrap();
        let token = within(
            Duration::from_secs(30),
            "the runner process begins its run",
            async {
                loop {
                    let begun: Vec<u64> = raw.lrange(CHILD_BEGUN, 0, -1).unwrap();
                    if let Some(token) = begun.first() {
                        return *token;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            },
        )
        .await;
        StrickenRunner {
            server,
            report,
            child,
            token,
        }
    }

    async fn payments(&self) -> (LockClient, Idempotency) {
        let client = LockClient::connect(&self.server.url()).await.unwrap();
        let payments = client.idempotency("payments", child_options()).unwrap();
        (client, payments)
    }

    /// Runs the key from the parent until it runs (the stricken runner's hold must end
    /// first), writing to the fenced log; the run's token and what it took over.
    async fn take_over(&self, payments: &Idempotency, client: &LockClient) -> (u64, Option<u64>) {
        let log = client.resource(KEY_LOG).unwrap();
        within(
            CHILD_AT_MOST + HANDOFF,
            "the parent's run takes the key over",
            async {
                loop {
                    let log = log.clone();
                    let outcome = payments
                        .run("pay-1", FINGERPRINT, |run| async move {
                            log.push(run.token(), &[b"parent"])
                                .await
                                .map_err(Failure::Retry)?;
                            let old = run.took_over().map_or(0, |old| old.get());
                            Ok(format!("{} {old}", run.token()).into_bytes())
                        })
                        .await
                        .unwrap();
                    match outcome {
                        Processed::Ran {
                            output: Ok(result), ..
                        } => {
                            let text = String::from_utf8(result).unwrap();
                            let (token, old) = text.split_once(' ').unwrap();
                            let old: u64 = old.parse().unwrap();
                            return (token.parse().unwrap(), (old != 0).then_some(old));
                        }
                        Processed::InProgress(Some(record)) => {
                            assert_eq!(record.token().get(), self.token, "the runner holds it");
                        }
                        // The stricken runner's hold ended between this call's busy attempt
                        // and its read of the record: the next call takes the key.
                        Processed::InProgress(None) => {}
                        other => panic!("the parent's run of the stricken key: {other:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
        )
        .await
    }

    fn ended(&self) -> Vec<String> {
        self.report
            .client()
            .get_connection()
            .unwrap()
            .lrange(CHILD_ENDED, 0, -1)
            .unwrap()
    }
}

#[tokio::test]
async fn a_runner_killed_with_sigkill_leaves_the_key_to_a_retry_with_a_greater_token() {
    let runner = StrickenRunner::start().await;
    send_signal(runner.child.pid(), Signal::Kill).unwrap();
    let (client, payments) = runner.payments().await;
    let (token, took_over) = runner.take_over(&payments, &client).await;
    assert!(token > runner.token);
    assert_eq!(took_over, Some(runner.token));
    let record = payments.record("pay-1").await.unwrap().unwrap();
    assert_eq!(record.token().get(), token);
    let log = client.resource(KEY_LOG).unwrap();
    assert_eq!(log.peek_items().await.unwrap(), vec![b"parent".to_vec()]);
}

#[tokio::test]
async fn a_runner_frozen_with_sigstop_past_its_hold_has_its_write_and_result_refused() {
    let mut runner = StrickenRunner::start().await;
    send_signal(runner.child.pid(), Signal::Stop).unwrap();
    let (client, payments) = runner.payments().await;
    let (token, took_over) = runner.take_over(&payments, &client).await;
    assert!(token > runner.token);
    assert_eq!(took_over, Some(runner.token));
    send_signal(runner.child.pid(), Signal::Cont).unwrap();
    assert!(
        runner
            .child
            .exited(Duration::from_secs(60), "the thawed runner ends")
            .await,
        "the runner process failed"
    );
    // Its fenced write was refused (the run's output), and so was storing that outcome over
    // the newer run's record (the call's error).
    assert_eq!(runner.ended(), vec!["finish-refused".to_owned()]);
    let record = payments.record("pay-1").await.unwrap().unwrap();
    assert_eq!(record.token().get(), token);
    assert_eq!(
        record.result(),
        Some(format!("{token} {}", runner.token).as_bytes())
    );
    let log = client.resource(KEY_LOG).unwrap();
    assert_eq!(log.peek_items().await.unwrap(), vec![b"parent".to_vec()]);
}
