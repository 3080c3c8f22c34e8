use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::agent::input::Role;
use crate::agent::message::{ChatMessage, TokenUsage};
use crate::agent::middleware::subagent_limit::{SubagentLimitConfig, SubagentLimitMiddleware};
use crate::agent::middleware::token_usage::TokenUsageMiddleware;
use crate::agent::middleware::{Middleware, MiddlewareChain};
use crate::agent::model::scripted::ScriptedModel;
use crate::agent::model::{
    ChatModel, DeltaSink, FinishReason, ModelError, ModelRequest, ModelResponse, ToolSpec,
};
use crate::agent::runtime::{CheckpointError, RunObserver, RuntimeSettings, Unobserved};
use crate::agent::subagents::config::SubagentsConfig;
use crate::agent::subagents::task_tool::{self, ShellPolicy, TaskTool};
use crate::agent::tools::{Tool, ToolContext, ToolError, ToolRegistry};

/// Answers "result of <the user message>" after `delay`, counting the calls in flight.
#[derive(Default)]
struct WorkerModel {
    delay: Duration,
    calls: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    requests: Mutex<Vec<ModelRequest>>,
}

impl WorkerModel {
    fn slow(delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            delay,
            ..Self::default()
        })
    }
}

struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl ChatModel for WorkerModel {
    fn name(&self) -> &str {
        "worker"
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        _deltas: Option<DeltaSink<'_>>,
    ) -> Result<ModelResponse, ModelError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.requests.lock().unwrap().push(request.clone());
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let _in_flight = InFlight(&self.in_flight);
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        let asked = request
            .messages
            .iter()
            .rev()
            .find(|m| matches!(m, ChatMessage::User { .. }))
            .map(|m| m.text().to_owned())
            .unwrap_or_default();
        Ok(ModelResponse {
            content: format!("result of {asked}"),
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
}

/// Records in memory, as the store keeps them.
#[derive(Debug, Default)]
struct MemoryRegistry {
    records: Mutex<BTreeMap<String, SubagentRecord>>,
}

impl MemoryRegistry {
    fn all(&self) -> Vec<SubagentRecord> {
        self.records.lock().unwrap().values().cloned().collect()
    }
}

#[async_trait::async_trait]
impl SubagentRegistry for MemoryRegistry {
    async fn create(&self, record: &SubagentRecord) -> Result<(), RegistryError> {
        self.records
            .lock()
            .unwrap()
            .insert(record.id.clone(), record.clone());
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<SubagentRecord>, RegistryError> {
        Ok(self.records.lock().unwrap().get(id).cloned())
    }

    async fn for_call(
        &self,
        thread_id: &str,
        turn: u64,
        call_id: &str,
    ) -> Result<Option<SubagentRecord>, RegistryError> {
        Ok(self
            .records
            .lock()
            .unwrap()
            .values()
            .find(|r| {
                r.parent_thread_id == thread_id
                    && r.parent_turn == turn
                    && r.parent_call_id == call_id
            })
            .cloned())
    }

    async fn transition(
        &self,
        id: &str,
        change: &SubagentChange,
    ) -> Result<Transition, RegistryError> {
        let mut records = self.records.lock().unwrap();
        let record = records
            .get_mut(id)
            .ok_or_else(|| RegistryError(format!("no task {id}")))?;
        Ok(if change.apply(record) {
            Transition::Applied(record.clone())
        } else {
            Transition::Refused(record.clone())
        })
    }
}

/// A tool that only has a name (the child's tool list is what is tested).
struct Named(&'static str);

#[async_trait::async_trait]
impl Tool for Named {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.0.into(),
            description: "stub".into(),
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    async fn call(&self, _: serde_json::Value, _: &ToolContext) -> Result<String, ToolError> {
        Ok("ran".into())
    }
}

fn settings() -> RuntimeSettings {
    RuntimeSettings {
        system_prompt: crate::live::Live::text("lead"),
        max_model_calls: 10,
        max_parallel_tools: 8,
        context_tokens: 0,
        data_root: std::env::temp_dir().join("antler-subagent-tests"),
        timezone: jiff::tz::TimeZone::UTC,
        token_budget: None,
    }
}

fn base_tools() -> ToolRegistry {
    let mut tools = ToolRegistry::default();
    for name in [
        "task",
        "ask_clarification",
        "present_files",
        "bash",
        "read_file",
    ] {
        tools.register(Arc::new(Named(name)));
    }
    tools
}

fn chain() -> MiddlewareChain {
    let token_usage: Arc<dyn Middleware> = Arc::new(TokenUsageMiddleware);
    MiddlewareChain::new(vec![token_usage]).unwrap()
}

/// The configured types, each run by `model` with `timeout`.
fn kinds(model: Arc<dyn ChatModel>, timeout: Duration) -> Vec<SubagentKind> {
    let config = SubagentsConfig {
        timeout_seconds: timeout.as_secs(),
        ..SubagentsConfig::default()
    };
    config
        .types()
        .into_iter()
        .map(|spec| SubagentKind::new(spec, Arc::clone(&model), base_tools(), chain(), settings()))
        .collect()
}

struct Setup {
    registry: Arc<MemoryRegistry>,
    executor: SubagentExecutor,
    shutdown: CancellationToken,
}

fn setup(model: Arc<dyn ChatModel>, timeout: Duration, max_concurrent: usize) -> Setup {
    let registry = Arc::new(MemoryRegistry::default());
    let shutdown = CancellationToken::new();
    let executor = SubagentExecutor::new(
        Arc::clone(&registry) as Arc<dyn SubagentRegistry>,
        kinds(model, timeout),
        max_concurrent,
        shutdown.clone(),
    );
    Setup {
        registry,
        executor,
        shutdown,
    }
}

fn request(call: &str, prompt: &str) -> TaskRequest {
    TaskRequest {
        description: format!("do {prompt}"),
        prompt: prompt.to_owned(),
        subagent_type: "general-purpose".to_owned(),
        parent: ParentCall {
            thread_id: "t1".to_owned(),
            turn: 1,
            call_id: call.to_owned(),
            author: Author {
                channel: "api".into(),
                user_id: "u1".into(),
                name: None,
                role: Role::User,
            },
            trace_id: "trace-1".to_owned(),
            deadline: Instant::now() + Duration::from_secs(3600),
            progress: Arc::new(|_: &str| {}),
        },
    }
}

#[tokio::test(start_paused = true)]
async fn at_most_max_concurrent_tasks_run_at_once_and_the_rest_wait_their_turn() {
    let model = WorkerModel::slow(Duration::from_secs(10));
    let Setup {
        executor, registry, ..
    } = setup(model.clone(), Duration::from_secs(900), 3);
    let runs: Vec<_> = (0..8)
        .map(|i| {
            let executor = executor.clone();
            tokio::spawn(async move {
                executor
                    .run(
                        request(&format!("call_{i}"), &format!("job {i}")),
                        &CancellationToken::new(),
                    )
                    .await
                    .unwrap()
            })
        })
        .collect();
    for (i, run) in runs.into_iter().enumerate() {
        let record = run.await.unwrap();
        assert_eq!(record.status, SubagentStatus::Completed);
        assert_eq!(
            record.result.as_deref(),
            Some(format!("result of job {i}").as_str())
        );
        assert_eq!(record.usage.total_tokens, 15);
    }
    assert_eq!(model.most_in_flight.load(Ordering::SeqCst), 3);
    assert_eq!(model.calls.load(Ordering::SeqCst), 8);
    assert_eq!(registry.all().len(), 8);
    assert_eq!(executor.active(), 0, "finished tasks are forgotten");
}

#[tokio::test(start_paused = true)]
async fn a_task_past_its_timeout_is_timed_out_and_its_model_call_is_cancelled() {
    let model = WorkerModel::slow(Duration::from_secs(600));
    let Setup { executor, .. } = setup(model.clone(), Duration::from_secs(5), 3);
    let started = Instant::now();
    let record = executor
        .run(request("call_1", "slow"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(record.status, SubagentStatus::TimedOut);
    assert_eq!(
        record.error.as_deref(),
        Some("it did not finish within 5 seconds")
    );
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(model.in_flight.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_task_never_runs_past_its_parents_deadline() {
    let model = WorkerModel::slow(Duration::from_secs(600));
    let Setup { executor, .. } = setup(model, Duration::from_secs(900), 3);
    let mut asked = request("call_1", "slow");
    asked.parent.deadline = Instant::now() + Duration::from_secs(60);
    let started = Instant::now();
    let record = executor
        .run(asked, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(record.status, SubagentStatus::TimedOut);
    assert_eq!(started.elapsed(), Duration::from_secs(60) - PARENT_MARGIN);
}

#[tokio::test(start_paused = true)]
async fn the_parents_cancellation_cancels_its_task_and_the_model_call() {
    let model = WorkerModel::slow(Duration::from_secs(600));
    let Setup {
        executor, registry, ..
    } = setup(model.clone(), Duration::from_secs(900), 3);
    let parent = CancellationToken::new();
    let stop = parent.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.cancel();
    });
    let record = executor
        .run(request("call_1", "slow"), &parent)
        .await
        .unwrap();
    assert_eq!(record.status, SubagentStatus::Cancelled);
    assert_eq!(registry.all()[0].status, SubagentStatus::Cancelled);
    assert_eq!(model.in_flight.load(Ordering::SeqCst), 0);
    assert_eq!(
        task_tool::answer(&record).content,
        "Task cancelled by user."
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_parent_call_still_ends_its_task_as_cancelled() {
    let model = WorkerModel::slow(Duration::from_secs(600));
    let Setup {
        executor, registry, ..
    } = setup(model.clone(), Duration::from_secs(900), 3);
    let running = executor.clone();
    let parent = tokio::spawn(async move {
        running
            .run(request("call_1", "slow"), &CancellationToken::new())
            .await
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    parent.abort();
    let _ = parent.await;
    executor.close(Duration::from_secs(10)).await;
    assert_eq!(registry.all()[0].status, SubagentStatus::Cancelled);
    assert_eq!(model.in_flight.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn an_operator_cancels_a_running_task_and_a_finished_one_stays_as_it_was() {
    let model = WorkerModel::slow(Duration::from_secs(600));
    let Setup {
        executor, registry, ..
    } = setup(model, Duration::from_secs(900), 3);
    let running = executor.clone();
    let task = tokio::spawn(async move {
        running
            .run(request("call_1", "slow"), &CancellationToken::new())
            .await
    });
    while registry
        .all()
        .first()
        .is_none_or(|r| r.status != SubagentStatus::Running)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let id = registry.all()[0].id.clone();
    let cancelled = executor.cancel(&id).await.unwrap();
    assert!(
        matches!(cancelled, CancelOutcome::Cancelled(ref r) if r.status == SubagentStatus::Cancelled),
        "{cancelled:?}"
    );
    let ended = task.await.unwrap().unwrap();
    assert_eq!(
        (ended.status, ended.error.as_deref()),
        (SubagentStatus::Cancelled, Some("cancelled by an operator"))
    );
    assert_eq!(
        task_tool::answer(&ended).content,
        "Task cancelled: cancelled by an operator."
    );
    assert!(matches!(
        executor.cancel(&id).await.unwrap(),
        CancelOutcome::AlreadyEnded(_)
    ));
    assert_eq!(
        executor.cancel("task_nope").await.unwrap(),
        CancelOutcome::Unknown
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_cut_short_by_shutdown_stays_running_for_the_next_start_to_fail() {
    let model = WorkerModel::slow(Duration::from_secs(600));
    let Setup {
        executor,
        registry,
        shutdown,
    } = setup(model, Duration::from_secs(900), 3);
    let parent = CancellationToken::new();
    let running = executor.clone();
    let cancel = parent.clone();
    let task = tokio::spawn(async move { running.run(request("call_1", "slow"), &cancel).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    shutdown.cancel();
    parent.cancel();
    let record = task.await.unwrap().unwrap();
    assert_eq!(record.status, SubagentStatus::Running);
    assert_eq!(registry.all()[0].status, SubagentStatus::Running);
}

#[tokio::test(start_paused = true)]
async fn a_rerun_of_the_turn_gets_the_recorded_end_instead_of_running_again() {
    let model = WorkerModel::slow(Duration::from_secs(1));
    let Setup {
        executor, registry, ..
    } = setup(model.clone(), Duration::from_secs(900), 3);
    let first = executor
        .run(request("call_1", "once"), &CancellationToken::new())
        .await
        .unwrap();
    let again = executor
        .run(request("call_1", "once"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(again, first);
    assert_eq!(model.calls.load(Ordering::SeqCst), 1);

    // A record a crash left RUNNING (not this process's): the re-run sees it failed.
    let left = SubagentRecord {
        id: "task_left".into(),
        parent_call_id: "call_2".into(),
        status: SubagentStatus::Running,
        result: None,
        ..first
    };
    registry.create(&left).await.unwrap();
    let record = executor
        .run(request("call_2", "again"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        (record.id.as_str(), record.status, record.error.as_deref()),
        ("task_left", SubagentStatus::Failed, Some(INTERRUPTED))
    );
    assert_eq!(model.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        task_tool::answer(&record).content,
        "Task failed. Error: interrupted by restart"
    );
}

#[tokio::test]
async fn a_subagent_never_gets_task_or_clarification() {
    let model = WorkerModel::slow(Duration::ZERO);
    let Setup { executor, .. } = setup(model.clone(), Duration::from_secs(900), 3);
    let general = kinds(model.clone(), Duration::from_secs(900))
        .into_iter()
        .find(|k| k.spec.name == "general-purpose")
        .unwrap();
    assert_eq!(general.runtime.tool_names(), ["bash", "read_file"]);
    executor
        .run(request("call_1", "look"), &CancellationToken::new())
        .await
        .unwrap();
    let requests = model.requests.lock().unwrap();
    let offered: Vec<&str> = requests[0].tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(offered, ["bash", "read_file"]);
    assert!(
        requests[0].messages[0]
            .text()
            .starts_with("You are a subagent"),
        "the type's system prompt comes first"
    );
}

/// The lead's side: a runtime whose `task` tool delegates to `executor`.
fn lead(model: Arc<dyn ChatModel>, executor: SubagentExecutor, shell: ShellPolicy) -> Runtime {
    let mut tools = ToolRegistry::default();
    let limit = SubagentLimitMiddleware::from_config(&SubagentLimitConfig::default()).unwrap();
    tools.register(Arc::new(TaskTool::new(
        executor,
        shell,
        limit.limits_of(task_tool::TASK_TOOL),
    )));
    let limit: Arc<dyn Middleware> = Arc::new(limit);
    let token_usage: Arc<dyn Middleware> = Arc::new(TokenUsageMiddleware);
    Runtime::new(
        model,
        tools,
        MiddlewareChain::new(vec![token_usage, limit]).unwrap(),
        settings(),
    )
}

fn task_call(id: &str, prompt: &str) -> (String, String, String) {
    (
        id.to_owned(),
        "task".to_owned(),
        serde_json::json!({"description": prompt, "prompt": prompt, "subagent_type": "general-purpose"})
            .to_string(),
    )
}

fn calls(list: &[(String, String, String)]) -> Result<ModelResponse, ModelError> {
    let borrowed: Vec<(&str, &str, &str)> = list
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect();
    ScriptedModel::calls(&borrowed)
}

#[tokio::test(start_paused = true)]
async fn five_task_calls_in_one_response_run_three_and_the_limit_answers_the_rest() {
    let worker = WorkerModel::slow(Duration::from_secs(5));
    let Setup {
        executor, registry, ..
    } = setup(worker.clone(), Duration::from_secs(900), 3);
    let five: Vec<_> = (1..=5)
        .map(|i| task_call(&format!("c{i}"), &format!("job {i}")))
        .collect();
    let lead_model = Arc::new(ScriptedModel::new(vec![
        calls(&five),
        ScriptedModel::text("all done"),
    ]));
    let runtime = lead(lead_model.clone(), executor, Arc::new(|_| true));
    let mut thread = ThreadState::new("t1".into(), "api:c".into(), 0, 0);
    let limits = RunLimits {
        timeout: Duration::from_secs(600),
        cancel: CancellationToken::new(),
    };
    let outcome = runtime
        .run(
            &mut thread,
            &RunInput::text("api", "u1", "go"),
            &Unobserved,
            &limits,
        )
        .await;
    assert_eq!(outcome.answer, "all done");
    assert_eq!(registry.all().len(), 3);
    assert_eq!(worker.calls.load(Ordering::SeqCst), 3);
    let results: Vec<&str> = thread
        .messages
        .iter()
        .filter(|m| matches!(m, ChatMessage::Tool { .. }))
        .map(ChatMessage::text)
        .collect();
    assert_eq!(results.len(), 5);
    for (i, result) in results.iter().enumerate().take(3) {
        assert_eq!(
            *result,
            format!("Task succeeded. Result: result of job {}", i + 1)
        );
    }
    for result in &results[3..] {
        assert!(
            result.starts_with("Not run: at most 3 task calls per response"),
            "{result}"
        );
    }
    // The subagents' tokens count for the parent: 3 × 15, plus the lead's own 15.
    assert_eq!(thread.usage.total_tokens, 60);
}

#[tokio::test(start_paused = true)]
async fn the_lead_goes_on_after_a_task_times_out() {
    let worker = WorkerModel::slow(Duration::from_secs(600));
    let Setup { executor, .. } = setup(worker, Duration::from_secs(30), 3);
    let lead_model = Arc::new(ScriptedModel::new(vec![
        calls(&[task_call("c1", "slow job")]),
        ScriptedModel::text("the task timed out, here is what I know"),
    ]));
    let runtime = lead(lead_model.clone(), executor, Arc::new(|_| true));
    let mut thread = ThreadState::new("t1".into(), "api:c".into(), 0, 0);
    let limits = RunLimits {
        timeout: Duration::from_secs(600),
        cancel: CancellationToken::new(),
    };
    let outcome = runtime
        .run(
            &mut thread,
            &RunInput::text("api", "u1", "go"),
            &Unobserved,
            &limits,
        )
        .await;
    assert_eq!(outcome.ending, RunEnding::Answered);
    assert_eq!(outcome.answer, "the task timed out, here is what I know");
    let second = &lead_model.requests()[1];
    let result = second.messages.last().unwrap().text();
    assert_eq!(
        result,
        "Task timed out. Error: it did not finish within 30 seconds"
    );
}

#[tokio::test]
async fn the_bash_type_is_refused_to_users_who_may_not_run_the_shell() {
    let worker = WorkerModel::slow(Duration::ZERO);
    let Setup {
        executor, registry, ..
    } = setup(worker.clone(), Duration::from_secs(900), 3);
    let tool = TaskTool::new(executor, Arc::new(|role| role == Role::Admin), None);
    let arguments = serde_json::json!({"description": "build", "prompt": "cargo build", "subagent_type": "bash"});
    let cx = crate::agent::tools::tests::context();
    let refused = tool
        .call_reporting(arguments.clone(), &cx)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("only operators"), "{refused}");
    assert!(registry.all().is_empty());
    let admin = ToolContext {
        author: Author {
            role: Role::Admin,
            ..cx.author.clone()
        },
        ..cx
    };
    let output = tool.call_reporting(arguments, &admin).await.unwrap();
    assert_eq!(
        output.content,
        "Task succeeded. Result: result of cargo build"
    );
    assert_eq!(output.usage.map(|u| u.total_tokens), Some(15));
    let unknown = serde_json::json!({"description": "x", "prompt": "y", "subagent_type": "wizard"});
    let error = tool.call_reporting(unknown, &admin).await.unwrap_err();
    assert!(
        error.to_string().contains("`bash`, `general-purpose`"),
        "{error}"
    );
}

#[tokio::test]
async fn progress_shows_a_line_as_a_task_starts_works_and_ends() {
    let worker = WorkerModel::slow(Duration::ZERO);
    let Setup { executor, .. } = setup(worker, Duration::from_secs(900), 3);
    let tool = TaskTool::new(executor, Arc::new(|_| true), None);
    let lines = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&lines);
    let cx = ToolContext {
        progress: Arc::new(move |line: &str| seen.lock().unwrap().push(line.to_owned())),
        ..crate::agent::tools::tests::context()
    };
    let arguments = serde_json::json!({"description": "check  the\nlogs", "prompt": "p", "subagent_type": "general-purpose"});
    tool.call_reporting(arguments, &cx).await.unwrap();
    let lines = lines.lock().unwrap();
    assert_eq!(lines.first().map(String::as_str), Some("⏳ check the logs"));
    let last = lines.last().unwrap();
    assert!(last.starts_with("✅ check the logs · "), "{last}");
}

#[tokio::test]
async fn the_task_tools_text_states_the_configured_limits() {
    let worker = WorkerModel::slow(Duration::ZERO);
    let Setup { executor, .. } = setup(worker, Duration::from_secs(900), 3);
    let limits = SubagentLimitMiddleware::from_config(&SubagentLimitConfig {
        max_per_response: 2,
        max_per_run: 5,
        ..SubagentLimitConfig::default()
    })
    .unwrap()
    .limits_of(task_tool::TASK_TOOL);
    let tool = TaskTool::new(executor.clone(), Arc::new(|_| true), limits);
    let text = tool.spec().description;
    assert!(
        text.contains(
            "in parallel (at most 2 per response and 5 per run; calls beyond that are not run)."
        ),
        "{text}"
    );
    assert!(!text.contains("at most 3"), "{text}");
    // Without subagent_limit there is no cap to state.
    let text = TaskTool::new(executor, Arc::new(|_| true), None)
        .spec()
        .description;
    assert!(
        text.contains("in parallel. The subagent sees only"),
        "{text}"
    );
    assert!(!text.contains("per response"), "{text}");
}

/// Records the thread's last message at each checkpoint.
#[derive(Default)]
struct Checkpoints(Mutex<Vec<String>>);

#[async_trait::async_trait]
impl RunObserver for Checkpoints {
    fn delta(&self, _text: &str) {}

    async fn checkpoint(&self, thread: &mut ThreadState) -> Result<(), CheckpointError> {
        let last = thread.messages.last().map_or("none", |m| match m {
            ChatMessage::Assistant { tool_calls, .. } if !tool_calls.is_empty() => "calls",
            ChatMessage::Tool { .. } => "result",
            _ => "other",
        });
        self.0.lock().unwrap().push(last.to_owned());
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn task_calls_are_saved_before_they_run_so_a_rerun_repeats_the_same_calls() {
    let worker = WorkerModel::slow(Duration::from_secs(1));
    let Setup { executor, .. } = setup(worker, Duration::from_secs(900), 3);
    let lead_model = Arc::new(ScriptedModel::new(vec![
        calls(&[task_call("c1", "a"), task_call("c2", "b")]),
        ScriptedModel::text("done"),
    ]));
    let runtime = lead(lead_model, executor, Arc::new(|_| true));
    let mut thread = ThreadState::new("t1".into(), "api:c".into(), 0, 0);
    let observer = Checkpoints::default();
    let limits = RunLimits {
        timeout: Duration::from_secs(600),
        cancel: CancellationToken::new(),
    };
    runtime
        .run(
            &mut thread,
            &RunInput::text("api", "u1", "go"),
            &observer,
            &limits,
        )
        .await;
    assert_eq!(*observer.0.lock().unwrap(), ["calls", "result", "result"]);
}

#[tokio::test]
async fn users_who_may_not_run_the_shell_are_not_offered_the_bash_type() {
    let worker = WorkerModel::slow(Duration::ZERO);
    let Setup { executor, .. } = setup(worker, Duration::from_secs(900), 3);
    let offered_types = |role: Role| {
        let executor = executor.clone();
        async move {
            let lead_model = Arc::new(ScriptedModel::new(vec![ScriptedModel::text("hi")]));
            let runtime = lead(
                lead_model.clone(),
                executor,
                Arc::new(|role| role == Role::Admin),
            );
            let mut thread = ThreadState::new("t1".into(), "api:c".into(), 0, 0);
            let mut input = RunInput::text("api", "u1", "go");
            input.author.role = role;
            let limits = RunLimits {
                timeout: Duration::from_secs(60),
                cancel: CancellationToken::new(),
            };
            runtime.run(&mut thread, &input, &Unobserved, &limits).await;
            let request = lead_model.requests().remove(0);
            let task = request
                .tools
                .iter()
                .find(|t| t.name == "task")
                .unwrap()
                .clone();
            task.parameters["properties"]["subagent_type"]["enum"].clone()
        }
    };
    assert_eq!(
        offered_types(Role::User).await,
        serde_json::json!(["general-purpose"])
    );
    assert_eq!(
        offered_types(Role::Admin).await,
        serde_json::json!(["bash", "general-purpose"])
    );
}

/// The lead as the app builds it for `config`: the `task` call's limit follows the subagent
/// types (`longest_call`), the turn has `agent.turn_timeout_secs`' default, 600 s.
fn configured_lead(
    lead_model: Arc<dyn ChatModel>,
    worker: Arc<dyn ChatModel>,
    config: &SubagentsConfig,
) -> (Runtime, RunLimits) {
    let kinds = config
        .types()
        .into_iter()
        .map(|spec| SubagentKind::new(spec, Arc::clone(&worker), base_tools(), chain(), settings()))
        .collect();
    let executor = SubagentExecutor::new(
        Arc::new(MemoryRegistry::default()),
        kinds,
        3,
        CancellationToken::new(),
    );
    let mut tools = ToolRegistry::default();
    tools.register(Arc::new(TaskTool::new(executor, Arc::new(|_| true), None)));
    let tools = tools.with_timeouts(
        Duration::from_secs(120),
        HashMap::from([(
            task_tool::TASK_TOOL.to_owned(),
            config.longest_call().unwrap(),
        )]),
    );
    let runtime = Runtime::new(lead_model, tools, chain(), settings());
    let limits = RunLimits {
        timeout: Duration::from_secs(600),
        cancel: CancellationToken::new(),
    };
    (runtime, limits)
}

#[tokio::test(start_paused = true)]
async fn a_900_second_subagent_timeout_is_honoured_not_cut_to_the_turns_600() {
    let config = SubagentsConfig::default();
    assert_eq!(config.timeout_seconds, 900);
    // 880 s of work: more than a 600 s turn has, within the type's 900 s.
    let worker = WorkerModel::slow(Duration::from_secs(880));
    let lead_model = Arc::new(ScriptedModel::new(vec![
        calls(&[task_call("c1", "long job")]),
        ScriptedModel::text("done"),
    ]));
    let (runtime, limits) = configured_lead(lead_model.clone(), worker, &config);
    let mut thread = ThreadState::new("t1".into(), "api:c".into(), 0, 0);
    let started = Instant::now();
    let outcome = runtime
        .run(
            &mut thread,
            &RunInput::text("api", "u1", "go"),
            &Unobserved,
            &limits,
        )
        .await;
    assert_eq!(outcome.ending, RunEnding::Answered, "{}", outcome.answer);
    assert_eq!(started.elapsed(), Duration::from_secs(880));
    let result = lead_model.requests()[1]
        .messages
        .last()
        .unwrap()
        .text()
        .to_owned();
    assert_eq!(result, "Task succeeded. Result: result of long job");

    // Past 900 s the type's own timeout ends it, at 900 s exactly.
    let worker = WorkerModel::slow(Duration::from_secs(5000));
    let lead_model = Arc::new(ScriptedModel::new(vec![
        calls(&[task_call("c1", "endless job")]),
        ScriptedModel::text("it timed out"),
    ]));
    let (runtime, limits) = configured_lead(lead_model.clone(), worker, &config);
    let mut thread = ThreadState::new("t2".into(), "api:c".into(), 0, 0);
    let started = Instant::now();
    let outcome = runtime
        .run(
            &mut thread,
            &RunInput::text("api", "u1", "go"),
            &Unobserved,
            &limits,
        )
        .await;
    assert_eq!(outcome.answer, "it timed out");
    assert_eq!(started.elapsed(), Duration::from_secs(900));
    let result = lead_model.requests()[1]
        .messages
        .last()
        .unwrap()
        .text()
        .to_owned();
    assert_eq!(
        result,
        "Task timed out. Error: it did not finish within 900 seconds"
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_left_less_than_its_timeout_says_so() {
    let model = WorkerModel::slow(Duration::from_secs(600));
    let Setup { executor, .. } = setup(model, Duration::from_secs(900), 3);
    let mut asked = request("call_1", "slow");
    asked.parent.deadline = Instant::now() + Duration::from_secs(100);
    let record = executor
        .run(asked, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(record.status, SubagentStatus::TimedOut);
    assert_eq!(
        record.error.as_deref(),
        Some(
            "it did not finish within 85 seconds, all the time its `task` call had left after \
             it waited for a free slot"
        )
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_over_its_token_budget_ends_timed_out_with_its_partial_result() {
    let step = |id: &str| {
        let mut response = ScriptedModel::calls(&[(id, "read_file", "{}")]).unwrap();
        response.content = format!("read part {id}");
        response.usage = Some(TokenUsage {
            prompt_tokens: 10,
            completion_tokens: 5,
            total_tokens: 15,
        });
        Ok(response)
    };
    let worker = Arc::new(ScriptedModel::new(vec![step("r1"), step("r2"), step("r3")]));
    let config = SubagentsConfig {
        token_budget: 20,
        ..SubagentsConfig::default()
    };
    let kinds = config
        .types()
        .into_iter()
        .map(|spec| {
            let model: Arc<dyn ChatModel> = worker.clone();
            SubagentKind::new(spec, model, base_tools(), chain(), settings())
        })
        .collect();
    let registry = Arc::new(MemoryRegistry::default());
    let executor = SubagentExecutor::new(
        Arc::clone(&registry) as Arc<dyn SubagentRegistry>,
        kinds,
        3,
        CancellationToken::new(),
    );
    let record = executor
        .run(
            request("call_1", "read everything"),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(record.status, SubagentStatus::TimedOut);
    assert_eq!(record.stop_reason.as_deref(), Some("token_budget"));
    assert_eq!(record.usage.total_tokens, 30);
    assert_eq!(
        record.result.as_deref(),
        Some("read part r1\n\nread part r2")
    );
    assert_eq!(worker.requests().len(), 2, "no round after the budget");
    let told = task_tool::answer(&record);
    assert!(told.is_error);
    assert_eq!(
        told.content,
        "Task timed out (token_budget). Error: it used 30 tokens, over its budget of 20 \
         (subagents.token_budget)\n\nPartial result: read part r1\n\nread part r2"
    );
}

#[tokio::test(start_paused = true)]
async fn the_turn_grows_only_as_far_as_the_tasks_own_type_needs() {
    let config: SubagentsConfig =
        toml::from_str("[types.quick]\ndescription = \"quick\"\ntimeout_seconds = 200\n").unwrap();
    let worker = WorkerModel::slow(Duration::from_secs(150));
    let kinds = config
        .types()
        .into_iter()
        .map(|spec| {
            let model: Arc<dyn ChatModel> = worker.clone();
            SubagentKind::new(spec, model, base_tools(), chain(), settings())
        })
        .collect();
    let executor = SubagentExecutor::new(
        Arc::new(MemoryRegistry::default()),
        kinds,
        3,
        CancellationToken::new(),
    );
    let mut tools = ToolRegistry::default();
    tools.register(Arc::new(TaskTool::new(executor, Arc::new(|_| true), None)));
    tools.register(Arc::new(crate::agent::tools::tests::Sleeper));
    let tools = tools.with_timeouts(
        Duration::from_secs(5000),
        HashMap::from([(
            task_tool::TASK_TOOL.to_owned(),
            config.longest_call().unwrap(),
        )]),
    );
    let quick_task = serde_json::json!({
        "description": "quick", "prompt": "quick job", "subagent_type": "quick"
    })
    .to_string();
    let lead_model = Arc::new(ScriptedModel::new(vec![
        ScriptedModel::calls(&[("c1", "task", &quick_task)]),
        ScriptedModel::calls(&[("c2", "sleep", r#"{"seconds": 4000}"#)]),
    ]));
    let runtime = Runtime::new(lead_model.clone(), tools, chain(), settings());
    let limits = RunLimits {
        timeout: Duration::from_secs(100),
        cancel: CancellationToken::new(),
    };
    let mut thread = ThreadState::new("t1".into(), "api:c".into(), 0, 0);
    let started = Instant::now();
    let outcome = runtime
        .run(
            &mut thread,
            &RunInput::text("api", "u1", "go"),
            &Unobserved,
            &limits,
        )
        .await;
    // The 150 s task finished in a 100 s turn; the turn then had until 200 + 60 + 120 s,
    // not the slowest type's 900 + 60 + 120.
    let result = lead_model.requests()[1]
        .messages
        .last()
        .unwrap()
        .text()
        .to_owned();
    assert_eq!(result, "Task succeeded. Result: result of quick job");
    assert_eq!(outcome.ending, RunEnding::TimedOut);
    assert_eq!(started.elapsed(), Duration::from_secs(380));
    assert!(
        outcome.answer.contains("longer than 380 seconds"),
        "{}",
        outcome.answer
    );
}
