//! The layer and its settings.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fencelock::{Idempotency, MAX_FINGERPRINT_LEN, MAX_RESULT_LEN};
use http::header::{CONTENT_TYPE, LOCATION};
use http::request::Parts;
use http::{HeaderName, StatusCode};
use sha2::{Digest, Sha256};
use tower_layer::Layer;

use crate::service::IdempotencyService;

/// What becomes of a response the handler gave, as [`IdempotencyLayer::on_response`] decides
/// by its status.
///
/// ```
/// use fencelock_http::{default_disposition, Disposition};
/// use http::StatusCode;
/// assert_eq!(default_disposition(StatusCode::CREATED), Disposition::Store);
/// assert_eq!(default_disposition(StatusCode::PAYMENT_REQUIRED), Disposition::StoreAsFailure);
/// assert_eq!(default_disposition(StatusCode::SERVICE_UNAVAILABLE), Disposition::Retry);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Stored as the key's answer: every duplicate gets it.
    Store,
    /// Stored as the key's answer, marked as a failure the handler made final
    /// ([`fencelock::Failure::Final`]): every duplicate gets it.
    StoreAsFailure,
    /// Not stored: the key is left to a retry ([`fencelock::Failure::Retry`]), and the next
    /// request with it runs the handler again.
    Retry,
}

/// The default [`Disposition`]: a 5xx leaves the key to a retry (the server failed; a retry
/// may not), and so do the three 4xx that say "try again": `408 Request Timeout` (a timeout
/// layer inside the stack cut the handler off, maybe after it wrote), `425 Too Early` and
/// `429 Too Many Requests` (a rate limit, the service's or a provider's). Any other 4xx is
/// stored as a final failure (the request was wrong; a retry would only repeat it), anything
/// else is stored.
///
/// The status is all it sees: a 4xx that a layer inside this one made (an extractor's
/// rejection, a `413` of a body limit, a `401` of an authentication layer placed after this
/// one) is stored as the handler's would be. Place such layers before this one, or answer
/// them otherwise with [`IdempotencyLayer::on_response`].
///
/// ```
/// use fencelock_http::{default_disposition, Disposition};
/// assert_eq!(default_disposition(http::StatusCode::OK), Disposition::Store);
/// assert_eq!(default_disposition(http::StatusCode::TOO_MANY_REQUESTS), Disposition::Retry);
/// assert_eq!(default_disposition(http::StatusCode::REQUEST_TIMEOUT), Disposition::Retry);
/// ```
pub fn default_disposition(status: StatusCode) -> Disposition {
    let try_again = matches!(status.as_u16(), 408 | 425 | 429);
    if status.is_server_error() || try_again {
        Disposition::Retry
    } else if status.is_client_error() {
        Disposition::StoreAsFailure
    } else {
        Disposition::Store
    }
}

/// The default fingerprint of a request: `METHOD PATH?QUERY sha256:HEX` with the SHA-256 digest
/// of the body; over [`MAX_FINGERPRINT_LEN`] bytes (a very long URI), the SHA-256 digest of
/// that text instead. The same key with another method, target or body is refused (422).
///
/// ```
/// let (parts, ()) = http::Request::post("/payments?dry=1").body(()).unwrap().into_parts();
/// let fingerprint = fencelock_http::default_fingerprint(&parts, b"{}");
/// assert!(fingerprint.starts_with(b"POST /payments?dry=1 sha256:44136fa355b3678a"));
/// ```
pub fn default_fingerprint(parts: &Parts, body: &[u8]) -> Vec<u8> {
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", |target| target.as_str());
    let digest = hex(&Sha256::digest(body));
    let text = format!("{} {target} sha256:{digest}", parts.method);
    if text.len() <= MAX_FINGERPRINT_LEN {
        text.into_bytes()
    } else {
        hex(&Sha256::digest(text.as_bytes())).into_bytes()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

type ScopeFn = dyn Fn(&Parts) -> Option<Vec<u8>> + Send + Sync;
type FingerprintFn = dyn Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync;
type DispositionFn = dyn Fn(StatusCode) -> Disposition + Send + Sync;

/// The layer's settings, shared by every clone of its service.
pub(crate) struct Config {
    pub(crate) idempotency: Idempotency,
    pub(crate) require_key: bool,
    pub(crate) accept_bare: bool,
    pub(crate) scope: Option<Arc<ScopeFn>>,
    pub(crate) fingerprint: Arc<FingerprintFn>,
    pub(crate) disposition: Arc<DispositionFn>,
    pub(crate) kept_headers: Vec<HeaderName>,
    pub(crate) retry_after: Duration,
    pub(crate) max_request_body: usize,
    pub(crate) max_stored_response: usize,
}

impl Clone for Config {
    fn clone(&self) -> Self {
        Config {
            idempotency: self.idempotency.clone(),
            scope: self.scope.clone(),
            fingerprint: self.fingerprint.clone(),
            disposition: self.disposition.clone(),
            kept_headers: self.kept_headers.clone(),
            ..*self
        }
    }
}

/// A tower [`Layer`] that runs each request with an `Idempotency-Key` header once under that
/// key, and answers its duplicates with the stored response (see the [crate] docs for every
/// answer it gives).
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// use std::time::Duration;
/// use fencelock::IdempotencyOptions;
/// use fencelock_http::IdempotencyLayer;
/// let payments = client.idempotency("payments", IdempotencyOptions::new(Duration::from_secs(30)))?;
/// let layer = IdempotencyLayer::new(payments)
///     .require_key(true)
///     // Keys are per customer: another customer's key never answers.
///     .scope_by(|parts| parts.headers.get("x-customer").map(|v| v.as_bytes().to_vec()));
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer {
    pub(crate) config: Arc<Config>,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.config;
        f.debug_struct("IdempotencyLayer")
            .field("idempotency", &config.idempotency)
            .field("require_key", &config.require_key)
            .field("accept_bare_keys", &config.accept_bare)
            .field("scoped", &config.scope.is_some())
            .field("kept_headers", &config.kept_headers)
            .field("retry_after", &config.retry_after)
            .field("max_request_body", &config.max_request_body)
            .field("max_stored_response", &config.max_stored_response)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer whose keys live in `idempotency`'s namespace, run as its options say (how long
    /// a run may hold a key, how long responses are kept, whether a duplicate waits for a run
    /// in progress: [`fencelock::IdempotencyOptions`]). Defaults: a missing key passes the
    /// request through; only quoted keys are accepted; one scope for all requests; the
    /// [`default_fingerprint`] and [`default_disposition`]; `content-type` and `location` kept;
    /// `Retry-After: 1`; request bodies and stored responses up to 1 MiB.
    ///
    /// ```no_run
    /// # fn demo(payments: fencelock::Idempotency) {
    /// let layer = fencelock_http::IdempotencyLayer::new(payments);
    /// # let _ = layer; }
    /// ```
    pub fn new(idempotency: Idempotency) -> Self {
        IdempotencyLayer {
            config: Arc::new(Config {
                idempotency,
                require_key: false,
                accept_bare: false,
                scope: None,
                fingerprint: Arc::new(default_fingerprint),
                disposition: Arc::new(default_disposition),
                kept_headers: vec![CONTENT_TYPE, LOCATION],
                retry_after: Duration::from_secs(1),
                max_request_body: MAX_RESULT_LEN,
                max_stored_response: MAX_RESULT_LEN,
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// With `true`, a request without an `Idempotency-Key` header is refused with 400 instead
    /// of passed through.
    ///
    /// ```no_run
    /// # fn demo(layer: fencelock_http::IdempotencyLayer) {
    /// let layer = layer.require_key(true);
    /// # let _ = layer; }
    /// ```
    #[must_use]
    pub fn require_key(self, require: bool) -> Self {
        self.with(|config| config.require_key = require)
    }

    /// With `true`, a bare key (`Idempotency-Key: 5f2c-81`: visible ASCII, no quotes, as
    /// Stripe's clients send it) is accepted beside the structured-field string the IETF draft
    /// specifies (`Idempotency-Key: "5f2c-81"`). Off by default: the draft's form is the
    /// standard, and a server that accepts both gives the same key to `abc` and `"abc"`.
    ///
    /// ```no_run
    /// # fn demo(layer: fencelock_http::IdempotencyLayer) {
    /// let layer = layer.accept_bare_keys(true);
    /// # let _ = layer; }
    /// ```
    #[must_use]
    pub fn accept_bare_keys(self, accept: bool) -> Self {
        self.with(|config| config.accept_bare = accept)
    }

    /// Keys are scoped by what `scope` returns for the request (the principal or tenant: from
    /// a header, or an extension an authentication layer set before this one): the same key
    /// sent by two principals is two keys, so one never gets the other's response. `None`
    /// refuses a request that has a key with 401 (no principal to scope it by); return an
    /// empty scope to share one. At most [`MAX_SCOPE_LEN`](crate::MAX_SCOPE_LEN) bytes (more
    /// is refused with 400). Without it, every request shares one scope.
    ///
    /// ```no_run
    /// # fn demo(layer: fencelock_http::IdempotencyLayer) {
    /// #[derive(Clone)]
    /// struct Customer(String); // set by the authentication layer
    /// let layer = layer.scope_by(|parts| {
    ///     parts.extensions.get::<Customer>().map(|c| c.0.clone().into_bytes())
    /// });
    /// # let _ = layer; }
    /// ```
    #[must_use]
    pub fn scope_by<F>(self, scope: F) -> Self
    where
        F: Fn(&Parts) -> Option<Vec<u8>> + Send + Sync + 'static,
    {
        self.with(|config| config.scope = Some(Arc::new(scope)))
    }

    /// The request's fingerprint from its head and whole body (instead of
    /// [`default_fingerprint`]): the same key with another fingerprint is refused with 422.
    /// 1 to [`MAX_FINGERPRINT_LEN`] bytes: hash what may be long.
    ///
    /// ```no_run
    /// # fn demo(layer: fencelock_http::IdempotencyLayer) {
    /// // The body alone: the same payment sent to /v1 and /v2 is one request.
    /// let layer = layer.fingerprint_with(|_parts, body| {
    ///     fencelock_http::default_fingerprint(&http::Request::new(()).into_parts().0, body)
    /// });
    /// # let _ = layer; }
    /// ```
    #[must_use]
    pub fn fingerprint_with<F>(self, fingerprint: F) -> Self
    where
        F: Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    {
        self.with(|config| config.fingerprint = Arc::new(fingerprint))
    }

    /// Which responses are stored and which leave the key to a retry, by status (instead of
    /// [`default_disposition`]).
    ///
    /// ```no_run
    /// # fn demo(layer: fencelock_http::IdempotencyLayer) {
    /// use fencelock_http::{default_disposition, Disposition};
    /// // A 409 from the handler (a lock it could not take) is worth a retry too.
    /// let layer = layer.on_response(|status| match status.as_u16() {
    ///     409 => Disposition::Retry,
    ///     _ => default_disposition(status),
    /// });
    /// # let _ = layer; }
    /// ```
    #[must_use]
    pub fn on_response<F>(self, disposition: F) -> Self
    where
        F: Fn(StatusCode) -> Disposition + Send + Sync + 'static,
    {
        self.with(|config| config.disposition = Arc::new(disposition))
    }

    /// The response headers stored with the status and body, so that a replay carries them
    /// (instead of `content-type` and `location`). The first response carries all of them.
    ///
    /// ```no_run
    /// # fn demo(layer: fencelock_http::IdempotencyLayer) {
    /// use http::header::{CONTENT_TYPE, ETAG, LOCATION};
    /// let layer = layer.keep_headers([CONTENT_TYPE, LOCATION, ETAG]);
    /// # let _ = layer; }
    /// ```
    #[must_use]
    pub fn keep_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names = names.into_iter().collect();
        self.with(|config| config.kept_headers = names)
    }

    /// The `Retry-After` of a 409 for a key whose run is in progress, rounded up to whole
    /// seconds (default 1 s).
    ///
    /// ```no_run
    /// # fn demo(layer: fencelock_http::IdempotencyLayer) {
    /// let layer = layer.retry_after(std::time::Duration::from_secs(2));
    /// # let _ = layer; }
    /// ```
    #[must_use]
    pub fn retry_after(self, after: Duration) -> Self {
        self.with(|config| config.retry_after = after)
    }

    /// The largest request body read for the fingerprint (default 1 MiB); a larger one with
    /// a key is refused with 413.
    ///
    /// ```no_run
    /// # fn demo(layer: fencelock_http::IdempotencyLayer) {
    /// let layer = layer.max_request_body(64 * 1024);
    /// # let _ = layer; }
    /// ```
    #[must_use]
    pub fn max_request_body(self, len: usize) -> Self {
        self.with(|config| config.max_request_body = len)
    }

    /// The largest response stored, in bytes of its stored form (status, kept headers and
    /// body), at most (and by default) [`MAX_RESULT_LEN`]. A larger response is sent to its
    /// client once, not stored: the key is left to a retry, and a `tracing` event with target
    /// `fencelock.http` says why.
    ///
    /// ```no_run
    /// # fn demo(layer: fencelock_http::IdempotencyLayer) {
    /// let layer = layer.max_stored_response(64 * 1024);
    /// # let _ = layer; }
    /// ```
    #[must_use]
    pub fn max_stored_response(self, len: usize) -> Self {
        self.with(|config| config.max_stored_response = len.min(MAX_RESULT_LEN))
    }

    /// The namespace's handle the layer runs its keys with.
    ///
    /// ```no_run
    /// # fn demo(layer: fencelock_http::IdempotencyLayer) {
    /// println!("keys in {:?}", String::from_utf8_lossy(layer.idempotency().namespace()));
    /// # }
    /// ```
    pub fn idempotency(&self) -> &Idempotency {
        &self.config.idempotency
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            config: self.config.clone(),
        }
    }
}
