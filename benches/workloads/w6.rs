//! W6: re-entry depth, interleaved with its limit.

use std::fmt::Write as _;

use crate::common::{self, Contenders, Kind, Locker};
use crate::measure::interleaved;
use crate::stats::{fmt_us, median};
use crate::{Cfg, Report};

// ---------------------------------------------------------------------------------------------
// W6: re-entry depth, interleaved with its limit.

pub async fn w6(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let Locker::Ours(lock) = contenders.locker(Kind::Ours, "w6") else {
        unreachable!()
    };
    let keys = contenders.limit.keys("w6");
    let rounds = cfg.pick(40, 2);
    let mut text = String::from(
        "### W6: re-entry depth (acquire, `reenter()` d times, release all d + 1 guards)\n\n\
         | depth d | round trips | fencelock | limit (same number of raw EVALSHA) | ratio | per re-entry + its release |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let mut base = f64::NAN;
    for depth in [0usize, 1, 4, 16] {
        let n = cfg.pick((64 / (depth + 1)).max(4) as u32, 2);
        let (ours, limit, ratios) = interleaved(
            rounds,
            n,
            async || common::reentry_cycle(&lock, depth).await,
            async || common::limit_reentry_cycle(&contenders.limit, &keys, depth).await,
        )
        .await;
        let t = median(&ours);
        if depth == 0 {
            base = t;
        }
        let per = if depth == 0 {
            "–".to_owned()
        } else {
            fmt_us((t - base) / depth as f64)
        };
        let _ = writeln!(
            text,
            "| {depth} | {} | {} | {} | {:.2} | {per} |",
            2 * (depth + 1),
            fmt_us(t),
            fmt_us(median(&limit)),
            median(&ratios),
        );
    }
    let _ = writeln!(
        text,
        "\n{rounds} interleaved rounds; ratio = median of per-round ratios. Peers have no \
         re-entry.\n"
    );
    report.section(text);
}
