//! dangling_tool_call (chain position 4): makes every request's tool-call pairing valid.
//!
//! OpenAI-compatible providers answer HTTP 400 ("an assistant message with 'tool_calls' must
//! be followed by tool messages responding to each 'tool_call_id'") when the history holds a
//! tool call without a result, a result without a call, a result separated from its call, or
//! two calls with the same id. Such histories happen: a run interrupted between the model's
//! tool calls and their results, a crash before the results were persisted, summarization
//! cutting between a call and its result, a provider sending empty or repeated ids.
//!
//! In `before_model` it repairs the *request* messages (never the stored history, so the
//! repair is recomputed, deterministically, for every request):
//!
//! - calls with an empty id, or an id already used by an earlier call, get a fresh id
//!   `call_repaired_<n>`; the result that answered them is renamed with them;
//! - each call's result is looked for after its assistant message (up to the next assistant
//!   message that reuses the same original id); results found out of place are moved right
//!   after the existing results of their call's assistant message;
//! - every call left without a result gets the placeholder result [`PLACEHOLDER`], placed
//!   after the existing results;
//! - tool messages that answer no earlier call (orphans, surplus duplicates) are dropped.
//!
//! A complete, well-formed history is left exactly as it is.
//!
//! Placement: `before_model` hooks run in chain order, so sitting at position 4 it repairs the
//! request before any later middleware (summarization, memory, loop-detection warnings) reads
//! or extends it, and those later hooks see a well-formed pairing. It is an observer and fails
//! open: a failed repair is no worse than no repair.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError, RunContext};
use crate::agent::message::ChatMessage;
use crate::agent::model::ModelRequest;

/// The result given to a tool call that never got one.
pub(crate) const PLACEHOLDER: &str = "[Tool call was interrupted and did not return a result.]";

/// `[agent.middleware.dangling_tool_call]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct DanglingToolCallConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
}

impl Default for DanglingToolCallConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Repairs tool-call pairing in each model request.
#[derive(Debug, Clone, Default)]
pub(crate) struct DanglingToolCallMiddleware;

impl DanglingToolCallMiddleware {
    /// The middleware, or `None` when it is disabled.
    pub(crate) fn from_config(cfg: &DanglingToolCallConfig) -> Option<Self> {
        cfg.enabled.then_some(Self)
    }
}

#[async_trait::async_trait]
impl Middleware for DanglingToolCallMiddleware {
    fn name(&self) -> &'static str {
        "dangling_tool_call"
    }

    async fn before_model(
        &self,
        cx: &mut RunContext<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), MiddlewareError> {
        let report = repair(&mut request.messages);
        if !report.is_clean() {
            tracing::debug!(
                thread = %cx.thread.id,
                placeholders = report.placeholders,
                orphans_dropped = report.orphans_dropped,
                results_moved = report.results_moved,
                ids_repaired = report.ids_repaired,
                "repaired tool-call pairing in the model request"
            );
            metrics::counter!("antler_dangling_tool_call_repairs_total").increment(report.total());
        }
        Ok(())
    }
}

/// What [`repair`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RepairReport {
    /// Placeholder results inserted for calls without a result.
    pub(crate) placeholders: u64,
    /// Tool messages dropped because they answer no earlier call.
    pub(crate) orphans_dropped: u64,
    /// Results moved next to their call.
    pub(crate) results_moved: u64,
    /// Calls given a new id because theirs was empty or already used.
    pub(crate) ids_repaired: u64,
}

impl RepairReport {
    fn is_clean(&self) -> bool {
        self.total() == 0
    }

    fn total(&self) -> u64 {
        self.placeholders + self.orphans_dropped + self.results_moved + self.ids_repaired
    }
}

/// The plan for one assistant message with tool calls.
struct CallPlan {
    /// The final id of each call, in call order.
    ids: Vec<String>,
    /// For each call, the index of the tool message answering it, if any.
    results: Vec<Option<usize>>,
}

/// Repairs the tool-call pairing of `messages` in place (see the module doc).
pub(crate) fn repair(messages: &mut Vec<ChatMessage>) -> RepairReport {
    let mut report = RepairReport::default();

    // Every id in use, so repaired ids never collide with one.
    let mut taken: HashSet<String> = HashSet::new();
    // Tool message positions by the id they answer.
    let mut results_by_id: HashMap<&str, Vec<usize>> = HashMap::new();
    // Assistant message positions by the (original) call ids they contain.
    let mut assistants_by_id: HashMap<&str, Vec<usize>> = HashMap::new();
    for (index, message) in messages.iter().enumerate() {
        match message {
            ChatMessage::Assistant { tool_calls, .. } => {
                for call in tool_calls {
                    taken.insert(call.id.clone());
                    let seen = assistants_by_id.entry(call.id.as_str()).or_default();
                    if seen.last() != Some(&index) {
                        seen.push(index);
                    }
                }
            }
            ChatMessage::Tool { tool_call_id, .. } => {
                taken.insert(tool_call_id.clone());
                results_by_id
                    .entry(tool_call_id.as_str())
                    .or_default()
                    .push(index);
            }
            ChatMessage::System { .. } | ChatMessage::User { .. } => {}
        }
    }

    let mut claimed = vec![false; messages.len()];
    let mut used_ids: HashSet<String> = HashSet::new();
    let mut next_repair = 1_u64;
    let mut plans: HashMap<usize, CallPlan> = HashMap::new();

    for (index, message) in messages.iter().enumerate() {
        let ChatMessage::Assistant { tool_calls, .. } = message else {
            continue;
        };
        if tool_calls.is_empty() {
            continue;
        }
        let mut plan = CallPlan {
            ids: Vec::with_capacity(tool_calls.len()),
            results: Vec::with_capacity(tool_calls.len()),
        };
        for call in tool_calls {
            let original = call.id.as_str();
            // A result belongs to this call if it comes after this assistant message and
            // before the next assistant message that reuses the same id.
            let bound = assistants_by_id
                .get(original)
                .and_then(|positions| positions.iter().copied().find(|&p| p > index))
                .unwrap_or(messages.len());
            let result = results_by_id.get(original).and_then(|positions| {
                positions
                    .iter()
                    .copied()
                    .find(|&p| p > index && p < bound && !claimed.get(p).copied().unwrap_or(true))
            });
            if let Some(slot) = result.and_then(|position| claimed.get_mut(position)) {
                *slot = true;
            }

            let id = if original.is_empty() || used_ids.contains(original) {
                report.ids_repaired += 1;
                loop {
                    let candidate = format!("call_repaired_{next_repair}");
                    next_repair += 1;
                    if !taken.contains(&candidate) {
                        taken.insert(candidate.clone());
                        break candidate;
                    }
                }
            } else {
                original.to_owned()
            };
            used_ids.insert(id.clone());
            plan.ids.push(id);
            plan.results.push(result);
        }
        plans.insert(index, plan);
    }

    // Fast path: nothing to move, insert, drop or rename.
    let needs_rebuild = report.ids_repaired > 0
        || claimed
            .iter()
            .zip(messages.iter())
            .any(|(claimed, m)| matches!(m, ChatMessage::Tool { .. }) && !claimed)
        || plans.iter().any(|(&index, plan)| {
            let mut found: Vec<usize> = plan.results.iter().flatten().copied().collect();
            found.sort_unstable();
            found.len() != plan.results.len()
                || found
                    .iter()
                    .enumerate()
                    .any(|(offset, &position)| position != index + 1 + offset)
        });
    if !needs_rebuild {
        return report;
    }

    let mut slots: Vec<Option<ChatMessage>> =
        std::mem::take(messages).into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(slots.len());
    for index in 0..slots.len() {
        let Some(message) = slots.get_mut(index).and_then(Option::take) else {
            // Already moved next to its call.
            continue;
        };
        match message {
            ChatMessage::Assistant {
                content,
                mut tool_calls,
                reasoning,
            } => {
                let Some(plan) = plans.remove(&index) else {
                    out.push(ChatMessage::Assistant {
                        content,
                        tool_calls,
                        reasoning,
                    });
                    continue;
                };
                for (call, id) in tool_calls.iter_mut().zip(plan.ids.iter()) {
                    call.id.clone_from(id);
                }
                out.push(ChatMessage::Assistant {
                    content,
                    tool_calls,
                    reasoning,
                });

                // Existing results, in their original order, then placeholders in call order.
                let mut found: Vec<(usize, &String)> = plan
                    .results
                    .iter()
                    .zip(plan.ids.iter())
                    .filter_map(|(result, id)| result.map(|position| (position, id)))
                    .collect();
                found.sort_unstable_by_key(|(position, _)| *position);
                let mut expected = index + 1;
                for (position, id) in found {
                    if position != expected {
                        report.results_moved += 1;
                    }
                    expected = position + 1;
                    if let Some(ChatMessage::Tool { content, .. }) =
                        slots.get_mut(position).and_then(Option::take)
                    {
                        out.push(ChatMessage::tool(id.clone(), content));
                    }
                }
                for (result, id) in plan.results.iter().zip(plan.ids.iter()) {
                    if result.is_none() {
                        report.placeholders += 1;
                        out.push(ChatMessage::tool(id.clone(), PLACEHOLDER));
                    }
                }
            }
            ChatMessage::Tool { .. } => {
                // Not claimed by any earlier call.
                report.orphans_dropped += 1;
            }
            other @ (ChatMessage::System { .. } | ChatMessage::User { .. }) => out.push(other),
        }
    }
    *messages = out;
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::message::ToolCall;
    use crate::agent::middleware::test_context;
    use crate::agent::thread::ThreadState;

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall {
            id: id.to_owned(),
            name: name.to_owned(),
            arguments: "{}".to_owned(),
        }
    }

    fn calls(ids: &[&str]) -> ChatMessage {
        ChatMessage::assistant_calls("", ids.iter().map(|id| call(id, "t")).collect())
    }

    /// Asserts the OpenAI pairing rule: each assistant message with tool calls is followed by
    /// exactly one result per call id, and every tool message answers the run before it.
    fn assert_well_formed(messages: &[ChatMessage]) {
        let mut index = 0;
        while let Some(message) = messages.get(index) {
            match message {
                ChatMessage::Assistant { tool_calls, .. } if !tool_calls.is_empty() => {
                    let mut wanted: Vec<&str> = tool_calls.iter().map(|c| c.id.as_str()).collect();
                    wanted.sort_unstable();
                    let mut got = Vec::new();
                    index += 1;
                    while let Some(ChatMessage::Tool { tool_call_id, .. }) = messages.get(index) {
                        got.push(tool_call_id.as_str());
                        index += 1;
                    }
                    got.sort_unstable();
                    assert_eq!(wanted, got, "results do not match calls in {messages:#?}");
                }
                ChatMessage::Tool { .. } => panic!("stray tool message at {index}: {messages:#?}"),
                _ => index += 1,
            }
        }
    }

    #[test]
    fn interrupted_call_gets_placeholder_after_existing_results() {
        let mut messages = vec![
            ChatMessage::user("hi"),
            calls(&["a", "b", "c"]),
            ChatMessage::tool("b", "B"),
            ChatMessage::user("what happened?"),
        ];
        let report = repair(&mut messages);
        assert_eq!(report.placeholders, 2);
        assert_eq!(
            messages,
            vec![
                ChatMessage::user("hi"),
                calls(&["a", "b", "c"]),
                ChatMessage::tool("b", "B"),
                ChatMessage::tool("a", PLACEHOLDER),
                ChatMessage::tool("c", PLACEHOLDER),
                ChatMessage::user("what happened?"),
            ]
        );
        assert_well_formed(&messages);
    }

    #[test]
    fn trailing_call_without_results_gets_placeholder() {
        let mut messages = vec![ChatMessage::user("hi"), calls(&["a"])];
        repair(&mut messages);
        assert_eq!(messages.last(), Some(&ChatMessage::tool("a", PLACEHOLDER)));
        assert_well_formed(&messages);
    }

    #[test]
    fn orphan_results_are_dropped() {
        let mut messages = vec![
            ChatMessage::tool("ghost", "before any call"),
            ChatMessage::user("hi"),
            calls(&["a"]),
            ChatMessage::tool("a", "A"),
            ChatMessage::tool("nobody", "orphan"),
            ChatMessage::tool("a", "surplus duplicate"),
            ChatMessage::assistant("done"),
        ];
        let report = repair(&mut messages);
        assert_eq!(report.orphans_dropped, 3);
        assert_eq!(
            messages,
            vec![
                ChatMessage::user("hi"),
                calls(&["a"]),
                ChatMessage::tool("a", "A"),
                ChatMessage::assistant("done"),
            ]
        );
    }

    #[test]
    fn complete_history_is_untouched() {
        let original = vec![
            ChatMessage::system("sys"),
            ChatMessage::user("hi"),
            calls(&["a", "b"]),
            // Results in a different order than the calls are still valid.
            ChatMessage::tool("b", "B"),
            ChatMessage::tool("a", "A"),
            calls(&["c"]),
            ChatMessage::tool("c", "C"),
            ChatMessage::assistant("done"),
            ChatMessage::user("again"),
        ];
        let mut messages = original.clone();
        let report = repair(&mut messages);
        assert_eq!(report, RepairReport::default());
        assert_eq!(messages, original);
    }

    #[test]
    fn out_of_place_result_is_regrouped() {
        let mut messages = vec![
            calls(&["a", "b"]),
            ChatMessage::tool("a", "A"),
            ChatMessage::user("interjection"),
            ChatMessage::tool("b", "B"),
        ];
        let report = repair(&mut messages);
        assert_eq!(report.results_moved, 1);
        assert_eq!(report.placeholders, 0);
        assert_eq!(
            messages,
            vec![
                calls(&["a", "b"]),
                ChatMessage::tool("a", "A"),
                ChatMessage::tool("b", "B"),
                ChatMessage::user("interjection"),
            ]
        );
    }

    #[test]
    fn duplicate_ids_are_repaired_and_pairing_kept() {
        let mut messages = vec![
            calls(&["x", "x"]),
            ChatMessage::tool("x", "first"),
            ChatMessage::tool("x", "second"),
            calls(&["x"]),
            ChatMessage::tool("x", "third"),
        ];
        let report = repair(&mut messages);
        assert_eq!(report.ids_repaired, 2);
        assert_eq!(
            messages,
            vec![
                calls(&["x", "call_repaired_1"]),
                ChatMessage::tool("x", "first"),
                ChatMessage::tool("call_repaired_1", "second"),
                calls(&["call_repaired_2"]),
                ChatMessage::tool("call_repaired_2", "third"),
            ]
        );
        assert_well_formed(&messages);

        // Deterministic: the same input gives the same repair.
        let mut again = vec![
            calls(&["x", "x"]),
            ChatMessage::tool("x", "first"),
            ChatMessage::tool("x", "second"),
            calls(&["x"]),
            ChatMessage::tool("x", "third"),
        ];
        repair(&mut again);
        assert_eq!(again, messages);
    }

    #[test]
    fn interrupted_duplicate_does_not_steal_a_later_result() {
        // The first call "x" was interrupted; the second call reuses "x" and has a result.
        let mut messages = vec![
            calls(&["x"]),
            ChatMessage::user("retry"),
            calls(&["x"]),
            ChatMessage::tool("x", "later"),
        ];
        repair(&mut messages);
        assert_eq!(
            messages,
            vec![
                calls(&["x"]),
                ChatMessage::tool("x", PLACEHOLDER),
                ChatMessage::user("retry"),
                calls(&["call_repaired_1"]),
                ChatMessage::tool("call_repaired_1", "later"),
            ]
        );
        assert_well_formed(&messages);
    }

    #[test]
    fn empty_ids_are_repaired_without_collisions() {
        let mut messages = vec![
            calls(&["", "call_repaired_1"]),
            ChatMessage::tool("", "empty"),
            ChatMessage::tool("call_repaired_1", "named"),
        ];
        let report = repair(&mut messages);
        assert_eq!(report.ids_repaired, 1);
        assert_eq!(
            messages,
            vec![
                calls(&["call_repaired_2", "call_repaired_1"]),
                ChatMessage::tool("call_repaired_2", "empty"),
                ChatMessage::tool("call_repaired_1", "named"),
            ]
        );
        assert_well_formed(&messages);
    }

    #[tokio::test]
    async fn before_model_repairs_the_request_not_the_history() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        thread.messages = vec![ChatMessage::user("hi"), calls(&["a"])];
        let stored = thread.messages.clone();
        let mut request = ModelRequest {
            messages: stored.clone(),
            tools: Vec::new(),
        };
        let middleware =
            DanglingToolCallMiddleware::from_config(&DanglingToolCallConfig::default());
        let Some(middleware) = middleware else {
            panic!("enabled by default");
        };
        let mut cx = test_context(&mut thread);
        middleware
            .before_model(&mut cx, &mut request)
            .await
            .unwrap();
        assert_eq!(
            request.messages.last(),
            Some(&ChatMessage::tool("a", PLACEHOLDER))
        );
        assert_eq!(thread.messages, stored);
    }

    #[test]
    fn disabled_config_gives_none() {
        let cfg = DanglingToolCallConfig { enabled: false };
        assert!(DanglingToolCallMiddleware::from_config(&cfg).is_none());
    }
}
