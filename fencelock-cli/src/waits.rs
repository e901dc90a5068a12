//! The `waits` command: who waits for what right now, and the possible deadlocks among them.

use std::time::Duration;

use fencelock::admin::Admin;
use fencelock::Error;
use serde_json::json;

use crate::json::{deadlock_json, wait_json};
use crate::Cli;

/// Prints every recorded wait, then every wait-for cycle whose waits all lasted
/// `deadlock_after`; exit 0 either way (the doctor is the alerting command).
pub(crate) async fn waits(cli: &Cli, admin: &Admin, deadlock_after: Duration) -> Result<u8, Error> {
    let waits = admin.waits().await?;
    let deadlocks = admin.possible_deadlocks(deadlock_after).await?;
    if cli.json {
        let waits: Vec<_> = waits.iter().map(wait_json).collect();
        let deadlocks: Vec<_> = deadlocks.iter().map(deadlock_json).collect();
        println!(
            "{}",
            json!({"waits": waits, "possible_deadlocks": deadlocks})
        );
        return Ok(0);
    }
    if waits.is_empty() {
        println!("nobody waits under prefix {:?}", cli.prefix);
    }
    for wait in &waits {
        println!("{wait}");
    }
    for deadlock in &deadlocks {
        println!("{deadlock}");
    }
    Ok(0)
}
