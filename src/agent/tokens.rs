//! Counting tokens: the o200k tokenizer, built when a text first needs it, a bounded
//! [`count_tokens`] and a [`TokenBudget`] that tokenizes only when bytes alone cannot decide.
//! Below the middlewares (summarization budgets requests with it) and memory (the injection
//! budget).

use std::sync::LazyLock;

use tiktoken_rs::CoreBPE;

/// The tokenizer, built by the first text that needs it (building it takes about half a
/// second of CPU and some 20 MiB, which a process whose conversations stay short never
/// spends); `None` if it cannot be built, and then tokens are estimated from characters.
static TOKENIZER: LazyLock<Option<CoreBPE>> = LazyLock::new(|| match tiktoken_rs::o200k_base() {
    Ok(bpe) => Some(bpe),
    Err(e) => {
        tracing::warn!(error = %e, "tokenizer unavailable; token counts are estimated");
        None
    }
});

/// Texts longer than this are counted from a sample of this many bytes, scaled: tokenizing
/// costs about 0.3 µs a byte (release build) and more for long runs without spaces, and a
/// hostile megabyte must not cost that on every model call.
const EXACT_COUNT_BYTES: usize = 64 * 1024;

#[cfg(test)]
thread_local! {
    /// How many texts this thread handed to the tokenizer (tests check which paths avoid it).
    static TOKENIZED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many texts this thread has handed to the tokenizer so far.
#[cfg(test)]
pub(crate) fn tokenized_on_this_thread() -> usize {
    TOKENIZED.with(std::cell::Cell::get)
}

/// The tokens of `text` (special tokens counted as plain text: it is untrusted); texts over
/// [`EXACT_COUNT_BYTES`] are extrapolated from their start. Never more than `text.len()`:
/// a token is at least one byte.
pub(crate) fn count_tokens(text: &str) -> usize {
    if text.is_empty() {
        return 0;
    }
    #[cfg(test)]
    TOKENIZED.with(|count| count.set(count.get() + 1));
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

/// A token budget filled text by text, deciding exactly as counting every text with
/// [`count_tokens`] would, but tokenizing only when the bytes alone cannot decide: a text
/// whose bytes (an upper bound of its tokens) fit what is left surely fits, and is counted
/// only if a later text comes close to the limit.
#[derive(Debug)]
pub(crate) struct TokenBudget<'a> {
    limit: usize,
    /// The exact tokens of what was taken and counted.
    counted: usize,
    /// What was taken but not counted yet, with the tokens added to each.
    uncounted: Vec<(&'a str, usize)>,
    /// The bytes of `uncounted` plus what was added to them.
    uncounted_bound: usize,
}

impl<'a> TokenBudget<'a> {
    /// An empty budget of `limit` tokens.
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            counted: 0,
            uncounted: Vec::new(),
            uncounted_bound: 0,
        }
    }

    /// Takes `text` plus `extra` tokens when they fit what is left; whether they did.
    pub(crate) fn take(&mut self, text: &'a str, extra: usize) -> bool {
        let bound = text.len().saturating_add(extra);
        if self
            .counted
            .saturating_add(self.uncounted_bound)
            .saturating_add(bound)
            <= self.limit
        {
            self.uncounted.push((text, extra));
            self.uncounted_bound += bound;
            return true;
        }
        for (taken, added) in self.uncounted.drain(..) {
            self.counted += count_tokens(taken) + added;
        }
        self.uncounted_bound = 0;
        let cost = count_tokens(text).saturating_add(extra);
        if self.counted.saturating_add(cost) > self.limit {
            return false;
        }
        self.counted += cost;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the budget takes of `texts` (each with one extra token), counting every text.
    fn greedy(limit: usize, texts: &[&str]) -> Vec<bool> {
        let mut left = limit;
        texts
            .iter()
            .map(|text| {
                let cost = count_tokens(text) + 1;
                let fits = cost <= left;
                if fits {
                    left -= cost;
                }
                fits
            })
            .collect()
    }

    #[test]
    fn a_budget_decides_as_counting_every_text_does() {
        let texts = [
            "- [correction | 0.97] the deploy runs on Fridays",
            "- Work: antler",
            &" word".repeat(40),
            "- [preference | 0.90] short answers",
            "x",
            &"é".repeat(30),
        ];
        for limit in 0..260 {
            let mut budget = TokenBudget::new(limit);
            let taken: Vec<bool> = texts.iter().map(|text| budget.take(text, 1)).collect();
            assert_eq!(taken, greedy(limit, &texts), "limit {limit}");
        }
    }

    #[test]
    fn a_budget_that_fits_by_bytes_never_tokenizes() {
        let before = tokenized_on_this_thread();
        let mut budget = TokenBudget::new(2_000);
        for text in [
            "<memory>\n",
            "</memory>",
            "- Work: antler",
            "- [fact | 0.9] x",
        ] {
            assert!(budget.take(text, 1));
        }
        assert_eq!(tokenized_on_this_thread(), before);
        // Close to the limit, it counts.
        assert!(budget.take(&" word".repeat(400), 0));
        assert!(tokenized_on_this_thread() > before);
    }
}
