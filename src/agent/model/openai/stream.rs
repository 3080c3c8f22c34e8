//! Streaming: server-sent events split from the byte stream, and the answer assembled from
//! its chunks (text, reasoning, tool-call fragments, usage, errors).

use super::wire::{WireCallDelta, WireChunk, finish_reason, non_empty};
use super::*;

/// Splits a byte stream into the `data` of server-sent events.
#[derive(Default)]
pub(super) struct SseParser {
    /// Bytes after the last complete line.
    pub(super) pending: Vec<u8>,
    /// How much of `pending` is known to hold no newline.
    pub(super) scanned: usize,
    /// The `data` lines of the event being read, joined by `\n`.
    pub(super) data: Option<String>,
    /// Whether a `data` line was read since the last [`SseParser::take_activity`].
    pub(super) data_seen: bool,
}

impl SseParser {
    /// Feeds the next network chunk; returns the events it completed.
    pub(super) fn push(&mut self, chunk: &[u8]) -> Result<Vec<String>, AttemptError> {
        self.pending.extend_from_slice(chunk);
        let mut events = Vec::new();
        let mut start = 0;
        let mut from = self.scanned;
        while let Some(offset) = self.pending[from..].iter().position(|b| *b == b'\n') {
            let end = from + offset;
            if end - start > SSE_LINE_MAX_BYTES {
                return Err(line_too_long());
            }
            let line = String::from_utf8_lossy(&self.pending[start..end]).into_owned();
            self.line(&line, &mut events);
            start = end + 1;
            from = start;
        }
        self.pending.drain(..start);
        self.scanned = self.pending.len();
        if self.pending.len() > SSE_LINE_MAX_BYTES {
            return Err(line_too_long());
        }
        Ok(events)
    }

    /// Whether the answer moved since the last call: a `data` line was read, or a line that is
    /// not a comment is arriving. Comments (`: ping`, LiteLLM's keep-alive) and blank lines are
    /// not activity, so an upstream that only pings still meets the stream's timeouts.
    pub(super) fn take_activity(&mut self) -> bool {
        let arriving = self.pending.first().is_some_and(|b| *b != b':');
        std::mem::take(&mut self.data_seen) || arriving
    }

    /// Ends the stream; returns an event left without its closing blank line.
    pub(super) fn finish(&mut self) -> Option<String> {
        let mut events = Vec::new();
        if !self.pending.is_empty() {
            let line = String::from_utf8_lossy(&self.pending).into_owned();
            self.pending.clear();
            self.scanned = 0;
            self.line(&line, &mut events);
        }
        self.line("", &mut events);
        events.pop()
    }

    pub(super) fn line(&mut self, line: &str, events: &mut Vec<String>) {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            events.extend(self.data.take());
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        if field == "data" {
            self.data_seen = true;
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            }
        }
    }
}

pub(super) fn line_too_long() -> AttemptError {
    AttemptError::Invalid(format!(
        "a stream line is longer than {} MiB",
        SSE_LINE_MAX_BYTES / (1024 * 1024)
    ))
}

/// A tool call being assembled from stream fragments.
pub(super) struct PartialCall {
    pub(super) index: usize,
    pub(super) id: String,
    pub(super) name: String,
    pub(super) arguments: String,
}

/// What a stream has said so far.
#[derive(Default)]
pub(super) struct StreamState {
    pub(super) content: String,
    pub(super) reasoning: String,
    pub(super) think: ThinkSplitter,
    pub(super) calls: Vec<PartialCall>,
    pub(super) finish_reason: Option<String>,
    pub(super) usage: Option<TokenUsage>,
}

impl StreamState {
    /// Applies one event; returns true at `[DONE]`.
    pub(super) fn apply(
        &mut self,
        data: &str,
        sink: DeltaSink<'_>,
        shown: &mut String,
    ) -> Result<bool, Fault> {
        if data.trim() == "[DONE]" {
            return Ok(true);
        }
        let chunk: WireChunk = serde_json::from_str(data)
            .map_err(|e| Fault::Invalid(format!("bad stream event ({e}): {data}")))?;
        if let Some(error) = chunk.error.filter(|e| !e.is_null()) {
            return Err(Fault::Provider(error));
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.into());
        }
        // Only the first choice matters: antler never asks for n > 1.
        let Some(choice) = chunk.choices.into_iter().next() else {
            return Ok(false);
        };
        if choice.finish_reason.is_some() {
            self.finish_reason = choice.finish_reason;
        }
        let Some(delta) = choice.delta else {
            return Ok(false);
        };
        let (text, reasoning) = delta.texts();
        self.reasoning.push_str(&reasoning);
        self.take_text(&text, sink, shown);
        for fragment in delta.tool_calls.unwrap_or_default() {
            self.apply_call(fragment);
        }
        Ok(false)
    }

    /// Routes content through the `<think>` splitter: answer text to the sink, the rest to
    /// the reasoning.
    pub(super) fn take_text(&mut self, text: &str, sink: DeltaSink<'_>, shown: &mut String) {
        if text.is_empty() {
            return;
        }
        let split = self.think.push(text);
        self.reasoning.push_str(&split.reasoning);
        emit(sink, shown, &split.answer);
        self.content.push_str(&split.answer);
    }

    pub(super) fn apply_call(&mut self, fragment: WireCallDelta) {
        let id = fragment.id.filter(|id| !id.is_empty());
        // Without an index (some servers), a new id starts a new call; otherwise it continues.
        let index = fragment
            .index
            .unwrap_or_else(|| match (&id, self.calls.last()) {
                (Some(id), Some(last)) if !last.id.is_empty() && *id != last.id => last.index + 1,
                (_, Some(last)) => last.index,
                (_, None) => 0,
            });
        // The latest call at this index continues, unless the fragment names another id:
        // then it is a new call that reuses the index (seen from some servers).
        let latest = self.calls.iter().rposition(|c| c.index == index);
        let position = match (latest, &id) {
            (Some(position), Some(id))
                if self
                    .calls
                    .get(position)
                    .is_some_and(|c| !c.id.is_empty() && c.id != *id) =>
            {
                None
            }
            (latest, _) => latest,
        };
        let position = position.unwrap_or_else(|| {
            self.calls.push(PartialCall {
                index,
                id: String::new(),
                name: String::new(),
                arguments: String::new(),
            });
            self.calls.len() - 1
        });
        let Some(call) = self.calls.get_mut(position) else {
            return;
        };
        // Id and name come whole in the first fragment; some servers repeat them later.
        if let Some(id) = id {
            if call.id.is_empty() {
                call.id = id;
            }
        }
        if let Some(function) = fragment.function {
            if let Some(name) = function.name.filter(|n| !n.is_empty()) {
                if call.name.is_empty() {
                    call.name = name;
                }
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }

    /// The response; text the `<think>` splitter still held goes out first.
    pub(super) fn finish(mut self, sink: DeltaSink<'_>, shown: &mut String) -> ModelResponse {
        let rest = self.think.finish();
        self.reasoning.push_str(&rest.reasoning);
        emit(sink, shown, &rest.answer);
        self.content.push_str(&rest.answer);
        // Stable: calls that share an index keep their order.
        self.calls.sort_by_key(|c| c.index);
        let tool_calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id,
                name: c.name,
                arguments: c.arguments,
            })
            .collect();
        ModelResponse {
            content: self.content,
            finish_reason: finish_reason(self.finish_reason, !tool_calls.is_empty()),
            reasoning: non_empty(self.reasoning),
            tool_calls,
            usage: self.usage,
        }
    }
}
