//! W4's child process: this binary re-executed with `--child w4 ...`, competing for the key
//! and printing one line per acquisition.

use std::fmt::Write as _;
use std::time::Duration;

use tokio::task::JoinSet;

use crate::common::{self, Contenders, Kind};
use crate::stats::now_ns;

pub const CHILD_FLAG: &str = "--child";

/// One acquisition as a child saw it: wall-clock ns (comparable across processes).
pub struct Record {
    pub called: u64,
    pub acquired: u64,
    pub releasing: u64,
    pub token: u64,
    pub process: usize,
}

/// `--child w4 <kind> <url> <tasks>`: connect, print `READY`, read `GO <start> <end>` (unix
/// ns, the same for every child) from stdin, compete from start to end, then print one
/// `R called acquired releasing token` line per acquisition.
pub fn child_main(args: &[String]) {
    let [_, workload, kind, url, tasks] = args else {
        panic!("child arguments: {args:?}");
    };
    assert_eq!(workload, "w4");
    let kind = Kind::from_slug(kind).expect("kind");
    let tasks: usize = tasks.parse().expect("tasks");
    let rt = common::runtime();
    let records = rt.block_on(async {
        let contenders = Contenders::connect(url).await;
        // Connected (rslock connects lazily: make it connect now too).
        let warm = contenders.locker(kind, "w4-warm-up");
        warm.cycle().await;
        println!("READY");
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).expect("GO line");
        let times: Vec<u64> = go
            .strip_prefix("GO ")
            .expect("GO line")
            .split_whitespace()
            .map(|t| t.parse().expect("time"))
            .collect();
        let [start, end] = times[..] else {
            panic!("GO line: {go:?}")
        };
        let wait = start.saturating_sub(now_ns());
        tokio::time::sleep(Duration::from_nanos(wait)).await;
        let mut set = JoinSet::new();
        for _ in 0..tasks {
            let locker = contenders.locker(kind, "w4");
            set.spawn(async move {
                let mut records = Vec::new();
                let mut counter = 0u64;
                while now_ns() < end {
                    let called = now_ns();
                    let held = locker.acquire().await;
                    let acquired = now_ns();
                    counter += 1;
                    let token = held.token().unwrap_or(0);
                    let releasing = now_ns();
                    records.push((called, acquired, releasing, token));
                    locker.release(held).await;
                }
                assert_eq!(counter as usize, records.len());
                records
            });
        }
        let mut all = Vec::new();
        while let Some(joined) = set.join_next().await {
            all.extend(joined.expect("child task"));
        }
        all
    });
    let mut out = String::new();
    for (called, acquired, releasing, token) in records {
        let _ = writeln!(out, "R {called} {acquired} {releasing} {token}");
    }
    print!("{out}");
}
