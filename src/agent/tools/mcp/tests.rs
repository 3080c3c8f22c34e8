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

#[tokio::test]
async fn a_stdio_server_s_tools_are_listed_and_called() {
    let server = McpServerConfig {
        env: BTreeMap::from([("MCP_TEST_SECRET".to_owned(), Secret::new("hunter22"))]),
        ..stdio("test", &test_server().display().to_string())
    };
    let servers = McpServers::connect(&[server]).await;
    assert_eq!(
        servers.status(),
        [McpServerStatus {
            name: "test".to_owned(),
            transport: "stdio",
            ok: true,
            tools: 4,
            error: None,
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
    // Shutdown ends the child (this is the only test here that starts the test server).
    assert_eq!(test_server_children(), 1);
    servers.shutdown().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while test_server_children() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the MCP server outlived the shutdown"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Live (not zombie) children of this process running the test server.
fn test_server_children() -> usize {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path().join("stat")).ok())
        .filter(|stat| {
            // pid (comm) state ppid ...
            let Some((comm, rest)) = stat.split_once(") ") else {
                return false;
            };
            let fields: Vec<&str> = rest.split(' ').collect();
            comm.ends_with("(mcp_test_server")
                && fields.first() != Some(&"Z")
                && fields.get(1) == Some(&me.as_str())
        })
        .count()
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
