//! The service the layer wraps a handler in: the request's way through its key.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use fencelock::{Error, Failure, FencingToken, Idempotency, Processed, MAX_FINGERPRINT_LEN};
use futures_util::FutureExt;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use tower_service::Service;

use crate::body::IdempotentBody;
use crate::key::{read_key, stored_key, KeyHeader, MAX_SCOPE_LEN};
use crate::layer::{Config, Disposition};
use crate::record::{decode, encode};

/// The header that marks a replayed response: `Idempotent-Replayed: true`.
///
/// ```
/// # fn demo(response: http::Response<()>) {
/// let replayed = response.headers().get(fencelock_http::IDEMPOTENT_REPLAYED).is_some();
/// # }
/// ```
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The longest run label: the core's limit.
const MAX_LABEL_LEN: usize = 256;

/// The key's run that handles a request, put into the request's extensions before the handler is
/// called: the fencing token to fence the handler's writes with, and the key. With axum, take
/// it with the `Extension<IdempotencyRun>` extractor.
///
/// Key the rows the handler writes by [`stored_key`](IdempotencyRun::stored_key) (the key in
/// its scope), never by [`key`](IdempotencyRun::key) alone: two principals may send the same
/// key, and their tokens are unrelated, so one's write would pass the other's fence.
///
/// ```no_run
/// use axum::Extension;
/// use fencelock_http::IdempotencyRun;
///
/// async fn pay(Extension(run): Extension<IdempotencyRun>) -> String {
///     // e.g. UPDATE payments SET ..., fence = $token WHERE id = $stored_key AND fence <= $token
///     format!("paid under key {} with token {}", run.key(), run.token())
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRun {
    key: String,
    scope: Vec<u8>,
    stored: Vec<u8>,
    token: FencingToken,
    took_over: Option<FencingToken>,
}

impl IdempotencyRun {
    /// The key, as the client sent it (unquoted). Not unique across principals: key rows by
    /// [`stored_key`](IdempotencyRun::stored_key).
    ///
    /// ```no_run
    /// # fn demo(run: fencelock_http::IdempotencyRun) {
    /// println!("key {}", run.key());
    /// # }
    /// ```
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The key in its scope, as the key's run is stored
    /// ([`stored_key`](crate::stored_key)`(scope, key)`): unique per (principal, key), the
    /// id to key the handler's rows by (a `BYTEA` column, say; it is text when the scope is).
    /// The handler's writes fenced by [`token`](IdempotencyRun::token) on a row with this id
    /// are refused to every earlier run of the same request, and to no other request's run.
    ///
    /// ```no_run
    /// # async fn demo(run: fencelock_http::IdempotencyRun, db: tokio_postgres::Client) {
    /// let fence = fencelock::sql::fence_param(run.token());
    /// db.execute(
    ///     "UPDATE payments SET fence = $2 WHERE id = $1 AND fence <= $2",
    ///     &[&run.stored_key(), &fence],
    /// )
    /// .await
    /// .unwrap();
    /// # }
    /// ```
    pub fn stored_key(&self) -> &[u8] {
        &self.stored
    }

    /// The scope the key is in ([`IdempotencyLayer::scope_by`](crate::IdempotencyLayer::scope_by);
    /// empty without one).
    ///
    /// ```no_run
    /// # fn demo(run: fencelock_http::IdempotencyRun) {
    /// println!("for {}", String::from_utf8_lossy(run.scope()));
    /// # }
    /// ```
    pub fn scope(&self) -> &[u8] {
        &self.scope
    }

    /// The run's fencing token: greater than that of every earlier run of the key. Write it
    /// with every change the handler makes, and have the storage refuse older ones
    /// ([`fencelock::sql`]): a run the key gave up on (it froze past `at_most_for`) cannot
    /// write after its successor.
    ///
    /// ```no_run
    /// # fn demo(run: fencelock_http::IdempotencyRun) {
    /// let fence: i64 = fencelock::sql::fence_param(run.token());
    /// # let _ = fence; }
    /// ```
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The token of an earlier run of the key whose runner died mid-run (its writes may be
    /// half done), if any.
    ///
    /// ```no_run
    /// # fn demo(run: fencelock_http::IdempotencyRun) {
    /// if let Some(old) = run.took_over() {
    ///     println!("a run with token {old} died: finish or undo its writes");
    /// }
    /// # }
    /// ```
    pub fn took_over(&self) -> Option<FencingToken> {
        self.took_over
    }
}

/// The service made by [`IdempotencyLayer`](crate::IdempotencyLayer) around `S`.
///
/// `S` takes requests whose body `B` can be made from bytes (`From<Bytes>`, as axum's `Body`):
/// a request with a key is read whole (for its fingerprint) and handed on rebuilt. Its
/// responses' bodies must be `Unpin` (as axum's): one over the stored bound is handed on with
/// what was read of it, then the rest.
///
/// ```no_run
/// # fn demo(layer: fencelock_http::IdempotencyLayer) {
/// use tower_layer::Layer;
/// let service = layer.layer(axum::Router::<()>::new());
/// # let _ = service; }
/// ```
#[derive(Clone)]
pub struct IdempotencyService<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<Config>,
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("idempotency", &self.config.idempotency)
            .finish_non_exhaustive()
    }
}

/// The future of [`IdempotencyService`]'s `call`: boxed, `Send`.
///
/// ```no_run
/// # async fn demo(mut service: fencelock_http::IdempotencyService<axum::Router>) {
/// use tower_service::Service;
/// let future: fencelock_http::ResponseFuture<axum::body::Body, std::convert::Infallible> =
///     service.call(http::Request::new(axum::body::Body::empty()));
/// let response = future.await.unwrap();
/// # }
/// ```
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<IdempotentBody<B>>, E>> + Send>>;

impl<S, ReqB, ResB> Service<Request<ReqB>> for IdempotencyService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ResB: Body<Data = Bytes> + Unpin + Send + 'static,
    ResB::Error: Send + 'static,
{
    type Response = Response<IdempotentBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The clone that was made ready is the one that serves this request (tower's rule).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(serve(inner, self.config.clone(), request))
    }
}

type Answer<B, E> = Result<Response<IdempotentBody<B>>, E>;

/// Why a run left its key to a retry, beyond the handler's own answer.
enum Unstored {
    Disposition,
    ServiceError,
    Panicked,
    TooLarge,
    BodyFailed,
}

async fn serve<S, ReqB, ResB>(
    mut inner: S,
    config: Arc<Config>,
    request: Request<ReqB>,
) -> Answer<ResB, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ResB: Body<Data = Bytes> + Unpin + Send + 'static,
    ResB::Error: Send + 'static,
{
    let (parts, body) = request.into_parts();
    let key = match read_key(&parts.headers, config.accept_bare) {
        KeyHeader::Key(key) => key,
        KeyHeader::Absent if !config.require_key => {
            let response = inner.call(Request::from_parts(parts, body)).await?;
            return Ok(response.map(IdempotentBody::inner));
        }
        KeyHeader::Absent => {
            return Ok(refuse(
                StatusCode::BAD_REQUEST,
                "an Idempotency-Key header is required",
            ))
        }
        KeyHeader::Malformed(reason) => return Ok(refuse(StatusCode::BAD_REQUEST, reason)),
    };
    let scope = match &config.scope {
        None => Vec::new(),
        Some(scope) => match scope(&parts) {
            Some(scope) if scope.len() <= MAX_SCOPE_LEN => scope,
            Some(_) => {
                return Ok(refuse(
                    StatusCode::BAD_REQUEST,
                    "the request's scope is over 256 bytes",
                ))
            }
            None => {
                return Ok(refuse(
                    StatusCode::UNAUTHORIZED,
                    "the request names no principal to scope its Idempotency-Key by",
                ))
            }
        },
    };
    let body = match read_request(body, config.max_request_body).await {
        Ok(body) => body,
        Err(status) => return Ok(refuse(status, "the request body could not be read whole")),
    };
    let fingerprint = (config.fingerprint)(&parts, &body);
    if fingerprint.is_empty() || fingerprint.len() > MAX_FINGERPRINT_LEN {
        return Ok(refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request's fingerprint is empty or too long",
        ));
    }
    let stored = stored_key(&scope, &key);
    let idempotency = labelled(&config.idempotency, &parts);

    // A duplicate of a finished request is answered from one read of the key's record: one
    // round trip, where a run's path takes the key's lock first.
    // A store that fails here answers at once: nothing ran, and the run's path would only
    // meet the same failure.
    match idempotency.record(&stored).await {
        Ok(Some(record)) => {
            if record.fingerprint() != fingerprint {
                return Ok(refuse(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "the Idempotency-Key was used for another request",
                ));
            }
            if let Some(result) = record.result() {
                return Ok(replay(result));
            }
        }
        Ok(None) => {}
        Err(err) => return Ok(store_failed(&config, &idempotency, &stored, &err, false)),
    }

    // From here the request's run is a task of its own: a client that goes away drops this
    // future, and with it only the wait for the task; the run goes on, and its response is
    // stored for the client's retry. The handler's writes are never cut off half way by a
    // disconnect.
    let run = Run {
        inner,
        config,
        parts,
        body,
        key,
        scope,
        stored,
        fingerprint,
        idempotency,
    };
    match tokio::spawn(run_key::<S, ReqB, ResB>(run)).await {
        Ok(answer) => answer,
        // The handler's own panic is caught in the task; this is the layer's, or the runtime
        // shutting down. The key's hold is released as for a dropped run: left to a retry.
        Err(_) => Ok(refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request's run panicked; the key is left to a retry",
        )),
    }
}

/// A request that goes through its key's run: what [`run_key`] takes into its task.
struct Run<S> {
    inner: S,
    config: Arc<Config>,
    parts: Parts,
    body: Bytes,
    key: String,
    scope: Vec<u8>,
    stored: Vec<u8>,
    fingerprint: Vec<u8>,
    idempotency: Idempotency,
}

/// Runs the request under its key: the handler once, its response stored as the key's answer.
async fn run_key<S, ReqB, ResB>(run: Run<S>) -> Answer<ResB, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ReqB: Body<Data = Bytes> + From<Bytes>,
    ResB: Body<Data = Bytes> + Unpin,
{
    let Run {
        mut inner,
        config,
        parts,
        body,
        key,
        scope,
        stored,
        fingerprint,
        idempotency,
    } = run;
    let mut first: Option<Answer<ResB, S::Error>> = None;
    let slot = &mut first;
    let settings = &*config;
    let key_name = &stored[..];
    let run_key = stored.clone();
    let outcome = idempotency
        .run(&stored, &fingerprint, |key_run| async move {
            let mut parts = parts;
            parts.extensions.insert(IdempotencyRun {
                key,
                scope,
                stored: run_key,
                token: key_run.token(),
                took_over: key_run.took_over(),
            });
            let request = Request::from_parts(parts, ReqB::from(body));
            let handled =
                AssertUnwindSafe(handle(&mut inner, request, settings, key_name)).catch_unwind();
            let (answer, unstored) = match handled.await {
                Err(_panic) => {
                    tracing::error!(
                        target: "fencelock.http",
                        key = %String::from_utf8_lossy(key_name),
                        "the handler panicked: answered 500, the key is left to a retry"
                    );
                    (None, Some(Unstored::Panicked))
                }
                Ok(Err(err)) => (Some(Err(err)), Some(Unstored::ServiceError)),
                Ok(Ok(Handled::Stored {
                    response,
                    stored,
                    disposition,
                })) => {
                    *slot = Some(Ok(response));
                    return match disposition {
                        Disposition::Store => Ok(stored),
                        Disposition::StoreAsFailure => Err(Failure::Final {
                            error: Unstored::Disposition,
                            result: stored,
                        }),
                        Disposition::Retry => Err(Failure::Retry(Unstored::Disposition)),
                    };
                }
                Ok(Ok(Handled::Unstored { response, why })) => (Some(Ok(response)), Some(why)),
            };
            *slot = answer;
            Err(Failure::Retry(unstored.unwrap_or(Unstored::Disposition)))
        })
        .await;
    match outcome {
        Ok(Processed::Ran {
            output: Err(Failure::Retry(Unstored::Panicked)),
            ..
        }) => Ok(refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the handler panicked; the key is left to a retry",
        )),
        Ok(Processed::Ran { .. }) => first.unwrap_or_else(|| {
            Ok(refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the handler gave no response",
            ))
        }),
        Ok(Processed::Completed(record)) => Ok(record.result().map_or_else(
            || {
                refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the key's record has no response",
                )
            },
            replay,
        )),
        Ok(Processed::InProgress(_)) => Ok(busy(
            &config,
            "a request with this Idempotency-Key is in progress",
        )),
        Ok(Processed::Abandoned(_)) => Ok(refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the run of this Idempotency-Key died and is left to an operator",
        )),
        Ok(_) => Ok(refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "an outcome of the key this layer does not know",
        )),
        Err(Error::KeyReused { .. }) => Ok(refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "the Idempotency-Key was used for another request",
        )),
        Err(Error::StaleToken { .. }) => Ok(busy(
            &config,
            "a newer run of this Idempotency-Key took it over",
        )),
        Err(err) => {
            let answered = store_failed(&config, &idempotency, &stored, &err, first.is_some());
            // The handler ran and answered: that answer stands (its writes are done), though
            // it may not be stored. Otherwise nothing ran.
            first.unwrap_or(Ok(answered))
        }
    }
}

/// The answer when the key's store failed with `err` (logged): `503` with `Retry-After` when
/// Redis could not be reached or did not answer in time (a retry may get through), `500` for
/// an answer a retry would only repeat (a key of another type at the record's place, a
/// refused command).
fn store_failed<B: Body>(
    config: &Config,
    idempotency: &Idempotency,
    stored: &[u8],
    err: &Error,
    handled: bool,
) -> Response<IdempotentBody<B>> {
    tracing::warn!(
        target: "fencelock.http",
        namespace = %String::from_utf8_lossy(idempotency.namespace()),
        key = %String::from_utf8_lossy(stored),
        error = %err,
        handled,
        "idempotency key failed"
    );
    if unavailable(err) {
        retry_after(
            config,
            StatusCode::SERVICE_UNAVAILABLE,
            "the idempotency store is unavailable",
        )
    } else {
        refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the idempotency store refused the key's operation",
        )
    }
}

/// Whether `err` says the store could not be reached or did not answer in time, rather than
/// answered.
fn unavailable(err: &Error) -> bool {
    matches!(
        err,
        Error::Redis(_)
            | Error::Timeout { .. }
            | Error::Cancelled
            | Error::ReplicationTimeout { .. }
    )
}

/// What the handler answered.
enum Handled<B: Body> {
    /// Read whole and fit to store: the response for this client, and its stored form.
    Stored {
        response: Response<IdempotentBody<B>>,
        stored: Vec<u8>,
        disposition: Disposition,
    },
    /// Not stored: the key is left to a retry.
    Unstored {
        response: Response<IdempotentBody<B>>,
        why: Unstored,
    },
}

/// Calls the handler and reads its response up to the stored bound.
async fn handle<S, ReqB, ResB>(
    inner: &mut S,
    request: Request<ReqB>,
    config: &Config,
    key: &[u8],
) -> Result<Handled<ResB>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes> + Unpin,
{
    let response = inner.call(request).await?;
    let (parts, mut body) = response.into_parts();
    let disposition = (config.disposition)(parts.status);
    // A response the key will not keep is handed on as it streams.
    if disposition == Disposition::Retry {
        let response = Response::from_parts(parts, IdempotentBody::inner(body));
        return Ok(Handled::Unstored {
            response,
            why: Unstored::Disposition,
        });
    }
    let limit = config.max_stored_response;
    let mut read = BytesMut::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(err) => {
                let response =
                    Response::from_parts(parts, IdempotentBody::failed(read.freeze(), err));
                return Ok(Handled::Unstored {
                    response,
                    why: Unstored::BodyFailed,
                });
            }
        };
        match frame.into_data() {
            Ok(data) => read.extend_from_slice(&data),
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
        if read.len() > limit {
            // Not stored; the client still gets it whole, once.
            tracing::warn!(
                target: "fencelock.http",
                namespace = %String::from_utf8_lossy(config.idempotency.namespace()),
                key = %String::from_utf8_lossy(key),
                status = parts.status.as_u16(),
                limit,
                "response over the stored bound: sent once, not stored; the key is left to a retry"
            );
            let response = Response::from_parts(
                parts,
                IdempotentBody::parts(Some(read.freeze()), Some(body), None),
            );
            return Ok(Handled::Unstored {
                response,
                why: Unstored::TooLarge,
            });
        }
    }
    let read = read.freeze();
    let stored = encode(parts.status, &parts.headers, &config.kept_headers, &read);
    if stored.len() > limit {
        tracing::warn!(
            target: "fencelock.http",
            namespace = %String::from_utf8_lossy(config.idempotency.namespace()),
            key = %String::from_utf8_lossy(key),
            status = parts.status.as_u16(),
            stored = stored.len(),
            limit,
            "response with its kept headers over the stored bound: sent once, not stored; the key is left to a retry"
        );
        let response =
            Response::from_parts(parts, IdempotentBody::parts(Some(read), None, trailers));
        return Ok(Handled::Unstored {
            response,
            why: Unstored::TooLarge,
        });
    }
    let response = Response::from_parts(parts, IdempotentBody::parts(Some(read), None, trailers));
    Ok(Handled::Stored {
        response,
        stored,
        disposition,
    })
}

/// The request body, read whole up to `limit` bytes; 413 over it, 400 when it fails.
async fn read_request<B: Body<Data = Bytes>>(body: B, limit: usize) -> Result<Bytes, StatusCode> {
    let mut body = pin!(body);
    let mut read = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| StatusCode::BAD_REQUEST)?;
        if let Ok(data) = frame.into_data() {
            read.extend_from_slice(&data);
            if read.len() > limit {
                return Err(StatusCode::PAYLOAD_TOO_LARGE);
            }
        }
    }
    Ok(read.freeze())
}

/// The namespace's handle whose runs carry the request's method and path (what `fencelock
/// keys` shows next to a running key), cut to the core's limit; unlabelled if it cannot be one.
fn labelled(idempotency: &Idempotency, parts: &Parts) -> Idempotency {
    let mut label = format!("{} {}", parts.method, parts.uri.path());
    if label.len() > MAX_LABEL_LEN {
        let mut end = MAX_LABEL_LEN;
        while !label.is_char_boundary(end) {
            end -= 1;
        }
        label.truncate(end);
    }
    idempotency
        .with_label(&label)
        .unwrap_or_else(|_| idempotency.clone())
}

/// The stored response, marked as a replay.
fn replay<B: Body>(stored: &[u8]) -> Response<IdempotentBody<B>> {
    let Some(stored) = decode(stored) else {
        return refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the key's stored response is not in this layer's format",
        );
    };
    let mut response = Response::new(IdempotentBody::full(stored.body));
    *response.status_mut() = stored.status;
    *response.headers_mut() = stored.headers;
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// 409 with `Retry-After`: the client sends the same request again later.
fn busy<B: Body>(config: &Config, reason: &'static str) -> Response<IdempotentBody<B>> {
    retry_after(config, StatusCode::CONFLICT, reason)
}

/// `status` with `Retry-After` (whole seconds, rounded up, at least one).
fn retry_after<B: Body>(
    config: &Config,
    status: StatusCode,
    reason: &'static str,
) -> Response<IdempotentBody<B>> {
    let mut response = refuse(status, reason);
    let seconds = config.retry_after.as_secs() + u64::from(config.retry_after.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
}

/// A response of the layer's own: `status` and a plain-text body naming the reason.
fn refuse<B: Body>(status: StatusCode, reason: &'static str) -> Response<IdempotentBody<B>> {
    let mut response = Response::new(IdempotentBody::full(Bytes::from_static(reason.as_bytes())));
    *response.status_mut() = status;
    let mut headers = HeaderMap::new();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    *response.headers_mut() = headers;
    response
}
