//! The `task` tool: `task(description, prompt, subagent_type)` delegates one task to a
//! subagent and waits for its result itself, so the model never polls. It answers
//! "Task succeeded. Result: …", or says that the task failed, timed out or was cancelled; the
//! subagent's token usage comes with the answer and is added to the parent thread's.
//!
//! The chat sees a line per task as it starts, as it works (its current tool) and as it ends,
//! through the call's progress notes (a live reply edits them in place). The `bash` type runs
//! shell commands: users who may not run the shell themselves are neither offered it (their
//! requests' `task` spec leaves it out) nor allowed it.
//! `subagent_limit` decides how many calls of one response and run may start tasks; the
//! tool's description states its configured caps (none when it is off), so the model is told
//! the limits it will meet.

use std::sync::Arc;

use serde::Deserialize;

use super::config::TASK_CALL_MARGIN;
use super::executor::{ParentCall, SubagentExecutor, TaskError, TaskRequest};
use super::registry::{SubagentRecord, SubagentStatus};
use crate::agent::input::{Author, Role};
use crate::agent::middleware::subagent_limit::SubagentLimits;
use crate::agent::model::ToolSpec;
use crate::agent::tools::ToolOutput;
use crate::agent::tools::{Tool, ToolContext, ToolError, parse_arguments};

/// The tool's name.
pub(crate) const TASK_TOOL: &str = "task";

/// The longest description kept (one line in the chat).
const MAX_DESCRIPTION_CHARS: usize = 80;

/// The longest prompt accepted.
const MAX_PROMPT_BYTES: usize = 32 * 1024;

/// Who may run the shell, as the guardrail decides (`bash` subagents follow it).
pub(crate) type ShellPolicy = Arc<dyn Fn(Role) -> bool + Send + Sync>;

/// Delegates to subagents through the executor.
pub(crate) struct TaskTool {
    executor: SubagentExecutor,
    shell_allowed: ShellPolicy,
    /// The caps `subagent_limit` enforces on this tool's calls, stated in its description.
    limits: Option<SubagentLimits>,
    /// The spec for users who may not run the shell, made once; `None` when no type runs it.
    without_shell: Option<Arc<ToolSpec>>,
}

impl TaskTool {
    /// The tool over `executor`; `limits` are the caps `subagent_limit` enforces on its calls
    /// (`None` when it is off).
    pub(crate) fn new(
        executor: SubagentExecutor,
        shell_allowed: ShellPolicy,
        limits: Option<SubagentLimits>,
    ) -> Self {
        let mut tool = Self {
            executor,
            shell_allowed,
            limits,
            without_shell: None,
        };
        if tool.executor.types().any(|t| t.needs_shell) {
            tool.without_shell = Some(Arc::new(tool.spec_with(false)));
        }
        tool
    }
}

#[derive(Deserialize)]
struct TaskArguments {
    description: String,
    prompt: String,
    subagent_type: String,
}

impl TaskTool {
    /// The spec listing the types; `with_shell`: also those that run shell commands.
    fn spec_with(&self, with_shell: bool) -> ToolSpec {
        let offered = || {
            self.executor
                .types()
                .filter(move |t| with_shell || !t.needs_shell)
        };
        let types: Vec<&str> = offered().map(|t| t.name.as_str()).collect();
        let listed: String = offered()
            .map(|t| {
                let shell = if t.needs_shell {
                    " (only for users who may run the shell)"
                } else {
                    ""
                };
                format!("\n- `{}`: {}{shell}", t.name, t.description)
            })
            .collect();
        let limits = self.limits.map_or_else(String::new, |limits| {
            format!(
                " (at most {} per response and {} per run; calls beyond that are not run)",
                limits.per_response, limits.per_run
            )
        });
        ToolSpec {
            name: TASK_TOOL.into(),
            description: format!(
                "Delegate one task to a subagent, which works on it in its own context with its \
                 own tools and returns its final answer; this call waits for it. Use it for \
                 work of several steps that does not need this conversation, and call it \
                 several times in one response to run independent tasks in parallel{limits}. \
                 The subagent sees only `prompt`: say everything it needs, including what to \
                 return. Subagent types:{listed}"
            ),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {
                    "description": {
                        "type": "string",
                        "description": "A short description of the task (3 to 5 words), shown to the user."
                    },
                    "prompt": {
                        "type": "string",
                        "description": "The complete task for the subagent: goal, context, constraints and what to return."
                    },
                    "subagent_type": {
                        "type": "string",
                        "enum": types,
                        "description": "Which subagent type does it."
                    }
                },
                "required": ["description", "prompt", "subagent_type"],
                "additionalProperties": false
            }),
        }
    }
}

#[async_trait::async_trait]
impl Tool for TaskTool {
    fn spec(&self) -> ToolSpec {
        self.spec_with(true)
    }

    /// Users who may not run the shell are not offered the types that would.
    fn spec_for(&self, author: &Author) -> Option<Arc<ToolSpec>> {
        let spec = self.without_shell.as_ref()?;
        (!(self.shell_allowed)(author.role)).then(|| Arc::clone(spec))
    }

    fn checkpoint_first(&self) -> bool {
        true
    }

    /// The type's timeout and [`TASK_CALL_MARGIN`]: the turn grows only as far as this task
    /// needs.
    fn call_limit(&self, arguments: &str) -> Option<std::time::Duration> {
        let name = serde_json::from_str::<serde_json::Value>(arguments).ok()?;
        let kind = self.executor.kind(name.get("subagent_type")?.as_str()?)?;
        Some(kind.timeout + TASK_CALL_MARGIN)
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<String, ToolError> {
        let output = self.call_reporting(arguments, cx).await?;
        Ok(output.content)
    }

    async fn call_reporting(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let args: TaskArguments = parse_arguments(arguments)?;
        let description = one_line(&args.description);
        if description.is_empty() || args.prompt.trim().is_empty() {
            return Err(ToolError::InvalidArguments(
                "`description` and `prompt` must not be empty".to_owned(),
            ));
        }
        if args.prompt.len() > MAX_PROMPT_BYTES {
            return Err(ToolError::InvalidArguments(format!(
                "`prompt` is {} bytes; at most {MAX_PROMPT_BYTES} are accepted",
                args.prompt.len()
            )));
        }
        let Some(kind) = self.executor.kind(&args.subagent_type) else {
            let known: Vec<String> = self
                .executor
                .types()
                .map(|t| format!("`{}`", t.name))
                .collect();
            return Err(ToolError::InvalidArguments(format!(
                "there is no subagent type `{}`; the types are {}",
                args.subagent_type,
                known.join(", ")
            )));
        };
        if kind.needs_shell && !(self.shell_allowed)(cx.author.role) {
            return Err(ToolError::Failed(format!(
                "the `{}` subagent runs shell commands, which only operators may run here; use \
                 `general-purpose` instead",
                kind.name
            )));
        }
        (cx.progress)(&format!("⏳ {description}"));
        let request = TaskRequest {
            description: description.clone(),
            prompt: args.prompt,
            subagent_type: args.subagent_type,
            parent: ParentCall {
                thread_id: cx.thread_id.clone(),
                turn: cx.turn,
                call_id: cx.call_id.clone(),
                author: cx.author.clone(),
                trace_id: cx.trace_id.clone(),
                // The type's own limit: a quicker type's call does not wait for the slowest.
                deadline: cx
                    .deadline
                    .min(tokio::time::Instant::now() + kind.timeout + TASK_CALL_MARGIN),
                progress: Arc::clone(&cx.progress),
            },
        };
        let record = match self.executor.run(request, &cx.cancel).await {
            Ok(record) => record,
            Err(e @ TaskError::UnknownType(_)) => {
                return Err(ToolError::InvalidArguments(e.to_string()));
            }
            Err(TaskError::Registry(e)) => {
                tracing::error!(error = %e, "a subagent task could not be recorded");
                (cx.progress)(&format!("❌ {description}"));
                return Err(ToolError::Failed(
                    "the task could not be recorded, so it did not run; try again later".to_owned(),
                ));
            }
        };
        (cx.progress)(&ending_line(&description, &record));
        Ok(answer(&record))
    }
}

/// `text` on one line, whitespace collapsed, at most [`MAX_DESCRIPTION_CHARS`].
fn one_line(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match joined.char_indices().nth(MAX_DESCRIPTION_CHARS) {
        Some((end, _)) => format!("{}…", &joined[..end]),
        None => joined,
    }
}

/// The chat line of an ended task.
fn ending_line(description: &str, record: &SubagentRecord) -> String {
    let seconds = record
        .duration_ms(crate::now_ms())
        .map(|ms| format!(" · {} s", ms.div_ceil(1000)))
        .unwrap_or_default();
    let (mark, word) = match record.status {
        SubagentStatus::Completed => ("✅", ""),
        SubagentStatus::Failed => ("❌", " · failed"),
        SubagentStatus::TimedOut => ("⌛", " · timed out"),
        SubagentStatus::Cancelled => ("⏹", " · cancelled"),
        SubagentStatus::Pending | SubagentStatus::Running => ("⏸", " · interrupted"),
    };
    format!("{mark} {description}{word}{seconds}")
}

/// What the model is told about an ended task.
pub(crate) fn answer(record: &SubagentRecord) -> ToolOutput {
    let error = record.error.as_deref().unwrap_or("no reason was recorded");
    let mut output = match record.status {
        SubagentStatus::Completed => {
            let result = record.result.as_deref().unwrap_or_default();
            let text = match &record.stop_reason {
                Some(reason) => format!("Task succeeded (capped: {reason}). Result: {result}"),
                None => format!("Task succeeded. Result: {result}"),
            };
            ToolOutput::ok(text)
        }
        SubagentStatus::Failed => ToolOutput::error(format!("Task failed. Error: {error}")),
        SubagentStatus::TimedOut => {
            let capped = record
                .stop_reason
                .as_ref()
                .map_or_else(String::new, |reason| format!(" ({reason})"));
            let partial = record.result.as_ref().map_or_else(String::new, |result| {
                format!("\n\nPartial result: {result}")
            });
            ToolOutput::error(format!("Task timed out{capped}. Error: {error}{partial}"))
        }
        SubagentStatus::Cancelled => ToolOutput::error(match &record.error {
            Some(reason) => format!("Task cancelled: {reason}."),
            None => "Task cancelled by user.".to_owned(),
        }),
        SubagentStatus::Pending | SubagentStatus::Running => {
            ToolOutput::error("Task interrupted: antler is shutting down.")
        }
    };
    output.usage = Some(record.usage);
    output
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_become_one_short_line() {
        assert_eq!(one_line("  look up\n the  docs "), "look up the docs");
        let long = "word ".repeat(40);
        let line = one_line(&long);
        assert_eq!(line.chars().count(), MAX_DESCRIPTION_CHARS + 1);
        assert!(line.ends_with('…'));
    }
}
