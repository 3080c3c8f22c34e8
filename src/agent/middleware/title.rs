//! title (chain position 11): gives a new thread a short title after its first exchange.
//!
//! In `after_model`, when the thread has no title yet, holds exactly one user message outside
//! failed turns, and the
//! response is a final answer (no tool calls), it sets `ThreadState::title` from that user
//! message, locally and without a model call: whitespace collapsed, at most `max_words` words
//! and `max_chars` characters (cut on a character boundary, "…" appended when anything was
//! cut). An empty message gives "New conversation". An existing title is never replaced.
//!
//! Placement: `after_model` hooks run in reverse chain order, so at position 11 it runs after
//! loop_detection and subagent_limit (later in the chain) have rewritten the response: a
//! response whose tool calls were stripped by a forced stop counts as the final answer it has
//! become. It fails open: a missing title must never stop a run.

use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError, RunContext};
use crate::agent::message::ChatMessage;
use crate::agent::model::ModelResponse;

/// The title of a thread whose first message is empty.
pub(crate) const EMPTY_TITLE: &str = "New conversation";

/// Appended to a title that was cut.
const ELLIPSIS: char = '…';

/// `[agent.middleware.title]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct TitleConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
    /// At most this many words.
    pub(crate) max_words: usize,
    /// At most this many characters.
    pub(crate) max_chars: usize,
}

impl Default for TitleConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_words: 6,
            max_chars: 60,
        }
    }
}

/// Titles a thread from its first user message.
#[derive(Debug, Clone)]
pub(crate) struct TitleMiddleware {
    max_words: usize,
    max_chars: usize,
}

impl TitleMiddleware {
    /// The middleware, or `None` when it is disabled. Limits below 1 are raised to 1.
    pub(crate) fn from_config(cfg: &TitleConfig) -> Option<Self> {
        cfg.enabled.then(|| Self {
            max_words: cfg.max_words.max(1),
            max_chars: cfg.max_chars.max(1),
        })
    }
}

#[async_trait::async_trait]
impl Middleware for TitleMiddleware {
    fn name(&self) -> &'static str {
        "title"
    }

    async fn after_model(
        &self,
        cx: &mut RunContext<'_>,
        response: &mut ModelResponse,
    ) -> Result<(), MiddlewareError> {
        if cx.thread.title.is_some() || !response.tool_calls.is_empty() {
            return Ok(());
        }
        // Failed turns do not count: a thread whose first turn failed is titled after the
        // first exchange that was answered.
        let title = {
            let mut users = cx.thread.context().filter_map(|m| match m {
                ChatMessage::User { content, .. } => Some(content.as_str()),
                _ => None,
            });
            let (Some(first), None) = (users.next(), users.next()) else {
                return Ok(());
            };
            make_title(first, self.max_words, self.max_chars)
        };
        cx.thread.title = Some(title);
        Ok(())
    }
}

/// A title from `text`: whitespace collapsed, at most `max_words` words and `max_chars`
/// characters including the "…" appended when something was cut.
pub(crate) fn make_title(text: &str, max_words: usize, max_chars: usize) -> String {
    let mut words = text.split_whitespace();
    let mut title = words.by_ref().take(max_words).collect::<Vec<_>>().join(" ");
    if title.is_empty() {
        return EMPTY_TITLE.to_owned();
    }
    let mut cut = words.next().is_some();
    let limit = if cut {
        max_chars.saturating_sub(1)
    } else {
        max_chars
    };
    if title.chars().count() > limit {
        cut = true;
        let keep = max_chars.saturating_sub(1);
        if let Some((byte, _)) = title.char_indices().nth(keep) {
            title.truncate(byte);
        }
    }
    if cut {
        title.truncate(title.trim_end().len());
        title.push(ELLIPSIS);
    }
    title
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::message::ToolCall;
    use crate::agent::middleware::test_context;
    use crate::agent::model::FinishReason;
    use crate::agent::thread::ThreadState;

    fn answer(content: &str) -> ModelResponse {
        ModelResponse {
            content: content.into(),
            tool_calls: Vec::new(),
            usage: None,
            finish_reason: FinishReason::Stop,
            reasoning: None,
        }
    }

    fn middleware() -> TitleMiddleware {
        let Some(m) = TitleMiddleware::from_config(&TitleConfig::default()) else {
            panic!("enabled by default");
        };
        m
    }

    fn thread_with(messages: Vec<ChatMessage>) -> ThreadState {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        thread.messages = messages;
        thread
    }

    #[test]
    fn long_message_is_cut_to_six_words() {
        let title = make_title(
            "  Please   help me\nwrite a Rust function that parses TOML  ",
            6,
            60,
        );
        assert_eq!(title, "Please help me write a Rust…");
    }

    #[test]
    fn long_words_are_cut_to_sixty_chars() {
        let long = "a".repeat(100);
        let title = make_title(&format!("{long} b"), 6, 60);
        assert_eq!(title.chars().count(), 60);
        assert!(title.ends_with('…'));
        assert!(title.starts_with("aaaa"));

        // Six words that together exceed the limit.
        let words = ["abcdefghijk"; 6].join(" ");
        let title = make_title(&words, 6, 60);
        assert!(title.chars().count() <= 60, "{title}");
        assert!(title.ends_with('…'));
    }

    #[test]
    fn short_message_is_kept_whole() {
        assert_eq!(make_title("Deploy  status?", 6, 60), "Deploy status?");
        // Exactly at the limits: nothing cut, no ellipsis.
        assert_eq!(make_title("a b c d e f", 6, 60), "a b c d e f");
        assert_eq!(make_title(&"x".repeat(60), 6, 60), "x".repeat(60));
    }

    #[test]
    fn unicode_is_cut_on_char_boundaries() {
        let text = "日本語のテキスト".repeat(20);
        let title = make_title(&text, 6, 10);
        assert_eq!(title, "日本語のテキスト日…");
        assert_eq!(title.chars().count(), 10);

        let emoji = "🚀✨🔥".repeat(30);
        let title = make_title(&emoji, 6, 5);
        assert_eq!(title, "🚀✨🔥🚀…");
    }

    #[test]
    fn empty_message_gives_default_title() {
        assert_eq!(make_title("   \n\t ", 6, 60), EMPTY_TITLE);
        assert_eq!(make_title("", 6, 60), EMPTY_TITLE);
    }

    #[tokio::test]
    async fn sets_title_after_first_answer() {
        let mut thread = thread_with(vec![ChatMessage::user("Why is the build red today?")]);
        let mut cx = test_context(&mut thread);
        middleware()
            .after_model(&mut cx, &mut answer("Because of a flaky test."))
            .await
            .unwrap();
        assert_eq!(thread.title.as_deref(), Some("Why is the build red today?"));
    }

    #[tokio::test]
    async fn not_set_when_the_response_calls_tools() {
        let mut thread = thread_with(vec![ChatMessage::user("check the pods")]);
        let mut response = answer("");
        response.tool_calls.push(ToolCall {
            id: "1".into(),
            name: "shell".into(),
            arguments: "{}".into(),
        });
        response.finish_reason = FinishReason::ToolCalls;
        let mut cx = test_context(&mut thread);
        middleware()
            .after_model(&mut cx, &mut response)
            .await
            .unwrap();
        assert_eq!(thread.title, None);
    }

    #[tokio::test]
    async fn existing_title_is_not_overwritten() {
        let mut thread = thread_with(vec![ChatMessage::user("something new")]);
        thread.title = Some("Kept".into());
        let mut cx = test_context(&mut thread);
        middleware()
            .after_model(&mut cx, &mut answer("ok"))
            .await
            .unwrap();
        assert_eq!(thread.title.as_deref(), Some("Kept"));
    }

    #[tokio::test]
    async fn not_set_on_a_later_exchange() {
        let mut thread = thread_with(vec![
            ChatMessage::user("first"),
            ChatMessage::assistant("answer"),
            ChatMessage::user("second"),
        ]);
        let mut cx = test_context(&mut thread);
        middleware()
            .after_model(&mut cx, &mut answer("ok"))
            .await
            .unwrap();
        assert_eq!(thread.title, None);
    }

    #[tokio::test]
    async fn a_thread_whose_first_turn_failed_is_titled_by_its_first_answered_one() {
        let mut thread = thread_with(vec![
            ChatMessage::user("first try"),
            ChatMessage::assistant("⚠️ the model failed"),
            ChatMessage::user("Why is the build red?"),
        ]);
        thread.failed = vec![0..2];
        let mut cx = test_context(&mut thread);
        middleware()
            .after_model(&mut cx, &mut answer("A flaky test."))
            .await
            .unwrap();
        assert_eq!(thread.title.as_deref(), Some("Why is the build red?"));
    }

    #[tokio::test]
    async fn not_set_without_a_user_message() {
        let mut thread = thread_with(vec![ChatMessage::system("sys")]);
        let mut cx = test_context(&mut thread);
        middleware()
            .after_model(&mut cx, &mut answer("ok"))
            .await
            .unwrap();
        assert_eq!(thread.title, None);
    }

    #[test]
    fn disabled_config_gives_none() {
        let cfg = TitleConfig {
            enabled: false,
            ..TitleConfig::default()
        };
        assert!(TitleMiddleware::from_config(&cfg).is_none());
    }
}
