//! The stored form of a response: what a key's record keeps as its result.
//!
//! A small binary format, every integer big-endian:
//!
//! ```text
//! "FLH1"                          4 bytes: the format and its version
//! status                          u16
//! header count                    u16
//! per header: name length         u16, then the name (lowercase, as `http` keeps it)
//!             value length        u32, then the value's bytes
//! body                            the rest, to the end
//! ```
//!
//! The whole is at most [`MAX_RESULT_LEN`](fencelock::MAX_RESULT_LEN) bytes. Written here rather
//! than with a serialization library: five fields, and one more dependency for every user.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

const MAGIC: &[u8; 4] = b"FLH1";

/// A response as stored: the status, the kept headers and the body.
#[derive(Debug)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// The stored form of `status`, `headers` (only those named in `kept`) and `body`.
pub(crate) fn encode(
    status: StatusCode,
    headers: &HeaderMap,
    kept: &[HeaderName],
    body: &[u8],
) -> Vec<u8> {
    let kept: Vec<(&HeaderName, &HeaderValue)> = headers
        .iter()
        .filter(|(name, _)| kept.contains(name))
        .collect();
    let mut out = Vec::with_capacity(8 + body.len() + kept.len() * 64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&status.as_u16().to_be_bytes());
    // At most a handful of names are kept; a header map holds far fewer than 65536 values of
    // them.
    let count = u16::try_from(kept.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&count.to_be_bytes());
    for (name, value) in kept.into_iter().take(usize::from(count)) {
        let name = name.as_str().as_bytes();
        // Header names are short (hyper refuses lines over 64 KiB anyway).
        out.extend_from_slice(&u16::try_from(name.len()).unwrap_or(0).to_be_bytes());
        out.extend_from_slice(name);
        let value = value.as_bytes();
        out.extend_from_slice(&u32::try_from(value.len()).unwrap_or(0).to_be_bytes());
        out.extend_from_slice(value);
    }
    out.extend_from_slice(body);
    out
}

/// The response stored as `stored`, or `None` when it is not in this format.
pub(crate) fn decode(stored: &[u8]) -> Option<StoredResponse> {
    let mut rest = stored.strip_prefix(MAGIC)?;
    let status = StatusCode::from_u16(u16::from_be_bytes(take(&mut rest)?)).ok()?;
    let count = u16::from_be_bytes(take(&mut rest)?);
    let mut headers = HeaderMap::new();
    for _ in 0..count {
        let len = usize::from(u16::from_be_bytes(take(&mut rest)?));
        let name = HeaderName::from_bytes(split(&mut rest, len)?).ok()?;
        let len = usize::try_from(u32::from_be_bytes(take(&mut rest)?)).ok()?;
        let value = HeaderValue::from_bytes(split(&mut rest, len)?).ok()?;
        // A header map holds at most 24576 names, and panics past them on `append`: a record
        // crafted with more is not a response of this layer's.
        headers.try_append(name, value).ok()?;
    }
    Some(StoredResponse {
        status,
        headers,
        body: Bytes::copy_from_slice(rest),
    })
}

fn take<const N: usize>(rest: &mut &[u8]) -> Option<[u8; N]> {
    split(rest, N)?.try_into().ok()
}

fn split<'a>(rest: &mut &'a [u8], len: usize) -> Option<&'a [u8]> {
    if rest.len() < len {
        return None;
    }
    let (head, tail) = rest.split_at(len);
    *rest = tail;
    Some(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{CONTENT_TYPE, LOCATION, SET_COOKIE};

    #[test]
    fn a_response_round_trips_with_its_kept_headers_only() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(LOCATION, HeaderValue::from_static("/payments/7"));
        headers.insert(SET_COOKIE, HeaderValue::from_static("session=secret"));
        let kept = [CONTENT_TYPE, LOCATION];
        let stored = encode(StatusCode::CREATED, &headers, &kept, b"{\"id\":7}");
        let back = decode(&stored).unwrap();
        assert_eq!(back.status, StatusCode::CREATED);
        assert_eq!(back.headers.len(), 2);
        assert_eq!(back.headers[LOCATION], "/payments/7");
        assert!(!back.headers.contains_key(SET_COOKIE));
        assert_eq!(&back.body[..], b"{\"id\":7}");
    }

    #[test]
    fn foreign_or_cut_data_is_not_a_response() {
        assert!(decode(b"charged").is_none());
        let stored = encode(StatusCode::OK, &HeaderMap::new(), &[], b"");
        assert!(decode(&stored[..stored.len() - 1]).is_none());
        let mut headers = HeaderMap::new();
        headers.insert(LOCATION, HeaderValue::from_static("/x"));
        let stored = encode(StatusCode::OK, &headers, &[LOCATION], b"");
        assert!(decode(&stored[..stored.len() - 1]).is_none());
    }

    #[test]
    fn a_record_with_more_names_than_a_header_map_holds_is_not_a_response() {
        let names = 30_000u16;
        let mut stored = b"FLH1".to_vec();
        stored.extend_from_slice(&200u16.to_be_bytes());
        stored.extend_from_slice(&names.to_be_bytes());
        for n in 0..names {
            let name = format!("x-{n}");
            stored.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
            stored.extend_from_slice(name.as_bytes());
            stored.extend_from_slice(&0u32.to_be_bytes());
        }
        assert!(decode(&stored).is_none());
    }
}
