//! The `bash` tool through the API channel with a scripted model: it runs in the thread's
//! workspace with virtual paths, `sandbox_audit` blocks and audits, the guardrail keeps it
//! from non-admins, and the command's environment holds none of antler's.

use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::support::{Behaviour, Client, MockModel, TestApp};

const ADMIN_TOKEN: &str = "admin-token-0123456789";
const USER_TOKEN: &str = "ana-token-0123456789";

/// The API with an admin token and a user token (for `ana`), the shell without a sandbox
/// (bubblewrap is not assumed on test machines).
const OVERRIDES: &str = r#"
[channels.api]
token = "admin-token-0123456789"

[[channels.api.tokens]]
token = "ana-token-0123456789"
user = "ana"

[agent.tools.bash]
sandbox = "none"
"#;

fn bash(command: &str) -> Behaviour {
    Behaviour::TurnScript(vec![(
        "bash".to_owned(),
        json!({ "command": command }).to_string(),
    )])
}

/// Posts `text` on `conversation` and waits for the reply.
async fn ask(client: &Client, conversation: &str, text: &str) -> String {
    let answer = client
        .post(&json!({"conversation": conversation, "text": text, "wait": true}))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    answer.json["reply"].as_str().unwrap_or_default().to_owned()
}

/// Every line of the shell audit log.
fn audit_lines(store: &Path) -> Vec<Value> {
    std::fs::read_to_string(store.join("audit/shell.log"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("an audit line is JSON"))
        .collect()
}

/// Every file called `name` in any thread's folders.
fn files_named(store: &Path, name: &str) -> Vec<PathBuf> {
    let Ok(threads) = std::fs::read_dir(store.join("threads")) else {
        return Vec::new();
    };
    threads
        .flatten()
        .flat_map(|thread| {
            ["workspace", "outputs", "uploads"].map(|area| thread.path().join(area).join(name))
        })
        .filter(|path| path.exists())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admins_command_runs_in_the_workspace_with_virtual_paths() {
    let mock = MockModel::start(bash(
        "echo hi > /mnt/user-data/workspace/a.txt && cat /mnt/user-data/workspace/a.txt && pwd",
    ))
    .await;
    let app = TestApp::spawn(&mock, OVERRIDES).await;
    let admin = app.client.with_token(ADMIN_TOKEN);

    let reply = ask(&admin, "ops", "make a file").await;
    assert_eq!(reply, "done: hi\n/mnt/user-data/workspace\n[exit code 0]");
    let requests = mock.requests();
    assert_eq!(requests.len(), 2, "one tool round, then the answer");
    let offered: Vec<&str> = requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(offered.contains(&"bash"), "{offered:?}");
    let results = mock.tool_results();
    assert_eq!(results, ["hi\n/mnt/user-data/workspace\n[exit code 0]"]);
    let store = app.store.display().to_string();
    assert!(
        !requests[1].body.to_string().contains(&store),
        "a host path reached the model"
    );
    let written = files_named(&app.store, "a.txt");
    assert_eq!(written.len(), 1, "{written:?}");
    assert!(written[0].ends_with("workspace/a.txt"));
    assert_eq!(std::fs::read_to_string(&written[0]).unwrap(), "hi\n");

    let lines = audit_lines(&app.store);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["verdict"], "pass");
    assert_eq!(lines[0]["channel"], "api");
    assert_eq!(lines[0]["role"], "admin");
    assert!(
        lines[0]["command"]
            .as_str()
            .unwrap()
            .starts_with("echo hi > /mnt/user-data/workspace/a.txt")
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_command_is_not_run_and_is_audited() {
    // Harmless even if it ran (`false` stops the chain before `rm`), but the marker would
    // exist: its absence shows that nothing of the command ran.
    let command = "touch /mnt/user-data/workspace/marker && false && rm -rf /";
    let mock = MockModel::start(bash(command)).await;
    let app = TestApp::spawn(&mock, OVERRIDES).await;
    let admin = app.client.with_token(ADMIN_TOKEN);

    let reply = ask(&admin, "ops", "clean up everything").await;
    assert!(
        reply.starts_with("done: Command blocked by the sandbox audit (rule `rm_root`)"),
        "{reply}"
    );
    assert!(
        files_named(&app.store, "marker").is_empty(),
        "the blocked command ran"
    );
    let lines = audit_lines(&app.store);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["verdict"], "block");
    assert_eq!(lines[0]["rule"], "rm_root");
    assert_eq!(lines[0]["command"], command);
    assert_eq!(lines[0]["role"], "admin");
    assert_eq!(lines[0]["call_id"], "call_script_0");
    assert!(lines[0]["thread"].as_str().is_some_and(|t| !t.is_empty()));

    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(app.store.join("audit/shell.log"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_bash_call_is_refused_and_not_run() {
    let mock = MockModel::start(bash("touch /mnt/user-data/workspace/user-marker")).await;
    let app = TestApp::spawn(&mock, OVERRIDES).await;
    let ana = app.client.with_token(USER_TOKEN);

    let reply = ask(&ana, "mine", "touch a file").await;
    assert!(
        reply.contains("Refused: the tool `bash` needs an operator"),
        "{reply}"
    );
    assert!(files_named(&app.store, "user-marker").is_empty());
    // Not even offered to a user: neither the tool nor `task`'s shell subagent type.
    let offered = mock.requests()[0].body["tools"].to_string();
    assert!(!offered.contains("\"bash\""), "{offered}");
    assert!(offered.contains("\"task\""), "{offered}");
    let lines = audit_lines(&app.store);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["verdict"], "refused");
    assert_eq!(lines[0]["user"], "ana");
    assert_eq!(lines[0]["role"], "user");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_environment_holds_nothing_of_antlers() {
    let mock = MockModel::start(bash("env")).await;
    let app = TestApp::spawn(&mock, OVERRIDES).await;
    let admin = app.client.with_token(ADMIN_TOKEN);

    let reply = ask(&admin, "ops", "show the environment").await;
    assert!(reply.ends_with("[exit code 0]"), "{reply}");
    assert!(reply.contains("TERM=dumb"), "{reply}");
    // antler runs in this test process: its environment is antler's. None of it may reach
    // the command (cargo gives the test plenty: CARGO_*, RUST_*, ...) but PATH and the
    // variables the tool sets itself.
    let set_by_the_tool = [
        "PATH",
        "HOME",
        "PWD",
        "LANG",
        "LC_ALL",
        "TERM",
        "NO_COLOR",
        "PAGER",
        "GIT_PAGER",
        "GIT_TERMINAL_PROMPT",
        "DEBIAN_FRONTEND",
        "SHLVL",
        "OLDPWD",
        "_",
    ];
    let own: Vec<(String, String)> = std::env::vars()
        .filter(|(name, _)| !set_by_the_tool.contains(&name.as_str()))
        .collect();
    assert!(
        own.iter().any(|(name, _)| name.starts_with("CARGO")),
        "the test runs under cargo, so it has CARGO_* variables"
    );
    let shown: Vec<&str> = reply
        .trim_start_matches("done: ")
        .lines()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name))
        .collect();
    assert!(shown.contains(&"PATH"), "{reply}");
    for (name, _) in &own {
        assert!(!shown.contains(&name.as_str()), "{name} leaked:\n{reply}");
    }
    // Nor the model's API key, nor the admin token (config values, not environment).
    assert!(!reply.contains("sk-e2e-test-key"), "{reply}");
    assert!(!reply.contains(ADMIN_TOKEN), "{reply}");
    app.shutdown().await;
}
