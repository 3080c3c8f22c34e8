//! MCP end to end: a stdio MCP server (`examples/mcp_test_server.rs`) configured in
//! `[[mcp.servers]]`, its tools deferred behind `tool_search`, found, offered, and called by
//! the scripted mock model; a server that cannot start is reported in `/readyz` and antler
//! answers anyway; a killed server is restarted (its tools saying so meanwhile); a result over
//! the transport's limit is reported as too large; the servers' arguments never show.

use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::Value;

use crate::support::{Behaviour, MockModel, TestApp, wait_until};

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
        serde_json::json!([{"name": "test", "transport": "stdio", "ok": true, "tools": 5}])
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

/// The ids of the live processes whose command line holds `--tag <tag>` (a zombie's command
/// line is empty).
fn tagged(tag: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            args.windows(2)
                .any(|pair| pair[0] == b"--tag" && pair[1] == tag.as_bytes())
                .then_some(pid)
        })
        .collect()
}

fn kill(pid: i32) {
    let pid = rustix::process::Pid::from_raw(pid).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
}

/// MCP tools open to users and offered at once (not deferred), and the test server named
/// `test` started with `args`.
fn open_server(args: &[&str]) -> String {
    format!(
        "[agent.middleware.deferred_tools]\nenabled = false\n\n\
         [agent.middleware.guardrail]\nadmin_only = [\"bash\", \"write_file\", \"str_replace\"]\n\n\
         [[mcp.servers]]\nname = \"test\"\ncommand = {:?}\nargs = {args:?}\n",
        test_server().display().to_string()
    )
}

#[tokio::test]
async fn a_killed_server_is_restarted_and_its_tools_say_so_meanwhile() {
    let mock = MockModel::start(Behaviour::TurnScript(vec![(
        "mcp__test__add".to_owned(),
        r#"{"a": 2, "b": 40}"#.to_owned(),
    )]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("refuse");
    let gate_arg = gate.display().to_string();
    let tag = "e2e-killed-and-restarted";
    let app = TestApp::spawn(
        &mock,
        &open_server(&["--tag", tag, "--refuse-if", &gate_arg]),
    )
    .await;
    let answer = app.ask("before", "what is 2 + 40?").await;
    assert_eq!(answer.json["reply"], "done: 42", "{}", answer.text);

    // The gate file makes every restart fail until it is gone: a window the test controls.
    std::fs::write(&gate, "").unwrap();
    let first = tagged(tag);
    assert_eq!(first.len(), 1, "{first:?}");
    kill(first[0]);
    let down = wait_until("/readyz shows the server down", || async {
        let ready = app.get("/readyz").await;
        (ready.json["mcp"][0]["ok"] == false).then_some(ready)
    })
    .await;
    assert_eq!(
        down.status, 200,
        "a server restarting is no unready gateway"
    );
    let error = down.json["mcp"][0]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("the connection ended; restarting"),
        "{}",
        down.text
    );
    assert_eq!(down.json["mcp"][0]["tools"], 5);

    let answer = app.ask("during", "what is 2 + 40?").await;
    assert_eq!(
        answer.json["reply"],
        "done: Error: `mcp__test__add` failed: the MCP server `test` is restarting; try again shortly",
        "{}",
        answer.text
    );

    std::fs::remove_file(&gate).unwrap();
    let up = wait_until("/readyz shows the server back", || async {
        let ready = app.get("/readyz").await;
        (ready.json["mcp"][0]["ok"] == true).then_some(ready)
    })
    .await;
    assert_eq!(
        up.json["mcp"],
        serde_json::json!([{"name": "test", "transport": "stdio", "ok": true, "tools": 5, "restarts": 1}])
    );
    let answer = app.ask("after", "what is 2 + 40?").await;
    assert_eq!(answer.json["reply"], "done: 42", "{}", answer.text);
    app.shutdown().await;
}

#[tokio::test]
async fn a_result_over_the_transport_limit_is_reported_as_too_large() {
    // One byte of text past 16 MiB: with the JSON around it, over the limit.
    let mock = MockModel::start(Behaviour::TurnScript(vec![(
        "mcp__test__big".to_owned(),
        format!(r#"{{"bytes": {}}}"#, 16 * 1024 * 1024 + 1),
    )]))
    .await;
    let app = TestApp::spawn(&mock, &open_server(&[])).await;
    let answer = app.ask("big", "give me everything").await;
    assert_eq!(
        answer.json["reply"],
        "done: Error: `mcp__test__big` failed: the result of `big` from the MCP server `test` is \
         larger than the limit of 16 MiB (16777216 bytes) and was dropped; ask for less at once",
        "{}",
        answer.text
    );
    let ready = app.get("/readyz").await;
    assert_eq!(ready.json["mcp"][0]["ok"], true, "{}", ready.text);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_arguments_are_masked_in_every_output() {
    const SECRETS: [&str; 2] = ["sk-arg-secret-refused", "sk-arg-secret-kept"];
    let mock = MockModel::start(Behaviour::Echo).await;
    let tag = "e2e-masked";
    let server = test_server().display().to_string();
    let rig = crate::support::ChildRig::new(
        &mock,
        &format!(
            "[[mcp.servers]]\nname = \"refusing\"\ncommand = {server:?}\n\
             args = [\"--token\", \"{}\", \"--refuse\"]\n\
             [[mcp.servers]]\nname = \"kept\"\ncommand = {server:?}\n\
             args = [\"--tag\", \"{tag}\", \"--token\", \"{}\"]\n",
            SECRETS[0], SECRETS[1]
        ),
    );
    let config = rig.config.to_str().unwrap();
    let shows_a_secret = |text: &str| SECRETS.iter().any(|secret| text.contains(secret));

    let (code, stdout, stderr) =
        crate::support::run_binary(&["check-config", "--config", config]).await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("mcp servers: refusing (stdio), kept (stdio)"),
        "{stdout}"
    );
    assert!(
        !shows_a_secret(&stdout) && !shows_a_secret(&stderr),
        "{stdout}{stderr}"
    );

    let (code, stdout, stderr) = crate::support::run_binary(&["doctor", "--config", config]).await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let refused = stdout
        .lines()
        .find(|l| l.starts_with("warn  mcp") && l.contains("refusing (stdio)"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        refused.contains("refusing to start: the token *** was rejected"),
        "{refused}"
    );
    assert!(
        !shows_a_secret(&stdout) && !shows_a_secret(&stderr),
        "{stdout}{stderr}"
    );

    let child = rig.serve().await;
    let ready = child.client.get("/readyz").await;
    let mcp = &ready.json["mcp"];
    assert_eq!(mcp[0]["ok"], false, "{}", ready.text);
    assert!(
        mcp[0]["error"]
            .as_str()
            .is_some_and(|e| e.ends_with("the token *** was rejected")),
        "{}",
        ready.text
    );
    assert_eq!(mcp[1]["ok"], true, "{}", ready.text);
    assert!(!shows_a_secret(&ready.text), "{}", ready.text);

    // A killed server's restart is logged and counted.
    let pids = tagged(tag);
    assert_eq!(pids.len(), 1, "{pids:?}");
    kill(pids[0]);
    wait_until("the killed server is back", || async {
        let ready = child.client.get("/readyz").await;
        (ready.json["mcp"][1]["restarts"] == 1 && ready.json["mcp"][1]["ok"] == true).then_some(())
    })
    .await;
    let metrics = child.client.get("/metrics").await;
    assert!(
        metrics
            .text
            .lines()
            .any(|l| l.starts_with("antler_mcp_restarts_total{")
                && l.contains(r#"server="kept""#)
                && l.contains(r#"outcome="ok""#)
                && l.ends_with(" 1")),
        "{}",
        metrics.text
    );
    let log = child.log_text();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("kept")
            && l.contains("attempt=1")
            && l.contains("wait_ms=")),
        "{log}"
    );
    assert!(!shows_a_secret(&log), "{log}");
}
