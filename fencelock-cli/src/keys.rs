//! The idempotency-key commands: `keys`, `key`, `forget`.

use fencelock::admin::{Admin, Forgotten, KeyInfo};
use fencelock::Error;
use serde_json::json;

use crate::json::key_json;
use crate::{confirmed, fail, print_all, Cli, NOT_FOUND, REFUSED};

pub(crate) async fn keys(cli: &Cli, admin: &Admin, namespace: Option<&[u8]>) -> Result<u8, Error> {
    let keys = admin.idempotency_keys(namespace).await?;
    let none = match namespace {
        Some(namespace) => format!(
            "no idempotency key of namespace {:?} has a record under prefix {:?}",
            String::from_utf8_lossy(namespace),
            cli.prefix
        ),
        None => format!(
            "no idempotency key has a record under prefix {:?}",
            cli.prefix
        ),
    };
    print_all(cli, &keys, key_json, &none);
    Ok(0)
}

pub(crate) async fn key(
    cli: &Cli,
    admin: &Admin,
    namespace: &[u8],
    key: &[u8],
) -> Result<u8, Error> {
    match admin.idempotency_key(namespace, key).await? {
        Some(info) => {
            print_one(cli, &info);
            Ok(0)
        }
        None => Ok(fail(NOT_FOUND, &no_record(namespace, key))),
    }
}

fn print_one(cli: &Cli, info: &KeyInfo) {
    if cli.json {
        println!("{}", key_json(info));
        return;
    }
    println!("{info}");
    println!(
        "  fingerprint {}",
        String::from_utf8_lossy(info.record.fingerprint())
    );
    if let Some(result) = info.record.result() {
        println!("  result {}", String::from_utf8_lossy(result));
    }
}

fn no_record(namespace: &[u8], key: &[u8]) -> String {
    format!(
        "idempotency key {}:{} has no record (never run, or its retention passed)",
        String::from_utf8_lossy(namespace),
        String::from_utf8_lossy(key)
    )
}

pub(crate) async fn forget(
    cli: &Cli,
    admin: &Admin,
    namespace: &[u8],
    key: &[u8],
    yes: bool,
) -> Result<u8, Error> {
    let Some(info) = admin.idempotency_key(namespace, key).await? else {
        return Ok(fail(NOT_FOUND, &no_record(namespace, key)));
    };
    if !cli.json {
        println!("{info}");
    }
    let question = format!(
        "forget {}: its next run runs the request as new?",
        info.display_key()
    );
    if !yes && !confirmed(&question) {
        return Ok(fail(REFUSED, "not confirmed; nothing changed"));
    }
    // Only the run shown: one that took the key over while the operator read is kept.
    let shown = Some(info.record.token());
    match admin.forget_idempotency_key(namespace, key, shown).await? {
        Forgotten::Deleted(info) => {
            if cli.json {
                println!("{}", json!({"forgotten": key_json(&info)}));
            } else {
                println!("forgotten: {}", info.display_key());
            }
            Ok(0)
        }
        Forgotten::Held(info) => Ok(fail(
            REFUSED,
            &format!(
                "{} is held by a run now ({}); nothing changed: forget it once that run has \
                 finished",
                info.display_key(),
                info.record.runner()
            ),
        )),
        Forgotten::NoRecord => Ok(fail(NOT_FOUND, &no_record(namespace, key))),
        Forgotten::OtherRun(info) => Ok(fail(
            REFUSED,
            &format!(
                "{} is another run's now (token {}, not the one shown); nothing changed: look \
                 again",
                info.display_key(),
                info.record.token()
            ),
        )),
        _ => Ok(fail(REFUSED, "nothing changed")),
    }
}
