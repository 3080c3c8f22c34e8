//! title (chain position 11): gives a new thread a short title after its first model answer.
//!
//! The thread's first turn (no earlier exchange in its context; failed turns do not count) is
//! titled when its run ends, however it ends, once the model has answered at least once: with
//! an answer, with a clarification question, stopped (a forced loop stop, the user's `/stop`
//! after a model answer), with todo reminders in between, or even failed or timed out after
//! an answer, as DeerFlow titles in `after_model` after the first AI message. The
//! title comes from a helper call, as DeerFlow does: the question and the answer (the turn's
//! last non-empty assistant text, else the question the run asks, each cut to 500 characters)
//! and "Generate a concise title (max 6 words) …". The reply is cleaned (`<think>` blocks,
//! quotes and anything after the first line removed), made plain text (Markdown emphasis,
//! code marks, links and headings reduced to their text, so a cut never leaves half a mark)
//! and held to `max_words` words and
//! `max_chars` characters (cut on a character boundary, "…" appended when anything was cut).
//! When the call fails, times out (15 s) or returns nothing usable, or `use_model` is off, the
//! question itself, cut the same way, is the title. A first run the user stopped before the
//! model answered gets that fallback title too (DeerFlow's interrupted path); a first run that
//! failed or timed out before any answer gets none, and leaves the context, so the next turn
//! is the first again. An empty question gives "New conversation". An existing title is never
//! replaced.
//!
//! The answer does not wait for the title: `after_run` gives the thread the fallback title at
//! once and starts the helper call in a task of its own, handed out as the run's
//! [`PendingTitle`] (`RunOutputs::title`). The turn runner finishes the turn (with the
//! fallback title) and hands the reply to delivery, then, still holding the conversation's
//! lane, waits for the call and writes the model's title if the thread still carries the
//! fallback (`pending_title::TitleUpdate::apply`). A crash (or a failed write) between the reply and the
//! title write leaves the fallback title; a shutdown that interrupts the running turns
//! abandons the call, with the same result.
//!
//! Which turn is the first is decided in `before_run` and kept in the run's state: later in
//! the run the thread may hold more user messages of the same turn (todo reminders).
//!
//! Placement: `after_run` hooks run in reverse chain order, after the later middlewares
//! (memory, loop_detection) have seen the run end. Titling after the run rather than after
//! the model call means the title describes the question *and* the answer the user got, and
//! adds no wait before the first tool call. The helper call's tokens count towards the
//! thread when its title is written (not towards the run, which has ended by then). It fails
//! open: a missing title must never stop a run.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use super::context::complete_helper;
use super::pending_title::{ModelTitle, PendingTitle};
use super::{Middleware, MiddlewareError, RunContext, RunEnding};
use crate::agent::message::ChatMessage;
use crate::agent::model::ModelRequest;
use crate::agent::thread::ThreadState;

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

/// Where the run's turn starts when it is the thread's first turn (`None`: a later turn), as
/// `before_run` found it.
#[derive(Debug, Clone, Default)]
struct FirstTurn(Option<usize>);

/// The index of the current turn's user message when nothing before it counts (failed turns
/// do not): the thread's first turn.
fn first_turn(thread: &ThreadState) -> Option<usize> {
    let start = thread.turn_start()?;
    let earlier = (0..start).any(|index| !thread.is_failed(index));
    (!earlier).then_some(start)
}

/// What the turn starting at `start` answered: its last non-empty assistant text, else the
/// question the run asks the user, else nothing.
fn answer_of(thread: &ThreadState, start: usize) -> String {
    thread
        .messages
        .get(start + 1..)
        .unwrap_or_default()
        .iter()
        .rev()
        .find_map(|m| match m {
            ChatMessage::Assistant { content, .. } if !content.trim().is_empty() => {
                Some(content.clone())
            }
            _ => None,
        })
        .or_else(|| thread.pending_question.as_ref().map(|q| q.question.clone()))
        .unwrap_or_default()
}

/// Titles a thread after its first model answer.
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

    /// Starts the call in which the model proposes a title for the exchange of `question`
    /// and `answer`; the thread carries `fallback` until it is written.
    fn start_model_title(
        &self,
        cx: &RunContext<'_>,
        question: &str,
        answer: &str,
        fallback: String,
    ) -> PendingTitle {
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
        let model = cx.model();
        let thread = cx.thread.id.clone();
        let (max_words, max_chars) = (self.max_words, self.max_chars);
        let call = async move {
            let response = tokio::time::timeout(
                TITLE_CALL_LIMIT,
                complete_helper(model.as_ref(), "title", &request),
            )
            .await;
            let response = match response {
                Ok(Ok(response)) => response,
                Ok(Err(e)) => {
                    tracing::debug!(%thread, error = %e, "title call failed; the question stays the title");
                    return ModelTitle::default();
                }
                Err(_) => {
                    tracing::debug!(%thread, "title call timed out; the question stays the title");
                    return ModelTitle::default();
                }
            };
            let cleaned = clean_title(&response.content);
            ModelTitle {
                title: (!cleaned.is_empty()).then(|| make_title(&cleaned, max_words, max_chars)),
                usage: response.usage,
            }
        };
        PendingTitle::new(
            fallback,
            AbortOnDropHandle::new(tokio::spawn(call.in_current_span())),
        )
    }
}

#[async_trait::async_trait]
impl Middleware for TitleMiddleware {
    fn name(&self) -> &'static str {
        "title"
    }

    async fn before_run(&self, cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
        if cx.thread.title.is_none() {
            *cx.state.get_or_default() = FirstTurn(first_turn(cx.thread));
        }
        Ok(())
    }

    async fn after_run(&self, cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
        if cx.thread.title.is_some() {
            return Ok(());
        }
        // A run cut short before `before_run` has not changed the thread since it started.
        let start = match cx.state.get::<FirstTurn>() {
            Some(FirstTurn(start)) => *start,
            None => first_turn(cx.thread),
        };
        let Some(start) = start else {
            return Ok(());
        };
        let answered = cx.model_calls > 0 || cx.ending == Some(RunEnding::Answered);
        let stopped = cx.ending == Some(RunEnding::Stopped);
        if !answered && !stopped {
            return Ok(());
        }
        let question = match cx.thread.messages.get(start) {
            Some(ChatMessage::User { content, .. }) => content.clone(),
            _ => return Ok(()),
        };
        let fallback = make_title(&question, self.max_words, self.max_chars);
        cx.thread.title = Some(fallback.clone());
        if answered && self.use_model && !question.trim().is_empty() {
            let answer = answer_of(cx.thread, start);
            cx.outputs.title = Some(self.start_model_title(cx, &question, &answer, fallback));
        }
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

/// The text of `markdown` without its marks: emphasis, code spans, links and images (their
/// text), headings, lists and quotes; blocks and line breaks become spaces.
fn plain_text(markdown: &str) -> String {
    use pulldown_cmark::{Event, Parser, TagEnd};
    let mut plain = String::with_capacity(markdown.len());
    for event in Parser::new(markdown) {
        match event {
            Event::Text(text)
            | Event::Code(text)
            | Event::Html(text)
            | Event::InlineHtml(text)
            | Event::InlineMath(text)
            | Event::DisplayMath(text) => plain.push_str(&text),
            Event::SoftBreak
            | Event::HardBreak
            | Event::Rule
            | Event::End(
                TagEnd::Paragraph
                | TagEnd::Heading(_)
                | TagEnd::BlockQuote(_)
                | TagEnd::CodeBlock
                | TagEnd::HtmlBlock
                | TagEnd::Item
                | TagEnd::TableCell
                | TagEnd::TableRow
                | TagEnd::TableHead,
            ) => plain.push(' '),
            _ => {}
        }
    }
    plain
}

/// A title from `text`: Markdown reduced to plain text, whitespace collapsed, at most
/// `max_words` words and `max_chars` characters including the "…" appended when something
/// was cut.
pub(crate) fn make_title(text: &str, max_words: usize, max_chars: usize) -> String {
    let text = plain_text(text);
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::agent::input::RunInput;
    use crate::agent::model::scripted::ScriptedModel;
    use crate::agent::model::{ChatModel, DeltaSink, ModelError, ModelResponse};
    use crate::agent::thread::ThreadState;

    /// Runs `after_run` on `thread` as after a run that ended with `ending`, with a model that
    /// answers the title call with `reply` (or fails when there is none), then writes the
    /// model's title as the turn runner does after the reply.
    async fn title_after(
        thread: &mut ThreadState,
        ending: RunEnding,
        reply: Option<&str>,
    ) -> Vec<ModelRequest> {
        let script = reply.map(ScriptedModel::text).into_iter().collect();
        let model = Arc::new(ScriptedModel::new(script));
        let input = RunInput::text("test", "user", "hi");
        let mut cx = RunContext::new(thread, &input, model.clone());
        cx.ending = Some(ending);
        middleware().after_run(&mut cx).await.unwrap();
        let pending = cx.outputs.title.take();
        write_title(thread, pending).await;
        model.requests()
    }

    /// What the turn runner does with a pending title once the reply is out: waits for it and
    /// applies it to the thread.
    async fn write_title(thread: &mut ThreadState, pending: Option<PendingTitle>) {
        if let Some(pending) = pending {
            pending.wait().await.apply(thread);
        }
    }

    /// A model that never answers; it notes when a call of it starts and when it is dropped
    /// (abandoned).
    #[derive(Default)]
    struct Silent {
        started: AtomicBool,
        abandoned: Arc<AtomicBool>,
    }

    /// Sets its flag when dropped.
    struct DropFlag(Arc<AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[async_trait::async_trait]
    impl ChatModel for Silent {
        fn name(&self) -> &str {
            "silent"
        }

        async fn complete(
            &self,
            _request: &ModelRequest,
            _deltas: Option<DeltaSink<'_>>,
        ) -> Result<ModelResponse, ModelError> {
            let _flag = DropFlag(Arc::clone(&self.abandoned));
            self.started.store(true, Ordering::SeqCst);
            std::future::pending().await
        }
    }

    /// `after_run` after an answered first exchange, with a model that never answers the
    /// title call; the pending title.
    async fn title_with_a_silent_model(
        thread: &mut ThreadState,
        model: Arc<Silent>,
    ) -> PendingTitle {
        let input = RunInput::text("test", "user", "hi");
        let mut cx = RunContext::new(thread, &input, model);
        cx.ending = Some(RunEnding::Answered);
        middleware().after_run(&mut cx).await.unwrap();
        let Some(pending) = cx.outputs.title.take() else {
            panic!("a title call is pending");
        };
        pending
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
    fn titles_are_plain_text_before_they_are_cut() {
        let title = make_title(
            "**Deploying** the `api` service to [prod](https://example.com/x) now, please",
            6,
            60,
        );
        assert_eq!(title, "Deploying the api service to prod…");
        // A cut inside a mark leaves no half of it.
        let title = make_title(
            "## Why does **`kubectl rollout status` hang** on the payments cluster",
            20,
            30,
        );
        assert!(!title.contains(['*', '`', '#', '[', ']', '(']), "{title}");
        assert_eq!(title.chars().count(), 30, "{title}");
        assert!(title.starts_with("Why does kubectl rollout"), "{title}");
        // Text that only looks like marks stays.
        assert_eq!(
            make_title("is 2 * 3 * 4 = 24?", 10, 60),
            "is 2 * 3 * 4 = 24?"
        );
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

    /// A first run as the runtime drives it: `before_run` on the thread holding the question,
    /// then the run's messages, `model_calls` model answers and its ending, then `after_run`
    /// with a model that answers the title call with `reply` (or fails when there is none).
    async fn first_run(
        then: Vec<ChatMessage>,
        model_calls: u32,
        ending: RunEnding,
        reply: Option<&str>,
    ) -> (ThreadState, Vec<ModelRequest>) {
        let mut thread = thread_with(vec![ChatMessage::user("Why is the build red today?")]);
        let script = reply.map(ScriptedModel::text).into_iter().collect();
        let model = Arc::new(ScriptedModel::new(script));
        let input = RunInput::text("test", "user", "hi");
        let m = middleware();
        {
            let mut cx = RunContext::new(&mut thread, &input, model.clone());
            m.before_run(&mut cx).await.unwrap();
            cx.thread.messages.extend(then);
            cx.model_calls = model_calls;
            if ending == RunEnding::Interrupted {
                cx.thread.pending_question = Some(crate::agent::thread::PendingQuestion {
                    question: "Which pipeline?".to_owned(),
                    options: Vec::new(),
                });
            }
            cx.ending = Some(ending);
            m.after_run(&mut cx).await.unwrap();
            let pending = cx.outputs.title.take();
            write_title(cx.thread, pending).await;
        }
        let requests = model.requests();
        (thread, requests)
    }

    fn clarification_call() -> ChatMessage {
        ChatMessage::assistant_calls(
            "",
            vec![crate::agent::message::ToolCall {
                id: "c1".into(),
                name: "ask_clarification".into(),
                arguments: r#"{"question":"Which pipeline?"}"#.into(),
            }],
        )
    }

    #[tokio::test]
    async fn a_first_run_ending_in_a_question_is_titled() {
        let (thread, requests) = first_run(
            vec![clarification_call()],
            1,
            RunEnding::Interrupted,
            Some("Red build pipeline"),
        )
        .await;
        assert_eq!(thread.title.as_deref(), Some("Red build pipeline"));
        let prompt = requests[0].messages[0].text();
        assert!(
            prompt.contains("User: Why is the build red today?"),
            "{prompt}"
        );
        assert!(prompt.contains("Assistant: Which pipeline?"), "{prompt}");
    }

    #[tokio::test]
    async fn a_first_run_stopped_after_an_answer_is_titled() {
        // loop_detection's forced stop after five identical rounds.
        let (thread, _) = first_run(
            vec![ChatMessage::assistant(
                "[FORCED STOP] Repeated tool calls were stopped.",
            )],
            5,
            RunEnding::Stopped,
            Some("Red build loop"),
        )
        .await;
        assert_eq!(thread.title.as_deref(), Some("Red build loop"));
    }

    #[tokio::test]
    async fn a_first_run_with_a_todo_reminder_is_titled() {
        // The todo middleware sent the model back with a reminder: a second user message.
        let (thread, requests) = first_run(
            vec![
                ChatMessage::assistant("Looking into it."),
                ChatMessage::user("<system-reminder>You have open todo items.</system-reminder>"),
                ChatMessage::assistant("A flaky test; all items done."),
            ],
            2,
            RunEnding::Answered,
            Some("Flaky build test"),
        )
        .await;
        assert_eq!(thread.title.as_deref(), Some("Flaky build test"));
        let prompt = requests[0].messages[0].text();
        assert!(
            prompt.contains("User: Why is the build red today?"),
            "{prompt}"
        );
        assert!(
            prompt.contains("Assistant: A flaky test; all items done."),
            "{prompt}"
        );
    }

    #[tokio::test]
    async fn a_first_run_stopped_before_an_answer_gets_the_fallback_title() {
        let (thread, requests) = first_run(
            vec![ChatMessage::assistant("[stopped]")],
            0,
            RunEnding::Stopped,
            Some("unused"),
        )
        .await;
        assert_eq!(thread.title.as_deref(), Some("Why is the build red today?"));
        assert!(requests.is_empty(), "no model call for the fallback");
    }

    #[tokio::test]
    async fn a_first_run_that_failed_after_an_answer_is_titled_and_one_without_is_not() {
        let (thread, _) = first_run(
            vec![ChatMessage::assistant("Checking.")],
            1,
            RunEnding::Failed,
            Some("Red build"),
        )
        .await;
        assert_eq!(thread.title.as_deref(), Some("Red build"));
        for ending in [RunEnding::Failed, RunEnding::TimedOut] {
            let (thread, requests) = first_run(Vec::new(), 0, ending, Some("unused")).await;
            assert_eq!(thread.title, None, "{ending:?}");
            assert!(requests.is_empty());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_run_ends_with_the_fallback_title_while_the_model_writes_one() {
        let mut thread = thread_with(vec![
            ChatMessage::user("Why is the build red today?"),
            ChatMessage::assistant("Because of a flaky test."),
        ]);
        let model = Arc::new(Silent::default());
        let pending = title_with_a_silent_model(&mut thread, Arc::clone(&model)).await;
        // The run is over and the thread has a title; the model's call is still going on.
        assert_eq!(thread.title.as_deref(), Some("Why is the build red today?"));
        assert!(!model.abandoned.load(Ordering::SeqCst));
        // The call's time runs out: nothing changes, the question stays the title.
        let update = pending.wait().await;
        assert!(!update.changes_anything());
        assert!(!update.apply(&mut thread));
        assert_eq!(thread.title.as_deref(), Some("Why is the build red today?"));
        assert!(model.abandoned.load(Ordering::SeqCst));
    }

    /// Lets other tasks run until `done` holds (or a thousand times).
    async fn yield_until(done: impl Fn() -> bool) {
        for _ in 0..1000 {
            if done() {
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_pending_title_dropped_abandons_its_call() {
        let mut thread = thread_with(vec![ChatMessage::user("q"), ChatMessage::assistant("a")]);
        let model = Arc::new(Silent::default());
        let pending = title_with_a_silent_model(&mut thread, Arc::clone(&model)).await;
        // Once the call is under way…
        yield_until(|| model.started.load(Ordering::SeqCst)).await;
        assert!(!model.abandoned.load(Ordering::SeqCst));
        // …dropping it (shutdown) ends it.
        drop(pending);
        yield_until(|| model.abandoned.load(Ordering::SeqCst)).await;
        assert!(model.abandoned.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_title_set_meanwhile_is_not_replaced() {
        let mut thread = thread_with(vec![
            ChatMessage::user("Why is the build red today?"),
            ChatMessage::assistant("Because of a flaky test."),
        ]);
        let model = Arc::new(ScriptedModel::new(vec![ScriptedModel::text("Flaky build")]));
        let input = RunInput::text("test", "user", "hi");
        let mut cx = RunContext::new(&mut thread, &input, model);
        cx.ending = Some(RunEnding::Answered);
        middleware().after_run(&mut cx).await.unwrap();
        let Some(pending) = cx.outputs.title.take() else {
            panic!("a title call is pending");
        };
        assert_eq!(thread.title.as_deref(), Some("Why is the build red today?"));
        let update = pending.wait().await;
        assert!(update.changes_anything());

        // Someone renamed the thread before the model's title came.
        let mut renamed = thread.clone();
        renamed.title = Some("Renamed".to_owned());
        assert!(update.apply(&mut renamed), "the call's tokens still count");
        assert_eq!(renamed.title.as_deref(), Some("Renamed"));
        assert_eq!(renamed.usage.total_tokens, 15);

        // A thread that has no title any more is not given one either.
        let mut untitled = thread.clone();
        untitled.title = None;
        update.apply(&mut untitled);
        assert_eq!(untitled.title, None);

        // The thread as the run left it gets the model's title.
        assert!(update.apply(&mut thread));
        assert_eq!(thread.title.as_deref(), Some("Flaky build"));
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
