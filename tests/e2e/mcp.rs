//! MCP end to end: a stdio MCP server (`examples/mcp_test_server.rs`) configured in
//! `[[mcp.servers]]`, its tools deferred behind `tool_search`, found, offered, and called by
//! the scripted mock model; a server that cannot start is reported in `/readyz` and antler
//! answers anyway.

use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::Value;

use crate::support::{Behaviour, MockModel, TestApp};

/// The test MCP server binary. `cargo test` builds the examples; a narrower run
/// (`cargo test --test e2e`) may not have, so it is built once here when missing.
fn test_server() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        // target/<profile>/deps/e2e-<hash> → target/<profile>/examples/mcp_test_server
        let profile = exe.parent().and_then(|deps| deps.parent()).unwrap();
        let path = profile.join("examples").join("mcp_test_server");
        if !path.exists() {
            let status = std::process::Command::new(env!("CARGO"))
                .args(["build", "--example", "mcp_test_server"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("run cargo build --example mcp_test_server");
            assert!(status.success(), "building the MCP test server failed");
        }
        assert!(path.exists(), "{} is missing", path.display());
        path
    })
    .clone()
}

fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_deferred_mcp_tool_is_found_offered_and_called() {
    let mock = MockModel::start(Behaviour::TurnScript(vec![
        (
            "tool_search".to_owned(),
            r#"{"query": "add numbers"}"#.to_owned(),
        ),
        (
            "mcp__test__add".to_owned(),
            r#"{"a": 2, "b": 40}"#.to_owned(),
        ),
    ]))
    .await;
    // MCP tools are admin-only by default; this operator opens them to users (the loopback
    // API's user is not an admin).
    let overrides = format!(
        "[agent.middleware.deferred_tools]\nmax_tools = 3\n\n\
         [agent.middleware.guardrail]\nadmin_only = [\"bash\", \"write_file\", \"str_replace\"]\n\n\
         [[mcp.servers]]\nname = \"test\"\ncommand = {:?}\n",
        test_server().display().to_string()
    );
    let app = TestApp::spawn(&mock, &overrides).await;

    let answer = app.ask("mcp", "what is 2 + 40?").await;
    assert_eq!(answer.json["reply"], "done: 42", "{}", answer.text);

    let requests = mock.requests();
    assert_eq!(requests.len(), 3, "search, call, answer");
    let first = tool_names(&requests[0].body);
    assert!(first.contains(&"tool_search".to_owned()), "{first:?}");
    assert!(first.contains(&"current_time".to_owned()), "{first:?}");
    assert!(
        !first.iter().any(|name| name.starts_with("mcp__")),
        "MCP tools are deferred: {first:?}"
    );

    let second = tool_names(&requests[1].body);
    assert!(second.contains(&"mcp__test__add".to_owned()), "{second:?}");
    assert!(
        !second.contains(&"mcp__test__fail".to_owned()),
        "only what the search found: {second:?}"
    );
    let found = requests[1].messages().last().cloned().unwrap();
    assert_eq!(found["role"], "tool");
    let found: Value = serde_json::from_str(found["content"].as_str().unwrap()).unwrap();
    assert_eq!(found["tools"][0]["name"], "mcp__test__add", "{found}");
    assert_eq!(
        found["tools"][0]["parameters"]["required"],
        serde_json::json!(["a", "b"])
    );

    let result = requests[2].messages().last().cloned().unwrap();
    assert_eq!(result["role"], "tool");
    assert_eq!(result["content"], "42");
    assert_eq!(result["tool_call_id"], "call_script_1");

    let ready = app.get("/readyz").await;
    assert_eq!(ready.status, 200);
    assert_eq!(
        ready.json["mcp"],
        serde_json::json!([{"name": "test", "transport": "stdio", "ok": true, "tools": 4}])
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_server_that_cannot_start_is_reported_and_antler_still_answers() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let overrides = "[[mcp.servers]]\nname = \"broken\"\ncommand = \"/nonexistent/mcp-server\"\n\
                     env = { TOKEN = \"very-secret-token\" }\n";
    let app = TestApp::spawn(&mock, overrides).await;

    let ready = app.get("/readyz").await;
    assert_eq!(
        ready.status, 200,
        "one broken MCP server is not a broken gateway"
    );
    assert_eq!(ready.json["ready"], true);
    let mcp = &ready.json["mcp"][0];
    assert_eq!(mcp["name"], "broken");
    assert_eq!(mcp["ok"], false);
    assert_eq!(mcp["tools"], 0);
    assert!(
        mcp["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("cannot start the command")),
        "{mcp}"
    );
    assert!(!ready.text.contains("very-secret-token"), "{}", ready.text);

    let answer = app.ask("hello", "are you there?").await;
    assert_eq!(answer.json["reply"], "echo: are you there?");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_starts_each_server_and_lists_its_tools() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("antler.toml");
    std::fs::write(
        &config,
        crate::support::config_text(
            &mock.base_url(),
            &dir.path().join("store"),
            &format!(
                "[server]\nlisten = \"127.0.0.1:{}\"\n\
                 [[mcp.servers]]\nname = \"test\"\ncommand = {:?}\n\
                 [[mcp.servers]]\nname = \"broken\"\ncommand = \"/nonexistent/mcp-server\"\n",
                crate::support::free_port(),
                test_server().display().to_string()
            ),
        ),
    )
    .unwrap();
    let (code, stdout, _) =
        crate::support::run_binary(&["doctor", "--config", config.to_str().unwrap()]).await;
    // A server that cannot start is a warning: antler serves without it.
    assert_eq!(code, Some(0), "{stdout}");
    let ok = stdout
        .lines()
        .find(|l| l.starts_with("ok    mcp") && l.contains("test (stdio): "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(ok.ends_with(" tools") && !ok.contains(": 0 tools"), "{ok}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("warn  mcp") && l.contains("broken (stdio)")),
        "{stdout}"
    );
    assert!(
        stdout.contains("antler serves without its tools"),
        "{stdout}"
    );
}
