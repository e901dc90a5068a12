//! The fencing token.

use std::fmt;
use std::num::NonZeroU64;

/// A fencing token: a number that is strictly greater for every fresh acquisition of a lock
/// than for any earlier one.
///
/// Hand it to the storage you protect with every write, and have the storage reject a write
/// whose token is lower than the highest it has accepted. A holder that paused past its lease
/// (GC, page fault, `SIGSTOP`) then cannot overwrite the work of the holder that took over:
/// its token is older. A re-entry returns the token of the outer acquisition, so every frame of
/// one holder writes with the same token.
///
/// Tokens are exact integers below 2<sup>53</sup> (they pass through Lua doubles on the
/// server), never zero, and are compared as plain numbers.
///
/// ```
/// use fencelock::FencingToken;
///
/// let older = FencingToken::new(41).unwrap();
/// let newer = FencingToken::new(42).unwrap();
/// assert!(newer > older);
/// assert_eq!(newer.get(), 42);
/// assert_eq!(newer.to_string(), "42");
/// assert!(FencingToken::new(0).is_none());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(NonZeroU64);

impl FencingToken {
    /// Wraps a raw token, for example one read back from your storage. Returns `None` for zero,
    /// which is never issued.
    pub const fn new(raw: u64) -> Option<Self> {
        match NonZeroU64::new(raw) {
            Some(v) => Some(FencingToken(v)),
            None => None,
        }
    }

    /// The token as a number, to store next to the resource or bind as a SQL parameter.
    pub const fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_shows_and_converts_as_its_number() {
        let token = FencingToken::new(1_796_225_285_875_239).unwrap();
        assert_eq!(token.to_string(), "1796225285875239");
        assert_eq!(format!("{token:>18}"), "  1796225285875239");
        assert_eq!(u64::from(token), 1_796_225_285_875_239);
        assert_eq!(u64::from(FencingToken::new(7).unwrap()), 7);
    }
}
