//! A mock OpenAI-compatible chat-completions server on 127.0.0.1, shared by the end-to-end
//! tests and the pipeline benchmark, so both measure and test against the same model. It records every request (unless started with
//! [`MockModel::start_unrecorded`]), can hold requests until released, and answers by
//! [`Behaviour`]: echo, slow, tool calls, rate limits, server errors, loops, long streams,
//! errors inside streams, reasoning.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The model name the mock reports (tests configure antler with it).
pub const MODEL_NAME: &str = "mock-model-e2e";

/// How long [`MockModel::wait_for_requests`] waits.
const WAIT: Duration = Duration::from_secs(30);

/// How the mock model answers.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Echoes the last user message: `echo: <text>` (streamed when the request asks for it).
    Echo,
    /// Sleeps, then echoes.
    Slow(Duration),
    /// Calls `current_time` with `{}`; answers with the tool result once the last message is one.
    ToolThenAnswer,
    /// Answers 429 with `Retry-After: 0` this many times (in total), then echoes.
    RateLimited { times: usize },
    /// Answers 500 forever.
    ServerError,
    /// Answers 401 forever.
    Unauthorized,
    /// Always the same two `current_time` calls (offset 0 and 60), their order swapped between
    /// responses.
    Loop,
    /// Answers `status` with `{"error": {"message": message}}` forever.
    Fail { status: u16, message: String },
    /// Calls `ask_clarification` ("Which cluster?", options prod and staging) until the
    /// request holds a tool result; then echoes the last user message.
    Clarify,
    /// Writes a todo list with one open item (`write_todos`) until the request holds a tool
    /// result; then echoes the last user message, never completing the item.
    Todo,
    /// Echoes in `pieces` deltas, one every `every` (streamed; a whole answer after
    /// `pieces × every` otherwise): a long but healthy stream.
    Trickle { pieces: usize, every: Duration },
    /// The first `times` streamed answers are what LiteLLM's proxy sends for a rate limit:
    /// HTTP 200, `: ping` keep-alive comments, then `data: {"error": {"code": "429", ...}}`
    /// and the end of the stream. Then echoes.
    RateLimitedInStream { times: usize },
    /// Echoes after reasoning: `reasoning_content` deltas (DeepSeek) and a `<think>` block at
    /// the start of the content (Qwen via Ollama), both containing [`REASONING_MARK`], the
    /// content in 3-character deltas so the tags are split.
    Reasoning,
    /// Within each turn, calls the tools `(name, arguments)` in order, one per response (the
    /// assistant messages after the last user message say how far it got); then answers
    /// `done: <the last tool result>`.
    TurnScript(Vec<(String, String)>),
    /// The n-th request (counted from the first this behaviour answers) gets the n-th step;
    /// once the script is over, echoes.
    Script(Vec<Step>),
    /// Answers antler's memory updater (recognised by its prompt, [`MEMORY_PROMPT`]) with
    /// update JSON holding the fact `fact` (`{n}` in it replaced by the request's index),
    /// labelled to pass the write gate (`user`, `durable`, `descriptive`), when the
    /// conversation contains `trigger`, and no change otherwise; echoes every other request.
    Memory { trigger: String, fact: String },
    /// Answers antler's memory updater with the update JSON of the first `(trigger, update)`
    /// whose trigger the request's new messages hold (those not marked `(seen)`), and no
    /// change when none does; echoes every other request.
    MemoryAnswers(Vec<(String, Value)>),
    /// The lead delegates: the first response of a turn calls `task` once per prompt, all in
    /// one response; once the results are in, it answers `summary: <results joined by " | ">`.
    /// A subagent (its system prompt starts with [`SUBAGENT_PROMPT`]) waits until as many
    /// subagents as there are prompts ask at once (at most 10 s: they must run in parallel to
    /// get there sooner), then answers `found: <its task>`.
    Delegate(Vec<String>),
    /// Answers antler's summary calls (recognised by their prompt, [`SUMMARY_PROMPT`]) with
    /// HTTP 400, which is not retried; echoes every other request.
    FailSummaries,
    /// Like [`Behaviour::Delegate`], but the lead and every subagent first call `tool` with
    /// `arguments` `repeats` times, one call per response (a request's assistant messages say
    /// how far it got; these are one-turn conversations): the same call from every run. The
    /// subagents' requests wait for each other as `Delegate`'s do, so their calls interleave.
    DelegateRepeating {
        prompts: Vec<String>,
        tool: String,
        arguments: String,
        repeats: usize,
    },
}

/// The start of a built-in subagent's system prompt.
pub const SUBAGENT_PROMPT: &str = "You are a subagent";

/// Words of antler's summary prompt (src/agent/middleware/summarization.rs).
pub const SUMMARY_PROMPT: &str = "Context Extraction Assistant";

/// The start of the memory updater's system prompt.
pub const MEMORY_PROMPT: &str = "You are a memory management system.";

/// One response of a [`Behaviour::Script`].
#[derive(Debug, Clone)]
pub enum Step {
    /// Calls tool `name` with `arguments` (call id `call_<n>`, n the step's number).
    Call { name: String, arguments: Value },
    /// Answers with this text.
    Text(String),
}

impl Step {
    /// A call of `name` with `arguments`.
    pub fn call(name: &str, arguments: Value) -> Self {
        Self::Call {
            name: name.to_owned(),
            arguments,
        }
    }

    /// A text answer.
    pub fn text(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}

/// A word that appears only in the reasoning [`Behaviour::Reasoning`] sends.
pub const REASONING_MARK: &str = "PRIVATE-REASONING";

/// One request the mock received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Arrival order, from 0.
    pub index: usize,
    /// When it arrived.
    pub at: Instant,
    /// The JSON body.
    pub body: Value,
    /// The conversation key: the first user message of the request (antler's hidden
    /// `<context>` message left out).
    pub conversation: String,
    /// Requests in flight (this one included) when it arrived.
    pub in_flight: usize,
    /// Requests of the same conversation in flight (this one included) when it arrived.
    pub in_flight_same_conversation: usize,
}

impl Recorded {
    /// The request's messages.
    pub fn messages(&self) -> Vec<Value> {
        self.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The request's messages without antler's hidden `<context>` message (the current
    /// time, memory), which every request carries before the turn's message: the
    /// conversation as the thread has it.
    pub fn messages_without_context(&self) -> Vec<Value> {
        self.messages()
            .into_iter()
            .filter(|m| !(m["role"] == "user" && text_of(&m["content"]).starts_with("<context>")))
            .collect()
    }

    /// The content of the last user message.
    pub fn last_user_text(&self) -> String {
        last_user_text(&self.body)
    }

    /// Whether this request overlapped another one.
    pub fn concurrent(&self) -> bool {
        self.in_flight > 1
    }
}

#[derive(Default)]
struct MockState {
    behaviour: Mutex<Option<Behaviour>>,
    /// Whether request bodies are kept (the benchmark turns it off).
    record: bool,
    served: AtomicUsize,
    requests: Mutex<Vec<Recorded>>,
    in_flight: AtomicUsize,
    in_flight_by_conversation: Mutex<HashMap<String, usize>>,
    max_in_flight_by_conversation: Mutex<HashMap<String, usize>>,
    failures_served: AtomicUsize,
    loop_responses: AtomicUsize,
    /// Requests a [`Behaviour::Script`] answered so far.
    script_steps: AtomicUsize,
    /// Subagent requests of [`Behaviour::Delegate`] being answered, and the most at once.
    subagents_asking: AtomicUsize,
    most_subagents_at_once: AtomicUsize,
    /// `Some(n)`: requests from arrival index `n` on wait (after being recorded) until it
    /// turns `None`.
    gate: Option<watch::Sender<Option<usize>>>,
}

/// Decrements the in-flight counters when a request is done (or its handler is dropped).
struct InFlight {
    state: Arc<MockState>,
    conversation: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Ok(mut map) = self.state.in_flight_by_conversation.lock() {
            if let Some(n) = map.get_mut(&self.conversation) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

/// A mock OpenAI-compatible chat-completions server on 127.0.0.1.
#[derive(Clone)]
pub struct MockModel {
    state: Arc<MockState>,
    addr: SocketAddr,
}

impl MockModel {
    /// Starts the server with `behaviour`, recording every request.
    pub async fn start(behaviour: Behaviour) -> Self {
        Self::start_with(behaviour, true).await
    }

    /// Starts the server without keeping request bodies (only counting them), for load.
    pub async fn start_unrecorded(behaviour: Behaviour) -> Self {
        Self::start_with(behaviour, false).await
    }

    async fn start_with(behaviour: Behaviour, record: bool) -> Self {
        let (gate, _) = watch::channel(None);
        let state = Arc::new(MockState {
            behaviour: Mutex::new(Some(behaviour)),
            record,
            gate: Some(gate),
            ..MockState::default()
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .route("/v1/models", get(models))
            .with_state(Arc::clone(&state));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind mock");
        let addr = listener.local_addr().expect("mock address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { state, addr }
    }

    /// The most subagent requests of [`Behaviour::Delegate`] that were asking at once.
    pub fn most_subagents_at_once(&self) -> usize {
        self.state.most_subagents_at_once.load(Ordering::SeqCst)
    }

    /// The API base URL to configure (`.../v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Changes how later requests are answered.
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        *self.state.behaviour.lock().expect("behaviour lock") = Some(behaviour);
        // A new script starts at its first step.
        self.state.script_steps.store(0, Ordering::SeqCst);
    }

    /// Makes requests wait (after being recorded) until [`MockModel::release`].
    pub fn hold(&self) {
        self.hold_from(0);
    }

    /// Makes requests from the `n`th (0-based arrival index) on wait until released.
    pub fn hold_from(&self, n: usize) {
        if let Some(gate) = &self.state.gate {
            gate.send_replace(Some(n));
        }
    }

    /// Lets held and later requests through.
    pub fn release(&self) {
        if let Some(gate) = &self.state.gate {
            gate.send_replace(None);
        }
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().expect("requests lock").clone()
    }

    /// The tool results the model was sent in its last request (which holds them all), in
    /// order.
    pub fn tool_results(&self) -> Vec<String> {
        self.requests()
            .last()
            .map(Recorded::messages)
            .unwrap_or_default()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// How many chat-completion requests arrived.
    pub fn count(&self) -> usize {
        self.state.served.load(Ordering::SeqCst)
    }

    /// The largest number of requests of one conversation that were in flight at once.
    pub fn max_in_flight(&self, conversation: &str) -> usize {
        self.state
            .max_in_flight_by_conversation
            .lock()
            .expect("max lock")
            .get(conversation)
            .copied()
            .unwrap_or(0)
    }

    /// Waits until at least `n` requests arrived (panics after 30 s).
    pub async fn wait_for_requests(&self, n: usize) -> Vec<Recorded> {
        let start = Instant::now();
        loop {
            let requests = self.requests();
            if requests.len() >= n {
                return requests;
            }
            assert!(
                start.elapsed() < WAIT,
                "the mock model received {} of {n} requests within {WAIT:?}",
                requests.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// What the user wrote: antler's `input_sanitization` sends it wrapped in
/// `<user_message>\n...\n</user_message>` (the `<uploaded_files>` block, when there is one,
/// after the wrapper); the wrapper is taken off, the rest kept as sent.
pub fn unwrap_user_text(content: &str) -> String {
    match content
        .strip_prefix("<user_message>\n")
        .and_then(|rest| rest.split_once("\n</user_message>"))
    {
        Some((own, after)) => format!("{own}{after}"),
        None => content.to_owned(),
    }
}

fn last_user_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .map(|m| unwrap_user_text(&text_of(&m["content"])))
        .unwrap_or_default()
}

/// The first user message that is not antler's hidden `<context>` (the current time, memory).
fn first_user_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| {
            m.iter()
                .find(|m| m["role"] == "user" && !text_of(&m["content"]).starts_with("<context>"))
        })
        .map(|m| unwrap_user_text(&text_of(&m["content"])))
        .unwrap_or_default()
}

/// The text of a message's content: a string, or the text parts of content parts (a user
/// message with images).
fn text_of(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|part| part["type"] == "text")
            .filter_map(|part| part["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The lead of a [`Behaviour::Delegate`]: `task` calls, then the summary of their results.
fn delegate(body: &Value, prompts: &[String], stream: bool) -> Response {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let turn_start = messages
        .iter()
        .rposition(|m| m["role"] == "user")
        .map_or(0, |at| at + 1);
    let answered = messages
        .get(turn_start..)
        .unwrap_or_default()
        .iter()
        .any(|m| m["role"] == "tool");
    if answered {
        return task_summary(body, stream);
    }
    task_calls(prompts, stream)
}

/// One `task` call per prompt (ids `call_task_<n>`), all in one response.
fn task_calls(prompts: &[String], stream: bool) -> Response {
    let calls: Vec<(String, String)> = prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let arguments = json!({
                "description": format!("look into {prompt}"),
                "prompt": prompt,
                "subagent_type": "general-purpose",
            });
            (format!("call_task_{i}"), arguments.to_string())
        })
        .collect();
    let borrowed: Vec<(&str, &str)> = calls
        .iter()
        .map(|(id, arguments)| (id.as_str(), arguments.as_str()))
        .collect();
    tool_calls_to("task", &borrowed, stream)
}

/// `summary: <the results of this turn's task calls joined by " | ">`.
fn task_summary(body: &Value, stream: bool) -> Response {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let turn_start = messages
        .iter()
        .rposition(|m| m["role"] == "user")
        .map_or(0, |at| at + 1);
    let results: Vec<&str> = messages
        .get(turn_start..)
        .unwrap_or_default()
        .iter()
        .filter(|m| {
            m["role"] == "tool"
                && m["tool_call_id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("call_task_"))
        })
        .filter_map(|m| m["content"].as_str())
        .collect();
    answer(&format!("summary: {}", results.join(" | ")), stream)
}

/// A subagent of a [`Behaviour::Delegate`]: waits for `expected` subagents to ask at once.
async fn subagent(state: &MockState, body: &Value, expected: usize, stream: bool) -> Response {
    wait_for_subagents(state, expected).await;
    answer(&format!("found: {}", last_user_text(body)), stream)
}

/// Waits (at most 10 s) until `expected` subagents have asked at once, as [`subagent`] does.
async fn wait_for_subagents(state: &MockState, expected: usize) {
    struct Asking<'a>(&'a AtomicUsize);
    impl Drop for Asking<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let now = state.subagents_asking.fetch_add(1, Ordering::SeqCst) + 1;
    let _asking = Asking(&state.subagents_asking);
    state
        .most_subagents_at_once
        .fetch_max(now, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while state.most_subagents_at_once.load(Ordering::SeqCst) < expected
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The next step of a [`Behaviour::TurnScript`] for this request.
fn script(body: &Value, steps: &[(String, String)], stream: bool) -> Response {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let turn_start = messages
        .iter()
        .rposition(|m| m["role"] == "user")
        .map_or(0, |at| at + 1);
    let turn = messages.get(turn_start..).unwrap_or_default();
    let done = turn.iter().filter(|m| m["role"] == "assistant").count();
    match steps.get(done) {
        Some((name, arguments)) => {
            tool_call(&format!("call_script_{done}"), name, arguments, stream)
        }
        None => {
            let result = turn
                .iter()
                .rev()
                .find(|m| m["role"] == "tool")
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default();
            answer(&format!("done: {result}"), stream)
        }
    }
}

async fn completions(State(state): State<Arc<MockState>>, body: Bytes) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    let conversation = first_user_text(&body);
    let in_flight = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let same = {
        let mut map = state.in_flight_by_conversation.lock().expect("lock");
        let n = map.entry(conversation.clone()).or_insert(0);
        *n += 1;
        *n
    };
    {
        let mut max = state.max_in_flight_by_conversation.lock().expect("lock");
        let m = max.entry(conversation.clone()).or_insert(0);
        *m = (*m).max(same);
    }
    let _guard = InFlight {
        state: Arc::clone(&state),
        conversation: conversation.clone(),
    };
    let index = {
        let mut requests = state.requests.lock().expect("lock");
        let index = state.served.fetch_add(1, Ordering::SeqCst);
        if state.record {
            requests.push(Recorded {
                index,
                at: Instant::now(),
                body: body.clone(),
                conversation,
                in_flight,
                in_flight_same_conversation: same,
            });
        }
        index
    };
    if let Some(gate) = &state.gate {
        let mut rx = gate.subscribe();
        let _ = rx
            .wait_for(|held| held.is_none_or(|from| index < from))
            .await;
    }
    let behaviour = state
        .behaviour
        .lock()
        .expect("lock")
        .clone()
        .unwrap_or(Behaviour::Echo);
    let stream = body["stream"].as_bool().unwrap_or(false);
    match behaviour {
        Behaviour::Echo => echo(&body, stream),
        Behaviour::Memory { trigger, fact } => {
            let updater = body["messages"][0]["content"]
                .as_str()
                .is_some_and(|s| s.starts_with(MEMORY_PROMPT));
            if !updater {
                echo(&body, stream)
            } else if last_user_text(&body).contains(&trigger) {
                let fact = fact.replace("{n}", &index.to_string());
                let update = json!({"newFacts": [
                    {"content": fact, "category": "preference", "confidence": 0.9,
                     "scope": "user", "durability": "durable", "authority": "descriptive"}
                ]});
                answer(&format!("```json\n{update}\n```"), stream)
            } else {
                answer("{\"newFacts\": []}", stream)
            }
        }
        Behaviour::MemoryAnswers(rules) => {
            let updater = body["messages"][0]["content"]
                .as_str()
                .is_some_and(|s| s.starts_with(MEMORY_PROMPT));
            if !updater {
                return echo(&body, stream);
            }
            let conversation = last_user_text(&body);
            let new: String = conversation
                .lines()
                .filter(|line| !line.starts_with("(seen) "))
                .collect::<Vec<_>>()
                .join("\n");
            match rules.iter().find(|(trigger, _)| new.contains(trigger.as_str())) {
                Some((_, update)) => answer(&update.to_string(), stream),
                None => answer("{\"newFacts\": []}", stream),
            }
        }
        Behaviour::Slow(wait) => {
            tokio::time::sleep(wait).await;
            echo(&body, stream)
        }
        Behaviour::Clarify => {
            let asked = body["messages"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
            if asked {
                echo(&body, stream)
            } else {
                let arguments = json!({
                    "question": "Which cluster?",
                    "clarification_type": "approach_choice",
                    "options": ["prod", "staging"],
                });
                tool_call(
                    "call_ask_1",
                    "ask_clarification",
                    &arguments.to_string(),
                    stream,
                )
            }
        }
        Behaviour::Todo => {
            let written = body["messages"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
            if written {
                echo(&body, stream)
            } else {
                let arguments = json!({"todos": [{"content": "restart api", "status": "pending"}]});
                tool_call("call_todo_1", "write_todos", &arguments.to_string(), stream)
            }
        }
        Behaviour::ToolThenAnswer => {
            let last = body["messages"]
                .as_array()
                .and_then(|m| m.last())
                .cloned()
                .unwrap_or(Value::Null);
            if last["role"] == "tool" {
                let result = last["content"].as_str().unwrap_or_default();
                answer(&format!("The time is {result}"), stream)
            } else {
                tool_calls(&[("call_time_1", "{}")], stream)
            }
        }
        Behaviour::RateLimited { times } => {
            if state.failures_served.fetch_add(1, Ordering::SeqCst) < times {
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, "0")],
                    axum::Json(json!({"error": {"message": "slow down", "type": "rate_limit"}})),
                )
                    .into_response()
            } else {
                echo(&body, stream)
            }
        }
        Behaviour::ServerError => (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"error": {"message": "boom", "type": "server_error"}})),
        )
            .into_response(),
        Behaviour::Unauthorized => (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})),
        )
            .into_response(),
        Behaviour::Fail { status, message } => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            axum::Json(json!({"error": {"message": message, "type": "mock_error"}})),
        )
            .into_response(),
        Behaviour::Trickle { pieces, every } => trickle(&body, stream, pieces, every).await,
        Behaviour::RateLimitedInStream { times } => {
            if stream && state.failures_served.fetch_add(1, Ordering::SeqCst) < times {
                let error = json!({"error": {
                    "message": "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached. Please try again in 1s.",
                    "type": "None", "param": "None", "code": "429"
                }});
                let body = format!(": ping\n\n: ping\n\ndata: {error}\n\n");
                ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
            } else {
                echo(&body, stream)
            }
        }
        Behaviour::Reasoning => reasoning(&body, stream),
        Behaviour::TurnScript(steps) => script(&body, &steps, stream),
        Behaviour::Delegate(prompts) => {
            let system = body["messages"][0]["content"].as_str().unwrap_or_default();
            if system.starts_with(SUBAGENT_PROMPT) {
                subagent(&state, &body, prompts.len(), stream).await
            } else {
                delegate(&body, &prompts, stream)
            }
        }
        Behaviour::FailSummaries => {
            if last_user_text(&body).contains(SUMMARY_PROMPT) {
                (
                    StatusCode::BAD_REQUEST,
                    axum::Json(json!({"error": {"message": "summaries are down"}})),
                )
                    .into_response()
            } else {
                echo(&body, stream)
            }
        }
        Behaviour::DelegateRepeating {
            prompts,
            tool,
            arguments,
            repeats,
        } => {
            let system = body["messages"][0]["content"].as_str().unwrap_or_default();
            let subagent_asks = system.starts_with(SUBAGENT_PROMPT);
            let done = body["messages"]
                .as_array()
                .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
            let who = if subagent_asks { "sub" } else { "lead" };
            if done < repeats {
                if subagent_asks {
                    wait_for_subagents(&state, prompts.len()).await;
                }
                let id = format!("call_{who}_{index}_{done}");
                tool_call(&id, &tool, &arguments, stream)
            } else if subagent_asks {
                subagent(&state, &body, prompts.len(), stream).await
            } else if done == repeats {
                task_calls(&prompts, stream)
            } else {
                task_summary(&body, stream)
            }
        }
        Behaviour::Script(steps) => {
            let n = state.script_steps.fetch_add(1, Ordering::SeqCst);
            match steps.get(n) {
                Some(Step::Call { name, arguments }) => tool_call(
                    &format!("call_{n}"),
                    name,
                    &arguments.to_string(),
                    stream,
                ),
                Some(Step::Text(text)) => answer(text, stream),
                None => echo(&body, stream),
            }
        }
        Behaviour::Loop => {
            let n = state.loop_responses.fetch_add(1, Ordering::SeqCst);
            let a = (
                format!("call_{n}_a"),
                r#"{"utc_offset_minutes":0}"#.to_owned(),
            );
            let b = (
                format!("call_{n}_b"),
                r#"{"utc_offset_minutes":60}"#.to_owned(),
            );
            let calls = if n % 2 == 0 { [a, b] } else { [b, a] };
            let calls: Vec<(&str, &str)> = calls
                .iter()
                .map(|(id, args)| (id.as_str(), args.as_str()))
                .collect();
            tool_calls(&calls, stream)
        }
    }
}

/// `GET /v1/models`: the one model the mock serves.
async fn models() -> Response {
    axum::Json(json!({"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]}))
        .into_response()
}

const USAGE: &str = r#"{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}"#;

fn echo(body: &Value, stream: bool) -> Response {
    answer(&format!("echo: {}", last_user_text(body)), stream)
}

fn usage() -> Value {
    serde_json::from_str(USAGE).unwrap_or(Value::Null)
}

/// A text answer, as one JSON completion or as SSE chunks of a few characters.
fn answer(text: &str, stream: bool) -> Response {
    if !stream {
        return axum::Json(json!({
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "model": MODEL_NAME,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage(),
        }))
        .into_response();
    }
    let chars: Vec<char> = text.chars().collect();
    let mut events = vec![json!({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})];
    for piece in chars.chunks(4) {
        let piece: String = piece.iter().collect();
        events.push(json!({"choices": [{"index": 0, "delta": {"content": piece}}]}));
    }
    events.push(
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage()}),
    );
    sse(&events)
}

/// An answer with one call of tool `name`.
fn tool_call(id: &str, name: &str, arguments: &str, stream: bool) -> Response {
    tool_calls_to(name, &[(id, arguments)], stream)
}

/// The echo in `pieces` deltas, one every `every`.
async fn trickle(body: &Value, stream: bool, pieces: usize, every: Duration) -> Response {
    let text = format!("echo: {}", last_user_text(body));
    if !stream {
        tokio::time::sleep(every.saturating_mul(u32::try_from(pieces).unwrap_or(u32::MAX))).await;
        return answer(&text, false);
    }
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(pieces.max(1)).max(1);
    let mut events: Vec<String> = chars
        .chunks(size)
        .map(|piece| {
            let piece: String = piece.iter().collect();
            let event = json!({"choices": [{"index": 0, "delta": {"content": piece}}]});
            format!("data: {event}\n\n")
        })
        .collect();
    let last =
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage()});
    events.push(format!("data: {last}\n\ndata: [DONE]\n\n"));
    let paced = futures_util::stream::unfold(events.into_iter(), move |mut rest| async move {
        let event = rest.next()?;
        tokio::time::sleep(every).await;
        Some((Ok::<_, std::io::Error>(event), rest))
    });
    (
        [(header::CONTENT_TYPE, "text/event-stream")],
        axum::body::Body::from_stream(paced),
    )
        .into_response()
}

/// The echo after reasoning in both places providers put it.
fn reasoning(body: &Value, stream: bool) -> Response {
    let thinking = format!("The user wants an echo. {REASONING_MARK} in reasoning_content.");
    let content = format!(
        "<think>\nA {REASONING_MARK} thought in a think block.\n</think>\n\necho: {}",
        last_user_text(body)
    );
    if !stream {
        return axum::Json(json!({
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "model": MODEL_NAME,
            "choices": [{"index": 0, "message": {"role": "assistant", "reasoning_content": thinking, "content": content}, "finish_reason": "stop"}],
            "usage": usage(),
        }))
        .into_response();
    }
    let mut events =
        vec![json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null}}]})];
    let words: Vec<&str> = thinking.split_inclusive(' ').collect();
    for word in words {
        events.push(json!({"choices": [{"index": 0, "delta": {"reasoning_content": word}}]}));
    }
    let chars: Vec<char> = content.chars().collect();
    for piece in chars.chunks(3) {
        let piece: String = piece.iter().collect();
        events.push(json!({"choices": [{"index": 0, "delta": {"content": piece}}]}));
    }
    events.push(
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage()}),
    );
    sse(&events)
}

/// An answer with tool calls `(id, arguments)` to `current_time`.
fn tool_calls(calls: &[(&str, &str)], stream: bool) -> Response {
    tool_calls_to("current_time", calls, stream)
}

/// An answer with tool calls `(id, arguments)` to tool `name`.
fn tool_calls_to(name: &str, calls: &[(&str, &str)], stream: bool) -> Response {
    let wire: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (id, args))| {
            json!({"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": args}})
        })
        .collect();
    if !stream {
        return axum::Json(json!({
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "model": MODEL_NAME,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": wire}, "finish_reason": "tool_calls"}],
            "usage": usage(),
        }))
        .into_response();
    }
    let mut events = vec![json!({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})];
    for call in wire {
        events.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}));
    }
    events.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}], "usage": usage()}));
    sse(&events)
}

fn sse(events: &[Value]) -> Response {
    let mut body = String::new();
    for event in events {
        body.push_str(&format!("data: {event}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}
