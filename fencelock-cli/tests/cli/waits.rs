//! Who waits for whom: `waits` lists the waiting acquisitions and the wait-for cycles among
//! them, and the doctor fails on a cycle older than `--deadlock-after`.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_and_the_doctor_report_a_possible_deadlock() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let quiet = fencelock(&url, &["waits"]).await;
    assert_eq!(quiet.code, 0, "{quiet:?}");
    assert!(quiet.stdout.contains("nobody waits"), "{quiet:?}");

    // Two clients nesting A, B and B, A: both outer locks taken before either nests.
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let mut tasks = Vec::new();
    for (name, outer, inner) in [("payments-1", "A", "B"), ("refunds-1", "B", "A")] {
        let client = LockClient::builder(&url)
            .client_name(name)
            .connect()
            .await
            .unwrap();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let label = format!("req-{name}");
            let lock = client.lock(outer).unwrap().with_label(&label).unwrap();
            let _outer = lock.acquire().await.unwrap();
            barrier.wait().await;
            let inner = client.lock(inner).unwrap().with_label(&label).unwrap();
            let _ = inner.acquire().await;
        }));
    }
    // Waits are recorded once they lasted a second: wait for both records to be a second old
    // (the admin API's view of the same records) before asking the tool.
    let admin = fencelock::admin::Admin::connect(&url).await.unwrap();
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        while admin
            .possible_deadlocks(Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(found.is_ok(), "no possible deadlock reported within 20 s");

    let waits = fencelock(&url, &["waits", "--deadlock-after", "1s"]).await;
    assert_eq!(waits.code, 0, "{waits:?}");
    let lines: Vec<&str> = waits.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "two waits and one cycle: {waits:?}");
    // Locks are named as `list` names them: their name alone, never their key's `lock:`.
    assert!(
        !waits.stdout.contains("lock:A") && !waits.stdout.contains("lock:B"),
        "{waits:?}"
    );
    for line in &lines[..2] {
        let (named, held) = match line.contains("payments-1") {
            true => ("waits for B since ", "holding A"),
            false => ("waits for A since ", "holding B"),
        };
        assert!(line.contains(named) && line.ends_with(held), "{waits:?}");
    }
    assert!(
        lines[2].contains(" waits for A held by ") && lines[2].contains(" waits for B held by "),
        "{waits:?}"
    );
    assert!(
        lines[2].starts_with("possible deadlock: ")
            && lines[2].contains("payments-1")
            && lines[2].contains("refunds-1")
            && lines[2].contains("label req-payments-1"),
        "{waits:?}"
    );
    let json = json(
        &fencelock(&url, &["waits", "--json", "--deadlock-after", "1s"])
            .await
            .stdout,
    );
    assert_eq!(json["waits"].as_array().map(Vec::len), Some(2), "{json}");
    assert_eq!(
        json["possible_deadlocks"].as_array().map(Vec::len),
        Some(1),
        "{json}"
    );
    let wait = &json["possible_deadlocks"][0]["waits"][0];
    assert!(wait["waited_ms"].as_u64().unwrap() >= 1000, "{json}");
    assert_eq!(wait["holds"].as_array().map(Vec::len), Some(1), "{json}");

    let doctor = fencelock(&url, &["doctor", "--pings", "1", "--deadlock-after", "1s"]).await;
    assert_eq!(doctor.code, 5, "{doctor:?}");
    assert!(doctor.stdout.contains("FAIL deadlock"), "{doctor:?}");
    let patient = fencelock(&url, &["doctor", "--pings", "1"]).await;
    assert!(
        patient
            .stdout
            .contains("OK   deadlock         no wait-for cycle"),
        "the default waits 30 s: {patient:?}"
    );
    // `waits` takes the doctor's default: the same young cycle is not reported yet, its waits
    // are.
    let young = fencelock(&url, &["waits"]).await;
    assert_eq!(young.code, 0, "{young:?}");
    assert_eq!(
        young.stdout.lines().count(),
        2,
        "the default waits 30 s: {young:?}"
    );
    assert!(!young.stdout.contains("possible deadlock"), "{young:?}");
    for task in tasks {
        task.abort();
    }
}

/// `waits` and `doctor` report a cycle after the same time unless told otherwise.
#[tokio::test]
async fn waits_and_the_doctor_share_one_deadlock_threshold() {
    for cmd in ["waits", "doctor"] {
        let help = finish(command(&[cmd, "--help"]).spawn().unwrap()).await;
        // The flag's own lines: up to the next option.
        let after = help.stdout.split("--deadlock-after <DURATION>").nth(1);
        let own = after.unwrap_or("").lines();
        let flag: String = own
            .take_while(|l| !l.trim_start().starts_with('-'))
            .collect();
        assert!(flag.contains("[default: 30s]"), "{cmd}: {help:?}");
    }
}
