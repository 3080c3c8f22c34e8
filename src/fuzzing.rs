//! Entry points for the fuzz targets in `fuzz/` (see the README's "Fuzzing" section): thin
//! wrappers over parsers that are otherwise internal, taking raw input and returning plain
//! data the targets check properties on. Not an API: hidden from the docs and free to change.

use std::sync::{LazyLock, Mutex};

use crate::agent::model::{ModelResponse, OpenAiClient, OpenAiConfig};

/// What a streamed or non-streamed model answer was read as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelAnswer {
    /// The visible text.
    pub content: String,
    /// The text passed to the delta sink as it arrived, joined.
    pub deltas: String,
    /// The reasoning kept apart from the answer.
    pub reasoning: Option<String>,
    /// The tool calls as `(id, name, arguments)`.
    pub tool_calls: Vec<(String, String, String)>,
    /// Why the model stopped, as the runtime names it.
    pub finish_reason: String,
}

/// A client whose base URL is never reached: reading a body makes no request. Built once:
/// building an HTTP client costs far more than reading a body.
fn client() -> Result<&'static OpenAiClient, String> {
    static CLIENT: LazyLock<Result<OpenAiClient, String>> = LazyLock::new(|| {
        OpenAiClient::new(OpenAiConfig::new("http://127.0.0.1:9/v1", "fuzz"))
            .map_err(|e| e.to_string())
    });
    CLIENT.as_ref().map_err(Clone::clone)
}

fn answer(response: ModelResponse, deltas: String) -> ModelAnswer {
    ModelAnswer {
        content: response.content,
        deltas,
        reasoning: response.reasoning,
        tool_calls: response
            .tool_calls
            .into_iter()
            .map(|call| (call.id, call.name, call.arguments))
            .collect(),
        finish_reason: format!("{:?}", response.finish_reason),
    }
}

/// The `data` of each server-sent event in a model's stream arriving in `pieces`, as the
/// OpenAI-compatible client splits it, with the event left unterminated at the end (if any)
/// last; or the error that stopped it.
pub fn model_sse_events(pieces: &[&[u8]]) -> Result<Vec<String>, String> {
    crate::agent::model::sse_events(pieces)
}

/// A streamed chat completion arriving in `pieces`, read as the client reads it.
pub fn model_stream(pieces: &[&[u8]]) -> Result<ModelAnswer, String> {
    let client = client()?;
    let deltas = Mutex::new(String::new());
    let sink = |text: &str| {
        if let Ok(mut deltas) = deltas.lock() {
            deltas.push_str(text);
        }
    };
    let mut shown = String::new();
    let response = client
        .read_stream(pieces, &sink, &mut shown)
        .map_err(|e| e.to_string())?;
    let deltas = deltas.into_inner().unwrap_or_default();
    Ok(answer(response, deltas))
}

/// A non-streamed chat completion body, read as the client reads it.
pub fn model_completion(body: &[u8]) -> Result<ModelAnswer, String> {
    let response = client()?.read_completion(body).map_err(|e| e.to_string())?;
    let deltas = response.content.clone();
    Ok(answer(response, deltas))
}

/// The `(event, data)` of each complete block of an API answer stream arriving in `pieces`,
/// as `antler chat` reads it.
pub fn chat_sse_events(pieces: &[&[u8]]) -> Vec<(String, String)> {
    let mut blocks = crate::chat::SseBlocks::default();
    let mut events = Vec::new();
    for piece in pieces {
        blocks.push(piece);
        while let Some(block) = blocks.next_block() {
            events.push(crate::chat::parse_block(&String::from_utf8_lossy(&block)));
        }
    }
    events
}

/// A `.env` file's variables, sorted by name, or the line number and problem of its first
/// error.
pub fn env_file(text: &str) -> Result<Vec<(String, String)>, (usize, &'static str)> {
    let mut vars: Vec<(String, String)> =
        crate::config::parse_env_file(text)?.into_iter().collect();
    vars.sort();
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &[u8] = b": ping\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"<think>r</think>He\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"llo\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

    #[test]
    fn a_stream_reads_the_same_whole_and_cut() {
        let whole = model_stream(&[STREAM]).unwrap();
        assert_eq!(whole.content, "Hello");
        assert_eq!(whole.deltas, "Hello");
        assert_eq!(whole.reasoning.as_deref(), Some("r"));
        let pieces: Vec<&[u8]> = STREAM.chunks(3).collect();
        assert_eq!(model_stream(&pieces).unwrap(), whole);
        assert_eq!(model_sse_events(&pieces), model_sse_events(&[STREAM]));
    }

    #[test]
    fn a_stream_cut_short_is_an_error() {
        let cut = &STREAM[..STREAM.len() / 2];
        assert!(model_stream(&[cut]).is_err());
    }

    #[test]
    fn chat_events_and_env_files_read() {
        let events =
            chat_sse_events(&[b"event: delta\ndata: a\n\nevent: final\ndata: b\n\n".as_slice()]);
        assert_eq!(
            events,
            [("delta".into(), "a".into()), ("final".into(), "b".into())]
        );
        assert_eq!(env_file("A=1\n# c\n"), Ok(vec![("A".into(), "1".into())]));
        assert_eq!(env_file("nope"), Err((1, "expected NAME=value")));
    }
}
