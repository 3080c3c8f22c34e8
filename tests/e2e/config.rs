//! `antler check-config`: errors name the key, a valid file prints a summary without secrets.

use std::path::PathBuf;

use crate::support::run_binary;

fn write(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let path = dir.path().join("antler.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn check(path: &std::path::Path) -> (Option<i32>, String, String) {
    run_binary(&["check-config", "--config", path.to_str().unwrap()]).await
}

#[tokio::test]
async fn a_typo_names_the_dotted_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "[server]\nlisen = \"127.0.0.1:8080\"\n");
    let (code, _, stderr) = check(&path).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(code.is_some(), "exited normally");
    assert!(stderr.contains("server.lisen"), "{stderr}");
    assert!(stderr.contains("unknown key"), "{stderr}");
}

#[tokio::test]
async fn slack_without_signing_secret_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "[channels.slack]\nenabled = true\nbot_token = \"xoxb-1\"\n",
    );
    let (code, _, stderr) = check(&path).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("channels.slack.signing_secret: required when enabled"),
        "{stderr}"
    );
}

#[tokio::test]
async fn bad_values_and_syntax_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "[agent]\nmax_iterations = 0\n");
    let (code, _, stderr) = check(&path).await;
    assert_ne!(code, Some(0));
    assert!(stderr.contains("agent.max_iterations"), "{stderr}");

    let path = write(&dir, "[server\nlisten = 1\n");
    let (code, _, stderr) = check(&path).await;
    assert_ne!(code, Some(0));
    assert!(
        stderr.contains("line"),
        "syntax errors carry a position: {stderr}"
    );

    let missing = dir.path().join("does-not-exist.toml");
    let (code, _, stderr) = check(&missing).await;
    assert_ne!(code, Some(0));
    assert!(stderr.contains("does-not-exist.toml"), "{stderr}");
}

#[tokio::test]
async fn a_valid_config_prints_a_summary_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let text = crate::support::config_text(
        "http://127.0.0.1:9/v1",
        &store,
        "[model]\napi_key = \"sk-very-secret-value-123\"\n[channels.api]\ntoken = \"api-token-secret-456\"\n",
    );
    let path = write(&dir, &text);
    let (code, stdout, stderr) = check(&path).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("valid"), "{stdout}");
    assert!(stdout.contains(crate::support::MODEL_NAME), "{stdout}");
    assert!(stdout.contains("127.0.0.1:9"), "{stdout}");
    for secret in ["sk-very-secret-value-123", "api-token-secret-456"] {
        assert!(!stdout.contains(secret), "secret shown: {stdout}");
        assert!(!stderr.contains(secret), "secret shown: {stderr}");
    }
    assert!(stdout.contains("***"), "{stdout}");
}

/// EX_USAGE from sysexits.h: what `check-config` exits with on a bad configuration.
const EX_USAGE: i32 = 64;

#[tokio::test]
async fn every_typo_is_reported_in_one_run_with_ex_usage() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "[server]\nlisen = \"127.0.0.1:8080\"\n[model]\nmodle = \"gpt-4o-mini\"\nmax_retries = \"three\"\n",
    );
    let (code, stdout, stderr) = check(&path).await;
    assert_eq!(code, Some(EX_USAGE), "{stdout}\n{stderr}");
    let lisen = stderr.find("server.lisen: unknown key").expect(&stderr);
    let modle = stderr.find("model.modle: unknown key").expect(&stderr);
    assert!(lisen < modle, "file order: {stderr}");
    assert!(
        stderr.contains(
            "model.max_retries: invalid type: expected an unsigned integer, found a string"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("three"), "value shown: {stderr}");
}

#[tokio::test]
async fn a_syntax_error_does_not_print_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "sk-secret-value-1234567890";
    let path = write(
        &dir,
        &format!("[server]\nlisten = \"127.0.0.1:8080\"\n[channels.api]\ntoken = \"{secret}\" x\n"),
    );
    let (code, stdout, stderr) = check(&path).await;
    assert_eq!(code, Some(EX_USAGE), "{stdout}\n{stderr}");
    assert!(stderr.contains("line 4, column 38: "), "{stderr}");
    assert!(!stderr.contains(secret), "secret shown: {stderr}");
    assert!(!stdout.contains(secret), "secret shown: {stdout}");
}

#[tokio::test]
async fn a_secret_in_a_numeric_field_is_not_printed() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "[model]\nmax_retries = \"${ANTLER_TEST_SECRET}\"\n");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_antler"))
        .args(["check-config", "--config", path.to_str().unwrap()])
        .env("ANTLER_TEST_SECRET", "sk-live-secret-987")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(EX_USAGE), "{stderr}");
    assert!(
        stderr.contains("model.max_retries: invalid type"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("sk-live-secret-987"),
        "secret shown: {stderr}"
    );
}

#[tokio::test]
async fn a_valid_file_with_the_new_keys_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let text = crate::support::config_text(
        "http://127.0.0.1:9/v1",
        &store,
        r#"
[server]
ops_listen = "127.0.0.1:9091"
metrics_token = "metrics-token-secret-789"
allowed_hosts = ["bot.example.com"]
[[channels.api.tokens]]
token = "alice-token-secret-012"
user = "alice"
"#,
    );
    let path = write(&dir, &text);
    let (code, stdout, stderr) = check(&path).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("ops listener: 127.0.0.1:9091"), "{stdout}");
    assert!(stdout.contains("metrics token: ***"), "{stdout}");
    assert!(stdout.contains("1 user token"), "{stdout}");
    for secret in ["metrics-token-secret-789", "alice-token-secret-012"] {
        assert!(!stdout.contains(secret), "secret shown: {stdout}");
        assert!(!stderr.contains(secret), "secret shown: {stderr}");
    }
}
