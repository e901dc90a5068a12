//! Statistics and formatting for the tables: medians, percentiles, µs, clocks, the peers' note.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

// ---------------------------------------------------------------------------------------------
// Small helpers: statistics, formatting, Redis administration, CPU clocks.

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub fn median(values: &[f64]) -> f64 {
    percentile(values, 50.0)
}

/// Nearest-rank percentile of unsorted values (NaN for none).
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

pub fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NAN, f64::max)
}

/// A duration in µs, as µs or ms, for tables.
pub fn fmt_us(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.2} ms", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0} µs")
    } else {
        format!("{v:.1} µs")
    }
}

pub fn yes_no(met: bool) -> &'static str {
    if met {
        "**met**"
    } else {
        "**missed**"
    }
}

pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

/// CPU time of this process: the sum of its threads' on-CPU time (ns resolution).
pub fn process_cpu() -> Duration {
    let mut total = 0u64;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
                total += stat
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Duration::from_nanos(total)
}

/// Peers lack these; the tables say so next to their numbers.
pub const PEER_NOTE: &str = "\\* peers: no re-entry, no fencing tokens (and no cancel safety or \
                          idempotent retries).";

/// What the Redisson row is, and what it lacks against fencelock.
pub const REDISSON_NOTE: &str = "† the shape of Redisson's fenced lock: its two scripts \
                              (a hash of holder -> re-entry count, a token from INCR, an unlock \
                              latch per release request) called raw like ours, so it has \
                              re-entry and fencing tokens but no clock floor under its tokens, \
                              no replay of a re-sent acquisition and no type checks; a raw \
                              baseline, it does not wait.";
