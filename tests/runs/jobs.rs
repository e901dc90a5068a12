//! Run-once scheduled jobs against real servers: five instances over twenty ticks with clock
//! offsets, a job faster than the skew, a runner that overruns its hold or dies mid-job (as a
//! task and as a process frozen with SIGSTOP or killed with SIGKILL), cancellation and bad
//! input, and the README's scheduler loop on aligned ticks. The topology tests run on one server
//! and on a 3-primary cluster.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::child::ChildProcess;
use crate::common::deadline::{within, HANDOFF};
use crate::common::ticks::{
    assert_each_tick_ran_once, assert_log_has_each_tick_once, drive, tick_view, PERIOD,
};
use crate::common::{Env, Fixture};
use fencelock::{Error, JobOptions, JobOutcome, LockClient, OnRunnerDeath, MAX_NAME_LEN};
use fencelock_testing::{send_signal, RedisServer, Signal};
use redis::Commands;

const TICKS: u64 = 20;

async fn clients(fx: &Env, n: usize) -> Vec<LockClient> {
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(fx.client().await);
    }
    clients
}

on_topologies_multi_thread! {
    async fn five_instances_with_clocks_two_seconds_apart_run_each_of_twenty_ticks_once(fx) {
        let clients = clients(&fx, 5).await;
        let options = JobOptions::new(PERIOD, Duration::from_secs(5));
        let calls = drive(
            &clients,
            |client| client.job("report", options.clone()).unwrap(),
            TICKS,
            Duration::from_millis(120),
            Duration::from_millis(40),
            Duration::from_millis(30),
            "report-log",
        )
        .await;
        assert_each_tick_ran_once(&clients[0], &calls, TICKS, "report-log").await;
        // Every other call skipped: the tick was running or done, never late (the offsets are
        // within half a period).
        for call in calls.iter().filter(|call| !call.outcome.ran()) {
            assert!(
                matches!(
                    call.outcome,
                    JobOutcome::SkippedRunning { .. } | JobOutcome::SkippedDone { .. }
                ),
                "{call:?}"
            );
        }
        // What stays behind: the tick record alone (the lock was released after each run).
        let record = clients[0].job("report", options).unwrap().last_tick().await.unwrap().unwrap();
        assert!(record.finished().is_some(), "{record:?}");
        assert!(fx.keys("fencelock:{*}job:report").is_empty(), "the job's lock is free");
        assert_eq!(fx.keys("fencelock:{*}job-tick:report").len(), 1);
    }

    async fn a_job_faster_than_the_skew_with_at_least_for_still_runs_once_per_tick(fx) {
        let clients = clients(&fx, 5).await;
        let at_least = Duration::from_millis(200);
        let options = JobOptions::new(PERIOD, Duration::from_secs(5)).at_least_for(at_least);
        // Instances wake up spread over 150 ms; the job takes 1 ms.
        let calls = drive(
            &clients,
            |client| client.job("fast", options.clone()).unwrap(),
            TICKS,
            at_least + Duration::from_millis(100),
            Duration::from_millis(150),
            Duration::from_millis(1),
            "fast-log",
        )
        .await;
        assert_each_tick_ran_once(&clients[0], &calls, TICKS, "fast-log").await;
        // Right after a fast run the job is still held, for at_least_for from its start.
        let job = clients[0].job("fast", options).unwrap();
        let outcome = job
            .run_exclusive(tick_view(TICKS, 0), |_run| async {})
            .await
            .unwrap();
        assert!(outcome.ran());
        let held = clients[1]
            .job("fast", job.options().clone())
            .unwrap()
            .run_exclusive(tick_view(TICKS, 0), |_run| async {})
            .await
            .unwrap();
        match held {
            JobOutcome::SkippedRunning { record: Some(run) } => {
                assert_eq!(Some(run.token()), outcome.token());
                assert!(run.finished().is_some(), "held for at_least_for after finishing");
            }
            JobOutcome::SkippedDone { .. } => {} // at_least_for already over on a slow machine
            other => panic!("right after a fast run: {other:?}"),
        }
    }

    async fn a_runner_that_overruns_its_hold_is_taken_over_and_its_finish_refused(fx) {
        let (slow, next) = (fx.client().await, fx.client().await);
        let at_most = Duration::from_millis(400);
        let options = JobOptions::new(PERIOD, at_most).on_runner_death(OnRunnerDeath::RunAgain);
        let slow_job = slow.job("overrun", options.clone()).unwrap();
        let next_job = next.job("overrun", options).unwrap();
        let tick = tick_view(0, 0);
        let (began_tx, began_rx) = tokio::sync::oneshot::channel();
        let overrunning = tokio::spawn(async move {
            slow_job
                .run_exclusive(tick, |run| async move {
                    assert!(run.is_valid() && run.valid_until() > std::time::Instant::now());
                    assert!(format!("{run:?}").starts_with("JobRun"));
                    began_tx.send(run.token()).unwrap();
                    run.lost().await; // the hold ends while the job still runs
                    assert!(!run.is_valid(), "the hold ended");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                })
                .await
        });
        let first = within(HANDOFF, "the slow run begins", began_rx).await.unwrap();
        // While the hold lasts, the other instance skips and names the runner.
        let skipped = next_job.run_exclusive(tick, |_run| async {}).await.unwrap();
        assert!(
            matches!(&skipped, JobOutcome::SkippedRunning { record: Some(run) } if run.token() == first),
            "{skipped:?}"
        );
        tokio::time::sleep(at_most + Duration::from_millis(50)).await;
        let taken = next_job
            .run_exclusive(tick + Duration::from_millis(1500), |run| async move { run.took_over() })
            .await
            .unwrap();
        let JobOutcome::Ran { token, output: took_over } = taken else {
            panic!("after the hold ended: {taken:?}")
        };
        assert!(token > first);
        assert_eq!(took_over, Some(first));
        let late = within(HANDOFF, "the overrunning job ends", overrunning).await.unwrap();
        match late {
            Err(Error::StaleToken { resource, presented, latest, by, .. }) => {
                assert_eq!((presented, latest, by), (first, token, fencelock::Superseded::TookOver));
                assert_eq!(resource.as_bytes(), next_job.name(), "the refusal names the job");
            }
            other => panic!("the overrun run's finish: {other:?}"),
        }
        let record = next_job.last_tick().await.unwrap().unwrap();
        assert_eq!(record.token(), token);
    }

    async fn a_busy_job_says_for_each_tick_why_it_skips(fx) {
        let (runner, other) = (fx.client().await, fx.client().await);
        let at_least = Duration::from_secs(2);
        let options = JobOptions::new(PERIOD, Duration::from_secs(30)).at_least_for(at_least);
        let job = runner.job("busy", options.clone()).unwrap();
        let asker = other.job("busy", options).unwrap();
        let tick = tick_view(5, 0);
        let (began_tx, began_rx) = tokio::sync::oneshot::channel();
        let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(async move {
            job.run_exclusive(tick, |run| async move {
                began_tx.send(run.token()).unwrap();
                end_rx.await.unwrap();
            })
            .await
            .unwrap()
        });
        let token = within(HANDOFF, "the run begins", began_rx).await.unwrap();
        let skip = |view| {
            let asker = asker.clone();
            async move { asker.run_exclusive(view, |_run| async {}).await.unwrap() }
        };
        // While it runs: the same tick (seen up to just under half a period either way) is
        // running, a tick half a period older is late, a newer tick waits for the runner.
        let half = PERIOD / 2;
        for view in [tick, tick + half - Duration::from_millis(1), tick - half + Duration::from_millis(1)] {
            let outcome = skip(view).await;
            assert!(
                matches!(&outcome, JobOutcome::SkippedRunning { record: Some(run) }
                    if run.token() == token && run.finished().is_none()),
                "{view:?}: {outcome:?}"
            );
        }
        let late = skip(tick - half).await;
        assert!(matches!(&late, JobOutcome::SkippedLate { record } if record.token() == token), "{late:?}");
        let newer = skip(tick + PERIOD).await;
        assert!(matches!(&newer, JobOutcome::SkippedRunning { record: Some(run) } if run.token() == token), "{newer:?}");

        // Finished and kept for at_least_for: the same tick is done, a newer one still waits
        // for the hold (the runner is named, finished).
        end_tx.send(()).unwrap();
        assert!(running.await.unwrap().ran());
        let done = skip(tick + half - Duration::from_millis(1)).await;
        assert!(matches!(&done, JobOutcome::SkippedDone { record: run } if run.token() == token), "{done:?}");
        // Exactly half a period newer is the next tick already: it waits for the hold.
        for view in [tick + half, tick + PERIOD] {
            let held = skip(view).await;
            assert!(
                matches!(&held, JobOutcome::SkippedRunning { record: Some(run) }
                    if run.token() == token && run.finished().is_some()),
                "{view:?}: {held:?}"
            );
        }
    }

    async fn a_cancelled_run_frees_the_job_at_once_and_its_tick_follows_the_policy(fx) {
        let client = fx.client().await;
        let options = JobOptions::new(PERIOD, Duration::from_secs(30));
        let give_up = client.job("cancelled", options.clone()).unwrap();
        let run_again = client
            .job("cancelled", options.on_runner_death(OnRunnerDeath::RunAgain))
            .unwrap();
        let tick = tick_view(0, 0);
        let (began_tx, began_rx) = tokio::sync::oneshot::channel();
        let call = tokio::spawn({
            let job = give_up.clone();
            async move {
                job.run_exclusive(tick, |run| async move {
                    began_tx.send(run.token()).unwrap();
                    std::future::pending::<()>().await;
                })
                .await
            }
        });
        let first = within(HANDOFF, "the run begins", began_rx).await.unwrap();
        call.abort();
        // Dropped mid-job: the lock goes at once (not after 30 s), the record stays running.
        within(HANDOFF, "the cancelled run's lock is released", async {
            while !fx.keys("fencelock:{*}job:cancelled").is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        let abandoned = give_up.run_exclusive(tick, |_run| async {}).await.unwrap();
        assert!(
            matches!(&abandoned, JobOutcome::SkippedAbandoned { record: run } if run.token() == first),
            "{abandoned:?}"
        );
        let rerun = run_again.run_exclusive(tick, |run| async move { run.took_over() }).await;
        assert_eq!(rerun.unwrap().into_output(), Some(Some(first)));
        // Done now, whatever the policy.
        let done = give_up.run_exclusive(tick, |_run| async {}).await.unwrap();
        assert!(matches!(done, JobOutcome::SkippedDone { .. }), "{done:?}");
        let late = run_again.run_exclusive(tick - PERIOD, |_run| async {}).await.unwrap();
        assert!(matches!(late, JobOutcome::SkippedLate { .. }), "{late:?}");
    }

    async fn cancellation_at_any_point_leaves_no_lock_behind(fx) {
        let client = fx.client().await;
        let job = client
            .job("racy", JobOptions::new(PERIOD, Duration::from_secs(30)))
            .unwrap();
        // Cancel after 0..=2.5 ms in 50 µs steps: before the acquire is sent, between the
        // acquire and the begin, inside the job, while finishing.
        for case in 0..50u32 {
            let tick = tick_view(u64::from(case), 0);
            let call = job.run_exclusive(tick, |_run| async {
                tokio::time::sleep(Duration::from_micros(500)).await;
            });
            let _ = tokio::time::timeout(Duration::from_micros(50 * u64::from(case)), call).await;
            within(HANDOFF, "a cancelled run's lock is released", async {
                while !fx.keys("fencelock:{*}job:racy").is_empty() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
            // The record is none, running or done, never a half-written one.
            if let Some(record) = job.last_tick().await.unwrap() {
                assert!(record.tick() <= tick, "case {case}: {record:?}");
            }
        }
        // And the job carries on.
        let outcome = job.run_exclusive(tick_view(100, 0), |_run| async {}).await.unwrap();
        assert!(outcome.ran());
    }
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_leaves_nothing_behind() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let ok = || JobOptions::new(PERIOD, Duration::from_secs(5));
    assert!(client.job("", ok()).unwrap_err().is_invalid_input());
    let long = vec![b'x'; MAX_NAME_LEN + 1];
    assert!(client.job(&long, ok()).unwrap_err().is_invalid_input());
    for bad in [
        JobOptions::new(Duration::ZERO, Duration::from_secs(5)),
        JobOptions::new(PERIOD, Duration::ZERO),
        ok().at_least_for(Duration::from_secs(6)),
        ok().with_retention(Duration::from_secs(1)),
    ] {
        let err = client.job("bad", bad.clone()).unwrap_err();
        assert!(err.is_invalid_input(), "{bad:?}: {err}");
    }
    let job = client.job("bad", ok()).unwrap();
    assert_eq!(job.name(), b"bad");
    let shown = format!("{job:?}");
    assert!(
        shown.starts_with("Job") && shown.contains("\"bad\""),
        "{shown}"
    );
    let before_epoch = UNIX_EPOCH - Duration::from_secs(1);
    let err = job
        .run_exclusive(before_epoch, |_run| async { panic!("must not run") })
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
    assert!(fx.keys("*").is_empty());

    // Foreign data at the tick record: a typed error, the lock released, the data untouched.
    let record_key = {
        job.run_exclusive(SystemTime::now(), |_run| async {})
            .await
            .unwrap();
        let keys: Vec<Vec<u8>> = fx.raw().keys("fencelock:{*}job-tick:bad").unwrap();
        keys.into_iter().next().unwrap()
    };
    let _: () = fx.raw().set(&record_key, "foreign").unwrap();
    let err = job
        .run_exclusive(SystemTime::now(), |_run| async { panic!("must not run") })
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let value: String = fx.raw().get(&record_key).unwrap();
    assert_eq!(value, "foreign");
    within(HANDOFF, "the refused run's lock is released", async {
        while !fx
            .raw()
            .keys::<_, Vec<String>>("fencelock:{*}job:bad")
            .unwrap()
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

// Separate processes: instance processes of this test binary, each with its own clock offset,
// fire twenty ticks; the parent freezes or kills the runner of one tick mid-job.

const CHILD_ENV: &str = "FENCELOCK_JOB_CHILD";
/// The children's job log (fenced) and what each call ended as (raw list).
const CHILD_LOG: &str = "jobs-log";
const CHILD_CALLS: &str = "jobs-calls";
/// Where a run announces its tick before its job's work, so the parent can find the runner.
const CHILD_BEGUN: &str = "jobs-begun";
/// The tick whose runner the parent freezes or kills, and how long that tick's job works.
const TARGET_TICK: u64 = 6;
/// Long enough for the parent to freeze or kill the runner mid-job on a loaded machine.
const TARGET_WORK: Duration = Duration::from_millis(3000);
const CHILD_AT_MOST: Duration = Duration::from_millis(800);
/// Real time between two ticks.
const CHILD_SPACING: Duration = Duration::from_millis(300);

/// One instance process, a no-op unless the parent started this binary as a child. Its env
/// says the server, its instance number (so its clock offset) and when tick 0 fires. For each
/// tick it calls the job; while another instance runs the tick it calls again every 100 ms
/// (a scheduler's catch-up), for up to three holds; each call's outcome goes to a raw list.
#[tokio::test]
async fn job_child_runs_its_schedule() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let spec = Spec::parse(&spec);
    let client = spec.builder().connect().await.unwrap();
    let options = JobOptions::new(PERIOD, CHILD_AT_MOST).on_runner_death(OnRunnerDeath::RunAgain);
    let job = client.job("processes", options).unwrap();
    let log = client.resource(CHILD_LOG).unwrap();
    let report = spec.report.clone();
    let mut raw = redis::Client::open(report.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let instance = spec.instance;
    let offset = crate::common::ticks::OFFSETS_MS[instance];
    let pid = std::process::id();
    for tick in 0..TICKS {
        let fire = UNIX_EPOCH
            + Duration::from_millis(spec.start_ms)
            + CHILD_SPACING * u32::try_from(tick).unwrap();
        if let Ok(wait) = fire.duration_since(SystemTime::now()) {
            tokio::time::sleep(wait + Duration::from_millis(instance as u64 * 7)).await;
        }
        let give_up_at = std::time::Instant::now() + 3 * CHILD_AT_MOST;
        loop {
            let outcome = job
                .run_exclusive(tick_view(tick, offset), |run| {
                    let log = log.clone();
                    let report = report.clone();
                    async move {
                        let mut raw = redis::Client::open(report)
                            .unwrap()
                            .get_connection()
                            .unwrap();
                        let _: () = raw.rpush(CHILD_BEGUN, format!("{tick}:{pid}")).unwrap();
                        let work = if tick == TARGET_TICK && run.took_over().is_none() {
                            TARGET_WORK
                        } else {
                            Duration::from_millis(20)
                        };
                        tokio::time::sleep(work).await;
                        let entry = format!("{tick}:{}", run.token());
                        log.push(run.token(), &[entry.as_bytes()]).await.map(|_| ())
                    }
                })
                .await;
            let label = match &outcome {
                Ok(JobOutcome::Ran { output: Ok(()), .. }) => "ran".to_owned(),
                Ok(JobOutcome::Ran {
                    output: Err(err), ..
                }) => format!("ran-write-refused {err}"),
                Ok(JobOutcome::SkippedRunning { .. }) => "running".to_owned(),
                Ok(JobOutcome::SkippedDone { .. }) => "done".to_owned(),
                Ok(JobOutcome::SkippedLate { .. }) => "late".to_owned(),
                Ok(other) => format!("{other:?}"),
                Err(err) if err.is_stale_token() => "finish-refused".to_owned(),
                Err(err) => format!("error {err}"),
            };
            let _: () = raw
                .rpush(CHILD_CALLS, format!("{tick}:{pid}:{label}"))
                .unwrap();
            let again = matches!(outcome, Ok(JobOutcome::SkippedRunning { .. }));
            if !again || std::time::Instant::now() > give_up_at {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What an instance process is told: its number, when tick 0 fires, where to report, and the
/// deployment to connect to (`standalone URL`, `cluster URL,URL,...`, `sentinel URL,... MASTER`).
struct Spec {
    instance: usize,
    start_ms: u64,
    report: String,
    kind: String,
    urls: Vec<String>,
    master: Option<String>,
}

impl Spec {
    fn parse(text: &str) -> Spec {
        let parts: Vec<&str> = text.split(' ').collect();
        Spec {
            instance: parts[0].parse().unwrap(),
            start_ms: parts[1].parse().unwrap(),
            report: parts[2].to_owned(),
            kind: parts[3].to_owned(),
            urls: parts[4].split(',').map(str::to_owned).collect(),
            master: parts.get(5).map(|m| (*m).to_owned()),
        }
    }

    fn builder(&self) -> fencelock::LockClientBuilder {
        match self.kind.as_str() {
            "standalone" => LockClient::builder(&self.urls[0]),
            "cluster" => LockClient::cluster_builder(self.urls.clone()),
            "sentinel" => {
                LockClient::sentinel_builder(self.urls.clone(), self.master.as_deref().unwrap())
            }
            other => panic!("unknown deployment {other}"),
        }
    }
}

/// The deployment a process test runs on, and how its children reach it.
#[allow(clippy::large_enum_variant)] // one per test
enum Deployment {
    Standalone(RedisServer),
    Cluster(fencelock_testing::RedisCluster),
    Sentinel(fencelock_testing::RedisSentinels),
}

impl Deployment {
    fn start(kind: &str) -> Deployment {
        match kind {
            "standalone" => Deployment::Standalone(RedisServer::start().unwrap()),
            "cluster" => Deployment::Cluster(
                fencelock_testing::RedisCluster::builder()
                    .replicas_per_primary(0)
                    .start()
                    .unwrap(),
            ),
            "sentinel" => {
                Deployment::Sentinel(fencelock_testing::RedisSentinels::start(1).unwrap())
            }
            other => panic!("unknown deployment {other}"),
        }
    }

    /// `kind URLS [MASTER]` for a child's spec.
    fn spec(&self) -> String {
        match self {
            Deployment::Standalone(server) => format!("standalone {}", server.url()),
            Deployment::Cluster(cluster) => format!("cluster {}", cluster.urls().join(",")),
            Deployment::Sentinel(set) => format!(
                "sentinel {} {}",
                set.sentinel_urls().join(","),
                set.master_name()
            ),
        }
    }
}

/// A process test's servers: the deployment under test, and a server of its own where the
/// children report (their calls and begun runs), whatever the deployment.
struct ProcessTest {
    deployment: Deployment,
    report: RedisServer,
}

impl ProcessTest {
    fn start(kind: &str) -> ProcessTest {
        ProcessTest {
            deployment: Deployment::start(kind),
            report: RedisServer::start().unwrap(),
        }
    }

    fn raw(&self) -> redis::Connection {
        self.report.client().get_connection().unwrap()
    }

    async fn client(&self) -> LockClient {
        let spec = Spec::parse(&format!("0 0 - {}", self.deployment.spec()));
        spec.builder().connect().await.unwrap()
    }

    fn calls(&self) -> Vec<String> {
        self.raw().lrange(CHILD_CALLS, 0, -1).unwrap()
    }
}

/// Starts five instance processes, waits for the runner of [`TARGET_TICK`] to begin its work,
/// and does `to_runner` to it; returns the processes and the runner's index.
async fn schedule_with_a_stricken_runner(
    test: &ProcessTest,
    to_runner: impl FnOnce(u32),
) -> (Vec<ChildProcess>, usize) {
    let start_ms = u64::try_from(
        (SystemTime::now() + Duration::from_secs(2))
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let deployment = test.deployment.spec();
    let report = test.report.url();
    let instances: Vec<ChildProcess> = (0..5)
        .map(|i| {
            let spec = format!("{i} {start_ms} {report} {deployment}");
            ChildProcess::start(
                module_path!(),
                "job_child_runs_its_schedule",
                CHILD_ENV,
                &spec,
            )
        })
        .collect();
    let target = format!("{TARGET_TICK}:");
    let runner = within(
        Duration::from_secs(30),
        "the target tick's runner begins",
        async {
            loop {
                let begun: Vec<String> = test.raw().lrange(CHILD_BEGUN, 0, -1).unwrap();
                if let Some(entry) = begun.iter().find(|entry| entry.starts_with(&target)) {
                    return entry[target.len()..].parse::<u32>().unwrap();
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        },
    )
    .await;
    to_runner(runner);
    let index = instances.iter().position(|i| i.pid() == runner).unwrap();
    (instances, index)
}

fn ran_count(calls: &[String]) -> usize {
    calls.iter().filter(|call| call.ends_with(":ran")).count()
}

/// The runner of one tick frozen with SIGSTOP mid-job: another instance takes the tick over
/// after the hold, the thawed runner's write and finish are refused, twenty runs in all.
async fn a_frozen_runner_is_taken_over_and_its_late_writes_refused(kind: &str) {
    let test = ProcessTest::start(kind);
    let (mut instances, frozen) = schedule_with_a_stricken_runner(&test, |pid| {
        send_signal(pid, Signal::Stop).unwrap();
    })
    .await;
    let client = test.client().await;
    let log = client.resource(CHILD_LOG).unwrap();
    within(
        CHILD_AT_MOST + HANDOFF,
        "another instance runs the frozen runner's tick",
        async {
            let target = format!("{TARGET_TICK}:").into_bytes();
            while !log
                .peek_items()
                .await
                .unwrap()
                .iter()
                .any(|e| e.starts_with(&target))
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    send_signal(instances[frozen].pid(), Signal::Cont).unwrap();
    for instance in &mut instances {
        let finished = instance
            .exited(Duration::from_secs(60), "an instance finishes its schedule")
            .await;
        assert!(finished, "an instance failed");
    }
    let calls = test.calls();
    let pid = instances[frozen].pid();
    let thawed: Vec<&String> = calls
        .iter()
        .filter(|call| call.starts_with(&format!("{TARGET_TICK}:{pid}:")))
        .collect();
    assert_eq!(thawed.len(), 1, "{thawed:?}");
    // Its job's write is refused by the fenced log, and so is its finish of the tick record
    // (the job's own error is its output; the finish's refusal is the call's error).
    assert!(
        thawed[0].ends_with(":finish-refused"),
        "the thawed runner's call: {}",
        thawed[0]
    );
    assert_eq!(
        ran_count(&calls),
        usize::try_from(TICKS).unwrap(),
        "{calls:#?}"
    );
    assert_log_has_each_tick_once(&client, CHILD_LOG, TICKS).await;
}

/// The runner of one tick killed with SIGKILL mid-job: another instance runs the tick after
/// the hold, twenty runs in all.
async fn a_killed_runner_leaves_its_tick_to_another_instance(kind: &str) {
    let test = ProcessTest::start(kind);
    let (mut instances, killed) = schedule_with_a_stricken_runner(&test, |pid| {
        send_signal(pid, Signal::Kill).unwrap();
    })
    .await;
    for (i, instance) in instances.iter_mut().enumerate() {
        if i != killed {
            let finished = instance
                .exited(Duration::from_secs(60), "an instance finishes its schedule")
                .await;
            assert!(finished, "an instance failed");
        }
    }
    let calls = test.calls();
    assert_eq!(
        ran_count(&calls),
        usize::try_from(TICKS).unwrap(),
        "{calls:#?}"
    );
    assert_log_has_each_tick_once(&test.client().await, CHILD_LOG, TICKS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_frozen_with_sigstop_is_taken_over_and_its_late_writes_refused() {
    a_frozen_runner_is_taken_over_and_its_late_writes_refused("standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_runner_frozen_with_sigstop_is_taken_over() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "on_a_cluster_a_runner_frozen_with_sigstop_is_taken_over",
    ) {
        return;
    }
    a_frozen_runner_is_taken_over_and_its_late_writes_refused("cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_a_runner_frozen_with_sigstop_is_taken_over() {
    a_frozen_runner_is_taken_over_and_its_late_writes_refused("sentinel").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_with_sigkill_leaves_its_tick_to_another_instance() {
    a_killed_runner_leaves_its_tick_to_another_instance("standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_runner_killed_with_sigkill_leaves_its_tick_to_another_instance() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "on_a_cluster_a_runner_killed_with_sigkill_leaves_its_tick_to_another_instance",
    ) {
        return;
    }
    a_killed_runner_leaves_its_tick_to_another_instance("cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_a_runner_killed_with_sigkill_leaves_its_tick_to_another_instance() {
    a_killed_runner_leaves_its_tick_to_another_instance("sentinel").await;
}

/// The README's scheduler loop as written (`job.ticks()`, then `run_exclusive` with the instant
/// each `next()` returns) on five instances started at random moments within one period: every
/// one of twenty aligned ticks runs exactly once. (Naming the tick `SystemTime::now()` at each
/// wake-up of an interval, the pattern this replaces, runs a tick once per instance as soon as
/// instances start more than half a period apart.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_started_apart_run_each_aligned_tick_once() {
    // Long enough that a whole-process stall under load does not skip a tick for all five
    // instances at once (a tick woken for after the next one passed is skipped by design).
    const PERIOD: Duration = Duration::from_millis(1000);
    const TICKS: u32 = 20;
    let fx = Fixture::start();
    let options = JobOptions::new(PERIOD, PERIOD / 2);
    let probe = fx.client().await.job("aligned", options.clone()).unwrap();
    // The first tick of every instance: each starts within the period before it.
    let first = probe.ticks().at_or_after(SystemTime::now() + 2 * PERIOD);
    let last = first + PERIOD * (TICKS - 1);
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut rng = crate::common::Rng(seed);
    let runs = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut instances = Vec::new();
    for _ in 0..5 {
        let client = fx.client().await;
        let options = options.clone();
        let runs = runs.clone();
        let start = first - PERIOD + Duration::from_millis(1 + rng.below(999));
        instances.push(tokio::spawn(async move {
            tokio::time::sleep(start.duration_since(SystemTime::now()).unwrap_or_default()).await;
            let report = client.job("aligned", options)?;
            let mut ticks = report.ticks();
            loop {
                let tick = ticks.next().await; // the instant this tick was scheduled for
                if tick > last {
                    return Ok::<(), Error>(());
                }
                let runs = &runs;
                report
                    .run_exclusive(tick, |run| async move {
                        runs.lock().push((tick, run.token()));
                    })
                    .await?;
            }
        }));
    }
    for instance in instances {
        // A guard against a hang, far past the last tick.
        within(
            PERIOD * (TICKS + 4) + HANDOFF,
            "an instance's twenty ticks",
            instance,
        )
        .await
        .unwrap()
        .unwrap();
    }
    let mut runs = runs.lock().clone();
    runs.sort();
    let ticks: Vec<SystemTime> = runs.iter().map(|(tick, _)| *tick).collect();
    let expected: Vec<SystemTime> = (0..TICKS).map(|k| first + PERIOD * k).collect();
    assert_eq!(ticks, expected, "seed {seed}: runs {runs:?}");
    assert!(
        runs.windows(2).all(|w| w[0].1 < w[1].1),
        "every run's token is above the one before: {runs:?}"
    );
}

on_topologies! {
    /// A job that returns an error leaves its tick to a retry (the default policy): the next
    /// call for the tick, from another instance, runs it again with a newer token and records
    /// it done. Under `OnFailure::RecordDone` the failed tick counts as done and is not run
    /// again.
    async fn a_failing_job_is_retried_or_recorded_done_by_its_policy(fx) {
        let clients = clients(&fx, 2).await;
        let tick = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let options = JobOptions::new(Duration::from_secs(60), Duration::from_secs(30))
            .at_least_for(Duration::from_secs(20));
        let retried = |client: &LockClient| client.job("export", options.clone()).unwrap();
        let failed = retried(&clients[0])
            .run_fallible(tick, |_run| async { Err::<(), &str>("the warehouse did not answer") })
            .await
            .unwrap();
        let JobOutcome::Ran { token: first, output: Err(_) } = failed else {
            panic!("the failing run: {failed:?}");
        };
        let record = retried(&clients[1]).last_tick().await.unwrap().unwrap();
        assert!(record.failed().is_some() && record.finished().is_none(), "{record:?}");
        // Released at once although at_least_for is 20 s: the retry need not wait.
        let retry = retried(&clients[1])
            .run_fallible(tick, |run| async move { Ok::<_, &str>(run.took_over()) })
            .await
            .unwrap();
        let JobOutcome::Ran { token: second, output: Ok(took_over) } = retry else {
            panic!("the retry: {retry:?}");
        };
        assert!(second > first);
        assert_eq!(took_over, Some(first));
        let again = retried(&clients[0]).run_fallible(tick, |_run| async { Ok::<_, &str>(()) }).await.unwrap();
        assert!(matches!(again, JobOutcome::SkippedRunning { .. } | JobOutcome::SkippedDone { .. }), "{again:?}");

        let recorded = |client: &LockClient| {
            client
                .job("nightly", options.clone().on_failure(fencelock::OnFailure::RecordDone))
                .unwrap()
        };
        let failed = recorded(&clients[0])
            .run_fallible(tick, |_run| async { Err::<(), &str>("failed for good") })
            .await
            .unwrap();
        assert!(matches!(failed, JobOutcome::Ran { output: Err(_), .. }), "{failed:?}");
        let record = recorded(&clients[1]).last_tick().await.unwrap().unwrap();
        assert!(record.finished().is_some() && record.failed().is_none(), "{record:?}");
    }
}
