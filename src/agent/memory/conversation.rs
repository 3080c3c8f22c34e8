//! What of a thread the memory updater reads (DeerFlow's `filter_messages_for_memory`).
//!
//! Kept: what people wrote and the model's final answers. Dropped: tool results, assistant
//! messages that call tools (their text is a step, not an answer), antler's own reminders
//! (`<system-reminder>` user-role messages), failed turns, and the `<uploaded_files>` /
//! `<current_uploads>` blocks (a message that held nothing else goes, and so does the answer
//! to it). Each kept message is cut to its head and tail, and only the newest
//! [`MAX_MESSAGES`] are kept, so a queued item stays small whatever the thread holds.
//!
//! Group chats: the thread does not record who wrote each user message, so only the running
//! turn is taken (its author's message and the answers to it), never earlier turns, which
//! may be other members'. In a direct chat every turn is the one user's.
//!
//! The watermark: in a direct chat an update carries only the messages after the thread's
//! watermark for the author (the thread index up to which the conversation was already
//! queued, kept in the thread's `memory` extension, [`MemoryMarks`]), plus the last
//! [`SEEN_TAIL`] kept messages before it as context the updater has already read. The
//! watermark moves with the turn's end in the same store transaction as the queued item, and
//! a newer item that replaces an unread one takes the older one's messages over
//! (`MemoryUpdate::take_unseen`), so every message reaches the updater once. Nothing before
//! the watermark is read again: a `/memory clear` stays cleared, and an item the worker gives
//! up on (its model call kept failing) loses its messages.
//!
//! Two small text rules on the turn's user message (upload blocks removed, trimmed):
//! - [`is_trivial`]: nothing but acknowledgements (`ok`, `thanks`, `got it`, `👍`, ...):
//!   letters and digits form at most [`TRIVIAL_MAX_WORDS`] words, each in [`ACKNOWLEDGEMENTS`]
//!   (punctuation and emoji do not count). Such a turn queues nothing and leaves the
//!   watermark where it was, so its words still reach the updater with the next update.
//! - [`is_correction`]: it starts with a correcting phrase ([`CORRECTION_STARTS`]: `no,`,
//!   `actually`, `correction:`, `I moved`, ...) or says `not X but Y`. The updater sees it
//!   marked `User (correction)` and is asked to replace the old fact.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::agent::message::ChatMessage;
use crate::agent::thread::{Extension, ThreadState};

/// The characters kept from the start and from the end of a long message.
pub(crate) const HEAD_TAIL_CHARS: usize = 1_000;

/// Messages queued per item at most (the newest).
pub(crate) const MAX_MESSAGES: usize = 40;

/// Kept messages before the watermark that go with an update as context.
pub(crate) const SEEN_TAIL: usize = 2;

/// Words a trivial message may have at most.
pub(crate) const TRIVIAL_MAX_WORDS: usize = 4;

/// The words of an acknowledgement (lower case).
const ACKNOWLEDGEMENTS: &[&str] = &[
    "ok", "okay", "k", "kk", "thanks", "thank", "you", "thx", "ty", "cheers", "cool", "great",
    "nice", "perfect", "yes", "yep", "yeah", "sure", "got", "it", "np", "lol", "alright", "fine",
    "good", "awesome", "noted", "好的", "谢谢", "好",
];

/// How a correction starts (lower case, `'` for any apostrophe).
const CORRECTION_STARTS: &[&str] = &[
    "no,",
    "no.",
    "no!",
    "nope",
    "actually",
    "correction",
    "i moved",
    "i've moved",
    "i have moved",
    "i no longer",
    "that's wrong",
    "that is wrong",
    "that's not right",
    "wrong,",
];

/// `not X but Y` within one sentence.
static NOT_BUT: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\bnot\b[^.?!\n]*\bbut\b").ok());

/// Per memory key, the thread index up to which the conversation was queued for the
/// updater (the watermark); the thread's `memory` extension.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MemoryMarks(pub(crate) BTreeMap<String, usize>);

impl Extension for MemoryMarks {
    const KEY: &'static str = "memory";
}

/// What of a thread one update carries.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Portion {
    /// The context the updater already read (`seen` of them), then the new messages.
    pub(crate) messages: Vec<ChatMessage>,
    pub(crate) seen: usize,
    /// The thread index of the first new message.
    pub(crate) from: usize,
    /// The thread index after the last message taken: the next watermark.
    pub(crate) upto: usize,
}

/// Where a cut message's middle was.
const CUT_MARK: &str = "\n...[truncated]...\n";

/// Blocks of antler's own that are not the user's words.
const STRIPPED_BLOCKS: &[(&str, &str)] = &[
    ("<uploaded_files>", "</uploaded_files>"),
    ("<current_uploads>", "</current_uploads>"),
];

/// The conversation of `thread` to queue for its running turn's author; `group` when the
/// thread is a group chat, `mark` the author's watermark in a direct chat (0: none yet).
pub(crate) fn for_memory(thread: &ThreadState, group: bool, mark: usize) -> Portion {
    let upto = thread.messages.len();
    if group {
        let from = thread.turn_start().unwrap_or(upto);
        return Portion {
            messages: filter(thread.messages.iter().skip(from)),
            seen: 0,
            from,
            upto,
        };
    }
    let from = mark.min(upto);
    let in_context = |range: std::ops::Range<usize>| {
        range
            .filter(|&index| !thread.is_failed(index))
            .filter_map(|index| thread.messages.get(index))
    };
    // A few raw messages before the mark are enough to find the kept ones among them.
    let before = from.saturating_sub(4 * SEEN_TAIL);
    let mut messages = filter(in_context(before..from));
    messages.drain(..messages.len().saturating_sub(SEEN_TAIL));
    let seen = messages.len();
    let mut new = filter(in_context(from..upto));
    new.drain(..new.len().saturating_sub(MAX_MESSAGES - seen));
    messages.extend(new);
    Portion {
        messages,
        seen,
        from,
        upto,
    }
}

/// The user message that opened the running turn, without upload blocks, trimmed.
pub(crate) fn turn_text(thread: &ThreadState) -> Option<String> {
    let start = thread.turn_start()?;
    match thread.messages.get(start)? {
        ChatMessage::User { content, .. } => Some(strip_blocks(content).trim().to_owned()),
        _ => None,
    }
}

/// Whether `text` is only an acknowledgement (see the module doc).
pub(crate) fn is_trivial(text: &str) -> bool {
    let letters: String = text
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { ' ' })
        .collect::<String>()
        .to_lowercase();
    let words: Vec<&str> = letters.split_whitespace().collect();
    words.len() <= TRIVIAL_MAX_WORDS && words.iter().all(|w| ACKNOWLEDGEMENTS.contains(w))
}

/// Whether `text` corrects something said before (see the module doc).
pub(crate) fn is_correction(text: &str) -> bool {
    let text = text.trim().to_lowercase().replace(['\u{2019}', '`'], "'");
    CORRECTION_STARTS
        .iter()
        .any(|start| text.starts_with(start))
        || NOT_BUT.as_ref().is_some_and(|re| re.is_match(&text))
}

/// Filters and cuts `messages` (see the module doc).
pub(crate) fn filter<'a>(messages: impl IntoIterator<Item = &'a ChatMessage>) -> Vec<ChatMessage> {
    let mut kept = Vec::new();
    let mut skip_answer = false;
    for message in messages {
        match message {
            ChatMessage::User { content, .. } => {
                if content.trim_start().starts_with("<system-reminder>") {
                    continue;
                }
                let text = strip_blocks(content);
                let text = text.trim();
                skip_answer = text.is_empty();
                if !skip_answer {
                    kept.push(ChatMessage::user(cut(text)));
                }
            }
            ChatMessage::Assistant {
                content,
                tool_calls,
                ..
            } => {
                if !tool_calls.is_empty() || content.trim().is_empty() {
                    continue;
                }
                if !std::mem::take(&mut skip_answer) {
                    kept.push(ChatMessage::assistant(cut(content.trim())));
                }
            }
            ChatMessage::System { .. } | ChatMessage::Tool { .. } => {}
        }
    }
    let excess = kept.len().saturating_sub(MAX_MESSAGES);
    kept.drain(..excess);
    kept
}

/// `text` without the blocks of [`STRIPPED_BLOCKS`] (an unclosed block runs to the end).
fn strip_blocks(text: &str) -> String {
    let mut out = text.to_owned();
    for (open, close) in STRIPPED_BLOCKS {
        while let Some(start) = out.find(open) {
            let end = out[start..]
                .find(close)
                .map_or(out.len(), |at| start + at + close.len());
            out.replace_range(start..end, "");
        }
    }
    out
}

/// `text` cut to its head and tail when it is longer than twice [`HEAD_TAIL_CHARS`].
pub(crate) fn cut(text: &str) -> String {
    let chars = text.chars().count();
    if chars <= 2 * HEAD_TAIL_CHARS {
        return text.to_owned();
    }
    let head: String = text.chars().take(HEAD_TAIL_CHARS).collect();
    let tail: String = text.chars().skip(chars - HEAD_TAIL_CHARS).collect();
    format!("{head}{CUT_MARK}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::message::ToolCall;
    use crate::agent::thread::RunningTurn;

    fn call() -> ToolCall {
        ToolCall {
            id: "c1".into(),
            name: "bash".into(),
            arguments: "{}".into(),
        }
    }

    #[test]
    fn keeps_people_and_final_answers_only() {
        let messages = vec![
            ChatMessage::system("you are antler"),
            ChatMessage::user("what time is it?"),
            ChatMessage::assistant_calls("let me look", vec![call()]),
            ChatMessage::tool("c1", "12:00"),
            ChatMessage::user("<system-reminder>todo: finish</system-reminder>"),
            ChatMessage::assistant("It is noon."),
        ];
        assert_eq!(
            filter(&messages),
            vec![
                ChatMessage::user("what time is it?"),
                ChatMessage::assistant("It is noon.")
            ]
        );
    }

    #[test]
    fn upload_blocks_go_and_an_upload_only_turn_goes_with_its_answer() {
        let messages = vec![
            ChatMessage::user("<uploaded_files>\n- a.pdf\n</uploaded_files>"),
            ChatMessage::assistant("I see a PDF."),
            ChatMessage::user("summarise it\n<uploaded_files>\n- b.pdf\n</uploaded_files>"),
            ChatMessage::assistant("It is about tea."),
            ChatMessage::user("and <current_uploads>x</current_uploads>this"),
        ];
        assert_eq!(
            filter(&messages),
            vec![
                ChatMessage::user("summarise it"),
                ChatMessage::assistant("It is about tea."),
                ChatMessage::user("and this"),
            ]
        );
    }

    #[test]
    fn long_messages_keep_head_and_tail_and_old_ones_go() {
        let long = format!(
            "{}{}{}",
            "a".repeat(1_500),
            "m".repeat(500),
            "z".repeat(1_500)
        );
        let kept = filter(&[ChatMessage::user(long)]);
        let text = kept[0].text();
        assert!(text.starts_with(&"a".repeat(1_000)) && text.ends_with(&"z".repeat(1_000)));
        assert!(text.contains("[truncated]") && !text.contains('m'));
        assert_eq!(text.chars().count(), 2_000 + CUT_MARK.len());

        let many: Vec<ChatMessage> = (0..100)
            .map(|i| ChatMessage::user(format!("m{i}")))
            .collect();
        let kept = filter(&many);
        assert_eq!(kept.len(), MAX_MESSAGES);
        assert_eq!(kept.last().map(ChatMessage::text), Some("m99"));
    }

    fn dm_thread(texts: &[&str]) -> ThreadState {
        let mut thread = ThreadState::new("t".into(), "api:ada".into(), 0, 0);
        for (i, text) in texts.iter().enumerate() {
            thread.messages.push(if i % 2 == 0 {
                ChatMessage::user(*text)
            } else {
                ChatMessage::assistant(*text)
            });
        }
        thread
    }

    fn texts(portion: &Portion) -> Vec<&str> {
        portion.messages.iter().map(ChatMessage::text).collect()
    }

    #[test]
    fn after_the_watermark_only_new_messages_and_a_seen_tail() {
        let thread = dm_thread(&["I like tea", "Noted.", "I live in Lyon", "Nice."]);
        let first = for_memory(&thread, false, 0);
        assert_eq!(
            texts(&first),
            ["I like tea", "Noted.", "I live in Lyon", "Nice."]
        );
        assert_eq!((first.seen, first.from, first.upto), (0, 0, 4));

        let mut thread = thread;
        thread.messages.push(ChatMessage::user("I work on antler"));
        thread.messages.push(ChatMessage::assistant("Cool."));
        let second = for_memory(&thread, false, first.upto);
        assert_eq!(
            texts(&second),
            ["I live in Lyon", "Nice.", "I work on antler", "Cool."]
        );
        assert_eq!((second.seen, second.from, second.upto), (2, 4, 6));

        // A mark past the end (a thread read by an older version) takes nothing new.
        let none = for_memory(&thread, false, 99);
        assert_eq!(none.messages.len(), none.seen);
    }

    #[test]
    fn trivial_turns_are_acknowledgements_only() {
        for trivial in [
            "ok",
            "OK!",
            "thanks",
            "Thank you :)",
            "👍",
            "got it, thx",
            "🙏🙏",
            "",
            "好的",
        ] {
            assert!(is_trivial(trivial), "{trivial:?}");
        }
        for meaningful in [
            "ok, I moved to Berlin",
            "thanks, call me Ada",
            "no",
            "42",
            "ok ok ok ok ok",
            "I like tea",
        ] {
            assert!(!is_trivial(meaningful), "{meaningful:?}");
        }
    }

    #[test]
    fn corrections_start_with_a_correcting_phrase_or_say_not_x_but_y() {
        for correction in [
            "no, I moved to Berlin",
            "Actually I prefer Go",
            "Correction: my name is Ada",
            "I moved to Berlin last week",
            "That\u{2019}s wrong, it is Lyon",
            "I use not Python but Rust",
        ] {
            assert!(is_correction(correction), "{correction:?}");
        }
        for plain in [
            "I live in Berlin",
            "nothing but tea",
            "no problem",
            "Note: but",
        ] {
            assert!(!is_correction(plain), "{plain:?}");
        }
    }

    #[test]
    fn a_group_chat_yields_only_the_running_turn() {
        let mut thread = ThreadState::new("t".into(), "telegram:g1".into(), 0, 0);
        thread
            .messages
            .push(ChatMessage::user("(bob) I am a vegan"));
        thread.messages.push(ChatMessage::assistant("Noted, Bob."));
        thread.messages.push(ChatMessage::user("(ada) I like tea"));
        thread.messages.push(ChatMessage::assistant("Tea it is."));
        thread.running = Some(RunningTurn {
            inbox_seq: 1,
            start: 2,
        });
        let group = for_memory(&thread, true, 0).messages;
        assert_eq!(
            group,
            vec![
                ChatMessage::user("(ada) I like tea"),
                ChatMessage::assistant("Tea it is.")
            ]
        );
        assert!(group.iter().all(|m| !m.text().contains("vegan")));
        assert_eq!(for_memory(&thread, false, 0).messages.len(), 4);
    }
}
