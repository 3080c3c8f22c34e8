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
        ("ANTLER_API_TOKEN", "tok-abc-0123456789"),
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
            "thread_data",
            "uploads",
            "input_sanitization",
            "dangling_tool_call",
            "guardrail",
            "sandbox_audit",
            "tool_output_budget",
            "summarization",
            "todo",
            "token_usage",
            "title",
            "view_image",
            "deferred_tools",
            "subagent_limit",
            "loop_detection",
            "clarification"
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
    assert!(matches!(err, ConfigError::Syntax { .. }), "{err:?}");
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
    // The value is not quoted: it may be a secret.
    assert_eq!(
        err.to_string(),
        "model.max_retries: invalid type: expected an unsigned integer, found a string \
         (from environment variable R)"
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
        ["channels.slack.signing_secret: required when enabled"]
    );
    assert_issue(
        "[channels.telegram]\nenabled = true\n",
        "channels.telegram.webhook_secret: required when enabled",
    );
    let found = issues("[channels.discord]\nenabled = true\n");
    assert_eq!(
        found,
        [
            "channels.discord.application_id: required when enabled",
            "channels.discord.public_key: required when enabled",
            "channels.discord.bot_token: required when enabled",
        ]
    );
    let found = issues("[channels.feishu]\nenabled = true\napp_secret = \"\"\n");
    assert_eq!(
        found,
        [
            "channels.feishu.app_id: required when enabled",
            "channels.feishu.app_secret: required when enabled",
            "channels.feishu.verification_token: required when enabled",
        ]
    );
}

#[test]
fn feishu_websocket_mode_needs_no_verification_token_and_webhook_mode_does() {
    let socket = "[channels.feishu]\nenabled = true\nmode = \"websocket\"\napp_id = \"cli_1\"\n\
                  app_secret = \"s\"\n";
    let config = parse(socket).unwrap();
    assert_eq!(
        config.channels.feishu.mode,
        crate::config::FeishuMode::Websocket
    );
    assert_eq!(
        parse("").unwrap().channels.feishu.mode,
        crate::config::FeishuMode::Webhook,
        "webhook by default"
    );
    let found = issues("[channels.feishu]\nenabled = true\nmode = \"websocket\"\n");
    assert_eq!(
        found,
        [
            "channels.feishu.app_id: required when enabled",
            "channels.feishu.app_secret: required when enabled",
        ]
    );
    let found = issues(
        "[channels.feishu]\nenabled = true\nmode = \"webhook\"\napp_id = \"cli_1\"\napp_secret = \"s\"\n",
    );
    assert_eq!(
        found,
        ["channels.feishu.verification_token: required when enabled"]
    );
    let found = issues("[channels.feishu]\nmode = \"socket\"\n");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("channels.feishu.mode"), "{found:?}");
}

#[test]
fn slack_socket_mode_needs_the_app_token_instead_of_the_signing_secret() {
    let socket = "[channels.slack]\nenabled = true\nmode = \"socket\"\nbot_token = \"xoxb-1\"\n";
    assert_eq!(
        issues(socket),
        ["channels.slack.app_token: required when enabled"]
    );
    let config = parse(&format!("{socket}app_token = \"xapp-1-A1-2-SECRET-13\"\n")).unwrap();
    assert_eq!(config.channels.slack.mode, super::SlackMode::Socket);
    assert_eq!(
        config.channels.slack.app_token.as_ref().map(Secret::expose),
        Some("xapp-1-A1-2-SECRET-13")
    );
    assert!(!format!("{config:?}").contains("SECRET-13"), "masked");
    // A bot token where the app token belongs is named.
    let found = issues(&format!("{socket}app_token = \"xoxb-2\"\n"));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("channels.slack.app_token: must be an app-level token (xapp-...)"),
        "{found:?}"
    );
    // The default stays the webhooks, which need the signing secret and no app token.
    assert_eq!(
        parse("[channels.slack]\n").unwrap().channels.slack.mode,
        super::SlackMode::Events
    );
    let found =
        issues("[channels.slack]\nenabled = true\nmode = \"events\"\nbot_token = \"xoxb-1\"\n");
    assert_eq!(
        found,
        ["channels.slack.signing_secret: required when enabled"]
    );
    let found = issues("[channels.slack]\nmode = \"websocket\"\n");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("channels.slack.mode"), "{found:?}");
}

#[test]
fn every_platform_is_available_and_discord_has_its_shapes() {
    let text = "[channels.discord]\nenabled = true\napplication_id = \"1\"\nbot_token = \"t\"\n\
                public_key = \"0000000000000000000000000000000000000000000000000000000000000000\"\n";
    assert!(parse(text).is_ok(), "discord is built");
    let found = issues(
        "[channels.discord]\napplication_id = \"my-app\"\nallowed_guilds = [\"1\", \"guild\"]\n\
         gateway = true\n",
    );
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0]
            .starts_with("channels.discord.application_id: must be the application's numeric id")
    );
    assert_eq!(
        found[1],
        "channels.discord.allowed_guilds[1]: must be a server (guild) id: digits only"
    );
    let config = parse("[channels.discord]\nallowed_guilds = [1100000000000000001]\n").unwrap();
    assert_eq!(
        config.channels.discord.allowed_guilds,
        ["1100000000000000001"]
    );
    assert!(!config.channels.discord.gateway);
    let telegram =
        "[channels.telegram]\nenabled = true\nbot_token = \"1:A\"\nwebhook_secret = \"s\"\n";
    assert!(parse(telegram).is_ok(), "telegram is built");
    let slack =
        "[channels.slack]\nenabled = true\nbot_token = \"xoxb-1\"\nsigning_secret = \"s\"\n";
    assert!(parse(slack).is_ok(), "slack is built");
    let feishu = "[channels.feishu]\nenabled = true\napp_id = \"cli_1\"\napp_secret = \"s\"\n\
                  verification_token = \"t\"\n";
    assert!(parse(feishu).is_ok(), "feishu is built");
    let found = issues("[channels.feishu]\napp_id = \"app1\"\n");
    assert_eq!(
        found,
        [
            "channels.feishu.app_id: must be the app's id (cli_...), from the app's Credentials & Basic Info page"
        ]
    );
}

#[test]
fn slack_token_team_and_command_must_have_slacks_shape() {
    let found = issues(
        "[channels.slack]\nbot_token = \"xoxp-user\"\nteam_id = \"acme\"\ncommand = \"antler\"\n\
         allowed_bots = [\"U1\"]\n",
    );
    assert_eq!(
        found,
        [
            "channels.slack.bot_token: must be the app's bot token (xoxb-...), from OAuth & Permissions",
            "channels.slack.team_id: must be a workspace id such as T0123ABCD",
            "channels.slack.allowed_bots[0]: must be a bot id such as B0123ABCD or an app id such as A0123ABCD",
            "channels.slack.command: must be a slash and 1 to 31 lower-case letters, digits, - or _, e.g. /antler",
        ]
    );
    let config = parse("[channels.slack]\nteam_id = \"T0123ABCD\"\n").unwrap();
    assert_eq!(config.channels.slack.team_id.as_deref(), Some("T0123ABCD"));
    assert!(config.channels.slack.thread_follow_ups);
    assert_eq!(config.channels.slack.command, "/antler");
}

#[test]
fn telegram_token_and_secret_must_have_telegrams_shape() {
    let text = "[channels.telegram]\nenabled = true\nbot_token = \"nope\"\nwebhook_secret = \"has space\"\n";
    let found = issues(text);
    assert_eq!(
        found,
        [
            "channels.telegram.bot_token: must look like <bot id>:<secret>, as @BotFather gives it",
            "channels.telegram.webhook_secret: must be 1 to 256 characters of A-Z, a-z, 0-9, _ and -",
        ]
    );
    assert!(
        found
            .iter()
            .all(|issue| !issue.contains("nope") && !issue.contains("has space"))
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
    parse("[server]\nlisten = \"0.0.0.0:8080\"\n[channels.api]\ntoken = \"t-0123456789abcdef\"\n")
        .unwrap();
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
fn shell_tool_and_audit_defaults() {
    let config = parse("").unwrap();
    let bash = &config.agent.tools.bash;
    // The shell is on, sandboxed, and offline unless the network is asked for.
    assert!(bash.enabled && !bash.network);
    assert_eq!(bash.sandbox, crate::sandbox::SandboxMode::Auto);
    assert_eq!(bash.limits.processes, 64);
    assert_eq!(bash.limits.memory_mb, 1024);
    assert_eq!(bash.limits.cpu_secs, None);
    assert_eq!(bash.limits.file_mb, 256);
    assert_eq!(bash.limits.open_files, 256);
    assert_eq!(bash.max_output_bytes, 65_536);
    let audit = &config.agent.middleware.sandbox_audit;
    assert!(audit.enabled && audit.builtin_rules);
    assert_eq!(audit.tools, ["bash"]);
    assert_eq!(audit.audit_log, None);
    assert_eq!(audit.max_command_chars, 10_000);
    assert!(config.agent.middleware.input_sanitization.enabled);

    let text = r#"
        [agent.tools.bash]
        sandbox = "bwrap"
        network = true
        max_output_bytes = 1000
        [agent.tools.bash.limits]
        processes = 10
        cpu_secs = 5
        [agent.middleware.sandbox_audit]
        audit_log = "/var/log/antler/shell.log"
        block = [{ name = "no-kubectl-delete", pattern = 'kubectl\s+delete' }]
    "#;
    let config = parse(text).unwrap();
    assert_eq!(
        config.agent.tools.bash.sandbox,
        crate::sandbox::SandboxMode::Bwrap
    );
    assert!(config.agent.tools.bash.network);
    assert_eq!(config.agent.tools.bash.limits.processes, 10);
    assert_eq!(config.agent.tools.bash.limits.cpu_secs, Some(5));
    assert_eq!(config.agent.tools.bash.limits.memory_mb, 1024);
    assert_eq!(
        config.agent.middleware.sandbox_audit.block[0].name,
        "no-kubectl-delete"
    );
}

#[test]
fn shell_tool_and_audit_values_are_checked_by_key() {
    let found = issues(
        "[agent.tools.bash]
sandbox = \"docker\"
",
    );
    assert_eq!(
        found,
        ["agent.tools.bash.sandbox: unknown value (must be one of: auto, bwrap, landlock, none)"]
    );
    let text = r#"
        [agent.tools.bash]
        sandbox = "none"
        network = false
        max_output_bytes = 0
        [agent.middleware.sandbox_audit]
        max_command_chars = 0
        tools = []
        warn = [{ name = "ok", pattern = "fine" }, { name = "bad", pattern = "(SECRETISH" }]
        block = [{ name = "", pattern = "x" }]
    "#;
    let found = issues(text);
    assert_eq!(
        found,
        [
            "agent.tools.bash.max_output_bytes: must be between 1 and 16777216 (got 0)",
            "agent.middleware.sandbox_audit.max_command_chars: must be between 1 and 1000000 (got 0)",
            "agent.middleware.sandbox_audit.tools: must name at least one tool",
            "agent.middleware.sandbox_audit.block[0].name: must be 1 to 64 letters, digits, `_` or `-`",
            "agent.middleware.sandbox_audit.warn[1].pattern: is not a valid regular expression: unclosed group",
        ]
    );
    assert!(!found.iter().any(|issue| issue.contains("SECRETISH")));
    let found = issues(
        "[agent.middleware.sandbox_audit]
block = [{ name = \"x\" }]
",
    );
    assert!(
        found[0].starts_with("agent.middleware.sandbox_audit.block[0]"),
        "{found:?}"
    );
}

#[test]
fn model_timeouts_and_stream_usage() {
    let config = parse("").unwrap();
    let m = &config.model;
    assert_eq!(
        [
            m.connect_timeout_secs,
            m.first_byte_timeout_secs,
            m.idle_timeout_secs,
            m.request_timeout_secs
        ],
        [10, 60, 60, 120]
    );
    assert!(m.stream_usage);

    let text = r#"
        [model]
        connect_timeout_secs = 3
        first_byte_timeout_secs = 90
        idle_timeout_secs = 30
        request_timeout_secs = 300
        stream_usage = false
    "#;
    let m = parse(text).unwrap().model;
    assert_eq!(
        [
            m.connect_timeout_secs,
            m.first_byte_timeout_secs,
            m.idle_timeout_secs,
            m.request_timeout_secs
        ],
        [3, 90, 30, 300]
    );
    assert!(!m.stream_usage);
    // Configs written before the split still load: `request_timeout_secs` alone is fine.
    assert_eq!(
        parse("[model]\nrequest_timeout_secs = 45\n")
            .unwrap()
            .model
            .request_timeout_secs,
        45
    );

    let text = r#"
        [model]
        connect_timeout_secs = 0
        first_byte_timeout_secs = 0
        idle_timeout_secs = 0
        request_timeout_secs = 0
    "#;
    assert_eq!(
        issues(text),
        [
            "model.connect_timeout_secs: must be at least 1 (got 0)",
            "model.first_byte_timeout_secs: must be at least 1 (got 0)",
            "model.idle_timeout_secs: must be at least 1 (got 0)",
            "model.request_timeout_secs: must be at least 1 (got 0)",
        ]
    );
    assert_issue(
        "[model]\nstream_usage = \"yes\"\n",
        "model.stream_usage: invalid type: expected a boolean, found a string",
    );
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
fn max_attachment_bytes_defaults_to_20_mib_and_is_bounded() {
    assert_eq!(
        parse("").unwrap().agent.max_attachment_bytes,
        20 * 1024 * 1024
    );
    assert_eq!(
        parse("[agent]\nmax_attachment_bytes = 1024\n")
            .unwrap()
            .agent
            .max_attachment_bytes,
        1024
    );
    for (value, got) in [("0", "0"), ("1073741825", "1073741825")] {
        let err = parse(&format!("[agent]\nmax_attachment_bytes = {value}\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "agent.max_attachment_bytes: must be between 1 and 1073741824 (1 GiB) (got {got})"
            )
        );
    }
}

#[test]
fn secrets_are_masked_in_debug_display_and_summary() {
    let text = r#"
        [server]
        listen = "0.0.0.0:8080"
        metrics_token = "SECRET-11-metrics-token"
        [model]
        base_url = "https://user:pw-SECRET-0@llm.example.com/v1"
        api_key = "SECRET-1"
        [channels.api]
        token = "SECRET-2-admin-api-token"
        [[channels.api.tokens]]
        token = "SECRET-12-user-api-token"
        user = "alice"
        [channels.telegram]
        bot_token = "3:SECRET-3"
        webhook_secret = "SECRET-4"
        [channels.slack]
        bot_token = "xoxb-SECRET-5"
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
         limits: 512 connections, 256 streams, header timeout 10s, body timeout 30s\n\
         store: data (cache: 8 MiB)\n\
         model: llama3.2 at http://127.0.0.1:11434/v1 (api key: not set)\n\
         api channel: enabled (admin token: not set)\n\
         platforms: none\n\
         middleware: thread_data, uploads, input_sanitization, dangling_tool_call, guardrail, sandbox_audit, tool_output_budget, summarization, skills, todo, token_usage, title, memory, deferred_tools, subagent_limit, loop_detection, clarification\n\
         shell: sandbox auto, network off, limits 64 processes, 1024 MiB memory, 256 MiB files, 256 open files\n\
         subagents: 3 at once, 900s timeout, types: bash, general-purpose"
    );
    let off = parse("[agent.tools.bash]\nenabled = false\n")
        .unwrap()
        .summary();
    assert!(off.contains("\nshell: disabled\n"), "{off}");

    let text = "[model]\napi_key = \"k\"\n[agent.middleware.title]\nenabled = false\n";
    let summary = parse(text).unwrap().summary();
    // view_image is listed only for a model with vision.
    let vision = parse("[model]\nvision = true\n").unwrap().summary();
    assert!(
        vision.contains(", title, memory, view_image, deferred_tools, subagent_limit,"),
        "{vision}"
    );
    assert!(summary.contains("(api key: ***)"), "{summary}");
    assert!(
        summary.contains(
            "middleware: thread_data, uploads, input_sanitization, dangling_tool_call, guardrail, sandbox_audit, tool_output_budget, summarization, skills, todo, token_usage, memory, deferred_tools, subagent_limit, loop_detection, clarification"
        ),
        "{summary}"
    );
}

// ---------------------------------------------------------------------------------------------
// Every issue in one run; no value in any message
// ---------------------------------------------------------------------------------------------

#[test]
fn every_unknown_key_and_type_error_is_reported_at_once_in_file_order() {
    // File order differs from alphabetical order, both across and within tables.
    let text = r#"
        [store]
        pth = "data"
        [server]
        max_streams = "lots"
        lisen = "127.0.0.1:1"
        [agent]
        max_iterations = true
        [delivery]
        max_attempts = 0
    "#;
    let found = issues(text);
    let keys: Vec<&str> = found
        .iter()
        .map(|issue| issue.split_once(':').map_or("", |(key, _)| key))
        .collect();
    assert_eq!(
        keys,
        [
            "store.pth",
            "server.max_streams",
            "server.lisen",
            "agent.max_iterations",
            "delivery.max_attempts",
        ],
        "{found:#?}"
    );
    assert_eq!(
        found[0],
        "store.pth: unknown key (expected one of: backend, path, dedupe_ttl_secs, cache_capacity_bytes, \
         url, pool_size, lease_secs, replica)"
    );
    assert_eq!(
        found[1],
        "server.max_streams: invalid type: expected an unsigned integer, found a string"
    );
    assert!(
        found[2].starts_with("server.lisen: unknown key (expected one of: listen, public_url"),
        "{found:?}"
    );
    assert_eq!(
        found[3],
        "agent.max_iterations: invalid type: expected an unsigned integer, found a boolean"
    );
    // Validation still runs over the rest, and its issues follow.
    assert_eq!(
        found[4],
        "delivery.max_attempts: must be at least 1 (got 0)"
    );
}

#[test]
fn unknown_tables_and_wrong_types_at_any_depth_are_all_reported() {
    let text = r#"
        [channels.matrix]
        enabled = true
        [channels]
        api = 3
        [agent.middleware.title]
        max_words = "six"
        max_char = 10
    "#;
    let found = issues(text);
    assert_eq!(found.len(), 4, "{found:#?}");
    assert!(
        found[0].starts_with("channels.matrix: unknown key"),
        "{found:?}"
    );
    assert_eq!(
        found[1],
        "channels.api: invalid type: expected a table, found an integer"
    );
    assert_eq!(
        found[2],
        "agent.middleware.title.max_words: invalid type: expected an unsigned integer, found a string"
    );
    assert!(
        found[3].starts_with("agent.middleware.title.max_char: unknown key"),
        "{found:?}"
    );
}

#[test]
fn a_failed_key_is_not_also_validated_at_its_default() {
    // Without the wrong type, the default hard_limit (5) would fail "greater than
    // warn_threshold (10)": that would blame a value the file never set.
    let text =
        "[agent.middleware.loop_detection]\nwarn_threshold = 10\nhard_limit = \"x\"\nwindow = 30\n";
    assert_eq!(
        issues(text),
        [
            "agent.middleware.loop_detection.hard_limit: invalid type: expected an unsigned integer, found a string"
        ]
    );
    // A whole table that failed takes its rules with it.
    let text = "[server]\nlisten = \"0.0.0.0:8080\"\n[channels]\napi = 3\n";
    assert_eq!(
        issues(text),
        ["channels.api: invalid type: expected a table, found an integer"]
    );
}

#[test]
fn arrays_of_tables_are_reported_with_the_index_in_the_file() {
    let text = r#"
        [[channels.api.tokens]]
        token = "0123456789abcdef-0"
        user = ["alice"]
        [[channels.api.tokens]]
        token = "0123456789abcdef-1"
        user = "bob"
        colour = "red"
        [[channels.api.tokens]]
        token = "0123456789abcdef-2"
        user = "a/b"
        [[channels.api.tokens]]
        user = "dave"
    "#;
    // Element 0 cannot be built (its user is not a string) and is dropped; the later errors
    // still name the elements by their index in the file.
    assert_eq!(
        issues(text),
        [
            "channels.api.tokens[0].user: invalid type: expected a string, found an array",
            "channels.api.tokens[1].colour: unknown key (expected one of: token, user, role)",
            "channels.api.tokens[3].token: required",
            "channels.api.tokens[2].user: must be 1 to 64 characters from A-Z, a-z, 0-9, `.`, `_`, `@` and `-`",
        ]
    );
}

#[test]
fn syntax_error_shows_line_and_column_but_not_the_line() {
    let text = "[server]\nlisten = \"127.0.0.1:8080\"\n\n[channels.api]\ntoken = \"sk-secret-value-1234567890\" oops\n";
    let err = parse(text).unwrap_err();
    let ConfigError::Syntax {
        line,
        column,
        message,
    } = &err
    else {
        panic!("expected a syntax error, got {err:?}");
    };
    let bad_line = text.lines().nth(4).unwrap();
    assert_eq!(*line, 5);
    assert_eq!(*column, bad_line.find("oops").unwrap() + 1);
    assert!(!message.is_empty());
    let shown = err.to_string();
    assert!(shown.starts_with("line 5, column 38: "), "{shown}");
    for leak in ["sk-secret", "oops", "token ="] {
        assert!(!shown.contains(leak), "the line leaked: {shown}");
        assert!(
            !format!("{err:?}").contains(leak),
            "the line leaked: {err:?}"
        );
    }
}

#[test]
fn unrepresentable_literal_is_a_syntax_error_without_the_literal() {
    let err = parse("[model]\nmax_tokens = 123456789012345678901234567890\n").unwrap_err();
    assert!(matches!(err, ConfigError::Syntax { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(shown.starts_with("line 2, column 14: "), "{shown}");
    assert!(!shown.contains("1234567890"), "the literal leaked: {shown}");
}

#[test]
fn line_and_column_count_characters() {
    assert_eq!(line_column("", 0), (1, 1));
    assert_eq!(line_column("ab\ncd", 4), (2, 2));
    assert_eq!(line_column("ab\ncd", 99), (2, 3));
    // `é` is two bytes but one column; an offset inside it counts from its start.
    assert_eq!(line_column("a = \"é\" x", 9), (1, 9));
    assert_eq!(line_column("é", 1), (1, 1));
}

#[test]
fn a_secret_substituted_into_a_typed_field_is_never_echoed() {
    let env = env_of(&[
        ("OPENAI_API_KEY", "sk-live-123"),
        ("NUMERIC_SECRET", "-4242424242"),
    ]);
    let text = r#"
        [server]
        listen = "${OPENAI_API_KEY}"
        ops_listen = "${OPENAI_API_KEY}"
        [model]
        max_retries = "${OPENAI_API_KEY}"
        max_tokens = "${NUMERIC_SECRET}"
        stream = "${OPENAI_API_KEY}"
        [[channels.api.tokens]]
        token = "0123456789abcdef"
        user = "alice"
        role = "${OPENAI_API_KEY}"
    "#;
    let err = Config::from_toml_str(text, &env).unwrap_err();
    let shown = err.to_string();
    for leak in ["sk-live", "4242"] {
        assert!(!shown.contains(leak), "secret leaked: {shown}");
    }
    let found: Vec<String> = err.issues().iter().map(ToString::to_string).collect();
    assert_eq!(
        found,
        [
            "server.listen: invalid socket address syntax (from environment variable OPENAI_API_KEY)",
            "server.ops_listen: invalid socket address syntax (expected ip:port, e.g. 127.0.0.1:9090) (from environment variable OPENAI_API_KEY)",
            "model.max_retries: invalid type: expected an unsigned integer, found a string (from environment variable OPENAI_API_KEY)",
            "model.max_tokens: out of range: expected an integer from 0 to 4294967295 (from environment variable NUMERIC_SECRET)",
            "model.stream: invalid type: expected a boolean, found a string (from environment variable OPENAI_API_KEY)",
            "channels.api.tokens[0].role: unknown value (must be one of: user, admin) (from environment variable OPENAI_API_KEY)",
        ]
    );
}

#[test]
fn serde_messages_lose_their_values() {
    let cases = [
        (
            "invalid type: string \"sk-1, expected x\", expected u32",
            "invalid type: expected an unsigned integer, found a string",
        ),
        (
            "invalid type: floating point `1.5`, expected i64",
            "invalid type: expected an integer, found a float",
        ),
        (
            "invalid type: sequence, expected struct ServerConfig",
            "invalid type: expected a table, found an array",
        ),
        (
            "invalid value: integer `-1`, expected u8",
            "out of range: expected an integer from 0 to 255",
        ),
        (
            "invalid value: string \"sk-2\", expected a port",
            "invalid value: expected a port, found a string",
        ),
        (
            "unknown variant `sk-3`, expected `user` or `admin`",
            "unknown value (must be one of: user, admin)",
        ),
        (
            "unknown variant `sk-4`, expected one of `a`, `b`, `c`",
            "unknown value (must be one of: a, b, c)",
        ),
        (
            "unknown variant `sk-5`, there are no variants",
            "unknown value (nothing is allowed here)",
        ),
        (
            "unknown field `x`, there are no fields",
            "unknown key (this table takes no keys)",
        ),
        ("duplicate field `user`", "duplicate key user"),
        ("something about \"sk-6\"", "invalid value"),
        (
            "invalid socket address syntax",
            "invalid socket address syntax",
        ),
    ];
    for (message, expected) in cases {
        assert_eq!(friendly_message(message), expected, "for {message:?}");
    }
}

#[test]
fn env_errors_still_name_the_variable_and_not_the_value() {
    let env = env_of(&[("SET", "sk-present-value")]);
    let text = "[model]\napi_key = \"${SET}-${MISSING}\"\n";
    let err = Config::from_toml_str(text, &env).unwrap_err();
    assert_eq!(
        err.to_string(),
        "model.api_key: environment variable MISSING is not set"
    );
}

// ---------------------------------------------------------------------------------------------
// Rules for the server limits, hosts, listeners, cache and API tokens
// ---------------------------------------------------------------------------------------------

#[test]
fn server_limits_and_cache_size_have_lower_bounds() {
    let text = r#"
        [server]
        max_connections = 0
        header_read_timeout_secs = 0
        body_read_timeout_secs = 0
        max_streams = 0
        [store]
        cache_capacity_bytes = 1048575
    "#;
    assert_eq!(
        issues(text),
        [
            "server.max_connections: must be at least 1 (got 0)",
            "server.header_read_timeout_secs: must be at least 1 (got 0)",
            "server.body_read_timeout_secs: must be at least 1 (got 0)",
            "server.max_streams: must be at least 1 (got 0)",
            "store.cache_capacity_bytes: must be at least 1048576 (got 1048575)",
        ]
    );
    let text = r#"
        [server]
        max_connections = 1
        header_read_timeout_secs = 1
        body_read_timeout_secs = 1
        max_streams = 1
        [store]
        cache_capacity_bytes = 1048576
    "#;
    let config = parse(text).unwrap();
    assert_eq!(config.server.max_connections, 1);
    assert_eq!(config.store.cache_capacity_bytes, 1_048_576);
}

#[test]
fn new_keys_default_as_documented() {
    let config = Config::default();
    assert_eq!(config.server.max_connections, 512);
    assert_eq!(config.server.header_read_timeout_secs, 10);
    assert_eq!(config.server.body_read_timeout_secs, 30);
    assert_eq!(config.server.max_streams, 256);
    assert!(config.server.allowed_hosts.is_empty());
    assert_eq!(config.server.metrics_token, None);
    assert_eq!(config.server.ops_listen, None);
    assert_eq!(config.store.cache_capacity_bytes, 8 * 1024 * 1024);
    assert!(config.channels.api.tokens.is_empty());
}

#[test]
fn allowed_hosts_are_hosts_or_host_ports() {
    let text = r#"
        [server]
        allowed_hosts = [
            "*",
            "bot.example.com",
            "bot.example.com:8443",
            "10.0.0.7",
            "[::1]:8080",
            "",
            "https://bot.example.com",
            "bot.example.com/api",
            "*.example.com",
            "::1",
            "bot.example.com:99999",
            "bot example.com",
            "[::1",
        ]
    "#;
    assert_eq!(
        issues(text),
        [
            "server.allowed_hosts[5]: must not be empty",
            "server.allowed_hosts[6]: must be a host or host:port, without a scheme",
            "server.allowed_hosts[7]: must be a host or host:port, without a path",
            "server.allowed_hosts[8]: `*` must stand alone (it accepts any host)",
            "server.allowed_hosts[9]: an IPv6 address must be written in brackets: [::1]:8080",
            "server.allowed_hosts[10]: the port must be a number from 0 to 65535",
            "server.allowed_hosts[11]: must be a host name or IP address (letters, digits, `-`, `.`, `_`), optionally with :port",
            "server.allowed_hosts[12]: an IPv6 address needs a closing `]`",
        ]
    );
    let config =
        parse("[server]\nallowed_hosts = [\"*\", \"[::1]\", \"bot.example.com:8443\"]\n").unwrap();
    assert_eq!(config.server.allowed_hosts.len(), 3);
}

#[test]
fn ops_listener_must_differ_from_the_main_listener() {
    let clash = "server.ops_listen: must differ from server.listen (another port, or another address that is not a wildcard)";
    assert_eq!(
        issues("[server]\nlisten = \"127.0.0.1:8080\"\nops_listen = \"127.0.0.1:8080\"\n"),
        [clash]
    );
    assert_eq!(
        issues("[server]\nlisten = \"127.0.0.1:8080\"\nops_listen = \"0.0.0.0:8080\"\n"),
        [clash]
    );
    let config =
        parse("[server]\nlisten = \"127.0.0.1:8080\"\nops_listen = \"127.0.0.1:9090\"\n").unwrap();
    assert_eq!(
        config.server.ops_listen,
        Some(SocketAddr::from(([127, 0, 0, 1], 9090)))
    );
    // Port 0 picks a fresh port for each listener.
    parse("[server]\nlisten = \"127.0.0.1:0\"\nops_listen = \"127.0.0.1:0\"\n").unwrap();
    parse("[server]\nlisten = \"127.0.0.1:8080\"\nops_listen = \"127.0.0.2:8080\"\n").unwrap();
    // Empty (an unset `${VAR:-}`) means no ops listener.
    let config = parse("[server]\nops_listen = \"${ANTLER_OPS_LISTEN:-}\"\n").unwrap();
    assert_eq!(config.server.ops_listen, None);
}

#[test]
fn api_users_are_well_formed_and_unique() {
    let long = "u".repeat(65);
    let longest = "u".repeat(64);
    let text = format!(
        r#"
        [[channels.api.tokens]]
        token = "token-0"
        user = "alice.smith_1@example-org"
        [[channels.api.tokens]]
        token = "token-1"
        user = "a/b"
        [[channels.api.tokens]]
        token = "token-2"
        user = "api:alice"
        [[channels.api.tokens]]
        token = "token-3"
        user = ""
        [[channels.api.tokens]]
        token = "token-4"
        user = "{long}"
        [[channels.api.tokens]]
        token = "token-5"
        user = "alice.smith_1@example-org"
        role = "admin"
        [[channels.api.tokens]]
        token = "token-6"
        user = "{longest}"
        [[channels.api.tokens]]
        token = "token-7"
        user = "bob smith"
        "#
    );
    let rule = "must be 1 to 64 characters from A-Z, a-z, 0-9, `.`, `_`, `@` and `-`";
    assert_eq!(
        issues(&text),
        [
            format!("channels.api.tokens[1].user: {rule}"),
            format!("channels.api.tokens[2].user: {rule}"),
            format!("channels.api.tokens[3].user: {rule}"),
            format!("channels.api.tokens[4].user: {rule}"),
            "channels.api.tokens[5].user: duplicate user (the same as channels.api.tokens[0].user)"
                .to_owned(),
            format!("channels.api.tokens[7].user: {rule}"),
        ]
    );
    let config = parse(
        "[[channels.api.tokens]]\ntoken = \"t\"\nuser = \"alice\"\n\
         [[channels.api.tokens]]\ntoken = \"u\"\nuser = \"bob\"\nrole = \"admin\"\n",
    )
    .unwrap();
    assert_eq!(
        config.channels.api.tokens[0].role,
        ApiRole::User,
        "the default"
    );
    assert_eq!(config.channels.api.tokens[1].role, ApiRole::Admin);
    assert_eq!(config.channels.api.tokens[1].user, "bob");
    assert_eq!(config.channels.api.tokens[1].token.expose(), "u");
}

#[test]
fn every_token_is_distinct_and_not_empty() {
    let text = r#"
        [server]
        metrics_token = "shared-admin-token"
        [channels.api]
        token = "shared-admin-token"
        [[channels.api.tokens]]
        token = "shared-admin-token"
        user = "alice"
        [[channels.api.tokens]]
        token = "user-token-bob"
        user = "bob"
        [[channels.api.tokens]]
        token = "user-token-bob"
        user = "carol"
        [[channels.api.tokens]]
        token = "${UNSET_TOKEN:-}"
        user = "dave"
    "#;
    let found = issues(text);
    assert_eq!(
        found,
        [
            "channels.api.tokens[0].token: must differ from channels.api.token",
            "channels.api.tokens[2].token: must differ from channels.api.tokens[1].token",
            "channels.api.tokens[3].token: must not be empty",
            "server.metrics_token: must differ from channels.api.token",
        ]
    );
    for issue in &found {
        assert!(
            !issue.contains("shared-admin") && !issue.contains("user-token"),
            "{issue}"
        );
    }
}

#[test]
fn non_loopback_listen_needs_a_token_and_long_tokens() {
    // `tokens` alone satisfies the token requirement.
    let text = "[server]\nlisten = \"0.0.0.0:8080\"\n\
                [[channels.api.tokens]]\ntoken = \"0123456789abcdef\"\nuser = \"alice\"\n";
    parse(text).unwrap();

    let text = r#"
        [server]
        listen = "0.0.0.0:8080"
        metrics_token = "short-metrics"
        [channels.api]
        token = "short-admin"
        [[channels.api.tokens]]
        token = "short-user"
        user = "alice"
        [[channels.api.tokens]]
        token = "long-enough-user-token"
        user = "bob"
    "#;
    let rule = "must be at least 16 characters when server.listen is not a loopback address";
    let found = issues(text);
    assert_eq!(
        found,
        [
            format!("channels.api.token: {rule}"),
            format!("channels.api.tokens[0].token: {rule}"),
            format!("server.metrics_token: {rule}"),
        ]
    );
    for issue in &found {
        assert!(!issue.contains("short-"), "token shown: {issue}");
    }
    // Characters, not bytes: 15 two-byte characters are too short.
    let text = format!(
        "[server]\nlisten = \"0.0.0.0:8080\"\n[channels.api]\ntoken = \"{}\"\n",
        "é".repeat(15)
    );
    assert_eq!(issues(&text), [format!("channels.api.token: {rule}")]);

    // On loopback, short tokens are fine.
    parse(
        "[server]\nlisten = \"127.0.0.1:8080\"\nmetrics_token = \"m\"\n\
         [channels.api]\ntoken = \"t\"\n[[channels.api.tokens]]\ntoken = \"u\"\nuser = \"alice\"\n",
    )
    .unwrap();
    // A disabled API channel's tokens guard nothing; the metrics token still guards /metrics.
    let text = "[server]\nlisten = \"0.0.0.0:8080\"\nmetrics_token = \"m\"\n\
                [channels.api]\nenabled = false\ntoken = \"t\"\n";
    assert_eq!(issues(text), [format!("server.metrics_token: {rule}")]);
}

#[test]
fn summary_shows_new_facts_with_secrets_masked() {
    let text = r#"
        [server]
        listen = "0.0.0.0:8080"
        ops_listen = "127.0.0.1:9090"
        allowed_hosts = ["bot.example.com", "*"]
        max_connections = 100
        max_streams = 20
        metrics_token = "metrics-token-0123456789"
        [store]
        cache_capacity_bytes = 67108864
        [channels.api]
        token = "admin-token-0123456789"
        [[channels.api.tokens]]
        token = "alice-token-0123456789"
        user = "alice"
        [[channels.api.tokens]]
        token = "bob-token-0123456789"
        user = "bob"
        role = "admin"
    "#;
    let summary = parse(text).unwrap().summary();
    for line in [
        "ops listener: 127.0.0.1:9090",
        "allowed hosts: bot.example.com, *",
        "limits: 100 connections, 20 streams, header timeout 10s, body timeout 30s",
        "metrics token: ***",
        "store: data (cache: 64 MiB)",
        "api channel: enabled (admin token: ***, 2 user tokens, 1 with role admin)",
    ] {
        assert!(
            summary.lines().any(|l| l == line),
            "{line:?} not in:\n{summary}"
        );
    }
    assert!(!summary.contains("token-0123456789"), "{summary}");

    let summary = parse("[[channels.api.tokens]]\ntoken = \"t\"\nuser = \"alice\"\n[store]\ncache_capacity_bytes = 2000000\n")
        .unwrap()
        .summary();
    assert!(
        summary.contains("\napi channel: enabled (admin token: not set, 1 user token)\n"),
        "{summary}"
    );
    assert!(
        summary.contains("\nstore: data (cache: 2000000 bytes)\n"),
        "{summary}"
    );
    assert!(!summary.contains("ops listener"), "{summary}");
    assert!(!summary.contains("metrics token"), "{summary}");
}

#[test]
fn example_token_table_is_valid_once_uncommented() {
    let mut uncommented = 0;
    let text: String = EXAMPLE
        .lines()
        .scan(false, |inside, line| {
            if line == "# [[channels.api.tokens]]" {
                *inside = true;
            } else if *inside && !line.starts_with("# ") {
                *inside = false;
            }
            let line = match line.strip_prefix("# ") {
                Some(rest) if *inside => {
                    uncommented += 1;
                    rest
                }
                _ => line,
            };
            Some(format!("{line}\n"))
        })
        .collect();
    assert_eq!(uncommented, 4, "the example table moved");
    let env = env_of(&[
        ("OPENAI_API_KEY", "sk-example"),
        ("ANTLER_ALICE_TOKEN", "alice-0123456789"),
    ]);
    let config = Config::from_toml_str(&text, &env).unwrap();
    let tokens = &config.channels.api.tokens;
    assert_eq!(tokens.len(), 1);
    assert_eq!(tokens[0].user, "alice");
    assert_eq!(tokens[0].role, ApiRole::User);
    assert_eq!(tokens[0].token.expose(), "alice-0123456789");
}

#[test]
fn access_lists_parse_with_numbers_as_ids_and_default_to_empty() {
    let config = parse(
        r#"
        [channels.telegram]
        allowed_users = [12345, "678"]
        allowed_chats = [-1001]
        admins = ["12345"]
        [channels.slack]
        allowed_chats = ["C0123"]
        [channels.api]
        allowed_users = ["alice"]
        "#,
    )
    .unwrap();
    let telegram = &config.channels.telegram;
    assert_eq!(telegram.allowed_users, ["12345", "678"]);
    assert_eq!(telegram.allowed_chats, ["-1001"]);
    assert_eq!(telegram.admins, ["12345"]);
    assert_eq!(config.channels.slack.allowed_chats, ["C0123"]);
    assert!(config.channels.discord.allowed_users.is_empty());
    assert!(config.channels.feishu.admins.is_empty());
    assert_eq!(config.channels.api.allowed_users, ["alice"]);
    assert!(config.channels.api.admins.is_empty());
}

#[test]
fn bad_access_lists_name_the_key_and_index() {
    let found = issues(
        r#"
        [channels.telegram]
        allowed_users = ["1", "", "1"]
        [channels.discord]
        admins = ["a", "b\u0007"]
        [channels.feishu]
        allowed_chats = ["oc_1", " "]
        [channels.api]
        allowed_users = ["alice", "bob smith", "alice"]
        admins = ["carol"]
        "#,
    );
    let rule = "must be 1 to 64 characters from A-Z, a-z, 0-9, `.`, `_`, `@` and `-`";
    for expected in [
        "channels.telegram.allowed_users[1]: must not be empty".to_owned(),
        "channels.telegram.allowed_users[2]: duplicate (the same as channels.telegram.allowed_users[0])".to_owned(),
        "channels.discord.admins[1]: must not contain control characters".to_owned(),
        "channels.feishu.allowed_chats[1]: must not be empty".to_owned(),
        format!("channels.api.allowed_users[1]: {rule}"),
        "channels.api.allowed_users[2]: duplicate (the same as channels.api.allowed_users[0])".to_owned(),
    ] {
        assert!(found.contains(&expected), "{expected:?} not in {found:?}");
    }
    // A token-less API cannot tell who asks, so it cannot have admins.
    assert!(
        found
            .iter()
            .any(|issue| issue.starts_with("channels.api.admins: needs API tokens")),
        "{found:?}"
    );
    let with_token = parse(
        r#"
        [channels.api]
        token = "admin-token-0123456789"
        admins = ["carol"]
        "#,
    )
    .unwrap();
    assert_eq!(with_token.channels.api.admins, ["carol"]);
}

#[test]
fn summarization_view_image_and_subagent_limit_keys() {
    let config = parse("").unwrap();
    let mw = &config.agent.middleware;
    assert!(mw.summarization.enabled);
    assert_eq!(mw.summarization.trigger_tokens, 32_000);
    assert_eq!(mw.summarization.keep_messages, 10);
    assert_eq!(mw.summarization.trim_tokens_to_summarize, 15_564);
    assert!(!config.model.vision);
    assert_eq!(mw.view_image.max_images, 4);
    assert_eq!(mw.view_image.max_image_bytes, 5 * 1024 * 1024);
    assert_eq!(mw.subagent_limit.max_per_response, 3);
    assert_eq!(mw.subagent_limit.max_per_run, 6);
    assert_eq!(mw.subagent_limit.tool_name, "task");
    assert!(format!("{:?}", config.model).contains("vision: false"));

    let found = issues(
        r#"
        [model]
        context_tokens = 16000
        [agent.middleware.summarization]
        trigger_tokens = 20000
        keep_messages = 0
        [agent.middleware.view_image]
        max_images = 0
        max_image_bytes = 30000000
        [agent.middleware.subagent_limit]
        max_per_response = 5
        max_per_run = 51
        tool_name = " "
        "#,
    );
    assert_eq!(
        found,
        [
            "agent.middleware.summarization.keep_messages: must be at least 1 (got 0)",
            "agent.middleware.summarization.trigger_tokens: must be below model.context_tokens \
             (20000 >= 16000), or older messages are dropped before they are summarized",
            "agent.middleware.view_image.max_images: must be between 1 and 20 (got 0)",
            "agent.middleware.view_image.max_image_bytes: must be between 1 and 20971520 \
             (20 MiB) (got 30000000)",
            "agent.middleware.subagent_limit.max_per_response: must be between 1 and 4 (got 5)",
            "agent.middleware.subagent_limit.max_per_run: must be between 1 and 50 (got 51)",
            "agent.middleware.subagent_limit.tool_name: must not be empty",
        ]
    );
    // The check against context_tokens is off when summarization is.
    parse("[model]\ncontext_tokens = 16000\n[agent.middleware.summarization]\nenabled = false\n")
        .unwrap();
}

#[test]
fn mcp_servers_parse_with_secrets_hidden() {
    let text = r#"
[[mcp.servers]]
name = "github"
command = "npx"
args = ["-y", "server-github"]
env = { GITHUB_TOKEN = "${GH}" }

[[mcp.servers]]
name = "docs"
url = "https://mcp.example.com/mcp"
bearer_token = "tok-123456"
headers = { "X-Api-Key" = "key-abcdef" }
enabled = false
timeout_secs = 5
"#;
    let config = Config::from_toml_str(text, &env_of(&[("GH", "ghp_secret_value")])).unwrap();
    let servers = &config.mcp.servers;
    assert_eq!(servers.len(), 2);
    assert_eq!(servers[0].name, "github");
    assert_eq!(servers[0].command.as_deref(), Some("npx"));
    assert_eq!(servers[0].args, ["-y", "server-github"]);
    assert_eq!(servers[0].env["GITHUB_TOKEN"].expose(), "ghp_secret_value");
    assert!(servers[0].enabled);
    assert_eq!(servers[0].timeout_secs, 60);
    assert_eq!(servers[0].connect_timeout_secs, 20);
    assert_eq!(
        servers[1].url.as_deref(),
        Some("https://mcp.example.com/mcp")
    );
    assert!(!servers[1].enabled);
    assert_eq!(servers[1].timeout_secs, 5);
    let debug = format!("{config:?}");
    for secret in ["ghp_secret_value", "tok-123456", "key-abcdef"] {
        assert!(!debug.contains(secret), "{secret} shown in {debug}");
    }
    // The summary names the enabled servers and their transport, nothing more.
    let summary = config.summary();
    assert!(
        summary.lines().any(|l| l == "mcp servers: github (stdio)"),
        "{summary}"
    );
    assert!(
        !summary.contains("npx") && !summary.contains("ghp_"),
        "{summary}"
    );
}

#[test]
fn mcp_servers_need_one_transport_and_unique_safe_names() {
    assert_issue(
        "[[mcp.servers]]\nname = \"a\"\n",
        "mcp.servers[0].command: set command (stdio) or url (streamable HTTP)",
    );
    assert_issue(
        "[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\nurl = \"http://127.0.0.1:1/mcp\"\n",
        "mcp.servers[0].url: set either command (stdio) or url (streamable HTTP), not both",
    );
    assert_issue(
        "[[mcp.servers]]\nname = \"a b\"\ncommand = \"x\"\n",
        "mcp.servers[0].name: must be 1 to 32 letters, digits, `_` or `-`, without `__`",
    );
    assert_issue(
        "[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\n[[mcp.servers]]\nname = \"a\"\ncommand = \"y\"\n",
        "mcp.servers[1].name: is used by an earlier server",
    );
    assert_issue(
        "[[mcp.servers]]\nname = \"a\"\nurl = \"ftp://host/x\"\n",
        "mcp.servers[0].url: must be an http or https URL (got scheme \"ftp\")",
    );
    assert_issue(
        "[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\nbearer_token = \"t\"\n",
        "mcp.servers[0].headers: headers and bearer_token are for url servers",
    );
    assert_issue(
        "[[mcp.servers]]\nname = \"a\"\nurl = \"http://h/mcp\"\nenv = { A = \"1\" }\n",
        "mcp.servers[0].args: args and env are for command servers",
    );
    assert_issue(
        "[[mcp.servers]]\nname = \"a\"\nurl = \"http://h/mcp\"\nheaders = { X = \"bad\\nvalue\" }\n",
        "mcp.servers[0].headers.X: is not a valid HTTP header value",
    );
    assert_issue(
        "[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\ntimeout_secs = 0\n",
        "mcp.servers[0].timeout_secs: must be at least 1 (got 0)",
    );
    let found = issues("[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\nwhat = 1\n");
    assert!(found.iter().any(|i| i.contains("what")), "{found:?}");
}

#[test]
fn web_fetch_and_deferred_tools_are_configured_and_checked() {
    let config = parse(
        "[agent.tools.web_fetch]\nallow_private = true\nallowed_hosts = [\"wiki.internal\"]\n\
         [agent.middleware.deferred_tools]\nmax_tools = 5\n",
    )
    .unwrap();
    let web_fetch = &config.agent.tools.web_fetch;
    assert!(web_fetch.enabled && web_fetch.allow_private);
    assert_eq!(web_fetch.max_bytes, 1024 * 1024);
    assert_eq!(web_fetch.timeout_secs, 20);
    assert_eq!(web_fetch.allowed_hosts, ["wiki.internal"]);
    assert_eq!(config.agent.middleware.deferred_tools.max_tools, 5);
    assert_issue(
        "[agent.tools.web_fetch]\nmax_bytes = 0\n",
        "agent.tools.web_fetch.max_bytes: must be at least 1 (got 0)",
    );
    assert_issue(
        "[agent.middleware.deferred_tools]\nmax_tools = 0\n",
        "agent.middleware.deferred_tools.max_tools: must be at least 1 (got 0)",
    );
    let found = issues("[agent.tools.web_fetch]\nallow_all = true\n");
    assert!(found.iter().any(|i| i.contains("allow_all")), "{found:?}");
}

#[test]
fn memory_defaults_and_identities_are_checked() {
    use crate::agent::memory::config::GroupFacts;

    let config = parse("").unwrap();
    let memory = &config.memory;
    assert!(memory.enabled && memory.injection_enabled);
    assert_eq!(memory.debounce_seconds, 30);
    assert_eq!(memory.max_facts, 100);
    assert_eq!(memory.max_injection_tokens, 2000);
    assert!((memory.fact_confidence_threshold - 0.7).abs() < f64::EPSILON);
    assert_eq!(memory.group_facts, GroupFacts::Work);
    assert!(!memory.group_personal_context);
    let shared = parse("[memory]\ngroup_facts = \"shareable\"\n").unwrap();
    assert_eq!(shared.memory.group_facts, GroupFacts::Shareable);
    let wrong = parse("[memory]\ngroup_facts = \"everyone\"\n")
        .unwrap_err()
        .to_string();
    assert!(wrong.contains("group_facts"), "{wrong}");

    let linked =
        parse("[[memory.identities]]\nname = \"ada\"\nids = [\"telegram:42\", \"slack:T1:U9\"]\n")
            .unwrap();
    assert_eq!(
        linked.memory.identities[0].ids,
        ["telegram:42", "slack:T1:U9"]
    );

    let found = issues(
        r#"
        [memory]
        max_facts = 0
        fact_confidence_threshold = 1.5
        max_injection_tokens = 10
        [[memory.identities]]
        name = "ada"
        ids = ["telegram:42", "irc:7"]
        [[memory.identities]]
        name = "ada"
        ids = ["telegram:42"]
        "#,
    );
    assert_eq!(
        found,
        [
            "memory.max_facts: must be between 1 and 1000 (got 0)",
            "memory.fact_confidence_threshold: must be between 0 and 1 (got 1.5)",
            "memory.max_injection_tokens: must be between 100 and 32000 (got 10)",
            "memory.identities[0].ids: `irc:7` is not `<channel>:<user id>` with a known channel",
            "memory.identities[1].name: is used by an earlier identity",
            "memory.identities[1].ids: `telegram:42` is already linked by memory.identities[0]",
        ]
    );
}

#[test]
fn subagents_default_to_three_at_once_and_bad_types_name_their_key() {
    let config = parse("").unwrap();
    assert!(config.subagents.enabled);
    assert_eq!(config.subagents.max_concurrent, 3);
    assert_eq!(config.subagents.timeout_seconds, 900);

    let custom = parse(
        r#"
        [subagents.types.researcher]
        description = "Reads the web"
        tools = ["web_fetch"]
        max_turns = 20
        "#,
    )
    .unwrap();
    let names: Vec<String> = custom
        .subagents
        .types()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["bash", "general-purpose", "researcher"]);

    let found = issues(
        r#"
        [subagents]
        max_concurrent = 0
        timeout_seconds = 0
        [subagents.types.general-purpose]
        max_turns = 0
        [subagents.types.nameless]
        tools = []
        model = " "
        [subagents.types.Bad_Name]
        description = "x"
        timeout_seconds = 100000
        "#,
    );
    assert_eq!(
        found,
        [
            "subagents.max_concurrent: must be between 1 and 16 (got 0)",
            "subagents.timeout_seconds: must be between 1 and 86400 seconds (got 0)",
            "subagents.types.Bad_Name: a type's name must be 1 to 64 lowercase letters, digits, `_` or `-`",
            "subagents.types.Bad_Name.timeout_seconds: must be between 1 and 86400 seconds (got 100000)",
            "subagents.types.general-purpose.max_turns: must be between 1 and 500 (got 0)",
            "subagents.types.nameless.description: must say what the type is for (the lead agent chooses by it)",
            "subagents.types.nameless.model: must not be empty (leave it out to use `model.model`)",
            "subagents.types.nameless.tools: must name at least one tool (leave it out for all)",
        ]
    );
    assert_issue(
        "[subagents]\nmax_concurent = 3\n",
        "subagents.max_concurent: unknown key (expected one of: enabled, max_concurrent, timeout_seconds, token_budget, types)",
    );
}

#[test]
fn the_task_calls_limit_follows_the_slowest_subagent_type_and_a_lower_one_is_refused() {
    let config = parse("").unwrap();
    assert_eq!(config.subagents.token_budget, 1_000_000);
    // 900 s of the slowest type and 60 s for its call's wait and record.
    assert_eq!(
        config.subagents.longest_call(),
        Some(std::time::Duration::from_secs(960))
    );
    let custom =
        parse("[subagents.types.slow]\ndescription = \"x\"\ntimeout_seconds = 3000\n").unwrap();
    assert_eq!(
        custom.subagents.longest_call(),
        Some(std::time::Duration::from_secs(3060))
    );
    let off = parse("[subagents]\nenabled = false\n").unwrap();
    assert_eq!(off.subagents.longest_call(), None);

    assert_issue(
        "[agent]\ntool_timeouts = { task = 600 }\n",
        "agent.tool_timeouts.task: must be at least 960 seconds: the slowest subagent type's \
         timeout_seconds and 60 s for the task's wait and record (or leave it out)",
    );
    assert!(parse("[agent]\ntool_timeouts = { task = 960 }\n").is_ok());
}

#[test]
fn the_time_zone_is_an_iana_name() {
    let config = parse("[agent]\ntimezone = \"Europe/Berlin\"\n").unwrap();
    assert_eq!(
        config.agent.time_zone().unwrap().iana_name(),
        Some("Europe/Berlin")
    );
    assert_eq!(parse("").unwrap().agent.timezone, "UTC");
    // A container without /usr/share/zoneinfo still has the zones antler carries.
    assert!(
        jiff::tz::TimeZoneDatabase::bundled()
            .get("Europe/Berlin")
            .is_ok()
    );
    let found = issues("[agent]\ntimezone = \"Mars/Olympus\"\n");
    assert!(
        found.iter().any(|issue| issue
            .starts_with("agent.timezone: `Mars/Olympus` is not a known IANA time zone")),
        "{found:?}"
    );
}

#[test]
fn the_default_lead_prompt_is_short_fixed_and_covers_files_questions_and_chat_style() {
    let words = DEFAULT_SYSTEM_PROMPT.split_whitespace().count();
    assert!(words <= 400, "{words} words");
    for needed in [
        "You are antler",
        "/mnt/user-data/uploads",
        "/mnt/user-data/outputs",
        "present_files",
        "ask_clarification",
        "<current_time>",
        "<user_message>",
        "Markdown",
    ] {
        assert!(DEFAULT_SYSTEM_PROMPT.contains(needed), "{needed}");
    }
    // The same bytes for every run: nothing that could be a date or a time.
    assert!(
        !DEFAULT_SYSTEM_PROMPT.chars().any(|c| c.is_ascii_digit()),
        "{DEFAULT_SYSTEM_PROMPT}"
    );
    assert!(
        !DEFAULT_SYSTEM_PROMPT.contains("  "),
        "no stray line-continuation spaces"
    );
}

#[test]
fn skills_are_on_by_default_and_their_folders_are_checked() {
    let config = parse("").unwrap();
    assert!(config.skills.enabled);
    assert!(config.skills.paths.is_empty());
    assert_issue(
        "[skills]\npaths = [\"a\", \"\"]\n",
        "skills.paths[1]: must not be empty",
    );
    assert_issue(
        "[skills]\npaths = [\"a\", \"a\"]\n",
        "skills.paths[1]: is listed twice",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("antler.toml");
    std::fs::write(&path, "[skills]\npaths = [\"mine\"]\n").unwrap();
    let loaded = Config::load(&path).unwrap();
    assert_eq!(
        loaded.skills.folders(),
        [(dir.path().join("mine"), true)],
        "relative to the config file's folder"
    );
}

// ---------------------------------------------------------------------------------------------
// Every platform from the environment alone (the container image's config)
// ---------------------------------------------------------------------------------------------

#[test]
fn local_default_turns_each_platform_on_from_its_token() {
    let public_key = "ab".repeat(32);
    let pairs = [
        ("ANTLER_TELEGRAM_BOT_TOKEN", "7000000001:TEST-token"),
        ("ANTLER_TELEGRAM_API_URL", "http://127.0.0.1:9/"),
        ("ANTLER_SLACK_BOT_TOKEN", "xoxb-1-2-abc"),
        ("ANTLER_SLACK_APP_TOKEN", "xapp-1-A1-2-abc"),
        ("ANTLER_DISCORD_BOT_TOKEN", "discord-token"),
        ("ANTLER_DISCORD_APPLICATION_ID", "123456789012345678"),
        ("ANTLER_DISCORD_PUBLIC_KEY", &public_key),
        ("ANTLER_FEISHU_APP_ID", "cli_a1b2c3"),
        ("ANTLER_FEISHU_APP_SECRET", "feishu-secret"),
        ("ANTLER_METRICS_TOKEN", "metrics-token-0123456789"),
        ("ANTLER_OPS_LISTEN", "127.0.0.1:9090"),
        ("ANTLER_TELEGRAM_ALLOWED_USERS", "5550001001, 5550001002"),
        ("ANTLER_TELEGRAM_ADMINS", "5550001001"),
        ("ANTLER_SLACK_ALLOWED_CHATS", "C0OPS"),
    ];
    let env = env_of(&pairs);
    let config = Config::from_toml_str(LOCAL, &env).unwrap();
    assert_eq!(
        config.channels.enabled_platforms(),
        ["telegram", "slack", "discord", "feishu"]
    );
    let channels = &config.channels;
    assert_eq!(channels.telegram.mode, TelegramMode::Polling);
    assert_eq!(channels.telegram.api_url, "http://127.0.0.1:9/");
    assert_eq!(channels.slack.mode, SlackMode::Socket);
    assert!(channels.discord.gateway);
    assert_eq!(channels.feishu.mode, FeishuMode::Websocket);
    assert!(config.server.metrics_token.is_some());
    assert_eq!(
        config.server.ops_listen,
        Some(SocketAddr::from(([127, 0, 0, 1], 9090)))
    );
    assert_eq!(
        channels.telegram.allowed_users,
        ["5550001001", "5550001002"],
        "a list from one variable, commas and spaces between"
    );
    assert_eq!(channels.telegram.admins, ["5550001001"]);
    assert_eq!(channels.slack.allowed_chats, ["C0OPS"]);
    assert!(channels.discord.allowed_users.is_empty(), "unset: empty");
    let discord = &channels.discord;
    assert_eq!(
        DmPolicy::effective(
            discord.dm_policy,
            &discord.allowed_users,
            &discord.allowed_chats
        ),
        DmPolicy::Pairing
    );

    // One token alone turns on its platform alone.
    let env = env_of(&[("ANTLER_TELEGRAM_BOT_TOKEN", "7000000001:TEST-token")]);
    let config = Config::from_toml_str(LOCAL, &env).unwrap();
    assert_eq!(config.channels.enabled_platforms(), ["telegram"]);
}

#[test]
fn booleans_and_numbers_come_from_the_environment() {
    let text = "[channels.telegram]\nenabled = \"${TG_ON}\"\nmode = \"polling\"\n\
                bot_token = \"7000000001:TEST-token\"\n\
                [server]\nmax_connections = \"${MAX_CONN:-64}\"\n";
    let config =
        Config::from_toml_str(text, &env_of(&[("TG_ON", "true"), ("MAX_CONN", "32")])).unwrap();
    assert!(config.channels.telegram.enabled);
    assert_eq!(config.server.max_connections, 32);
    let config = Config::from_toml_str(text, &env_of(&[("TG_ON", "false")])).unwrap();
    assert!(!config.channels.telegram.enabled);
    assert_eq!(config.server.max_connections, 64, "the default applies");
}

#[test]
fn a_value_from_the_environment_that_does_not_parse_names_the_key_and_the_variable() {
    let text = "[channels.telegram]\nenabled = \"${TG_ON}\"\n\
                [server]\nmax_connections = \"${MAX_CONN}\"\n";
    let err = Config::from_toml_str(
        text,
        &env_of(&[("TG_ON", "yes-please"), ("MAX_CONN", "many")]),
    )
    .unwrap_err();
    let issues: Vec<String> = err.issues().iter().map(ToString::to_string).collect();
    assert_eq!(issues.len(), 2, "{issues:?}");
    assert!(
        issues[0].starts_with("channels.telegram.enabled: ")
            && issues[0].ends_with("(from environment variable TG_ON)"),
        "{issues:?}"
    );
    assert!(
        issues[1].starts_with("server.max_connections: ")
            && issues[1].ends_with("(from environment variable MAX_CONN)"),
        "{issues:?}"
    );
    // Neither value is quoted: it could have been a secret.
    assert!(!err.to_string().contains("yes-please") && !err.to_string().contains("many"));
}

#[test]
fn an_alternative_is_its_word_when_set_and_leaves_the_key_out_when_not() {
    let text = "[channels.telegram]\nenabled = \"${TOKEN:+true}\"\nmode = \"polling\"\n\
                bot_token = \"${TOKEN:-}\"\n[model]\nmodel = \"m-${SUFFIX:+x}\"\n";
    let config = Config::from_toml_str(
        text,
        &env_of(&[("TOKEN", "7000000001:TEST-token"), ("SUFFIX", "1")]),
    )
    .unwrap();
    assert!(config.channels.telegram.enabled);
    assert_eq!(config.model.model, "m-x");
    // Unset or empty: the whole value is left out (the default, false); inside text, nothing.
    for env in [env_of(&[]), env_of(&[("TOKEN", ""), ("SUFFIX", "")])] {
        let config = Config::from_toml_str(text, &env).unwrap();
        assert!(!config.channels.telegram.enabled);
        assert_eq!(config.model.model, "m-");
    }
}

#[test]
fn the_env_file_beside_the_config_fills_in_what_the_environment_does_not_set() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("antler.toml");
    std::fs::write(
        &path,
        "[model]\nmodel = \"${ANTLER_TEST_ENV_FILE_MODEL}\"\n\
         api_key = \"${ANTLER_TEST_ENV_FILE_KEY}\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join(".env"),
        "# secrets\n\nexport ANTLER_TEST_ENV_FILE_MODEL='from-file'\n\
         ANTLER_TEST_ENV_FILE_KEY=\"sk-\\\"quoted\\\"\" # a comment\n",
    )
    .unwrap();
    std::fs::set_permissions(
        dir.path().join(".env"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let config = Config::load(&path).unwrap();
    assert_eq!(config.model.model, "from-file");
    assert_eq!(
        config.model.api_key.as_ref().map(Secret::expose),
        Some("sk-\"quoted\"")
    );
    // PATH is set in the environment: the file does not override it.
    std::fs::write(&path, "[model]\nmodel = \"${PATH}\"\n").unwrap();
    std::fs::write(dir.path().join(".env"), "PATH=from-file\n").unwrap();
    let config = Config::load(&path).unwrap();
    assert_eq!(config.model.model, std::env::var("PATH").unwrap());
    // A broken line is named by its number, never quoted.
    std::fs::write(dir.path().join(".env"), "A=1\nsecret-without-equals\n").unwrap();
    let err = Config::load(&path).unwrap_err().to_string();
    assert!(err.ends_with(".env, line 2: expected NAME=value"), "{err}");
    assert!(!err.contains("secret-without"), "{err}");
}

#[test]
fn locate_takes_the_named_file_else_reports_where_it_looked() {
    let named = Path::new("/somewhere/antler.toml");
    assert_eq!(super::locate(Some(named)).unwrap(), named);
    let message = super::ConfigNotFound.to_string();
    for place in [
        "$ANTLER_CONFIG",
        "./config/antler.toml",
        "/etc/antler/antler.toml",
        "antler init",
    ] {
        assert!(message.contains(place), "{message}");
    }
}

#[test]
fn wait_lasts_as_long_as_the_turn_may_run_unless_set() {
    // Unset: the turn's limit plus the margin for the queue and delivery, not a fixed cap.
    let config = parse("[agent]\nturn_timeout_secs = 900\n").unwrap();
    assert_eq!(
        config.api_wait_limit(),
        Duration::from_secs(900 + WAIT_MARGIN_SECS)
    );
    assert_eq!(
        parse("").unwrap().api_wait_limit(),
        Duration::from_secs(600 + WAIT_MARGIN_SECS)
    );
    let config = parse("[server]\nwait_timeout_secs = 30\n").unwrap();
    assert_eq!(config.api_wait_limit(), Duration::from_secs(30));
    assert_issue(
        "[server]\nwait_timeout_secs = 0\n",
        "server.wait_timeout_secs: must be at least 1 (got 0)",
    );
}

#[test]
fn dm_policy_parses_defaults_by_the_allowlists_and_open_must_not_list_anyone() {
    use crate::config::DmPolicy;
    let config = parse(
        r#"
        [channels.telegram]
        dm_policy = "allowlist"
        [channels.slack]
        allowed_users = ["U1"]
        [channels.discord]
        dm_policy = "open"
        "#,
    )
    .unwrap();
    let channels = &config.channels;
    assert_eq!(channels.telegram.dm_policy, Some(DmPolicy::Allowlist));
    assert_eq!(channels.discord.dm_policy, Some(DmPolicy::Open));
    assert_eq!(channels.feishu.dm_policy, None);
    let effective =
        |policy, users: &[String], chats: &[String]| DmPolicy::effective(policy, users, chats);
    assert_eq!(effective(None, &[], &[]), DmPolicy::Pairing);
    assert_eq!(
        effective(None, &channels.slack.allowed_users, &[]),
        DmPolicy::Allowlist
    );
    assert_eq!(DmPolicy::Open.as_str(), "open");

    let found = issues(
        r#"
        [channels.telegram]
        dm_policy = "open"
        allowed_chats = ["-100"]
        [channels.feishu]
        dm_policy = "open"
        "#,
    );
    assert_eq!(
        found,
        [
            "channels.telegram.dm_policy: \"open\" lets anyone talk, but allowed_users or \
          allowed_chats names someone; empty them, or choose \"allowlist\" or \"pairing\""
        ]
    );
    let bad = parse("[channels.slack]\ndm_policy = \"closed\"\n")
        .unwrap_err()
        .to_string();
    assert!(bad.contains("channels.slack.dm_policy"), "{bad}");
}

#[test]
fn who_may_talk_the_prompt_skills_and_log_level_change_without_a_restart() {
    let running = parse("[channels.telegram]\nallowed_users = [\"1\"]\n").unwrap();
    let new = parse(
        "[server]\nlog_level = \"debug\"\n\
         [model]\nsystem_prompt = \"Answer in French.\"\n\
         [skills]\npaths = [\"more-skills\"]\n\
         [channels.telegram]\nallowed_users = [\"1\", \"2\"]\nadmins = [\"1\"]\n\
         dm_policy = \"allowlist\"\n[channels.api]\nallowed_users = [\"ops\"]\n",
    )
    .unwrap();
    assert!(super::needs_restart(&running, &new).is_empty());
    let new = parse(
        "[channels.telegram]\nallowed_users = [\"1\"]\nmode = \"polling\"\n\
         [agent]\nmax_iterations = 3\n",
    )
    .unwrap();
    assert_eq!(
        super::needs_restart(&running, &new),
        ["agent", "channels.telegram"]
    );
    let new = parse(
        "[channels.telegram]\nallowed_users = [\"1\"]\n[skills]\nenabled = false\n\
         [model]\nmodel = \"other\"\n",
    )
    .unwrap();
    assert_eq!(
        super::needs_restart(&running, &new),
        ["model", "skills"],
        "switching skills off changes the chain; another model, the client"
    );
}

#[test]
fn an_id_list_is_a_toml_list_or_one_string_of_comma_separated_ids() {
    let text = "[channels.telegram]\nallowed_users = \"${USERS:-}\"\nadmins = [42, \"43\"]\n";
    let config = Config::from_toml_str(text, &env_of(&[("USERS", "1, 2,,3 ")])).unwrap();
    assert_eq!(config.channels.telegram.allowed_users, ["1", "2", "3"]);
    assert_eq!(config.channels.telegram.admins, ["42", "43"]);
    let config = Config::from_toml_str(text, &env_of(&[])).unwrap();
    assert!(config.channels.telegram.allowed_users.is_empty());
    let config = Config::from_toml_str(text, &env_of(&[("USERS", "5550001001")])).unwrap();
    assert_eq!(
        config.channels.telegram.allowed_users,
        ["5550001001"],
        "one numeric id"
    );
    let wrong = Config::from_toml_str("[channels.telegram]\nadmins = true\n", &env_of(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        wrong.contains("channels.telegram.admins") && wrong.contains("comma"),
        "{wrong}"
    );
}

#[test]
fn schedules_are_checked_naming_the_key_and_read_in_their_zone() {
    let config = parse(
        r#"
        [agent]
        timezone = "Europe/Berlin"
        [[schedules]]
        name = "morning-errors"
        cron = "0 9 * * 1-5"
        conversation = "api:ops"
        prompt = "Summarise the errors"
        [[schedules]]
        name = "queue"
        every = "15m"
        timezone = "UTC"
        conversation = "api:ops"
        prompt = "Queue depth?"
        missed = "skip"
        "#,
    )
    .unwrap();
    let morning = config.schedules[0]
        .schedule(&config.agent.timezone)
        .unwrap();
    assert_eq!(morning.when_text, "0 9 * * 1-5 (Europe/Berlin)");
    assert_eq!(morning.missed, crate::schedule::Missed::Once);
    let queue = config.schedules[1]
        .schedule(&config.agent.timezone)
        .unwrap();
    assert_eq!(queue.when_text, "every 15m");
    assert_eq!(queue.missed, crate::schedule::Missed::Skip);

    let found = issues(
        r#"
        [[schedules]]
        name = "a"
        cron = "0 9 * * *"
        conversation = "telegram:42"
        prompt = "hi"
        [[schedules]]
        name = "a"
        conversation = "api:ops"
        prompt = "hi"
        [[schedules]]
        name = "b"
        every = "5s"
        conversation = "api"
        prompt = "hi"
        "#,
    );
    assert_eq!(
        found,
        [
            "schedules[0].conversation: is on `telegram`, which is not an enabled channel",
            "schedules[1].name: is used by an earlier schedule",
            "schedules[1].cron: set cron (`0 9 * * 1-5`) or every (`15m`)",
            "schedules[2].every: must be at least a minute",
            "schedules[2].conversation: must be a conversation key `<channel>:<chat>` such as \
             `slack:T0ACME:C0OPS` or `telegram:-1001234567890`, at most 300 characters",
        ]
    );
    let unknown = issues("[[schedules]]\nname = \"a\"\nwhen = \"daily\"\n");
    assert!(
        unknown
            .iter()
            .any(|issue| issue.starts_with("schedules[0].when")),
        "{unknown:?}"
    );
}

#[test]
fn the_postgres_store_needs_a_postgres_url_and_keeps_it_secret() {
    assert_issue(
        "[store]\nbackend = \"postgres\"\n",
        "store.url: is required with store.backend = \"postgres\" \
         (postgres://user:password@host:5432/db)",
    );
    let found = issues("[store]\nbackend = \"postgres\"\nurl = \"mysql://u:hunter2@db/x\"\n");
    assert_eq!(
        found,
        ["store.url: must be a postgres:// or postgresql:// URL"]
    );
    assert_issue(
        "[store]\nbackend = \"postgres\"\nurl = \"postgres://db/x\"\npool_size = 0\n",
        "store.pool_size: must be at least 1 (got 0)",
    );
    assert_issue(
        "[store]\nlease_secs = 2\n",
        "store.lease_secs: must be at least 3 (got 2)",
    );
    assert!(
        !issues("[store]\nbackend = \"mongo\"\n").is_empty(),
        "an unknown backend is refused"
    );
    let config = Config::from_toml_str(
        "[store]\nbackend = \"postgres\"\nurl = \"${DATABASE_URL}\"\nreplica = \"a\"\n",
        &env_of(&[("DATABASE_URL", "postgres://antler:hunter2@db:5432/antler")]),
    )
    .unwrap();
    assert_eq!(config.store.backend, StoreBackend::Postgres);
    assert_eq!(
        config.store.url.as_ref().map(Secret::expose),
        Some("postgres://antler:hunter2@db:5432/antler")
    );
    assert_eq!(config.store.replica.as_deref(), Some("a"));
    assert!(!format!("{config:?}").contains("hunter2"));
    assert!(!config.summary().contains("hunter2"));
}

#[test]
fn the_local_config_takes_the_postgres_store_from_the_environment() {
    // What deploy/compose.postgres.yaml and deploy/kubernetes/postgres/ set.
    let env = env_of(&[
        ("ANTLER_STORE_BACKEND", "postgres"),
        (
            "DATABASE_URL",
            "postgres://antler:hunter2@db:5432/antler?sslmode=verify-full",
        ),
        ("ANTLER_REPLICA", "antler-2"),
    ]);
    let config = Config::from_toml_str(LOCAL, &env).unwrap();
    assert_eq!(config.store.backend, StoreBackend::Postgres);
    assert_eq!(
        config.store.url.as_ref().map(Secret::expose),
        Some("postgres://antler:hunter2@db:5432/antler?sslmode=verify-full")
    );
    assert_eq!(config.store.replica.as_deref(), Some("antler-2"));
    assert!(!config.summary().contains("hunter2"));

    // Unset: sled, no URL, the default replica name.
    let config = Config::from_toml_str(LOCAL, &env_of(&[])).unwrap();
    assert_eq!(config.store.backend, StoreBackend::Sled);
    assert!(config.store.url.is_none());
    assert!(config.store.replica.is_none());

    // The backend without a URL names the key.
    let refused =
        Config::from_toml_str(LOCAL, &env_of(&[("ANTLER_STORE_BACKEND", "postgres")])).unwrap_err();
    assert!(refused.to_string().contains("store.url"), "{refused}");
}

#[test]
fn telemetry_is_off_by_default_and_its_urls_are_checked() {
    let config = parse("").unwrap();
    assert_eq!(
        config.telemetry,
        crate::telemetry::TelemetryConfig::default()
    );

    let on = parse(
        r#"
        [telemetry]
        otlp_endpoint = "http://user:hunter2@collector:4318/"
        trace_url = "https://tempo.example/trace/{trace_id}"
        "#,
    )
    .unwrap();
    assert_eq!(
        on.telemetry.otlp_endpoint.as_deref(),
        Some("http://user:hunter2@collector:4318/")
    );
    let summary = on.summary();
    assert!(
        summary.contains("traces: exported to http://user:***@collector:4318"),
        "{summary}"
    );
    assert!(!summary.contains("hunter2"), "{summary}");

    let found = issues(
        r#"
        [telemetry]
        otlp_endpoint = "collector:4317"
        trace_url = "https://tempo.example/trace/"
        "#,
    );
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].starts_with("telemetry.otlp_endpoint: "),
        "{found:?}"
    );
    assert_eq!(
        found[1],
        "telemetry.trace_url: must contain `{trace_id}`, where the trace id goes"
    );
    // Left empty (`${VAR:-}` unset) is the same as left out.
    let empty = parse("[telemetry]\notlp_endpoint = \"\"\n").unwrap();
    assert_eq!(empty.telemetry.otlp_endpoint.as_deref(), Some(""));
}
