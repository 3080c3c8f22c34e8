//! Subagents through the API channel: the lead delegates two tasks in one response, they run
//! in parallel and the lead answers from their results; every task is a record the task API
//! shows, `/tasks` lists, an operator can cancel, `/stop` cancels, and a restart fails.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Behaviour, ChildRig, MockModel, SUBAGENT_PROMPT, Step, TestApp, wait_until};

const TOKEN: &str = "subagents-admin-token";

fn config() -> String {
    format!("[channels.api]\ntoken = \"{TOKEN}\"\n")
}

async fn spawn(mock: &MockModel) -> TestApp {
    let mut app = TestApp::spawn(mock, &config()).await;
    app.client.token = Some(TOKEN.to_owned());
    app
}

/// The thread's tasks as the API lists them, newest first.
async fn tasks(app: &TestApp, thread_id: &str) -> Vec<Value> {
    let listed = app.get(&format!("/api/v1/tasks?thread={thread_id}")).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    listed.json["tasks"].as_array().cloned().unwrap_or_default()
}

/// Waits until the thread has `n` tasks, all with `status`.
async fn wait_for_tasks(app: &TestApp, thread_id: &str, n: usize, status: &str) -> Vec<Value> {
    wait_until(&format!("{n} tasks {status}"), || async {
        let tasks = tasks(app, thread_id).await;
        (tasks.len() == n && tasks.iter().all(|t| t["status"] == status)).then_some(tasks)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_run_in_parallel_and_the_lead_answers_from_their_results() {
    let mock = MockModel::start(Behaviour::Delegate(vec![
        "alpha facts".to_owned(),
        "beta facts".to_owned(),
    ]))
    .await;
    let app = spawn(&mock).await;

    let answer = app.ask("research", "compare alpha and beta").await;
    assert_eq!(
        answer.json["reply"],
        "summary: Task succeeded. Result: found: alpha facts | Task succeeded. Result: found: beta facts",
        "{}",
        answer.text
    );
    assert_eq!(
        mock.most_subagents_at_once(),
        2,
        "the two tasks ran at once"
    );

    // Lead, two subagents, lead again. A subagent is offered neither `task` nor
    // `ask_clarification`; the lead is offered `task`.
    let requests = mock.requests();
    assert_eq!(requests.len(), 4);
    let tools = |body: &Value| -> Vec<String> {
        body["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    for request in &requests {
        let system = request.messages()[0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let offered = tools(&request.body);
        if system.starts_with(SUBAGENT_PROMPT) {
            assert!(
                !offered
                    .iter()
                    .any(|t| t == "task" || t == "ask_clarification"),
                "{offered:?}"
            );
            assert!(offered.iter().any(|t| t == "read_file"), "{offered:?}");
        } else {
            assert!(offered.iter().any(|t| t == "task"), "{offered:?}");
        }
    }

    // The records: both completed, with their results, trace and parent.
    let thread_id = answer.json["thread_id"].as_str().unwrap();
    let listed = tasks(&app, thread_id).await;
    assert_eq!(listed.len(), 2);
    let trace = listed[0]["trace_id"].as_str().unwrap().to_owned();
    assert_eq!(trace.len(), 32, "the OpenTelemetry trace id: {trace}");
    for task in &listed {
        assert_eq!(task["status"], "COMPLETED", "{task}");
        assert_eq!(task["parent_thread_id"], thread_id);
        assert_eq!(task["subagent_type"], "general-purpose");
        assert_eq!(task["trace_id"], trace.as_str(), "one trace for the turn");
        assert_eq!(task["usage"]["total_tokens"], 15, "{task}");
        assert!(task["duration_ms"].as_u64().is_some(), "{task}");
    }
    let id = listed[0]["id"].as_str().unwrap();
    let one = app.get(&format!("/api/v1/tasks/{id}")).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.text);
    assert_eq!(one.json["id"], id);
    let result = one.json["result"].as_str().unwrap();
    assert!(result.starts_with("found: "), "{result}");
    assert_eq!(
        app.post_to(&format!("/api/v1/tasks/{id}/cancel"))
            .await
            .status,
        StatusCode::CONFLICT,
        "an ended task cannot be cancelled"
    );

    // The subagents' tokens count for the thread: 4 requests of 15 tokens each.
    let thread = app.thread(thread_id).await;
    assert_eq!(thread["usage"]["total_tokens"], 60, "{thread}");

    // `/tasks` in the conversation lists both.
    let listed = app.ask("research", "/tasks").await;
    let text = listed.json["reply"].as_str().unwrap();
    assert_eq!(
        text.matches("✅ COMPLETED · look into ").count(),
        2,
        "{text}"
    );

    // The API is the operator's: no token 401, unknown 404, malformed 400.
    let anonymous = crate::support::Client::new(app.client.base.clone());
    assert_eq!(
        anonymous.get(&format!("/api/v1/tasks/{id}")).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        app.get("/api/v1/tasks/task_0000000000000000").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.get("/api/v1/tasks/..%2Fetc").await.status,
        StatusCode::BAD_REQUEST
    );
    app.shutdown().await;
}

/// Whether `message` is loop detection's warning (src/agent/middleware/loop_detection.rs).
fn is_loop_warning(message: &Value) -> bool {
    message["role"] == "user"
        && message["content"]
            .as_str()
            .is_some_and(|c| c.contains("[LOOP DETECTED]"))
}

fn is_subagent(request: &crate::support::mock_model::Recorded) -> bool {
    request.messages()[0]["content"]
        .as_str()
        .is_some_and(|s| s.starts_with(SUBAGENT_PROMPT))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_and_two_parallel_subagents_calling_the_same_tool_keep_their_own_loop_counts() {
    // Each run calls `current_time` the same way twice: below the warning threshold (3) in
    // every run, above it (6) if the lead's and the subagents' calls were counted together.
    let mock = MockModel::start(Behaviour::DelegateRepeating {
        prompts: vec!["alpha facts".to_owned(), "beta facts".to_owned()],
        tool: "current_time".to_owned(),
        arguments: r#"{"utc_offset_minutes":0}"#.to_owned(),
        repeats: 2,
    })
    .await;
    let app = spawn(&mock).await;

    let answer = app.ask("research", "compare alpha and beta").await;
    assert_eq!(
        answer.json["reply"],
        "summary: Task succeeded. Result: found: alpha facts | Task succeeded. Result: found: beta facts",
        "{}",
        answer.text
    );
    assert_eq!(
        mock.most_subagents_at_once(),
        2,
        "the two tasks ran at once"
    );
    let requests = mock.requests();
    // The lead: 2 calls, the tasks, the summary; each subagent: 2 calls, its answer.
    assert_eq!(requests.len(), 4 + 2 * 3, "{requests:#?}");
    assert_eq!(requests.iter().filter(|r| is_subagent(r)).count(), 6);
    for request in &requests {
        assert!(
            !request.messages().iter().any(is_loop_warning),
            "request {} carries a loop warning: {:#?}",
            request.index,
            request.messages()
        );
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_repeating_one_task_call_is_warned() {
    // The lead asks for the same task three times, each in its own response (requests 0, 2
    // and 4; the subagents answer 1, 3 and 5); its fourth request carries the warning.
    let same_task = json!({
        "description": "check the pods",
        "prompt": "list the failing pods",
        "subagent_type": "general-purpose",
    });
    let mut steps = Vec::new();
    for _ in 0..3 {
        steps.push(Step::call("task", same_task.clone()));
        steps.push(Step::text("found: nothing failing"));
    }
    steps.push(Step::text("nothing is failing"));
    let mock = MockModel::start(Behaviour::Script(steps)).await;
    let app = spawn(&mock).await;

    let answer = app.ask("loops", "are the pods healthy?").await;
    assert_eq!(
        answer.json["reply"], "nothing is failing",
        "{}",
        answer.text
    );
    let requests = mock.requests();
    assert_eq!(requests.len(), 7);
    let lead: Vec<_> = requests.iter().filter(|r| !is_subagent(r)).collect();
    assert_eq!(lead.len(), 4);
    for (n, request) in lead.iter().enumerate() {
        let messages = request.messages();
        let warnings = messages.iter().filter(|m| is_loop_warning(m)).count();
        if n == 3 {
            assert_eq!(
                warnings, 1,
                "the lead's 4th request is warned: {messages:#?}"
            );
            assert!(
                messages.last().is_some_and(is_loop_warning),
                "{messages:#?}"
            );
        } else {
            assert_eq!(warnings, 0, "lead request {}: {messages:#?}", n + 1);
        }
    }
    for request in requests.iter().filter(|r| is_subagent(r)) {
        assert!(!request.messages().iter().any(is_loop_warning));
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_tool_states_the_configured_limits() {
    let mock = MockModel::start(Behaviour::Delegate(vec!["alpha facts".to_owned()])).await;
    let overrides = format!(
        "{}[agent.middleware.subagent_limit]\nmax_per_response = 2\nmax_per_run = 4\n",
        config()
    );
    let mut app = TestApp::spawn(&mock, &overrides).await;
    app.client.token = Some(TOKEN.to_owned());
    app.ask("research", "look into alpha").await;
    let lead = &mock.requests()[0];
    let description = lead.body["tools"]
        .as_array()
        .and_then(|tools| {
            tools
                .iter()
                .find(|t| t["function"]["name"] == "task")
                .and_then(|t| t["function"]["description"].as_str())
        })
        .unwrap_or_default()
        .to_owned();
    assert!(
        description.contains("at most 2 per response and 4 per run"),
        "{description}"
    );
    assert!(!description.contains("at most 3"), "{description}");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_cancels_a_running_task_and_the_lead_goes_on() {
    let mock = MockModel::start(Behaviour::Delegate(vec!["slow job".to_owned()])).await;
    // The lead's first request passes; the subagent's waits.
    mock.hold_from(1);
    let app = spawn(&mock).await;
    let posted = app
        .post(&json!({"conversation": "ops", "user": "tester", "text": "do the slow job"}))
        .await;
    assert_eq!(posted.status, StatusCode::ACCEPTED, "{}", posted.text);
    let thread_id = posted.json["thread_id"].as_str().unwrap().to_owned();
    let running = wait_for_tasks(&app, &thread_id, 1, "RUNNING").await;
    let id = running[0]["id"].as_str().unwrap();

    let cancelled = app.post_to(&format!("/api/v1/tasks/{id}/cancel")).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.text);
    assert_eq!(cancelled.json["status"], "CANCELLED");
    assert_eq!(cancelled.json["error"], "cancelled by an operator");
    mock.release();

    let thread = app.wait_for_messages(&thread_id, 4).await;
    let last = thread["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        last["content"], "summary: Task cancelled: cancelled by an operator.",
        "{thread}"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_cancels_the_turns_subagents() {
    let mock = MockModel::start(Behaviour::Delegate(vec!["endless".to_owned()])).await;
    mock.hold_from(1);
    let app = spawn(&mock).await;
    let posted = app
        .post(&json!({"conversation": "ops", "user": "tester", "text": "go"}))
        .await;
    let thread_id = posted.json["thread_id"].as_str().unwrap().to_owned();
    wait_for_tasks(&app, &thread_id, 1, "RUNNING").await;

    let stop = app.ask("ops", "/stop").await;
    assert_eq!(
        stop.json["reply"],
        "⏹ Stopped the answer that was being written."
    );
    let ended = wait_for_tasks(&app, &thread_id, 1, "CANCELLED").await;
    assert!(ended[0]["finished_at_ms"].as_u64().is_some());
    mock.release();
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_a_restart_interrupted_is_failed_and_the_rerun_lead_sees_it() {
    let mock = MockModel::start(Behaviour::Delegate(vec!["long job".to_owned()])).await;
    mock.hold_from(1);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut app = TestApp::start(&mock, &store, &config()).await;
    app.client.token = Some(TOKEN.to_owned());
    let posted = app
        .post(&json!({"conversation": "ops", "user": "tester", "text": "start the long job"}))
        .await;
    let thread_id = posted.json["thread_id"].as_str().unwrap().to_owned();
    wait_for_tasks(&app, &thread_id, 1, "RUNNING").await;

    // Stopping interrupts the turn (after the grace period) and leaves the task RUNNING; the
    // next start marks it failed, and the turn's re-run gets that result without a new task.
    app.shutdown().await;
    mock.release();
    let mut app = TestApp::start(&mock, &store, &config()).await;
    app.client.token = Some(TOKEN.to_owned());
    let thread = wait_until("the re-run turn's answer", || async {
        let thread = app.thread(&thread_id).await;
        let answered = thread["messages"].as_array().is_some_and(|m| {
            m.iter().any(|m| {
                m["content"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("summary: "))
            })
        });
        answered.then_some(thread)
    })
    .await;
    let last = thread["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        last["content"], "summary: Task failed. Error: interrupted by restart",
        "{thread}"
    );
    let listed = tasks(&app, &thread_id).await;
    assert_eq!(listed.len(), 1, "no second task: {listed:?}");
    assert_eq!(listed[0]["status"], "FAILED");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sigkill_the_running_task_is_failed_once_and_its_logs_carry_the_trace() {
    let mock = MockModel::start(Behaviour::Delegate(vec!["crash job".to_owned()])).await;
    mock.hold_from(1);
    let rig = ChildRig::new(&mock, &config());
    let mut antler = rig.serve().await;
    antler.client.token = Some(TOKEN.to_owned());
    let posted = antler
        .post(&json!({"conversation": "ops", "user": "tester", "text": "run the crash job"}))
        .await;
    assert_eq!(posted.status, StatusCode::ACCEPTED, "{}", posted.text);
    let thread_id = posted.json["thread_id"].as_str().unwrap().to_owned();
    let running = wait_until("the task runs", || async {
        let listed = antler
            .get(&format!("/api/v1/tasks?thread={thread_id}"))
            .await;
        let tasks = listed.json["tasks"].as_array().cloned().unwrap_or_default();
        tasks.first().filter(|t| t["status"] == "RUNNING").cloned()
    })
    .await;
    let (id, trace) = (
        running["id"].as_str().unwrap().to_owned(),
        running["trace_id"].as_str().unwrap().to_owned(),
    );
    // The task's own log lines carry the turn's trace id and the task id.
    let started = wait_until("the task's start is logged", || async {
        let log = antler.log_text();
        log.lines()
            .find(|line| line.contains("subagent starts"))
            .map(str::to_owned)
    })
    .await;
    assert!(
        started.contains(&format!("trace={trace}")) && started.contains(&format!("task={id}")),
        "{started}"
    );

    antler.kill().await;
    mock.release();
    let mut antler = rig.serve().await;
    antler.client.token = Some(TOKEN.to_owned());
    let thread = wait_until("the re-run turn's answer", || async {
        let thread = antler.thread(&thread_id).await;
        let answered = thread["messages"].as_array().is_some_and(|m| {
            m.iter().any(|m| {
                m["content"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("summary: "))
            })
        });
        answered.then_some(thread)
    })
    .await;
    let last = thread["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        last["content"], "summary: Task failed. Error: interrupted by restart",
        "{thread}"
    );
    let record = antler.get(&format!("/api/v1/tasks/{id}")).await;
    assert_eq!(record.json["status"], "FAILED", "{}", record.text);
    let listed = antler
        .get(&format!("/api/v1/tasks?thread={thread_id}"))
        .await;
    assert_eq!(
        listed.json["tasks"].as_array().unwrap().len(),
        1,
        "no second task"
    );
    assert!(antler.log_text().contains("subagents_failed=1"));
}

/// The `<current_time>` block of a request's hidden context, if it has one.
fn current_time_of(request: &crate::support::mock_model::Recorded) -> Option<String> {
    request.messages().iter().find_map(|m| {
        let content = m["content"].as_str()?;
        let rest = content.strip_prefix("<context>\n<current_time>")?;
        let (time, _) = rest.split_once("</current_time>")?;
        (m["role"] == "user").then(|| time.to_owned())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lead_and_its_subagents_are_told_the_date_in_the_configured_zone() {
    let mock = MockModel::start(Behaviour::Delegate(vec!["alpha facts".to_owned()])).await;
    let mut app = TestApp::spawn(
        &mock,
        &format!("{}[agent]\ntimezone = \"Asia/Tokyo\"\n", config()),
    )
    .await;
    app.client.token = Some(TOKEN.to_owned());
    let tokyo = jiff::tz::TimeZone::get("Asia/Tokyo").unwrap();
    let day = || {
        jiff::Timestamp::now()
            .to_zoned(tokyo.clone())
            .strftime("%Y-%m-%d")
            .to_string()
    };
    let before = day();
    let answer = app.ask("dated", "what happened today?").await;
    let after = day();
    assert!(
        answer.json["reply"]
            .as_str()
            .unwrap()
            .starts_with("summary: Task succeeded."),
        "{}",
        answer.text
    );

    let requests = mock.requests();
    assert_eq!(requests.len(), 3, "lead, subagent, lead");
    let (mut lead, mut subagent) = (0, 0);
    for request in &requests {
        let time = current_time_of(request)
            .unwrap_or_else(|| panic!("no current time in {:?}", request.messages()));
        assert!(
            time.contains(&before) || time.contains(&after),
            "{time} is not today in Tokyo ({before})"
        );
        assert!(time.ends_with("(Asia/Tokyo, UTC+09:00)"), "{time}");
        let system = request.messages()[0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if system.starts_with(SUBAGENT_PROMPT) {
            subagent += 1;
        } else {
            lead += 1;
        }
    }
    assert_eq!((lead, subagent), (2, 1));
    // Fixed when the run starts: the lead's two requests say the same.
    let lead_times: Vec<String> = requests
        .iter()
        .filter(|r| {
            !r.messages()[0]["content"]
                .as_str()
                .unwrap_or_default()
                .starts_with(SUBAGENT_PROMPT)
        })
        .filter_map(current_time_of)
        .collect();
    assert_eq!(lead_times[0], lead_times[1]);
    // Never stored: the thread holds the people's and the model's messages only.
    let thread = app.thread(answer.json["thread_id"].as_str().unwrap()).await;
    assert!(!thread.to_string().contains("current_time"), "{thread}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_over_its_token_budget_ends_timed_out_with_token_budget() {
    // Each mock response costs 15 tokens: the subagent's second response crosses 20, so its
    // second tool call is not run and the task ends there.
    let mock = MockModel::start(Behaviour::DelegateRepeating {
        prompts: vec!["count the files".to_owned()],
        tool: "current_time".to_owned(),
        arguments: "{}".to_owned(),
        repeats: 2,
    })
    .await;
    let mut app = TestApp::spawn(
        &mock,
        &format!("{}[subagents]\ntoken_budget = 20\n", config()),
    )
    .await;
    app.client.token = Some(TOKEN.to_owned());
    let answer = app.ask("budget", "delegate it").await;
    let reply = answer.json["reply"].as_str().unwrap();
    assert!(
        reply.starts_with(
            "summary: Task timed out (token_budget). Error: it used 30 tokens, over its budget of 20"
        ),
        "{reply}"
    );
    let thread_id = answer.json["thread_id"].as_str().unwrap();
    let listed = tasks(&app, thread_id).await;
    assert_eq!(listed.len(), 1);
    let task = &listed[0];
    assert_eq!(task["status"], "TIMED_OUT", "{task}");
    assert_eq!(task["stop_reason"], "token_budget", "{task}");
    assert_eq!(task["usage"]["total_tokens"], 30, "{task}");
    let subagent_requests = mock
        .requests()
        .iter()
        .filter(|r| {
            r.messages()[0]["content"]
                .as_str()
                .unwrap_or_default()
                .starts_with(SUBAGENT_PROMPT)
        })
        .count();
    assert_eq!(subagent_requests, 2, "no round after the budget ran out");
}
