//! Reading the `Idempotency-Key` header, and the key a request is stored under.

use http::{HeaderMap, HeaderName};

/// The request header that carries the key.
///
/// ```
/// let request = http::Request::post("/payments")
///     .header(fencelock_http::IDEMPOTENCY_KEY, "\"5f2c-81\"")
///     .body(())
///     .unwrap();
/// assert_eq!(request.headers()["idempotency-key"], "\"5f2c-81\"");
/// ```
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The longest key accepted, in bytes once unquoted: 255, as payment APIs accept. A longer
/// one is refused with 400.
///
/// ```
/// let key = "k".repeat(fencelock_http::MAX_KEY_LEN);
/// assert_eq!(fencelock_http::stored_key(b"", &key).len(), 2 + 255);
/// ```
pub const MAX_KEY_LEN: usize = 255;

/// The longest scope accepted ([`crate::IdempotencyLayer::scope_by`]), in bytes. A longer one
/// is refused with 400.
///
/// ```
/// // The namespace, the length prefix, the scope and the key fit one fencelock name.
/// assert!(256 + 5 + fencelock_http::MAX_SCOPE_LEN + fencelock_http::MAX_KEY_LEN < fencelock::MAX_NAME_LEN);
/// ```
pub const MAX_SCOPE_LEN: usize = 256;

/// What the request's header says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyHeader {
    /// No `Idempotency-Key` header.
    Absent,
    /// A usable key (unquoted).
    Key(String),
    /// A header that is not a key, and why.
    Malformed(&'static str),
}

/// Reads the `Idempotency-Key` header: a structured-field string (RFC 8941 §3.3.3: `"..."` of
/// printable ASCII, with `\"` and `\\` the only escapes), or with `accept_bare` also a bare key
/// of visible ASCII without quotes or spaces (what Stripe's clients send).
///
/// Written here rather than taken from a structured-field parser: the grammar of the one
/// string item a key is takes a dozen lines, and the parsers bring a decimal and a base64
/// dependency for the types a key never has; the bare form is no structured field at all.
pub(crate) fn read_key(headers: &HeaderMap, accept_bare: bool) -> KeyHeader {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return KeyHeader::Absent;
    };
    if values.next().is_some() {
        return KeyHeader::Malformed("more than one Idempotency-Key header");
    }
    // RFC 8941 §4.2: spaces around the field value are discarded before parsing.
    let raw = value.as_bytes().trim_ascii_matches_space();
    let key = if raw.first() == Some(&b'"') {
        match unquote(raw) {
            Ok(key) => key,
            Err(reason) => return KeyHeader::Malformed(reason),
        }
    } else if accept_bare {
        if !raw.iter().all(|&b| (0x21..=0x7e).contains(&b) && b != b'"') {
            return KeyHeader::Malformed("a bare key has visible ASCII characters only");
        }
        String::from_utf8_lossy(raw).into_owned()
    } else {
        return KeyHeader::Malformed("the key is not a quoted string (\"...\")");
    };
    if key.is_empty() {
        return KeyHeader::Malformed("the key is empty");
    }
    if key.len() > MAX_KEY_LEN {
        return KeyHeader::Malformed("the key is longer than 255 bytes");
    }
    KeyHeader::Key(key)
}

/// The content of an sf-string, or why it is not one.
fn unquote(raw: &[u8]) -> Result<String, &'static str> {
    let mut key = String::new();
    let mut bytes = raw[1..].iter();
    loop {
        match bytes.next() {
            None => return Err("the quoted key has no closing quote"),
            Some(b'\\') => match bytes.next() {
                Some(&c @ (b'"' | b'\\')) => key.push(char::from(c)),
                _ => return Err("the quoted key has an escape other than \\\" or \\\\"),
            },
            Some(b'"') => break,
            Some(&c) if (0x20..=0x7e).contains(&c) => key.push(char::from(c)),
            Some(_) => return Err("the quoted key has a character that is not printable ASCII"),
        }
    }
    if bytes.next().is_some() {
        return Err("the header has more than the quoted key");
    }
    Ok(key)
}

/// The key a request's run is stored under in its namespace: the scope and the key, the scope
/// length-prefixed (`<scope length>:<scope><key>`), so that no two (scope, key) pairs share
/// it: `("ab", "c")` is `2:abc`, `("a", "bc")` is `1:abc`. An empty scope (no
/// [`scope_by`](crate::IdempotencyLayer::scope_by)) is `0:<key>`.
///
/// What an operator passes to [`Idempotency::record`](fencelock::Idempotency::record) or looks
/// for in `fencelock keys`.
///
/// ```
/// assert_eq!(fencelock_http::stored_key(b"tenant-7", "order-1842"), b"8:tenant-7order-1842");
/// assert_ne!(fencelock_http::stored_key(b"ab", "c"), fencelock_http::stored_key(b"a", "bc"));
/// ```
pub fn stored_key(scope: &[u8], key: &str) -> Vec<u8> {
    let mut stored = format!("{}:", scope.len()).into_bytes();
    stored.extend_from_slice(scope);
    stored.extend_from_slice(key.as_bytes());
    stored
}

/// Spaces (only spaces, as RFC 8941 says) off both ends.
trait TrimSpace {
    fn trim_ascii_matches_space(&self) -> &[u8];
}

impl TrimSpace for [u8] {
    fn trim_ascii_matches_space(&self) -> &[u8] {
        let start = self.iter().position(|&b| b != b' ').unwrap_or(self.len());
        let end = self
            .iter()
            .rposition(|&b| b != b' ')
            .map_or(start, |i| i + 1);
        &self[start..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(values: &[&str], bare: bool) -> KeyHeader {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(IDEMPOTENCY_KEY, value.parse().unwrap());
        }
        read_key(&headers, bare)
    }

    #[test]
    fn structured_field_strings_are_keys() {
        assert_eq!(read(&[], false), KeyHeader::Absent);
        assert_eq!(read(&["\"abc-1\""], false), KeyHeader::Key("abc-1".into()));
        assert_eq!(read(&[" \"a b\" "], false), KeyHeader::Key("a b".into()));
        assert_eq!(
            read(&[r#""a\"b\\c""#], false),
            KeyHeader::Key(r#"a"b\c"#.into())
        );
        let long = format!("\"{}\"", "k".repeat(MAX_KEY_LEN));
        assert!(matches!(read(&[&long], false), KeyHeader::Key(_)));
    }

    #[test]
    fn malformed_keys_are_refused() {
        for bad in ["\"\"", "\"open", "\"a\\nb\"", "\"a\"b", "abc", "\"a\";p=1"] {
            assert!(
                matches!(read(&[bad], false), KeyHeader::Malformed(_)),
                "{bad}"
            );
        }
        let long = format!("\"{}\"", "k".repeat(MAX_KEY_LEN + 1));
        assert!(matches!(read(&[&long], false), KeyHeader::Malformed(_)));
        assert!(matches!(
            read(&["\"a\"", "\"b\""], false),
            KeyHeader::Malformed(_)
        ));
        let tab = http::HeaderValue::from_bytes(b"\"a\tb\"").unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, tab);
        assert!(matches!(read_key(&headers, false), KeyHeader::Malformed(_)));
    }

    #[test]
    fn bare_keys_only_when_accepted() {
        assert_eq!(read(&["abc-1"], true), KeyHeader::Key("abc-1".into()));
        assert_eq!(read(&["\"abc-1\""], true), KeyHeader::Key("abc-1".into()));
        assert!(matches!(read(&["a b"], true), KeyHeader::Malformed(_)));
        assert!(matches!(read(&["abc-1"], false), KeyHeader::Malformed(_)));
    }

    #[test]
    fn scopes_are_length_prefixed() {
        assert_eq!(stored_key(b"", "k"), b"0:k");
        assert_ne!(stored_key(b"1:a", "b"), stored_key(b"", "3:1:ab"));
        assert_ne!(stored_key(b"ab", "c"), stored_key(b"a", "bc"));
    }
}
