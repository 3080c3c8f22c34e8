//! The runtime's tool seams through the whole app: real HTTP to the API channel, a wiremock
//! model, and tools only the tests register (one that meets its siblings, one that never
//! ends, one that reports its folder).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Barrier;
use wiremock::matchers::{body_string_contains, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::serve_with_tools;
use crate::agent::model::ToolSpec;
use crate::agent::tools::{Tool, ToolContext, ToolError};
use crate::config::Config;

fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: format!("test tool {name}"),
        parameters: json!({"type": "object"}),
    }
}

/// Waits until three calls of it are running at once: it can only succeed if the calls of
/// one response run concurrently (no clock involved).
struct Meet(Arc<Barrier>);

#[async_trait::async_trait]
impl Tool for Meet {
    fn spec(&self) -> ToolSpec {
        spec("meet")
    }

    async fn call(&self, _: Value, cx: &ToolContext) -> Result<String, ToolError> {
        (cx.progress)("waiting for the others");
        self.0.wait().await;
        Ok("met the other two".to_owned())
    }
}

/// Never ends.
struct Stall;

#[async_trait::async_trait]
impl Tool for Stall {
    fn spec(&self) -> ToolSpec {
        spec("stall")
    }

    async fn call(&self, _: Value, _: &ToolContext) -> Result<String, ToolError> {
        std::future::pending().await
    }
}

/// Reports its thread's workspace, if it exists.
struct Where;

#[async_trait::async_trait]
impl Tool for Where {
    fn spec(&self) -> ToolSpec {
        spec("where")
    }

    async fn call(&self, _: Value, cx: &ToolContext) -> Result<String, ToolError> {
        let workspace = cx.folders.workspace();
        if !workspace.is_dir() {
            return Err(ToolError::Failed("no workspace".to_owned()));
        }
        Ok(format!("{} for {}", workspace.display(), cx.author.user_id))
    }
}

fn completion(message: Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }))
}

fn call(id: &str, name: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_run_together_see_their_folder_and_time_out_cleanly() {
    let model = MockServer::start().await;
    // Once the request carries tool results, answer; before that, call five tools at once.
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(body_string_contains(r#""role":"tool""#))
        .respond_with(completion(json!({"role": "assistant", "content": "done"})))
        .with_priority(1)
        .mount(&model)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(completion(json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [
                call("m1", "meet"), call("m2", "meet"), call("m3", "meet"),
                call("s1", "stall"), call("w1", "where"),
            ],
        })))
        .with_priority(5)
        .mount(&model)
        .await;

    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.store.path = dir.path().join("store");
    config.model.base_url = format!("{}/v1", model.uri());
    config.model.model = "test-model".to_owned();
    config.model.stream = false;
    config.agent.tool_timeout_secs = 60;
    config.agent.tool_timeouts = [("stall".to_owned(), 1)].into();
    config.agent.max_parallel_tools = 5;
    config.agent.middleware.title.use_model = false;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(Meet(Arc::new(Barrier::new(3)))),
        Arc::new(Stall),
        Arc::new(Where),
    ];
    let server = tokio::spawn(serve_with_tools(
        config,
        listener,
        async move {
            let _ = stopped.await;
        },
        tools,
    ));

    let http = reqwest::Client::new();
    let answer: Value = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let sent = http
                .post(format!("{base}/api/v1/messages"))
                .json(&json!({"conversation": "tools", "user": "ops", "text": "go", "wait": true}))
                .send()
                .await;
            if let Ok(response) = sent {
                return response.json().await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("an answer within a minute");
    assert_eq!(answer["reply"], "done", "{answer}");

    let thread_id = answer["thread_id"].as_str().unwrap();
    let thread: Value = http
        .get(format!("{base}/api/v1/threads/{thread_id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let results: Vec<(String, String)> = thread["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let ids: Vec<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["m1", "m2", "m3", "s1", "w1"], "results in call order");
    for (id, content) in &results[..3] {
        assert_eq!(content, "met the other two", "{id}: the three ran at once");
    }
    assert!(
        results[3].1.contains("did not finish within 1 seconds"),
        "{}",
        results[3].1
    );
    let workspace = dir
        .path()
        .join("store/threads")
        .join(thread_id)
        .join("workspace");
    assert_eq!(results[4].1, format!("{} for ops", workspace.display()));

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
