//! `antler check-config`: errors name the key, a valid file prints a summary without secrets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;

use common::run_binary;

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
    let text = common::config_text(
        "http://127.0.0.1:9/v1",
        &store,
        "[model]\napi_key = \"sk-very-secret-value-123\"\n[channels.api]\ntoken = \"api-token-secret-456\"\n",
    );
    let path = write(&dir, &text);
    let (code, stdout, stderr) = check(&path).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("valid"), "{stdout}");
    assert!(stdout.contains(common::MODEL_NAME), "{stdout}");
    assert!(stdout.contains("127.0.0.1:9"), "{stdout}");
    for secret in ["sk-very-secret-value-123", "api-token-secret-456"] {
        assert!(!stdout.contains(secret), "secret shown: {stdout}");
        assert!(!stderr.contains(secret), "secret shown: {stderr}");
    }
    assert!(stdout.contains("***"), "{stdout}");
}
