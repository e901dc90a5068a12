//! The doctor: what it checks on default, misconfigured, restricted, old and cluster servers.

use super::*;

#[tokio::test]
async fn doctor_on_a_default_test_server_warns_about_persistence_only() {
    let fx = Fixture::start();
    // No persistence weakens a guarantee (WARN) but breaks no lock: `doctor && deploy` passes.
    let run = fencelock(&fx.server.url(), &["doctor", "--pings", "5"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let strict = fencelock(&fx.server.url(), &["doctor", "--pings", "5", "--strict"]).await;
    assert_eq!(strict.code, 1, "--strict fails on a WARN: {strict:?}");
    for name in [
        "version",
        "protocol",
        "maxmemory-policy",
        "persistence",
        "replication",
        "cluster",
        "latency",
        "clock",
    ] {
        assert!(
            run.stdout
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(name)),
            "no {name} check: {run:?}"
        );
    }
    assert!(run.stdout.contains("WARN persistence"), "{run:?}");
    assert!(
        run.stdout.contains("fix: CONFIG SET appendonly yes"),
        "{run:?}"
    );
    assert!(run.stdout.contains("OK   maxmemory-policy"), "{run:?}");
    assert!(run.stdout.contains("OK   replication"), "{run:?}");
    assert!(run.stdout.contains("over 5 PINGs"), "{run:?}");
    assert!(run.stdout.ends_with("overall: WARN\n"), "{run:?}");
}

/// The doctor's verdicts by check name, from `--json`.
fn verdicts(run: &Run) -> std::collections::HashMap<String, String> {
    json(&run.stdout)["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn doctor_warns_about_an_eviction_policy_that_picks_held_locks() {
    let server = RedisServer::builder()
        .persistence(true)
        .config("maxmemory-policy", "volatile-lru")
        .start()
        .unwrap();
    let run = fencelock(&server.url(), &["doctor"]).await;
    assert_eq!(run.code, 0, "a WARN alone passes: {run:?}");
    assert!(
        run.stdout
            .contains("WARN maxmemory-policy volatile-lru evicts keys with a TTL"),
        "{run:?}"
    );
    assert!(
        run.stdout
            .contains("fix: CONFIG SET maxmemory-policy noeviction"),
        "{run:?}"
    );
    assert!(run.stdout.contains("OK   persistence"), "{run:?}");

    let machine = fencelock(&server.url(), &["doctor", "--json", "--strict"]).await;
    assert_eq!(machine.code, 1, "{machine:?}");
    let verdicts = verdicts(&machine);
    assert_eq!(verdicts["maxmemory-policy"], "WARN");
    assert_eq!(verdicts["persistence"], "OK");
    assert_eq!(json(&machine.stdout)["status"], "WARN");
}

#[tokio::test]
async fn doctor_passes_a_well_configured_server_and_fails_a_replica() {
    let primary = RedisServer::builder().persistence(true).start().unwrap();
    let run = fencelock(&primary.url(), &["doctor", "--json"]).await;
    let verdicts_primary = verdicts(&run);
    for (name, status) in &verdicts_primary {
        // Latency is the machine's business; everything else is configuration.
        if name != "latency" {
            assert_eq!(status, "OK", "{name}: {run:?}");
        }
    }
    assert_eq!(run.code, 0, "{run:?}");

    let replica = RedisServer::builder()
        .persistence(true)
        .replica_of(primary.addr())
        .start()
        .unwrap();
    let run = fencelock(&replica.url(), &["doctor"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stdout.contains("FAIL replication"), "{run:?}");
    assert!(run.stdout.contains("is a replica of 127.0.0.1:"), "{run:?}");
    assert!(run.stdout.ends_with("overall: FAIL\n"), "{run:?}");

    // With the replica attached the primary warns about asynchronous replication.
    let mut attached = false;
    for _ in 0..200 {
        let run = fencelock(&primary.url(), &["doctor", "--json"]).await;
        if verdicts(&run)["replication"] == "WARN" {
            attached = true;
            assert!(run.stdout.contains("min-replicas-to-write 1"), "{run:?}");
            break;
        }
    }
    assert!(attached, "the primary never reported its replica");
}

#[tokio::test]
async fn doctor_says_which_checks_a_restricted_user_could_not_run() {
    // A typical application user: everything but CONFIG.
    let server = RedisServer::builder()
        .persistence(true)
        .acl_lines([
            "user default off",
            "user app on >secret ~* &* +@all -config",
        ])
        .credentials("app", "secret")
        .start()
        .unwrap();
    let run = fencelock(&server.url(), &["doctor", "--json"]).await;
    assert_eq!(
        run.code, 0,
        "unchecked settings are WARNs, not FAILs: {run:?}"
    );
    let doc = json(&run.stdout);
    let checks = doc["checks"].as_array().unwrap();
    let eviction = checks
        .iter()
        .find(|c| c["name"] == "maxmemory-policy")
        .unwrap();
    assert_eq!(eviction["status"], "WARN");
    assert!(
        eviction["finding"]
            .as_str()
            .unwrap()
            .starts_with("could not be checked: "),
        "{eviction}"
    );
    // The checks that need no CONFIG still ran.
    let verdicts = verdicts(&run);
    assert_eq!(verdicts["version"], "OK");
    assert_eq!(verdicts["cluster"], "OK");
}

#[tokio::test]
async fn a_server_without_hello_is_diagnosed_instead_of_refused() {
    // What Redis 5 answers to HELLO, on the Redis we have.
    let server = RedisServer::builder()
        .persistence(true)
        .config("rename-command", "HELLO \"\"")
        .start()
        .unwrap();
    let run = fencelock(&server.url(), &["doctor"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(
        run.stdout
            .contains("FAIL protocol         the server refused HELLO 3"),
        "{run:?}"
    );
    let run = fencelock(&server.url(), &["list"]).await;
    assert_eq!(run.code, 0, "inspection still works over RESP2: {run:?}");
    let run = fencelock(&server.url(), &["watch", "orders"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("watch needs RESP3"), "{run:?}");
}

#[tokio::test]
async fn doctor_on_a_cluster_node_warns_that_clients_need_the_cluster_builder() {
    let cluster = fencelock_testing::RedisCluster::builder()
        .replicas_per_primary(0)
        .start()
        .unwrap();
    let url = cluster.urls().remove(0);
    let run = fencelock(&url, &["doctor", "--json"]).await;
    let verdicts = verdicts(&run);
    assert_eq!(verdicts["cluster"], "WARN", "{run:?}");
    assert!(run.stdout.contains("cluster_builder"), "{run:?}");
    assert_eq!(run.code, 0, "a WARN alone passes: {run:?}");
    let strict = fencelock(&url, &["doctor", "--strict"]).await;
    assert_eq!(strict.code, 1, "{strict:?}");
}
