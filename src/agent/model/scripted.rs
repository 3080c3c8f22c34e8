//! A model that answers from a script, for unit tests of the run loop and middlewares.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::{ChatModel, DeltaSink, FinishReason, ModelError, ModelRequest, ModelResponse};
use crate::agent::message::{TokenUsage, ToolCall};

/// Answers each request with the next scripted response and records the requests.
#[derive(Debug, Default)]
pub(crate) struct ScriptedModel {
    script: Mutex<VecDeque<Result<ModelResponse, ModelError>>>,
    requests: Mutex<Vec<ModelRequest>>,
}

impl ScriptedModel {
    pub(crate) fn new(script: Vec<Result<ModelResponse, ModelError>>) -> Self {
        Self {
            script: Mutex::new(script.into()),
            requests: Mutex::default(),
        }
    }

    /// A final text answer.
    pub(crate) fn text(content: &str) -> Result<ModelResponse, ModelError> {
        Ok(ModelResponse {
            content: content.to_owned(),
            tool_calls: Vec::new(),
            usage: Some(TokenUsage {
                prompt_tokens: 10,
                completion_tokens: 5,
                total_tokens: 15,
            }),
            finish_reason: FinishReason::Stop,
            reasoning: None,
        })
    }

    /// Tool calls `(id, name, arguments)`.
    pub(crate) fn calls(calls: &[(&str, &str, &str)]) -> Result<ModelResponse, ModelError> {
        Ok(ModelResponse {
            content: String::new(),
            tool_calls: calls
                .iter()
                .map(|(id, name, arguments)| ToolCall {
                    id: (*id).to_owned(),
                    name: (*name).to_owned(),
                    arguments: (*arguments).to_owned(),
                })
                .collect(),
            usage: None,
            finish_reason: FinishReason::ToolCalls,
            reasoning: None,
        })
    }

    pub(crate) fn requests(&self) -> Vec<ModelRequest> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl ChatModel for ScriptedModel {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        deltas: Option<DeltaSink<'_>>,
    ) -> Result<ModelResponse, ModelError> {
        if let Ok(mut requests) = self.requests.lock() {
            requests.push(request.clone());
        }
        let next = self
            .script
            .lock()
            .ok()
            .and_then(|mut s| s.pop_front())
            .unwrap_or_else(|| Err(ModelError::InvalidResponse("script exhausted".to_owned())));
        if let (Ok(response), Some(sink)) = (&next, deltas) {
            if !response.content.is_empty() {
                sink(&response.content);
            }
        }
        next
    }
}
