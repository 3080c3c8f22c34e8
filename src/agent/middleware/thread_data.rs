//! thread_data (chain position 1): tells the model where the thread's files are.
//!
//! Each thread has three folders on disk (`uploads/`, `workspace/`, `outputs/`), made by the
//! runtime before tools run and handed to every tool call (`ToolContext::folders`) and to
//! hooks (`RunContext::folders`). The model only ever sees them as `/mnt/user-data/...`
//! (`tools::paths`). In `before_model` this middleware adds a short note naming the three
//! folders and what each is for, so the model does not guess paths.
//!
//! The note is added only when the request offers a tool that works on files (the file tools
//! or `bash`): a run without them has nothing to do with paths, and the note would only cost
//! tokens. It goes into the leading system message (not a second system message: some
//! providers refuse several, which DeerFlow has to repair with a coalescing middleware), and
//! only into the request, never into the stored history.
//!
//! Placement: first. It describes the ground every later middleware and tool stands on;
//! `uploads` (next) lists files inside those folders. It fails open: without the note the
//! model can still `ls /mnt/user-data`.

use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError, RunContext};
use crate::agent::message::ChatMessage;
use crate::agent::model::ModelRequest;
use crate::agent::tools::files::FILE_TOOL_NAMES;

/// The note added to the system message.
pub(crate) const NOTE: &str = "Files of this conversation (use these paths with the file tools):
- /mnt/user-data/workspace: your scratch space
- /mnt/user-data/uploads: the user's files (read-only)
- /mnt/user-data/outputs: files for the user; put what you make for them here";

/// `[agent.middleware.thread_data]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ThreadDataConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
}

impl Default for ThreadDataConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Names the thread's folders for the model.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ThreadDataMiddleware;

impl ThreadDataMiddleware {
    /// The middleware, or `None` when it is disabled.
    pub(crate) fn from_config(cfg: &ThreadDataConfig) -> Option<Self> {
        cfg.enabled.then_some(Self)
    }
}

/// Whether the request offers a tool that reads or writes the thread's files.
fn offers_file_tools(request: &ModelRequest) -> bool {
    request
        .tools
        .iter()
        .any(|tool| tool.name == "bash" || FILE_TOOL_NAMES.contains(&tool.name.as_str()))
}

#[async_trait::async_trait]
impl Middleware for ThreadDataMiddleware {
    fn name(&self) -> &'static str {
        "thread_data"
    }

    async fn before_model(
        &self,
        _cx: &mut RunContext<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), MiddlewareError> {
        if !offers_file_tools(request) {
            return Ok(());
        }
        match request.messages.first_mut() {
            Some(ChatMessage::System { content }) => {
                if !content.contains(NOTE) {
                    if !content.trim().is_empty() {
                        content.push_str("\n\n");
                    }
                    content.push_str(NOTE);
                }
            }
            _ => request.messages.insert(0, ChatMessage::system(NOTE)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::agent::middleware::test_context;
    use crate::agent::model::ToolSpec;
    use crate::agent::thread::ThreadState;

    fn tool(name: &str) -> Arc<ToolSpec> {
        Arc::new(ToolSpec {
            name: name.to_owned(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
        })
    }

    async fn prepared(messages: Vec<ChatMessage>, tools: &[&str]) -> Vec<ChatMessage> {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        let mut request = ModelRequest {
            messages,
            tools: tools.iter().map(|name| tool(name)).collect(),
        };
        ThreadDataMiddleware
            .before_model(&mut cx, &mut request)
            .await
            .unwrap();
        // A second pass (the next model call of the run builds a new request; a re-used one
        // must not grow) adds nothing.
        ThreadDataMiddleware
            .before_model(&mut cx, &mut request)
            .await
            .unwrap();
        request.messages
    }

    #[tokio::test]
    async fn the_note_joins_the_system_message_when_file_tools_are_offered() {
        let messages = prepared(
            vec![ChatMessage::system("Be brief."), ChatMessage::user("hi")],
            &["current_time", "read_file"],
        )
        .await;
        assert_eq!(
            messages,
            vec![
                ChatMessage::system(format!("Be brief.\n\n{NOTE}")),
                ChatMessage::user("hi")
            ]
        );
        assert!(NOTE.contains("/mnt/user-data/uploads: the user's files (read-only)"));
        let messages = prepared(vec![ChatMessage::user("hi")], &["bash"]).await;
        assert_eq!(
            messages,
            vec![ChatMessage::system(NOTE), ChatMessage::user("hi")]
        );
    }

    #[tokio::test]
    async fn no_file_tools_no_note() {
        let messages = vec![ChatMessage::system("Be brief."), ChatMessage::user("hi")];
        assert_eq!(
            prepared(messages.clone(), &["current_time"]).await,
            messages
        );
        assert_eq!(prepared(messages.clone(), &[]).await, messages);
    }

    #[test]
    fn disabled_means_absent() {
        assert!(ThreadDataMiddleware::from_config(&ThreadDataConfig::default()).is_some());
        assert!(ThreadDataMiddleware::from_config(&ThreadDataConfig { enabled: false }).is_none());
    }
}
