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

use crate::agent::message::ChatMessage;
use crate::agent::thread::ThreadState;

/// The characters kept from the start and from the end of a long message.
pub(crate) const HEAD_TAIL_CHARS: usize = 1_000;

/// Messages queued per item at most (the newest).
pub(crate) const MAX_MESSAGES: usize = 40;

/// Where a cut message's middle was.
const CUT_MARK: &str = "\n...[truncated]...\n";

/// Blocks of antler's own that are not the user's words.
const STRIPPED_BLOCKS: &[(&str, &str)] = &[
    ("<uploaded_files>", "</uploaded_files>"),
    ("<current_uploads>", "</current_uploads>"),
];

/// The conversation of `thread` to queue for its running turn's author; `group` when the
/// thread is a group chat.
pub(crate) fn for_memory(thread: &ThreadState, group: bool) -> Vec<ChatMessage> {
    let messages: Vec<&ChatMessage> = if group {
        match thread.turn_start() {
            Some(start) => thread.messages.iter().skip(start).collect(),
            None => Vec::new(),
        }
    } else {
        thread.context().collect()
    };
    filter(messages)
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
        let group = for_memory(&thread, true);
        assert_eq!(
            group,
            vec![
                ChatMessage::user("(ada) I like tea"),
                ChatMessage::assistant("Tea it is.")
            ]
        );
        assert!(group.iter().all(|m| !m.text().contains("vegan")));
        assert_eq!(for_memory(&thread, false).len(), 4);
    }
}
