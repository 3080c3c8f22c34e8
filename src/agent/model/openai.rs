//! HELPER: OpenAI-compatible client.

/// Settings of the OpenAI-compatible client.
#[derive(Debug, Clone)]
pub(crate) struct OpenAiConfig;

/// The OpenAI-compatible chat-completions client.
#[derive(Debug, Clone)]
pub(crate) struct OpenAiClient;
