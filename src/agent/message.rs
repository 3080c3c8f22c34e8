//! The conversation data the runtime works on: chat messages, tool calls and token usage.
//!
//! These are antler's own types, stored in the thread state; the model client maps them to
//! and from the OpenAI wire format.

use serde::{Deserialize, Serialize};

/// One message of a thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub(crate) enum ChatMessage {
    /// Instructions for the model.
    System {
        /// The instructions.
        content: String,
    },
    /// What a person wrote.
    User {
        /// The text.
        content: String,
        /// Further content after the text (images for vision models), sent as content parts.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        parts: Vec<ContentPart>,
        /// Set on the message the person sent (by `input_sanitization`, before the message is
        /// first saved, so it is stored with it); `None` on antler's own user-role messages
        /// and on messages stored before it was kept here.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        authored: Option<Authored>,
    },
    /// What the model answered: text, tool calls, or both.
    Assistant {
        /// The visible text (may be empty when the model only calls tools).
        #[serde(default)]
        content: String,
        /// Tools the model asked to run, answered by the `Tool` messages that follow.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// The model's reasoning (`reasoning_content`, `<think>` blocks), kept apart from the
        /// answer: never streamed or delivered as answer text, never sent back to the model.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reasoning: Option<String>,
    },
    /// The result of one tool call.
    Tool {
        /// The id of the call it answers.
        tool_call_id: String,
        /// The result (or error) text the model sees.
        content: String,
    },
}

impl ChatMessage {
    /// A system message.
    #[must_use]
    pub(crate) fn system(content: impl Into<String>) -> Self {
        Self::System {
            content: content.into(),
        }
    }

    /// A user message.
    #[must_use]
    pub(crate) fn user(content: impl Into<String>) -> Self {
        Self::User {
            content: content.into(),
            parts: Vec::new(),
            authored: None,
        }
    }

    /// An assistant message with text only.
    #[must_use]
    pub(crate) fn assistant(content: impl Into<String>) -> Self {
        Self::Assistant {
            content: content.into(),
            tool_calls: Vec::new(),
            reasoning: None,
        }
    }

    /// An assistant message with text and tool calls.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn assistant_calls(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self::Assistant {
            content: content.into(),
            tool_calls,
            reasoning: None,
        }
    }

    /// The message's text (empty for none).
    #[must_use]
    pub(crate) fn text(&self) -> &str {
        match self {
            Self::System { content }
            | Self::User { content, .. }
            | Self::Assistant { content, .. }
            | Self::Tool { content, .. } => content,
        }
    }

    /// The bytes of what the message says: its text, its text parts, and its tool calls'
    /// ids, names and arguments; each image part counts as `image_bytes`. The base of the
    /// token estimates that must not run a tokenizer.
    #[must_use]
    pub(crate) fn payload_bytes(&self, image_bytes: usize) -> usize {
        match self {
            Self::Assistant {
                content,
                tool_calls,
                ..
            } => {
                content.len()
                    + tool_calls
                        .iter()
                        .map(|c| c.id.len() + c.name.len() + c.arguments.len())
                        .sum::<usize>()
            }
            Self::User { content, parts, .. } => {
                content.len()
                    + parts
                        .iter()
                        .map(|part| match part {
                            ContentPart::Text { text } => text.len(),
                            ContentPart::Image { .. } => image_bytes,
                        })
                        .sum::<usize>()
            }
            other => other.text().len(),
        }
    }

    /// A tool result.
    #[must_use]
    pub(crate) fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self::Tool {
            tool_call_id: tool_call_id.into(),
            content: content.into(),
        }
    }
}

/// That a user-role message is what a person wrote, and which part of it antler appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Authored {
    /// How many bytes at the end of the text antler appended (the uploads block): trusted,
    /// unlike the rest.
    pub(crate) trusted_tail: usize,
}

/// A piece of message content beyond its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ContentPart {
    /// More text.
    Text {
        /// The text.
        text: String,
    },
    /// An image, as an `https:` URL or a `data:` URL with base64 content.
    Image {
        /// Where the model reads it.
        url: String,
    },
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ToolCall {
    /// The provider's call id; the tool result names it.
    pub(crate) id: String,
    /// The tool's name.
    pub(crate) name: String,
    /// The arguments as the model wrote them: a JSON object as text, possibly invalid.
    pub(crate) arguments: String,
}

/// Tokens counted by the model provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TokenUsage {
    /// Tokens in the prompt.
    pub(crate) prompt_tokens: u64,
    /// Tokens generated.
    pub(crate) completion_tokens: u64,
    /// Their sum as the provider reports it.
    pub(crate) total_tokens: u64,
}

impl TokenUsage {
    /// Adds another count to this one.
    pub(crate) fn add(&mut self, other: &Self) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.total_tokens += other.total_tokens;
    }
}
