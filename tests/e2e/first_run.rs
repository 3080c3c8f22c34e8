//! A new user's first run, through the real binary: `antler init --non-interactive` writes a
//! config that `check-config` accepts and that serves Telegram by polling; the interactive
//! `antler init` asks again for a model it cannot reach and before overwriting; commands find
//! `./config/antler.toml` without `--config` and say where they looked when there is none; the
//! shipped config serves Telegram from environment variables alone, as the container does.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use antler_testkit::telegram::{MockTelegram, TOKEN};

use crate::support::{Behaviour, Client, DEADLINE, MODEL_NAME, MockModel, free_port};

/// The binary, run in `dir` with `env` (and no `$ANTLER_CONFIG` from the test's environment).
fn antler(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_antler"));
    command
        .args(args)
        .current_dir(dir)
        .env_remove("ANTLER_CONFIG")
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs the binary to completion: (exit code, stdout, stderr).
async fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let output = antler(dir, args, env).output().await.expect("run antler");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Starts `antler serve` (no `--config`) in `dir` and waits until it answers on `port`.
async fn serve(dir: &Path, port: u16, env: &[(&str, &str)]) -> tokio::process::Child {
    let log = std::fs::File::create(dir.join("serve.log")).expect("log file");
    let mut child = antler(dir, &["serve"], env)
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn antler");
    let client = Client::new(format!("http://127.0.0.1:{port}"));
    let start = Instant::now();
    loop {
        let log = || std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
        if let Ok(Some(status)) = child.try_wait() {
            panic!("antler exited early with {status}:\n{}", log());
        }
        if client.is_healthy().await {
            return child;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "antler did not come up:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_writes_a_config_that_serves_telegram_by_polling_and_never_overwrites_it() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start_polling("").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let api_url = api.uri();
    // Where antler listens and which Bot API it calls are environment, as on a real host.
    let env = [
        ("ANTLER_LISTEN", listen.as_str()),
        ("ANTLER_TELEGRAM_API_URL", api_url.as_str()),
    ];
    let base_url = model.base_url();
    let init = [
        "init",
        "--non-interactive",
        "--model-url",
        &base_url,
        "--model",
        MODEL_NAME,
        "--api-key",
        "sk-e2e-test-key",
        "--telegram-token",
        TOKEN,
    ];
    let (code, stdout, stderr) = run(dir.path(), &init, &env).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    // The model was probed, then the doctor checked the written config, token and all.
    assert!(stdout.contains("serves `mock-model-e2e`"), "{stdout}");
    assert!(
        stdout.contains("ok    telegram the token works"),
        "{stdout}"
    );
    assert!(stdout.contains("antler is ready to serve"), "{stdout}");
    assert!(stdout.contains("start antler: antler serve\n"), "{stdout}");

    let config = std::fs::read_to_string(dir.path().join("config/antler.toml")).unwrap();
    assert!(config.contains("mode = \"polling\""), "{config}");
    assert!(
        !config.contains(TOKEN) && !config.contains("sk-e2e-test-key"),
        "no secret in the config: {config}"
    );
    let env_file = dir.path().join("config/.env");
    let secrets = std::fs::read_to_string(&env_file).unwrap();
    assert!(
        secrets.contains(&format!("ANTLER_TELEGRAM_BOT_TOKEN='{TOKEN}'")),
        "{secrets}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&env_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");

    // Found without --config, the tokens read from .env.
    let (code, stdout, stderr) = run(dir.path(), &["check-config"], &env).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("config/antler.toml: valid"), "{stdout}");

    // No allowlist: the stranger is paired. The operator approves them as an admin.
    let mut child = serve(dir.path(), port, &env).await;
    let sent = api.wait_for_sends(1).await;
    let text = sent[0]["text"].as_str().unwrap_or_default();
    let code: String = text
        .split_once("antler pairing approve ")
        .map(|(_, rest)| rest.chars().take(8).collect())
        .unwrap_or_else(|| panic!("a pairing code: {text}"));
    assert!(
        api.received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .any(|r| r.url.path().ends_with("/GetUpdates")),
        "the update came by polling"
    );
    let (code, stdout, stderr) =
        run(dir.path(), &["pairing", "approve", &code, "--admin"], &env).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let again = antler_testkit::telegram::fixture("tg_private_text")
        .replace("730100001", "730100002")
        .replace("status payments-api", "status checkout");
    api.poll_next(730_100_001, serde_json::from_str(&again).unwrap())
        .await;
    let sent = api.wait_for_sends(2).await;
    assert_eq!(sent[1]["text"], "echo: status checkout");
    child.kill().await.unwrap();

    // A second init refuses to overwrite, names the file and --force, and changes nothing.
    let (code, stdout, stderr) = run(dir.path(), &init, &env).await;
    assert_eq!(code, Some(73), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("config/antler.toml exists; pass --force to overwrite it"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("config/antler.toml")).unwrap(),
        config
    );
    assert_eq!(std::fs::read_to_string(&env_file).unwrap(), secrets);
}

/// Runs `antler init` (interactive) in `dir`, typing `lines`: (exit code, stdout, stderr).
async fn init_typing(dir: &Path, lines: &[&str]) -> (Option<i32>, String, String) {
    use tokio::io::AsyncWriteExt as _;
    let mut child = antler(dir, &["init"], &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn antler init");
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(format!("{}\n", lines.join("\n")).as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("init finishes")
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The interactive setup: a model it cannot reach is asked for again (nothing written), the
/// answers then make a config `check-config` accepts, and a second run asks before
/// overwriting it, keeping it when told no.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_init_asks_again_for_an_unreachable_model_and_before_overwriting() {
    let model = MockModel::start(Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let base_url = model.base_url();
    // The endpoint, key, model, Telegram token, Slack token, public URL: Enter keeps "none".
    let good = [base_url.as_str(), "sk-e2e-test-key", MODEL_NAME, "", "", ""];
    let unreachable = [
        "http://127.0.0.1:9/v1",
        "sk-e2e-test-key",
        MODEL_NAME,
        "",
        "",
        "",
    ];
    let mut typed: Vec<&str> = unreachable.to_vec();
    typed.push("n"); // do not write it anyway
    typed.extend(good);
    let (code, stdout, stderr) = init_typing(dir.path(), &typed).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("Let's try the model settings again."),
        "{stdout}"
    );
    assert!(
        stderr.contains("Write the configuration anyway? (y/N)"),
        "{stderr}"
    );
    assert!(stdout.contains("serves `mock-model-e2e`"), "{stdout}");
    let written = std::fs::read_to_string(dir.path().join("config/antler.toml")).unwrap();
    assert!(written.contains(&base_url), "the second answers: {written}");
    assert!(!written.contains("127.0.0.1:9/"), "{written}");
    let (code, stdout, stderr) = run(dir.path(), &["check-config"], &[]).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");

    // Again, answering no to the overwrite: the file stays, exit 73.
    let mut typed: Vec<&str> = good.to_vec();
    typed.push("n");
    let (code, stdout, stderr) = init_typing(dir.path(), &typed).await;
    assert_eq!(code, Some(73), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("antler.toml exists. Overwrite it? (y/N)"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("config/antler.toml")).unwrap(),
        written
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_refuses_a_model_it_cannot_reach_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let dead = format!("http://127.0.0.1:{}/v1", free_port());
    let (code, stdout, stderr) = run(
        dir.path(),
        &[
            "init",
            "--non-interactive",
            "--model-url",
            &dead,
            "--model",
            "m",
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("the model endpoint check failed"),
        "{stderr}"
    );
    assert!(stderr.contains("is unreachable"), "{stderr}");
    assert!(!dir.path().join("config").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_config_every_command_says_where_it_looked_and_suggests_init() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["serve"][..],
        &["check-config"],
        &["doctor"],
        &["telegram", "webhook-info"],
    ] {
        let (code, stdout, stderr) = run(dir.path(), args, &[]).await;
        assert_eq!(code, Some(64), "{args:?}: {stdout}\n{stderr}");
        for place in [
            "$ANTLER_CONFIG",
            "./config/antler.toml",
            "/etc/antler/antler.toml",
            "antler init",
        ] {
            assert!(stderr.contains(place), "{args:?}: {stderr}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_config_serves_telegram_from_the_environment_alone() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start_polling("").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/config/antler.toml");
    let listen = format!("127.0.0.1:{port}");
    let data = dir.path().join("data").display().to_string();
    let base_url = model.base_url();
    let api_url = api.uri();
    // What a container gets: the config named by ANTLER_CONFIG (as the image sets it) and
    // everything else in the environment.
    let env = [
        ("ANTLER_CONFIG", shipped),
        ("ANTLER_LISTEN", listen.as_str()),
        ("ANTLER_DATA_DIR", data.as_str()),
        ("ANTLER_MODEL_BASE_URL", base_url.as_str()),
        ("ANTLER_MODEL", MODEL_NAME),
        ("OPENAI_API_KEY", "sk-e2e-test-key"),
        ("ANTLER_TELEGRAM_BOT_TOKEN", TOKEN),
        ("ANTLER_TELEGRAM_API_URL", api_url.as_str()),
    ];
    let (code, stdout, stderr) = run(dir.path(), &["check-config"], &env).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("telegram"), "{stdout}");
    let mut child = serve(dir.path(), port, &env).await;
    let sent = api.wait_for_sends(1).await;
    // Whoever finds the bot is not let in: they get a pairing code.
    let text = sent[0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("Your pairing code is"), "{text}");
    child.kill().await.unwrap();
}
