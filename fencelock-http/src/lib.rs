//! An `Idempotency-Key` layer for tower HTTP services (axum, or any `tower` service whose
//! request body can be made from bytes), on [fencelock]'s idempotency keys in Redis: a request
//! sent with a key runs once, however often it is sent and whichever server instance gets it;
//! its duplicates get the stored response.
//!
//! ```no_run
//! use std::time::Duration;
//! use axum::{routing::post, Extension, Router};
//! use fencelock::{IdempotencyOptions, LockClient};
//! use fencelock_http::{IdempotencyLayer, IdempotencyRun};
//!
//! async fn pay(Extension(run): Extension<IdempotencyRun>, body: String) -> String {
//!     // Fence the payment's database writes with run.token() (fencelock::sql).
//!     format!("paid {body} with token {}", run.token())
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = LockClient::builder("redis://127.0.0.1:7000/").connect().await?;
//! let payments = client.idempotency("payments", IdempotencyOptions::new(Duration::from_secs(30)))?;
//! let layer = IdempotencyLayer::new(payments)
//!     // `pay` needs the run: a request without a key is refused (400), not passed to it.
//!     .require_key(true)
//!     .scope_by(|parts| parts.headers.get("x-customer").map(|v| v.as_bytes().to_vec()));
//! let app: Router = Router::new().route("/payments", post(pay)).layer(layer);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! # Scope: keys are per principal
//!
//! **A key alone says nothing about who sent it.** Without [`IdempotencyLayer::scope_by`] every
//! client shares one key space, and a client that sends another's key (guessed, or leaked in
//! a log) gets that client's stored response. Give the layer the principal (a customer, a
//! tenant: from a header your gateway sets, or an extension your authentication layer put on
//! the request before this layer): keys are then stored per principal, as
//! `<scope length>:<scope><key>` ([`stored_key`]), so that no two (principal, key) pairs meet.
//!
//! # What each request gets
//!
//! Following the IETF draft "The Idempotency-Key HTTP Header Field" and Stripe's API:
//!
//! | the request | the answer |
//! | --- | --- |
//! | the first with its key | the handler runs; its response is stored (status, body, the [kept headers](IdempotencyLayer::keep_headers): `content-type`, `location`) |
//! | a duplicate after it finished | the stored response, with `Idempotent-Replayed: true` |
//! | a duplicate while it runs | `409 Conflict` with `Retry-After`; or, with the namespace's [`wait_for_outcome`](fencelock::IdempotencyOptions::wait_for_outcome), the stored response once the first finishes (or a run of its own, if the first failed) |
//! | the same key, another request (another [fingerprint](default_fingerprint): method, target, body digest) | `422 Unprocessable Content`; the handler is not called |
//! | no key | passed through, or `400` with [`require_key`](IdempotencyLayer::require_key) |
//! | a malformed key: empty, over 255 bytes, not an RFC 8941 string (`"..."` of printable ASCII, `\"` and `\\` escapes), or two headers | `400` ([bare keys](IdempotencyLayer::accept_bare_keys) by option) |
//! | a key but no principal from [`scope_by`](IdempotencyLayer::scope_by) | `401` |
//! | a body over [`max_request_body`](IdempotencyLayer::max_request_body) | `413` |
//! | the handler answers 5xx, `408`, `425` or `429` | sent; not stored: the key is left to a retry ([`default_disposition`], [`IdempotencyLayer::on_response`]) |
//! | the handler answers another 4xx | sent and stored, as a final failure: its duplicates get it (also a 4xx a layer inside this one made) |
//! | the handler panics | `500`; the key is left to a retry |
//! | the inner service fails (its `Err`) | that error; the key is left to a retry |
//! | a response over [`max_stored_response`](IdempotencyLayer::max_stored_response) | sent once, not stored: the key is left to a retry, and a `tracing` event with target `fencelock.http` says why |
//! | the run was taken over (it outlived `at_most_for`) | `409` with `Retry-After`: the retry gets the newer run's answer |
//! | Redis unreachable (or no answer in time) before the handler ran | `503` with `Retry-After` |
//! | Redis answered with an error a retry would only repeat (a key of another type where the record is, a refused command) before the handler ran | `500` |
//! | the store failed after the handler ran | the handler's response (its writes are done), maybe not stored; a `fencelock.http` event |
//! | the run's runner died and the namespace gives such keys up ([`OnRunnerDeath::GiveUp`](fencelock::OnRunnerDeath::GiveUp)) | `500` |
//!
//! The layer's own answers have a `text/plain` body naming the reason.
//!
//! A duplicate of a finished request is answered from one read of the key's record in Redis
//! (one round trip); a first request takes that read, then the key's lock, records its run,
//! and stores its response.
//!
//! # The handler's token
//!
//! The handler runs with an [`IdempotencyRun`] in the request's extensions (axum:
//! `Extension<IdempotencyRun>`): the run's fencing token, greater than that of every earlier
//! run of the key. A run that froze past the namespace's `at_most_for` may still be running
//! when a retry runs the request again; fence the handler's writes with the token (the
//! `fence` column of [`fencelock::sql`]) and the late run's writes are refused.
//!
//! # Cancel safety
//!
//! A client that disconnects mid-request drops the service's future. Before the request's run
//! begins (its key read, its body read, the key's record read), that ends it: nothing ran.
//! From there the run is a task of its own ([`tokio::spawn`]), and the dropped future only
//! stops waiting for it: the handler is not cut off at an await (after its database commit,
//! say, before its response is stored), it runs to its end, and its response is stored; the
//! client's retry gets it, replayed. The layer therefore needs a tokio runtime, as fencelock
//! does.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod key;
mod layer;
mod record;
mod service;

pub use body::IdempotentBody;
pub use key::{stored_key, IDEMPOTENCY_KEY, MAX_KEY_LEN, MAX_SCOPE_LEN};
pub use layer::{default_disposition, default_fingerprint, Disposition, IdempotencyLayer};
pub use service::{IdempotencyRun, IdempotencyService, ResponseFuture, IDEMPOTENT_REPLAYED};

/// The README's example, compiled as a doc test so that it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
