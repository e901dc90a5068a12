//! The result shape W3 and W4 share (one contended key), its table and its plot series.

use std::fmt::Write as _;
use std::time::Duration;

use crate::common::Kind;
use crate::plot::Series;
use crate::stats::{fmt_us, max, mean, percentile, us};

// ---------------------------------------------------------------------------------------------
// W3 and W4: contention on one key. Shared result shape.

/// What one contended run produced.
pub struct Contended {
    pub kind: Kind,
    pub acquisitions: u64,
    pub elapsed: Duration,
    /// Release started by one holder → acquire returned to the next, µs.
    pub handoffs: Vec<f64>,
    /// The handoffs whose next holder was another task (W3) or process (W4).
    pub cross: Vec<f64>,
    /// Acquire called → returned, µs.
    pub waits: Vec<f64>,
    /// Round trips per acquisition, with the breakdown by command.
    pub round_trips: String,
    /// Who held the lock, in grant order (task in W3, process in W4).
    pub owners: Vec<usize>,
    pub rtt: Duration,
}

impl Contended {
    fn rate(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64()
    }

    pub fn per_two_rtt(&self) -> f64 {
        self.rate() * 2.0 * self.rtt.as_secs_f64()
    }

    pub fn in_rtt(&self, v: f64) -> f64 {
        v / us(self.rtt)
    }

    pub fn wait_ratio(&self) -> f64 {
        max(&self.waits) / mean(&self.waits)
    }

    /// Fraction of handoffs that went back to the same owner (task or process).
    fn same_owner(&self) -> f64 {
        let same = self.owners.windows(2).filter(|w| w[0] == w[1]).count();
        same as f64 / self.owners.len().saturating_sub(1).max(1) as f64
    }

    /// The most consecutive acquisitions by one owner.
    fn longest_streak(&self) -> usize {
        let (mut best, mut run) = (0, 0);
        for (i, owner) in self.owners.iter().enumerate() {
            run = if i > 0 && self.owners[i - 1] == *owner {
                run + 1
            } else {
                1
            };
            best = best.max(run);
        }
        best
    }
}

/// Plot series: every handoff (solid), and, where many went back to the same owner, the
/// handoffs to another owner (dashed).
pub fn cdf_series(runs: &[Contended], owner: &str) -> Vec<Series> {
    let mut series = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        series.push(Series {
            label: run.kind.label().to_owned(),
            values: run.handoffs.clone(),
            color: i,
            dashed: false,
        });
        if run.same_owner() > 0.05 && !run.cross.is_empty() {
            series.push(Series {
                label: format!("{}, to another {owner}", run.kind.label()),
                values: run.cross.clone(),
                color: i,
                dashed: true,
            });
        }
    }
    series
}

pub fn contended_table(title: &str, owner: &str, runs: &[Contended]) -> String {
    let mut text = format!(
        "### {title}\n\n\
         | contender | acquisitions/s | per 2 raw RTT | handoff p50 | p50 in RTT | handoff p99 | p99 in RTT | p50 handoff to another {owner} | mean wait | p99 wait | max wait | max / mean wait | handoffs to the same {owner} | longest {owner} streak | round trips / acquisition | raw RTT |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n"
    );
    for run in runs {
        let p50 = percentile(&run.handoffs, 50.0);
        let p99 = percentile(&run.handoffs, 99.0);
        let _ = writeln!(
            text,
            "| {} | {:.0} | {:.2} | {} | {:.1} | {} | {:.1} | {} | {} | {} | {} | {:.1} | {:.0} % | {} | {} | {} |",
            run.kind.label(),
            run.rate(),
            run.per_two_rtt(),
            fmt_us(p50),
            run.in_rtt(p50),
            fmt_us(p99),
            run.in_rtt(p99),
            fmt_us(percentile(&run.cross, 50.0)),
            fmt_us(mean(&run.waits)),
            fmt_us(percentile(&run.waits, 99.0)),
            fmt_us(max(&run.waits)),
            run.wait_ratio(),
            100.0 * run.same_owner(),
            run.longest_streak(),
            run.round_trips,
            fmt_us(us(run.rtt)),
        );
    }
    text
}
