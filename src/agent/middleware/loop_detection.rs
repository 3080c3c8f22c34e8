//! loop_detection (chain position 16): stops a model that keeps making the same tool calls.
//!
//! Semantics after DeerFlow's LoopDetectionMiddleware (reference/deerflow.md section 5):
//!
//! - In `after_model`, a response with tool calls is reduced to one hash: MD5 over the sorted
//!   list of `name:key`, first 12 hex chars. The key holds what makes two calls the same:
//!   for `read_file` the path and the 200-line buckets its range starts and ends in (reading
//!   lines 1-50 and then 51-100 of one file is the same read), for `bash` the command, for
//!   every other tool the arguments parsed as JSON and re-serialized with sorted keys (the
//!   trimmed raw text when they are not JSON). The order of the calls within one response
//!   does not matter.
//! - Per run the last `window` (20) hashes are kept. When the new hash occurs `warn_threshold`
//!   (3) times in the window, a warning is queued for that run — once per hash while it stays
//!   in the window (DeerFlow's behaviour: the 4th repeat does not warn again; a hash that left
//!   the window may warn again later).
//! - The queued warning ([`WARNING`]) is injected by the *next* `before_model` as a user
//!   message appended at the very end of the request, after the tool results, then cleared.
//!   Injecting it in the same step would place a user message between an assistant's tool
//!   calls and their results, which OpenAI-compatible providers reject with HTTP 400.
//! - When the hash occurs `hard_limit` (5) or more times, all tool calls are stripped, the
//!   finish reason becomes `Stop`, [`FORCED_STOP`] is appended to the content and the run is
//!   stopped (`RunControl::Stop`) with the reason `loop_capped`.
//! - Per tool, the calls of a run are counted too (DeerFlow's frequency layer): a model that
//!   calls one tool `tool_freq_warn` (30) times in a run, whatever the arguments (reading
//!   file after file), is warned once ([`frequency_warning`]), and at `tool_freq_hard_limit`
//!   (50) stopped as above. `tool_freq_overrides` sets both per tool (`{ bash = { warn = 100,
//!   hard_limit = 150 } }`) for tools a task legitimately calls often.
//! - The window belongs to one run: the lead's run and each subagent task's run keep their own
//!   (in [`RunContext::state`](super::RunContext::state)), although subagents run under their
//!   parent's thread id with this same middleware instance. So a subagent starting does not
//!   empty the lead's window (a lead repeating one `task` call is caught), parallel subagents
//!   do not pool their calls, and nothing is left behind when a run ends. DeerFlow builds
//!   fresh middlewares per subagent task to the same end. DeerFlow keeps the lead's window
//!   across runs, so a user who asks for the same check in five separate turns (one identical
//!   tool call each) is stopped as a loop on the fifth (its issue #2511); here each turn starts
//!   clean, and only a model repeating itself within one run is a loop.
//!
//! Placement: last but one in the chain. `after_model` hooks run in reverse order, so its
//! `after_model` runs first and sees the raw tool calls before anything else rewrites the
//! response (and title/token_usage see its forced stop). Its `before_model` runs last, so the
//! warning is appended after everything earlier middlewares added or repaired
//! (dangling_tool_call has already completed the tool results it lands after). It fails open.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError, RunContext};
use crate::agent::message::{ChatMessage, ToolCall};
use crate::agent::model::{FinishReason, ModelRequest, ModelResponse};

/// The warning injected before the model call that follows a repeated tool-call set.
pub(crate) const WARNING: &str = "[LOOP DETECTED] You are repeating the same tool calls. Stop calling tools and answer with what you have, or try a different approach.";

/// Appended to the answer when repeated tool calls were stripped.
pub(crate) const FORCED_STOP: &str =
    "[FORCED STOP] Repeated tool calls were stopped; answering with what is known so far.";

/// The warning injected when one tool was called `count` times in a run.
pub(crate) fn frequency_warning(tool: &str, count: usize) -> String {
    format!(
        "[LOOP DETECTED] You have called {tool} {count} times in this run without an answer. \
         Stop calling tools and answer with what you have, or say what is left undone."
    )
}

/// Appended to the answer when a tool's calls passed its per-run limit.
fn frequency_stop(tool: &str, count: usize) -> String {
    format!(
        "[FORCED STOP] {tool} was called {count} times in this run, over its limit; answering \
         with what is known so far."
    )
}

/// The lines of one `read_file` bucket: reads within the same 200 lines are the same read.
const READ_BUCKET_LINES: u64 = 200;

/// The run's stop reason after a forced stop.
pub(crate) const STOP_REASON: &str = "loop_capped";

/// `[agent.middleware.loop_detection]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct LoopDetectionConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
    /// Repeats of the same tool-call set (within the window) that trigger a warning.
    pub(crate) warn_threshold: usize,
    /// Repeats that strip the tool calls and force a text answer.
    pub(crate) hard_limit: usize,
    /// How many recent tool-call sets of a run are remembered.
    pub(crate) window: usize,
    /// No longer used (each run keeps its own window, dropped with the run); still accepted
    /// so existing config files load.
    pub(crate) max_threads: usize,
    /// Calls of one tool in a run that add a warning.
    pub(crate) tool_freq_warn: usize,
    /// Calls of one tool in a run that strip the tool calls and force a text answer.
    pub(crate) tool_freq_hard_limit: usize,
    /// Both limits for particular tools, by name (`{ bash = { warn = 100, hard_limit = 150 } }`).
    pub(crate) tool_freq_overrides: BTreeMap<String, ToolFrequencyLimits>,
}

/// One tool's per-run call limits (`tool_freq_overrides`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolFrequencyLimits {
    /// Calls that add a warning.
    pub(crate) warn: usize,
    /// Calls that force a text answer.
    pub(crate) hard_limit: usize,
}

impl Default for LoopDetectionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            warn_threshold: 3,
            hard_limit: 5,
            window: 20,
            max_threads: 100,
            tool_freq_warn: 30,
            tool_freq_hard_limit: 50,
            tool_freq_overrides: BTreeMap::new(),
        }
    }
}

/// One run's recent tool calls.
#[derive(Debug, Clone, Default)]
struct RunWindow {
    /// The most recent tool-call set hashes, oldest first, at most `window`.
    recent: VecDeque<String>,
    /// Hashes already warned about while they were in the window.
    warned: HashSet<String>,
    /// A warning waiting for the next model call.
    pending_warning: Option<String>,
    /// Calls of each tool in this run.
    calls_by_tool: HashMap<String, usize>,
    /// Tools already warned about for their frequency.
    frequency_warned: HashSet<String>,
}

/// What `after_model` decided for one response.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Pass,
    Warn,
    Stop,
    /// A tool was called too often: warned with this text.
    WarnFrequency(String),
    /// A tool was called too often: stopped with this note.
    StopFrequency(String),
}

/// Detects repeated tool-call sets within a run.
#[derive(Debug)]
pub(crate) struct LoopDetectionMiddleware {
    warn_threshold: usize,
    hard_limit: usize,
    window: usize,
    frequency: ToolFrequencyLimits,
    frequency_overrides: BTreeMap<String, ToolFrequencyLimits>,
}

impl LoopDetectionMiddleware {
    /// The middleware, or `None` when it is disabled. Values below 1 are raised to 1, and the
    /// hard limit to at least the warn threshold.
    pub(crate) fn from_config(cfg: &LoopDetectionConfig) -> Option<Self> {
        let warn_threshold = cfg.warn_threshold.max(1);
        let limits = |warn: usize, hard_limit: usize| {
            let warn = warn.max(1);
            ToolFrequencyLimits {
                warn,
                hard_limit: hard_limit.max(warn),
            }
        };
        cfg.enabled.then(|| Self {
            warn_threshold,
            hard_limit: cfg.hard_limit.max(warn_threshold),
            window: cfg.window.max(1),
            frequency: limits(cfg.tool_freq_warn, cfg.tool_freq_hard_limit),
            frequency_overrides: cfg
                .tool_freq_overrides
                .iter()
                .map(|(tool, o)| (tool.clone(), limits(o.warn, o.hard_limit)))
                .collect(),
        })
    }

    /// Counts one response's calls per tool; says whether a tool passed its limits. The
    /// first tool over its hard limit stops; else the first newly over its warn limit warns.
    fn record_frequency(&self, run: &mut RunWindow, calls: &[ToolCall]) -> Verdict {
        let mut verdict = Verdict::Pass;
        for call in calls {
            let count = run.calls_by_tool.entry(call.name.clone()).or_insert(0);
            *count += 1;
            let count = *count;
            let limits = self
                .frequency_overrides
                .get(&call.name)
                .unwrap_or(&self.frequency);
            if count >= limits.hard_limit {
                return Verdict::StopFrequency(frequency_stop(&call.name, count));
            }
            if count >= limits.warn
                && verdict == Verdict::Pass
                && run.frequency_warned.insert(call.name.clone())
            {
                verdict = Verdict::WarnFrequency(frequency_warning(&call.name, count));
            }
        }
        verdict
    }

    /// Records one tool-call set in the run's window and says what to do about it.
    fn record(&self, run: &mut RunWindow, hash: String) -> (Verdict, usize) {
        run.recent.push_back(hash.clone());
        while run.recent.len() > self.window {
            let Some(old) = run.recent.pop_front() else {
                break;
            };
            if !run.recent.contains(&old) {
                run.warned.remove(&old);
            }
        }
        let count = run.recent.iter().filter(|h| **h == hash).count();
        let verdict = if count >= self.hard_limit {
            Verdict::Stop
        } else if count >= self.warn_threshold && run.warned.insert(hash) {
            run.pending_warning = Some(WARNING.to_owned());
            Verdict::Warn
        } else {
            Verdict::Pass
        };
        (verdict, count)
    }
}

/// Takes the run's pending warning, if any.
fn take_warning(cx: &mut RunContext<'_>) -> Option<String> {
    cx.state
        .get_or_default::<RunWindow>()
        .pending_warning
        .take()
}

#[async_trait::async_trait]
impl Middleware for LoopDetectionMiddleware {
    fn name(&self) -> &'static str {
        "loop_detection"
    }

    async fn before_model(
        &self,
        cx: &mut RunContext<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), MiddlewareError> {
        if let Some(warning) = take_warning(cx) {
            // At the end: after the last assistant message's tool results, never between.
            request.messages.push(ChatMessage::user(warning));
        }
        Ok(())
    }

    async fn after_model(
        &self,
        cx: &mut RunContext<'_>,
        response: &mut ModelResponse,
    ) -> Result<(), MiddlewareError> {
        if response.tool_calls.is_empty() {
            return Ok(());
        }
        let hash = tool_calls_hash(&response.tool_calls);
        let run: &mut RunWindow = cx.state.get_or_default();
        let (verdict, count) = self.record(run, hash.clone());
        // The repeat layer decides first; the frequency layer when it lets the calls pass.
        let verdict = match verdict {
            Verdict::Pass => match self.record_frequency(run, &response.tool_calls) {
                Verdict::WarnFrequency(warning) => {
                    run.pending_warning = Some(warning.clone());
                    Verdict::WarnFrequency(warning)
                }
                other => other,
            },
            other => {
                self.record_frequency(run, &response.tool_calls);
                other
            }
        };
        match verdict {
            Verdict::Pass => {}
            Verdict::WarnFrequency(warning) => {
                tracing::info!(thread = %cx.thread.id, %warning, "one tool called often: warning queued");
                metrics::counter!("antler_loop_detection_total", "action" => "warn_frequency")
                    .increment(1);
            }
            Verdict::StopFrequency(note) => {
                tracing::warn!(thread = %cx.thread.id, %note, "one tool called too often: forced stop");
                metrics::counter!("antler_loop_detection_total", "action" => "stop_frequency")
                    .increment(1);
                force_stop(cx, response, &note);
            }
            Verdict::Warn => {
                tracing::info!(thread = %cx.thread.id, %hash, count, "repeated tool calls: warning queued");
                metrics::counter!("antler_loop_detection_total", "action" => "warn").increment(1);
            }
            Verdict::Stop => {
                tracing::warn!(thread = %cx.thread.id, %hash, count, "repeated tool calls: forced stop");
                metrics::counter!("antler_loop_detection_total", "action" => "stop").increment(1);
                force_stop(cx, response, FORCED_STOP);
            }
        }
        Ok(())
    }
}

/// Strips the response's tool calls, appends `note` to its text and stops the run.
fn force_stop(cx: &mut RunContext<'_>, response: &mut ModelResponse, note: &str) {
    response.tool_calls.clear();
    response.finish_reason = FinishReason::Stop;
    if response.content.trim().is_empty() {
        response.content = note.to_owned();
    } else {
        response.content.push_str("\n\n");
        response.content.push_str(note);
    }
    cx.stop(STOP_REASON);
}

/// The canonical form of one call, `name:key`: what makes two calls the same (module doc).
fn normalize(call: &ToolCall) -> String {
    let parsed = serde_json::from_str::<serde_json::Value>(&call.arguments).ok();
    let salient = parsed.as_ref().and_then(|args| match call.name.as_str() {
        "read_file" => read_key(args),
        "bash" => args
            .get("command")
            .and_then(serde_json::Value::as_str)
            .map(|command| command.trim().to_owned()),
        _ => None,
    });
    let key = salient.unwrap_or_else(|| match parsed {
        Some(value) => serde_json::to_string(&sort_keys(value))
            .unwrap_or_else(|_| call.arguments.trim().to_owned()),
        None => call.arguments.trim().to_owned(),
    });
    format!("{}:{key}", call.name)
}

/// A `read_file` call's key: its path and the 200-line buckets of its range's first and
/// last line (a missing start is line 1, a missing end the start).
fn read_key(args: &serde_json::Value) -> Option<String> {
    let path = args.get("path")?.as_str()?;
    let line = |field: &str| args.get(field).and_then(serde_json::Value::as_u64);
    let start = line("start_line").unwrap_or(1).max(1);
    let end = line("end_line").unwrap_or(start).max(1);
    let (first, last) = (start.min(end), start.max(end));
    let bucket = |line: u64| (line - 1) / READ_BUCKET_LINES;
    Some(format!("{path}:{}-{}", bucket(first), bucket(last)))
}

/// The value with every object's keys in sorted order (independent of whether serde_json's
/// `preserve_order` feature is on somewhere in the build).
fn sort_keys(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(String, serde_json::Value)> = map.into_iter().collect();
            entries.sort_by(|(a, _), (b, _)| a.cmp(b));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect(),
            )
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sort_keys).collect())
        }
        other => other,
    }
}

/// The hash of one response's tool-call set: MD5 of the sorted normalized calls joined by
/// newlines, first 12 hex chars.
pub(crate) fn tool_calls_hash(calls: &[ToolCall]) -> String {
    let mut normalized: Vec<String> = calls.iter().map(normalize).collect();
    normalized.sort_unstable();
    let digest = Md5::digest(normalized.join("\n").as_bytes());
    let mut hex = hex::encode(digest);
    hex.truncate(12);
    hex
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::middleware::test_context;
    use crate::agent::thread::ThreadState;

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    fn response(calls: Vec<ToolCall>) -> ModelResponse {
        ModelResponse {
            content: String::new(),
            tool_calls: calls,
            usage: None,
            finish_reason: FinishReason::ToolCalls,
            reasoning: None,
        }
    }

    fn shell(id: &str) -> Vec<ToolCall> {
        vec![call(id, "shell", r#"{"command": "kubectl get pods"}"#)]
    }

    fn middleware(cfg: LoopDetectionConfig) -> LoopDetectionMiddleware {
        let Some(m) = LoopDetectionMiddleware::from_config(&cfg) else {
            panic!("enabled");
        };
        m
    }

    fn thread(id: &str) -> ThreadState {
        ThreadState::new(id.into(), "c".into(), 0, 0)
    }

    /// A request ending like the real loop's: the assistant's tool calls and their results.
    fn request_after(calls: &[ToolCall]) -> ModelRequest {
        let mut messages = vec![
            ChatMessage::system("sys"),
            ChatMessage::user("check the pods"),
            ChatMessage::assistant_calls("", calls.to_vec()),
        ];
        messages.extend(
            calls
                .iter()
                .map(|c| ChatMessage::tool(c.id.clone(), "output")),
        );
        ModelRequest {
            messages,
            tools: Vec::new(),
        }
    }

    /// One model step: before_model on a request, then after_model on a response with these
    /// calls. Returns the request as sent and the response as rewritten.
    async fn step(
        m: &LoopDetectionMiddleware,
        cx: &mut RunContext<'_>,
        calls: Vec<ToolCall>,
    ) -> (ModelRequest, ModelResponse) {
        let mut request = request_after(&calls);
        m.before_model(cx, &mut request).await.unwrap();
        let mut r = response(calls);
        m.after_model(cx, &mut r).await.unwrap();
        (request, r)
    }

    fn warnings(request: &ModelRequest) -> usize {
        request
            .messages
            .iter()
            .filter(|m| **m == ChatMessage::user(WARNING))
            .count()
    }

    #[test]
    fn hash_ignores_call_order_and_key_order_but_not_args() {
        let a = call(
            "1",
            "read",
            r#"{"path": "/a", "lines": [1, {"z": 1, "y": 2}]}"#,
        );
        let b = call("2", "shell", "  not json  ");
        let a_reordered = call("9", "read", r#"{"lines":[1,{"y":2,"z":1}],"path":"/a"}"#);
        let b_trimmed = call("8", "shell", "not json");
        assert_eq!(
            tool_calls_hash(&[a.clone(), b.clone()]),
            tool_calls_hash(&[b_trimmed, a_reordered])
        );
        assert_eq!(tool_calls_hash(std::slice::from_ref(&a)).len(), 12);
        assert_ne!(
            tool_calls_hash(std::slice::from_ref(&a)),
            tool_calls_hash(&[call("1", "read", r#"{"path": "/b"}"#)])
        );
        assert_ne!(
            tool_calls_hash(std::slice::from_ref(&a)),
            tool_calls_hash(&[a, b])
        );
    }

    #[tokio::test]
    async fn the_same_check_in_five_separate_turns_is_not_a_loop() {
        let m = middleware(LoopDetectionConfig::default());
        let mut t = thread("t1");
        for turn in 1..=5 {
            let mut cx = test_context(&mut t);
            m.before_run(&mut cx).await.unwrap();
            let (request, r) = step(&m, &mut cx, shell(&format!("c{turn}"))).await;
            assert_eq!(warnings(&request), 0, "turn {turn}");
            assert_eq!(r.tool_calls.len(), 1, "turn {turn}: answered normally");
            let (request, _) = step(&m, &mut cx, Vec::new()).await;
            assert_eq!(warnings(&request), 0, "turn {turn}");
        }
        // Within one run, five repeats are still a loop.
        let mut cx = test_context(&mut t);
        m.before_run(&mut cx).await.unwrap();
        let mut last = None;
        for i in 1..=5 {
            last = Some(step(&m, &mut cx, shell(&format!("r{i}"))).await.1);
        }
        assert!(last.unwrap().tool_calls.is_empty(), "stripped at the fifth");
    }

    #[tokio::test]
    async fn warns_at_third_repeat_in_the_next_request_at_the_end() {
        let m = middleware(LoopDetectionConfig::default());
        let mut t = thread("t1");
        let mut cx = test_context(&mut t);

        for i in 1..=2 {
            let (request, r) = step(&m, &mut cx, shell(&format!("c{i}"))).await;
            assert_eq!(warnings(&request), 0);
            assert_eq!(r.tool_calls.len(), 1);
        }
        // The 3rd identical set: the warning is queued, not added to this response.
        let (request, r) = step(&m, &mut cx, shell("c3")).await;
        assert_eq!(warnings(&request), 0);
        assert_eq!(r.tool_calls.len(), 1, "a warning does not strip the calls");
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);

        // The next request carries it once, as the very last message, after the tool results.
        let calls = shell("c3");
        let mut next = request_after(&calls);
        let before = next.messages.clone();
        m.before_model(&mut cx, &mut next).await.unwrap();
        assert_eq!(next.messages.len(), before.len() + 1);
        assert_eq!(next.messages[..before.len()], before[..]);
        assert_eq!(next.messages.last(), Some(&ChatMessage::user(WARNING)));

        // Cleared after injection.
        let mut after = request_after(&calls);
        m.before_model(&mut cx, &mut after).await.unwrap();
        assert_eq!(warnings(&after), 0);
        assert_eq!(cx.control(), None);
    }

    #[tokio::test]
    async fn warning_never_lands_between_tool_calls_and_results() {
        let m = middleware(LoopDetectionConfig::default());
        let mut t = thread("t1");
        let mut cx = test_context(&mut t);
        let calls = vec![
            call("a", "shell", r#"{"command":"ls"}"#),
            call("b", "read", r#"{"path":"x"}"#),
        ];
        for _ in 0..3 {
            m.after_model(&mut cx, &mut response(calls.clone()))
                .await
                .unwrap();
        }
        let mut request = request_after(&calls);
        m.before_model(&mut cx, &mut request).await.unwrap();

        let position = request
            .messages
            .iter()
            .position(|m| *m == ChatMessage::user(WARNING));
        let Some(position) = position else {
            panic!("warning missing: {:#?}", request.messages);
        };
        // Everything after an assistant message with tool calls up to the warning is a result.
        let assistant = request.messages.iter().rposition(
            |m| matches!(m, ChatMessage::Assistant { tool_calls, .. } if !tool_calls.is_empty()),
        );
        let Some(assistant) = assistant else {
            panic!("no assistant message");
        };
        assert!(position > assistant);
        let between = &request.messages[assistant + 1..position];
        assert_eq!(between.len(), calls.len());
        assert!(
            between
                .iter()
                .all(|m| matches!(m, ChatMessage::Tool { .. }))
        );
    }

    #[tokio::test]
    async fn warns_once_per_hash_and_strips_at_the_fifth() {
        let m = middleware(LoopDetectionConfig::default());
        let mut t = thread("t1");
        let mut cx = test_context(&mut t);
        let mut warned_at = Vec::new();
        for i in 1..=4 {
            let mut r = response(shell("c"));
            m.after_model(&mut cx, &mut r).await.unwrap();
            assert_eq!(r.tool_calls.len(), 1, "repeat {i} must not strip");
            if take_warning(&mut cx).is_some() {
                warned_at.push(i);
            }
        }
        assert_eq!(warned_at, vec![3]);

        let mut r = response(shell("c"));
        r.content = "Let me check again.".into();
        m.after_model(&mut cx, &mut r).await.unwrap();
        assert!(r.tool_calls.is_empty());
        assert_eq!(r.finish_reason, FinishReason::Stop);
        assert_eq!(r.content, format!("Let me check again.\n\n{FORCED_STOP}"));
        assert_eq!(
            cx.take_control(),
            Some(crate::agent::middleware::RunControl::Stop {
                reason: STOP_REASON.into()
            })
        );

        // Empty content becomes just the notice.
        let mut r = response(shell("c"));
        m.after_model(&mut cx, &mut r).await.unwrap();
        assert_eq!(r.content, FORCED_STOP);
        assert!(r.tool_calls.is_empty());
    }

    #[tokio::test]
    async fn calls_in_a_different_order_count_as_the_same_set() {
        let m = middleware(LoopDetectionConfig::default());
        let mut t = thread("t1");
        let mut cx = test_context(&mut t);
        let a = call("1", "shell", r#"{"command":"ls","cwd":"/"}"#);
        let b = call("2", "read", r#"{"path":"x"}"#);
        let a2 = call("3", "shell", r#"{"cwd":"/","command":"ls"}"#);
        m.after_model(&mut cx, &mut response(vec![a.clone(), b.clone()]))
            .await
            .unwrap();
        m.after_model(&mut cx, &mut response(vec![b.clone(), a2]))
            .await
            .unwrap();
        assert!(take_warning(&mut cx).is_none());
        m.after_model(&mut cx, &mut response(vec![b, a]))
            .await
            .unwrap();
        assert!(take_warning(&mut cx).is_some());
    }

    #[tokio::test]
    async fn different_args_do_not_count() {
        let m = middleware(LoopDetectionConfig::default());
        let mut t = thread("t1");
        let mut cx = test_context(&mut t);
        for i in 0..10 {
            let mut r = response(vec![call("c", "read", &format!(r#"{{"path":"/f{i}"}}"#))]);
            m.after_model(&mut cx, &mut r).await.unwrap();
            assert_eq!(r.tool_calls.len(), 1);
        }
        assert!(take_warning(&mut cx).is_none());
        assert_eq!(cx.control(), None);
    }

    #[tokio::test]
    async fn window_forgets_old_sets() {
        let m = middleware(LoopDetectionConfig::default());
        let mut t = thread("t1");
        let mut cx = test_context(&mut t);
        // Two repeats, then 18 other sets fill the 20-wide window.
        for _ in 0..2 {
            m.after_model(&mut cx, &mut response(shell("c")))
                .await
                .unwrap();
        }
        for i in 0..18 {
            let calls = vec![call("c", "read", &format!(r#"{{"path":"/f{i}"}}"#))];
            m.after_model(&mut cx, &mut response(calls)).await.unwrap();
        }
        // The 3rd shell pushes the 1st out: 2 in the window, no warning.
        m.after_model(&mut cx, &mut response(shell("c")))
            .await
            .unwrap();
        assert!(take_warning(&mut cx).is_none());
        // The 4th pushes the 2nd out: still 2.
        m.after_model(&mut cx, &mut response(shell("c")))
            .await
            .unwrap();
        assert!(take_warning(&mut cx).is_none());
        // The 5th is the 3rd in the window.
        m.after_model(&mut cx, &mut response(shell("c")))
            .await
            .unwrap();
        assert!(take_warning(&mut cx).is_some());
        assert_eq!(cx.control(), None);
    }

    #[tokio::test]
    async fn warns_again_after_the_hash_left_the_window() {
        let m = middleware(LoopDetectionConfig {
            window: 4,
            ..LoopDetectionConfig::default()
        });
        let mut t = thread("t1");
        let mut cx = test_context(&mut t);
        for _ in 0..3 {
            m.after_model(&mut cx, &mut response(shell("c")))
                .await
                .unwrap();
        }
        assert!(take_warning(&mut cx).is_some());
        for i in 0..4 {
            let calls = vec![call("c", "read", &format!(r#"{{"path":"/f{i}"}}"#))];
            m.after_model(&mut cx, &mut response(calls)).await.unwrap();
        }
        for _ in 0..3 {
            m.after_model(&mut cx, &mut response(shell("c")))
                .await
                .unwrap();
        }
        assert!(take_warning(&mut cx).is_some());
    }

    #[tokio::test]
    async fn runs_are_tracked_separately() {
        let m = middleware(LoopDetectionConfig::default());
        let mut a = thread("a");
        let mut b = thread("b");
        let mut a = test_context(&mut a);
        let mut b = test_context(&mut b);
        // a and b each make the same call twice: a run's count is its own.
        for _ in 0..2 {
            m.after_model(&mut a, &mut response(shell("x")))
                .await
                .unwrap();
            m.after_model(&mut b, &mut response(shell("x")))
                .await
                .unwrap();
        }
        assert!(take_warning(&mut a).is_none());
        assert!(take_warning(&mut b).is_none());
        // a's third call warns a, not b.
        m.after_model(&mut a, &mut response(shell("x")))
            .await
            .unwrap();
        assert!(take_warning(&mut a).is_some());
        assert!(take_warning(&mut b).is_none());
    }

    #[tokio::test]
    async fn responses_without_tool_calls_are_ignored() {
        let m = middleware(LoopDetectionConfig::default());
        let mut t = thread("t1");
        let mut cx = test_context(&mut t);
        for _ in 0..6 {
            let mut r = response(Vec::new());
            r.content = "plain answer".into();
            r.finish_reason = FinishReason::Stop;
            m.after_model(&mut cx, &mut r).await.unwrap();
            assert_eq!(r.content, "plain answer");
        }
        assert_eq!(cx.control(), None);
        assert!(cx.state.get::<RunWindow>().is_none());
    }

    #[test]
    fn config_is_respected() {
        let disabled = LoopDetectionConfig {
            enabled: false,
            ..LoopDetectionConfig::default()
        };
        assert!(LoopDetectionMiddleware::from_config(&disabled).is_none());
        let odd = LoopDetectionConfig {
            warn_threshold: 4,
            hard_limit: 2,
            window: 0,
            max_threads: 0,
            enabled: true,
            tool_freq_warn: 0,
            tool_freq_hard_limit: 0,
            tool_freq_overrides: BTreeMap::from([(
                "bash".to_owned(),
                ToolFrequencyLimits {
                    warn: 10,
                    hard_limit: 5,
                },
            )]),
        };
        let m = middleware(odd);
        assert_eq!(m.hard_limit, 4);
        assert_eq!(m.window, 1);
        assert_eq!(
            m.frequency,
            ToolFrequencyLimits {
                warn: 1,
                hard_limit: 1
            }
        );
        assert_eq!(m.frequency_overrides["bash"].hard_limit, 10);
    }

    #[test]
    fn reads_in_the_same_200_lines_of_a_file_are_the_same_call() {
        let read = |args: &str| tool_calls_hash(&[call("1", "read_file", args)]);
        let whole = read(r#"{"path": "/mnt/user-data/workspace/a.rs"}"#);
        assert_eq!(
            whole,
            read(r#"{"path": "/mnt/user-data/workspace/a.rs", "start_line": 1, "end_line": 50}"#)
        );
        assert_eq!(
            read(r#"{"path": "/mnt/user-data/workspace/a.rs", "start_line": 51, "end_line": 100}"#),
            read(
                r#"{"end_line": 200, "start_line": 120, "path": "/mnt/user-data/workspace/a.rs"}"#
            ),
        );
        assert_ne!(
            whole,
            read(r#"{"path": "/mnt/user-data/workspace/a.rs", "start_line": 201}"#),
            "the next 200 lines are a new read"
        );
        assert_ne!(
            whole,
            read(
                r#"{"path": "/mnt/user-data/workspace/a.rs", "start_line": 150, "end_line": 250}"#
            ),
            "a range across buckets differs"
        );
        assert_ne!(whole, read(r#"{"path": "/mnt/user-data/workspace/b.rs"}"#));
    }

    #[test]
    fn a_shell_call_is_its_command() {
        let bash = |args: &str| tool_calls_hash(&[call("1", "bash", args)]);
        assert_eq!(
            bash(r#"{"command": "ls -la"}"#),
            bash(r#"{"command": " ls -la ", "description": "list again"}"#)
        );
        assert_ne!(
            bash(r#"{"command": "ls -la"}"#),
            bash(r#"{"command": "ls"}"#)
        );
        // Other tools: every argument counts.
        let write = |args: &str| tool_calls_hash(&[call("1", "write_file", args)]);
        assert_ne!(
            write(r#"{"path": "a", "content": "x"}"#),
            write(r#"{"path": "a", "content": "y"}"#)
        );
    }

    #[tokio::test]
    async fn one_tool_called_often_is_warned_then_stopped_whatever_its_arguments() {
        let m = middleware(LoopDetectionConfig {
            tool_freq_warn: 3,
            tool_freq_hard_limit: 5,
            ..LoopDetectionConfig::default()
        });
        let mut thread = thread("t1");
        let mut cx = test_context(&mut thread);
        let read = |n: usize| {
            vec![call(
                &format!("c{n}"),
                "read_file",
                &format!(r#"{{"path": "/mnt/user-data/workspace/file{n}.txt"}}"#),
            )]
        };
        let mut sent = Vec::new();
        let mut last = None;
        for n in 1..=5 {
            let (request, response) = step(&m, &mut cx, read(n)).await;
            sent.push(request);
            last = Some(response);
        }
        let frequency_warnings = |request: &ModelRequest| {
            request
                .messages
                .iter()
                .filter(|m| m.text() == frequency_warning("read_file", 3))
                .count()
        };
        // Warned once, in the request after the third call.
        assert_eq!(
            sent.iter().map(frequency_warnings).collect::<Vec<_>>(),
            [0, 0, 0, 1, 0]
        );
        assert_eq!(sent.iter().map(warnings).sum::<usize>(), 0, "no repeats");
        let last = last.unwrap();
        assert!(last.tool_calls.is_empty(), "stopped at the fifth");
        assert_eq!(last.content, frequency_stop("read_file", 5));
        assert_eq!(
            cx.take_control(),
            Some(crate::agent::middleware::RunControl::Stop {
                reason: STOP_REASON.into()
            })
        );
    }

    #[tokio::test]
    async fn a_tools_override_replaces_the_frequency_limits() {
        let m = middleware(LoopDetectionConfig {
            tool_freq_warn: 2,
            tool_freq_hard_limit: 3,
            tool_freq_overrides: BTreeMap::from([(
                "bash".to_owned(),
                ToolFrequencyLimits {
                    warn: 10,
                    hard_limit: 20,
                },
            )]),
            ..LoopDetectionConfig::default()
        });
        let mut thread = thread("t1");
        let mut cx = test_context(&mut thread);
        for n in 1..=6 {
            let calls = vec![call(
                &format!("c{n}"),
                "bash",
                &format!(r#"{{"command": "echo {n}"}}"#),
            )];
            let (_, response) = step(&m, &mut cx, calls).await;
            assert_eq!(response.tool_calls.len(), 1, "call {n} runs");
        }
        assert_eq!(cx.control(), None);
        let (_, response) = step(
            &m,
            &mut cx,
            vec![
                call("x1", "ls", "{}"),
                call("x2", "ls", r#"{"path": "a"}"#),
                call("x3", "ls", r#"{"path": "b"}"#),
            ],
        )
        .await;
        assert!(response.tool_calls.is_empty(), "ls keeps the global limits");
    }
}
