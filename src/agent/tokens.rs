//! Counting tokens: the o200k tokenizer, built once, and a bounded [`count_tokens`]. Below the
//! middlewares (summarization budgets requests with it) and memory (the injection budget).

use std::sync::LazyLock;

use tiktoken_rs::CoreBPE;

/// The tokenizer, built once (building it takes a while); `None` if it cannot be built, and
/// then tokens are estimated from characters.
pub(crate) static TOKENIZER: LazyLock<Option<CoreBPE>> =
    LazyLock::new(|| match tiktoken_rs::o200k_base() {
        Ok(bpe) => Some(bpe),
        Err(e) => {
            tracing::warn!(error = %e, "tokenizer unavailable; token counts are estimated");
            None
        }
    });

/// Builds the tokenizer, if it is not built yet, on the blocking pool: building takes about
/// half a second and the tokenizer holds about 36 MiB, so it is built when a count is first
/// needed (a request that may pass the summarization threshold, a memory document to inject),
/// never by a deployment whose requests stay short, and never on an async worker.
pub(crate) async fn tokenizer_ready() {
    if tokio::task::spawn_blocking(|| LazyLock::force(&TOKENIZER).is_some())
        .await
        .is_err()
    {
        tracing::warn!("building the tokenizer failed; it is built where it is first used");
    }
}

/// Texts longer than this are counted from a sample of this many bytes, scaled: tokenizing
/// costs about 0.3 µs a byte (release build) and more for long runs without spaces, and a
/// hostile megabyte must not cost that on every model call.
const EXACT_COUNT_BYTES: usize = 64 * 1024;

/// The tokens of `text` (special tokens counted as plain text: it is untrusted); texts over
/// [`EXACT_COUNT_BYTES`] are extrapolated from their start.
pub(crate) fn count_tokens(text: &str) -> usize {
    if text.is_empty() {
        return 0;
    }
    let Some(bpe) = TOKENIZER.as_ref() else {
        return text.len().div_ceil(4);
    };
    if text.len() <= EXACT_COUNT_BYTES {
        return bpe.encode_ordinary(text).len();
    }
    let mut end = EXACT_COUNT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let sample = bpe.encode_ordinary(&text[..end]).len();
    sample.saturating_mul(text.len()) / end.max(1)
}
