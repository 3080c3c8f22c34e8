//! `cmd_<name>`: an operator command offered to the model. Its parameters are one string per
//! argument, with the argument's pattern; it runs as the chat command does and returns the same
//! text. Someone whose role may not run the command is refused here too, whatever the
//! guardrail says.

use std::sync::Arc;

use serde_json::json;

use super::OperatorCommand;
use super::exec::{Origin, Run, Runner, Utf8Pieces};
use crate::agent::model::ToolSpec;
use crate::agent::tools::{Tool, ToolContext, ToolError, ToolOutput};

/// The most characters of output shown as the call's progress line.
const PROGRESS_CHARS: usize = 120;

/// One operator command as a tool.
#[derive(Debug)]
pub(crate) struct CommandTool {
    command: Arc<OperatorCommand>,
    runner: Arc<Runner>,
}

impl CommandTool {
    pub(crate) fn new(command: Arc<OperatorCommand>, runner: Arc<Runner>) -> Self {
        Self { command, runner }
    }
}

#[async_trait::async_trait]
impl Tool for CommandTool {
    fn spec(&self) -> ToolSpec {
        let config = &self.command.config;
        let mut properties = serde_json::Map::new();
        let mut required = Vec::new();
        for arg in &config.args {
            properties.insert(
                arg.name.clone(),
                json!({
                    "type": "string",
                    "pattern": format!("^(?:{})$", arg.pattern),
                }),
            );
            if !arg.optional {
                required.push(arg.name.clone());
            }
        }
        ToolSpec {
            name: self.command.tool_name(),
            description: format!(
                "{} (the operator command `{}`; its output and exit status are returned).",
                config.description.trim_end_matches('.'),
                self.command.usage()
            ),
            parameters: json!({
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false
            }),
        }
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<String, ToolError> {
        let output = self.call_reporting(arguments, cx).await?;
        if output.is_error {
            Err(ToolError::Failed(output.content))
        } else {
            Ok(output.content)
        }
    }

    async fn call_reporting(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let command = &self.command;
        if !command.allows(cx.author.role) {
            return Err(ToolError::Failed(format!(
                "Refused: /{} is for admins only, and this user is not one. It was not run.",
                command.config.name
            )));
        }
        let values = command
            .parse_called(&arguments)
            .map_err(|e| ToolError::InvalidArguments(format!("{e}; usage: {}", command.usage())))?;
        let name = command.config.name.clone();
        let progress = Arc::clone(&cx.progress);
        let mut decoder = Utf8Pieces::default();
        let mut on_output = move |bytes: &[u8]| {
            let text = decoder.push(bytes);
            if let Some(last) = text.lines().rev().find(|l| !l.trim().is_empty()) {
                let line: String = last.chars().take(PROGRESS_CHARS).collect();
                progress(&format!("⏳ /{name}: {line}"));
            }
        };
        let outcome = self
            .runner
            .run(Run {
                command,
                argv: command.argv(&values),
                origin: Origin {
                    via: "tool",
                    channel: &cx.author.channel,
                    user_id: &cx.author.user_id,
                    role: cx.author.role,
                    thread_id: &cx.thread_id,
                },
                folders: Some(&cx.folders),
                cancel: Some(cx.cancel.clone()),
                deadline: Some(cx.deadline),
                output: Some(&mut on_output),
            })
            .await;
        Ok(if outcome.failed {
            ToolOutput::error(outcome.text)
        } else {
            ToolOutput::ok(outcome.text)
        })
    }
}
