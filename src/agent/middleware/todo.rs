//! todo (chain position 9): plan mode, a todo list the model keeps and is held to.
//!
//! It contributes the `write_todos` tool: the model sends the whole list (`content`,
//! `status`: pending, in_progress or completed) and the list replaces the thread's, kept in
//! the thread's extensions (so it survives restarts and later turns). Like DeerFlow's
//! TodoList middleware:
//!
//! - `before_model`: when the thread has open todos but no `write_todos` call is left in the
//!   request (summarization compacted it away), a reminder with the list is added at the end
//!   of the request (not to the stored history).
//! - `after_model`: when the model tries to finish (no tool calls) while todos are still open,
//!   it is sent back with a completion reminder (`RunControl::Continue`), at most
//!   `max_reminders` (2) times per run; after that the answer stands.
//!
//! The tool is intercepted in `before_tool` (it needs the thread, which tools do not get), so
//! a refusal by an earlier guard is respected. Placement: after summarization, so the
//! reminder is added to the compacted history; before token_usage and title. It fails open:
//! a lost reminder never stops a run.
//!
//! Plan mode is off by default, as DeerFlow's: `enabled = true` turns it on for every thread.
//! Where antler goes further: with `plan_command` (on by default) the `/plan` chat command
//! switches it on or off for one conversation's thread (the [`PlanMode`] extension, kept with
//! the thread); DeerFlow only sets it per run from its own client. When plan mode is off for
//! a thread, the middleware takes `write_todos` out of the request, refuses a call of it
//! anyway, and reminds of nothing; so it stays in the chain whenever `/plan` may switch it
//! on.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Middleware, MiddlewareError, RunContext, ToolDecision, ToolOutput};
use crate::agent::message::{ChatMessage, ToolCall};
use crate::agent::model::{ModelRequest, ModelResponse, ToolSpec};
use crate::agent::thread::{Extension, ThreadState};
use crate::agent::tools::{InterceptedTool, Tool, intercepted_arguments};

/// The tool's name.
pub(crate) const TOOL_NAME: &str = "write_todos";

/// At most this many todos, each at most [`MAX_TODO_CHARS`] characters.
const MAX_TODOS: usize = 50;
const MAX_TODO_CHARS: usize = 500;

/// `[agent.middleware.todo]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct TodoConfig {
    /// Plan mode for every thread (`/plan off` still switches it off for one).
    pub(crate) enabled: bool,
    /// Whether `/plan` may switch plan mode on or off for a conversation's thread. With
    /// neither this nor `enabled`, the middleware is left out of the chain.
    pub(crate) plan_command: bool,
    /// Completion reminders per run at most.
    pub(crate) max_reminders: u32,
}

impl Default for TodoConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            plan_command: true,
            max_reminders: 2,
        }
    }
}

impl TodoConfig {
    /// Whether the middleware is in the chain: plan mode may be on for some thread.
    pub(crate) fn in_chain(&self) -> bool {
        self.enabled || self.plan_command
    }

    /// Whether plan mode is on for `thread`: its `/plan` choice when the command is allowed,
    /// else `enabled`.
    pub(crate) fn plan_mode(&self, thread: &ThreadState) -> bool {
        let chosen = self
            .plan_command
            .then(|| thread.extensions.get::<PlanMode>())
            .flatten();
        chosen.map_or(self.enabled, |mode| mode.on)
    }
}

/// A thread's `/plan` choice, kept with the thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PlanMode {
    /// Plan mode on (`/plan on`) or off (`/plan off`).
    pub(crate) on: bool,
}

impl Extension for PlanMode {
    const KEY: &'static str = "plan_mode";
}

/// The thread's todo list as `/status` shows it, if it has one.
pub(crate) fn status_list(thread: &ThreadState) -> Option<String> {
    let list = thread.extensions.get::<TodoList>()?;
    (!list.todos.is_empty()).then(|| list.render())
}

/// Where a todo is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TodoStatus {
    Pending,
    InProgress,
    Completed,
}

/// One todo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Todo {
    pub(crate) content: String,
    pub(crate) status: TodoStatus,
}

/// The thread's todo list and this run's reminder count.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TodoList {
    pub(crate) todos: Vec<Todo>,
    #[serde(default)]
    reminders_this_run: u32,
}

impl Extension for TodoList {
    const KEY: &'static str = "todo";
}

impl TodoList {
    fn open(&self) -> impl Iterator<Item = &Todo> {
        self.todos
            .iter()
            .filter(|t| t.status != TodoStatus::Completed)
    }

    fn render(&self) -> String {
        self.todos
            .iter()
            .map(|t| {
                let mark = match t.status {
                    TodoStatus::Pending => "[ ]",
                    TodoStatus::InProgress => "[~]",
                    TodoStatus::Completed => "[x]",
                };
                format!("- {mark} {}", t.content)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[derive(Deserialize)]
struct Arguments {
    todos: Vec<Todo>,
}

/// Keeps the model's todo list and reminds it of open items, in threads in plan mode.
#[derive(Debug, Clone)]
pub(crate) struct TodoMiddleware {
    config: TodoConfig,
}

impl TodoMiddleware {
    /// The middleware, or `None` when plan mode can be on for no thread.
    pub(crate) fn from_config(cfg: &TodoConfig) -> Option<Self> {
        cfg.in_chain().then(|| Self {
            config: cfg.clone(),
        })
    }

    fn active(&self, cx: &RunContext<'_>) -> bool {
        self.config.plan_mode(cx.thread)
    }
}

/// The tool as the model sees it; the middleware answers its calls.
fn write_todos() -> InterceptedTool {
    InterceptedTool::new(
        ToolSpec {
            name: TOOL_NAME.to_owned(),
            description: "Plan multi-step work: write the whole todo list (it replaces the \
                previous one). Mark an item in_progress when you start it and completed as \
                soon as it is done. Use it for tasks of three or more steps."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "todos": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "content": {"type": "string"},
                                "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}
                            },
                            "required": ["content", "status"]
                        }
                    }
                },
                "required": ["todos"]
            }),
        },
        "the todo list is not available right now",
    )
}

#[async_trait::async_trait]
impl Middleware for TodoMiddleware {
    fn name(&self) -> &'static str {
        "todo"
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        vec![Arc::new(write_todos())]
    }

    async fn before_run(&self, cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
        if let Some(mut list) = cx.thread.extensions.get::<TodoList>() {
            if list.reminders_this_run != 0 {
                list.reminders_this_run = 0;
                cx.thread.extensions.set(&list);
            }
        }
        Ok(())
    }

    async fn before_model(
        &self,
        cx: &mut RunContext<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), MiddlewareError> {
        if !self.active(cx) {
            request.tools.retain(|tool| tool.name != TOOL_NAME);
            return Ok(());
        }
        let Some(list) = cx.thread.extensions.get::<TodoList>() else {
            return Ok(());
        };
        if list.open().next().is_none() {
            return Ok(());
        }
        let visible = request.messages.iter().any(|m| {
            matches!(m, ChatMessage::Assistant { tool_calls, .. }
                if tool_calls.iter().any(|c| c.name == TOOL_NAME))
        });
        if !visible {
            // At the end: never between an assistant's tool calls and their results.
            request.messages.push(ChatMessage::user(format!(
                "<system-reminder>Your todo list (kept with `{TOOL_NAME}`):\n{}\n\
                 </system-reminder>",
                list.render()
            )));
        }
        Ok(())
    }

    async fn after_model(
        &self,
        cx: &mut RunContext<'_>,
        response: &mut ModelResponse,
    ) -> Result<(), MiddlewareError> {
        if !response.tool_calls.is_empty() || !self.active(cx) {
            return Ok(());
        }
        let Some(mut list) = cx.thread.extensions.get::<TodoList>() else {
            return Ok(());
        };
        let open: Vec<String> = list.open().map(|t| t.content.clone()).collect();
        if open.is_empty() || list.reminders_this_run >= self.config.max_reminders {
            return Ok(());
        }
        list.reminders_this_run += 1;
        cx.thread.extensions.set(&list);
        metrics::counter!("antler_todo_reminders_total").increment(1);
        cx.continue_with(ChatMessage::user(format!(
            "<system-reminder>You are about to finish, but these todos are not completed:\n- {}\n\
             Continue working on them, or call `{TOOL_NAME}` to mark them completed or remove \
             them if they are no longer needed.</system-reminder>",
            open.join("\n- ")
        )));
        Ok(())
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
        if !self.active(cx) {
            return Ok(ToolDecision::Skip(ToolOutput::error(format!(
                "Error: `{TOOL_NAME}` is only available in plan mode, which is off in this \
                 conversation (the user can turn it on with /plan)."
            ))));
        }
        let arguments: Arguments = match intercepted_arguments(call) {
            Ok(arguments) => arguments,
            Err(refusal) => return Ok(ToolDecision::Skip(refusal)),
        };
        if arguments.todos.len() > MAX_TODOS {
            return Ok(ToolDecision::Skip(ToolOutput::error(format!(
                "Error: at most {MAX_TODOS} todos; merge some."
            ))));
        }
        let todos: Vec<Todo> = arguments
            .todos
            .into_iter()
            .filter(|t| !t.content.trim().is_empty())
            .map(|t| Todo {
                content: t.content.trim().chars().take(MAX_TODO_CHARS).collect(),
                status: t.status,
            })
            .collect();
        if todos.is_empty() {
            cx.thread.extensions.remove::<TodoList>();
            return Ok(ToolDecision::Skip(ToolOutput::ok(
                "The todo list is now empty.",
            )));
        }
        let mut list = cx.thread.extensions.get::<TodoList>().unwrap_or_default();
        list.todos = todos;
        let shown = list.render();
        cx.thread.extensions.set(&list);
        Ok(ToolDecision::Skip(ToolOutput::ok(format!(
            "The todo list is now:\n{shown}"
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::middleware::{RunControl, test_context};
    use crate::agent::model::FinishReason;
    use crate::agent::thread::ThreadState;

    fn write(todos: serde_json::Value) -> ToolCall {
        ToolCall {
            id: "w1".into(),
            name: TOOL_NAME.into(),
            arguments: json!({ "todos": todos }).to_string(),
        }
    }

    fn final_answer() -> ModelResponse {
        ModelResponse {
            content: "All done.".into(),
            tool_calls: Vec::new(),
            usage: None,
            finish_reason: FinishReason::Stop,
            reasoning: None,
        }
    }

    fn middleware() -> TodoMiddleware {
        TodoMiddleware::from_config(&TodoConfig {
            enabled: true,
            ..TodoConfig::default()
        })
        .unwrap()
    }

    fn offered(request: &ModelRequest) -> bool {
        request.tools.iter().any(|t| t.name == TOOL_NAME)
    }

    fn request_with_the_tool() -> ModelRequest {
        ModelRequest {
            messages: vec![ChatMessage::user("go")],
            tools: vec![Arc::new(write_todos().spec())],
        }
    }

    #[tokio::test]
    async fn plan_mode_follows_the_threads_choice_then_the_config() {
        // Off by default, but in the chain so /plan can turn it on.
        let by_command = TodoMiddleware::from_config(&TodoConfig::default()).unwrap();
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        let mut request = request_with_the_tool();
        by_command
            .before_model(&mut cx, &mut request)
            .await
            .unwrap();
        assert!(!offered(&request), "plan mode off: no write_todos");
        let call = write(json!([{"content": "a", "status": "pending"}]));
        let decision = by_command.before_tool(&mut cx, &call, None).await.unwrap();
        assert!(
            matches!(&decision, ToolDecision::Skip(o) if o.is_error && o.content.contains("/plan")),
            "{decision:?}"
        );
        assert!(cx.thread.extensions.get::<TodoList>().is_none());

        // `/plan on` for this thread.
        cx.thread.extensions.set(&PlanMode { on: true });
        let mut request = request_with_the_tool();
        by_command
            .before_model(&mut cx, &mut request)
            .await
            .unwrap();
        assert!(offered(&request));
        let decision = by_command.before_tool(&mut cx, &call, None).await.unwrap();
        assert!(matches!(decision, ToolDecision::Skip(o) if !o.is_error));
        assert_eq!(status_list(cx.thread).as_deref(), Some("- [ ] a"));

        // `/plan off` wins over `enabled`; without the command, the thread's choice is ignored.
        cx.thread.extensions.set(&PlanMode { on: false });
        let always = TodoConfig {
            enabled: true,
            ..TodoConfig::default()
        };
        assert!(!always.plan_mode(cx.thread));
        let fixed = TodoConfig {
            enabled: true,
            plan_command: false,
            ..TodoConfig::default()
        };
        assert!(fixed.plan_mode(cx.thread));
        let mut request = request_with_the_tool();
        middleware()
            .before_model(&mut cx, &mut request)
            .await
            .unwrap();
        assert!(!offered(&request));
        assert!(
            TodoMiddleware::from_config(&TodoConfig {
                plan_command: false,
                ..TodoConfig::default()
            })
            .is_none(),
            "neither on nor switchable: out of the chain"
        );
    }

    #[tokio::test]
    async fn the_list_is_kept_in_the_thread_and_open_items_are_reminded_twice() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        let decision = middleware()
            .before_tool(
                &mut cx,
                &write(json!([
                    {"content": "check pods", "status": "completed"},
                    {"content": "restart api", "status": "in_progress"},
                    {"content": "  ", "status": "pending"}
                ])),
                None,
            )
            .await
            .unwrap();
        let ToolDecision::Skip(output) = decision else {
            panic!("the middleware answers the call")
        };
        assert_eq!(
            output.content,
            "The todo list is now:\n- [x] check pods\n- [~] restart api"
        );
        for _ in 0..2 {
            middleware()
                .after_model(&mut cx, &mut final_answer())
                .await
                .unwrap();
            let Some(RunControl::Continue(messages)) = cx.take_control() else {
                panic!("an open todo sends the model back")
            };
            assert!(messages[0].text().contains("- restart api"));
        }
        middleware()
            .after_model(&mut cx, &mut final_answer())
            .await
            .unwrap();
        assert_eq!(cx.take_control(), None, "at most two reminders per run");
        // The next run may remind again.
        middleware().before_run(&mut cx).await.unwrap();
        middleware()
            .after_model(&mut cx, &mut final_answer())
            .await
            .unwrap();
        assert!(cx.take_control().is_some());
        let stored = serde_json::to_value(&thread).unwrap();
        assert_eq!(
            stored["extensions"]["todo"]["todos"][1]["content"],
            "restart api"
        );
    }

    #[tokio::test]
    async fn a_list_that_left_the_context_is_shown_again() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        thread.extensions.set(&TodoList {
            todos: vec![Todo {
                content: "write report".into(),
                status: TodoStatus::Pending,
            }],
            reminders_this_run: 0,
        });
        let mut cx = test_context(&mut thread);
        let mut request = ModelRequest {
            messages: vec![ChatMessage::system("sys"), ChatMessage::user("go on")],
            tools: Vec::new(),
        };
        middleware()
            .before_model(&mut cx, &mut request)
            .await
            .unwrap();
        let last = request.messages.last().unwrap().text();
        assert!(last.contains("- [ ] write report"), "{last}");
        // Not when the call that wrote it is still in view.
        let mut request = ModelRequest {
            messages: vec![ChatMessage::assistant_calls("", vec![write(json!([]))])],
            tools: Vec::new(),
        };
        middleware()
            .before_model(&mut cx, &mut request)
            .await
            .unwrap();
        assert_eq!(request.messages.len(), 1);
    }

    #[tokio::test]
    async fn bad_arguments_are_answered_as_errors() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        let bad = ToolCall {
            arguments: "{\"todos\": 3}".into(),
            ..write(json!([]))
        };
        let decision = middleware().before_tool(&mut cx, &bad, None).await.unwrap();
        assert!(matches!(decision, ToolDecision::Skip(o) if o.is_error));
        assert!(cx.thread.extensions.get::<TodoList>().is_none());
        // An empty list removes it.
        let fill = write(json!([{"content": "a", "status": "pending"}]));
        middleware()
            .before_tool(&mut cx, &fill, None)
            .await
            .unwrap();
        assert!(cx.thread.extensions.get::<TodoList>().is_some());
        let decision = middleware()
            .before_tool(&mut cx, &write(json!([])), None)
            .await
            .unwrap();
        assert_eq!(
            decision,
            ToolDecision::Skip(ToolOutput::ok("The todo list is now empty."))
        );
        assert!(thread.extensions.is_empty());
    }
}
