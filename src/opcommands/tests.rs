use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::exec::{Origin, Run, Runner, Utf8Pieces, fenced};
use super::*;
use crate::agent::input::ThreadFolders;

fn deploy() -> CommandConfig {
    toml::from_str(
        r#"
        name = "deploy"
        description = "Deploy a service"
        run = ["/opt/ops/deploy.sh", "--service={service}", "{version}", "--now"]
        args = [ { name = "service", pattern = "[a-z0-9-]{1,40}" },
                 { name = "version", pattern = "^v[0-9]+\\.[0-9]+\\.[0-9]+$", optional = true } ]
        "#,
    )
    .unwrap()
}

fn command(config: CommandConfig) -> OperatorCommand {
    OperatorCommand::new(config).unwrap()
}

#[test]
fn defaults_are_admins_five_minutes_a_tool_and_the_workspace() {
    let config = deploy();
    assert_eq!(config.roles, vec![CommandRole::Admin]);
    assert_eq!(config.timeout_secs, 300);
    assert!(config.tool);
    assert_eq!(config.cwd, None);
    assert!(config.env.is_empty());
    let deploy = command(config);
    assert!(deploy.allows(Role::Admin));
    assert!(!deploy.allows(Role::User));
    assert_eq!(deploy.tool_name(), "cmd_deploy");
    assert_eq!(deploy.usage(), "/deploy <service> [version]");
}

#[test]
fn typed_arguments_become_argv_items_and_an_omitted_optional_drops_its_item() {
    let deploy = command(deploy());
    let values = deploy.parse_typed("api v1.4.2").unwrap();
    assert_eq!(
        deploy.argv(&values),
        ["/opt/ops/deploy.sh", "--service=api", "v1.4.2", "--now"]
    );
    let values = deploy.parse_typed("  'api'  ").unwrap();
    assert_eq!(
        deploy.argv(&values),
        ["/opt/ops/deploy.sh", "--service=api", "--now"]
    );
}

#[test]
fn injection_and_bad_values_are_refused_by_the_whole_pattern() {
    let deploy = command(deploy());
    let no_match = |name: &str| ArgsError::NoMatch {
        name: name.to_owned(),
        pattern: deploy
            .config
            .args
            .iter()
            .find(|arg| arg.name == name)
            .unwrap()
            .pattern
            .clone(),
    };
    // The pattern `[a-z0-9-]{1,40}` is unanchored as written, but matches whole values only.
    assert_eq!(
        deploy.parse_typed(r#""api; rm -rf /""#),
        Err(no_match("service"))
    );
    assert_eq!(deploy.parse_typed("api$(reboot)"), Err(no_match("service")));
    assert_eq!(deploy.parse_typed("api v1"), Err(no_match("version")));
    assert_eq!(
        deploy.parse_typed(""),
        Err(ArgsError::Missing("service".into()))
    );
    assert_eq!(
        deploy.parse_typed("api v1.0.0 extra"),
        Err(ArgsError::TooMany)
    );
    assert_eq!(deploy.parse_typed("\"api"), Err(ArgsError::UnclosedQuote));
    let long = "a".repeat(MAX_VALUE_BYTES + 1);
    assert_eq!(deploy.parse_typed(&long), Err(no_match("service")));
}

#[test]
fn quotes_group_words() {
    assert_eq!(
        split_words(r#"a "b c" 'd "e"' "f\"g\\" h'i j'"#).unwrap(),
        ["a", "b c", "d \"e\"", "f\"g\\", "hi j"]
    );
    assert_eq!(split_words(r#""""#).unwrap(), [""]);
}

#[test]
fn called_arguments_are_checked_like_typed_ones() {
    let deploy = command(deploy());
    assert_eq!(
        deploy.parse_called(&json!({"service": "api"})).unwrap(),
        [Some("api".to_owned()), None]
    );
    assert_eq!(
        deploy.parse_called(&json!({"service": "api; rm -rf /"})),
        Err(ArgsError::NoMatch {
            name: "service".into(),
            pattern: "[a-z0-9-]{1,40}".into()
        })
    );
    assert_eq!(
        deploy.parse_called(&json!({"service": "api", "force": "yes"})),
        Err(ArgsError::Unknown("force".into()))
    );
    assert_eq!(
        deploy.parse_called(&json!({"service": 3})),
        Err(ArgsError::NotText("service".into()))
    );
    assert_eq!(
        deploy.parse_called(&json!({})),
        Err(ArgsError::Missing("service".into()))
    );
}

#[test]
fn the_tool_schema_has_one_string_per_argument_with_its_pattern() {
    let tool = tool::CommandTool::new(
        Arc::new(command(deploy())),
        Arc::new(Runner::new(Path::new("/nonexistent"), 1024)),
    );
    let spec = crate::agent::tools::Tool::spec(&tool);
    assert_eq!(spec.name, "cmd_deploy");
    assert_eq!(
        spec.parameters,
        json!({
            "type": "object",
            "properties": {
                "service": {"type": "string", "pattern": "^(?:[a-z0-9-]{1,40})$"},
                "version": {"type": "string", "pattern": "^(?:^v[0-9]+\\.[0-9]+\\.[0-9]+$)$"}
            },
            "required": ["service"],
            "additionalProperties": false
        })
    );
    assert!(
        regex::Regex::new("^[A-Za-z0-9_-]+$")
            .unwrap()
            .is_match(&spec.name)
    );
}

#[test]
fn help_lists_the_commands_before_its_last_line() {
    let mut open = deploy();
    open.name = "uptime".into();
    open.description = "How long the hosts are up".into();
    open.args.clear();
    open.roles = vec![CommandRole::User];
    let commands =
        OperatorCommands::from_config(&[deploy(), open], Path::new("/nonexistent"), 1024);
    assert_eq!(commands.tools().len(), 2);
    assert_eq!(
        commands.help("Commands:\n/help — this list\nAnything else."),
        "Commands:\n/help — this list\n\
         /deploy <service> [version] — Deploy a service (admins)\n\
         /uptime — How long the hosts are up\n\
         Anything else."
    );
    assert_eq!(OperatorCommands::default().help("a\nb"), "a\nb");
}

#[test]
fn admin_commands_join_the_guardrails_admin_only_list() {
    let mut open = deploy();
    open.name = "uptime".into();
    open.roles = vec![CommandRole::User, CommandRole::Admin];
    let base = GuardrailConfig::default();
    let config = guardrail_config(&base, &[deploy(), open]);
    assert_eq!(
        config.admin_only.last().map(String::as_str),
        Some("cmd_deploy")
    );
    assert_eq!(config.admin_only.len(), base.admin_only.len() + 1);
}

#[test]
fn fences_cannot_be_closed_by_the_output() {
    assert_eq!(fenced("hi"), "```\nhi\n```\n");
    assert_eq!(fenced("a ```` b"), "`````\na ```` b\n`````\n");
}

#[test]
fn output_pieces_keep_characters_whole() {
    let mut pieces = Utf8Pieces::default();
    let bytes = "é!".as_bytes();
    assert_eq!(pieces.push(&bytes[..1]), "");
    assert_eq!(pieces.push(&bytes[1..]), "é!");
    assert_eq!(pieces.push(b"a\xffb"), "a\u{FFFD}b");
}

// Running

/// A script at `dir/name` with `body`, executable.
fn script(dir: &Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

fn origin() -> Origin<'static> {
    Origin {
        via: "chat",
        channel: "telegram",
        user_id: "42",
        role: Role::Admin,
        thread_id: "t1",
    }
}

fn config_running(program: &str, run: &[&str]) -> CommandConfig {
    let mut config = deploy();
    config.run = std::iter::once(program)
        .chain(run.iter().copied())
        .map(str::to_owned)
        .collect();
    config
}

#[tokio::test]
async fn a_run_gets_its_argv_its_env_only_the_workspace_and_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let program = script(
        dir.path(),
        "show.sh",
        "for a in \"$@\"; do echo \"arg:$a\"; done; env | sort; pwd -P",
    );
    let mut config = config_running(&program, &["{service}", "{version}"]);
    config
        .env
        .insert("KUBECONFIG".into(), crate::secret::Secret::new("/k/config"));
    let deploy = command(config);
    let store = dir.path().join("store");
    let folders = ThreadFolders::new(&store, "t1").unwrap();
    let runner = Runner::new(&store, 64 * 1024);
    let mut seen = Vec::new();
    let mut output = |bytes: &[u8]| seen.extend_from_slice(bytes);
    let values = deploy.parse_typed(r#""api""#).unwrap();
    let outcome = runner
        .run(Run {
            command: &deploy,
            argv: deploy.argv(&values),
            origin: origin(),
            folders: Some(&folders),
            cancel: None,
            deadline: None,
            output: Some(&mut output),
        })
        .await;
    assert!(!outcome.failed, "{}", outcome.text);
    let workspace = std::fs::canonicalize(folders.workspace()).unwrap();
    let lines: Vec<&str> = outcome.text.lines().collect();
    assert_eq!(lines[..2], ["```", "arg:api"], "{}", outcome.text);
    let n = lines.len();
    assert_eq!(
        lines[n - 3..n - 1],
        [workspace.display().to_string().as_str(), "```"],
        "it runs in the workspace: {}",
        outcome.text
    );
    let names: Vec<&str> = lines[2..n - 3]
        .iter()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name))
        .collect();
    assert!(lines.contains(&"KUBECONFIG=/k/config"), "{}", outcome.text);
    assert!(
        names
            .iter()
            .all(|name| ["KUBECONFIG", "PWD", "SHLVL", "_", "OLDPWD"].contains(name)),
        "only the listed variables (and what sh sets): {}",
        outcome.text
    );
    assert!(
        lines
            .last()
            .unwrap()
            .starts_with("✅ /deploy finished: exit code 0 · "),
        "{}",
        outcome.text
    );
    assert!(String::from_utf8_lossy(&seen).contains("arg:api\n"));
    let audit = std::fs::read_to_string(store.join("audit/commands.log")).unwrap();
    let audit: Vec<serde_json::Value> = audit
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(audit.len(), 2);
    assert_eq!(audit[0]["event"], "start");
    assert_eq!(audit[1]["event"], "end");
    assert_eq!(audit[1]["argv"], json!([program, "api"]));
    assert_eq!(audit[1]["user"], "42");
    assert_eq!(audit[1]["channel"], "telegram");
    assert_eq!(audit[1]["exit"], "exit code 0");
    assert!(audit[1]["duration_ms"].is_u64());
    assert!(!audit[1].to_string().contains("/k/config"), "env stays out");
}

#[tokio::test]
async fn a_failing_exit_is_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let program = script(dir.path(), "fail.sh", "echo broken >&2; exit 3");
    let mut config = config_running(&program, &[]);
    config.cwd = Some(dir.path().to_owned());
    let deploy = command(config);
    let runner = Runner::new(&dir.path().join("store"), 1024);
    let outcome = runner
        .run(Run {
            command: &deploy,
            argv: deploy.argv(&[Some("api".into()), None]),
            origin: origin(),
            folders: None,
            cancel: None,
            deadline: None,
            output: None,
        })
        .await;
    assert!(outcome.failed);
    assert!(
        outcome
            .text
            .starts_with("```\nbroken\n```\n❌ /deploy failed: exit code 3 · "),
        "{}",
        outcome.text
    );
}

/// Whether a process with `marker` in its command line is alive.
fn alive(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline"))
            .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(marker))
    })
}

async fn gone(marker: &str) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if !alive(marker) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_tree() {
    let dir = tempfile::tempdir().unwrap();
    let program = script(
        dir.path(),
        "hang.sh",
        "sleep 1000.456 & echo started; sleep 1000.457",
    );
    let mut config = config_running(&program, &[]);
    config.cwd = Some(dir.path().to_owned());
    config.timeout_secs = 1;
    let deploy = command(config);
    let runner = Runner::new(&dir.path().join("store"), 1024);
    let outcome = runner
        .run(Run {
            command: &deploy,
            argv: deploy.argv(&[]),
            origin: origin(),
            folders: None,
            cancel: None,
            deadline: None,
            output: None,
        })
        .await;
    assert!(outcome.failed);
    assert!(
        outcome
            .text
            .contains("❌ /deploy failed: killed by signal 9 (it did not finish in time)"),
        "{}",
        outcome.text
    );
    assert!(
        outcome.text.starts_with("```\nstarted\n```\n"),
        "{}",
        outcome.text
    );
    assert!(gone("1000.456").await && gone("1000.457").await);
}

#[tokio::test]
async fn a_program_that_cannot_start_is_a_failure_that_is_still_audited() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_running("/nonexistent/antler-test-program", &[]);
    config.cwd = Some(dir.path().to_owned());
    let deploy = command(config);
    let store = dir.path().join("store");
    let runner = Runner::new(&store, 1024);
    let outcome = runner
        .run(Run {
            command: &deploy,
            argv: deploy.argv(&[]),
            origin: origin(),
            folders: None,
            cancel: None,
            deadline: None,
            output: None,
        })
        .await;
    assert!(outcome.failed);
    assert!(
        outcome
            .text
            .starts_with("❌ /deploy did not run: cannot start the program"),
        "{}",
        outcome.text
    );
    let audit = std::fs::read_to_string(store.join("audit/commands.log")).unwrap();
    assert_eq!(audit.lines().count(), 2);
}
