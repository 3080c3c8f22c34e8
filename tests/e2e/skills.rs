//! Skills end to end, through the API channel with a scripted model: a skill folder is listed
//! in the system prompt, readable at `/mnt/skills/<name>/`, not writable, holds the run to its
//! `allowed-tools` once its `SKILL.md` was read, and `/skills disable` (or the API) takes it
//! out of the next request. The skills antler ships are listed and readable too.

use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::support::mock_model::Recorded;
use crate::support::{Answer, Behaviour, Client, MockModel, TestApp};

const ADMIN_TOKEN: &str = "admin-token-0123456789";
const USER_TOKEN: &str = "ana-token-0123456789";

const SKILL_MD: &str = "---\nname: probe\ndescription: Probe <things> & report\n\
allowed-tools: read_file current_time\n---\n\n# Probe\nRead notes.md, then tell the time.\n";

/// A skills folder holding the skill `probe` (with `notes.md` beside its `SKILL.md`).
fn skills_folder() -> tempfile::TempDir {
    let dir = crate::support::searchable_tempdir();
    let probe = dir.path().join("probe");
    std::fs::create_dir_all(&probe).unwrap();
    std::fs::write(probe.join("SKILL.md"), SKILL_MD).unwrap();
    std::fs::write(probe.join("notes.md"), "probe notes\n").unwrap();
    dir
}

/// The API with an admin token and a user token (`ana`), skills from `folder`.
fn overrides(folder: &Path) -> String {
    format!(
        "[channels.api]\ntoken = {ADMIN_TOKEN:?}\n\n[[channels.api.tokens]]\n\
         token = {USER_TOKEN:?}\nuser = \"ana\"\n\n[skills]\npaths = [{:?}]\n",
        folder.display().to_string()
    )
}

/// Posts `text` on `conversation` and waits for the reply.
async fn ask(client: &Client, conversation: &str, text: &str) -> String {
    let answer = client
        .post(&json!({"conversation": conversation, "text": text, "wait": true}))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    answer.json["reply"].as_str().unwrap_or_default().to_owned()
}

/// `method path` as `client`'s token, with an optional JSON body.
async fn call(client: &Client, method: &str, path: &str, body: Option<Value>) -> Answer {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = client
        .http
        .request(method, format!("{}{path}", client.base));
    if let Some(token) = &client.token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        text,
        json,
    }
}

fn system_text(request: &Recorded) -> String {
    request
        .messages()
        .first()
        .filter(|m| m["role"] == "system")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn offered(request: &Recorded) -> Vec<String> {
    request.body["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// The tool results of `request`, in order.
fn tool_results(request: &Recorded) -> Vec<String> {
    request
        .messages()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Whether any thread's workspace holds `name`.
fn workspace_has(store: &Path, name: &str) -> bool {
    std::fs::read_dir(store.join("threads"))
        .map(|threads| {
            threads
                .flatten()
                .any(|thread| thread.path().join("workspace").join(name).exists())
        })
        .unwrap_or(false)
}

fn step(tool: &str, arguments: Value) -> (String, String) {
    (tool.to_owned(), arguments.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_is_listed_readable_not_writable_and_holds_the_run_to_its_tools() {
    let folder = skills_folder();
    let mock = MockModel::start(Behaviour::TurnScript(vec![
        step("ls", json!({"path": "/mnt/skills"})),
        step(
            "write_file",
            json!({"path": "/mnt/skills/probe/SKILL.md", "content": "pwned"}),
        ),
        step("read_file", json!({"path": "/mnt/skills/probe/SKILL.md"})),
        step("read_file", json!({"path": "/mnt/skills/probe/notes.md"})),
        step(
            "write_file",
            json!({"path": "/mnt/user-data/workspace/a.txt", "content": "x"}),
        ),
        step("current_time", json!({})),
    ]))
    .await;
    let app = TestApp::spawn(&mock, &overrides(folder.path())).await;
    let admin = app.client.with_token(ADMIN_TOKEN);

    let reply = ask(&admin, "skills", "probe it").await;
    assert!(reply.starts_with("done: "), "{reply}");
    let requests = mock.requests();
    assert_eq!(requests.len(), 7, "six tool rounds, then the answer");

    // Listed, escaped, in every request's system prompt.
    let system = system_text(&requests[0]);
    assert!(
        system.contains("<skill name=\"probe\">Probe &lt;things&gt; &amp; report</skill>"),
        "{system}"
    );
    assert!(requests.iter().all(|r| system_text(r) == system));

    let results = tool_results(requests.last().unwrap());
    assert_eq!(results.len(), 6, "{results:#?}");
    assert!(
        results[0].contains("probe/  (Probe &lt;things&gt; &amp; report)"),
        "{}",
        results[0]
    );
    assert!(
        results[1].contains("read-only"),
        "not writable: {}",
        results[1]
    );
    assert!(
        results[2].contains("# Probe\nRead notes.md"),
        "{}",
        results[2]
    );
    assert_eq!(results[3], "probe notes\n");
    assert!(
        results[4].starts_with("Refused: the skill `probe` allows only these tools")
            && results[4].contains("read_file, current_time"),
        "{}",
        results[4]
    );
    assert!(!results[5].contains("Refused"), "{}", results[5]);
    assert_eq!(
        std::fs::read_to_string(folder.path().join("probe/SKILL.md")).unwrap(),
        SKILL_MD
    );
    assert!(
        !workspace_has(&app.store, "a.txt"),
        "the refused write did not run"
    );

    // Before the read every tool is offered; after it, only the skill's (and `ls` of skills).
    for request in &requests[..3] {
        assert!(offered(request).contains(&"write_file".to_owned()));
    }
    for request in &requests[3..6] {
        let mut tools = offered(request);
        tools.sort();
        assert_eq!(tools, ["current_time", "ls", "read_file"]);
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_disable_takes_a_skill_out_of_the_next_request_and_enable_brings_it_back() {
    let folder = skills_folder();
    let mock = MockModel::start(Behaviour::TurnScript(vec![step(
        "read_file",
        json!({"path": "/mnt/skills/probe/SKILL.md"}),
    )]))
    .await;
    let app = TestApp::spawn(&mock, &overrides(folder.path())).await;
    let admin = app.client.with_token(ADMIN_TOKEN);
    let ana = app.client.with_token(USER_TOKEN);

    let list = ask(&ana, "ana", "/skills").await;
    assert!(
        list.contains("✅ probe — Probe \\<things\\> \\& report"),
        "{list}"
    );
    let refused = ask(&ana, "ana", "/skills disable probe").await;
    assert!(refused.starts_with("Only admins"), "{refused}");
    assert_eq!(
        call(&ana, "GET", "/api/v1/skills", None).await.status,
        StatusCode::FORBIDDEN
    );

    let reply = ask(&admin, "ops", "read the skill").await;
    assert!(reply.contains("# Probe"), "on at first: {reply}");
    let off = ask(&admin, "ops", "/skills disable probe").await;
    assert!(off.contains("is off"), "{off}");
    let listed = call(&admin, "GET", "/api/v1/skills", None).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    assert_eq!(listed.json["skills"][0]["name"], "probe");
    assert_eq!(listed.json["skills"][0]["enabled"], false);
    assert_eq!(
        listed.json["skills"][0]["allowed_tools"],
        json!(["read_file", "current_time"])
    );

    let before = mock.requests().len();
    let reply = ask(&admin, "ops", "read the skill again").await;
    assert!(
        reply.contains("not a skill"),
        "gone from the mount: {reply}"
    );
    let requests = mock.requests();
    let next = &requests[before];
    assert!(
        !system_text(next).contains("<skills>"),
        "{}",
        system_text(next)
    );

    let on = call(
        &admin,
        "PUT",
        "/api/v1/skills/probe",
        Some(json!({"enabled": true})),
    )
    .await;
    assert_eq!(on.status, StatusCode::OK, "{}", on.text);
    assert_eq!(on.json["enabled"], true);
    let unknown = call(
        &admin,
        "PUT",
        "/api/v1/skills/nope",
        Some(json!({"enabled": true})),
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let before = mock.requests().len();
    let reply = ask(&ana, "ana", "read it once more").await;
    assert!(reply.contains("# Probe"), "back on: {reply}");
    assert!(system_text(&mock.requests()[before]).contains("<skill name=\"probe\">"));
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_skills_are_listed_to_the_model_and_readable() {
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/skills/public");
    let mock = MockModel::start(Behaviour::TurnScript(vec![
        step(
            "read_file",
            json!({"path": "/mnt/skills/incident-summary/SKILL.md"}),
        ),
        step(
            "read_file",
            json!({"path": "/mnt/skills/incident-summary/reference/log-patterns.md"}),
        ),
        step(
            "read_file",
            json!({"path": "/mnt/skills/postmortem/SKILL.md"}),
        ),
    ]))
    .await;
    let app = TestApp::spawn(&mock, &overrides(&shipped)).await;

    let reply = ask(
        &app.client.with_token(USER_TOKEN),
        "ship",
        "the API is down, what happened?",
    )
    .await;
    assert!(reply.starts_with("done: "), "{reply}");
    let requests = mock.requests();
    let system = system_text(&requests[0]);
    assert!(
        system.contains("<skill name=\"incident-summary\">Read a service"),
        "{system}"
    );
    assert!(
        system.contains("<skill name=\"postmortem\">Write a blameless postmortem"),
        "{system}"
    );
    let results = tool_results(requests.last().unwrap());
    assert_eq!(results.len(), 3, "{results:#?}");
    assert!(results[0].contains("# Incident summary"), "{}", results[0]);
    assert!(results[1].contains("# Log patterns"), "{}", results[1]);
    assert!(results[2].contains("# Postmortem"), "{}", results[2]);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_and_doctor_list_the_skills_and_why_one_was_left_out() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = crate::support::searchable_tempdir();
    let config = dir.path().join("antler.toml");
    std::fs::write(
        &config,
        crate::support::config_text(&mock.base_url(), &dir.path().join("store"), ""),
    )
    .unwrap();
    // Beside the config file, where antler looks by default.
    let good = dir.path().join("skills/public/good");
    std::fs::create_dir_all(&good).unwrap();
    std::fs::write(
        good.join("SKILL.md"),
        "---\nname: good\ndescription: Fine\n---\n",
    )
    .unwrap();
    let bad = dir.path().join("skills/custom/bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(
        bad.join("SKILL.md"),
        "---\nname: Bad\ndescription: x\n---\n",
    )
    .unwrap();
    let config = config.display().to_string();

    let (code, stdout, stderr) =
        crate::support::run_binary(&["check-config", "--config", &config]).await;
    assert_eq!(
        code,
        Some(0),
        "a bad skill is never fatal: {stdout}{stderr}"
    );
    assert!(stdout.contains("skills: 1 loaded: good"), "{stdout}");
    assert!(
        stdout.contains("warning: skill left out: ")
            && stdout.contains("skills/custom/bad/SKILL.md: the name `Bad` is not a skill name"),
        "{stdout}"
    );

    let (_, stdout, _) = crate::support::run_binary(&["doctor", "--config", &config]).await;
    assert!(stdout.contains("1 loaded: good"), "{stdout}");
    assert!(
        stdout.contains("left out: ") && stdout.contains("skills/custom/bad/SKILL.md"),
        "{stdout}"
    );

    // The repository's own config finds the skills antler ships.
    let repository = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/antler.toml");
    let (code, stdout, stderr) =
        crate::support::run_binary(&["check-config", "--config", repository.to_str().unwrap()])
            .await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("skills: 2 loaded: incident-summary, postmortem"),
        "{stdout}"
    );
    assert!(!stdout.contains("skill left out"), "{stdout}");
}

/// SIGHUP reads the skill folders again: a skill added while antler runs is listed after it,
/// without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_added_while_running_is_listed_after_sighup() {
    let model = MockModel::start(Behaviour::Echo).await;
    let folder = skills_folder();
    let rig = crate::support::ChildRig::new(&model, &overrides(folder.path()));
    let mut child = rig.serve().await;
    let client = child.client.with_token(ADMIN_TOKEN);
    let before = ask(&client, "ops", "/skills").await;
    assert!(
        before.contains("probe") && !before.contains("digest"),
        "{before}"
    );

    let digest = folder.path().join("digest");
    std::fs::create_dir_all(&digest).unwrap();
    std::fs::write(
        digest.join("SKILL.md"),
        "---\nname: digest\ndescription: Sums up a day of alerts\n---\n\nList them.\n",
    )
    .unwrap();
    child.reload().await;
    let after = ask(&client, "ops", "/skills").await;
    assert!(
        after.contains("probe") && after.contains("digest"),
        "{after}"
    );
    assert!(
        !child.log_text().contains("restart="),
        "nothing waits for a restart"
    );
    let status = crate::support::sigterm(&mut child.process).await;
    assert!(status.success());
}
