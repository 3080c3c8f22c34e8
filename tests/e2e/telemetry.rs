//! OpenTelemetry traces: `antler serve` (the real binary, whose log subscriber carries the
//! tracing layer) exports to a test OTLP collector on 127.0.0.1, which decodes the protobuf
//! posts. One message makes one trace: accept, turn, model calls, the tool call and the
//! delivery attempt, with the trace id the turn's log lines carry.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::json;

use crate::support::{Behaviour, Child, ChildRig, MockModel, Step, sigterm, wait_until};

/// One span as the collector received it.
#[derive(Debug, Clone)]
struct Received {
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: Vec<(String, String)>,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

type Spans = Arc<Mutex<Vec<Received>>>;

/// A collector accepting OTLP over HTTP (protobuf) at `/v1/traces`; returns its base URL.
async fn collector() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let app = axum::Router::new()
        .route("/v1/traces", post(receive))
        .with_state(Arc::clone(&spans));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}"), spans)
}

async fn receive(
    State(spans): State<Spans>,
    body: Bytes,
) -> ([(&'static str, &'static str); 1], Vec<u8>) {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf request");
    let mut received = spans.lock().unwrap();
    for resource in request.resource_spans {
        for scope in resource.scope_spans {
            for span in scope.spans {
                let attributes = span
                    .attributes
                    .iter()
                    .map(|kv| {
                        let value = kv
                            .value
                            .as_ref()
                            .and_then(|v| v.value.as_ref())
                            .map(|v| format!("{v:?}"))
                            .unwrap_or_default();
                        (kv.key.clone(), value)
                    })
                    .collect();
                received.push(Received {
                    name: span.name.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    attributes,
                });
            }
        }
    }
    (
        [("content-type", "application/x-protobuf")],
        // An empty ExportTraceServiceResponse: everything accepted.
        Vec::new(),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_makes_one_trace_from_accept_to_delivery() {
    let (endpoint, spans) = collector().await;
    let mock = MockModel::start(Behaviour::Script(vec![
        Step::call("current_time", json!({})),
        Step::text("It is tea time."),
    ]))
    .await;
    let rig = ChildRig::new(
        &mock,
        &format!(
            "[telemetry]\notlp_endpoint = \"{endpoint}\"\ntrace_url = \"https://tempo.example/trace/{{trace_id}}\"\n"
        ),
    );
    let mut child = Child::serve_with_env(
        &rig.config,
        rig.port,
        &rig.log,
        // Exported every 100 ms rather than every 5 s.
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("RUST_LOG", "info,antler=debug"),
        ],
    )
    .await;
    let answer = child.client.ask("otel", "what time is it?").await;
    assert_eq!(answer.json["reply"], "It is tea time.", "{}", answer.text);

    // The accept span's trace holds the whole message.
    let trace = wait_until("the message's spans reach the collector", || {
        let spans = Arc::clone(&spans);
        async move {
            let spans = spans.lock().unwrap().clone();
            let accept = spans.iter().find(|s| {
                s.name == "accept"
                    && s.attribute("conversation")
                        .is_some_and(|c| c.contains("otel"))
            })?;
            let mine: Vec<Received> = spans
                .iter()
                .filter(|s| s.trace_id == accept.trace_id)
                .cloned()
                .collect();
            let has = |name: &str| mine.iter().any(|s| s.name == name);
            (has("turn") && has("model_call") && has("tool_call") && has("delivery"))
                .then(|| (accept.clone(), mine))
        }
    })
    .await;
    let (accept, mine) = trace;
    assert_eq!(accept.trace_id.len(), 32);
    assert_ne!(accept.trace_id, "0".repeat(32));
    let named = |name: &str| -> Vec<&Received> { mine.iter().filter(|s| s.name == name).collect() };
    let turn = named("turn");
    assert_eq!(turn.len(), 1, "{mine:#?}");
    assert_eq!(
        turn[0].parent, accept.span_id,
        "the turn is a child of the accept span"
    );
    let calls = named("model_call");
    assert_eq!(
        calls.len(),
        2,
        "a call for the tool, one for the answer: {mine:#?}"
    );
    for call in &calls {
        assert_eq!(call.parent, turn[0].span_id, "{call:?}");
        for key in [
            "model",
            "prompt_tokens",
            "completion_tokens",
            "latency_ms",
            "retries",
        ] {
            assert!(call.attribute(key).is_some(), "{key} on {call:?}");
        }
    }
    let tool = named("tool_call");
    assert_eq!(tool.len(), 1, "{mine:#?}");
    assert!(
        tool[0]
            .attribute("tool")
            .is_some_and(|t| t.contains("current_time")),
        "{tool:?}"
    );
    assert!(
        tool[0]
            .attribute("outcome")
            .is_some_and(|o| o.contains("ok")),
        "{tool:?}"
    );
    let delivery = named("delivery");
    assert!(!delivery.is_empty());
    assert_eq!(
        delivery[0].parent, accept.span_id,
        "delivery hangs off the accept span"
    );
    assert!(
        delivery[0]
            .attribute("outcome")
            .is_some_and(|o| o.contains("sent")),
        "{delivery:?}"
    );
    // Nothing of the message's text is in the spans.
    assert!(
        !format!("{mine:?}").contains("what time is it"),
        "no message text in spans: {mine:#?}"
    );

    // `/status` shows the last turn's trace id, linked.
    let status = child.client.ask("otel", "/status").await;
    let reply = status.json["reply"].as_str().unwrap_or_default().to_owned();
    assert!(
        reply.contains(&format!("https://tempo.example/trace/{}", accept.trace_id)),
        "{reply}"
    );

    let exit = sigterm(&mut child.process).await;
    assert!(exit.success(), "antler exited with {exit}");
    // The turn's log lines carry the same id.
    let log = child.log_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains(&format!("trace={}", accept.trace_id)))
        .collect();
    assert!(
        lines.iter().any(|line| line.contains("turn{")),
        "a log line of the turn names the trace id {}:\n{log}",
        accept.trace_id
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_task_is_a_span_in_its_messages_trace() {
    let (endpoint, spans) = collector().await;
    let mock = MockModel::start(Behaviour::Delegate(vec!["alpha facts".to_owned()])).await;
    let rig = ChildRig::new(
        &mock,
        &format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\n"),
    );
    let mut child = Child::serve_with_env(
        &rig.config,
        rig.port,
        &rig.log,
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    )
    .await;
    let answer = child.client.ask("otel-task", "research alpha").await;
    assert!(
        answer.json["reply"]
            .as_str()
            .is_some_and(|r| r.contains("alpha facts")),
        "{}",
        answer.text
    );
    let mine = wait_until("the task's spans reach the collector", || {
        let spans = Arc::clone(&spans);
        async move {
            let spans = spans.lock().unwrap().clone();
            let accept = spans.iter().find(|s| {
                s.name == "accept"
                    && s.attribute("conversation")
                        .is_some_and(|c| c.contains("otel-task"))
            })?;
            let mine: Vec<Received> = spans
                .iter()
                .filter(|s| s.trace_id == accept.trace_id)
                .cloned()
                .collect();
            let has = |name: &str| mine.iter().any(|s| s.name == name);
            (has("subagent") && has("delivery")).then_some(mine)
        }
    })
    .await;
    let subagent = mine.iter().find(|s| s.name == "subagent").unwrap();
    assert!(
        subagent
            .attribute("task")
            .is_some_and(|t| t.contains("task_")),
        "{subagent:?}"
    );
    // The `task` tool call holds it, and the subagent's own model calls are inside it.
    let task_call = mine
        .iter()
        .find(|s| s.name == "tool_call" && s.attribute("tool").is_some_and(|t| t.contains("task")))
        .unwrap();
    assert_eq!(subagent.parent, task_call.span_id, "{mine:#?}");
    assert!(
        mine.iter()
            .any(|s| s.name == "model_call" && s.parent == subagent.span_id),
        "{mine:#?}"
    );
    let exit = sigterm(&mut child.process).await;
    assert!(exit.success(), "antler exited with {exit}");
}
