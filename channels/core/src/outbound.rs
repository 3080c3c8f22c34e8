//! What every platform client does with the platform's answers: secrets masked out of the texts
//! that reach errors and logs, the wait a rate-limited answer asks for, read from a header, and
//! downloads bounded in size.

use std::time::Duration;

use futures_util::{Stream, StreamExt};

use crate::ChannelError;

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

/// A download of at most `max_bytes`, read from `chunks` (a body's chunks as they arrive). A
/// larger one is [`ChannelError::TooLarge`]: known before reading from the size the platform
/// `declared` (a `Content-Length`, Telegram's file size), else once the chunks pass the limit,
/// without reading the rest. A chunk that fails becomes `read_error`'s error.
pub async fn read_bounded<S, B, E>(
    chunks: S,
    declared: Option<u64>,
    max_bytes: u64,
    read_error: impl Fn(E) -> ChannelError,
) -> Result<Vec<u8>, ChannelError>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
{
    if declared.is_some_and(|len| len > max_bytes) {
        return Err(ChannelError::TooLarge { limit: max_bytes });
    }
    let mut chunks = std::pin::pin!(chunks);
    let mut bytes = Vec::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(&read_error)?;
        let chunk = chunk.as_ref();
        if (bytes.len() + chunk.len()) as u64 > max_bytes {
            return Err(ChannelError::TooLarge { limit: max_bytes });
        }
        bytes.extend_from_slice(chunk);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(parts: &[&'static [u8]]) -> impl Stream<Item = Result<&'static [u8], String>> {
        futures_util::stream::iter(parts.iter().map(|p| Ok(*p)).collect::<Vec<_>>())
    }

    #[tokio::test]
    async fn a_download_is_read_up_to_its_limit_and_refused_past_it() {
        let error = |e: String| ChannelError::Transient(e);
        let read = read_bounded(chunks(&[b"ab", b"cd"]), Some(4), 4, error).await;
        assert_eq!(read.unwrap(), b"abcd");
        // Declared too large: refused before a byte is read.
        let declared = read_bounded(chunks(&[b"ab"]), Some(5), 4, error).await;
        assert!(matches!(declared, Err(ChannelError::TooLarge { limit: 4 })));
        // Not declared (or declared wrongly): refused when the chunks pass the limit.
        let read = read_bounded(chunks(&[b"abc", b"de", b"never read"]), Some(1), 4, error).await;
        assert!(matches!(read, Err(ChannelError::TooLarge { limit: 4 })));
        let failing = futures_util::stream::iter(vec![Ok(&b"a"[..]), Err("reset".to_owned())]);
        let read = read_bounded(failing, None, 4, error).await;
        assert!(matches!(read, Err(ChannelError::Transient(ref e)) if e == "reset"));
    }

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
