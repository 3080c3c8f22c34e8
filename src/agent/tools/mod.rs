//! Tools the model can call: the [`Tool`] trait, the [`ToolContext`] every call gets, and
//! the [`ToolRegistry`] that runs them.
//!
//! Tool failures are data for the model, never errors of the run: an unknown tool, arguments
//! that are not valid JSON or do not fit the tool's parameters, a tool that fails, runs out
//! of time or is cancelled, all come back as an error [`ToolOutput`] and the run goes on.

pub(crate) mod bash;
mod current_time;
pub(crate) mod egress;
pub(crate) mod files;
pub(crate) mod mcp;
pub(crate) mod paths;
pub(crate) mod present_files;
pub(crate) mod probed_bash;
pub(crate) mod web_fetch;

pub(crate) use current_time::CurrentTime;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::input::{Author, ThreadFolders};
use super::message::{TokenUsage, ToolCall};
use super::model::ToolSpec;
use super::skills::SkillMounts;

/// The result of a tool call, as the model will see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolOutput {
    /// The text the model sees.
    pub(crate) content: String,
    /// Whether this reports a failure.
    pub(crate) is_error: bool,
    /// Tokens the call used on the model (a subagent's), added to the run's usage.
    pub(crate) usage: Option<TokenUsage>,
}

impl ToolOutput {
    /// A successful result.
    pub(crate) fn ok(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
            usage: None,
        }
    }

    /// A failure the model is told about; the run goes on.
    pub(crate) fn error(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
            usage: None,
        }
    }
}

/// How long a tool call may take unless configured otherwise.
pub(crate) const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a tool call failed; the message is shown to the model.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ToolError {
    /// The arguments do not fit the tool's parameters.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The tool ran and failed.
    #[error("{0}")]
    Failed(String),
}

/// Receives progress notes of a running tool ("cloned the repository").
pub(crate) type ProgressSink = Arc<dyn Fn(&str) + Send + Sync>;

/// What a tool call knows about where it runs.
#[derive(Clone)]
pub(crate) struct ToolContext {
    /// The thread the call belongs to.
    pub(crate) thread_id: String,
    /// The call's id (as the model named it).
    pub(crate) call_id: String,
    /// Who the run is for, with their role.
    pub(crate) author: Author,
    /// The thread's folders (uploads, workspace, outputs).
    pub(crate) folders: ThreadFolders,
    /// When the call must be done; the registry stops it then.
    pub(crate) deadline: Instant,
    /// Cancelled when the run is stopped; long tools should check it between steps.
    pub(crate) cancel: CancellationToken,
    /// Where to report progress: each note replaces the call's line in a live reply.
    pub(crate) progress: ProgressSink,
    /// The inbox item of the turn the call belongs to (0 outside a turn): with `call_id`, it
    /// names the call across re-runs of the turn.
    pub(crate) turn: u64,
    /// The turn's trace id, for the logs of work the call starts.
    pub(crate) trace_id: String,
    /// The skills on for the run, read-only at `/mnt/skills/<name>/`.
    pub(crate) skills: SkillMounts,
}

impl std::fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolContext")
            .field("thread_id", &self.thread_id)
            .field("call_id", &self.call_id)
            .field("turn", &self.turn)
            .field("trace_id", &self.trace_id)
            .field("author", &self.author)
            .field("folders", &self.folders)
            .finish_non_exhaustive()
    }
}

/// One tool.
#[async_trait::async_trait]
pub(crate) trait Tool: Send + Sync {
    /// Its name, description and parameter schema.
    fn spec(&self) -> ToolSpec;

    /// Runs it with the model's arguments (a JSON value, already parsed).
    async fn call(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<String, ToolError>;

    /// The spec to offer `author` when it differs from [`Tool::spec`] (a tool whose choices
    /// depend on the author's rights); `None`: the usual one.
    fn spec_for(&self, _author: &Author) -> Option<Arc<ToolSpec>> {
        None
    }

    /// Whether the tool is offered now (a tool that waits for a check at start is not, until
    /// the check found it works).
    fn offered(&self) -> bool {
        true
    }

    /// Waits until whether the tool is offered to `author` is decided ([`Tool::offered`]).
    async fn settle(&self, _author: &Author) {}

    /// Whether the thread is saved before a call of this tool runs (calls that start long
    /// work the registry remembers, so a re-run finds it instead of starting it again).
    fn checkpoint_first(&self) -> bool {
        false
    }

    /// A shorter time limit for the call with these (raw) arguments than the tool's own (a
    /// `task` call of a quick subagent type); `None`: the tool's.
    fn call_limit(&self, _arguments: &str) -> Option<Duration> {
        None
    }

    /// [`Tool::call`] with everything the result carries: a tool whose result is more than
    /// text (a subagent's token usage, a failure reported in its own words) overrides this.
    async fn call_reporting(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        self.call(arguments, cx).await.map(ToolOutput::ok)
    }
}

/// Parses a tool's arguments into its typed argument struct.
pub(crate) fn parse_arguments<T>(arguments: serde_json::Value) -> Result<T, ToolError>
where
    T: serde::de::DeserializeOwned,
{
    serde_json::from_value(arguments).map_err(|e| ToolError::InvalidArguments(e.to_string()))
}

/// A tool that a middleware answers in `before_tool`, because answering needs the thread or
/// the run (`ask_clarification`, `write_todos`); run without that middleware, it says it is
/// unavailable.
pub(crate) struct InterceptedTool {
    spec: ToolSpec,
    unavailable: &'static str,
}

impl InterceptedTool {
    /// The tool `spec`; `unavailable` is what the model is told if it ever runs.
    pub(crate) fn new(spec: ToolSpec, unavailable: &'static str) -> Self {
        Self { spec, unavailable }
    }
}

#[async_trait::async_trait]
impl Tool for InterceptedTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    async fn call(&self, _: serde_json::Value, _: &ToolContext) -> Result<String, ToolError> {
        Err(ToolError::Failed(self.unavailable.to_owned()))
    }
}

/// The arguments of an intercepted call, or the error result that tells the model what is
/// wrong with them (empty arguments are an empty object).
pub(crate) fn intercepted_arguments<T>(call: &ToolCall) -> Result<T, ToolOutput>
where
    T: serde::de::DeserializeOwned,
{
    let raw = if call.arguments.trim().is_empty() {
        "{}"
    } else {
        &call.arguments
    };
    serde_json::from_str(raw).map_err(|e| {
        ToolOutput::error(format!(
            "Error: the arguments of `{}` are not valid: {e}.",
            call.name
        ))
    })
}

/// The tools offered to the model, by name, and how long each may run. Cloning shares it.
#[derive(Clone)]
pub(crate) struct ToolRegistry {
    tools: Arc<BTreeMap<String, Arc<dyn Tool>>>,
    /// The tools' specs, sorted by name, made once.
    specs: Arc<[Arc<ToolSpec>]>,
    default_timeout: Duration,
    timeouts: Arc<HashMap<String, Duration>>,
}

impl Default for ToolRegistry {
    fn default() -> Self {
        Self {
            tools: Arc::default(),
            specs: Arc::new([]),
            default_timeout: DEFAULT_TOOL_TIMEOUT,
            timeouts: Arc::default(),
        }
    }
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// The built-in tools.
    pub(crate) fn builtin() -> Self {
        let mut registry = Self::default();
        registry.register(Arc::new(CurrentTime));
        for tool in files::file_tools() {
            registry.register(tool);
        }
        registry
    }

    /// Adds (or replaces) a tool.
    pub(crate) fn register(&mut self, tool: Arc<dyn Tool>) {
        Arc::make_mut(&mut self.tools).insert(tool.spec().name, tool);
        self.specs = self.tools.values().map(|t| Arc::new(t.spec())).collect();
    }

    /// Sets the time limit of every tool, and of some by name.
    pub(crate) fn with_timeouts(
        mut self,
        default: Duration,
        by_name: HashMap<String, Duration>,
    ) -> Self {
        self.default_timeout = default;
        self.timeouts = Arc::new(by_name);
        self
    }

    /// The time limit of `call`: its tool's, or less when the tool says so for its arguments.
    pub(crate) fn call_timeout(&self, call: &ToolCall) -> Duration {
        let limit = self.timeout(&call.name);
        self.tools
            .get(&call.name)
            .and_then(|tool| tool.call_limit(&call.arguments))
            .map_or(limit, |own| own.min(limit))
    }

    /// The time limit of the tool called `name`.
    pub(crate) fn timeout(&self, name: &str) -> Duration {
        self.timeouts
            .get(name)
            .copied()
            .unwrap_or(self.default_timeout)
    }

    /// Keeps only the tools `keep` accepts (by name).
    pub(crate) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        Arc::make_mut(&mut self.tools).retain(|name, _| keep(name));
        self.specs = self.tools.values().map(|t| Arc::new(t.spec())).collect();
    }

    /// Whether the thread is saved before a call of the tool `name` runs.
    pub(crate) fn checkpoint_first(&self, name: &str) -> bool {
        self.tools
            .get(name)
            .is_some_and(|tool| tool.checkpoint_first())
    }

    /// Whether a tool of that name is registered.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// The specs to offer the model, sorted by name.
    #[cfg(test)]
    pub(crate) fn specs(&self) -> Vec<Arc<ToolSpec>> {
        self.specs.to_vec()
    }

    /// The specs to offer the model in a run for `author`, sorted by name: those of the tools
    /// offered now.
    pub(crate) fn specs_for(&self, author: &Author) -> Vec<Arc<ToolSpec>> {
        self.specs
            .iter()
            .filter_map(|spec| match self.tools.get(&spec.name) {
                Some(tool) if !tool.offered() => None,
                Some(tool) => Some(tool.spec_for(author).unwrap_or_else(|| Arc::clone(spec))),
                None => Some(Arc::clone(spec)),
            })
            .collect()
    }

    /// Waits until every tool knows whether it is offered to `author` (the shell, while the
    /// sandbox's probe runs at start).
    pub(crate) async fn settle(&self, author: &Author) {
        for tool in self.tools.values() {
            tool.settle(author).await;
        }
    }

    /// Runs one call until it ends, `cx.deadline` passes or `cx.cancel` fires; every
    /// failure becomes an error output.
    pub(crate) async fn call(&self, call: &ToolCall, cx: &ToolContext) -> ToolOutput {
        let Some(tool) = self.tools.get(&call.name) else {
            let known: Vec<&str> = self.tools.keys().map(String::as_str).collect();
            return ToolOutput::error(format!(
                "Error: there is no tool named `{}`. Available tools: {}.",
                call.name,
                known.join(", ")
            ));
        };
        let raw = if call.arguments.trim().is_empty() {
            "{}"
        } else {
            call.arguments.as_str()
        };
        let arguments = match serde_json::from_str::<serde_json::Value>(raw) {
            Ok(value @ serde_json::Value::Object(_)) => value,
            Ok(_) => {
                return ToolOutput::error(format!(
                    "Error: the arguments of `{}` must be a JSON object.",
                    call.name
                ));
            }
            Err(e) => {
                return ToolOutput::error(format!(
                    "Error: the arguments of `{}` are not valid JSON: {e}.",
                    call.name
                ));
            }
        };
        let started = Instant::now();
        tokio::select! {
            biased;
            () = cx.cancel.cancelled() => ToolOutput::error(format!(
                "Error: `{}` was cancelled before it finished.",
                call.name
            )),
            result = tokio::time::timeout_at(cx.deadline, tool.call_reporting(arguments, cx)) => match result {
                Ok(Ok(output)) => output,
                Ok(Err(e)) => ToolOutput::error(format!("Error: `{}` failed: {e}", call.name)),
                Err(_) => {
                    metrics::counter!("antler_tool_timeouts_total").increment(1);
                    ToolOutput::error(format!(
                        "Error: `{}` did not finish within {} seconds and was stopped.",
                        call.name,
                        cx.deadline.saturating_duration_since(started).as_secs().max(1)
                    ))
                }
            },
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::agent::input::Role;

    /// A context for thread `t1` under `/tmp/antler-test`, a deadline far away.
    pub(crate) fn context() -> ToolContext {
        ToolContext {
            thread_id: "t1".to_owned(),
            call_id: "call_1".to_owned(),
            author: Author {
                channel: "test".to_owned(),
                user_id: "u1".to_owned(),
                name: None,
                role: Role::User,
            },
            folders: ThreadFolders::new(std::path::Path::new("/tmp/antler-test"), "t1").unwrap(),
            deadline: Instant::now() + Duration::from_secs(3600),
            cancel: CancellationToken::new(),
            progress: Arc::new(|_: &str| {}),
            turn: 1,
            trace_id: "trace-test".to_owned(),
            skills: SkillMounts::default(),
        }
    }

    /// Sleeps for `seconds` (an argument), reporting progress first.
    pub(crate) struct Sleeper;

    #[async_trait::async_trait]
    impl Tool for Sleeper {
        fn spec(&self) -> ToolSpec {
            ToolSpec {
                name: "sleep".into(),
                description: "sleeps".into(),
                parameters: serde_json::json!({"type": "object"}),
            }
        }

        async fn call(
            &self,
            arguments: serde_json::Value,
            cx: &ToolContext,
        ) -> Result<String, ToolError> {
            (cx.progress)("sleeping");
            let seconds = arguments["seconds"].as_u64().unwrap_or(1);
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            Ok(format!(
                "slept {seconds}s for {} in {}",
                cx.thread_id,
                cx.folders.workspace().display()
            ))
        }
    }

    fn sleeper(timeout: Duration) -> ToolRegistry {
        let mut registry = ToolRegistry::default();
        registry.register(Arc::new(Sleeper));
        registry.with_timeouts(
            Duration::from_secs(1000),
            HashMap::from([("sleep".to_owned(), timeout)]),
        )
    }

    fn deadline_for(registry: &ToolRegistry, name: &str) -> ToolContext {
        ToolContext {
            deadline: Instant::now() + registry.timeout(name),
            ..context()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_tool_sees_its_thread_folder_and_runs_out_of_time_cleanly() {
        let registry = sleeper(Duration::from_secs(5));
        let notes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&notes);
        let cx = ToolContext {
            progress: Arc::new(move |note: &str| seen.lock().unwrap().push(note.to_owned())),
            ..deadline_for(&registry, "sleep")
        };
        let out = registry.call(&call("sleep", r#"{"seconds":2}"#), &cx).await;
        assert!(!out.is_error, "{}", out.content);
        assert!(
            out.content.ends_with("threads/t1/workspace"),
            "{}",
            out.content
        );
        assert_eq!(*notes.lock().unwrap(), ["sleeping"]);

        let cx = deadline_for(&registry, "sleep");
        let started = Instant::now();
        let out = registry
            .call(&call("sleep", r#"{"seconds":60}"#), &cx)
            .await;
        assert!(out.is_error);
        assert!(
            out.content.contains("did not finish within 5 seconds"),
            "{}",
            out.content
        );
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(registry.timeout("other"), Duration::from_secs(1000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_call_becomes_an_error_result() {
        let registry = sleeper(Duration::from_secs(500));
        let cx = deadline_for(&registry, "sleep");
        let cancel = cx.cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            cancel.cancel();
        });
        let out = registry
            .call(&call("sleep", r#"{"seconds":60}"#), &cx)
            .await;
        assert!(
            out.is_error && out.content.contains("cancelled"),
            "{}",
            out.content
        );
    }

    impl ToolRegistry {
        async fn call_for_test(&self, call: &ToolCall) -> ToolOutput {
            self.call(call, &context()).await
        }
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: "call_1".to_owned(),
            name: name.to_owned(),
            arguments: arguments.to_owned(),
        }
    }

    #[tokio::test]
    async fn unknown_tool_is_an_error_result_naming_the_known_tools() {
        let out = ToolRegistry::builtin()
            .call_for_test(&call("rm_rf", "{}"))
            .await;
        assert!(out.is_error);
        assert!(
            out.content.contains("no tool named `rm_rf`"),
            "{}",
            out.content
        );
        assert!(out.content.contains("current_time"), "{}", out.content);
    }

    #[tokio::test]
    async fn invalid_json_and_non_object_arguments_are_error_results() {
        let registry = ToolRegistry::builtin();
        let out = registry
            .call_for_test(&call("current_time", "{not json"))
            .await;
        assert!(
            out.is_error && out.content.contains("not valid JSON"),
            "{}",
            out.content
        );
        let out = registry.call_for_test(&call("current_time", "[1]")).await;
        assert!(
            out.is_error && out.content.contains("JSON object"),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn arguments_that_do_not_fit_the_schema_are_error_results() {
        let out = ToolRegistry::builtin()
            .call_for_test(&call("current_time", r#"{"utc_offset_minutes":"soon"}"#))
            .await;
        assert!(
            out.is_error && out.content.contains("invalid arguments"),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn empty_arguments_mean_an_empty_object() {
        let out = ToolRegistry::builtin()
            .call_for_test(&call("current_time", ""))
            .await;
        assert!(!out.is_error, "{}", out.content);
    }
}
