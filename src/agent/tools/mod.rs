//! Tools the model can call: the [`Tool`] trait and the [`ToolRegistry`] that runs them.
//!
//! Tool failures are data for the model, never errors of the run: an unknown tool, arguments
//! that are not valid JSON or do not fit the tool's parameters, or a tool that fails, all come
//! back as an error [`ToolOutput`] and the run goes on.

mod current_time;

pub(crate) use current_time::CurrentTime;

use std::collections::BTreeMap;
use std::sync::Arc;

use super::message::ToolCall;
use super::middleware::ToolOutput;
use super::model::ToolSpec;

/// Why a tool call failed; the message is shown to the model.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ToolError {
    /// The arguments do not fit the tool's parameters.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The tool ran and failed.
    #[error("{0}")]
    Failed(String),
}

/// One tool.
#[async_trait::async_trait]
pub(crate) trait Tool: Send + Sync {
    /// Its name, description and parameter schema.
    fn spec(&self) -> ToolSpec;

    /// Runs it with the model's arguments (a JSON value, already parsed).
    async fn call(&self, arguments: serde_json::Value) -> Result<String, ToolError>;
}

/// Parses a tool's arguments into its typed argument struct.
pub(crate) fn parse_arguments<T>(arguments: serde_json::Value) -> Result<T, ToolError>
where
    T: serde::de::DeserializeOwned,
{
    serde_json::from_value(arguments).map_err(|e| ToolError::InvalidArguments(e.to_string()))
}

/// The tools offered to the model, by name.
#[derive(Clone, Default)]
pub(crate) struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// The built-in tools.
    pub(crate) fn builtin() -> Self {
        let mut registry = Self::default();
        registry.register(Arc::new(CurrentTime));
        registry
    }

    /// Adds (or replaces) a tool.
    pub(crate) fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.spec().name, tool);
    }

    /// The specs to offer the model, sorted by name.
    pub(crate) fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|t| t.spec()).collect()
    }

    /// Runs one call; every failure becomes an error output.
    pub(crate) async fn call(&self, call: &ToolCall) -> ToolOutput {
        let Some(tool) = self.tools.get(&call.name) else {
            let known: Vec<&str> = self.tools.keys().map(String::as_str).collect();
            return ToolOutput::error(format!(
                "Error: there is no tool named `{}`. Available tools: {}.",
                call.name,
                known.join(", ")
            ));
        };
        let raw = if call.arguments.trim().is_empty() {
            "{}"
        } else {
            call.arguments.as_str()
        };
        let arguments = match serde_json::from_str::<serde_json::Value>(raw) {
            Ok(value @ serde_json::Value::Object(_)) => value,
            Ok(_) => {
                return ToolOutput::error(format!(
                    "Error: the arguments of `{}` must be a JSON object.",
                    call.name
                ));
            }
            Err(e) => {
                return ToolOutput::error(format!(
                    "Error: the arguments of `{}` are not valid JSON: {e}.",
                    call.name
                ));
            }
        };
        match tool.call(arguments).await {
            Ok(content) => ToolOutput::ok(content),
            Err(e) => ToolOutput::error(format!("Error: `{}` failed: {e}", call.name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: "call_1".to_owned(),
            name: name.to_owned(),
            arguments: arguments.to_owned(),
        }
    }

    #[tokio::test]
    async fn unknown_tool_is_an_error_result_naming_the_known_tools() {
        let out = ToolRegistry::builtin().call(&call("rm_rf", "{}")).await;
        assert!(out.is_error);
        assert!(
            out.content.contains("no tool named `rm_rf`"),
            "{}",
            out.content
        );
        assert!(out.content.contains("current_time"), "{}", out.content);
    }

    #[tokio::test]
    async fn invalid_json_and_non_object_arguments_are_error_results() {
        let registry = ToolRegistry::builtin();
        let out = registry.call(&call("current_time", "{not json")).await;
        assert!(
            out.is_error && out.content.contains("not valid JSON"),
            "{}",
            out.content
        );
        let out = registry.call(&call("current_time", "[1]")).await;
        assert!(
            out.is_error && out.content.contains("JSON object"),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn arguments_that_do_not_fit_the_schema_are_error_results() {
        let out = ToolRegistry::builtin()
            .call(&call("current_time", r#"{"utc_offset_minutes":"soon"}"#))
            .await;
        assert!(
            out.is_error && out.content.contains("invalid arguments"),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn empty_arguments_mean_an_empty_object() {
        let out = ToolRegistry::builtin()
            .call(&call("current_time", ""))
            .await;
        assert!(!out.is_error, "{}", out.content);
    }
}
