//! Loop detection end to end: a model repeating the same tool calls is warned after the third
//! repeat (in the next request, after the tool results) and stopped at the fifth, within one
//! run; the same request in five separate turns is not a loop; one tool called over and over
//! with new arguments is warned and stopped at its per-tool limits.

use crate::support::{Behaviour, MockModel, TestApp};
use serde_json::Value;

/// The texts of src/agent/middleware/loop_detection.rs.
const WARNING: &str = "[LOOP DETECTED] You are repeating the same tool calls. Stop calling tools and answer with what you have, or try a different approach.";
const FORCED_STOP: &str =
    "[FORCED STOP] Repeated tool calls were stopped; answering with what is known so far.";

fn is_warning(message: &Value) -> bool {
    message["role"] == "user"
        && message["content"]
            .as_str()
            .is_some_and(|c| c.contains("[LOOP DETECTED]"))
}

/// Every assistant message with tool calls is followed directly by exactly its tool results.
fn assert_tool_results_follow_calls(messages: &[Value], request: usize) {
    for (i, message) in messages.iter().enumerate() {
        let Some(calls) = message["tool_calls"].as_array() else {
            continue;
        };
        let ids: Vec<&str> = calls.iter().map(|c| c["id"].as_str().unwrap()).collect();
        let following: Vec<&Value> = messages.iter().skip(i + 1).take(ids.len()).collect();
        assert_eq!(
            following.len(),
            ids.len(),
            "request {request}: results missing"
        );
        for (result, id) in following.iter().zip(&ids) {
            assert_eq!(
                result["role"],
                "tool",
                "request {request}: message {} between tool calls and results: {result}",
                i + 1
            );
            assert_eq!(result["tool_call_id"], *id, "request {request}");
        }
    }
}

async fn run(stream: bool) {
    let mock = MockModel::start(Behaviour::Loop).await;
    let overrides = format!("[model]\nstream = {stream}\n[agent]\nmax_iterations = 10\n");
    let app = TestApp::spawn(&mock, &overrides).await;

    let answer = app.ask("loop", "what time is it in London and UTC?").await;
    let reply = answer.json["reply"].as_str().unwrap();
    assert!(reply.contains("[FORCED STOP]"), "{reply}");
    assert_eq!(reply, FORCED_STOP);

    let requests = mock.requests();
    assert_eq!(requests.len(), 5, "stopped at the fifth identical set");
    for (n, request) in requests.iter().enumerate() {
        let messages = request.messages();
        assert_tool_results_follow_calls(&messages, n + 1);
        let warnings = messages.iter().filter(|m| is_warning(m)).count();
        if n == 3 {
            assert_eq!(warnings, 1, "the 4th request carries the warning");
            let last = messages.last().unwrap();
            assert!(is_warning(last), "the warning is the last message: {last}");
            assert_eq!(last["content"], WARNING);
            let before = &messages[messages.len() - 2];
            assert_eq!(
                before["role"], "tool",
                "the warning follows the tool results"
            );
        } else {
            assert_eq!(warnings, 0, "request {} has no warning", n + 1);
        }
        // Requests 2.. end with the previous response's calls and their results.
        if n >= 1 {
            let expected_calls = 2 * n;
            let calls = messages.iter().filter(|m| m["role"] == "tool").count();
            assert_eq!(calls, expected_calls, "request {}", n + 1);
        }
    }

    let thread = app.thread(answer.json["thread_id"].as_str().unwrap()).await;
    let messages = thread["messages"].as_array().unwrap();
    // user, 4 × (assistant with 2 calls + 2 results), the final stripped answer.
    assert_eq!(messages.len(), 1 + 4 * 3 + 1, "{messages:?}");
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "assistant");
    assert!(last["tool_calls"].is_null(), "tool calls stripped: {last}");
    assert_eq!(last["content"], FORCED_STOP);
    assert!(
        !messages.iter().any(is_warning),
        "the warning is not stored in the thread"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_tool_calls_are_warned_then_stopped() {
    run(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_tool_calls_are_warned_then_stopped_when_streaming() {
    run(true).await;
}

/// DeerFlow's false positive (its issue #2511): the same question in five separate turns, each
/// answered with the same tool call and then text, is five normal answers. The window covers
/// one run, so nothing is warned or stopped, and the tool runs every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_request_in_five_separate_turns_is_answered_normally() {
    use crate::support::Step;

    let turn = || {
        [
            Step::call("current_time", serde_json::json!({"utc_offset_minutes": 0})),
            Step::text("It is noon in London."),
        ]
    };
    let mock = MockModel::start(Behaviour::Script((0..5).flat_map(|_| turn()).collect())).await;
    let app = TestApp::spawn(&mock, "").await;

    for n in 1..=5 {
        let answer = app.ask("same", "what time is it in London?").await;
        assert_eq!(
            answer.json["reply"], "It is noon in London.",
            "turn {n}: {}",
            answer.text
        );
    }
    let requests = mock.requests();
    assert_eq!(requests.len(), 10, "two model calls a turn, none cut");
    for (n, request) in requests.iter().enumerate() {
        let messages = request.messages();
        assert!(
            !messages.iter().any(is_warning),
            "request {}: no loop warning",
            n + 1
        );
        assert_tool_results_follow_calls(&messages, n + 1);
        if n % 2 == 1 {
            // The turn's second request ends with this turn's tool result: the tool ran.
            let last = messages.last().unwrap();
            assert_eq!(last["role"], "tool", "request {}: {last}", n + 1);
            assert_eq!(last["tool_call_id"], format!("call_{}", n - 1));
            let content = last["content"].as_str().unwrap();
            assert!(!content.starts_with("Error"), "{content}");
            assert!(!content.contains("[FORCED STOP]"));
        }
    }
    let thread_id = app.ask("same", "/status").await.json["thread_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let thread = app.thread(&thread_id).await;
    let messages = thread["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 5 * 4, "user, call, result, answer per turn");
    assert!(!messages.iter().any(|m| {
        m["content"]
            .as_str()
            .is_some_and(|c| c.contains("[FORCED STOP]"))
    }));
    app.shutdown().await;
}

/// The frequency layer: one tool called with different arguments each time is warned at its
/// configured count and stopped at its limit, within one run; an override sets both per tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tool_called_with_ever_new_arguments_is_warned_then_stopped() {
    let offsets: Vec<(String, String)> = (1..=6)
        .map(|n| {
            (
                "current_time".to_owned(),
                format!(r#"{{"utc_offset_minutes":{}}}"#, n * 60),
            )
        })
        .collect();
    let mock = MockModel::start(Behaviour::TurnScript(offsets)).await;
    let overrides = "[agent]\nmax_iterations = 10\n\
        [agent.middleware.loop_detection]\ntool_freq_overrides = { current_time = { warn = 2, hard_limit = 4 } }\n";
    let app = TestApp::spawn(&mock, overrides).await;

    let answer = app.ask("freq", "the time in six zones, one by one").await;
    let reply = answer.json["reply"].as_str().unwrap();
    assert_eq!(
        reply,
        "[FORCED STOP] current_time was called 4 times in this run, over its limit; answering \
         with what is known so far.",
        "{}",
        answer.text
    );
    let requests = mock.requests();
    assert_eq!(requests.len(), 4, "stopped at the fourth call");
    let frequency_warnings: Vec<usize> = requests
        .iter()
        .map(|r| {
            r.messages()
                .iter()
                .filter(|m| {
                    is_warning(m)
                        && m["content"]
                            .as_str()
                            .is_some_and(|c| c.contains("called current_time 2 times"))
                })
                .count()
        })
        .collect();
    assert_eq!(
        frequency_warnings,
        [0, 0, 1, 0],
        "warned once, after the second call"
    );
    for (n, request) in requests.iter().enumerate() {
        assert_tool_results_follow_calls(&request.messages(), n + 1);
    }
    app.shutdown().await;
}
