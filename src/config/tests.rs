use std::collections::HashMap;
use std::io::Write as _;

use super::env::expand;
use super::*;

const LOCAL: &str = include_str!("../../config/antler.toml");
const EXAMPLE: &str = include_str!("../../config/antler.example.toml");

fn no_env(_: &str) -> Option<String> {
    None
}

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |name| map.get(name).cloned()
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_str(text, &no_env)
}

fn issues(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(config) => panic!("expected an error, got {config:?}"),
        Err(err) => err.issues().iter().map(ToString::to_string).collect(),
    }
}

fn assert_issue(text: &str, expected: &str) {
    let found = issues(text);
    assert!(
        found.iter().any(|issue| issue == expected),
        "expected issue {expected:?}, got {found:?}"
    );
}

#[test]
fn local_default_parses_without_environment() {
    let config = parse(LOCAL).unwrap();
    assert_eq!(
        config.server.listen,
        SocketAddr::from(([127, 0, 0, 1], 8080))
    );
    assert_eq!(config.store.path, PathBuf::from("data"));
    assert_eq!(config.model.base_url, "http://127.0.0.1:11434/v1");
    assert_eq!(config.model.model, "llama3.2");
    assert_eq!(config.model.api_key, None, "empty key counts as absent");
    assert!(config.channels.api.enabled);
    assert_eq!(config.channels.api.token, None);
    assert!(config.channels.enabled_platforms().is_empty());
}

#[test]
fn local_default_follows_environment() {
    let env = env_of(&[
        ("ANTLER_MODEL", "qwen2.5"),
        ("OPENAI_API_KEY", "sk-local-123"),
        ("ANTLER_LISTEN", "0.0.0.0:9000"),
        ("ANTLER_API_TOKEN", "tok-abc"),
    ]);
    let config = Config::from_toml_str(LOCAL, &env).unwrap();
    assert_eq!(config.model.model, "qwen2.5");
    assert_eq!(
        config.model.api_key.as_ref().map(Secret::expose),
        Some("sk-local-123")
    );
    assert_eq!(config.server.listen.port(), 9000);
}

#[test]
fn example_parses_and_validates() {
    let env = env_of(&[("OPENAI_API_KEY", "sk-example")]);
    let config = Config::from_toml_str(EXAMPLE, &env).unwrap();
    assert_eq!(config.model.temperature, Some(0.7));
    assert_eq!(config.model.max_tokens, Some(4096));
    assert_eq!(
        config.server.public_url.as_deref(),
        Some("https://bot.example.com")
    );
    assert_eq!(config.channels.discord.public_key, None);
    assert_eq!(config.agent.middleware.loop_detection.window, 20);
    // Everything else is at its default.
    let mut expected = Config::default();
    expected.model.api_key = Some(Secret::new("sk-example"));
    expected.model.temperature = Some(0.7);
    expected.model.max_tokens = Some(4096);
    expected.server.public_url = Some("https://bot.example.com".to_owned());
    assert_eq!(config, expected);
}

#[test]
fn example_documents_every_key() {
    // Every key line is preceded by a comment line.
    let lines: Vec<&str> = EXAMPLE.lines().collect();
    for (index, line) in lines.iter().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
            continue;
        }
        assert!(
            index > 0 && lines[index - 1].trim().starts_with('#'),
            "key without a comment: {line}"
        );
    }
}

#[test]
fn example_without_api_key_names_the_key() {
    assert_eq!(
        Config::from_toml_str(EXAMPLE, &no_env)
            .unwrap_err()
            .to_string(),
        "model.api_key: environment variable OPENAI_API_KEY is not set"
    );
}

#[test]
fn empty_file_is_all_defaults() {
    let config = parse("").unwrap();
    assert_eq!(config, Config::default());
    assert_eq!(config.model.system_prompt, DEFAULT_SYSTEM_PROMPT);
    assert_eq!(config.agent.max_iterations, 25);
    assert_eq!(config.delivery.max_attempts, 8);
    assert_eq!(config.channels.feishu.api_url, "https://open.feishu.cn");
    assert_eq!(
        config.agent.middleware.enabled_names(),
        [
            "dangling_tool_call",
            "token_usage",
            "title",
            "loop_detection"
        ]
    );
}

#[test]
fn unknown_key_names_dotted_path() {
    let found = issues("[server]\nlisen = \"127.0.0.1:1\"\n");
    assert_eq!(found.len(), 1);
    assert!(
        found[0].starts_with("server.lisen: unknown key (expected one of: listen, public_url"),
        "{found:?}"
    );

    let found = issues("[agent.middleware.loop_detection]\nwarn = 2\n");
    assert!(
        found[0].starts_with("agent.middleware.loop_detection.warn: unknown key"),
        "{found:?}"
    );

    let found = issues("[channels.matrix]\nenabled = true\n");
    assert!(
        found[0].starts_with("channels.matrix: unknown key"),
        "{found:?}"
    );

    let found = issues("[agent.middleware.token_usage]\nenabled = true\nverbose = 1\n");
    assert_eq!(
        found[0],
        "agent.middleware.token_usage.verbose: unknown key (expected one of: enabled)"
    );
}

#[test]
fn wrong_type_names_dotted_path() {
    let found = issues("[model]\nmax_retries = \"three\"\n");
    assert_eq!(found.len(), 1);
    assert!(
        found[0].starts_with("model.max_retries: invalid type"),
        "{found:?}"
    );

    let found = issues("[agent.middleware.title]\nmax_words = true\n");
    assert!(
        found[0].starts_with("agent.middleware.title.max_words: invalid type"),
        "{found:?}"
    );

    let found = issues("[server]\nlisten = \"not an address\"\n");
    assert!(found[0].starts_with("server.listen: "), "{found:?}");

    let found = issues("[channels]\napi = 3\n");
    assert!(
        found[0].starts_with("channels.api: invalid type"),
        "{found:?}"
    );
}

#[test]
fn syntax_error_has_line_information() {
    let err = parse("[server]\nlisten = \n").unwrap_err();
    assert!(matches!(err, ConfigError::Syntax(_)), "{err:?}");
    assert!(err.to_string().contains("line 2"), "{err}");
}

#[test]
fn load_reads_files_and_reports_io_errors() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(b"[store]\npath = \"elsewhere\"\n").unwrap();
    let config = Config::load(file.path()).unwrap();
    assert_eq!(config.store.path, PathBuf::from("elsewhere"));

    let missing = Path::new("/nonexistent/antler.toml");
    let err = Config::load(missing).unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }));
    assert!(
        err.to_string().contains("/nonexistent/antler.toml"),
        "{err}"
    );
}

#[test]
fn env_substitution_defaults_and_multiple_occurrences() {
    let text = r#"
        [server]
        public_url = "http://${HOST:-localhost}:${PORT:-8080}/${PREFIX}"
        [model]
        model = "${MODEL:-gpt-4o-mini}"
        base_url = "${SCHEME}://${HOST:-localhost}/v1"
    "#;
    let env = env_of(&[("PREFIX", "bot"), ("SCHEME", "https"), ("MODEL", "")]);
    let config = Config::from_toml_str(text, &env).unwrap();
    assert_eq!(
        config.server.public_url.as_deref(),
        Some("http://localhost:8080/bot")
    );
    assert_eq!(
        config.model.model, "gpt-4o-mini",
        "empty variable takes default"
    );
    assert_eq!(config.model.base_url, "https://localhost/v1");

    let env = env_of(&[("HOST", "example.org"), ("PREFIX", ""), ("SCHEME", "http")]);
    let config = Config::from_toml_str(text, &env).unwrap();
    assert_eq!(
        config.server.public_url.as_deref(),
        Some("http://example.org:8080/")
    );
}

#[test]
fn expand_reports_whole_expressions() {
    let env = env_of(&[("A", "1"), ("B", "x")]);
    let whole = |text: &str| expand(text, &env).map(|e| e.whole).unwrap();
    assert!(whole("${A}"));
    assert!(whole("${C:-2}"));
    assert!(!whole("${A}${B}"));
    assert!(!whole(" ${A}"));
    assert!(!whole("${A} "));
    assert!(!whole("plain"));
    assert_eq!(expand("a$b${B}c$", &env).unwrap().text, "a$bxc$");
    assert_eq!(expand("${C:-a:-b}", &env).unwrap().text, "a:-b");
    assert_eq!(
        expand("${A", &env).unwrap_err(),
        ["unterminated `${` (missing `}`)"]
    );
    assert_eq!(
        expand("${1X} ${}", &env).unwrap_err(),
        [
            "invalid environment variable name \"1X\" in `${...}`",
            "invalid environment variable name \"\" in `${...}`"
        ]
    );
}

#[test]
fn env_substitution_coerces_numbers_and_booleans() {
    let text = r#"
        [model]
        max_retries = "${RETRIES:-3}"
        stream = "${STREAM:-true}"
        temperature = "${TEMPERATURE}"
        max_tokens = "${MAX_TOKENS:-100}"
        [agent]
        max_iterations = "${ITERATIONS}"
        [channels.discord]
        application_id = "${DISCORD_APP_ID}"
        [channels.feishu]
        app_secret = "${FEISHU_SECRET}"
    "#;
    let env = env_of(&[
        ("RETRIES", "5"),
        ("STREAM", "false"),
        ("TEMPERATURE", "0.25"),
        ("ITERATIONS", "40"),
        ("DISCORD_APP_ID", "1234567890123456789"),
        ("FEISHU_SECRET", "true"),
    ]);
    let config = Config::from_toml_str(text, &env).unwrap();
    assert_eq!(config.model.max_retries, 5);
    assert!(!config.model.stream);
    assert_eq!(config.model.temperature, Some(0.25));
    assert_eq!(config.model.max_tokens, Some(100));
    assert_eq!(config.agent.max_iterations, 40);
    // String settings keep the text even when it looks like a number or boolean.
    assert_eq!(
        config.channels.discord.application_id.as_deref(),
        Some("1234567890123456789")
    );
    assert_eq!(
        config
            .channels
            .feishu
            .app_secret
            .as_ref()
            .map(Secret::expose),
        Some("true")
    );

    // Mixed text is never coerced; a non-number for a number names the key.
    let found = issues("[model]\nmax_retries = \"${R:-3} \"\n");
    assert!(
        found[0].starts_with("model.max_retries: invalid type"),
        "{found:?}"
    );
    let env = env_of(&[("R", "0x10")]);
    let err = Config::from_toml_str("[model]\nmax_retries = \"${R}\"\n", &env).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("model.max_retries: invalid type: string \"0x10\""),
        "{err}"
    );
}

#[test]
fn missing_variable_names_the_key_and_all_are_reported() {
    let text = r#"
        [model]
        api_key = "${OPENAI_API_KEY}"
        [channels.slack]
        bot_token = "${SLACK_BOT_TOKEN}"
        [[extra]]
    "#;
    // `extra` would be an unknown key, but substitution errors come first.
    let found = issues(text);
    assert_eq!(
        found,
        [
            "channels.slack.bot_token: environment variable SLACK_BOT_TOKEN is not set",
            "model.api_key: environment variable OPENAI_API_KEY is not set",
        ]
    );
}

#[test]
fn missing_variable_inside_array_names_index() {
    let found = issues("extra = [\"a\", \"${NOPE}\"]\n");
    assert_eq!(found, ["extra[1]: environment variable NOPE is not set"]);
}

#[test]
fn enabled_platform_requires_its_secrets() {
    let found = issues("[channels.slack]\nenabled = true\nbot_token = \"xoxb-1\"\n");
    assert_eq!(
        found,
        [
            "channels.slack.signing_secret: required when enabled",
            "channels.slack.enabled: the slack channel is not available in this build yet",
        ]
    );
    assert_issue(
        "[channels.telegram]\nenabled = true\n",
        "channels.telegram.webhook_secret: required when enabled",
    );
    assert_issue(
        "[channels.discord]\nenabled = true\n",
        "channels.discord.application_id: required when enabled",
    );
    let found = issues("[channels.feishu]\nenabled = true\napp_secret = \"\"\n");
    assert_eq!(
        found,
        [
            "channels.feishu.app_id: required when enabled",
            "channels.feishu.app_secret: required when enabled",
            "channels.feishu.verification_token: required when enabled",
            "channels.feishu.enabled: the feishu channel is not available in this build yet",
        ]
    );
}

#[test]
fn complete_platform_is_not_available_yet() {
    let text = "[channels.telegram]\nenabled = true\nbot_token = \"1:A\"\nwebhook_secret = \"s\"\n";
    assert_eq!(
        issues(text),
        ["channels.telegram.enabled: the telegram channel is not available in this build yet"]
    );
}

#[test]
fn disabled_platform_needs_nothing_but_checks_urls_and_key_format() {
    let text = r#"
        [channels.slack]
        api_url = "ftp://slack.com"
        [channels.discord]
        public_key = "abc"
        api_url = "not a url"
        [channels.telegram]
        api_url = "http://127.0.0.1:9999"
    "#;
    let found = issues(text);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].starts_with("channels.slack.api_url: must be an http or https URL"));
    assert!(found[1].starts_with("channels.discord.api_url: not a valid URL"));
    assert_eq!(
        found[2],
        "channels.discord.public_key: must be 64 hexadecimal characters"
    );
    let key = "a".repeat(64);
    parse(&format!("[channels.discord]\npublic_key = \"{key}\"\n")).unwrap();
}

#[test]
fn non_loopback_listen_requires_api_token() {
    let text = "[server]\nlisten = \"0.0.0.0:8080\"\n";
    assert_eq!(
        issues(text),
        ["channels.api.token: required when server.listen is not a loopback address"]
    );
    parse("[server]\nlisten = \"0.0.0.0:8080\"\n[channels.api]\ntoken = \"t\"\n").unwrap();
    parse("[server]\nlisten = \"0.0.0.0:8080\"\n[channels.api]\nenabled = false\n").unwrap();
    parse("[server]\nlisten = \"[::1]:8080\"\n").unwrap();
    assert_issue(
        "[server]\nlisten = \"0.0.0.0:8080\"\n[channels.api]\ntoken = \"\"\n",
        "channels.api.token: required when server.listen is not a loopback address",
    );
}

#[test]
fn loop_detection_cross_field_validation() {
    let text = r#"
        [agent.middleware.loop_detection]
        warn_threshold = 0
        hard_limit = 0
        window = 0
        max_threads = 0
    "#;
    assert_eq!(
        issues(text),
        [
            "agent.middleware.loop_detection.warn_threshold: must be at least 1 (got 0)",
            "agent.middleware.loop_detection.hard_limit: must be greater than warn_threshold (0 <= 0)",
            "agent.middleware.loop_detection.max_threads: must be at least 1 (got 0)",
        ]
    );
    let text =
        "[agent.middleware.loop_detection]\nwarn_threshold = 4\nhard_limit = 6\nwindow = 5\n";
    assert_eq!(
        issues(text),
        ["agent.middleware.loop_detection.window: must be at least hard_limit (5 < 6)"]
    );
    parse("[agent.middleware.loop_detection]\nwarn_threshold = 1\nhard_limit = 2\nwindow = 2\n")
        .unwrap();
}

#[test]
fn ranges_are_checked_and_all_issues_collected() {
    let text = r#"
        [store]
        path = ""
        [model]
        base_url = "file:///tmp"
        model = " "
        temperature = 2.5
        [agent]
        max_iterations = 201
        max_concurrent_turns = 0
        backlog = 0
        max_turn_attempts = 0
        [agent.middleware.title]
        max_words = 0
        max_chars = 7
        [server]
        public_url = "bot.example.com"
    "#;
    let err = parse(text).unwrap_err();
    let found: Vec<&str> = err.issues().iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        found,
        [
            "server.public_url",
            "store.path",
            "model.base_url",
            "model.model",
            "model.temperature",
            "agent.max_iterations",
            "agent.max_concurrent_turns",
            "agent.backlog",
            "agent.max_turn_attempts",
            "agent.middleware.title.max_words",
            "agent.middleware.title.max_chars",
        ]
    );
    // Display lists every issue on its own line.
    assert_eq!(err.to_string().lines().count(), found.len());
    assert!(
        err.to_string()
            .contains("\nmodel.temperature: must be between 0 and 2 (got 2.5)\n")
    );
}

#[test]
fn secrets_are_masked_in_debug_display_and_summary() {
    let text = r#"
        [server]
        listen = "0.0.0.0:8080"
        [model]
        base_url = "https://user:pw-SECRET-0@llm.example.com/v1"
        api_key = "SECRET-1"
        [channels.api]
        token = "SECRET-2"
        [channels.telegram]
        bot_token = "SECRET-3"
        webhook_secret = "SECRET-4"
        [channels.slack]
        bot_token = "SECRET-5"
        signing_secret = "SECRET-6"
        [channels.discord]
        bot_token = "SECRET-7"
        [channels.feishu]
        app_secret = "SECRET-8"
        verification_token = "SECRET-9"
        encrypt_key = "SECRET-10"
    "#;
    let config = parse(text).unwrap();
    let debug = format!("{config:?}");
    let pretty = format!("{config:#?}");
    let summary = config.summary();
    for output in [&debug, &pretty, &summary] {
        assert!(!output.contains("SECRET"), "secret leaked: {output}");
    }
    assert!(debug.contains("***"));
    let secret = Secret::new("hunter2");
    assert_eq!(format!("{secret:?}"), "***");
    assert_eq!(format!("{secret}"), "***");
    assert_eq!(secret.expose(), "hunter2");
}

#[test]
fn summary_lists_the_essentials() {
    let config = parse(LOCAL).unwrap();
    let summary = config.summary();
    assert_eq!(
        summary,
        "listen: 127.0.0.1:8080\n\
         store: data\n\
         model: llama3.2 at http://127.0.0.1:11434/v1 (api key: not set)\n\
         api channel: enabled (token: not set)\n\
         platforms: none\n\
         middleware: dangling_tool_call, token_usage, title, loop_detection"
    );

    let text = "[model]\napi_key = \"k\"\n[agent.middleware.title]\nenabled = false\n";
    let summary = parse(text).unwrap().summary();
    assert!(summary.contains("(api key: ***)"), "{summary}");
    assert!(
        summary.contains("middleware: dangling_tool_call, token_usage, loop_detection"),
        "{summary}"
    );
}
