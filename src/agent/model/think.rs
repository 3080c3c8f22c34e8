//! Splits `<think>…</think>` blocks (Qwen, DeepSeek-R1 and other reasoning models served by
//! Ollama, llama.cpp ...) out of answer text, chunk by chunk.
//!
//! A block counts only where the answer has not started yet: at the very beginning (after
//! whitespace) or right after another block. Once visible text has begun, the tags are
//! ordinary text, so an answer that talks about `<think>` tags is never swallowed. A block
//! left open reaches to the end. Text that might still become a tag (`<thi`, or `</thi` inside
//! a block) is held back until the next chunk decides, so think text never reaches the
//! answer, whatever the chunking.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// What one piece of content split into.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Split {
    /// Visible answer text.
    pub(super) answer: String,
    /// Text from inside a think block.
    pub(super) reasoning: String,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing visible yet: whitespace and a possible `<think>` are held.
    #[default]
    Lead,
    /// Inside a block: a possible start of `</think>` is held.
    Think,
    /// The answer has begun: everything passes through.
    Answer,
}

/// The streaming splitter: [`ThinkSplitter::push`] each content fragment, then
/// [`ThinkSplitter::finish`] once.
#[derive(Debug, Default)]
pub(super) struct ThinkSplitter {
    state: State,
    held: String,
    /// Whether a block was seen; the whitespace that follows one is dropped.
    seen_block: bool,
}

impl ThinkSplitter {
    /// Feeds the next fragment; returns what can be decided now.
    pub(super) fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        if self.state == State::Answer {
            out.answer.push_str(text);
            return out;
        }
        self.held.push_str(text);
        loop {
            match self.state {
                State::Answer => {
                    out.answer.push_str(&std::mem::take(&mut self.held));
                    return out;
                }
                State::Lead => {
                    let rest = self.held.trim_start();
                    if rest.is_empty() || (rest.len() < OPEN.len() && OPEN.starts_with(rest)) {
                        return out;
                    }
                    if let Some(inside) = rest.strip_prefix(OPEN) {
                        self.held = inside.to_owned();
                        self.seen_block = true;
                        self.state = State::Think;
                        continue;
                    }
                    let visible = if self.seen_block {
                        rest.to_owned()
                    } else {
                        std::mem::take(&mut self.held)
                    };
                    self.held.clear();
                    out.answer.push_str(&visible);
                    self.state = State::Answer;
                    return out;
                }
                State::Think => {
                    if let Some(end) = self.held.find(CLOSE) {
                        out.reasoning.push_str(&self.held[..end]);
                        self.held.drain(..end + CLOSE.len());
                        self.state = State::Lead;
                        continue;
                    }
                    let cut = self.held.len() - partial_tag_suffix(&self.held, CLOSE);
                    out.reasoning.push_str(&self.held[..cut]);
                    self.held.drain(..cut);
                    return out;
                }
            }
        }
    }

    /// Ends the content: held text is decided (an open block's rest is reasoning, a partial
    /// tag before the answer is answer text).
    pub(super) fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        let mut out = Split::default();
        match self.state {
            State::Think => out.reasoning = held,
            State::Lead if self.seen_block => out.answer = held.trim_start().to_owned(),
            State::Lead | State::Answer => out.answer = held,
        }
        self.state = State::Answer;
        out
    }

    /// Splits a whole content string at once.
    pub(super) fn split(text: &str) -> Split {
        let mut splitter = Self::default();
        let mut out = splitter.push(text);
        let rest = splitter.finish();
        out.answer.push_str(&rest.answer);
        out.reasoning.push_str(&rest.reasoning);
        out
    }
}

/// The length of the longest proper suffix of `text` that starts `tag`.
fn partial_tag_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| {
            text.len() >= n
                && text.is_char_boundary(text.len() - n)
                && tag.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits `text` fed in pieces of `size` bytes (on character boundaries).
    fn chunked(text: &str, size: usize) -> Split {
        let mut splitter = ThinkSplitter::default();
        let mut out = Split::default();
        let mut piece = String::new();
        let mut feed = |piece: &str, out: &mut Split| {
            let part = splitter.push(piece);
            out.answer.push_str(&part.answer);
            out.reasoning.push_str(&part.reasoning);
        };
        for c in text.chars() {
            piece.push(c);
            if piece.len() >= size {
                feed(&piece, &mut out);
                piece.clear();
            }
        }
        feed(&piece, &mut out);
        let rest = splitter.finish();
        out.answer.push_str(&rest.answer);
        out.reasoning.push_str(&rest.reasoning);
        out
    }

    fn split(answer: &str, reasoning: &str) -> Split {
        Split {
            answer: answer.into(),
            reasoning: reasoning.into(),
        }
    }

    #[test]
    fn blocks_are_split_out_whatever_the_chunking() {
        let cases = [
            ("<think>plan</think>\n\nHello", split("Hello", "plan")),
            ("\n <think>a</think><think>b</think> Hi", split("Hi", "ab")),
            ("Plain answer", split("Plain answer", "")),
            ("  indented answer", split("  indented answer", "")),
            // Once the answer has begun, tags are text.
            ("Use <think> tags", split("Use <think> tags", "")),
            ("Hi <think>x</think>", split("Hi <think>x</think>", "")),
            // An unclosed block is reasoning to the end.
            ("<think>still thinking", split("", "still thinking")),
            // Something that only looked like a tag.
            ("<thi", split("<thi", "")),
            ("<b>bold</b>", split("<b>bold</b>", "")),
            ("<think>a </thin b</think>ok", split("ok", "a </thin b")),
            ("<think>ü</think>ß <think>", split("ß <think>", "ü")),
            ("", split("", "")),
        ];
        for (text, expected) in cases {
            assert_eq!(ThinkSplitter::split(text), expected, "whole: {text:?}");
            for size in 1..=text.len().max(1) {
                assert_eq!(
                    chunked(text, size),
                    expected,
                    "{text:?} in {size}-byte pieces"
                );
            }
        }
    }

    #[test]
    fn think_text_is_never_released_as_answer() {
        // Byte by byte: nothing of the block comes out as answer, and the answer comes out as
        // soon as it is certain.
        let mut splitter = ThinkSplitter::default();
        let mut answer = String::new();
        for c in "<think>secret</think>\n\nshown".chars() {
            answer.push_str(&splitter.push(&c.to_string()).answer);
            assert!(!answer.contains("secret"), "{answer:?}");
        }
        assert_eq!(answer, "shown");
        assert_eq!(splitter.finish(), Split::default());
    }

    #[test]
    fn held_text_is_only_what_may_still_be_a_tag() {
        let mut splitter = ThinkSplitter::default();
        assert_eq!(splitter.push("<thin"), split("", ""));
        assert_eq!(splitter.push("k>abc</th"), split("", "abc"));
        assert_eq!(splitter.push("ink>"), split("", ""));
        assert_eq!(splitter.push("Answer"), split("Answer", ""));
        assert_eq!(splitter.push(" <think>"), split(" <think>", ""));
    }
}
