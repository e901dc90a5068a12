//! The body of the layer's responses: bytes it holds (a stored or buffered response, one of
//! its own), then whatever of the handler's body it has not read.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// A response body from [`IdempotencyService`](crate::IdempotencyService): the bytes the
    /// layer holds (a replayed response, a buffered one, or one of its own refusals), then the
    /// rest of the handler's body `B` where the layer did not read all of it (a response over
    /// the stored bound, or a request without a key).
    ///
    /// ```
    /// use http_body_util::BodyExt;
    /// # async fn demo(response: http::Response<fencelock_http::IdempotentBody<axum::body::Body>>) {
    /// let bytes = response.into_body().collect().await.unwrap().to_bytes();
    /// # }
    /// ```
    pub struct IdempotentBody<B: Body> {
        held: Option<Bytes>,
        #[pin]
        rest: Option<B>,
        trailers: Option<HeaderMap>,
        error: Option<B::Error>,
    }
}

impl<B: Body> std::fmt::Debug for IdempotentBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentBody")
            .field("held", &self.held.as_ref().map(Bytes::len))
            .field("rest", &self.rest.is_some())
            .field("failed", &self.error.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Body> IdempotentBody<B> {
    /// Only `bytes`.
    pub(crate) fn full(bytes: impl Into<Bytes>) -> Self {
        Self::parts(Some(bytes.into()), None, None)
    }

    /// The handler's body as it is.
    pub(crate) fn inner(body: B) -> Self {
        Self::parts(None, Some(body), None)
    }

    /// `held`, then `rest`'s frames, then `trailers`.
    pub(crate) fn parts(held: Option<Bytes>, rest: Option<B>, trailers: Option<HeaderMap>) -> Self {
        IdempotentBody {
            held: held.filter(|bytes| !bytes.is_empty()),
            rest,
            trailers,
            error: None,
        }
    }

    /// `held`, then `error`: the handler's body failed while the layer read it, and the
    /// client sees it fail after what was read.
    pub(crate) fn failed(held: Bytes, error: B::Error) -> Self {
        IdempotentBody {
            held: Some(held).filter(|bytes| !bytes.is_empty()),
            rest: None,
            trailers: None,
            error: Some(error),
        }
    }
}

impl<B> Body for IdempotentBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        if let Some(bytes) = this.held.take() {
            return Poll::Ready(Some(Ok(Frame::data(bytes))));
        }
        if let Some(rest) = this.rest.as_mut().as_pin_mut() {
            return rest.poll_frame(cx);
        }
        if let Some(trailers) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(this.error.take().map(Err))
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none()
            && self.trailers.is_none()
            && self.error.is_none()
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let held = self.held.as_ref().map_or(0, |bytes| bytes.len() as u64);
        match &self.rest {
            Some(rest) => {
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + held);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + held);
                }
                hint
            }
            None => SizeHint::with_exact(held),
        }
    }
}
