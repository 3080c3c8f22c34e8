//! What every platform client does with the platform's answers: secrets masked out of the texts
//! that reach errors and logs, and the wait a rate-limited answer asks for, read from a header.

use std::time::Duration;

/// `text` with each non-empty secret replaced by `***`: for any text made from a request or
/// an answer (an error, a log line) before it leaves the client.
pub fn mask_secrets(text: &str, secrets: &[&str]) -> String {
    let mut text = text.to_owned();
    for secret in secrets.iter().filter(|secret| !secret.is_empty()) {
        text = text.replace(secret, "***");
    }
    text
}

/// A wait given in whole seconds by header `name` (`Retry-After`, Feishu's
/// `x-ogw-ratelimit-reset`); `None` when it is absent or not a number of seconds.
pub fn header_secs(headers: &http::HeaderMap, name: &str) -> Option<Duration> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_secret_is_masked_and_an_empty_one_masks_nothing() {
        assert_eq!(
            mask_secrets(
                "bot123:abc failed for bot123:abc with s3",
                &["bot123:abc", "", "s3"]
            ),
            "*** failed for *** with ***"
        );
        assert_eq!(mask_secrets("plain", &[""]), "plain");
    }

    #[test]
    fn header_seconds_are_read_when_they_are_seconds() {
        let mut headers = http::HeaderMap::new();
        headers.insert("retry-after", http::HeaderValue::from_static(" 7 "));
        headers.insert(
            "x-other",
            http::HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(
            header_secs(&headers, "retry-after"),
            Some(Duration::from_secs(7))
        );
        assert_eq!(header_secs(&headers, "x-other"), None);
        assert_eq!(header_secs(&headers, "x-missing"), None);
    }
}
