use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::response::{IntoResponse, Response};

use serde_json::{Value, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockBuilder, MockServer, ResponseTemplate};

use super::super::detail::DETAIL_MAX_CHARS;
use super::*;
use crate::agent::model::ToolSpec;

const KEY: &str = "sk-test-secret-key";

/// A client for `base` with test settings (tiny backoff), adjusted by `tweak`.
fn client_with(base: &str, tweak: impl FnOnce(&mut OpenAiConfig)) -> OpenAiClient {
    let mut config = OpenAiConfig::new(format!("{base}/v1/"), "test-model");
    config.api_key = Some(KEY.to_owned());
    config.backoff_base = Duration::from_millis(1);
    config.backoff_max = Duration::from_millis(4);
    config.request_timeout = Duration::from_secs(20);
    tweak(&mut config);
    OpenAiClient::new(config).unwrap()
}

fn client(server: &MockServer) -> OpenAiClient {
    client_with(&server.uri(), |_| {})
}

fn request() -> ModelRequest {
    ModelRequest {
        messages: vec![ChatMessage::system("be brief"), ChatMessage::user("hi")],
        tools: Vec::new(),
    }
}

fn completions() -> MockBuilder {
    Mock::given(method("POST")).and(path("/v1/chat/completions"))
}

/// A server answering every completion with `template`.
async fn serve(template: ResponseTemplate) -> MockServer {
    let server = MockServer::start().await;
    completions().respond_with(template).mount(&server).await;
    server
}

fn answer(content: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]
    }))
}

/// An SSE body of `events`, ended by `[DONE]` when `done`.
fn sse(events: &[Value], done: bool) -> ResponseTemplate {
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    if done {
        body.push_str("data: [DONE]\n\n");
    }
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

fn text_chunk(text: &str) -> Value {
    json!({"choices": [{"delta": {"content": text}, "finish_reason": null}]})
}

fn finish_chunk(reason: &str) -> Value {
    json!({"choices": [{"delta": {}, "finish_reason": reason}]})
}

fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

async fn fail(client: &OpenAiClient) -> ModelError {
    client.complete(&request(), None).await.unwrap_err()
}

async fn requests(server: &MockServer) -> usize {
    server.received_requests().await.unwrap().len()
}

async fn first_body(server: &MockServer) -> Value {
    server.received_requests().await.unwrap()[0]
        .body_json()
        .unwrap()
}

/// A server whose answer number `n` (from 0) is `answer(n)`: its base URL and hit count.
async fn serve_fn<F>(answer: F) -> (String, Arc<AtomicUsize>)
where
    F: Fn(usize) -> Response + Send + Sync + 'static,
{
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let answer = Arc::new(answer);
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            let answer = answer.clone();
            async move { answer(n) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, hits)
}

/// An SSE response sending `pieces` (raw text), each after `gap`; it then stays open
/// without sending anything when `hang`, or ends.
fn paced(pieces: Vec<String>, gap: Duration, hang: bool) -> Response {
    use futures_util::StreamExt;
    let stream = futures_util::stream::unfold(pieces.into_iter(), move |mut rest| async move {
        let piece = rest.next()?;
        tokio::time::sleep(gap).await;
        Some((Ok::<_, std::io::Error>(piece), rest))
    });
    let body = if hang {
        axum::body::Body::from_stream(stream.chain(futures_util::stream::pending()))
    } else {
        axum::body::Body::from_stream(stream)
    };
    ([(CONTENT_TYPE, "text/event-stream")], body).into_response()
}

/// `data: {event}` lines of `events`, plus `[DONE]` when `done`.
fn sse_text(events: &[Value], done: bool) -> String {
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    if done {
        body.push_str("data: [DONE]\n\n");
    }
    body
}

/// A server answering the first `n` completions with `first`, the rest with `then`.
async fn serve_then(first: ResponseTemplate, n: u64, then: ResponseTemplate) -> MockServer {
    let server = MockServer::start().await;
    completions()
        .respond_with(first)
        .up_to_n_times(n)
        .mount(&server)
        .await;
    completions().respond_with(then).mount(&server).await;
    server
}

async fn stream(client: &OpenAiClient, deltas: &Deltas) -> Result<ModelResponse, ModelError> {
    let sink = |t: &str| deltas.push(t);
    client.complete(&request(), Some(&sink)).await
}

/// Collects deltas; `push` is the sink.
#[derive(Default)]
struct Deltas(Mutex<Vec<String>>);

impl Deltas {
    fn push(&self, text: &str) {
        self.0.lock().unwrap().push(text.to_owned());
    }
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn plain_reply() {
    let server = MockServer::start().await;
    completions()
        .and(header("authorization", format!("Bearer {KEY}").as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
        })))
        .expect(1)
        .mount(&server)
        .await;
    let client = client(&server);
    assert_eq!(client.name(), "test-model");
    let response = client.complete(&request(), None).await.unwrap();
    assert_eq!(response.content, "hello");
    assert!(response.tool_calls.is_empty());
    assert_eq!(response.finish_reason, FinishReason::Stop);
    let usage = response.usage.unwrap();
    assert_eq!(
        [
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.total_tokens
        ],
        [5, 1, 6]
    );
}

#[tokio::test]
async fn streamed_reply_passes_deltas_in_order() {
    let server = serve(sse(
        &[
            json!({"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
            text_chunk("Hel"),
            text_chunk("lo "),
            text_chunk("world"),
            finish_chunk("stop"),
            json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}),
        ],
        true,
    ))
    .await;
    let deltas = Deltas::default();
    let sink = |t: &str| deltas.push(t);
    let response = client(&server)
        .complete(&request(), Some(&sink))
        .await
        .unwrap();
    assert_eq!(deltas.all(), ["Hel", "lo ", "world"]);
    assert_eq!(response.content, "Hello world");
    assert_eq!(response.finish_reason, FinishReason::Stop);
    assert_eq!(response.usage.unwrap().total_tokens, 10);
    let sent = first_body(&server).await;
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["stream_options"]["include_usage"], true);
}

#[tokio::test]
async fn non_streamed_tool_calls_are_parsed() {
    let server = serve(ResponseTemplate::new(200).set_body_json(json!({
        "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "ls", "arguments": {"dir": "/"}}}
        ]}, "finish_reason": "tool_calls"}]
    })))
    .await;
    let response = client(&server).complete(&request(), None).await.unwrap();
    assert_eq!(response.content, "");
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        response.tool_calls,
        [
            call("call_1", "read_file", r#"{"path":"a.txt"}"#),
            call("call_2", "ls", r#"{"dir":"/"}"#)
        ]
    );
    assert!(response.usage.is_none());
}

#[tokio::test]
async fn streamed_tool_calls_are_assembled_from_fragments() {
    let fragment = |index: u32, head: Option<(&str, &str)>, args: &str| {
        let mut fragment = json!({"index": index, "function": {"arguments": args}});
        if let Some((id, name)) = head {
            fragment["id"] = json!(id);
            fragment["type"] = json!("function");
            fragment["function"]["name"] = json!(name);
        }
        json!({"choices": [{"delta": {"tool_calls": [fragment]}, "finish_reason": null}]})
    };
    let events = [
        text_chunk("Let me look."),
        fragment(0, Some(("call_a", "read_file")), ""),
        fragment(0, None, "{\"pa"),
        fragment(1, Some(("call_b", "ls")), "{\"dir\""),
        fragment(0, None, "th\": \"x.md\"}"),
        fragment(1, None, ": \"/\"}"),
        finish_chunk("tool_calls"),
    ];
    // CRLF line endings, and two calls whose fragments interleave.
    let body: String = events
        .iter()
        .map(|e| format!("data: {e}\r\n\r\n"))
        .collect();
    let server = serve(
        ResponseTemplate::new(200)
            .set_body_raw(format!("{body}data: [DONE]\r\n\r\n"), "text/event-stream"),
    )
    .await;
    let deltas = Deltas::default();
    let sink = |t: &str| deltas.push(t);
    let response = client(&server)
        .complete(&request(), Some(&sink))
        .await
        .unwrap();
    assert_eq!(deltas.all(), ["Let me look."]);
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        response.tool_calls,
        [
            call("call_a", "read_file", r#"{"path": "x.md"}"#),
            call("call_b", "ls", r#"{"dir": "/"}"#)
        ]
    );
}

#[tokio::test]
async fn stream_without_done_is_accepted_only_when_finished() {
    let sink = |_: &str| {};
    let finished = serve(sse(&[text_chunk("ok"), finish_chunk("length")], false)).await;
    let response = client(&finished)
        .complete(&request(), Some(&sink))
        .await
        .unwrap();
    assert_eq!(response.content, "ok");
    assert_eq!(response.finish_reason, FinishReason::Length);

    let cut = serve(sse(&[text_chunk("o")], false)).await;
    let result = client(&cut).complete(&request(), Some(&sink)).await;
    assert!(
        matches!(&result, Err(ModelError::Interrupted { shown, .. }) if shown == "o"),
        "{result:?}"
    );
    // Text had been passed on: a retry would repeat it.
    assert_eq!(requests(&cut).await, 1);
}

#[tokio::test]
async fn stream_disabled_by_config_sends_the_text_once() {
    let server = serve(answer("whole")).await;
    let deltas = Deltas::default();
    let sink = |t: &str| deltas.push(t);
    let client = client_with(&server.uri(), |c| c.stream = false);
    let response = client.complete(&request(), Some(&sink)).await.unwrap();
    assert_eq!(response.content, "whole");
    assert_eq!(deltas.all(), ["whole"]);
    assert!(first_body(&server).await.get("stream").is_none());
}

#[tokio::test]
async fn rate_limit_with_retry_after_is_retried() {
    let server = MockServer::start().await;
    completions()
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "0"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    completions()
        .respond_with(answer("finally"))
        .mount(&server)
        .await;
    let response = client(&server).complete(&request(), None).await.unwrap();
    assert_eq!(response.content, "finally");
    assert_eq!(requests(&server).await, 2);
}

#[tokio::test]
async fn rate_limit_forever_gives_rate_limited() {
    let server = serve(ResponseTemplate::new(429)).await;
    assert_eq!(
        fail(&client(&server)).await,
        ModelError::RateLimited {
            attempts: 4,
            detail: String::new()
        }
    );
    assert_eq!(requests(&server).await, 4);
}

#[tokio::test]
async fn server_error_forever_gives_up_after_the_retries() {
    let server = serve(ResponseTemplate::new(503)).await;
    let error = fail(&client_with(&server.uri(), |c| c.max_retries = 2)).await;
    assert_eq!(
        error,
        ModelError::Server {
            status: 503,
            attempts: 3
        }
    );
    assert_eq!(requests(&server).await, 3);
}

#[tokio::test]
async fn unauthorized_is_not_retried() {
    let server = serve(ResponseTemplate::new(401).set_body_json(json!({
        "error": {"message": format!("Incorrect API key provided: {KEY}")}
    })))
    .await;
    let error = fail(&client(&server)).await;
    assert_eq!(
        error,
        ModelError::Unauthorized {
            status: 401,
            detail: "Incorrect API key provided: ***".to_owned()
        }
    );
    assert!(!error.to_string().contains(KEY));
    assert_eq!(requests(&server).await, 1);
}

#[tokio::test]
async fn not_found_carries_the_shortened_provider_message() {
    let long = format!("The model `gpt-9` does not exist {}", "x".repeat(1000));
    let server =
        serve(ResponseTemplate::new(404).set_body_json(json!({"error": {"message": long}}))).await;
    let error = fail(&client(&server)).await;
    let ModelError::NotFound { detail } = error else {
        panic!("expected NotFound, got {error:?}");
    };
    assert!(detail.starts_with("The model `gpt-9` does not exist"));
    assert!(detail.chars().count() <= DETAIL_MAX_CHARS + 3);
    assert_eq!(requests(&server).await, 1);
}

#[tokio::test]
async fn an_unknown_model_behind_litellm_is_for_the_operator() {
    // LiteLLM 1.x answers a model name it has no deployment for with a 400.
    let server = serve(ResponseTemplate::new(400).set_body_json(json!({"error": {
        "message": "/chat/completions: Invalid model name passed in model=gpt-5o. Call `/v1/models` to view available models for your key.",
        "type": "invalid_request_error", "param": "model", "code": "400"
    }})))
    .await;
    let error = fail(&client(&server)).await;
    let ModelError::UnknownModel {
        status: 400,
        detail,
    } = &error
    else {
        panic!("expected UnknownModel, got {error:?}");
    };
    assert!(detail.contains("Invalid model name"), "{detail}");
    assert!(!error.retry_can_help());
    let message = error.user_message();
    assert!(message.contains("`model.model`"), "{message}");
    assert!(!message.contains("/new"), "{message}");
    assert_eq!(requests(&server).await, 1);
    // A `model_not_found` code on another 4xx counts the same.
    let server = serve(ResponseTemplate::new(400).set_body_json(json!({"error": {
        "message": "no deployment", "code": "model_not_found"
    }})))
    .await;
    let error = fail(&client(&server)).await;
    assert!(
        matches!(error, ModelError::UnknownModel { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn other_client_errors_are_bad_requests_with_the_key_redacted() {
    let server = serve(ResponseTemplate::new(400).set_body_json(json!({
        "error": {"message": format!("context too long (key {KEY})")}
    })))
    .await;
    let detail = "context too long (key ***)".to_owned();
    assert_eq!(
        fail(&client(&server)).await,
        ModelError::BadRequest {
            status: 400,
            detail
        }
    );
    assert_eq!(requests(&server).await, 1);
}

#[tokio::test]
async fn garbage_body_is_invalid_and_not_retried() {
    let server =
        serve(ResponseTemplate::new(200).set_body_raw("<html>oops</html>", "text/html")).await;
    let error = fail(&client(&server)).await;
    assert!(matches!(error, ModelError::InvalidResponse(_)), "{error:?}");
    assert_eq!(requests(&server).await, 1);
}

#[tokio::test]
async fn slow_answer_times_out() {
    let server = serve(answer("late").set_delay(Duration::from_secs(30))).await;
    let timeout = Duration::from_millis(200);
    let client = client_with(&server.uri(), |c| {
        c.request_timeout = timeout;
        c.max_retries = 0;
    });
    assert_eq!(
        fail(&client).await,
        ModelError::Timeout {
            kind: TimeoutKind::Total,
            limit: timeout
        }
    );
}

#[tokio::test]
async fn stalled_stream_after_text_is_not_retried() {
    // One delta, then nothing: the stream goes idle after text went out.
    let (base, hits) = serve_fn(|_| {
        paced(
            vec![format!("data: {}\n\n", text_chunk("partial"))],
            Duration::ZERO,
            true,
        )
    })
    .await;
    let timeout = Duration::from_millis(300);
    let client = client_with(&base, |c| c.idle_timeout = timeout);
    let deltas = Deltas::default();
    let sink = |t: &str| deltas.push(t);
    let error = client.complete(&request(), Some(&sink)).await.unwrap_err();
    let ModelError::Interrupted { shown, reason } = &error else {
        panic!("expected Interrupted, got {error:?}");
    };
    assert_eq!(shown, "partial");
    assert!(reason.contains("sent nothing for 0.3s"), "{reason}");
    assert_eq!(deltas.all(), ["partial"]);
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn unreachable_endpoint_is_retried_then_reported() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let error = fail(&client_with(&base, |c| c.max_retries = 1)).await;
    assert!(matches!(error, ModelError::Unreachable(_)), "{error:?}");
    assert!(!error.to_string().contains(KEY));
}

#[tokio::test]
async fn request_body_has_the_openai_shape() {
    let server = serve(answer("done")).await;
    let client = client_with(&server.uri(), |c| {
        c.temperature = Some(0.5);
        c.max_tokens = Some(256);
    });
    let request = ModelRequest {
        messages: vec![
            ChatMessage::system("sys"),
            ChatMessage::user("list files"),
            ChatMessage::assistant_calls("", vec![call("call_1", "ls", "{}")]),
            ChatMessage::tool("call_1", "a.txt"),
            ChatMessage::assistant("There is a.txt."),
        ],
        tools: vec![std::sync::Arc::new(ToolSpec {
            name: "ls".into(),
            description: "Lists files.".into(),
            parameters: json!({"type": "object", "properties": {}}),
        })],
    };
    client.complete(&request, None).await.unwrap();
    assert_eq!(
        first_body(&server).await,
        json!({
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
                {"role": "assistant", "content": "There is a.txt."}
            ],
            "tools": [{"type": "function", "function": {
                "name": "ls",
                "description": "Lists files.",
                "parameters": {"type": "object", "properties": {}}
            }}],
            "temperature": 0.5,
            "max_tokens": 256
        })
    );
}

#[test]
fn sse_parser_handles_any_chunking() {
    let stream = b": comment\r\nevent: x\r\ndata: {\"a\":1}\r\n\r\nid: 7\ndata:{\"b\":2}\n\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n";
    let expected = ["{\"a\":1}", "{\"b\":2}", "line1\nline2", "[DONE]"];
    for size in 1..=stream.len() {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        for piece in stream.chunks(size) {
            events.extend(parser.push(piece).unwrap());
        }
        assert_eq!(parser.finish(), None);
        assert_eq!(events, expected, "chunk size {size}");
    }
    // An event cut off by the end of the stream still counts.
    let mut parser = SseParser::default();
    assert!(parser.push(b"data: tail").unwrap().is_empty());
    assert_eq!(parser.finish().as_deref(), Some("tail"));
}

#[test]
fn debug_never_shows_the_key() {
    let client = client_with("https://api.openai.com", |_| {});
    for shown in [format!("{:?}", client.config), format!("{client:?}")] {
        assert!(!shown.contains(KEY));
        assert!(shown.contains("***"));
    }
}

#[test]
fn url_and_retry_after_are_derived_carefully() {
    let with_slash = OpenAiClient::new(OpenAiConfig::new("http://h:1/v1/", "m")).unwrap();
    let without = OpenAiClient::new(OpenAiConfig::new("http://h:1/v1", "m")).unwrap();
    assert_eq!(with_slash.url.as_str(), "http://h:1/v1/chat/completions");
    assert_eq!(without.url, with_slash.url);
    assert!(OpenAiClient::new(OpenAiConfig::new("not a url", "m")).is_err());

    let after = |value: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, value.parse().unwrap());
        retry_after(&headers)
    };
    assert_eq!(after("2"), Some(Duration::from_secs(2)));
    assert_eq!(after("3600"), Some(RETRY_AFTER_CAP));
    assert_eq!(after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
}

#[test]
fn backoff_grows_and_is_capped() {
    let client = client_with("http://h", |c| {
        c.backoff_base = Duration::from_millis(100);
        c.backoff_max = Duration::from_millis(1000);
    });
    let ms = Duration::from_millis;
    for _ in 0..50 {
        assert!((ms(50)..=ms(100)).contains(&client.backoff(1, None)));
        assert!((ms(500)..=ms(1000)).contains(&client.backoff(30, None)));
    }
    assert_eq!(client.backoff(1, Some(Duration::ZERO)), Duration::ZERO);
}

// ---- timeouts ----

#[tokio::test]
async fn a_healthy_stream_outlives_every_timeout() {
    // 25 deltas 100 ms apart: about 2.5 s in all, beyond every limit (1 s each), while
    // each gap stays far below the idle limit.
    let pieces: Vec<String> = (0..25)
        .map(|i| format!("data: {}\n\n", text_chunk(&format!("{i} "))))
        .chain([format!(
            "data: {}\n\ndata: [DONE]\n\n",
            finish_chunk("stop")
        )])
        .collect();
    let (base, hits) =
        serve_fn(move |_| paced(pieces.clone(), Duration::from_millis(100), false)).await;
    let limit = Duration::from_secs(1);
    let client = client_with(&base, |c| {
        c.first_byte_timeout = limit;
        c.idle_timeout = limit;
        c.request_timeout = limit;
        c.max_retries = 0;
    });
    let started = std::time::Instant::now();
    let deltas = Deltas::default();
    let response = stream(&client, &deltas).await.unwrap();
    assert!(
        started.elapsed() > Duration::from_secs(2),
        "the stream was long"
    );
    let expected: String = (0..25).map(|i| format!("{i} ")).collect();
    assert_eq!(response.content, expected);
    assert_eq!(deltas.all().len(), 25);
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn first_byte_timeout_covers_the_head_and_the_first_chunk() {
    let limit = Duration::from_millis(300);
    let no_retry = |c: &mut OpenAiConfig| {
        c.first_byte_timeout = limit;
        c.max_retries = 0;
    };
    let expected = ModelError::Timeout {
        kind: TimeoutKind::FirstByte,
        limit,
    };
    // The head is late.
    let late_head =
        serve(sse(&[text_chunk("late")], true).set_delay(Duration::from_secs(30))).await;
    let deltas = Deltas::default();
    let error = stream(&client_with(&late_head.uri(), no_retry), &deltas).await;
    assert_eq!(error.unwrap_err(), expected);
    // The head comes at once, the first chunk never.
    let (base, _) = serve_fn(|_| paced(Vec::new(), Duration::ZERO, true)).await;
    let error = stream(&client_with(&base, no_retry), &deltas).await;
    assert_eq!(error.unwrap_err(), expected);
    assert!(deltas.all().is_empty());
}

#[tokio::test]
async fn keep_alive_comments_are_not_the_answer_starting() {
    // LiteLLM pings a streaming client with `: ping` comments while the upstream is silent;
    // a hung upstream must still end at the first-byte limit, not when the pings stop.
    let pings: Vec<String> = (0..100).map(|_| ": ping\n\n".to_owned()).collect();
    let (base, _) = serve_fn(move |_| paced(pings.clone(), Duration::from_millis(100), true)).await;
    let limit = Duration::from_millis(1500);
    let client = client_with(&base, |c| {
        c.first_byte_timeout = limit;
        c.idle_timeout = Duration::from_secs(60);
        c.max_retries = 0;
    });
    let deltas = Deltas::default();
    let error = stream(&client, &deltas).await.unwrap_err();
    assert_eq!(
        error,
        ModelError::Timeout {
            kind: TimeoutKind::FirstByte,
            limit
        }
    );
    assert!(deltas.all().is_empty());
}

#[tokio::test]
async fn keep_alive_comments_are_not_activity() {
    // Text, then only pings: the idle limit runs from the last `data`.
    let mut pieces = vec![format!("data: {}\n\n", text_chunk("partial"))];
    // 30 s of pings; the limit is 1.5 s.
    pieces.extend((0..300).map(|_| ": ping - 2025-01-01 00:00:00\n\n".to_owned()));
    let (base, _) =
        serve_fn(move |_| paced(pieces.clone(), Duration::from_millis(100), true)).await;
    let limit = Duration::from_millis(1500);
    let client = client_with(&base, |c| {
        c.idle_timeout = limit;
        c.max_retries = 0;
    });
    let deltas = Deltas::default();
    let started = std::time::Instant::now();
    let error = stream(&client, &deltas).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the pings kept the stream alive"
    );
    assert_eq!(
        error,
        ModelError::Interrupted {
            shown: "partial".to_owned(),
            reason: ModelError::Timeout {
                kind: TimeoutKind::Idle,
                limit
            }
            .to_string()
        }
    );
}

#[tokio::test]
async fn a_stream_stalled_before_any_text_is_retried() {
    // The first answer sends its role chunk and a reasoning delta, then goes quiet; the
    // second is fine. Nothing was shown, so the retry is invisible.
    let (base, hits) = serve_fn(|n| {
        if n == 0 {
            let events = [
                json!({"choices": [{"delta": {"role": "assistant"}}]}),
                json!({"choices": [{"delta": {"reasoning_content": "hmm"}}]}),
            ];
            paced(vec![sse_text(&events, false)], Duration::ZERO, true)
        } else {
            let events = [text_chunk("fine"), finish_chunk("stop")];
            paced(vec![sse_text(&events, true)], Duration::ZERO, false)
        }
    })
    .await;
    let client = client_with(&base, |c| c.idle_timeout = Duration::from_millis(300));
    let deltas = Deltas::default();
    let response = stream(&client, &deltas).await.unwrap();
    assert_eq!(response.content, "fine");
    assert_eq!(
        response.reasoning, None,
        "the failed attempt's reasoning is gone"
    );
    assert_eq!(deltas.all(), ["fine"]);
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

// ---- broken streams ----

#[tokio::test]
async fn a_stream_cut_before_any_text_is_retried() {
    let cut = sse(
        &[json!({"choices": [{"delta": {"role": "assistant"}}]})],
        false,
    );
    let server = serve_then(
        cut,
        1,
        sse(&[text_chunk("whole"), finish_chunk("stop")], true),
    )
    .await;
    let deltas = Deltas::default();
    let response = stream(&client(&server), &deltas).await.unwrap();
    assert_eq!(response.content, "whole");
    assert_eq!(requests(&server).await, 2);

    // Cut every time: the retries run out.
    let server = serve(sse(&[], false)).await;
    let error = stream(&client_with(&server.uri(), |c| c.max_retries = 1), &deltas)
        .await
        .unwrap_err();
    assert_eq!(
        error,
        ModelError::StreamBroken {
            attempts: 2,
            reason: "the stream ended before the answer was complete".to_owned()
        }
    );
    assert!(error.retry_can_help());
    assert_eq!(requests(&server).await, 2);
}

/// LiteLLM's proxy with keep-alive pings: a rate limit is a 200 stream of `: ping`
/// comments and an error chunk whose code is the status, as a string.
fn litellm_rate_limit() -> ResponseTemplate {
    let error = json!({"error": {
        "message": "litellm.RateLimitError: Rate limit reached for gpt-4o. Please try again in 2s.",
        "type": "None", "param": "None", "code": "429"
    }});
    ResponseTemplate::new(200).set_body_raw(
        format!(": ping\n\n: ping - 2025-01-01 00:00:00\n\ndata: {error}\n\n"),
        "text/event-stream",
    )
}

#[tokio::test]
async fn an_error_chunk_naming_429_is_a_rate_limit_and_retried() {
    let answer = sse(&[text_chunk("after"), finish_chunk("stop")], true);
    let server = serve_then(litellm_rate_limit(), 1, answer).await;
    let deltas = Deltas::default();
    let response = stream(&client(&server), &deltas).await.unwrap();
    assert_eq!(response.content, "after");
    assert_eq!(deltas.all(), ["after"]);
    assert_eq!(requests(&server).await, 2);

    let server = serve(litellm_rate_limit()).await;
    let error = stream(&client(&server), &deltas).await.unwrap_err();
    assert_eq!(
        error,
        ModelError::RateLimited {
            attempts: 4,
            detail:
                "litellm.RateLimitError: Rate limit reached for gpt-4o. Please try again in 2s."
                    .to_owned()
        }
    );
    assert_eq!(requests(&server).await, 4);
}

#[tokio::test]
async fn error_chunks_count_like_the_status_they_name() {
    let chunk = |error: Value| sse(&[json!({ "error": error })], false);
    let deltas = Deltas::default();
    // A numeric 401: not retried.
    let server = serve(chunk(
        json!({"message": "No api key passed in.", "code": 401}),
    ))
    .await;
    let error = stream(&client(&server), &deltas).await.unwrap_err();
    assert_eq!(
        error,
        ModelError::Unauthorized {
            status: 401,
            detail: "No api key passed in.".to_owned()
        }
    );
    assert_eq!(requests(&server).await, 1);
    // A named code: the context is full, not retried.
    let server = serve(chunk(json!({
        "message": "This model's maximum context length is 8192 tokens.",
        "code": "context_length_exceeded"
    })))
    .await;
    let error = stream(&client(&server), &deltas).await.unwrap_err();
    assert!(
        matches!(error, ModelError::ContextTooLong { status: 400, .. }),
        "{error:?}"
    );
    assert_eq!(requests(&server).await, 1);
    // No status at all: a broken stream, retried.
    let server = serve(chunk(
        json!({"message": "upstream hiccup", "type": "server_error"}),
    ))
    .await;
    let error = stream(&client_with(&server.uri(), |c| c.max_retries = 1), &deltas)
        .await
        .unwrap_err();
    assert_eq!(
        error,
        ModelError::StreamBroken {
            attempts: 2,
            reason: "the model endpoint sent an error: upstream hiccup".to_owned()
        }
    );
    assert_eq!(requests(&server).await, 2);
    assert!(deltas.all().is_empty());
}

#[tokio::test]
async fn an_error_after_text_interrupts_with_the_text_shown() {
    let server = serve(sse(
        &[
            text_chunk("The answer is"),
            json!({"error": {"message": "overloaded", "code": 503}}),
        ],
        false,
    ))
    .await;
    let deltas = Deltas::default();
    let error = stream(&client(&server), &deltas).await.unwrap_err();
    assert_eq!(
        error,
        ModelError::Interrupted {
            shown: "The answer is".to_owned(),
            reason: "HTTP 503: overloaded".to_owned()
        }
    );
    assert_eq!(error.shown_text(), Some("The answer is"));
    assert_eq!(deltas.all(), ["The answer is"]);
    assert_eq!(requests(&server).await, 1, "a retry would repeat the text");
    let message = error.user_message();
    assert!(message.starts_with("The answer is\n\n⚠️"), "{message}");
    assert!(message.contains("broke off"), "{message}");
    assert!(message.contains("again to get a full answer"), "{message}");
    assert!(
        !error.to_string().contains("The answer is"),
        "no answer text in logs"
    );
}

// ---- provider errors ----

#[tokio::test]
async fn the_providers_reason_is_kept_masked_and_short() {
    // LiteLLM's answer to a missing key.
    let server = serve(ResponseTemplate::new(401).set_body_json(json!({"error": {
        "message": "Authentication Error, No api key passed in.",
        "type": "auth_error", "param": "None", "code": "401"
    }})))
    .await;
    let error = fail(&client(&server)).await;
    assert_eq!(
        error,
        ModelError::Unauthorized {
            status: 401,
            detail: "Authentication Error, No api key passed in.".to_owned()
        }
    );
    assert!(
        error
            .to_string()
            .ends_with(": Authentication Error, No api key passed in.")
    );
    let message = error.user_message();
    assert!(
        message.contains(
            "The provider says: Authentication Error, No api key passed in. The operator"
        ),
        "{message}"
    );
    assert!(!message.contains(".."), "{message}");
    assert!(
        !message.to_lowercase().contains("send your message again"),
        "{message}"
    );

    // A long, multi-line message quoting the key.
    let long = format!(
        "Invalid request:\n  the key {KEY} was\tgiven, and {}",
        "more words follow here ".repeat(30)
    );
    let server =
        serve(ResponseTemplate::new(400).set_body_json(json!({"error": {"message": long}}))).await;
    let error = fail(&client(&server)).await;
    let ModelError::BadRequest {
        status: 400,
        detail,
    } = &error
    else {
        panic!("expected BadRequest, got {error:?}");
    };
    assert!(
        detail.starts_with("Invalid request: the key *** was given, and more words"),
        "{detail}"
    );
    assert!(!detail.contains(KEY) && !detail.contains('\n') && !detail.contains('\t'));
    assert!(detail.chars().count() <= DETAIL_MAX_CHARS + 1, "{detail}");
    let last_word = detail
        .trim_end_matches('…')
        .rsplit(' ')
        .next()
        .unwrap_or_default();
    assert!(
        ["more", "words", "follow", "here"].contains(&last_word),
        "{detail}"
    );
    assert!(error.user_message().contains(detail.as_str()));
    assert!(!error.user_message().contains(KEY));
}

#[tokio::test]
async fn a_full_context_is_its_own_error() {
    for body in [
        json!({"error": {"message": "Please reduce the length of the messages.", "code": "context_length_exceeded"}}),
        json!({"error": {"message": "This model's maximum context length is 128000 tokens."}}),
    ] {
        let server = serve(ResponseTemplate::new(400).set_body_json(body)).await;
        let error = fail(&client(&server)).await;
        assert!(
            matches!(error, ModelError::ContextTooLong { status: 400, .. }),
            "{error:?}"
        );
        assert!(error.user_message().contains("too long for the model"));
        assert!(error.user_message().contains("/new"));
        assert!(!error.retry_can_help());
        assert_eq!(requests(&server).await, 1);
    }
}

#[tokio::test]
async fn an_empty_quota_is_not_retried() {
    let server = serve(ResponseTemplate::new(429).set_body_json(json!({"error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota", "code": "insufficient_quota"
    }})))
    .await;
    let error = fail(&client(&server)).await;
    assert!(
        matches!(error, ModelError::QuotaExceeded { status: 429, .. }),
        "{error:?}"
    );
    assert_eq!(requests(&server).await, 1);
    let message = error.user_message();
    assert!(message.contains("billing"), "{message}");
    assert!(
        !message.to_lowercase().contains("send your message again"),
        "{message}"
    );
}

#[tokio::test]
async fn an_error_in_a_2xx_body_counts_like_its_status() {
    let server = serve_then(
        ResponseTemplate::new(200)
            .set_body_json(json!({"error": {"message": "busy", "code": "429"}})),
        1,
        answer("ok"),
    )
    .await;
    let response = client(&server).complete(&request(), None).await.unwrap();
    assert_eq!(response.content, "ok");
    assert_eq!(requests(&server).await, 2);
}

// ---- Retry-After and size limits ----

#[test]
fn retry_after_reads_dates_and_milliseconds() {
    let headers = |pairs: &[(&'static str, String)]| {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().unwrap());
        }
        retry_after(&headers)
    };
    let in_30s = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
    let wait = headers(&[("retry-after", in_30s)]).unwrap();
    assert!(
        (Duration::from_secs(20)..=Duration::from_secs(30)).contains(&wait),
        "{wait:?}"
    );
    assert_eq!(
        headers(&[("retry-after-ms", "1500".into())]),
        Some(Duration::from_millis(1500))
    );
    // The milliseconds are the more precise of the two.
    assert_eq!(
        headers(&[
            ("retry-after-ms", "250".into()),
            ("retry-after", "1".into())
        ]),
        Some(Duration::from_millis(250))
    );
    assert_eq!(headers(&[("retry-after", "soon".into())]), None);
    assert_eq!(headers(&[]), None);
    // Whatever the server asks, the wait is capped at backoff_max.
    let client = client_with("http://h", |c| c.backoff_max = Duration::from_millis(1000));
    assert_eq!(
        client.backoff(1, Some(Duration::from_secs(30))),
        Duration::from_millis(1000)
    );
}

#[test]
fn litellm_forwarded_retry_after_is_read() {
    // LiteLLM passes the provider's response headers on with an `llm_provider-` prefix.
    let headers = |pairs: &[(&'static str, &'static str)]| {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().unwrap());
        }
        retry_after(&headers)
    };
    assert_eq!(
        headers(&[("llm_provider-retry-after", "2")]),
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        headers(&[("llm_provider-retry-after-ms", "1500")]),
        Some(Duration::from_millis(1500))
    );
    assert_eq!(
        headers(&[
            ("llm_provider-retry-after-ms", "250"),
            ("llm_provider-retry-after", "1")
        ]),
        Some(Duration::from_millis(250))
    );
    // The proxy's own header wins over the forwarded one.
    assert_eq!(
        headers(&[("retry-after", "3"), ("llm_provider-retry-after", "1")]),
        Some(Duration::from_secs(3))
    );
    assert_eq!(headers(&[("llm_provider-retry-after", "soon")]), None);
}

#[tokio::test]
async fn litellm_forwarded_retry_after_delays_the_retry() {
    let server = serve_then(
        ResponseTemplate::new(429).insert_header("llm_provider-retry-after", "2"),
        1,
        answer("done"),
    )
    .await;
    let client = client_with(&server.uri(), |c| c.backoff_max = Duration::from_secs(5));
    let started = std::time::Instant::now();
    assert_eq!(
        client.complete(&request(), None).await.unwrap().content,
        "done"
    );
    // A lower bound only: the retry waited at least what the provider asked.
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(requests(&server).await, 2);
}

#[tokio::test]
async fn retry_after_ms_is_honoured() {
    let server = serve_then(
        ResponseTemplate::new(429).insert_header("retry-after-ms", "10"),
        1,
        answer("done"),
    )
    .await;
    let client = client_with(&server.uri(), |c| c.backoff_max = Duration::from_secs(5));
    assert_eq!(
        client.complete(&request(), None).await.unwrap().content,
        "done"
    );
    assert_eq!(requests(&server).await, 2);
}

#[tokio::test]
async fn oversized_answers_are_refused() {
    // A non-streamed body over 8 MiB.
    let big = format!(
        r#"{{"choices": [{{"message": {{"content": "{}"}}, "finish_reason": "stop"}}]}}"#,
        "a".repeat(BODY_MAX_BYTES)
    );
    let server = serve(ResponseTemplate::new(200).set_body_raw(big, "application/json")).await;
    let error = fail(&client(&server)).await;
    assert_eq!(
        error,
        ModelError::InvalidResponse("the answer is larger than 8 MiB".into())
    );
    assert_eq!(requests(&server).await, 1);

    let deltas = Deltas::default();
    // One line over 1 MiB.
    let line = format!("data: {}\n\n", "x".repeat(SSE_LINE_MAX_BYTES + 1));
    let server = serve(ResponseTemplate::new(200).set_body_raw(line, "text/event-stream")).await;
    let error = stream(&client(&server), &deltas).await.unwrap_err();
    assert_eq!(
        error,
        ModelError::InvalidResponse("a stream line is longer than 1 MiB".into())
    );
    // Over 16 MiB in all, in lines that are each fine.
    let comment = format!(": {}\n", "p".repeat(1024));
    let body = comment.repeat(STREAM_MAX_BYTES / comment.len() + 2);
    let server = serve(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")).await;
    let error = stream(&client(&server), &deltas).await.unwrap_err();
    assert_eq!(
        error,
        ModelError::InvalidResponse("the stream is longer than 16 MiB".into())
    );
    assert!(deltas.all().is_empty());
}

// ---- response shapes ----

#[tokio::test]
async fn same_index_with_a_new_id_is_a_new_call() {
    let fragment = |id: Option<&str>, name: Option<&str>, args: &str| {
        let mut f = json!({"index": 0, "function": {"arguments": args}});
        if let Some(id) = id {
            f["id"] = json!(id);
        }
        if let Some(name) = name {
            f["function"]["name"] = json!(name);
        }
        json!({"choices": [{"delta": {"tool_calls": [f]}}]})
    };
    let server = serve(sse(
        &[
            fragment(Some("call_1"), Some("ls"), "{\"dir\":"),
            fragment(None, None, "\"/\"}"),
            // Repeating the same id continues the call.
            fragment(Some("call_1"), None, ""),
            fragment(Some("call_2"), Some("read_file"), "{\"path\":"),
            fragment(None, None, "\"a\"}"),
            finish_chunk("tool_calls"),
        ],
        true,
    ))
    .await;
    let deltas = Deltas::default();
    let response = stream(&client(&server), &deltas).await.unwrap();
    assert_eq!(
        response.tool_calls,
        [
            call("call_1", "ls", r#"{"dir":"/"}"#),
            call("call_2", "read_file", r#"{"path":"a"}"#)
        ]
    );
}

#[tokio::test]
async fn array_content_is_read_in_messages_and_deltas() {
    let server = serve(ResponseTemplate::new(200).set_body_json(json!({
        "choices": [{"message": {"role": "assistant", "content": [
            {"type": "text", "text": "Hello "},
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            {"type": "text", "text": "there"}
        ]}, "finish_reason": "stop"}]
    })))
    .await;
    let response = client(&server).complete(&request(), None).await.unwrap();
    assert_eq!(response.content, "Hello there");

    let server = serve(sse(
        &[
            json!({"choices": [{"delta": {"content": [{"type": "text", "text": "Hi"}]}}]}),
            json!({"choices": [{"delta": {"content": [{"type": "text", "text": "!"}]}}]}),
            finish_chunk("stop"),
        ],
        true,
    ))
    .await;
    let deltas = Deltas::default();
    let response = stream(&client(&server), &deltas).await.unwrap();
    assert_eq!(response.content, "Hi!");
    assert_eq!(deltas.all(), ["Hi", "!"]);
}

#[tokio::test]
async fn length_and_content_filter_come_through() {
    for (raw, expected) in [
        ("length", FinishReason::Length),
        ("content_filter", FinishReason::ContentFilter),
    ] {
        let server = serve(ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {"content": "cut"}, "finish_reason": raw}]
        })))
        .await;
        let response = client(&server).complete(&request(), None).await.unwrap();
        assert_eq!(response.finish_reason, expected);

        let server = serve(sse(&[text_chunk("cut"), finish_chunk(raw)], true)).await;
        let response = stream(&client(&server), &Deltas::default()).await.unwrap();
        assert_eq!(response.finish_reason, expected);
        assert_eq!(response.content, "cut");
    }
}

#[tokio::test]
async fn stream_usage_can_be_turned_off() {
    let server = serve(sse(&[text_chunk("x"), finish_chunk("stop")], true)).await;
    let client = client_with(&server.uri(), |c| c.stream_usage = false);
    stream(&client, &Deltas::default()).await.unwrap();
    let sent = first_body(&server).await;
    assert_eq!(sent["stream"], true);
    assert!(sent.get("stream_options").is_none(), "{sent}");
}

// ---- reasoning ----

#[tokio::test]
async fn streamed_reasoning_never_reaches_the_sink() {
    // DeepSeek's reasoning_content, OpenRouter's reasoning, and a <think> block in the
    // content, its tags split across chunks.
    let content = "<think>The user greets; greet back.</think>\n\nHello!";
    let mut events = vec![
        json!({"choices": [{"delta": {"role": "assistant", "content": null, "reasoning_content": "Step one. "}}]}),
        json!({"choices": [{"delta": {"reasoning": "Step two. "}}]}),
        // vLLM sends both names with the same text: it counts once.
        json!({"choices": [{"delta": {"reasoning_content": "Step three. ", "reasoning": "Step three. "}}]}),
    ];
    let bytes: Vec<char> = content.chars().collect();
    for piece in bytes.chunks(3) {
        events.push(text_chunk(&piece.iter().collect::<String>()));
    }
    events.push(finish_chunk("stop"));
    let server = serve(sse(&events, true)).await;
    let deltas = Deltas::default();
    let response = stream(&client(&server), &deltas).await.unwrap();
    assert_eq!(response.content, "Hello!");
    assert_eq!(deltas.all().concat(), "Hello!");
    assert_eq!(
        response.reasoning.as_deref(),
        Some("Step one. Step two. Step three. The user greets; greet back.")
    );
}

#[tokio::test]
async fn reasoning_in_a_whole_message_is_kept_apart() {
    let server = serve(ResponseTemplate::new(200).set_body_json(json!({
        "choices": [{"message": {
            "role": "assistant",
            "reasoning_content": "Think first.",
            "content": "<think>\nAnd more.\n</think>\nThe answer."
        }, "finish_reason": "stop"}]
    })))
    .await;
    let deltas = Deltas::default();
    let sink = |t: &str| deltas.push(t);
    let client = client_with(&server.uri(), |c| c.stream = false);
    let response = client.complete(&request(), Some(&sink)).await.unwrap();
    assert_eq!(response.content, "The answer.");
    assert_eq!(deltas.all(), ["The answer."]);
    assert_eq!(
        response.reasoning.as_deref(),
        Some("Think first.\nAnd more.")
    );

    // No reasoning: none at all.
    let server = serve(answer("plain")).await;
    let response = client_with(&server.uri(), |_| {})
        .complete(&request(), None)
        .await
        .unwrap();
    assert_eq!(response.reasoning, None);
}

// ---- request shape ----

#[tokio::test]
async fn images_go_as_content_parts_and_reasoning_stays_home() {
    let server = serve(answer("seen")).await;
    let request = ModelRequest {
        messages: vec![
            ChatMessage::user("earlier"),
            ChatMessage::Assistant {
                content: "Earlier answer.".into(),
                tool_calls: Vec::new(),
                reasoning: Some("private thoughts".into()),
            },
            ChatMessage::User {
                content: "What is in these?".into(),
                parts: vec![
                    ContentPart::Image {
                        url: "https://example.com/a.png".into(),
                    },
                    ContentPart::Text {
                        text: "and this one:".into(),
                    },
                    ContentPart::Image {
                        url: "data:image/png;base64,iVBORw0KGgo=".into(),
                    },
                ],
                authored: None,
            },
        ],
        tools: Vec::new(),
    };
    client(&server).complete(&request, None).await.unwrap();
    let sent = first_body(&server).await;
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "user", "content": "earlier"},
            {"role": "assistant", "content": "Earlier answer."},
            {"role": "user", "content": [
                {"type": "text", "text": "What is in these?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "text", "text": "and this one:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
            ]}
        ])
    );
    assert!(!sent.to_string().contains("private thoughts"));
}

#[test]
fn sse_lines_are_limited() {
    let mut parser = SseParser::default();
    let half = vec![b'x'; SSE_LINE_MAX_BYTES / 2];
    assert!(parser.push(b"data: ").unwrap().is_empty());
    assert!(parser.push(&half).unwrap().is_empty());
    assert!(parser.push(&half).is_err(), "the line grew past the limit");
    // Also when the whole line arrives in one piece.
    let mut line = b"data: ".to_vec();
    line.extend(vec![b'x'; SSE_LINE_MAX_BYTES]);
    line.extend(b"\n\n");
    assert!(SseParser::default().push(&line).is_err());
    assert_eq!(SseParser::default().push(b"data: ok\n\n").unwrap(), ["ok"]);
}
