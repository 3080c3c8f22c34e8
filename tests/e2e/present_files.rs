//! `present_files` end to end through the API channel: a scripted model writes a file under
//! outputs and presents it; the answer carries it as an attachment (in the `"wait": true`
//! answer, the `final` SSE event and the thread), and the download route returns its bytes.
//! A path outside outputs is refused to the model, and nothing is attached.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Behaviour, MockModel, Step, TestApp, read_sse};

const TOKEN: &str = "present-files-admin-token";
const REPORT: &str = "uptime 99.9%\nerrors 0\n";

fn admin_config() -> String {
    format!("[channels.api]\ntoken = \"{TOKEN}\"\n")
}

/// The content of the last message of model request `n` (0-based).
fn last_message(mock: &MockModel, n: usize) -> Value {
    mock.requests()[n].messages().last().cloned().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presented_file_reaches_the_api_as_an_attachment_and_downloads() {
    let mock = MockModel::start(Behaviour::Script(vec![
        Step::call(
            "write_file",
            json!({"path": "/mnt/user-data/outputs/report.txt", "content": REPORT}),
        ),
        Step::call(
            "present_files",
            json!({"paths": ["/mnt/user-data/outputs/report.txt"]}),
        ),
        Step::text("Here is the report."),
    ]))
    .await;
    let mut app = TestApp::spawn(&mock, &admin_config()).await;
    app.client.token = Some(TOKEN.to_owned());

    let answer = app.ask("files", "write me a report").await;
    assert_eq!(
        answer.json["reply"], "Here is the report.",
        "{}",
        answer.text
    );
    let thread_id = answer.json["thread_id"].as_str().unwrap().to_owned();
    let url = format!("/api/v1/threads/{thread_id}/files/report.txt");
    assert_eq!(
        answer.json["attachments"],
        json!([{"name": "report.txt", "media_type": "text/plain", "size": REPORT.len(), "url": url}]),
        "{}",
        answer.text
    );
    // The model was told the file goes to the user.
    let told = last_message(&mock, 2);
    assert_eq!(told["role"], "tool");
    assert!(
        told["content"]
            .as_str()
            .unwrap()
            .contains("/mnt/user-data/outputs/report.txt"),
        "{told}"
    );

    let download = app.get(&url).await;
    assert_eq!(download.status, StatusCode::OK, "{}", download.text);
    assert_eq!(download.text, REPORT);
    assert_eq!(download.headers["content-type"], "text/plain");
    assert_eq!(
        download.headers["content-disposition"],
        "attachment; filename=\"report.txt\"; filename*=UTF-8''report.txt"
    );
    assert_eq!(download.headers["x-content-type-options"], "nosniff");
    // Streamed with its length announced.
    assert_eq!(
        download.headers["content-length"],
        REPORT.len().to_string().as_str()
    );

    // The thread shows the file on the answer that carried it, and only there.
    let thread = app.thread(&thread_id).await;
    let messages = thread["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    assert_eq!(last["content"], "Here is the report.");
    assert_eq!(last["attachments"][0]["url"], url);
    assert_eq!(
        messages
            .iter()
            .filter(|m| m.get("attachments").is_some())
            .count(),
        1
    );

    // Downloads need the thread's access: no token, no file.
    let mut stranger = app.client.clone();
    stranger.token = None;
    assert_eq!(stranger.get(&url).await.status, StatusCode::UNAUTHORIZED);
    // Nothing outside outputs, however it is spelled.
    for path in [
        "..%2Fworkspace%2Fnotes.txt",
        "%2E%2E/%2E%2E/threads",
        "../../etc/passwd",
        "missing.txt",
    ] {
        let answer = app
            .get(&format!("/api/v1/threads/{thread_id}/files/{path}"))
            .await;
        assert_ne!(answer.status, StatusCode::OK, "{path}: {}", answer.text);
    }

    // A streamed answer's final event carries the attachment too (a second run of the script).
    mock.set_behaviour(Behaviour::Script(vec![
        Step::call(
            "present_files",
            json!({"paths": ["/mnt/user-data/outputs/report.txt"]}),
        ),
        Step::text("Again."),
    ]));
    let response = app
        .http
        .post(format!("{}/api/v1/messages", app.base))
        .bearer_auth(TOKEN)
        .json(&json!({"conversation": "files", "text": "once more", "stream": true}))
        .send()
        .await
        .unwrap();
    let events = read_sse(response).await;
    let (_, last) = events.iter().rfind(|(name, _)| name == "final").unwrap();
    assert_eq!(last["text"], "Again.");
    assert_eq!(last["attachments"][0]["name"], "report.txt");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_outside_outputs_is_refused_and_nothing_is_attached() {
    let mock = MockModel::start(Behaviour::Script(vec![
        Step::call(
            "write_file",
            json!({"path": "/mnt/user-data/workspace/notes.txt", "content": "private"}),
        ),
        Step::call(
            "present_files",
            json!({"paths": ["/mnt/user-data/workspace/notes.txt"]}),
        ),
        Step::text("I could not share it."),
    ]))
    .await;
    let mut app = TestApp::spawn(&mock, &admin_config()).await;
    app.client.token = Some(TOKEN.to_owned());

    let answer = app.ask("files", "share my notes").await;
    assert_eq!(answer.json["reply"], "I could not share it.");
    assert!(answer.json.get("attachments").is_none(), "{}", answer.text);
    let refusal = last_message(&mock, 2);
    assert_eq!(refusal["role"], "tool");
    let text = refusal["content"].as_str().unwrap();
    assert!(
        text.contains("is not under /mnt/user-data/outputs"),
        "{text}"
    );

    let thread_id = answer.json["thread_id"].as_str().unwrap();
    let thread = app.thread(thread_id).await;
    assert!(
        !thread["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.get("attachments").is_some())
    );
    let download = app
        .get(&format!(
            "/api/v1/threads/{thread_id}/files/..%2Fworkspace%2Fnotes.txt"
        ))
        .await;
    assert_eq!(download.status, StatusCode::NOT_FOUND, "{}", download.text);
    assert!(!download.text.contains("private"));
    app.shutdown().await;
}

/// The review's race: a file of outputs swapped for a link to a secret and back in a loop
/// (as a sandboxed shell can) while it is downloaded; before, 475 of 38,780 downloads served
/// the host's config. The route opens the file once, beneath the outputs folder with links
/// refused, and sends what it opened: no download may ever carry the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_racing_a_link_swap_never_serve_what_the_link_points_to() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let mock = MockModel::start(Behaviour::Script(vec![
        Step::call(
            "write_file",
            json!({"path": "/mnt/user-data/outputs/report.txt", "content": "harmless"}),
        ),
        Step::call(
            "present_files",
            json!({"paths": ["/mnt/user-data/outputs/report.txt"]}),
        ),
        Step::text("Here."),
    ]))
    .await;
    let mut app = TestApp::spawn(&mock, &admin_config()).await;
    app.client.token = Some(TOKEN.to_owned());
    let answer = app.ask("race", "a report").await;
    let thread_id = answer.json["thread_id"].as_str().unwrap().to_owned();
    let outputs = app.store.join("threads").join(&thread_id).join("outputs");
    let secret = app.store.join("host-config.toml");
    std::fs::write(&secret, "api_key = \"SECRET-IN-HOST-CONFIG\"").unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicUsize::new(0));
    let swapper = {
        let (stop, swaps) = (Arc::clone(&stop), Arc::clone(&swaps));
        std::thread::spawn(move || {
            let path = outputs.join("report.txt");
            let (file, link) = (outputs.join(".file"), outputs.join(".link"));
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::write(&file, "harmless");
                let _ = std::fs::rename(&file, &path);
                let _ = std::os::unix::fs::symlink(&secret, &link);
                let _ = std::fs::rename(&link, &path);
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let url = format!("/api/v1/threads/{thread_id}/files/report.txt");
    let (mut served, mut refused) = (0, 0);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < until {
        let download = app.get(&url).await;
        assert!(
            !download.text.contains("SECRET-IN-HOST-CONFIG"),
            "a download served the link's target"
        );
        match download.status {
            StatusCode::OK => {
                assert_eq!(download.text, "harmless");
                served += 1;
            }
            _ => refused += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    // The race really ran both ways.
    assert!(
        swaps.load(Ordering::Relaxed) > 10,
        "the swapper did not run"
    );
    assert!(
        served > 0 && refused > 0,
        "served {served}, refused {refused}"
    );
    app.shutdown().await;
}
