//! W8: leadership: a campaign on a free election and a resignation's handoff.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::common::{self, Contenders};
use crate::measure::interleaved;
use crate::stats::{fmt_us, median, percentile, us};
use crate::{Cfg, Report};

// ---------------------------------------------------------------------------------------------
// W8: leadership: a campaign on a free election, and a resignation's handoff to the next
// candidate, against raw EVALSHA round trips measured interleaved with them.

pub async fn w8(cfg: &Cfg, report: &mut Report) {
    let server = common::start_server();
    let contenders = Contenders::connect(&server.url()).await;
    let follower = LockClient::connect(&server.url())
        .await
        .expect("connect the candidate");
    let leading = contenders.ours.election("w8").expect("name");
    let waiting = follower.election("w8").expect("name");
    let limit = &contenders.limit;
    let keys = limit.keys("w8");
    let rounds = cfg.pick(40, 2);
    let n: u32 = cfg.pick(32, 2);

    // (a) campaign + resign on a free election: acquire, announce, release = 3 round trips;
    // the limit is 3 raw EVALSHA one after another.
    let (ours, raw, ratios) = interleaved(
        rounds,
        n,
        async || {
            let guard = leading.campaign(b"w8").await.expect("campaign");
            guard.resign().await.expect("resign");
        },
        async || {
            let first = limit.acquire(&keys).await;
            let _second = limit.acquire(&keys).await;
            limit.release(&keys, &first).await;
        },
    )
    .await;
    let (campaign, campaign_limit, campaign_ratio) = (median(&ours), median(&raw), median(&ratios));

    // (b) handoff: a candidate of another client waits in `campaign`; the time from the
    // leader's `resign()` call to the candidate's guard (release, the message, the candidate's
    // acquisition and announcement), against one raw EVALSHA measured right after it.
    let (mut handoffs, mut trips) = (Vec::new(), Vec::new());
    for _ in 0..rounds * 4 {
        let guard = leading.campaign(b"leader").await.expect("campaign");
        let candidate = waiting.clone();
        let next = tokio::spawn(async move { candidate.campaign(b"next").await });
        // Let the candidate try once and subscribe; if it has not yet, its first attempt
        // finds the election free, which only shortens this sample.
        tokio::time::sleep(Duration::from_millis(cfg.pick(20, 5))).await;
        let started = Instant::now();
        guard.resign().await.expect("resign");
        let next = next
            .await
            .expect("candidate task")
            .expect("candidate campaign");
        handoffs.push(us(started.elapsed()));
        next.resign().await.expect("resign");
        let started = Instant::now();
        let holder = limit.acquire(&keys).await;
        trips.push(us(started.elapsed()));
        limit.release(&keys, &holder).await;
    }
    let trip = median(&trips);
    let mut text = String::from(
        "### W8: leadership (campaign on a free election; resignation handoff)\n\n\
         | what | round trips | fencelock | limit | ratio |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
    );
    let _ = writeln!(
        text,
        "| campaign + resign, free election | 3 | {} | {} (3 raw EVALSHA) | {campaign_ratio:.2} |",
        fmt_us(campaign),
        fmt_us(campaign_limit),
    );
    for (label, p) in [("p50", 50.0), ("p99", 99.0)] {
        let h = percentile(&handoffs, p);
        let _ = writeln!(
            text,
            "| resign -> next leader's guard, {label} | 3 + a message | {} | {} (1 raw EVALSHA, p50) | {:.2} |",
            fmt_us(h),
            fmt_us(trip),
            h / trip,
        );
    }
    let _ = writeln!(
        text,
        "\n{rounds} interleaved rounds of {n} campaigns; {} handoffs, each followed by one raw \
         round trip. Peers have no election.\n",
        handoffs.len()
    );
    report.section(text);
}
