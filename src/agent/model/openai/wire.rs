//! The chat-completions wire format: the request antler sends and the answers it reads.

use super::*;

#[derive(Serialize)]
pub(super) struct WireRequest<'a> {
    pub(super) model: &'a str,
    pub(super) messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) stream_options: Option<StreamOptions>,
}

#[derive(Serialize)]
pub(super) struct StreamOptions {
    pub(super) include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub(super) enum WireMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: WireContent<'a>,
    },
    Assistant {
        // `null` rather than "" when the message is only tool calls, as OpenAI documents.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireFunction<'a, WireCallBody<'a>>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

/// A user message's content: a string, or content parts when it carries more than text.
#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum WireContent<'a> {
    Text(&'a str),
    Parts(Vec<WirePart<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum WirePart<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: WireImageUrl<'a> },
}

#[derive(Serialize)]
pub(super) struct WireImageUrl<'a> {
    pub(super) url: &'a str,
}

/// `{"id"?, "type": "function", "function": F}`, shared by tool calls and tool specs.
#[derive(Serialize)]
pub(super) struct WireFunction<'a, F> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) id: Option<&'a str>,
    r#type: &'static str,
    pub(super) function: F,
}

#[derive(Serialize)]
pub(super) struct WireCallBody<'a> {
    pub(super) name: &'a str,
    pub(super) arguments: &'a str,
}

pub(super) type WireTool<'a> = WireFunction<'a, &'a super::super::ToolSpec>;

impl<'a> WireRequest<'a> {
    pub(super) fn new(config: &'a OpenAiConfig, request: &'a ModelRequest, stream: bool) -> Self {
        let messages = request.messages.iter().map(WireMessage::from).collect();
        let tools = request
            .tools
            .iter()
            .map(|spec| WireFunction {
                id: None,
                r#type: "function",
                function: spec.as_ref(),
            })
            .collect();
        Self {
            model: &config.model,
            messages,
            tools,
            temperature: config.temperature,
            max_tokens: config.max_tokens,
            stream,
            stream_options: (stream && config.stream_usage).then_some(StreamOptions {
                include_usage: true,
            }),
        }
    }
}

impl<'a> From<&'a ChatMessage> for WireMessage<'a> {
    fn from(message: &'a ChatMessage) -> Self {
        match message {
            ChatMessage::System { content } => Self::System { content },
            ChatMessage::User { content, parts, .. } if parts.is_empty() => Self::User {
                content: WireContent::Text(content),
            },
            ChatMessage::User { content, parts, .. } => {
                let text = (!content.is_empty()).then_some(WirePart::Text { text: content });
                let parts = text
                    .into_iter()
                    .chain(parts.iter().map(|part| match part {
                        ContentPart::Text { text } => WirePart::Text { text },
                        ContentPart::Image { url } => WirePart::ImageUrl {
                            image_url: WireImageUrl { url },
                        },
                    }))
                    .collect();
                Self::User {
                    content: WireContent::Parts(parts),
                }
            }
            // The reasoning stays home: providers reject or ignore it, and it costs tokens.
            ChatMessage::Assistant {
                content,
                tool_calls,
                ..
            } => Self::Assistant {
                content: (!content.is_empty() || tool_calls.is_empty()).then_some(content),
                tool_calls: tool_calls
                    .iter()
                    .map(|call| WireFunction {
                        id: Some(&call.id),
                        r#type: "function",
                        function: WireCallBody {
                            name: &call.name,
                            arguments: &call.arguments,
                        },
                    })
                    .collect(),
            },
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => Self::Tool {
                tool_call_id,
                content,
            },
        }
    }
}

#[derive(Deserialize)]
pub(super) struct WireCompletion {
    #[serde(default)]
    pub(super) choices: Vec<WireChoice>,
    pub(super) usage: Option<WireUsage>,
    pub(super) error: Option<Value>,
}

#[derive(Deserialize)]
pub(super) struct WireChoice {
    pub(super) message: WireAnswer,
    pub(super) finish_reason: Option<String>,
}

/// A message or a delta: content (a string or content parts), reasoning, tool calls.
#[derive(Deserialize)]
pub(super) struct WireAnswer<C = WireCallIn> {
    #[serde(default)]
    pub(super) content: Value,
    /// DeepSeek, vLLM (older), SGLang.
    #[serde(default)]
    pub(super) reasoning_content: Value,
    /// OpenRouter, vLLM (newer), Ollama.
    #[serde(default)]
    pub(super) reasoning: Value,
    pub(super) tool_calls: Option<Vec<C>>,
}

impl<C> WireAnswer<C> {
    /// The answer text and the reasoning this message carries (before `<think>` splitting).
    pub(super) fn texts(&self) -> (String, String) {
        let (text, mut reasoning) = content_texts(&self.content);
        // Servers that send both fields send the same text twice.
        let field = match (&self.reasoning_content, &self.reasoning) {
            (Value::String(text), _) if !text.is_empty() => text.as_str(),
            (_, Value::String(text)) => text.as_str(),
            _ => "",
        };
        reasoning.insert_str(0, field);
        (text, reasoning)
    }
}

/// The text and the reasoning of a `content` value: a string, `null`, or parts
/// (`{"type": "text", "text"}`; `thinking`/`reasoning` parts are reasoning; others, such as
/// images, are skipped).
pub(super) fn content_texts(content: &Value) -> (String, String) {
    let mut text = String::new();
    let mut reasoning = String::new();
    match content {
        Value::String(s) => text.push_str(s),
        Value::Array(parts) => {
            for part in parts {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("text");
                let body = ["text", kind]
                    .iter()
                    .find_map(|key| part.get(key))
                    .map(part_text)
                    .unwrap_or_default();
                match kind {
                    "text" | "output_text" => text.push_str(&body),
                    "thinking" | "reasoning" => reasoning.push_str(&body),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    (text, reasoning)
}

/// The text of a part's body: a string, or nested text parts (Mistral's `thinking`).
pub(super) fn part_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(_) => content_texts(value).0,
        _ => String::new(),
    }
}

#[derive(Deserialize)]
pub(super) struct WireCallIn {
    #[serde(default)]
    pub(super) id: String,
    pub(super) function: WireCallBodyIn,
}

#[derive(Deserialize)]
pub(super) struct WireCallBodyIn {
    pub(super) name: String,
    // A string per the spec; some servers send the object itself.
    #[serde(default)]
    pub(super) arguments: Value,
}

#[derive(Deserialize)]
pub(super) struct WireUsage {
    #[serde(default)]
    pub(super) prompt_tokens: u64,
    #[serde(default)]
    pub(super) completion_tokens: u64,
    pub(super) total_tokens: Option<u64>,
}

impl From<WireUsage> for TokenUsage {
    fn from(u: WireUsage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u
                .total_tokens
                .unwrap_or(u.prompt_tokens + u.completion_tokens),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct WireChunk {
    #[serde(default)]
    pub(super) choices: Vec<WireChunkChoice>,
    pub(super) usage: Option<WireUsage>,
    pub(super) error: Option<Value>,
}

#[derive(Deserialize)]
pub(super) struct WireChunkChoice {
    #[serde(default)]
    pub(super) delta: Option<WireAnswer<WireCallDelta>>,
    pub(super) finish_reason: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct WireCallDelta {
    pub(super) index: Option<usize>,
    pub(super) id: Option<String>,
    pub(super) function: Option<WireCallBodyDelta>,
}

#[derive(Deserialize)]
pub(super) struct WireCallBodyDelta {
    pub(super) name: Option<String>,
    pub(super) arguments: Option<String>,
}

pub(super) fn finish_reason(raw: Option<String>, has_tool_calls: bool) -> FinishReason {
    match raw.as_deref() {
        Some("stop") => FinishReason::Stop,
        Some("tool_calls" | "function_call") => FinishReason::ToolCalls,
        Some("length") => FinishReason::Length,
        Some("content_filter") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_owned()),
        // Some servers omit it; infer what the answer means.
        None if has_tool_calls => FinishReason::ToolCalls,
        None => FinishReason::Stop,
    }
}

/// Why a 2xx answer is not a usable completion.
pub(super) enum Fault {
    /// It carries `{"error": ...}`.
    Provider(Value),
    /// It is not a chat completion (the text is unmasked).
    Invalid(String),
}

/// Parses a non-streamed chat completion.
pub(super) fn parse_completion(bytes: &[u8]) -> Result<ModelResponse, Fault> {
    let completion: WireCompletion = serde_json::from_slice(bytes).map_err(|e| {
        let body = String::from_utf8_lossy(bytes);
        Fault::Invalid(format!("{e}; body: {body}"))
    })?;
    if let Some(error) = completion.error.filter(|e| !e.is_null()) {
        return Err(Fault::Provider(error));
    }
    let Some(choice) = completion.choices.into_iter().next() else {
        return Err(Fault::Invalid("the answer has no choices".to_owned()));
    };
    let (text, mut reasoning) = choice.message.texts();
    let split = ThinkSplitter::split(&text);
    reasoning.push_str(&split.reasoning);
    let tool_calls: Vec<ToolCall> = choice
        .message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .map(|call| ToolCall {
            id: call.id,
            name: call.function.name,
            arguments: match call.function.arguments {
                Value::String(text) => text,
                Value::Null => String::new(),
                other => other.to_string(),
            },
        })
        .collect();
    Ok(ModelResponse {
        content: split.answer,
        finish_reason: finish_reason(choice.finish_reason, !tool_calls.is_empty()),
        reasoning: non_empty(reasoning),
        tool_calls,
        usage: completion.usage.map(TokenUsage::from),
    })
}

/// Reasoning worth keeping: trimmed, `None` when nothing is left.
pub(super) fn non_empty(reasoning: String) -> Option<String> {
    let trimmed = reasoning.trim();
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}
