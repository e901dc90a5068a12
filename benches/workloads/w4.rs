//! W4: 4 processes × 4 tasks contending for one key; the parent spawns the children and
//! analyses their acquisitions.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::admin::Admin;
use crate::common::{self, Contenders, Kind};
use crate::contention::{cdf_series, contended_table, Contended};
use crate::measure::{per_unit, raw_rtt};
use crate::stats::{fmt_us, now_ns, percentile, us, PEER_NOTE};
use crate::w4_child::{Record, CHILD_FLAG};
use crate::{Cfg, Report};

// ---------------------------------------------------------------------------------------------
// W4: 4 processes x 4 tasks on one key. The parent re-executes this binary as children.

pub async fn w4(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let mut admin = Admin::new(&server).await;
    let (processes, tasks) = (4, 4);
    let exe = std::env::current_exe().expect("current exe");
    let mut runs = Vec::new();
    let mut windows = Vec::new();
    let mut starvation = Vec::new();
    for kind in [Kind::Ours, Kind::OursFair, Kind::Rslock, Kind::Distkit] {
        let rtt_cycles = cfg.pick(300, 10);
        let rtt_before = raw_rtt(&contenders.limit, rtt_cycles).await;
        let duration = cfg.secs(5.0, 0.5);
        let url = server.url();
        let mut stats_conn = server.client().get_connection().expect("connection");
        let exe = exe.clone();
        let records = tokio::task::spawn_blocking(move || {
            let mut children: Vec<_> = (0..processes)
                .map(|_| {
                    Command::new(&exe)
                        .args([CHILD_FLAG, "w4", kind.slug(), &url, &tasks.to_string()])
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .spawn()
                        .expect("spawn child")
                })
                .collect();
            // Every child has connected; they start and stop together (wall clock).
            let mut outputs = Vec::new();
            for child in &mut children {
                let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
                let mut ready = String::new();
                stdout.read_line(&mut ready).expect("READY");
                assert_eq!(ready.trim(), "READY", "W4 child did not start");
                outputs.push(stdout);
            }
            let () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query(&mut stats_conn)
                .expect("CONFIG RESETSTAT");
            let start = now_ns() + 50_000_000;
            let go = format!("GO {start} {}\n", start + duration.as_nanos() as u64);
            for child in &mut children {
                let mut stdin = child.stdin.take().expect("stdin");
                stdin.write_all(go.as_bytes()).expect("GO");
            }
            let mut records = Vec::new();
            for (process, (mut child, stdout)) in children.into_iter().zip(outputs).enumerate() {
                for line in stdout.lines() {
                    let line = line.expect("child output");
                    let fields: Vec<u64> = line
                        .strip_prefix("R ")
                        .map(|rest| rest.split(' ').map(|f| f.parse().expect("field")).collect())
                        .unwrap_or_default();
                    if let [called, acquired, releasing, token] = fields[..] {
                        records.push(Record {
                            called,
                            acquired,
                            releasing,
                            token,
                            process,
                        });
                    }
                }
                assert!(child.wait().expect("child").success(), "W4 child failed");
            }
            records
        })
        .await
        .expect("collect children");
        let counts = admin.round_trips(kind).await;
        let rtt_after = raw_rtt(&contenders.limit, rtt_cycles).await;

        let mut records = records;
        records.sort_by_key(|r| r.acquired);
        assert!(!records.is_empty(), "W4 {kind:?}: no acquisition");
        for pair in records.windows(2) {
            assert!(
                pair[1].acquired > pair[0].releasing,
                "W4 {kind:?}: holders overlapped (processes {} and {})",
                pair[0].process,
                pair[1].process
            );
            if kind.is_ours() {
                assert!(
                    pair[1].token > pair[0].token,
                    "W4: tokens not increasing in grant order"
                );
            }
        }
        for p in 0..processes {
            assert!(
                records.iter().any(|r| r.process == p),
                "W4 {kind:?}: process {p} never acquired"
            );
        }
        // Analyse only the window in which every process competed: a child that started late
        // (slow exec or connect on a loaded machine) or stopped early would otherwise show up as
        // another process' long streak.
        let from = (0..processes)
            .filter_map(|p| {
                records
                    .iter()
                    .filter(|r| r.process == p)
                    .map(|r| r.called)
                    .min()
            })
            .max()
            .unwrap_or(0);
        let to = (0..processes)
            .filter_map(|p| {
                records
                    .iter()
                    .filter(|r| r.process == p)
                    .map(|r| r.releasing)
                    .max()
            })
            .min()
            .unwrap_or(0);
        let all = records.len();
        records.retain(|r| r.called >= from && r.releasing <= to);
        // Who got the lock while the longest waiter waited.
        let longest = records
            .iter()
            .max_by_key(|r| r.acquired - r.called)
            .expect("records");
        let mut during = vec![0usize; processes];
        for r in &records {
            if r.acquired > longest.called && r.acquired < longest.acquired {
                during[r.process] += 1;
            }
        }
        starvation.push(format!(
            "{}: the longest wait ({}, a task of process {}) saw {} acquisitions by processes \
             0–3 while it waited",
            kind.label(),
            fmt_us((longest.acquired - longest.called) as f64 / 1000.0),
            longest.process,
            during
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" / ")
        ));
        windows.push((records.len(), all));
        let first = records.first().map_or(0, |r| r.called);
        let last = records.last().map_or(0, |r| r.releasing);
        runs.push(Contended {
            kind,
            acquisitions: records.len() as u64,
            elapsed: Duration::from_nanos(last.saturating_sub(first)),
            handoffs: records
                .windows(2)
                .map(|p| (p[1].acquired - p[0].releasing) as f64 / 1000.0)
                .collect(),
            cross: records
                .windows(2)
                .filter(|p| p[0].process != p[1].process)
                .map(|p| (p[1].acquired - p[0].releasing) as f64 / 1000.0)
                .collect(),
            waits: records
                .iter()
                .map(|r| (r.acquired - r.called) as f64 / 1000.0)
                .collect(),
            round_trips: per_unit(&counts, records.len() as f64).1,
            owners: records.iter().map(|r| r.process).collect(),
            rtt: (rtt_before + rtt_after) / 2,
        });
    }
    assert!(
        admin.scan("fencelock:{*}lock:*").await.is_empty(),
        "W4: a lock was left held"
    );

    let mut text = contended_table(
        "W4: 4 processes × 4 tasks, one key (this binary re-executed as children)",
        "process",
        &runs,
    );
    let _ = writeln!(
        text,
        "\nTimestamps are wall-clock (CLOCK_REALTIME, shared by the processes); the holder's \
         interval [acquired, release started] of consecutive acquisitions never overlapped, and \
         fencelock's tokens increased in grant order. \"fencelock (fair)\" is the same library \
         with `fair_handoff` (grace {} ms). Five processes (4 children + the \
         redis-server) share 2 cores. Statistics cover the window in which all four processes \
         competed ({}).\n",
        common::FAIR_GRACE.as_millis(),
        runs.iter()
            .zip(&windows)
            .map(|(r, (kept, all))| format!("{}: {kept} of {all} acquisitions", r.kind.label()))
            .collect::<Vec<_>>()
            .join("; ")
    );
    for line in &starvation {
        let _ = writeln!(text, "- {line}");
    }
    let _ = writeln!(text, "\n{PEER_NOTE}\n");
    report.section(text);
    let ours = &runs[0];
    let p50 = ours.in_rtt(percentile(&ours.handoffs, 50.0));
    report.target(
        "W4a",
        "handoff p50 ≤ 4 raw RTT",
        format!("{p50:.1} RTT"),
        p50 <= 4.0,
    );
    report.target(
        "W4b",
        "max wait < 10 × mean wait",
        format!("{:.1}×", ours.wait_ratio()),
        ours.wait_ratio() < 10.0,
    );
    report.target(
        "C-W4",
        "cost: ≥ 1.0 acquisitions per two raw RTT, default mode",
        format!("{:.2}", ours.per_two_rtt()),
        ours.per_two_rtt() >= 1.0,
    );
    let fair = runs
        .iter()
        .find(|r| r.kind == Kind::OursFair)
        .expect("fair run");
    report.target(
        "W4b fair",
        "max wait < 10 × mean wait, with `fair_handoff` (opt-in)",
        format!("{:.1}×", fair.wait_ratio()),
        fair.wait_ratio() < 10.0,
    );
    report.cdfs.push((
        "W4: 4 processes x 4 tasks".into(),
        us(ours.rtt),
        cdf_series(&runs, "process"),
    ));
}
