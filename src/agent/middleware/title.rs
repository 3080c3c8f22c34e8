//! title (chain position 11): gives a new thread a short title after its first exchange.
//!
//! In `after_run`, when a run ended with an answer, the thread has no title yet, and it holds
//! exactly one user message outside failed turns, it asks the model for a title with a helper
//! call, as DeerFlow does: the question and the answer (each cut to 500 characters) and
//! "Generate a concise title (max 6 words) …". The reply is cleaned (`<think>` blocks, quotes
//! and anything after the first line removed) and held to `max_words` words and `max_chars`
//! characters (cut on a character boundary, "…" appended when anything was cut). When the call
//! fails, times out (15 s) or returns nothing usable, or `use_model` is off, the question
//! itself, cut the same way, is the title. An empty question gives "New conversation". An
//! existing title is never replaced.
//!
//! Placement: `after_run` hooks run in reverse chain order, after the later middlewares
//! (memory, loop_detection) have seen the run end. Titling after the run rather than after
//! the model call means the title describes the question *and* the answer the user got; the
//! helper call's tokens count towards the thread. It fails open: a missing title must never
//! stop a run.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError, RunContext, RunEnding};
use crate::agent::message::ChatMessage;
use crate::agent::model::ModelRequest;

/// The title of a thread whose first message is empty.
pub(crate) const EMPTY_TITLE: &str = "New conversation";

/// Appended to a title that was cut.
const ELLIPSIS: char = '…';

/// How much of the question and of the answer the title prompt quotes.
const PROMPT_EXCERPT_CHARS: usize = 500;

/// How long the title call may take before the question is used instead.
const TITLE_CALL_LIMIT: Duration = Duration::from_secs(15);

/// `[agent.middleware.title]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct TitleConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
    /// Whether the model writes the title (one small helper call per new thread); otherwise
    /// the question, shortened, is the title.
    pub(crate) use_model: bool,
    /// At most this many words.
    pub(crate) max_words: usize,
    /// At most this many characters.
    pub(crate) max_chars: usize,
}

impl Default for TitleConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            use_model: true,
            max_words: 6,
            max_chars: 60,
        }
    }
}

/// Titles a thread after its first answered exchange.
#[derive(Debug, Clone)]
pub(crate) struct TitleMiddleware {
    use_model: bool,
    max_words: usize,
    max_chars: usize,
}

impl TitleMiddleware {
    /// The middleware, or `None` when it is disabled. Limits below 1 are raised to 1.
    pub(crate) fn from_config(cfg: &TitleConfig) -> Option<Self> {
        cfg.enabled.then(|| Self {
            use_model: cfg.use_model,
            max_words: cfg.max_words.max(1),
            max_chars: cfg.max_chars.max(1),
        })
    }

    /// The title the model proposes, cleaned, or `None`.
    async fn model_title(
        &self,
        cx: &mut RunContext<'_>,
        question: &str,
        answer: &str,
    ) -> Option<String> {
        let prompt = format!(
            "Generate a concise title (max {} words) for this conversation.\nUser: {}\n\
             Assistant: {}\n\nReturn ONLY the title, no quotes, no explanation.",
            self.max_words,
            excerpt(question),
            excerpt(answer)
        );
        let request = ModelRequest {
            messages: vec![ChatMessage::user(prompt)],
            tools: Vec::new(),
        };
        let response =
            tokio::time::timeout(TITLE_CALL_LIMIT, cx.helper_complete("title", &request)).await;
        let text = match response {
            Ok(Ok(response)) => response.content,
            Ok(Err(e)) => {
                tracing::debug!(thread = %cx.thread.id, error = %e, "title call failed; using the question");
                return None;
            }
            Err(_) => {
                tracing::debug!(thread = %cx.thread.id, "title call timed out; using the question");
                return None;
            }
        };
        let cleaned = clean_title(&text);
        (!cleaned.is_empty()).then(|| make_title(&cleaned, self.max_words, self.max_chars))
    }
}

#[async_trait::async_trait]
impl Middleware for TitleMiddleware {
    fn name(&self) -> &'static str {
        "title"
    }

    async fn after_run(&self, cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
        if cx.thread.title.is_some() || cx.ending != Some(RunEnding::Answered) {
            return Ok(());
        }
        // Failed turns do not count: a thread whose first turn failed is titled after the
        // first exchange that was answered.
        let (question, answer) = {
            let mut users = cx.thread.context().filter_map(|m| match m {
                ChatMessage::User { content, .. } => Some(content.as_str()),
                _ => None,
            });
            let (Some(first), None) = (users.next(), users.next()) else {
                return Ok(());
            };
            let answer = match cx.thread.messages.last() {
                Some(ChatMessage::Assistant { content, .. }) => content.clone(),
                _ => String::new(),
            };
            (first.to_owned(), answer)
        };
        let title = if self.use_model && !question.trim().is_empty() {
            self.model_title(cx, &question, &answer).await
        } else {
            None
        };
        cx.thread.title =
            Some(title.unwrap_or_else(|| make_title(&question, self.max_words, self.max_chars)));
        Ok(())
    }
}

/// At most [`PROMPT_EXCERPT_CHARS`] characters of `text`.
fn excerpt(text: &str) -> &str {
    text.char_indices()
        .nth(PROMPT_EXCERPT_CHARS)
        .map_or(text, |(byte, _)| &text[..byte])
}

/// The title in a model's reply: `<think>` blocks dropped, the first non-empty line, without
/// surrounding quotes, a "Title:" label or a trailing period.
fn clean_title(reply: &str) -> String {
    let mut text = reply.to_owned();
    while let Some(start) = text.find("<think>") {
        let end = text[start..]
            .find("</think>")
            .map_or(text.len(), |end| start + end + "</think>".len());
        text.replace_range(start..end, "");
    }
    let line = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .unwrap_or_default();
    let line = line
        .strip_prefix("Title:")
        .or_else(|| line.strip_prefix("title:"))
        .unwrap_or(line)
        .trim();
    let decoration = |c: char| matches!(c, '"' | '\'' | '`' | '*' | '“' | '”' | '「' | '」');
    line.trim_start_matches(decoration)
        .trim_end_matches(|c: char| decoration(c) || c == '.')
        .trim()
        .to_owned()
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
    use crate::agent::input::RunInput;
    use crate::agent::model::scripted::ScriptedModel;
    use crate::agent::thread::ThreadState;

    /// Runs `after_run` on `thread` as after a run that ended with `ending`, with a model that
    /// answers the title call with `reply` (or fails when there is none).
    async fn title_after(
        thread: &mut ThreadState,
        ending: RunEnding,
        reply: Option<&str>,
    ) -> Vec<ModelRequest> {
        let script = reply.map(ScriptedModel::text).into_iter().collect();
        let model = ScriptedModel::new(script);
        let input = RunInput::text("test", "user", "hi");
        let mut cx = RunContext::new(thread, &input, &model);
        cx.ending = Some(ending);
        middleware().after_run(&mut cx).await.unwrap();
        model.requests()
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
    async fn the_model_titles_the_first_exchange() {
        let mut thread = thread_with(vec![
            ChatMessage::user("Why is the build red today?"),
            ChatMessage::assistant("Because of a flaky test."),
        ]);
        let requests = title_after(
            &mut thread,
            RunEnding::Answered,
            Some("<think>short</think>\n\"Flaky build test investigation.\"\nmore"),
        )
        .await;
        assert_eq!(
            thread.title.as_deref(),
            Some("Flaky build test investigation")
        );
        let prompt = requests[0].messages[0].text();
        assert!(prompt.contains("max 6 words"), "{prompt}");
        assert!(
            prompt.contains("User: Why is the build red today?"),
            "{prompt}"
        );
        assert!(
            prompt.contains("Assistant: Because of a flaky test."),
            "{prompt}"
        );
        assert!(requests[0].tools.is_empty());
        // The helper call's tokens count.
        assert_eq!(thread.usage.total_tokens, 15);
    }

    #[tokio::test]
    async fn a_long_model_title_is_held_to_the_limits() {
        let mut thread = thread_with(vec![ChatMessage::user("q"), ChatMessage::assistant("a")]);
        title_after(
            &mut thread,
            RunEnding::Answered,
            Some("Title: one two three four five six seven eight"),
        )
        .await;
        assert_eq!(
            thread.title.as_deref(),
            Some("one two three four five six…")
        );
    }

    #[tokio::test]
    async fn the_question_is_the_title_when_the_call_fails_or_says_nothing() {
        let mut thread = thread_with(vec![
            ChatMessage::user("Why is the build red today?"),
            ChatMessage::assistant("Because of a flaky test."),
        ]);
        title_after(&mut thread, RunEnding::Answered, None).await;
        assert_eq!(thread.title.as_deref(), Some("Why is the build red today?"));

        let mut thread = thread_with(vec![
            ChatMessage::user("Please help me write a Rust function that parses TOML"),
            ChatMessage::assistant("Sure."),
        ]);
        title_after(&mut thread, RunEnding::Answered, Some("  \"\"  ")).await;
        assert_eq!(
            thread.title.as_deref(),
            Some("Please help me write a Rust…")
        );
    }

    #[tokio::test]
    async fn only_an_answered_first_exchange_gets_a_title() {
        for ending in [
            RunEnding::Failed,
            RunEnding::TimedOut,
            RunEnding::Interrupted,
        ] {
            let mut thread = thread_with(vec![ChatMessage::user("check the pods")]);
            let requests = title_after(&mut thread, ending, Some("Pods")).await;
            assert_eq!(thread.title, None, "{ending:?}");
            assert!(requests.is_empty());
        }
        let mut thread = thread_with(vec![
            ChatMessage::user("first"),
            ChatMessage::assistant("answer"),
            ChatMessage::user("second"),
            ChatMessage::assistant("again"),
        ]);
        title_after(&mut thread, RunEnding::Answered, Some("Nope")).await;
        assert_eq!(thread.title, None, "not on a later exchange");

        let mut thread = thread_with(vec![ChatMessage::user("new"), ChatMessage::assistant("x")]);
        thread.title = Some("Kept".into());
        title_after(&mut thread, RunEnding::Answered, Some("Nope")).await;
        assert_eq!(thread.title.as_deref(), Some("Kept"));
    }

    #[tokio::test]
    async fn a_thread_whose_first_turn_failed_is_titled_by_its_first_answered_one() {
        let mut thread = thread_with(vec![
            ChatMessage::user("first try"),
            ChatMessage::assistant("⚠️ the model failed"),
            ChatMessage::user("Why is the build red?"),
            ChatMessage::assistant("A flaky test."),
        ]);
        thread.failed = vec![0..2];
        title_after(&mut thread, RunEnding::Answered, None).await;
        assert_eq!(thread.title.as_deref(), Some("Why is the build red?"));
    }

    #[test]
    fn model_replies_are_cleaned() {
        assert_eq!(
            clean_title("“Kubernetes pod restarts”"),
            "Kubernetes pod restarts"
        );
        assert_eq!(clean_title("**Deploy plan**."), "Deploy plan");
        assert_eq!(
            clean_title("<think>hmm\n</think>\n\nDB outage"),
            "DB outage"
        );
        assert_eq!(clean_title("<think>never closed"), "");
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
