//! The workload harness: every workload next to its physical limit and the peers,
//! measured in the same run, reported as ratios.
//!
//! ```text
//! cargo bench --bench workloads                # full run, ~3 minutes on 2 cores
//! cargo bench --bench workloads -- --smoke     # every workload tiny; asserts invariants only
//! cargo bench --bench workloads -- w3 w4       # a subset (w1..w12, callgrind)
//! cargo bench --bench workloads -- --callgrind # instructions per cycle only (needs valgrind)
//! ```
//!
//! Run without `--bench` (that is, by `cargo test --all-targets`) it does the smoke run.
//! The full run prints the markdown tables that `BENCHMARKS.md` is copied from, writes them to
//! `benches/results/results.md`, and draws the handoff CDFs to `benches/results/handoff.png`.
//! W4 re-executes this binary as child processes (`--child w4 ...`), and the callgrind
//! section runs it under valgrind (`--cycles ...`).
// A bench is a binary whose helpers are `pub` for the modules that share them.
#![allow(unreachable_pub)]

mod common;

// Each workload and each shared part in a file of its own under `workloads/`.
#[path = "workloads/admin.rs"]
mod admin;
#[path = "workloads/callgrind.rs"]
mod callgrind;
#[path = "workloads/contention.rs"]
mod contention;
#[path = "workloads/heap.rs"]
mod heap;
#[path = "workloads/measure.rs"]
mod measure;
#[path = "workloads/plot.rs"]
mod plot;
#[path = "workloads/stats.rs"]
mod stats;
#[path = "workloads/w1.rs"]
mod w1;
#[path = "workloads/w10.rs"]
mod w10;
#[path = "workloads/w11.rs"]
mod w11;
#[path = "workloads/w12.rs"]
mod w12;
#[path = "workloads/w2.rs"]
mod w2;
#[path = "workloads/w3.rs"]
mod w3;
#[path = "workloads/w4.rs"]
mod w4;
#[path = "workloads/w4_child.rs"]
mod w4_child;
#[path = "workloads/w5.rs"]
mod w5;
#[path = "workloads/w6.rs"]
mod w6;
#[path = "workloads/w7.rs"]
mod w7;
#[path = "workloads/w8.rs"]
mod w8;
#[path = "workloads/w9.rs"]
mod w9;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use callgrind::{callgrind_section, cycles_main, have_valgrind, CYCLES_FLAG};
use plot::{plot, Panel};
use stats::yes_no;
use w4_child::{child_main, CHILD_FLAG};
use {
    w1::w1, w10::w10, w11::w11, w12::w12, w2::w2, w3::w3, w4::w4, w5::w5, w6::w6, w7::w7, w8::w8,
    w9::w9,
};

// ---------------------------------------------------------------------------------------------
// Configuration.

struct Cfg {
    smoke: bool,
    only: Vec<String>,
    out_dir: PathBuf,
}

impl Cfg {
    fn runs(&self, workload: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|w| w == workload)
    }

    /// `full` in a real run, `smoke` in a smoke run.
    fn pick<T>(&self, full: T, smoke: T) -> T {
        if self.smoke {
            smoke
        } else {
            full
        }
    }

    fn secs(&self, full: f64, smoke: f64) -> Duration {
        Duration::from_secs_f64(self.pick(full, smoke))
    }
}

/// One target and whether this run met it.
struct Target {
    id: &'static str,
    what: String,
    measured: String,
    met: bool,
}

#[derive(Default)]
struct Report {
    sections: Vec<String>,
    targets: Vec<Target>,
    /// Handoff latencies per workload panel, for the plot.
    cdfs: Vec<Panel>,
}

impl Report {
    fn section(&mut self, text: String) {
        println!("{text}");
        self.sections.push(text);
    }

    fn target(&mut self, id: &'static str, what: impl Into<String>, measured: String, met: bool) {
        self.targets.push(Target {
            id,
            what: what.into(),
            measured,
            met,
        });
    }
}

// ---------------------------------------------------------------------------------------------

fn machine(server_version: &str) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let commit = Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "describe",
            "--always",
            "--dirty",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let rustc = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!(
        "## Machine\n\n\
         - cores (nproc): {cores}\n\
         - CPU: {cpu}\n\
         - kernel: {}\n\
         - server: {server_version}\n\
         - {rustc}, release profile (`cargo bench`)\n\
         - fencelock at commit {commit}\n\
         - load average at start: {}\n",
        kernel.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some(CHILD_FLAG) => return child_main(&args[1..]),
        Some(CYCLES_FLAG) => return cycles_main(&args[1..]),
        _ => {}
    }
    if args.iter().any(|a| a == "--callgrind") {
        println!("{}", callgrind_section().0);
        return;
    }
    // `cargo bench` passes --bench; `cargo test --all-targets` passes nothing: smoke then.
    let smoke = args.iter().any(|a| a == "--smoke") || !args.iter().any(|a| a == "--bench");
    let only: Vec<String> = args
        .iter()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .cloned()
        .collect();
    let out_dir = if smoke {
        std::env::temp_dir().join(format!("fencelock-bench-smoke-{}", std::process::id()))
    } else if let Some(dir) = std::env::var_os("FENCELOCK_BENCH_RESULTS") {
        // Another server's run (BENCHMARKS.md: FENCELOCK_REDIS_SERVER and this variable)
        // keeps the main results as they are. A relative path is the repository's, as the
        // documented commands give it.
        Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results")
    };
    std::fs::create_dir_all(&out_dir).expect("results directory");
    let cfg = Cfg {
        smoke,
        only,
        out_dir,
    };

    let rt = common::runtime();
    let mut report = Report::default();
    let started = Instant::now();
    rt.block_on(async {
        // The flavour and release as the binary names them (Valkey's INFO says 7.2.4).
        let version = fencelock_testing::ServerBinary::current()
            .expect("the server binary")
            .to_string();
        let mode = if cfg.smoke {
            " (SMOKE: tiny sizes, numbers meaningless)"
        } else {
            ""
        };
        report.section(format!(
            "# fencelock workloads{mode}\n\n{}",
            machine(&version)
        ));
        type Workload = for<'a> fn(
            &'a Cfg,
            &'a mut Report,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;
        let workloads: [(&str, Workload); 12] = [
            ("w1", |c, r| Box::pin(w1(c, r))),
            ("w2", |c, r| Box::pin(w2(c, r))),
            ("w3", |c, r| Box::pin(w3(c, r))),
            ("w4", |c, r| Box::pin(w4(c, r))),
            ("w5", |c, r| Box::pin(w5(c, r))),
            ("w6", |c, r| Box::pin(w6(c, r))),
            ("w7", |c, r| Box::pin(w7(c, r))),
            ("w8", |c, r| Box::pin(w8(c, r))),
            ("w9", |c, r| Box::pin(w9(c, r))),
            ("w10", |c, r| Box::pin(w10(c, r))),
            ("w11", |c, r| Box::pin(w11(c, r))),
            ("w12", |c, r| Box::pin(w12(c, r))),
        ];
        for (name, run) in workloads {
            if cfg.runs(name) {
                let t = Instant::now();
                run(&cfg, &mut report).await;
                eprintln!("[{name} done in {:.1} s]", t.elapsed().as_secs_f64());
            }
        }
    });
    drop(rt);
    if !cfg.smoke && cfg.runs("callgrind") {
        if have_valgrind() {
            let t = Instant::now();
            let (text, vs_limit) = callgrind_section();
            report.section(text);
            report.target(
                "C-callgrind",
                "cost: server instructions per uncontended cycle ≤ 1.3 × the limit's",
                format!("{vs_limit:.2}×"),
                vs_limit <= 1.3,
            );
            eprintln!("[callgrind done in {:.1} s]", t.elapsed().as_secs_f64());
        } else {
            report.section("### Instructions per cycle: skipped (valgrind not installed)\n".into());
        }
    }

    let mut summary = format!(
        "## Targets (ratios against the limit measured in the same run)\n\n\
         Run took {:.0} s; load average at the end: {}.\n\n\
         | target | what | measured | |\n| --- | --- | ---: | --- |\n",
        started.elapsed().as_secs_f64(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    for t in &report.targets {
        let _ = writeln!(
            summary,
            "| {} | {} | {} | {} |",
            t.id,
            t.what,
            t.measured,
            yes_no(t.met)
        );
    }
    report.section(summary);

    if !report.cdfs.is_empty() {
        let png = cfg.out_dir.join("handoff.png");
        match plot(&png, &report.cdfs) {
            Ok(()) if cfg.smoke => {}
            Ok(()) => eprintln!("plot: {}", png.display()),
            Err(err) => panic!("plot failed: {err}"),
        }
    }
    let md = cfg.out_dir.join("results.md");
    std::fs::write(&md, report.sections.join("\n")).expect("write results");
    if cfg.smoke {
        // The smoke run only proves that everything runs (the plot included); its numbers are
        // meaningless, so nothing is left behind.
        let _ = std::fs::remove_dir_all(&cfg.out_dir);
        eprintln!(
            "smoke run passed in {:.0} s: every workload ran and its invariants held",
            started.elapsed().as_secs_f64()
        );
    } else {
        eprintln!(
            "results: {} ({:.0} s)",
            md.display(),
            started.elapsed().as_secs_f64()
        );
    }
}
