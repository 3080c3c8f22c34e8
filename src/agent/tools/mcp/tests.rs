use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::agent::tools::tests::context;

/// The test MCP server built from `examples/mcp_test_server.rs`. `cargo test` builds the
/// examples; a narrower run (`cargo test --lib`) may not have, so it is built once here.
pub(crate) fn test_server() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        // target/<profile>/deps/antler-<hash> → target/<profile>/examples/mcp_test_server
        let profile = exe.parent().and_then(|deps| deps.parent()).unwrap();
        let path = profile.join("examples").join("mcp_test_server");
        if !path.exists() {
            let status = std::process::Command::new(env!("CARGO"))
                .args(["build", "--example", "mcp_test_server"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .unwrap();
            assert!(status.success(), "building the MCP test server failed");
        }
        assert!(path.exists(), "{} is missing", path.display());
        path
    })
    .clone()
}

fn stdio(name: &str, command: &str) -> McpServerConfig {
    McpServerConfig {
        name: name.to_owned(),
        command: Some(command.to_owned()),
        ..McpServerConfig::default()
    }
}

/// The test server, started with `args` after `--tag <tag>` (by which [`tagged`] finds it).
fn test_stdio(name: &str, tag: &str, args: &[&str]) -> McpServerConfig {
    let mut all = vec!["--tag".to_owned(), tag.to_owned()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    McpServerConfig {
        args: all,
        ..stdio(name, &test_server().display().to_string())
    }
}

/// Restarts at once (a little backoff) and for long: tests wait on conditions, not on time.
fn quick() -> McpTuning {
    McpTuning {
        restart: RetryPolicy {
            max_attempts: 1000,
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_millis(200),
        },
        max_message_bytes: MAX_MESSAGE_BYTES,
    }
}

/// The ids of the live processes whose command line holds `--tag <tag>`.
fn tagged(tag: &str) -> Vec<i32> {
    let mut pids: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            // A zombie's command line is empty.
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            args.windows(2)
                .any(|pair| pair[0] == b"--tag" && pair[1] == tag.as_bytes())
                .then_some(pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

fn kill(pid: i32) {
    let pid = rustix::process::Pid::from_raw(pid).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
}

/// Polls `check` until it holds, for at most a generous minute.
async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn tool(servers: &McpServers, name: &str) -> Arc<dyn Tool> {
    servers
        .tools()
        .into_iter()
        .find(|t| t.spec().name == name)
        .unwrap_or_else(|| panic!("{name} missing"))
}

#[test]
fn tool_names_fit_the_openai_charset_and_length() {
    let none = HashSet::new();
    assert_eq!(tool_name("test", "add", &none), "mcp__test__add");
    assert_eq!(
        tool_name("gh", "repo.create issue/π", &none),
        "mcp__gh__repo_create_issue__"
    );
    let long = tool_name("server", &"x".repeat(100), &none);
    assert_eq!(long.len(), MAX_TOOL_NAME);
    assert!(long.starts_with("mcp__server__xxx"), "{long}");
    // Two long names that differ only after the cut stay apart.
    let other = tool_name("server", &format!("{}y", "x".repeat(99)), &none);
    assert_ne!(long, other);
    // A name taken already (two tools that sanitise alike) gets a hash.
    let taken = HashSet::from(["mcp__a__b_c".to_owned()]);
    let second = tool_name("a", "b.c", &taken);
    assert_ne!(second, "mcp__a__b_c");
    assert!(second.starts_with("mcp__a__b_c_"), "{second}");
    assert!(
        second
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    );
}

#[test]
fn server_names_are_checked() {
    for good in ["test", "git-hub", "a_1", &"x".repeat(MAX_SERVER_NAME)] {
        assert!(is_valid_server_name(good), "{good}");
    }
    for bad in [
        "",
        "a b",
        "a__b",
        "ä",
        "a.b",
        &"x".repeat(MAX_SERVER_NAME + 1),
    ] {
        assert!(!is_valid_server_name(bad), "{bad}");
    }
}

#[test]
fn secrets_are_masked_and_text_is_cut() {
    let secrets = vec!["hunter22".to_owned()];
    assert_eq!(
        mask("token hunter22 refused", &secrets, 100),
        "token *** refused"
    );
    assert_eq!(mask("abcdef", &secrets, 3), "abc…");
    let cfg = McpServerConfig {
        env: BTreeMap::from([("TOKEN".to_owned(), Secret::new("s3cr3t-value"))]),
        bearer_token: Some(Secret::new("tok")),
        url: Some("https://u:pw@example.com/mcp".to_owned()),
        ..stdio("x", "true")
    };
    // Secrets shorter than 4 characters would mask ordinary words; they are left out.
    assert_eq!(cfg.secrets(), ["s3cr3t-value"]);
    let debug = format!("{cfg:?}");
    assert!(
        !debug.contains("s3cr3t") && !debug.contains("pw@"),
        "{debug}"
    );
}

#[test]
fn argument_values_are_hidden_but_flags_stay_readable() {
    let cfg = McpServerConfig {
        args: [
            "--token",
            "sk-secret-arg",
            "--key=k3y-value",
            "-v",
            "--stdio",
            "/srv/docs",
            "ab",
        ]
        .map(str::to_owned)
        .to_vec(),
        env: BTreeMap::from([("TOKEN".to_owned(), Secret::new("s3cr3t-value"))]),
        ..stdio("x", "npx")
    };
    assert_eq!(
        cfg.hidden(),
        ["sk-secret-arg", "s3cr3t-value", "/srv/docs", "k3y-value"]
    );
    // Results keep the arguments (paths, URLs); only the secrets are masked there.
    assert_eq!(cfg.secrets(), ["s3cr3t-value"]);
    let said = "bad token sk-secret-arg (key k3y-value) for /srv/docs; try --stdio -v";
    assert_eq!(
        mask(said, &cfg.hidden(), 200),
        "bad token *** (key ***) for ***; try --stdio -v"
    );
    let debug = format!("{cfg:?}");
    for value in ["sk-secret", "k3y-value", "/srv/docs", "--token"] {
        assert!(!debug.contains(value), "{value} in {debug}");
    }
    assert!(debug.contains(r#"args: 7"#), "{debug}");
}

#[tokio::test]
async fn a_stdio_server_s_tools_are_listed_and_called() {
    let server = McpServerConfig {
        env: BTreeMap::from([("MCP_TEST_SECRET".to_owned(), Secret::new("hunter22"))]),
        ..stdio("test", &test_server().display().to_string())
    };
    let tag = "listed-and-called";
    let server = McpServerConfig {
        args: vec!["--tag".to_owned(), tag.to_owned()],
        ..server
    };
    let servers = McpServers::connect(&[server]).await;
    assert_eq!(
        servers.status(),
        [McpServerStatus {
            name: "test".to_owned(),
            transport: "stdio",
            ok: true,
            tools: 5,
            error: None,
            restarts: 0,
        }]
    );
    let tools = servers.tools();
    let tool = |name: &str| {
        tools
            .iter()
            .find(|t| t.spec().name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    let add = tool("mcp__test__add");
    assert!(add.spec().description.contains("Add two numbers"));
    assert_eq!(
        add.spec().parameters["required"],
        serde_json::json!(["a", "b"])
    );
    let sum = add
        .call(serde_json::json!({"a": 2, "b": 40}), &context())
        .await
        .unwrap();
    assert_eq!(sum, "42");
    let echo = tool("mcp__test__echo")
        .call(serde_json::json!({"text": "hello"}), &context())
        .await
        .unwrap();
    assert_eq!(echo, "hello");
    // A tool-level error is a tool error, with the server's secret masked.
    let err = tool("mcp__test__fail")
        .call(serde_json::json!({}), &context())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("backend refused the token ***"), "{err}");
    assert!(!err.contains("hunter22"), "{err}");
    let picture = tool("mcp__test__picture")
        .call(serde_json::json!({}), &context())
        .await
        .unwrap();
    assert_eq!(
        picture,
        "here it is\n[image (image/png, 12 bytes of base64) not shown]"
    );
    // Shutdown ends the child.
    assert_eq!(tagged(tag).len(), 1);
    let status = servers.live_status();
    servers.shutdown().await;
    wait_until("the MCP server ended with the shutdown", || {
        tagged(tag).is_empty()
    })
    .await;
    assert_eq!(status.snapshot()[0].error.as_deref(), Some("stopped"));
}

#[tokio::test]
async fn a_killed_server_is_restarted_and_its_tools_say_so_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("refuse");
    let tag = "killed-and-restarted";
    let gate_arg = gate.display().to_string();
    let server = test_stdio(
        "test",
        tag,
        &["--token", "sk-restart-secret", "--refuse-if", &gate_arg],
    );
    let servers = McpServers::connect_with(&[server], quick()).await;
    let add = tool(&servers, "mcp__test__add");
    let args = serde_json::json!({"a": 2, "b": 40});
    assert_eq!(add.call(args.clone(), &context()).await.unwrap(), "42");
    let first = tagged(tag);
    assert_eq!(first.len(), 1, "{first:?}");

    // While the gate file exists the server refuses to start: down, and its tools say so.
    std::fs::write(&gate, "").unwrap();
    kill(first[0]);
    wait_until("a restart was refused", || {
        servers.status()[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("the last failed"))
    })
    .await;
    let status = servers.status();
    assert!(!status[0].ok, "{status:?}");
    assert_eq!(status[0].tools, 5, "the tools stay registered: {status:?}");
    let error = status[0].error.clone().unwrap();
    assert!(
        error.starts_with("the connection ended; restarting (attempt "),
        "{error}"
    );
    // Its last words name the token argument, masked.
    assert!(
        error.contains("refusing to start: the token *** was rejected"),
        "{error}"
    );
    assert!(!error.contains("sk-restart-secret"), "{error}");
    let refused = add.call(args.clone(), &context()).await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        "the MCP server `test` is restarting; try again shortly"
    );

    std::fs::remove_file(&gate).unwrap();
    wait_until("the server is back", || servers.status()[0].ok).await;
    assert_eq!(servers.status()[0].restarts, 1);
    let second = tagged(tag);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(first, second, "a new process");
    // The same tool, by the same name, works again.
    assert_eq!(add.call(args, &context()).await.unwrap(), "42");
    servers.shutdown().await;
    wait_until("the restarted server ended with the shutdown", || {
        tagged(tag).is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_server_that_keeps_failing_to_restart_is_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("refuse");
    let tag = "given-up";
    let gate_arg = gate.display().to_string();
    let server = test_stdio("test", tag, &["--refuse-if", &gate_arg]);
    let tuning = McpTuning {
        restart: RetryPolicy {
            max_attempts: 2,
            ..quick().restart
        },
        ..quick()
    };
    let servers = McpServers::connect_with(&[server], tuning).await;
    let echo = tool(&servers, "mcp__test__echo");
    std::fs::write(&gate, "").unwrap();
    kill(tagged(tag)[0]);
    wait_until("the server is given up", || {
        servers.status()[0]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("the connection ended, and 2 attempts"))
    })
    .await;
    let error = servers.status()[0].error.clone().unwrap();
    assert!(error.contains("the handshake failed"), "{error}");
    let answer = echo
        .call(serde_json::json!({"text": "hi"}), &context())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        answer.contains("stopped and could not be started again"),
        "{answer}"
    );
}

#[tokio::test]
async fn a_result_over_the_message_limit_is_reported_as_too_large() {
    let tuning = McpTuning {
        max_message_bytes: 64 * 1024,
        ..quick()
    };
    let servers = McpServers::connect_with(&[test_stdio("test", "too-large", &[])], tuning).await;
    let big = tool(&servers, "mcp__test__big");
    let error = big
        .call(serde_json::json!({"bytes": 100_000}), &context())
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "the result of `big` from the MCP server `test` is larger than the limit of 64 KiB \
         (65536 bytes) and was dropped; ask for less at once"
    );
    // The connection is fine: a smaller result comes through.
    let small = big
        .call(serde_json::json!({"bytes": 1000}), &context())
        .await
        .unwrap();
    assert_eq!(small, "x".repeat(1000));
    assert!(servers.status()[0].ok);
}

/// A streamable-HTTP MCP server on a free port (JSON answers, no sessions), with one tool,
/// `big`, whose result is a text of `big` bytes; its URL.
async fn http_server(big: usize) -> String {
    use axum::response::IntoResponse;
    async fn answer(
        axum::extract::State(big): axum::extract::State<usize>,
        body: axum::body::Bytes,
    ) -> axum::response::Response {
        let message: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let Some(id) = message.get("id").cloned() else {
            return axum::http::StatusCode::ACCEPTED.into_response();
        };
        let result = match message["method"].as_str() {
            Some("initialize") => serde_json::json!({
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "fake", "version": "0"},
            }),
            Some("tools/list") => serde_json::json!({
                "tools": [{"name": "big", "inputSchema": {"type": "object"}}],
            }),
            Some("tools/call") => serde_json::json!({
                "content": [{"type": "text", "text": "x".repeat(big)}],
            }),
            _ => {
                return axum::Json(serde_json::json!({
                    "jsonrpc": "2.0",
                    "id": id,
                    "error": {"code": -32601, "message": "no such method"},
                }))
                .into_response();
            }
        };
        axum::Json(serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}))
            .into_response()
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route("/mcp", axum::routing::post(answer))
        .with_state(big);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::test]
async fn an_http_result_over_the_message_limit_is_reported_as_too_large() {
    let server = McpServerConfig {
        name: "remote".to_owned(),
        url: Some(http_server(100_000).await),
        ..McpServerConfig::default()
    };
    let tuning = McpTuning {
        max_message_bytes: 64 * 1024,
        ..quick()
    };
    let servers = McpServers::connect_with(&[server], tuning).await;
    let status = servers.status();
    assert!(status[0].ok, "{status:?}");
    let error = tool(&servers, "mcp__remote__big")
        .call(serde_json::json!({}), &context())
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "the result of `big` from the MCP server `remote` is larger than the limit of 64 KiB \
         (65536 bytes) and was dropped; ask for less at once"
    );
}

#[tokio::test]
async fn a_server_that_fails_to_start_has_its_arguments_masked() {
    let server = test_stdio(
        "refusing",
        "fails-at-start",
        &["--token", "sk-start-secret", "--refuse"],
    );
    let servers = McpServers::connect(std::slice::from_ref(&server)).await;
    let status = servers.status();
    let error = status[0].error.clone().unwrap();
    assert!(error.starts_with("the handshake failed: "), "{error}");
    assert!(
        error
            .ends_with("; its last words on stderr: refusing to start: the token *** was rejected"),
        "{error}"
    );
    for shown in [error, format!("{servers:?}"), format!("{server:?}")] {
        assert!(!shown.contains("sk-start-secret"), "{shown}");
    }
}

#[tokio::test]
async fn an_http_server_that_is_not_there_is_reported() {
    // A port nothing listens on: the streamable-HTTP client is built (its TLS provider
    // installed) and fails cleanly, with the token never shown.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let server = McpServerConfig {
        name: "remote".to_owned(),
        url: Some(format!("http://127.0.0.1:{port}/mcp")),
        bearer_token: Some(Secret::new("bearer-secret-value")),
        headers: BTreeMap::from([("X-Key".to_owned(), Secret::new("header-secret"))]),
        connect_timeout_secs: 20,
        ..McpServerConfig::default()
    };
    let servers = McpServers::connect(&[server]).await;
    let status = servers.status();
    assert_eq!(status[0].transport, "http");
    assert!(!status[0].ok, "{status:?}");
    let error = status[0].error.clone().unwrap();
    assert!(error.starts_with("the handshake failed"), "{error}");
    assert!(!error.contains("secret"), "{error}");
}

#[tokio::test]
async fn a_server_that_cannot_start_is_reported_not_fatal() {
    let servers = McpServers::connect(&[
        stdio("broken", "/nonexistent/mcp-server-binary"),
        McpServerConfig {
            enabled: false,
            ..stdio("off", "/nonexistent/too")
        },
        // A program that is no MCP server: the handshake fails when it exits.
        stdio("mute", "true"),
    ])
    .await;
    let status = servers.status();
    assert_eq!(
        status.len(),
        2,
        "disabled servers are not started: {status:?}"
    );
    assert_eq!(status[0].name, "broken");
    assert!(!status[0].ok);
    assert!(
        status[0]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("cannot start the command")),
        "{status:?}"
    );
    assert_eq!(status[1].name, "mute");
    assert!(!status[1].ok, "{status:?}");
    assert!(servers.tools().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_server_that_never_answers_times_out() {
    // `sleep` never speaks MCP: the connect time runs out (paused time: no real wait).
    let server = McpServerConfig {
        connect_timeout_secs: 5,
        args: vec!["600".to_owned()],
        ..stdio("slow", "sleep")
    };
    let servers = McpServers::connect(&[server]).await;
    let status = servers.status();
    assert_eq!(
        status[0].error.as_deref(),
        Some("no answer within 5 seconds"),
        "{status:?}"
    );
}
