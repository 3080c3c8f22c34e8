//! Constant-time verification helpers shared by every platform crate.
//!
//! Every comparison of a secret, token or signature goes through [`constant_time_eq`], so the
//! time a rejection takes says nothing about how much of the guess was right.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::ChannelError;

/// Compares two byte strings in time that depends only on their lengths.
#[must_use]
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

/// Checks `Authorization: Bearer <token>` against the expected token in constant time.
#[must_use]
pub fn bearer_matches(headers: &http::HeaderMap, expected: &str) -> bool {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return false;
    };
    let Some(presented) = value.as_bytes().strip_prefix(b"Bearer ") else {
        return false;
    };
    constant_time_eq(presented, expected.as_bytes())
}

/// Computes HMAC-SHA256 of `message` under `key`, as lowercase hex.
#[must_use]
pub fn hmac_sha256_hex(key: &[u8], message: &[&[u8]]) -> String {
    // HMAC accepts keys of any length, so construction cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    for part in message {
        mac.update(part);
    }
    hex::encode(mac.finalize().into_bytes())
}

/// A request header as text; `None` when it is missing or not visible ASCII.
#[must_use]
pub fn header<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// The timestamp and signature headers of a signed request.
#[derive(Debug, Clone, Copy)]
pub struct SignedHeaders<'a> {
    /// The timestamp as sent (Unix seconds, checked to be fresh).
    pub timestamp: &'a str,
    /// The signature as sent, unchecked: the caller verifies it over the body.
    pub signature: &'a str,
}

/// The timestamp and signature headers of a request signed as Slack and Discord sign theirs,
/// checked before the body is read: both present and the timestamp (Unix seconds) within
/// `window_secs` of `now_secs`. Anything else is [`ChannelError::Unauthorized`].
pub fn signed_headers<'a>(
    headers: &'a http::HeaderMap,
    timestamp_header: &str,
    signature_header: &str,
    now_secs: i64,
    window_secs: i64,
) -> Result<SignedHeaders<'a>, ChannelError> {
    let (Some(timestamp), Some(signature)) = (
        header(headers, timestamp_header),
        header(headers, signature_header),
    ) else {
        return Err(ChannelError::Unauthorized);
    };
    let fresh = timestamp
        .trim()
        .parse::<i64>()
        .is_ok_and(|ts| timestamp_within(ts, now_secs, window_secs));
    if !fresh {
        return Err(ChannelError::Unauthorized);
    }
    Ok(SignedHeaders {
        timestamp,
        signature,
    })
}

/// Whether a timestamp (Unix seconds) lies within `window_secs` of `now_secs`, either side.
#[must_use]
pub fn timestamp_within(timestamp_secs: i64, now_secs: i64, window_secs: i64) -> bool {
    timestamp_secs.abs_diff(now_secs) <= window_secs.unsigned_abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_headers_need_both_and_a_fresh_timestamp() {
        let mut headers = http::HeaderMap::new();
        fn check(headers: &http::HeaderMap) -> Result<(String, String), ChannelError> {
            signed_headers(headers, "x-ts", "x-sig", 1_000, 300)
                .map(|s| (s.timestamp.to_owned(), s.signature.to_owned()))
        }
        assert_eq!(check(&headers).unwrap_err(), ChannelError::Unauthorized);
        headers.insert("x-ts", "1200".parse().unwrap());
        assert_eq!(check(&headers).unwrap_err(), ChannelError::Unauthorized);
        headers.insert("x-sig", "abc".parse().unwrap());
        assert_eq!(check(&headers).unwrap(), ("1200".into(), "abc".into()));
        headers.insert("x-ts", "1301".parse().unwrap());
        assert_eq!(check(&headers).unwrap_err(), ChannelError::Unauthorized);
        headers.insert("x-ts", "soon".parse().unwrap());
        assert_eq!(check(&headers).unwrap_err(), ChannelError::Unauthorized);
    }

    #[test]
    fn equal_and_unequal_byte_strings() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret-longer"));
    }

    #[test]
    fn bearer_token_must_match_exactly() {
        let mut headers = http::HeaderMap::new();
        assert!(!bearer_matches(&headers, "t0k"));
        headers.insert(http::header::AUTHORIZATION, "Bearer t0k".parse().unwrap());
        assert!(bearer_matches(&headers, "t0k"));
        assert!(!bearer_matches(&headers, "t0k2"));
        headers.insert(http::header::AUTHORIZATION, "Basic t0k".parse().unwrap());
        assert!(!bearer_matches(&headers, "t0k"));
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac_sha256_hex(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            mac,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn replay_window_is_symmetric() {
        assert!(timestamp_within(1_000, 1_300, 300));
        assert!(timestamp_within(1_300, 1_000, 300));
        assert!(!timestamp_within(1_000, 1_301, 300));
    }
}
