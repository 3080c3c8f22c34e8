//! Constant-time verification helpers shared by every platform crate.
//!
//! Every comparison of a secret, token or signature goes through [`constant_time_eq`], so the
//! time a rejection takes says nothing about how much of the guess was right.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

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

/// Whether a timestamp (Unix seconds) lies within `window_secs` of `now_secs`, either side.
#[must_use]
pub fn timestamp_within(timestamp_secs: i64, now_secs: i64, window_secs: i64) -> bool {
    timestamp_secs.abs_diff(now_secs) <= window_secs.unsigned_abs()
}

#[cfg(test)]
mod tests {
    use super::*;

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
