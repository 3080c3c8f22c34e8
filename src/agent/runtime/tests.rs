use std::sync::Mutex;

use super::*;
use crate::agent::middleware::{Middleware, MiddlewareError};
use crate::agent::model::scripted::ScriptedModel;
use crate::agent::model::{DeltaSink, ToolSpec};
use crate::agent::tools::tests::Sleeper;
use crate::agent::tools::{Tool, ToolError};

fn thread() -> ThreadState {
    ThreadState::new("t1".to_owned(), "api:c1".to_owned(), 0, 1)
}

fn settings(max_model_calls: u32) -> RuntimeSettings {
    RuntimeSettings {
        system_prompt: crate::live::Live::text("be brief"),
        max_model_calls,
        max_parallel_tools: 4,
        context_tokens: 0,
        data_root: std::env::temp_dir().join("antler-runtime-tests"),
        timezone: jiff::tz::TimeZone::UTC,
        token_budget: None,
    }
}

fn runtime(model: Arc<dyn ChatModel>, max_model_calls: u32) -> Runtime {
    runtime_with(model, Vec::new(), settings(max_model_calls))
}

fn runtime_with(
    model: Arc<dyn ChatModel>,
    middlewares: Vec<Arc<dyn Middleware>>,
    settings: RuntimeSettings,
) -> Runtime {
    let mut tools = ToolRegistry::builtin();
    tools.register(Arc::new(Sleeper));
    Runtime::new(
        model,
        tools,
        MiddlewareChain::new(middlewares).unwrap(),
        settings,
    )
}

fn input(text: &str) -> RunInput {
    RunInput::text("api", "u1", text)
}

fn limits() -> RunLimits {
    RunLimits {
        timeout: Duration::from_secs(600),
        cancel: CancellationToken::new(),
    }
}

async fn run(runtime: &Runtime, thread: &mut ThreadState, text: &str) -> RunOutcome {
    runtime
        .run(thread, &input(text), &Unobserved, &limits())
        .await
}

fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: id.to_owned(),
        name: name.to_owned(),
        arguments: arguments.to_owned(),
    }
}

fn text_with(
    content: &str,
    f: impl FnOnce(&mut ModelResponse),
) -> Result<ModelResponse, ModelError> {
    let mut response = ScriptedModel::text(content)?;
    f(&mut response);
    Ok(response)
}

#[derive(Default)]
struct Recorder {
    deltas: Mutex<Vec<String>>,
    checkpoints: Mutex<Vec<usize>>,
    progress: Mutex<Vec<ToolProgress>>,
    fail_checkpoints: bool,
}

#[async_trait::async_trait]
impl RunObserver for Recorder {
    fn delta(&self, text: &str) {
        self.deltas.lock().unwrap().push(text.to_owned());
    }

    fn progress(&self, event: &ToolProgress) {
        self.progress.lock().unwrap().push(event.clone());
    }

    async fn checkpoint(&self, thread: &mut ThreadState) -> Result<(), CheckpointError> {
        if self.fail_checkpoints {
            return Err(CheckpointError("disk full".into()));
        }
        self.checkpoints.lock().unwrap().push(thread.messages.len());
        Ok(())
    }
}

#[tokio::test]
async fn plain_answer_appends_user_and_assistant_messages() {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedModel::text("hello")]));
    let mut thread = thread();
    let recorder = Recorder::default();
    let outcome = runtime(model.clone(), 5)
        .run(&mut thread, &input("hi"), &recorder, &limits())
        .await;
    assert_eq!(outcome.ending, RunEnding::Answered);
    assert_eq!(outcome.answer, "hello");
    assert_eq!(outcome.model_calls, 1);
    assert_eq!(
        thread.messages,
        vec![ChatMessage::user("hi"), ChatMessage::assistant("hello")]
    );
    assert_eq!(thread.turns, 1);
    assert_eq!(*recorder.deltas.lock().unwrap(), vec!["hello"]);
    let sent = &model.requests()[0];
    assert_eq!(sent.messages[0], ChatMessage::system("be brief"));
    assert!(sent.tools.iter().any(|t| t.name == "current_time"));
}

#[tokio::test]
async fn tool_results_go_back_to_the_model_each_checkpointed() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedModel::calls(&[("c1", "current_time", "{}"), ("c2", "nope", "{}")]),
        ScriptedModel::text("it is late"),
    ]));
    let mut thread = thread();
    let recorder = Recorder::default();
    let outcome = runtime(model.clone(), 5)
        .run(&mut thread, &input("time?"), &recorder, &limits())
        .await;
    assert_eq!(outcome.answer, "it is late");
    // user, assistant(tool_calls), tool, tool, assistant
    assert_eq!(thread.messages.len(), 5);
    let ChatMessage::Tool { tool_call_id, .. } = &thread.messages[2] else {
        panic!("expected a tool result")
    };
    assert_eq!(tool_call_id, "c1");
    assert!(thread.messages[3].text().contains("no tool named `nope`"));
    // The system prompt, the run's hidden context, then the thread's four messages.
    assert_eq!(model.requests()[1].messages.len(), 2 + 4);
    // One checkpoint per result, not one per round.
    assert_eq!(*recorder.checkpoints.lock().unwrap(), vec![3, 4]);
    // Only the call that ran reports progress; the unknown tool is an immediate error.
    let progress = recorder.progress.lock().unwrap();
    assert_eq!(
        progress.first(),
        Some(&ToolProgress::Started {
            call_id: "c1".into(),
            name: "current_time".into()
        })
    );
    assert!(progress.contains(&ToolProgress::Finished {
        call_id: "c1".into(),
        name: "current_time".into(),
        is_error: false
    }));
}

#[tokio::test]
async fn the_last_allowed_call_is_made_without_tools() {
    let call = || ScriptedModel::calls(&[("c", "current_time", "{}")]);
    let model = Arc::new(ScriptedModel::new(vec![
        call(),
        ScriptedModel::text("done: 12:00"),
    ]));
    let mut thread = thread();
    let outcome = run(&runtime(model.clone(), 2), &mut thread, "loop").await;
    assert_eq!(outcome.answer, "done: 12:00");
    assert_eq!(outcome.stop_reason, None);
    let requests = model.requests();
    assert!(!requests[0].tools.is_empty());
    assert!(
        requests[1].tools.is_empty(),
        "the last call offers no tools"
    );

    // A model that calls tools anyway still ends the run, with a notice.
    let model = Arc::new(ScriptedModel::new(vec![call(), call()]));
    let mut thread = self::thread();
    let outcome = run(&runtime(model, 2), &mut thread, "loop").await;
    assert_eq!(outcome.stop_reason.as_deref(), Some("iteration_limit"));
    assert!(
        outcome.answer.contains("stopped after 2 steps"),
        "{}",
        outcome.answer
    );
    let Some(ChatMessage::Assistant { tool_calls, .. }) = thread.messages.last() else {
        panic!("expected a final assistant message")
    };
    assert!(tool_calls.is_empty());
}

#[tokio::test]
async fn a_model_failure_fails_the_run_and_keeps_the_user_message() {
    let model = Arc::new(ScriptedModel::new(vec![Err(ModelError::Unauthorized {
        status: 401,
        detail: String::new(),
    })]));
    let mut thread = thread();
    let outcome = run(&runtime(model, 5), &mut thread, "hi").await;
    assert_eq!(outcome.ending, RunEnding::Failed);
    assert!(outcome.failed());
    assert!(matches!(
        outcome.error,
        Some(RunError::Model(ModelError::Unauthorized { .. }))
    ));
    assert!(outcome.answer.contains("credentials"), "{}", outcome.answer);
    assert_eq!(thread.messages, vec![ChatMessage::user("hi")]);
    assert_eq!(thread.turns, 0);
}

#[tokio::test(start_paused = true)]
async fn three_slow_tool_calls_take_the_time_of_one_and_keep_their_order() {
    let sleeps = || {
        ScriptedModel::calls(&[
            ("a", "sleep", r#"{"seconds":30}"#),
            ("b", "sleep", r#"{"seconds":10}"#),
            ("c", "sleep", r#"{"seconds":20}"#),
        ])
    };
    let model = Arc::new(ScriptedModel::new(vec![
        sleeps(),
        ScriptedModel::text("rested"),
    ]));
    let mut thread = thread();
    let started = Instant::now();
    let recorder = Recorder::default();
    let outcome = runtime(model, 5)
        .run(&mut thread, &input("rest"), &recorder, &limits())
        .await;
    assert_eq!(outcome.answer, "rested");
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    let ids: Vec<&str> = thread
        .messages
        .iter()
        .filter_map(|m| match m {
            ChatMessage::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert!(
        thread.messages[2]
            .text()
            .starts_with("slept 30s for t1 in ")
    );
    let notes = recorder
        .progress
        .lock()
        .unwrap()
        .iter()
        .filter(|p| matches!(p, ToolProgress::Note { text, .. } if text == "sleeping"))
        .count();
    assert_eq!(notes, 3);

    // Bounded: with two at a time, the third waits for a slot.
    let model = Arc::new(ScriptedModel::new(vec![
        sleeps(),
        ScriptedModel::text("rested"),
    ]));
    let mut thread = self::thread();
    let started = Instant::now();
    let bounded = runtime_with(
        model,
        Vec::new(),
        RuntimeSettings {
            max_parallel_tools: 2,
            ..settings(5)
        },
    );
    run(&bounded, &mut thread, "rest").await;
    // a (30 s) and b (10 s) start; c starts when b ends and ends at 30 s.
    assert_eq!(started.elapsed(), Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn a_tool_that_runs_out_of_time_becomes_an_error_result() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedModel::calls(&[("a", "sleep", r#"{"seconds":500}"#)]),
        ScriptedModel::text("gave up waiting"),
    ]));
    let mut tools = ToolRegistry::builtin().with_timeouts(
        Duration::from_secs(120),
        HashMap::from([("sleep".to_owned(), Duration::from_secs(5))]),
    );
    tools.register(Arc::new(Sleeper));
    let runtime = Runtime::new(model, tools, MiddlewareChain::default(), settings(5));
    let mut thread = thread();
    let started = Instant::now();
    let outcome = run(&runtime, &mut thread, "rest").await;
    assert_eq!(outcome.answer, "gave up waiting");
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert!(
        thread.messages[2]
            .text()
            .contains("did not finish within 5 seconds"),
        "{:?}",
        thread.messages[2]
    );
}

#[tokio::test]
async fn a_failed_checkpoint_fails_the_turn() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedModel::calls(&[("c1", "current_time", "{}")]),
        ScriptedModel::text("never asked"),
    ]));
    let mut thread = thread();
    let recorder = Recorder {
        fail_checkpoints: true,
        ..Recorder::default()
    };
    let outcome = runtime(model.clone(), 5)
        .run(&mut thread, &input("time?"), &recorder, &limits())
        .await;
    assert_eq!(outcome.ending, RunEnding::Failed);
    assert!(matches!(outcome.error, Some(RunError::Checkpoint(_))));
    assert!(
        outcome.answer.contains("could not save"),
        "{}",
        outcome.answer
    );
    assert_eq!(
        model.requests().len(),
        1,
        "no model call after the failed save"
    );
}

#[tokio::test]
async fn the_answer_holds_every_round_shown_and_reasoning_stays_apart() {
    let model = Arc::new(ScriptedModel::new(vec![
        Ok(ModelResponse {
            content: "Let me check the time.".into(),
            ..ScriptedModel::calls(&[("c1", "current_time", "{}")]).unwrap()
        }),
        text_with("It is noon.", |r| {
            r.reasoning = Some("the tool said 12:00".into())
        }),
    ]));
    let mut thread = thread();
    let recorder = Recorder::default();
    let outcome = runtime(model, 5)
        .run(&mut thread, &input("time?"), &recorder, &limits())
        .await;
    assert_eq!(outcome.answer, "Let me check the time.\n\nIt is noon.");
    assert_eq!(
        recorder.deltas.lock().unwrap().concat(),
        outcome.answer,
        "the stream is what the answer says"
    );
    let Some(ChatMessage::Assistant {
        content, reasoning, ..
    }) = thread.messages.last()
    else {
        panic!("expected the answer")
    };
    assert_eq!(content, "It is noon.");
    assert_eq!(reasoning.as_deref(), Some("the tool said 12:00"));
}

#[tokio::test]
async fn a_cut_off_answer_says_so() {
    let model = Arc::new(ScriptedModel::new(vec![text_with("The list: a, b", |r| {
        r.finish_reason = FinishReason::Length;
    })]));
    let mut thread = thread();
    let outcome = run(&runtime(model, 5), &mut thread, "list").await;
    assert!(outcome.answer.starts_with("The list: a, b\n\n"));
    assert!(
        outcome.answer.contains("output limit"),
        "{}",
        outcome.answer
    );
    assert_eq!(thread.messages[1], ChatMessage::assistant("The list: a, b"));
}

/// A middleware for the control tests: offers a tool, and decides per hook.
#[derive(Default)]
struct Steer {
    name: &'static str,
    /// Continue after every model call.
    keep_going: bool,
    /// Interrupt when `ask` is called.
    ask: bool,
    /// Stop after the first model call.
    stop: bool,
    /// Calls seen by before_tool, with whether an earlier hook refused them.
    seen: Mutex<Vec<(String, bool)>>,
    endings: Mutex<Vec<RunEnding>>,
}

struct Ask;

#[async_trait::async_trait]
impl Tool for Ask {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "ask".into(),
            description: "asks the user".into(),
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    async fn call(&self, _: serde_json::Value, _: &ToolContext) -> Result<String, ToolError> {
        Err(ToolError::Failed("handled by the middleware".into()))
    }
}

#[async_trait::async_trait]
impl Middleware for Steer {
    fn name(&self) -> &'static str {
        self.name
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        if self.ask {
            vec![Arc::new(Ask)]
        } else {
            Vec::new()
        }
    }

    async fn after_model(
        &self,
        cx: &mut RunContext<'_>,
        _response: &mut ModelResponse,
    ) -> Result<(), MiddlewareError> {
        if self.keep_going {
            cx.continue_with(ChatMessage::user("<reminder>keep going</reminder>"));
        }
        if self.stop {
            cx.stop("budget");
        }
        Ok(())
    }

    async fn before_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        refused: Option<&ToolOutput>,
    ) -> Result<ToolDecision, MiddlewareError> {
        self.seen
            .lock()
            .unwrap()
            .push((call.name.clone(), refused.is_some()));
        if self.ask && call.name == "ask" {
            cx.interrupt("Which cluster?", vec!["prod".into(), "staging".into()]);
            return Ok(ToolDecision::Skip(ToolOutput::ok("Asked the user.")));
        }
        if call.name == "forbidden" {
            return Ok(ToolDecision::Skip(ToolOutput::error("not allowed")));
        }
        Ok(ToolDecision::Run)
    }

    async fn after_run(&self, cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
        self.endings.lock().unwrap().extend(cx.ending);
        Ok(())
    }
}

#[tokio::test]
async fn continue_sends_the_model_back_and_is_capped() {
    let steer = Arc::new(Steer {
        name: "todo",
        keep_going: true,
        ..Steer::default()
    });
    let answers = (0..10)
        .map(|i| ScriptedModel::text(&format!("round {i}")))
        .collect();
    let model = Arc::new(ScriptedModel::new(answers));
    let runtime = runtime_with(model.clone(), vec![steer.clone()], settings(25));
    let mut thread = thread();
    let outcome = run(&runtime, &mut thread, "plan").await;
    assert_eq!(outcome.ending, RunEnding::Answered);
    assert_eq!(outcome.model_calls, 1 + MAX_CONTINUES);
    let reminders = thread
        .messages
        .iter()
        .filter(|m| m.text().contains("keep going"))
        .count();
    assert_eq!(reminders as u32, MAX_CONTINUES);
    // The last request carried the reminder after the previous answer.
    let last = model.requests().pop().unwrap();
    assert!(last.messages.last().unwrap().text().contains("keep going"));

    // Nor past the run's model calls.
    let answers = (0..10)
        .map(|i| ScriptedModel::text(&format!("round {i}")))
        .collect();
    let model = Arc::new(ScriptedModel::new(answers));
    let runtime = runtime_with(model, vec![steer], settings(2));
    let outcome = run(&runtime, &mut self::thread(), "plan").await;
    assert_eq!(outcome.model_calls, 2);
    assert_eq!(outcome.ending, RunEnding::Answered);
}

#[tokio::test]
async fn an_interrupt_asks_and_the_next_message_resumes_with_the_answer() {
    let steer = Arc::new(Steer {
        name: "clarification",
        ask: true,
        ..Steer::default()
    });
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedModel::calls(&[("q1", "ask", "{}"), ("c2", "current_time", "{}")]),
        ScriptedModel::text("Deploying to staging."),
    ]));
    let runtime = runtime_with(model.clone(), vec![steer.clone()], settings(25));
    assert!(
        runtime.tools.specs().iter().any(|t| t.name == "ask"),
        "the middleware's tool is offered"
    );
    let mut thread = thread();
    let outcome = run(&runtime, &mut thread, "deploy it").await;
    assert_eq!(outcome.ending, RunEnding::Interrupted);
    assert_eq!(outcome.answer, "Which cluster?\n\n1. prod\n2. staging");
    let pending = thread.pending_question.clone().unwrap();
    assert_eq!(pending.options, ["prod", "staging"]);
    // Every call has a result; the one after the question was not run.
    assert_eq!(
        thread.messages[2],
        ChatMessage::tool("q1", "Asked the user.")
    );
    assert!(thread.messages[3].text().contains("Not run"));
    assert_eq!(model.requests().len(), 1);

    let outcome = run(&runtime, &mut thread, "2").await;
    assert_eq!(outcome.ending, RunEnding::Answered);
    assert_eq!(outcome.answer, "Deploying to staging.");
    assert_eq!(thread.pending_question, None);
    let request = model.requests().pop().unwrap();
    assert_eq!(request.messages.last(), Some(&ChatMessage::user("staging")));
    assert!(
        request
            .messages
            .iter()
            .any(|m| m.text() == "Asked the user.")
    );
    assert_eq!(
        *steer.endings.lock().unwrap(),
        [RunEnding::Interrupted, RunEnding::Answered]
    );
}

#[tokio::test]
async fn a_stop_ends_the_run_and_every_hook_sees_every_call() {
    let first = Arc::new(Steer {
        name: "guardrail",
        stop: true,
        ..Steer::default()
    });
    let second = Arc::new(Steer {
        name: "sandbox_audit",
        ..Steer::default()
    });
    let model = Arc::new(ScriptedModel::new(vec![Ok(ModelResponse {
        content: "Partial work.".into(),
        ..ScriptedModel::calls(&[("c1", "current_time", "{}")]).unwrap()
    })]));
    let runtime = runtime_with(model, vec![first.clone(), second.clone()], settings(25));
    let mut thread = thread();
    let outcome = run(&runtime, &mut thread, "go").await;
    assert_eq!(outcome.ending, RunEnding::Stopped);
    assert_eq!(outcome.stop_reason.as_deref(), Some("budget"));
    assert_eq!(outcome.answer, "Partial work.");
    let Some(ChatMessage::Assistant { tool_calls, .. }) = thread.messages.last() else {
        panic!("expected the last answer")
    };
    assert!(tool_calls.is_empty(), "calls that cannot run are dropped");

    // A refusal by the first hook is seen by the second.
    let first = Arc::new(Steer {
        name: "guardrail",
        ..Steer::default()
    });
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedModel::calls(&[("c1", "forbidden", "{}")]),
        ScriptedModel::text("ok"),
    ]));
    let runtime = runtime_with(model, vec![first.clone(), second.clone()], settings(25));
    run(&runtime, &mut self::thread(), "go").await;
    assert_eq!(
        *first.seen.lock().unwrap(),
        [("forbidden".to_owned(), false)]
    );
    assert_eq!(
        *second.seen.lock().unwrap(),
        [("forbidden".to_owned(), true)]
    );
}

/// A model that never answers.
struct Hanging;

#[async_trait::async_trait]
impl ChatModel for Hanging {
    fn name(&self) -> &str {
        "hanging"
    }

    async fn complete(
        &self,
        _request: &ModelRequest,
        deltas: Option<DeltaSink<'_>>,
    ) -> Result<ModelResponse, ModelError> {
        if let Some(sink) = deltas {
            sink("Thinking about it");
        }
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn after_run_sees_failed_and_timed_out_runs() {
    let steer = Arc::new(Steer {
        name: "memory",
        ..Steer::default()
    });
    let failing = Arc::new(ScriptedModel::new(vec![Err(ModelError::Unreachable(
        "refused".into(),
    ))]));
    run(
        &runtime_with(failing, vec![steer.clone()], settings(5)),
        &mut thread(),
        "hi",
    )
    .await;

    let runtime = runtime_with(Arc::new(Hanging), vec![steer.clone()], settings(5));
    let mut thread = thread();
    let started = Instant::now();
    let outcome = runtime
        .run(
            &mut thread,
            &input("hi"),
            &Unobserved,
            &RunLimits {
                timeout: Duration::from_secs(60),
                cancel: CancellationToken::new(),
            },
        )
        .await;
    assert_eq!(started.elapsed(), Duration::from_secs(60));
    assert_eq!(outcome.ending, RunEnding::TimedOut);
    assert!(outcome.failed());
    assert!(
        outcome.answer.starts_with("Thinking about it\n\n⚠️"),
        "what was shown is kept: {}",
        outcome.answer
    );
    assert_eq!(
        *steer.endings.lock().unwrap(),
        [RunEnding::Failed, RunEnding::TimedOut]
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_run_stops_and_keeps_what_was_shown() {
    let runtime = runtime(Arc::new(Hanging), 5);
    let mut thread = thread();
    let limits = limits();
    let cancel = limits.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        cancel.cancel();
    });
    let outcome = runtime
        .run(&mut thread, &input("hi"), &Unobserved, &limits)
        .await;
    assert_eq!(outcome.ending, RunEnding::Stopped);
    assert!(!outcome.failed());
    assert_eq!(outcome.stop_reason.as_deref(), Some("stopped_by_user"));
    assert_eq!(outcome.answer, "Thinking about it\n\n⏹ Stopped.");
    assert_eq!(
        thread.messages.last(),
        Some(&ChatMessage::assistant("Thinking about it\n\n[stopped]"))
    );
}

#[tokio::test]
async fn a_resumed_turn_runs_only_the_calls_left_unanswered() {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedModel::text("all done")]));
    let mut thread = thread();
    thread.messages.push(ChatMessage::user("two things"));
    thread.messages.push(ChatMessage::assistant_calls(
        "",
        vec![
            call("done", "current_time", "{}"),
            call("left", "sleep", r#"{"seconds":0}"#),
        ],
    ));
    thread.messages.push(ChatMessage::tool("done", "12:00"));
    let recorder = Recorder::default();
    let outcome = runtime(model, 5)
        .resume(&mut thread, &input("two things"), &recorder, &limits())
        .await;
    assert_eq!(outcome.answer, "all done");
    let ChatMessage::Tool {
        tool_call_id,
        content,
    } = &thread.messages[3]
    else {
        panic!("expected the missing result: {:?}", thread.messages[3])
    };
    assert_eq!(tool_call_id, "left");
    assert!(content.starts_with("slept 0s for t1 in "), "{content}");
    let started: Vec<String> = recorder
        .progress
        .lock()
        .unwrap()
        .iter()
        .filter_map(|p| match p {
            ToolProgress::Started { call_id, .. } => Some(call_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(started, ["left"]);
}

#[test]
fn an_earlier_turns_calls_are_not_run_again() {
    let mut messages = vec![
        ChatMessage::user("first"),
        ChatMessage::assistant_calls("", vec![call("old", "sleep", "{}")]),
        ChatMessage::user("second"),
    ];
    assert!(unanswered_calls(&messages).is_empty());
    messages.push(ChatMessage::assistant_calls(
        "",
        vec![call("new", "sleep", "{}")],
    ));
    let pending = unanswered_calls(&messages);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].id, "new");
}

#[tokio::test]
async fn helper_calls_count_towards_the_run_and_the_thread() {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedModel::text("A title")]));
    let mut thread = thread();
    let input = input("hi");
    let mut cx = RunContext::new(&mut thread, &input, model.clone());
    let request = ModelRequest {
        messages: vec![ChatMessage::user("title this")],
        tools: Vec::new(),
    };
    let response = cx.helper_complete("title", &request).await.unwrap();
    assert_eq!(response.content, "A title");
    assert_eq!(cx.run_usage.total_tokens, 15);
    assert_eq!(cx.model_calls, 0, "helper calls are not steps of the run");
    assert_eq!(thread.usage.total_tokens, 15);
}

#[test]
fn the_oldest_exchanges_are_left_out_to_fit_the_context() {
    let long = "x".repeat(4000); // about 1000 tokens
    let mut request = ModelRequest {
        messages: vec![
            ChatMessage::system("sys"),
            ChatMessage::user(&long),
            ChatMessage::assistant_calls("", vec![call("c1", "current_time", "{}")]),
            ChatMessage::tool("c1", &long),
            ChatMessage::assistant("old answer"),
            ChatMessage::user(&long),
            ChatMessage::assistant("second answer"),
            ChatMessage::user("now"),
        ],
        tools: Vec::new(),
    };
    let dropped = fit_context(&mut request, 1500);
    assert_eq!(
        dropped, 4,
        "the first exchange, with its call and result, went"
    );
    assert_eq!(request.messages[0], ChatMessage::system("sys"));
    assert_eq!(request.messages[1].text(), long);
    assert_eq!(request.messages.last(), Some(&ChatMessage::user("now")));
    // The last exchange stays even when it alone is too big.
    let dropped = fit_context(&mut request, 10);
    assert_eq!(dropped, 2);
    assert_eq!(
        request.messages,
        vec![ChatMessage::system("sys"), ChatMessage::user("now")]
    );
}

#[tokio::test]
async fn finalization_repairs_what_a_hook_broke() {
    /// Drops every tool result from the request, as a careless summarizer might.
    struct DropResults;

    #[async_trait::async_trait]
    impl Middleware for DropResults {
        fn name(&self) -> &'static str {
            "summarization"
        }

        async fn before_model(
            &self,
            _cx: &mut RunContext<'_>,
            request: &mut ModelRequest,
        ) -> Result<(), MiddlewareError> {
            request
                .messages
                .retain(|m| !matches!(m, ChatMessage::Tool { .. }));
            Ok(())
        }
    }

    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedModel::calls(&[("c1", "current_time", "{}")]),
        ScriptedModel::text("fine"),
    ]));
    let runtime = runtime_with(model.clone(), vec![Arc::new(DropResults)], settings(5));
    run(&runtime, &mut thread(), "time?").await;
    let request = model.requests().pop().unwrap();
    // System, hidden context, user, assistant, the repaired result.
    let ChatMessage::Tool { tool_call_id, .. } = &request.messages[4] else {
        panic!("the call got a placeholder result: {:?}", request.messages)
    };
    assert_eq!(tool_call_id, "c1");
}

#[tokio::test]
async fn file_tools_run_under_the_guardrail_and_the_output_budget() {
    use crate::agent::input::Role;
    use crate::agent::middleware::guardrail::{GuardrailConfig, GuardrailMiddleware};
    use crate::agent::middleware::thread_data::{self, ThreadDataMiddleware};
    use crate::agent::middleware::tool_output_budget::{
        ToolOutputBudgetConfig, ToolOutputBudgetMiddleware,
    };

    let dir = tempfile::tempdir().unwrap();
    let settings = RuntimeSettings {
        data_root: dir.path().to_path_buf(),
        timezone: jiff::tz::TimeZone::UTC,
        token_budget: None,
        ..settings(5)
    };
    let chain = || -> Vec<Arc<dyn Middleware>> {
        vec![
            Arc::new(
                ThreadDataMiddleware::from_config(
                    &thread_data::ThreadDataConfig::default(),
                    1 << 20,
                )
                .unwrap(),
            ),
            Arc::new(GuardrailMiddleware::from_config(&GuardrailConfig::default()).unwrap()),
            Arc::new(
                ToolOutputBudgetMiddleware::from_config(&ToolOutputBudgetConfig::default())
                    .unwrap(),
            ),
        ]
    };
    let long: String = (0..2000).map(|i| format!("row {i:05}\n")).collect();
    let write =
        serde_json::json!({"path": "/mnt/user-data/outputs/big.txt", "content": long}).to_string();
    let read = r#"{"path": "/mnt/user-data/outputs/big.txt", "end_line": 1999}"#;
    let script = || {
        vec![
            ScriptedModel::calls(&[("w1", "write_file", &write)]),
            ScriptedModel::calls(&[("r1", "read_file", read), ("l1", "ls", "{}")]),
            ScriptedModel::text("done"),
        ]
    };

    // A user: the write is refused and not run, and write tools are not even offered.
    let model = Arc::new(ScriptedModel::new(script()));
    let runtime = runtime_with(model.clone(), chain(), settings.clone());
    let mut thread = thread();
    let outcome = runtime
        .run(&mut thread, &input("save it"), &Unobserved, &limits())
        .await;
    assert_eq!(outcome.answer, "done");
    assert!(
        thread.messages[2]
            .text()
            .contains("`write_file` needs an operator"),
        "{}",
        thread.messages[2].text()
    );
    let folders = ThreadFolders::new(dir.path(), "t1").unwrap();
    assert!(!folders.outputs().join("big.txt").exists());
    let first = &model.requests()[0];
    let offered: Vec<&str> = first.tools.iter().map(|t| t.name.as_str()).collect();
    assert!(offered.contains(&"read_file") && !offered.contains(&"write_file"));
    assert!(
        first.messages[0].text().ends_with(thread_data::NOTE),
        "{}",
        first.messages[0].text()
    );

    // An admin: the file is written, and the long read is cut with a pointer to line ranges.
    let model = Arc::new(ScriptedModel::new(script()));
    let runtime = runtime_with(model.clone(), chain(), settings);
    let mut thread = self::thread();
    let mut admin = input("save it");
    admin.author.role = Role::Admin;
    let outcome = runtime
        .run(&mut thread, &admin, &Unobserved, &limits())
        .await;
    assert_eq!(outcome.answer, "done");
    assert_eq!(
        thread.messages[2].text(),
        "Wrote 20000 bytes to /mnt/user-data/outputs/big.txt"
    );
    assert_eq!(
        std::fs::read_to_string(folders.outputs().join("big.txt")).unwrap(),
        long
    );
    let read_back = thread.messages[4].text();
    assert!(read_back.starts_with("row 00000\n"), "{read_back}");
    assert!(
        read_back.contains(
            "left out: read /mnt/user-data/outputs/big.txt in smaller parts with start_line and \
             end_line.]"
        ) && read_back.ends_with("row 01998\n"),
        "{read_back}"
    );
    assert!(
        thread.messages[5]
            .text()
            .starts_with("/mnt/user-data/workspace/ is empty"),
        "{}",
        thread.messages[5].text()
    );
}

#[test]
fn the_current_time_names_the_day_the_zone_and_its_offset() {
    let now: jiff::Timestamp = "2026-12-04T20:05:00Z".parse().unwrap();
    let berlin = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
    assert_eq!(
        current_time(now, &berlin),
        "<current_time>Friday, 2026-12-04 21:05 (Europe/Berlin, UTC+01:00)</current_time>"
    );
    assert_eq!(
        current_time(now, &jiff::tz::TimeZone::UTC),
        "<current_time>Friday, 2026-12-04 20:05 (UTC, UTC+00:00)</current_time>"
    );
}

#[tokio::test]
async fn every_request_of_a_run_carries_the_same_time_before_the_turns_message() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedModel::calls(&[("c1", "current_time", "{}")]),
        ScriptedModel::text("done"),
    ]));
    let mut thread = thread();
    thread.messages.push(ChatMessage::user("earlier"));
    thread
        .messages
        .push(ChatMessage::assistant("earlier answer"));
    run(&runtime(model.clone(), 5), &mut thread, "what day is it?").await;
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let context = |request: &ModelRequest| {
        let at = request
            .messages
            .iter()
            .position(|m| m.text().starts_with("<context>\n<current_time>"))
            .expect("the time is in the request");
        (at, request.messages[at].clone())
    };
    let (at, first) = context(&requests[0]);
    // After the stored history, just before the turn's message: the prefix stays cacheable.
    assert_eq!(at, 3);
    assert_eq!(
        requests[0].messages[at + 1],
        ChatMessage::user("what day is it?")
    );
    assert_eq!(
        context(&requests[1]),
        (at, first),
        "the same bytes in every request"
    );
    assert!(
        thread
            .messages
            .iter()
            .all(|m| !m.text().contains("<current_time>")),
        "never stored"
    );
}

#[tokio::test]
async fn an_empty_final_answer_is_retried_once_with_a_reminder() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedModel::text("   "),
        ScriptedModel::text("here it is"),
    ]));
    let mut thread = thread();
    let outcome = run(&runtime(model.clone(), 5), &mut thread, "hi").await;
    assert_eq!(outcome.ending, RunEnding::Answered);
    assert_eq!(outcome.answer, "here it is");
    assert_eq!(outcome.stop_reason, None);
    let second = &model.requests()[1];
    assert_eq!(
        second.messages.last().unwrap().text(),
        EMPTY_ANSWER_REMINDER,
        "the retry carries the reminder"
    );
}

#[tokio::test]
async fn an_answer_empty_twice_ends_with_a_note_not_an_empty_reply() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedModel::text(""),
        ScriptedModel::text(""),
        ScriptedModel::text("never asked"),
    ]));
    let mut thread = thread();
    let outcome = run(&runtime(model.clone(), 5), &mut thread, "hi").await;
    assert_eq!(outcome.ending, RunEnding::Answered);
    assert_eq!(outcome.answer, EMPTY_ANSWER_NOTE);
    assert_eq!(outcome.stop_reason.as_deref(), Some(EMPTY_ANSWER));
    assert_eq!(model.requests().len(), 2, "one retry only");
}

#[tokio::test]
async fn tool_calls_of_a_filtered_response_are_not_run() {
    let mut filtered = ScriptedModel::calls(&[("c1", "sleep", r#"{"seconds": 1}"#)]).unwrap();
    filtered.finish_reason = FinishReason::ContentFilter;
    let model = Arc::new(ScriptedModel::new(vec![Ok(filtered)]));
    let mut thread = thread();
    let recorder = Recorder::default();
    let outcome = runtime(model.clone(), 5)
        .run(&mut thread, &input("hi"), &recorder, &limits())
        .await;
    assert_eq!(outcome.ending, RunEnding::Answered);
    assert!(
        outcome.answer.contains("content filter withheld"),
        "{}",
        outcome.answer
    );
    assert!(recorder.progress.lock().unwrap().is_empty(), "nothing ran");
    assert_eq!(model.requests().len(), 1);
    assert!(
        thread
            .messages
            .iter()
            .all(|m| !matches!(m, ChatMessage::Tool { .. })),
        "{:?}",
        thread.messages
    );
}

#[tokio::test]
async fn a_run_over_its_token_budget_stops_before_its_next_round() {
    let with_usage = |id: &str| {
        let mut response = ScriptedModel::calls(&[(id, "current_time", "{}")]).unwrap();
        response.content = format!("step {id}");
        response.usage = Some(TokenUsage {
            prompt_tokens: 50,
            completion_tokens: 10,
            total_tokens: 60,
        });
        Ok(response)
    };
    let model = Arc::new(ScriptedModel::new(vec![
        with_usage("c1"),
        with_usage("c2"),
        with_usage("c3"),
    ]));
    let budgeted = runtime_with(
        model.clone(),
        Vec::new(),
        RuntimeSettings {
            token_budget: Some(100),
            ..settings(10)
        },
    );
    let mut thread = thread();
    let outcome = run(&budgeted, &mut thread, "work").await;
    assert_eq!(outcome.ending, RunEnding::Stopped);
    assert_eq!(outcome.stop_reason.as_deref(), Some(TOKEN_BUDGET));
    // 60 tokens: goes on; 120: the second response's call is not run.
    assert_eq!(model.requests().len(), 2);
    assert_eq!(
        outcome.answer, "step c1\n\nstep c2",
        "the partial result is kept"
    );
    let results = thread
        .messages
        .iter()
        .filter(|m| matches!(m, ChatMessage::Tool { .. }))
        .count();
    assert_eq!(results, 1);
}

/// Holds `sleep` calls (as `approval` does) until released.
#[derive(Default)]
struct Holder {
    released: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Middleware for Holder {
    fn name(&self) -> &'static str {
        "approval"
    }

    async fn before_tool(
        &self,
        _cx: &mut RunContext<'_>,
        call: &ToolCall,
        _refused: Option<&ToolOutput>,
    ) -> Result<ToolDecision, MiddlewareError> {
        let released = self.released.load(std::sync::atomic::Ordering::SeqCst);
        Ok(if call.name == "sleep" && !released {
            ToolDecision::Hold
        } else {
            ToolDecision::Run
        })
    }
}

#[tokio::test]
async fn a_held_call_stops_the_run_unanswered_and_a_resume_runs_it() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedModel::calls(&[
            ("held", "sleep", r#"{"seconds":0}"#),
            ("free", "current_time", "{}"),
        ]),
        ScriptedModel::text("all done"),
    ]));
    let holder = Arc::new(Holder::default());
    let runtime = runtime_with(
        model.clone(),
        vec![holder.clone() as Arc<dyn Middleware>],
        settings(5),
    );
    let mut thread = thread();
    let recorder = Recorder::default();
    let outcome = runtime
        .run(&mut thread, &input("two things"), &recorder, &limits())
        .await;
    assert_eq!(outcome.ending, RunEnding::Stopped);
    assert_eq!(outcome.stop_reason.as_deref(), Some(AWAITING_APPROVAL));
    // user, assistant(calls), the free call's result; the held one has none.
    assert_eq!(thread.messages.len(), 3, "{:?}", thread.messages);
    assert!(matches!(
        &thread.messages[2],
        ChatMessage::Tool { tool_call_id, .. } if tool_call_id == "free"
    ));
    // Saved with the call unanswered, and the model was not asked again.
    assert_eq!(recorder.checkpoints.lock().unwrap().last(), Some(&3));
    assert_eq!(model.requests().len(), 1);

    holder
        .released
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let outcome = runtime
        .resume(&mut thread, &input(""), &recorder, &limits())
        .await;
    assert_eq!(outcome.answer, "all done");
    assert!(matches!(
        &thread.messages[3],
        ChatMessage::Tool { tool_call_id, content } if tool_call_id == "held" && content.starts_with("slept 0s")
    ));
    assert_eq!(model.requests().len(), 2);
}

#[test]
fn a_schema_is_measured_as_long_as_its_compact_json() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Where"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 2000},
            "flags": {"type": "array", "items": {"type": "boolean"}, "default": [true, false, null]},
            "empty": {}
        },
        "required": ["path"]
    });
    assert_eq!(json_len(&schema), schema.to_string().len());
}
