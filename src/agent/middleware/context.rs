//! What hooks see of a run and how they steer it: [`RunContext`], the run-control decisions
//! ([`RunControl`]), the side outputs a run carries out ([`RunOutputs`]), what a middleware
//! keeps for one run ([`RunState`]) and helper model calls.

use std::sync::Arc;

use super::pending_title::PendingTitle;
use crate::agent::input::{RunInput, ThreadFolders};
use crate::agent::memory::MemoryUpdate;
use crate::agent::message::{ChatMessage, TokenUsage};
use crate::agent::model::{ChatModel, ModelError, ModelRequest, ModelResponse};
use crate::agent::skills::SkillMounts;
use crate::agent::thread::{PendingQuestion, ThreadState};
use crate::agent::tools::present_files::PresentedFile;

/// How a run ended, as `after_run` hooks see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunEnding {
    /// With an answer.
    Answered,
    /// With a question to the user; the next message resumes the run.
    Interrupted,
    /// Stopped early by a hook's `Stop` or by the user's `/stop`.
    Stopped,
    /// With an error (the model failed, a guard refused, a checkpoint failed).
    Failed,
    /// The turn's time ran out.
    TimedOut,
}

impl RunEnding {
    /// Its name in logs and metrics.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::Interrupted => "interrupted",
            Self::Stopped => "stopped",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
        }
    }
}

/// What a hook asks of the run loop. The strongest decision of a round wins:
/// `Stop` over `Interrupt` over `Continue`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RunControl {
    /// Send the model back with these messages added (a reminder), even if it meant to end.
    /// The runtime caps how often a run may be sent back.
    Continue(Vec<ChatMessage>),
    /// End the run and ask the user; the thread keeps the question and the user's next
    /// message resumes the run with the answer.
    Interrupt {
        /// What to ask.
        question: String,
        /// Suggested answers (may be empty).
        options: Vec<String>,
    },
    /// End the run now.
    Stop {
        /// Why, for logs and `RunOutcome::stop_reason` (`loop_capped`, `budget`).
        reason: String,
    },
}

impl RunControl {
    fn strength(&self) -> u8 {
        match self {
            Self::Continue(_) => 0,
            Self::Interrupt { .. } => 1,
            Self::Stop { .. } => 2,
        }
    }
}

/// What a run hands out besides its answer, for the caller to persist with the turn.
#[derive(Debug, Default)]
pub(crate) struct RunOutputs {
    /// The conversation to queue for the author's long-term memory (human messages and final
    /// answers), written with the turn's end, when the `memory` middleware chose to.
    pub(crate) memory_update: Option<MemoryUpdate>,
    /// Files the model presented to the user (`present_files`), to deliver with the answer.
    pub(crate) files: Vec<PresentedFile>,
    /// Tool calls held for a person's approval, to show in the chat.
    pub(crate) approvals: Vec<crate::agent::approvals::ApprovalRecord>,
    /// The model's title for a new thread, still being written when the run ended (the
    /// thread carries the fallback title meanwhile), for the caller to write after the reply.
    pub(crate) title: Option<PendingTitle>,
}

/// What middlewares keep for one run only (a loop-detection window, a tool catalogue): one
/// value per type, made on first use, dropped with the run.
///
/// Middleware instances are shared by every run of the lead and by the subagent runtimes,
/// whose runs carry their parent's thread id. State a middleware kept by thread id would be
/// shared by a lead's run and its subagents' runs, and by parallel subagents; kept here, it
/// belongs to exactly one run, as DeerFlow's fresh middlewares per task do.
#[derive(Debug, Default)]
pub(crate) struct RunState(http::Extensions);

impl RunState {
    /// This run's `T`, made with `T::default()` on first use.
    pub(crate) fn get_or_default<T>(&mut self) -> &mut T
    where
        T: Default + Clone + Send + Sync + 'static,
    {
        self.0.get_or_insert_default::<T>()
    }

    /// This run's `T`, if a hook made one.
    pub(crate) fn get<T>(&self) -> Option<&T>
    where
        T: Send + Sync + 'static,
    {
        self.0.get::<T>()
    }
}

/// Runtime facts a middleware may read and update during one run.
pub(crate) struct RunContext<'a> {
    /// The thread, including the messages of this run so far.
    pub(crate) thread: &'a mut ThreadState,
    /// The message the run is for: text, author, attachments, channel flags.
    pub(crate) input: &'a RunInput,
    /// The user the run is for (`<channel>:<user id>`).
    pub(crate) user_id: String,
    /// Model calls made so far in this run (helper calls not included).
    pub(crate) model_calls: u32,
    /// Tokens used by this run so far, helper calls included.
    pub(crate) run_usage: TokenUsage,
    /// Why the run was stopped early, if it was.
    pub(crate) stop_reason: Option<String>,
    /// The question this run's message answers, when the previous run asked one.
    pub(crate) answering: Option<PendingQuestion>,
    /// Side outputs for the caller.
    pub(crate) outputs: RunOutputs,
    /// How the run ended; set before `after_run`.
    pub(crate) ending: Option<RunEnding>,
    /// The thread's folders (the same the tools get), when the runtime has them.
    pub(crate) folders: Option<ThreadFolders>,
    /// Blocks of the run's hidden context message (the author's `<memory>`, the current
    /// time): sent to the model as one user-role message just before the turn's user
    /// message, in every request of the run, never stored. Hooks add blocks in `before_run`.
    pub(crate) hidden_context: Vec<String>,
    /// The skills on for this run, mounted read-only at `/mnt/skills` for its tool calls; the
    /// `skills` middleware sets them in `before_run` (none without it, as in a subagent's run).
    pub(crate) skills: SkillMounts,
    /// What middlewares keep for this run only.
    pub(crate) state: RunState,
    pub(super) control: Option<RunControl>,
    model: Arc<dyn ChatModel>,
}

impl std::fmt::Debug for RunContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunContext")
            .field("thread", &self.thread.id)
            .field("user_id", &self.user_id)
            .field("model_calls", &self.model_calls)
            .field("control", &self.control)
            .field("ending", &self.ending)
            .finish_non_exhaustive()
    }
}

impl<'a> RunContext<'a> {
    /// A context for a run of `input` on `thread` with `model`.
    pub(crate) fn new(
        thread: &'a mut ThreadState,
        input: &'a RunInput,
        model: Arc<dyn ChatModel>,
    ) -> Self {
        Self {
            thread,
            user_id: input.author.key(),
            input,
            model_calls: 0,
            run_usage: TokenUsage::default(),
            stop_reason: None,
            answering: None,
            outputs: RunOutputs::default(),
            ending: None,
            folders: None,
            hidden_context: Vec::new(),
            skills: SkillMounts::default(),
            state: RunState::default(),
            control: None,
            model,
        }
    }

    /// Where this turn's user message is in `request`: the user message equal to the
    /// thread's turn message, else the last one containing the user's words (a sanitizing
    /// hook may have wrapped it), else none.
    pub(crate) fn turn_position(&self, request: &ModelRequest) -> Option<usize> {
        let is_user_with = |m: &ChatMessage, f: &dyn Fn(&str) -> bool| matches!(m, ChatMessage::User { content, .. } if f(content));
        let turn_text = self
            .thread
            .turn_start()
            .and_then(|i| self.thread.messages.get(i))
            .map(ChatMessage::text);
        let exact = turn_text.and_then(|text| {
            request
                .messages
                .iter()
                .rposition(|m| is_user_with(m, &|content| content == text))
        });
        let words = self.input.text.trim();
        exact.or_else(|| {
            (!words.is_empty())
                .then(|| {
                    request
                        .messages
                        .iter()
                        .rposition(|m| is_user_with(m, &|content| content.contains(words)))
                })
                .flatten()
        })
    }

    /// The run's hidden context message, when a hook added blocks.
    pub(crate) fn hidden_context_message(&self) -> Option<ChatMessage> {
        (!self.hidden_context.is_empty()).then(|| {
            ChatMessage::user(format!(
                "<context>\n{}\n</context>",
                self.hidden_context.join("\n\n")
            ))
        })
    }

    /// Sends the model back once more with `message` added (a reminder), capped per run.
    pub(crate) fn continue_with(&mut self, message: ChatMessage) {
        match &mut self.control {
            Some(RunControl::Continue(messages)) => messages.push(message),
            Some(_) => {}
            None => self.control = Some(RunControl::Continue(vec![message])),
        }
    }

    /// Ends the run with a question to the user.
    pub(crate) fn interrupt(&mut self, question: impl Into<String>, options: Vec<String>) {
        self.decide(RunControl::Interrupt {
            question: question.into(),
            options,
        });
    }

    /// Ends the run now.
    pub(crate) fn stop(&mut self, reason: impl Into<String>) {
        self.decide(RunControl::Stop {
            reason: reason.into(),
        });
    }

    /// The decision taken so far this round, if any.
    pub(crate) fn control(&self) -> Option<&RunControl> {
        self.control.as_ref()
    }

    /// Takes the round's decision (the run loop acts on it).
    pub(crate) fn take_control(&mut self) -> Option<RunControl> {
        self.control.take()
    }

    fn decide(&mut self, control: RunControl) {
        if self
            .control
            .as_ref()
            .is_none_or(|current| current.strength() < control.strength())
        {
            self.control = Some(control);
        }
    }

    /// A completion of the middleware's own (a summary), with the run's model and its
    /// retries; its tokens count towards the run and the thread.
    pub(crate) async fn helper_complete(
        &mut self,
        purpose: &'static str,
        request: &ModelRequest,
    ) -> Result<ModelResponse, ModelError> {
        let response = complete_helper(self.model.as_ref(), purpose, request).await?;
        if let Some(usage) = &response.usage {
            self.run_usage.add(usage);
            self.thread.usage.add(usage);
        }
        Ok(response)
    }

    /// The run's model, for a helper call that outlives the run (a title written after the
    /// reply went out): such a call runs in a task of its own, made with
    /// [`complete_helper`], and its tokens count towards the thread where its result is
    /// applied.
    pub(crate) fn model(&self) -> Arc<dyn ChatModel> {
        Arc::clone(&self.model)
    }
}

/// A helper completion with `model` and its retries, counted in the metrics (the call and
/// its tokens); counting its tokens towards a run or a thread is the caller's.
pub(crate) async fn complete_helper(
    model: &dyn ChatModel,
    purpose: &'static str,
    request: &ModelRequest,
) -> Result<ModelResponse, ModelError> {
    let response = model.complete(request, None).await;
    metrics::counter!(
        "antler_helper_model_calls_total",
        "purpose" => purpose,
        "outcome" => if response.is_ok() { "ok" } else { "error" }
    )
    .increment(1);
    let response = response?;
    if let Some(usage) = &response.usage {
        metrics::counter!("antler_tokens_total", "kind" => "prompt").increment(usage.prompt_tokens);
        metrics::counter!("antler_tokens_total", "kind" => "completion")
            .increment(usage.completion_tokens);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::middleware::test_context;

    #[test]
    fn the_strongest_decision_wins() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        cx.continue_with(ChatMessage::user("one"));
        cx.continue_with(ChatMessage::user("two"));
        assert_eq!(
            cx.control(),
            Some(&RunControl::Continue(vec![
                ChatMessage::user("one"),
                ChatMessage::user("two")
            ]))
        );
        cx.interrupt("which one?", vec!["a".into()]);
        cx.continue_with(ChatMessage::user("three"));
        assert!(matches!(cx.control(), Some(RunControl::Interrupt { .. })));
        cx.stop("budget");
        cx.interrupt("again?", Vec::new());
        assert_eq!(
            cx.take_control(),
            Some(RunControl::Stop {
                reason: "budget".into()
            })
        );
        assert_eq!(cx.control(), None);
    }

    #[test]
    fn the_turn_message_is_found_exactly_or_by_its_words() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        thread.messages.push(ChatMessage::user("earlier"));
        thread.messages.push(ChatMessage::user("hi"));
        let cx = test_context(&mut thread);
        let request = |messages: Vec<ChatMessage>| ModelRequest {
            messages,
            tools: Vec::new(),
        };
        let exact = request(vec![
            ChatMessage::system("s"),
            ChatMessage::user("hi"),
            ChatMessage::user("a reminder"),
        ]);
        assert_eq!(cx.turn_position(&exact), Some(1));
        // A sanitizing hook wrapped it: found by the user's words.
        let wrapped = request(vec![
            ChatMessage::user("earlier"),
            ChatMessage::user("<user_message>\nhi\n</user_message>"),
            ChatMessage::user("a reminder"),
        ]);
        assert_eq!(cx.turn_position(&wrapped), Some(1));
        assert_eq!(
            cx.turn_position(&request(vec![ChatMessage::user("other")])),
            None
        );
    }

    #[test]
    fn hidden_context_blocks_make_one_user_message() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        assert_eq!(cx.hidden_context_message(), None);
        cx.hidden_context
            .push("<current_time>now</current_time>".into());
        cx.hidden_context.push("<memory>\nfacts\n</memory>".into());
        assert_eq!(
            cx.hidden_context_message(),
            Some(ChatMessage::user(
                "<context>\n<current_time>now</current_time>\n\n<memory>\nfacts\n</memory>\n</context>"
            ))
        );
    }
}
