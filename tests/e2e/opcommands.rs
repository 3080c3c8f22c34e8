//! Operator commands (`[[commands]]`) through the API channel: typed arguments become argv
//! items, an injection attempt is refused by the pattern and nothing runs, the output streams
//! and ends with the exit status, a failing exit is a failure, a timeout kills the process
//! tree, the model runs the same command as `cmd_<name>` and gets the same text, and a
//! non-admin is refused both ways. Every run is audited.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::support::{Behaviour, Client, MockModel, TestApp, read_sse_until};

const ADMIN_TOKEN: &str = "admin-token-0123456789";
const USER_TOKEN: &str = "ana-token-0123456789";

/// Scripts written by the test: `argv.sh` prints its arguments one a line (and counts its runs
/// in `runs`), `fail.sh` exits 3, `hang.sh` leaves a child behind and never ends, `gate.sh`
/// prints `one`, waits for the file `open`, then prints `two`.
struct Scripts {
    dir: tempfile::TempDir,
}

impl Scripts {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("runs");
        let open = dir.path().join("open");
        for (name, body) in [
            (
                "argv.sh",
                format!(
                    "echo run >> {runs:?}\nfor a in \"$@\"; do echo \"$a\"; done\necho \"KUBECONFIG=$KUBECONFIG HOME=$HOME\""
                ),
            ),
            ("fail.sh", "echo broken >&2\nexit 3".to_owned()),
            (
                "hang.sh",
                "sleep 1000.789 &\necho started\nsleep 1000.790".to_owned(),
            ),
            (
                "gate.sh",
                format!("echo one\nwhile [ ! -e {open:?} ]; do sleep 0.05; done\necho two"),
            ),
        ] {
            use std::os::unix::fs::PermissionsExt as _;
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// How many times `argv.sh` ran.
    fn runs(&self) -> usize {
        std::fs::read_to_string(self.path("runs"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    fn overrides(&self) -> String {
        let script = |name: &str| format!("{:?}", self.path(name).display().to_string());
        format!(
            r#"
[channels.api]
token = "{ADMIN_TOKEN}"

[[channels.api.tokens]]
token = "{USER_TOKEN}"
user = "ana"

[[commands]]
name = "deploy"
description = "Deploy a service to production"
run = [{argv}, "{{service}}", "--version={{version}}"]
args = [ {{ name = "service", pattern = "^[a-z0-9-]{{1,40}}$" }}, {{ name = "version", pattern = "^v[0-9]+\\.[0-9]+\\.[0-9]+$", optional = true }} ]
env = {{ KUBECONFIG = "/etc/kube/config" }}

[[commands]]
name = "uptime"
description = "How long the hosts are up"
run = [{argv}, "uptime"]
roles = ["user"]

[[commands]]
name = "say"
description = "Says its words"
run = [{argv}, "{{first}}", "{{second}}"]
args = [ {{ name = "first", pattern = "[a-z]+" }}, {{ name = "second", pattern = "[a-z]+", optional = true }} ]
roles = ["user"]

[[commands]]
name = "fail"
description = "Always fails"
run = [{fail}]

[[commands]]
name = "hang"
description = "Never ends"
run = [{hang}]
timeout_secs = 1

[[commands]]
name = "gate"
description = "Waits for the test"
run = [{gate}]
"#,
            argv = script("argv.sh"),
            fail = script("fail.sh"),
            hang = script("hang.sh"),
            gate = script("gate.sh"),
        )
    }
}

/// Posts `text` on `conversation` and waits for the reply.
async fn ask(client: &Client, conversation: &str, text: &str) -> String {
    let answer = client
        .post(&json!({"conversation": conversation, "text": text, "wait": true}))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    answer.json["reply"].as_str().unwrap_or_default().to_owned()
}

/// Every line of the command audit log.
fn audit_lines(store: &Path) -> Vec<Value> {
    std::fs::read_to_string(store.join("audit/commands.log"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("an audit line is JSON"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_runs_from_chat_with_its_arguments_as_argv_and_injection_runs_nothing() {
    let scripts = Scripts::new();
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, &scripts.overrides()).await;
    let admin = app.client.with_token(ADMIN_TOKEN);

    let reply = ask(&admin, "ops", r#"/deploy "api" v1.4.2"#).await;
    let (output, ending) = reply.rsplit_once('\n').unwrap();
    assert_eq!(
        output, "```\napi\n--version=v1.4.2\nKUBECONFIG=/etc/kube/config HOME=\n```",
        "each value one argv item, only `env` in the environment: {reply}"
    );
    assert!(
        ending.starts_with("✅ /deploy finished: exit code 0 · "),
        "{reply}"
    );
    assert_eq!(scripts.runs(), 1);

    // An optional argument left out drops its argv item.
    let reply = ask(&admin, "ops", "/deploy web").await;
    assert!(
        reply.starts_with("```\nweb\nKUBECONFIG=/etc/kube/config HOME=\n```\n✅"),
        "{reply}"
    );
    assert_eq!(scripts.runs(), 2);

    for attempt in [
        r#"/deploy "api; rm -rf /""#,
        "/deploy api;reboot",
        "/deploy api v1.4.2 extra",
        "/deploy",
        r#"/deploy "api"#,
    ] {
        let reply = ask(&admin, "ops", attempt).await;
        assert!(
            reply.ends_with("Nothing was run.\nUsage: /deploy <service> [version]"),
            "{attempt}: {reply}"
        );
    }
    assert_eq!(scripts.runs(), 2, "nothing ran for the refused arguments");

    let help = ask(&admin, "ops", "/help").await;
    assert!(
        help.contains("\n/deploy <service> [version] — Deploy a service to production (admins)\n"),
        "{help}"
    );
    assert!(
        help.contains("\n/uptime — How long the hosts are up\n"),
        "{help}"
    );

    let audit = audit_lines(&app.store);
    assert_eq!(audit.len(), 4, "a start and an end line per run: {audit:?}");
    assert_eq!(audit[1]["event"], "end");
    assert_eq!(audit[1]["via"], "chat");
    assert_eq!(audit[1]["channel"], "api");
    assert_eq!(audit[1]["role"], "admin");
    assert_eq!(
        audit[1]["argv"],
        json!([scripts.path("argv.sh"), "api", "--version=v1.4.2"])
    );
    assert_eq!(audit[1]["exit"], "exit code 0");
    assert!(audit[1]["duration_ms"].is_u64());
    assert_eq!(mock.requests().len(), 0, "commands never reach the model");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_admin_is_refused_an_admin_command_and_may_run_an_open_one() {
    let scripts = Scripts::new();
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, &scripts.overrides()).await;
    let ana = app.client.with_token(USER_TOKEN);

    let reply = ask(&ana, "ana-ops", "/deploy api").await;
    assert_eq!(reply, "⛔ /deploy is for admins only. Nothing was run.");
    assert_eq!(scripts.runs(), 0);
    let reply = ask(&ana, "ana-ops", "/uptime").await;
    assert!(reply.starts_with("```\nuptime\n"), "{reply}");
    assert_eq!(scripts.runs(), 1);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_exit_is_a_failure_and_a_timeout_kills_the_tree() {
    let scripts = Scripts::new();
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, &scripts.overrides()).await;
    let admin = app.client.with_token(ADMIN_TOKEN);

    let reply = ask(&admin, "ops", "/fail").await;
    assert!(
        reply.starts_with("```\nbroken\n```\n❌ /fail failed: exit code 3 · "),
        "{reply}"
    );

    let reply = ask(&admin, "ops", "/hang").await;
    assert!(
        reply.starts_with(
            "```\nstarted\n```\n❌ /hang failed: killed by signal 9 (it did not finish in time) · "
        ),
        "{reply}"
    );
    let start = Instant::now();
    while alive("1000.789") || alive("1000.790") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the timed-out command's processes survived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let audit = audit_lines(&app.store);
    assert_eq!(audit.last().unwrap()["failed"], true);
    app.shutdown().await;
}

/// Whether a process with `marker` in its command line is alive.
fn alive(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline"))
            .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(marker))
    })
}

/// The admin runs `/gate` in `conversation`, streamed: the open SSE response.
async fn gate_streamed(admin: &Client, conversation: &str) -> reqwest::Response {
    let response = admin
        .http
        .post(format!("{}/api/v1/messages", admin.base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"conversation": conversation, "text": "/gate", "message_id": "m-gate", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_output_streams_while_the_command_runs() {
    let scripts = Scripts::new();
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, &scripts.overrides()).await;
    let admin = app.client.with_token(ADMIN_TOKEN);

    let request = gate_streamed(&admin, "stream").await;
    let open = scripts.path("open");
    let events = read_sse_until(request, move |events| {
        let streamed: String = events
            .iter()
            .filter(|(name, _)| name == "delta")
            .filter_map(|(_, data)| data["text"].as_str())
            .collect();
        if streamed.contains("one") {
            // The command is still waiting: its first line came before its end.
            std::fs::write(&open, "").unwrap();
        }
        events.iter().any(|(name, _)| name == "final")
    })
    .await;
    let streamed: String = events
        .iter()
        .filter(|(name, _)| name == "delta")
        .filter_map(|(_, data)| data["text"].as_str())
        .collect();
    assert!(streamed.starts_with("```\none\n"), "{events:?}");
    let (_, last) = events.last().unwrap();
    let text = last["text"].as_str().unwrap();
    assert!(
        text.starts_with("```\none\ntwo\n```\n✅ /gate finished: exit code 0 · "),
        "{text}"
    );
    app.shutdown().await;
}

fn deploy_call(arguments: Value) -> Behaviour {
    Behaviour::TurnScript(vec![("cmd_deploy".to_owned(), arguments.to_string())])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_runs_a_command_as_a_tool_and_gets_the_same_output() {
    let scripts = Scripts::new();
    let mock = MockModel::start(deploy_call(json!({"service": "api", "version": "v2.0.0"}))).await;
    let app = TestApp::spawn(&mock, &scripts.overrides()).await;
    let admin = app.client.with_token(ADMIN_TOKEN);

    let reply = ask(&admin, "ops", "deploy api 2.0.0 please").await;
    let results = mock.tool_results();
    assert_eq!(results.len(), 1);
    assert!(
        results[0].starts_with(
            "```\napi\n--version=v2.0.0\nKUBECONFIG=/etc/kube/config HOME=\n```\n✅ /deploy finished: exit code 0 · "
        ),
        "{results:?}"
    );
    assert_eq!(reply, format!("done: {}", results[0]));
    assert_eq!(scripts.runs(), 1);

    let tools = mock.requests()[0].body["tools"].clone();
    let deploy = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "cmd_deploy")
        .unwrap_or_else(|| panic!("cmd_deploy is offered to an admin: {tools}"));
    assert_eq!(
        deploy["function"]["parameters"]["required"],
        json!(["service"])
    );
    assert_eq!(
        deploy["function"]["parameters"]["properties"]["service"]["pattern"],
        "^(?:^[a-z0-9-]{1,40}$)$"
    );
    let audit = audit_lines(&app.store);
    assert_eq!(audit[1]["via"], "tool");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_tool_call_and_a_non_admins_model_run_nothing() {
    let scripts = Scripts::new();
    let mock = MockModel::start(deploy_call(json!({"service": "api; rm -rf /"}))).await;
    let app = TestApp::spawn(&mock, &scripts.overrides()).await;
    let admin = app.client.with_token(ADMIN_TOKEN);
    ask(&admin, "ops", "deploy it").await;
    let results = mock.tool_results();
    assert!(
        results[0].contains("`service` must match ^[a-z0-9-]{1,40}$"),
        "{results:?}"
    );

    let ana = app.client.with_token(USER_TOKEN);
    ask(&ana, "ana-ops", "deploy it").await;
    let requests = mock.requests();
    let offered = requests.last().unwrap().body["tools"].to_string();
    assert!(
        !offered.contains("cmd_deploy"),
        "a non-admin's model is not offered it"
    );
    assert!(offered.contains("cmd_uptime"), "{offered}");
    let results = mock.tool_results();
    assert!(results[0].contains("needs an operator"), "{results:?}");
    assert_eq!(scripts.runs(), 0);
    assert!(audit_lines(&app.store).is_empty());
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_telegram_the_output_streams_into_a_draft_that_ends_as_the_answer() {
    use antler_testkit::telegram::{MockTelegram, SECRET, fixture, post};

    let scripts = Scripts::new();
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let overrides = format!(
        "{}\n{}",
        api.config("admins = [5550001001]\n"),
        scripts.overrides()
    );
    let app = TestApp::spawn(&model, &overrides).await;
    let mut update: Value = serde_json::from_str(&fixture("tg_private_text")).unwrap();
    update["message"]["text"] = json!("/gate@opsbot_bot");
    assert_eq!(
        post(&app.base, &update.to_string(), Some(SECRET)).await,
        StatusCode::OK
    );
    // The command waits for `open`: whatever the chat shows now came while it ran.
    let draft = crate::support::wait_until("the draft shows the first line", || async {
        api.sent().await.into_iter().find(|sent| {
            sent["text"]
                .as_str()
                .is_some_and(|text| text.contains("one"))
        })
    })
    .await;
    assert!(!draft["text"].as_str().unwrap().contains("two"), "{draft}");
    std::fs::write(scripts.path("open"), "").unwrap();
    crate::support::wait_until("the draft ends as the answer", || async {
        api.calls("EditMessageText").await.into_iter().find(|edit| {
            edit["text"].as_str().is_some_and(|text| {
                text.contains("one\ntwo") && text.contains("✅ /gate finished: exit code 0")
            })
        })
    })
    .await;
    app.client.with_token(ADMIN_TOKEN).wait_idle().await;
    assert_eq!(api.sent().await.len(), 1, "one message: the draft, edited");
    assert_eq!(model.count(), 0);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_slack_antler_runs_a_command_named_after_it_and_its_help_lists_them() {
    use antler_testkit::now_secs;
    use antler_testkit::slack::{MockSlack, SIGNING_SECRET, post_signed};

    let scripts = Scripts::new();
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let overrides = format!("{}\n{}", api.config(""), scripts.overrides());
    let app = TestApp::spawn(&model, &overrides).await;
    for (text, trigger) in [("/uptime", "8001.1"), ("", "8001.2")] {
        // One invocation, one trigger id (the event id).
        let form = api.slash_command(text).replace(
            "trigger_id=8001.1767225800.abc123",
            &format!("trigger_id={trigger}"),
        );
        let (status, _) = post_signed(
            &app.base,
            "commands",
            &form,
            SIGNING_SECRET,
            now_secs(),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    let responses = crate::support::wait_until("both answers", || async {
        let responses = api.responses().await;
        (responses.len() == 2).then_some(responses)
    })
    .await;
    let texts: Vec<&str> = responses
        .iter()
        .map(|r| r["text"].as_str().unwrap_or_default())
        .collect();
    let ran = texts
        .iter()
        .find(|text| text.contains("✅ /uptime finished: exit code 0"))
        .unwrap_or_else(|| panic!("{texts:?}"));
    assert!(ran.contains("uptime\n"), "{ran}");
    assert!(
        texts
            .iter()
            // Escaped as Slack wants `<`, `>` and `&`.
            .any(|text| text.contains("/deploy &lt;service&gt; [version] — Deploy a service")),
        "{texts:?}"
    );
    assert_eq!(scripts.runs(), 1);
    app.client.with_token(ADMIN_TOKEN).wait_idle().await;
    assert_eq!(model.count(), 0);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_kills_a_running_command() {
    let scripts = Scripts::new();
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, &scripts.overrides()).await;
    let admin = app.client.with_token(ADMIN_TOKEN);

    let response = gate_streamed(&admin, "stop").await;
    let reader = tokio::spawn(read_sse_until(response, |events| {
        events.iter().any(|(name, _)| name == "final")
    }));
    let gate = scripts.path("gate.sh").display().to_string();
    crate::support::wait_until("the command runs", || async { alive(&gate).then_some(()) }).await;

    let reply = ask(&admin, "stop", "/stop").await;
    assert!(reply.starts_with("⏹ Stopped"), "{reply}");
    let events = reader.await.unwrap();
    let (_, last) = events.last().unwrap();
    let text = last["text"].as_str().unwrap();
    assert!(
        text.starts_with("```\none\n```\n❌ /gate failed: killed by signal 9 (it was stopped) · "),
        "{text}"
    );
    assert!(!alive(&gate), "the command's process is gone");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cut_short_by_a_crash_is_not_run_again_and_the_chat_is_told() {
    use antler_testkit::telegram::{MockTelegram, SECRET, fixture, post};

    let scripts = Scripts::new();
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let overrides = format!(
        "{}\n{}",
        api.config("admins = [5550001001]\n"),
        scripts.overrides()
    );
    let rig = crate::support::ChildRig::new(&model, &overrides);
    let mut first = rig.serve().await;
    let mut update: Value = serde_json::from_str(&fixture("tg_private_text")).unwrap();
    update["message"]["text"] = json!("/gate");
    assert_eq!(
        post(&first.base, &update.to_string(), Some(SECRET)).await,
        StatusCode::OK
    );
    let gate = scripts.path("gate.sh").display().to_string();
    crate::support::wait_until("the command runs", || async { alive(&gate).then_some(()) }).await;
    first.kill().await;
    // The program outlives antler's crash (it leads its own group); let it end.
    std::fs::write(scripts.path("open"), "").unwrap();

    let second = rig.serve().await;
    let told = crate::support::wait_until("the chat is told", || async {
        let mut texts = api.sent().await;
        texts.extend(api.calls("EditMessageText").await);
        texts.into_iter().find_map(|sent| {
            sent["text"]
                .as_str()
                .filter(|text| text.contains("is not run again"))
                .map(str::to_owned)
        })
    })
    .await;
    assert!(told.contains("/gate"), "{told}");
    second.client.with_token(ADMIN_TOKEN).wait_idle().await;
    let audit = audit_lines(&rig.dir.path().join("store"));
    let starts = audit.iter().filter(|line| line["event"] == "start").count();
    assert_eq!(starts, 1, "it ran once: {audit:?}");
    assert_eq!(model.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_discord_a_command_with_its_options_runs_and_edits_the_original() {
    use antler_testkit::discord::{MockDiscord, ask, post};

    let scripts = Scripts::new();
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockDiscord::start().await;
    let overrides = format!("{}\n{}", api.config(""), scripts.overrides());
    let app = TestApp::spawn(&model, &overrides).await;
    let mut interaction = ask("1300000000000000977", "tok-say", "unused");
    interaction["data"]["name"] = json!("say");
    interaction["data"]["options"] = json!([
        {"name": "first", "type": 3, "value": "hello"},
        {"name": "second", "type": 3, "value": "world"}
    ]);
    assert_eq!(post(&app.base, &interaction).await, json!({"type": 5}));
    let edits = api.wait_for_edit("tok-say").await;
    let content = edits[0]["content"].as_str().unwrap();
    assert!(
        content.contains("hello\nworld\n") && content.contains("✅ /say finished: exit code 0"),
        "{content}"
    );
    assert_eq!(scripts.runs(), 1);
    app.client.with_token(ADMIN_TOKEN).wait_idle().await;
    assert_eq!(model.count(), 0);
    app.shutdown().await;
}
