//! clarification (chain position 17, always last): lets the model ask the user a question
//! instead of guessing.
//!
//! It contributes the `ask_clarification` tool (`question`, `clarification_type`, `context`,
//! `options`). In `before_tool` it intercepts every call of that tool: the call is not run;
//! its result is the question as the user sees it (an icon by type, the context, the
//! question, numbered options), and the run is interrupted (`RunControl::Interrupt`). The
//! thread keeps the question; the user's next message resumes the run with the answer (a
//! bare number picks an option), as DeerFlow's `Command(goto=END)` does.
//!
//! Placement: last, so every other `before_tool` hook (the guardrail above all) has seen the
//! call first; a call an earlier hook refused stays refused and asks nothing. Malformed
//! arguments are answered to the model as an error, so it can ask again properly. It fails
//! open: if it fails, the call is answered by the tool itself, which says it cannot run.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Middleware, MiddlewareError, RunContext, ToolDecision, ToolOutput};
use crate::agent::message::ToolCall;
use crate::agent::model::ToolSpec;
use crate::agent::tools::{InterceptedTool, Tool, intercepted_arguments};

/// The tool's name.
pub(crate) const TOOL_NAME: &str = "ask_clarification";

/// At most this many options, each at most [`MAX_OPTION_CHARS`] characters.
const MAX_OPTIONS: usize = 24;
const MAX_OPTION_CHARS: usize = 200;
/// At most this many characters of question and of context.
const MAX_TEXT_CHARS: usize = 2000;

/// `[agent.middleware.clarification]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ClarificationConfig {
    /// Whether the middleware (and its tool) is in the chain.
    pub(crate) enabled: bool,
}

impl Default for ClarificationConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Turns `ask_clarification` calls into a question to the user.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClarificationMiddleware;

impl ClarificationMiddleware {
    /// The middleware, or `None` when it is disabled.
    pub(crate) fn from_config(cfg: &ClarificationConfig) -> Option<Self> {
        cfg.enabled.then_some(Self)
    }
}

/// Why the model asks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ClarificationType {
    #[default]
    MissingInfo,
    AmbiguousRequirement,
    ApproachChoice,
    RiskConfirmation,
    Suggestion,
}

impl ClarificationType {
    fn icon(self) -> &'static str {
        match self {
            Self::MissingInfo => "❓",
            Self::AmbiguousRequirement => "🤔",
            Self::ApproachChoice => "🔀",
            Self::RiskConfirmation => "⚠️",
            Self::Suggestion => "💡",
        }
    }
}

#[derive(Debug, Deserialize)]
struct Arguments {
    question: String,
    #[serde(default)]
    clarification_type: ClarificationType,
    #[serde(default)]
    context: Option<String>,
    #[serde(default)]
    options: Vec<String>,
}

/// `text` cut to `max` characters.
fn bounded(text: &str, max: usize) -> String {
    let text = text.trim();
    match text.char_indices().nth(max) {
        Some((byte, _)) => format!("{}…", &text[..byte]),
        None => text.to_owned(),
    }
}

/// The tool as the model sees it; the middleware answers its calls.
fn ask_clarification() -> InterceptedTool {
    InterceptedTool::new(
        ToolSpec {
            name: TOOL_NAME.to_owned(),
            description: "Ask the user a question and wait for the answer, instead of \
                guessing, when information is missing, the request is ambiguous, there are \
                several reasonable approaches, or an action is risky. The run pauses until \
                the user replies."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "question": {"type": "string", "description": "The question to ask."},
                    "clarification_type": {
                        "type": "string",
                        "enum": ["missing_info", "ambiguous_requirement", "approach_choice",
                                 "risk_confirmation", "suggestion"]
                    },
                    "context": {"type": "string", "description": "Why you are asking."},
                    "options": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "Suggested answers, if there are clear choices."
                    }
                },
                "required": ["question"]
            }),
        },
        "clarification is not available right now; proceed with your best judgment",
    )
}

#[async_trait::async_trait]
impl Middleware for ClarificationMiddleware {
    fn name(&self) -> &'static str {
        "clarification"
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        vec![Arc::new(ask_clarification())]
    }

    async fn before_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        refused: Option<&ToolOutput>,
    ) -> Result<ToolDecision, MiddlewareError> {
        if call.name != TOOL_NAME || refused.is_some() {
            return Ok(ToolDecision::Run);
        }
        let arguments: Arguments = match intercepted_arguments(call) {
            Ok(arguments) => arguments,
            Err(refusal) => return Ok(ToolDecision::Skip(refusal)),
        };
        if arguments.question.trim().is_empty() {
            return Ok(ToolDecision::Skip(ToolOutput::error(format!(
                "Error: `{TOOL_NAME}` needs a non-empty `question`."
            ))));
        }
        let mut question = String::from(arguments.clarification_type.icon());
        question.push(' ');
        if let Some(context) = arguments.context.filter(|c| !c.trim().is_empty()) {
            question.push_str(&bounded(&context, MAX_TEXT_CHARS));
            question.push_str("\n\n");
        }
        question.push_str(&bounded(&arguments.question, MAX_TEXT_CHARS));
        let options: Vec<String> = arguments
            .options
            .iter()
            .filter(|o| !o.trim().is_empty())
            .take(MAX_OPTIONS)
            .map(|o| bounded(o, MAX_OPTION_CHARS))
            .collect();
        let pending = crate::agent::thread::PendingQuestion {
            question: question.clone(),
            options: options.clone(),
        };
        let shown = pending.render();
        tracing::debug!(thread = %cx.thread.id, "the model asks the user a question");
        metrics::counter!("antler_clarifications_total").increment(1);
        cx.interrupt(question, options);
        Ok(ToolDecision::Skip(ToolOutput::ok(format!(
            "Asked the user:\n{shown}\n\nWait for their reply."
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::middleware::{RunControl, test_context};
    use crate::agent::thread::ThreadState;

    fn ask(arguments: &str) -> ToolCall {
        ToolCall {
            id: "q1".into(),
            name: TOOL_NAME.into(),
            arguments: arguments.into(),
        }
    }

    #[tokio::test]
    async fn a_question_interrupts_the_run_with_numbered_options() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        let decision = ClarificationMiddleware
            .before_tool(
                &mut cx,
                &ask(
                    r#"{"question":"Which cluster?","clarification_type":"approach_choice",
                        "context":"Two clusters match.","options":["prod","staging"," "]}"#,
                ),
                None,
            )
            .await
            .unwrap();
        let ToolDecision::Skip(output) = decision else {
            panic!("the call is not run")
        };
        assert!(!output.is_error);
        assert!(
            output.content.contains("1. prod\n2. staging"),
            "{}",
            output.content
        );
        assert_eq!(
            cx.take_control(),
            Some(RunControl::Interrupt {
                question: "🔀 Two clusters match.\n\nWhich cluster?".into(),
                options: vec!["prod".into(), "staging".into()],
            })
        );
    }

    #[tokio::test]
    async fn bad_arguments_are_answered_and_other_calls_pass() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        for bad in ["{not json", r#"{"question":"  "}"#, "{}"] {
            let decision = ClarificationMiddleware
                .before_tool(&mut cx, &ask(bad), None)
                .await
                .unwrap();
            assert!(
                matches!(&decision, ToolDecision::Skip(o) if o.is_error),
                "{bad}: {decision:?}"
            );
        }
        let other = ToolCall {
            name: "current_time".into(),
            ..ask("{}")
        };
        assert_eq!(
            ClarificationMiddleware
                .before_tool(&mut cx, &other, None)
                .await
                .unwrap(),
            ToolDecision::Run
        );
        // A call an earlier hook refused asks nothing.
        let refusal = ToolOutput::error("denied");
        assert_eq!(
            ClarificationMiddleware
                .before_tool(&mut cx, &ask(r#"{"question":"Sure?"}"#), Some(&refusal))
                .await
                .unwrap(),
            ToolDecision::Run
        );
        assert_eq!(cx.take_control(), None);
    }

    #[test]
    fn the_tool_is_offered_with_its_schema() {
        let tools = ClarificationMiddleware.tools();
        let spec = tools[0].spec();
        assert_eq!(spec.name, TOOL_NAME);
        assert_eq!(spec.parameters["required"], json!(["question"]));
    }
}
