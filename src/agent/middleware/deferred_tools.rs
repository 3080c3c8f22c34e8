//! deferred_tools (chain position 14): many tools (MCP servers) hidden behind `tool_search`.
//!
//! When the runtime offers more than `max_tools` tools, `before_model` offers only the core
//! tools (`core_tools`: the built-ins), the tools this thread has already found, and
//! `tool_search`; the others are deferred. `tool_search(query)` scores the deferred tools
//! against the query (exact name; words of the query in the name; words in the description)
//! and answers with the best [`MAX_RESULTS`], each with its description and parameter schema.
//! The tools it found are *promoted*: offered from the next model call on, for the rest of the
//! thread (kept in the thread's extensions with a hash of the deferred catalogue, so a
//! changed set of MCP tools after a restart starts over, as DeerFlow's `promoted` state
//! does). At most [`MAX_PROMOTED`] tools stay promoted; the oldest go first.
//!
//! A call to a deferred tool that was not found is not run: the model never saw its schema,
//! so its arguments are guesses. It is answered with a hint to use `tool_search` first
//! (DeerFlow blocks such calls too). With `max_tools` or fewer tools nothing is deferred and
//! `tool_search` is not offered at all.
//!
//! Placement: late in `before_model`, after everything that adds to the request, so it
//! filters the final tool list; its `before_tool` answers `tool_search` itself (it needs the
//! thread to remember promotions, which tools do not get) and respects an earlier guard's
//! refusal. Unlike DeerFlow, there is no separate auto-promotion middleware (McpRouting) and
//! deferral starts from a tool count rather than a switch, so a small setup loses nothing.
//! It fails open: a lost promotion never stops a run. The deferred catalogue of a run is the
//! tool list of its last `before_model`, kept in
//! [`RunContext::state`](super::RunContext::state): the lead's run and each subagent task's
//! run have their own, although they share this instance and the thread id, so one run
//! ending or offering other tools never lifts another run's blocking. Tool calls a crash left
//! unanswered run before the first model call of the resumed run, when it has no catalogue
//! yet, so there a `tool_search` asks to be repeated and other calls run as the model made
//! them.

use std::collections::HashSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Middleware, MiddlewareError, RunContext, ToolDecision, ToolOutput};
use crate::agent::message::ToolCall;
use crate::agent::model::{ModelRequest, ToolSpec};
use crate::agent::thread::Extension;
use crate::agent::tools::{InterceptedTool, Tool, intercepted_arguments};

/// The search tool's name.
pub(crate) const TOOL_NAME: &str = "tool_search";
/// Tools one search returns at most.
pub(crate) const MAX_RESULTS: usize = 5;
/// Tools a thread keeps promoted at most.
pub(crate) const MAX_PROMOTED: usize = 32;
/// A query is cut to this many characters.
const MAX_QUERY_CHARS: usize = 500;
/// A found tool's description is cut to this many characters.
const MAX_DESCRIPTION_CHARS: usize = 1000;
/// Names listed when nothing matches, at most.
const MAX_LISTED: usize = 50;

/// The built-in tools that are never deferred.
pub(crate) const DEFAULT_CORE_TOOLS: [&str; 12] = [
    "ls",
    "read_file",
    "write_file",
    "str_replace",
    "bash",
    "web_fetch",
    "current_time",
    "write_todos",
    "ask_clarification",
    "present_files",
    "task",
    TOOL_NAME,
];

/// `[agent.middleware.deferred_tools]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct DeferredToolsConfig {
    /// Whether the middleware (and `tool_search`) is in the chain.
    pub(crate) enabled: bool,
    /// Above this many tools, the non-core ones are deferred.
    pub(crate) max_tools: usize,
    /// Tools always offered.
    pub(crate) core_tools: Vec<String>,
}

impl Default for DeferredToolsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_tools: 20,
            core_tools: DEFAULT_CORE_TOOLS.iter().map(|&n| n.to_owned()).collect(),
        }
    }
}

/// The tools a thread has found, for the catalogue they were found in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PromotedTools {
    /// The hash of the deferred catalogue (its sorted names).
    pub(crate) catalog_hash: String,
    /// Found tools, oldest first.
    pub(crate) names: Vec<String>,
}

impl Extension for PromotedTools {
    const KEY: &'static str = "deferred_tools";
}

/// The deferred tools of one run, as seen in its last `before_model`.
#[derive(Debug)]
struct Catalogue {
    hash: String,
    deferred: Vec<Arc<ToolSpec>>,
}

/// A run's catalogue (in [`RunContext::state`](super::RunContext::state)); `None` before its
/// first `before_model`.
#[derive(Debug, Clone, Default)]
struct RunCatalogue(Option<Arc<Catalogue>>);

/// Hides non-core tools behind `tool_search` when there are many.
#[derive(Debug)]
pub(crate) struct DeferredToolsMiddleware {
    max_tools: usize,
    core: HashSet<String>,
}

#[derive(Deserialize)]
struct Arguments {
    query: String,
}

impl DeferredToolsMiddleware {
    /// The middleware, or `None` when it is disabled.
    pub(crate) fn from_config(cfg: &DeferredToolsConfig) -> Option<Self> {
        cfg.enabled.then(|| Self {
            max_tools: cfg.max_tools,
            core: cfg
                .core_tools
                .iter()
                .cloned()
                .chain([TOOL_NAME.to_owned()])
                .collect(),
        })
    }

    /// The run's catalogue, once its first `before_model` made one.
    fn catalogue(cx: &RunContext<'_>) -> Option<Arc<Catalogue>> {
        cx.state.get::<RunCatalogue>().and_then(|run| run.0.clone())
    }

    /// Answers a `tool_search` call and promotes what it found.
    fn search(&self, cx: &mut RunContext<'_>, call: &ToolCall) -> ToolOutput {
        let Arguments { query } = match intercepted_arguments(call) {
            Ok(arguments) => arguments,
            Err(refusal) => return refusal,
        };
        let query: String = query.trim().chars().take(MAX_QUERY_CHARS).collect();
        if query.is_empty() {
            return ToolOutput::error(format!("Error: `{TOOL_NAME}` needs a non-empty `query`."));
        }
        let Some(catalogue) = Self::catalogue(cx) else {
            return ToolOutput::error(format!(
                "Error: `{TOOL_NAME}` is not available right now; try again in your next step."
            ));
        };
        if catalogue.deferred.is_empty() {
            return ToolOutput::ok("Every tool is already available; there is nothing to search.");
        }
        let found = rank(&catalogue.deferred, &query);
        if found.is_empty() {
            let names: Vec<&str> = catalogue
                .deferred
                .iter()
                .take(MAX_LISTED)
                .map(|s| s.name.as_str())
                .collect();
            let more = catalogue.deferred.len().saturating_sub(names.len());
            let mut text = format!(
                "No tool matches `{query}`. Deferred tools: {}",
                names.join(", ")
            );
            if more > 0 {
                text.push_str(&format!(" (and {more} more)"));
            }
            text.push_str(". Search again with other words, or `select:<name>`.");
            return ToolOutput::ok(text);
        }
        self.promote(cx, &catalogue.hash, found.iter().map(|s| s.name.clone()));
        let tools: Vec<serde_json::Value> = found
            .iter()
            .map(|spec| {
                json!({
                    "name": spec.name,
                    "description": spec.description.chars().take(MAX_DESCRIPTION_CHARS).collect::<String>(),
                    "parameters": spec.parameters,
                })
            })
            .collect();
        ToolOutput::ok(
            json!({
                "tools": tools,
                "note": "These tools can be called from your next step on.",
            })
            .to_string(),
        )
    }

    fn promote(&self, cx: &mut RunContext<'_>, hash: &str, names: impl Iterator<Item = String>) {
        let mut promoted = cx
            .thread
            .extensions
            .get::<PromotedTools>()
            .filter(|p| p.catalog_hash == hash)
            .unwrap_or_else(|| PromotedTools {
                catalog_hash: hash.to_owned(),
                names: Vec::new(),
            });
        for name in names {
            promoted.names.retain(|n| *n != name);
            promoted.names.push(name);
        }
        let excess = promoted.names.len().saturating_sub(MAX_PROMOTED);
        promoted.names.drain(..excess);
        cx.thread.extensions.set(&promoted);
    }

    /// The names promoted in this thread for the catalogue `hash`.
    fn promoted(cx: &RunContext<'_>, hash: &str) -> HashSet<String> {
        cx.thread
            .extensions
            .get::<PromotedTools>()
            .filter(|p| p.catalog_hash == hash)
            .map(|p| p.names.into_iter().collect())
            .unwrap_or_default()
    }
}

/// The search tool as the model sees it; the middleware answers its calls.
fn tool_search() -> InterceptedTool {
    InterceptedTool::new(
        ToolSpec {
            name: TOOL_NAME.to_owned(),
            description: "Find more tools. Only some tools are loaded; others (for example \
                those of connected MCP servers) are found by searching: describe what you \
                need in a few words (\"add numbers\", \"create a github issue\"), or give \
                exact names with `select:name1,name2`. Returns up to 5 tools with their \
                parameters; they can be called from your next step on."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "Words describing the tool you need, or select:<name>[,<name>]."}
                },
                "required": ["query"],
                "additionalProperties": false
            }),
        },
        "tool search is not available right now",
    )
}

/// Words that say nothing about a tool.
const STOP_WORDS: [&str; 24] = [
    "a", "an", "the", "to", "of", "for", "and", "or", "in", "on", "with", "by", "is", "it", "me",
    "my", "i", "tool", "tools", "that", "this", "from", "some", "please",
];

/// The lowercase words of `text` (letters and digits), stop words left out.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .collect()
}

/// A word without a plural or verb ending, so `numbers` meets `number`, `adds` meets `add`.
fn stem(word: &str) -> &str {
    for suffix in ["ing", "es", "ed", "s"] {
        if word.len() > suffix.len() + 2 {
            if let Some(stem) = word.strip_suffix(suffix) {
                return stem;
            }
        }
    }
    word
}

fn same_word(a: &str, b: &str) -> bool {
    a == b || stem(a) == stem(b)
}

/// How well `spec` fits the query: 0 for not at all.
fn score(spec: &ToolSpec, query: &str, query_words: &[String]) -> u32 {
    let name = spec.name.to_lowercase();
    let query = query.to_lowercase();
    if name == query {
        return 1000;
    }
    let name_words = words(&spec.name);
    let description_words = words(&spec.description);
    let mut score = 0;
    if query.len() >= 3 && name.contains(&query) {
        score += 20;
    }
    for word in query_words {
        if name_words.iter().any(|n| same_word(n, word)) {
            score += 10;
        } else if word.len() >= 3 && name.contains(word.as_str()) {
            score += 5;
        }
        if description_words.iter().any(|d| same_word(d, word)) {
            score += 3;
        }
    }
    score
}

/// The best matches for `query` among `deferred`, best first (ties by name): the exact names
/// of a `select:` query, else the [`MAX_RESULTS`] best-scoring tools.
fn rank(deferred: &[Arc<ToolSpec>], query: &str) -> Vec<Arc<ToolSpec>> {
    if let Some(names) = query.strip_prefix("select:") {
        let wanted: Vec<&str> = names.split(',').map(str::trim).collect();
        return deferred
            .iter()
            .filter(|s| wanted.contains(&s.name.as_str()))
            .take(MAX_RESULTS)
            .cloned()
            .collect();
    }
    let mut query_words = words(query);
    query_words.dedup();
    let mut scored: Vec<(u32, &Arc<ToolSpec>)> = deferred
        .iter()
        .map(|spec| (score(spec, query, &query_words), spec))
        .filter(|(score, _)| *score > 0)
        .collect();
    scored.sort_by(|(a, x), (b, y)| b.cmp(a).then_with(|| x.name.cmp(&y.name)));
    scored
        .into_iter()
        .take(MAX_RESULTS)
        .map(|(_, spec)| Arc::clone(spec))
        .collect()
}

/// A stable hash of the deferred tools' names (FNV-1a, hex): the same catalogue gives the same
/// hash across restarts and builds.
fn catalogue_hash(deferred: &[Arc<ToolSpec>]) -> String {
    let mut names: Vec<&str> = deferred.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for name in names {
        for byte in name.bytes().chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

#[async_trait::async_trait]
impl Middleware for DeferredToolsMiddleware {
    fn name(&self) -> &'static str {
        "deferred_tools"
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        vec![Arc::new(tool_search())]
    }

    async fn before_model(
        &self,
        cx: &mut RunContext<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), MiddlewareError> {
        if request.tools.is_empty() {
            return Ok(());
        }
        let others = request.tools.iter().filter(|t| t.name != TOOL_NAME).count();
        let deferred: Vec<Arc<ToolSpec>> = if others > self.max_tools {
            request
                .tools
                .iter()
                .filter(|t| !self.core.contains(&t.name))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        let hash = catalogue_hash(&deferred);
        if deferred.is_empty() {
            request.tools.retain(|t| t.name != TOOL_NAME);
        } else {
            let promoted = Self::promoted(cx, &hash);
            request
                .tools
                .retain(|t| self.core.contains(&t.name) || promoted.contains(&t.name));
        }
        *cx.state.get_or_default() = RunCatalogue(Some(Arc::new(Catalogue { hash, deferred })));
        Ok(())
    }

    async fn before_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        refused: Option<&ToolOutput>,
    ) -> Result<ToolDecision, MiddlewareError> {
        if refused.is_some() {
            return Ok(ToolDecision::Run);
        }
        if call.name == TOOL_NAME {
            return Ok(ToolDecision::Skip(self.search(cx, call)));
        }
        let Some(catalogue) = Self::catalogue(cx) else {
            return Ok(ToolDecision::Run);
        };
        if !catalogue.deferred.iter().any(|s| s.name == call.name)
            || Self::promoted(cx, &catalogue.hash).contains(&call.name)
        {
            return Ok(ToolDecision::Run);
        }
        Ok(ToolDecision::Skip(ToolOutput::error(format!(
            "Error: `{}` is not loaded yet. Call `{TOOL_NAME}` first (with what you need, or \
             `select:{}`); the tools it finds can be called from the next step on.",
            call.name, call.name
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::middleware::test_context;
    use crate::agent::thread::ThreadState;

    fn spec(name: &str, description: &str) -> Arc<ToolSpec> {
        Arc::new(ToolSpec {
            name: name.to_owned(),
            description: description.to_owned(),
            parameters: json!({"type": "object", "properties": {"x": {"type": "string"}}}),
        })
    }

    /// The core tools `ls` and `read_file`, `tool_search`, and three MCP tools.
    fn request() -> ModelRequest {
        ModelRequest {
            messages: Vec::new(),
            tools: vec![
                spec("ls", "List a folder"),
                spec("read_file", "Read a file"),
                spec(TOOL_NAME, "search"),
                spec("mcp__calc__add", "Add two numbers and return the sum"),
                spec("mcp__calc__multiply", "Multiply two numbers"),
                spec(
                    "mcp__gh__create_issue",
                    "Create an issue in a GitHub repository",
                ),
            ],
        }
    }

    fn middleware(max_tools: usize) -> DeferredToolsMiddleware {
        DeferredToolsMiddleware::from_config(&DeferredToolsConfig {
            max_tools,
            ..DeferredToolsConfig::default()
        })
        .unwrap()
    }

    fn names(request: &ModelRequest) -> Vec<&str> {
        request.tools.iter().map(|t| t.name.as_str()).collect()
    }

    fn call(name: &str, arguments: serde_json::Value) -> ToolCall {
        ToolCall {
            id: "c1".to_owned(),
            name: name.to_owned(),
            arguments: arguments.to_string(),
        }
    }

    fn thread() -> ThreadState {
        ThreadState::new("t".into(), "c".into(), 0, 0)
    }

    async fn decide(
        m: &DeferredToolsMiddleware,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
    ) -> ToolDecision {
        m.before_tool(cx, call, None).await.unwrap()
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let cfg = DeferredToolsConfig::default();
        assert!(cfg.enabled);
        assert_eq!(cfg.max_tools, 20);
        assert!(cfg.core_tools.iter().any(|t| t == "web_fetch"));
        assert_eq!(cfg.core_tools.len(), 12);
    }

    #[tokio::test]
    async fn few_tools_are_all_offered_without_tool_search() {
        let m = middleware(20);
        let mut thread = thread();
        let mut cx = test_context(&mut thread);
        let mut request = request();
        m.before_model(&mut cx, &mut request).await.unwrap();
        assert_eq!(
            names(&request),
            [
                "ls",
                "read_file",
                "mcp__calc__add",
                "mcp__calc__multiply",
                "mcp__gh__create_issue"
            ]
        );
        // Nothing is deferred: any call runs, and a search says so.
        assert_eq!(
            decide(&m, &mut cx, &call("mcp__calc__add", json!({}))).await,
            ToolDecision::Run
        );
        let ToolDecision::Skip(out) =
            decide(&m, &mut cx, &call(TOOL_NAME, json!({"query": "add"}))).await
        else {
            panic!("tool_search is answered by the middleware");
        };
        assert!(out.content.contains("already available"), "{}", out.content);
    }

    #[tokio::test]
    async fn many_tools_are_deferred_found_by_search_and_then_offered() {
        let m = middleware(3);
        let mut thread = thread();
        let mut cx = test_context(&mut thread);
        let mut request = request();
        m.before_model(&mut cx, &mut request).await.unwrap();
        assert_eq!(names(&request), ["ls", "read_file", TOOL_NAME]);

        // A deferred tool that was not found is not run.
        let ToolDecision::Skip(out) = decide(&m, &mut cx, &call("mcp__calc__add", json!({}))).await
        else {
            panic!("expected a refusal");
        };
        assert!(
            out.is_error && out.content.contains("tool_search"),
            "{}",
            out.content
        );

        let ToolDecision::Skip(out) = decide(
            &m,
            &mut cx,
            &call(TOOL_NAME, json!({"query": "add numbers"})),
        )
        .await
        else {
            panic!("expected the search result");
        };
        assert!(!out.is_error, "{}", out.content);
        let found: serde_json::Value = serde_json::from_str(&out.content).unwrap();
        let tools = found["tools"].as_array().unwrap();
        assert_eq!(tools[0]["name"], "mcp__calc__add", "best first: {found}");
        assert_eq!(tools[0]["parameters"]["properties"]["x"]["type"], "string");
        assert_eq!(tools[1]["name"], "mcp__calc__multiply", "{found}");
        assert!(
            !tools.iter().any(|t| t["name"] == "mcp__gh__create_issue"),
            "{found}"
        );

        // The next request offers what was found, and calls to it run.
        let mut next = self::request();
        m.before_model(&mut cx, &mut next).await.unwrap();
        assert_eq!(
            names(&next),
            [
                "ls",
                "read_file",
                TOOL_NAME,
                "mcp__calc__add",
                "mcp__calc__multiply"
            ]
        );
        assert_eq!(
            decide(&m, &mut cx, &call("mcp__calc__add", json!({}))).await,
            ToolDecision::Run
        );
        assert_eq!(
            decide(&m, &mut cx, &call("ls", json!({}))).await,
            ToolDecision::Run
        );
        m.after_run(&mut cx).await.unwrap();
        drop(cx);

        // Promotions stay with the thread for its next run.
        let promoted = thread.extensions.get::<PromotedTools>().unwrap();
        assert_eq!(promoted.names, ["mcp__calc__add", "mcp__calc__multiply"]);
        let mut cx = test_context(&mut thread);
        let mut again = self::request();
        m.before_model(&mut cx, &mut again).await.unwrap();
        assert!(names(&again).contains(&"mcp__calc__add"));
    }

    #[tokio::test]
    async fn a_changed_catalogue_forgets_promotions() {
        let m = middleware(3);
        let mut thread = thread();
        thread.extensions.set(&PromotedTools {
            catalog_hash: "0000000000000000".to_owned(),
            names: vec!["mcp__calc__add".to_owned()],
        });
        let mut cx = test_context(&mut thread);
        let mut request = request();
        m.before_model(&mut cx, &mut request).await.unwrap();
        assert_eq!(names(&request), ["ls", "read_file", TOOL_NAME]);
        assert!(matches!(
            decide(&m, &mut cx, &call("mcp__calc__add", json!({}))).await,
            ToolDecision::Skip(_)
        ));
    }

    #[tokio::test]
    async fn select_queries_misses_and_bad_arguments() {
        let m = middleware(3);
        let mut thread = thread();
        let mut cx = test_context(&mut thread);
        m.before_model(&mut cx, &mut request()).await.unwrap();

        let ToolDecision::Skip(out) = decide(
            &m,
            &mut cx,
            &call(
                TOOL_NAME,
                json!({"query": "select:mcp__gh__create_issue, nope"}),
            ),
        )
        .await
        else {
            panic!()
        };
        let found: serde_json::Value = serde_json::from_str(&out.content).unwrap();
        assert_eq!(found["tools"].as_array().unwrap().len(), 1, "{found}");
        assert_eq!(found["tools"][0]["name"], "mcp__gh__create_issue");

        let ToolDecision::Skip(out) = decide(
            &m,
            &mut cx,
            &call(TOOL_NAME, json!({"query": "weather forecast"})),
        )
        .await
        else {
            panic!()
        };
        assert!(!out.is_error);
        assert!(
            out.content.starts_with("No tool matches"),
            "{}",
            out.content
        );
        assert!(out.content.contains("mcp__calc__add"), "{}", out.content);

        for bad in [json!({"query": "  "}), json!({"q": "x"})] {
            let ToolDecision::Skip(out) = decide(&m, &mut cx, &call(TOOL_NAME, bad)).await else {
                panic!()
            };
            assert!(out.is_error, "{}", out.content);
        }
    }

    #[tokio::test]
    async fn an_earlier_refusal_stands() {
        let m = middleware(3);
        let mut thread = thread();
        let mut cx = test_context(&mut thread);
        m.before_model(&mut cx, &mut request()).await.unwrap();
        let refusal = ToolOutput::error("no");
        let decision = m
            .before_tool(
                &mut cx,
                &call(TOOL_NAME, json!({"query": "add"})),
                Some(&refusal),
            )
            .await
            .unwrap();
        assert_eq!(decision, ToolDecision::Run);
        assert!(thread.extensions.get::<PromotedTools>().is_none());
    }

    #[tokio::test]
    async fn each_run_keeps_its_own_catalogue_on_a_shared_thread() {
        // A lead and its subagent tasks run under one thread id with the same middleware.
        let m = middleware(3);
        let mut a_thread = thread();
        let mut b_thread = thread();
        let mut a = test_context(&mut a_thread);
        let mut b = test_context(&mut b_thread);
        m.before_model(&mut a, &mut request()).await.unwrap();
        m.before_model(&mut b, &mut request()).await.unwrap();
        // Run a ends (a subagent finished) while run b goes on.
        m.after_run(&mut a).await.unwrap();
        let ToolDecision::Skip(out) = decide(&m, &mut b, &call("mcp__calc__add", json!({}))).await
        else {
            panic!("a deferred tool that was not found stays blocked");
        };
        assert!(out.is_error, "{}", out.content);
        // A run whose request offers only the core tools defers nothing; the other run's
        // catalogue is unchanged by it.
        let mut small = request();
        small.tools.truncate(3);
        let mut c_thread = thread();
        let mut c = test_context(&mut c_thread);
        m.before_model(&mut c, &mut small).await.unwrap();
        assert!(matches!(
            decide(&m, &mut b, &call("mcp__gh__create_issue", json!({}))).await,
            ToolDecision::Skip(_)
        ));
    }

    #[test]
    fn promotions_are_bounded_oldest_first() {
        let m = middleware(3);
        let mut thread = thread();
        let mut cx = test_context(&mut thread);
        m.promote(
            &mut cx,
            "h",
            (0..MAX_PROMOTED + 3).map(|i| format!("tool_{i}")),
        );
        m.promote(&mut cx, "h", ["tool_5".to_owned()].into_iter());
        let promoted = thread.extensions.get::<PromotedTools>().unwrap();
        assert_eq!(promoted.names.len(), MAX_PROMOTED);
        assert_eq!(promoted.names[0], "tool_3");
        assert_eq!(promoted.names.last().unwrap(), "tool_5");
    }

    #[test]
    fn scoring_prefers_names_then_descriptions() {
        let deferred = vec![
            spec("mcp__a__echo", "Echo the text back"),
            spec("mcp__a__sum", "Adds numbers"),
            spec("mcp__b__add_row", "Append a row to a sheet"),
        ];
        let ranked: Vec<String> = rank(&deferred, "add numbers")
            .iter()
            .map(|s| s.name.clone())
            .collect();
        assert_eq!(ranked, ["mcp__b__add_row", "mcp__a__sum"]);
        assert_eq!(rank(&deferred, "mcp__a__echo")[0].name, "mcp__a__echo");
        assert!(rank(&deferred, "the a of").is_empty());
        assert_eq!(catalogue_hash(&deferred), catalogue_hash(&deferred[..]));
        assert_ne!(catalogue_hash(&deferred), catalogue_hash(&deferred[..2]));
    }
}
