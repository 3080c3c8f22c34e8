//! antler on PostgreSQL (`[store] backend = "postgres"`): a message answered and kept across a
//! restart, a second antler on the same database standing by until the first stops, and
//! `antler migrate`. They run when `ANTLER_TEST_DATABASE_URL` (or `DATABASE_URL`) names a
//! server, each in a schema of its own (the URL's `search_path`); without one they say so and
//! pass. An unreachable database at start needs no server and always runs.

use std::time::{Duration, Instant};

use crate::support::postgres::{Outage, Schema};
use crate::support::{
    Behaviour, Client, DEADLINE, MockModel, TestApp, config, read_sse, run_binary,
    searchable_tempdir,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_answered_and_kept_across_a_restart_on_postgres() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = searchable_tempdir();
    let folders = dir.path().join("store");
    let app = TestApp::start(&mock, &folders, &schema.store_config("a")).await;
    let first = app.ask("pg", "remember me").await;
    assert_eq!(first.json["reply"], "echo: remember me", "{}", first.text);
    let thread_id = first.json["thread_id"].as_str().unwrap().to_owned();
    // A redelivery is recognised by the database's dedupe keys.
    let again = app
        .post(&serde_json::json!({
            "conversation": "pg", "text": "remember me",
            "message_id": first.json["message_id"],
        }))
        .await;
    assert_eq!(again.json["duplicate"], true, "{}", again.text);
    app.wait_idle().await;
    app.shutdown().await;

    // The next start (another replica name: a new owner) reads the thread from PostgreSQL.
    let app = TestApp::start(&mock, &folders, &schema.store_config("b")).await;
    let thread = app.thread(&thread_id).await;
    let messages = thread["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[1]["content"], "echo: remember me");
    let second = app.ask("pg", "still there?").await;
    assert_eq!(second.json["thread_id"], thread_id.as_str());
    assert_eq!(second.json["reply"], "echo: still there?");
    assert_eq!(mock.requests().len(), 2, "each message ran once");
    app.shutdown().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_antlers_on_one_database_both_serve_and_a_conversation_runs_where_it_is_held() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = searchable_tempdir();
    let folders = dir.path().join("store");
    let first = TestApp::start(&mock, &folders, &schema.store_config("first")).await;
    let asked = first.ask("pg", "before").await;
    assert_eq!(asked.json["reply"], "echo: before");
    let thread_id = asked.json["thread_id"].clone();

    // The second serves at once beside the first (active/active, no standing by).
    let second = TestApp::start(&mock, &folders, &schema.store_config("second")).await;
    assert_eq!(second.get("/readyz").await.status, 200);
    // A message for the first's conversation may land on the second: it is stored there,
    // run by the first (which holds the conversation), and the second's `wait` gets the
    // answer from the store.
    let via_second = second.ask("pg", "via the second").await;
    assert_eq!(
        via_second.json["reply"], "echo: via the second",
        "{}",
        via_second.text
    );
    assert_eq!(via_second.json["thread_id"], thread_id);
    // A stream there ends with the answer too (read from the store: the turn's live events
    // stay on the replica running it).
    let response = second
        .http
        .post(format!("{}/api/v1/messages", second.base))
        .json(&serde_json::json!({"conversation": "pg", "text": "streamed", "message_id": "m-stream", "stream": true}))
        .send()
        .await
        .unwrap();
    let events = tokio::time::timeout(DEADLINE, read_sse(response))
        .await
        .expect("the stream ends");
    let (last, data) = events.last().unwrap();
    assert_eq!(last, "final", "{events:?}");
    assert_eq!(data["text"], "echo: streamed", "{events:?}");
    // A conversation that starts on the second runs there.
    let other = second.ask("pg-other", "new on the second").await;
    assert_eq!(
        other.json["reply"], "echo: new on the second",
        "{}",
        other.text
    );

    // The first stops cleanly (letting go of its conversations): the second adopts them
    // and goes on with the same thread.
    first.shutdown().await;
    let after = second.ask("pg", "after").await;
    assert_eq!(after.json["reply"], "echo: after", "{}", after.text);
    assert_eq!(after.json["thread_id"], thread_id);
    let thread = second.thread(thread_id.as_str().unwrap()).await;
    let contents: Vec<&str> = thread["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(
        contents,
        [
            "before",
            "echo: before",
            "via the second",
            "echo: via the second",
            "streamed",
            "echo: streamed",
            "after",
            "echo: after"
        ],
        "each message once, in order"
    );
    assert_eq!(mock.requests().len(), 5, "each message ran once");
    second.shutdown().await;
    schema.drop().await;
}

async fn wait_for_state(client: &Client, state: &str) {
    let started = Instant::now();
    loop {
        let ready = client.get("/readyz").await;
        if ready.status == 503 && ready.json["state"] == state {
            return;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "/readyz never said {state}: {} {}",
            ready.status,
            ready.text
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Needs no server: the database it names never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_at_start_is_waited_for_and_nothing_is_accepted_meanwhile() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = searchable_tempdir();
    // A port nobody listens on (bound, then let go).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "postgres://antler:hunter2@{}/antler",
        closed.local_addr().unwrap()
    );
    drop(closed);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = Client::new(format!("http://{}", listener.local_addr().unwrap()));
    let config = config(
        &mock.base_url(),
        &dir.path().join("store"),
        &format!("[store]\nbackend = \"postgres\"\nurl = {url:?}\n"),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(antler::serve(config, listener, async move {
        let _ = stopped.await;
    }));
    wait_for_state(&client, "waiting_for_database").await;
    assert!(client.is_healthy().await, "alive while it waits");
    let refused = client
        .post(&serde_json::json!({"conversation": "pg", "text": "hello"}))
        .await;
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert!(!refused.text.contains("hunter2"));
    assert!(mock.requests().is_empty(), "nothing ran");
    // A stop while waiting is a clean one.
    let _ = stop.send(());
    tokio::time::timeout(DEADLINE, serving)
        .await
        .expect("it stops while waiting")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_applies_the_schema_once_and_says_what_it_did() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    let dir = searchable_tempdir();
    let path = dir.path().join("antler.toml");
    std::fs::write(
        &path,
        format!(
            "[model]\nbase_url = \"http://127.0.0.1:9/v1\"\n{}",
            schema.store_config("migrate")
        ),
    )
    .unwrap();
    let path = path.to_str().unwrap();
    let (code, out, err) = run_binary(&["migrate", "--config", path]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("schema version 0 -> 2, applied"), "{out}");
    let (code, out, err) = run_binary(&["migrate", "--config", path]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("schema version 2, nothing to apply"), "{out}");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_served_on_sled_is_copied_to_postgres_and_served_there() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = searchable_tempdir();
    let folders = dir.path().join("store");
    let app = TestApp::start(&mock, &folders, "").await;
    let first = app.ask("moving", "before the move").await;
    assert_eq!(
        first.json["reply"], "echo: before the move",
        "{}",
        first.text
    );
    let thread_id = first.json["thread_id"].as_str().unwrap().to_owned();
    app.wait_idle().await;
    let from = format!("sled:{}", folders.display());
    let to = schema.url();
    let copy = [
        "store",
        "copy",
        "--from",
        from.as_str(),
        "--to",
        to.as_str(),
    ];
    // Not while antler runs on the store.
    let (code, out, err) = run_binary(&copy).await;
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(err.contains("another antler is using the store"), "{err}");
    app.shutdown().await;

    let (code, out, err) = run_binary(&copy).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("1 conversations"), "{out}");
    assert!(out.contains("2 thread messages"), "{out}");
    // The target holds a conversation now: a second copy is refused without --force.
    let (code, out, err) = run_binary(&copy).await;
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(err.contains("--force"), "{err}");

    let app = TestApp::start(&mock, &folders, &schema.store_config("after-move")).await;
    let thread = app.thread(&thread_id).await;
    let messages = thread["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[1]["content"], "echo: before the move");
    let again = app
        .post(&serde_json::json!({
            "conversation": "moving", "text": "before the move",
            "message_id": first.json["message_id"],
        }))
        .await;
    assert_eq!(again.json["duplicate"], true, "{}", again.text);
    let second = app.ask("moving", "after the move").await;
    assert_eq!(second.json["thread_id"], thread_id.as_str());
    assert_eq!(second.json["reply"], "echo: after the move");
    assert_eq!(mock.requests().len(), 2, "each message ran once");
    app.shutdown().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_does_not_see_the_shared_folder_refuses_to_start() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = searchable_tempdir();
    let shared = dir.path().join("shared");
    let first = TestApp::start(&mock, &shared, &schema.store_config("first")).await;
    let id = std::fs::read_to_string(shared.join(".antler-store-id")).unwrap();
    assert!(!id.trim().is_empty());

    // Another folder (a volume that is not the shared one): the replica says so and stops.
    let elsewhere = dir.path().join("elsewhere");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = config(&mock.base_url(), &elsewhere, &schema.store_config("lost"));
    let refused = tokio::time::timeout(
        DEADLINE,
        antler::serve(config, listener, std::future::pending()),
    )
    .await
    .expect("it stops rather than serving")
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("does not see the folder the other replicas share")
            && refused.contains(id.trim()),
        "{refused}"
    );
    first.shutdown().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_refuses_messages_with_503_and_a_running_turn_finishes_after_it() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    let Some(server) = schema.server_address() else {
        eprintln!("skipped: the test database's URL names no host:port to put a proxy in front of");
        return;
    };
    let outage = Outage::start(server).await;
    let url = schema.url_through(outage.address).unwrap();
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = searchable_tempdir();
    let store = format!(
        "[store]\nbackend = \"postgres\"\nurl = {url:?}\nlease_secs = 60\nreplica = \"outage\"\n"
    );
    let app = TestApp::start(&mock, &dir.path().join("store"), &store).await;
    let before = app.ask("out", "before").await;
    assert_eq!(before.json["reply"], "echo: before", "{}", before.text);

    // A turn is running (the model holds its answer) when the database goes away.
    mock.hold();
    let during = app
        .post(
            &serde_json::json!({"conversation": "out", "text": "during", "message_id": "m-during"}),
        )
        .await;
    assert_eq!(during.status, 202, "{}", during.text);
    mock.wait_for_requests(2).await;
    outage.cut();

    // Nothing is acknowledged that was not stored: a message is refused with 503 and
    // Retry-After, and readiness says the store fails.
    let refused = app
        .post(
            &serde_json::json!({"conversation": "out", "text": "lost?", "message_id": "m-refused"}),
        )
        .await;
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert_eq!(
        refused.json["error"]["code"], "store_unavailable",
        "{}",
        refused.text
    );
    assert_eq!(refused.headers["retry-after"], "5");
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.text);
    // The turn's answer comes while the database is away: its finish waits and retries.
    mock.release();
    tokio::time::sleep(Duration::from_millis(500)).await;
    outage.mend();

    let thread_id = before.json["thread_id"].as_str().unwrap().to_owned();
    let thread = app.wait_for_messages(&thread_id, 4).await;
    let contents: Vec<&str> = thread["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(
        contents,
        ["before", "echo: before", "during", "echo: during"]
    );
    // The refused message was never stored: sent again, it is new and answered.
    let again = app
        .post(&serde_json::json!({"conversation": "out", "text": "lost?", "message_id": "m-refused", "wait": true}))
        .await;
    assert_eq!(again.json["duplicate"], false, "{}", again.text);
    assert_eq!(again.json["reply"], "echo: lost?", "{}", again.text);
    assert_eq!(app.get("/readyz").await.status, 200);
    app.shutdown().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_approved_through_pairing_on_one_replica_may_talk_on_the_other() {
    use antler_testkit::telegram::{MockTelegram, SECRET, post};
    let Some(schema) = Schema::create().await else {
        return;
    };
    const TOKEN: &str = "replicas-pairing-admin-token";
    const PAT: u64 = 5_550_003_001;
    let dm = |n: u64, text: &str| {
        serde_json::json!({
            "update_id": 730_300_000 + n,
            "message": {
                "message_id": 3_000 + n,
                "from": {"id": PAT, "is_bot": false, "first_name": "Pat"},
                "chat": {"id": PAT, "first_name": "Pat", "type": "private"},
                "date": 1_767_225_600 + n,
                "text": text
            }
        })
        .to_string()
    };
    let mock = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    // No allowlists and no dm_policy: pairing is the default.
    let telegram = api.config("").replace("dm_policy = \"open\"\n", "");
    let overrides = |replica: &str| {
        format!(
            "{telegram}[channels.api]\ntoken = \"{TOKEN}\"\n{}",
            schema.store_config(replica)
        )
    };
    let dir = searchable_tempdir();
    let folders = dir.path().join("store");
    let first = TestApp::start(&mock, &folders, &overrides("first")).await;
    let second = TestApp::start(&mock, &folders, &overrides("second")).await;

    // Pat writes to the second replica: a pairing code, nothing runs.
    assert_eq!(post(&second.base, &dm(1, "hello"), Some(SECRET)).await, 200);
    let sent = api.wait_for_sends(1).await;
    let text = sent[0]["text"].as_str().unwrap().to_owned();
    let code: String = text
        .split_once("antler pairing approve ")
        .map(|(_, rest)| rest.chars().take(8).collect())
        .unwrap_or_else(|| panic!("no code in {text}"));
    // The operator approves through the first replica's API.
    let approved = reqwest::Client::new()
        .post(format!("{}/api/v1/pairing/approve", first.base))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"code": code}))
        .send()
        .await
        .unwrap();
    assert_eq!(approved.status(), 200);
    // The second replica learns of it (it reads the approvals again every few seconds):
    // Pat's next messages there are answered.
    let mut n = 1;
    antler_testkit::wait_until("the second replica admits Pat", || {
        n += 1;
        let (base, update) = (second.base.clone(), dm(n, "hello again"));
        let api = &api;
        async move {
            assert_eq!(post(&base, &update, Some(SECRET)).await, 200);
            tokio::time::sleep(Duration::from_millis(500)).await;
            api.sent()
                .await
                .iter()
                .any(|m| m["text"] == "echo: hello again")
                .then_some(())
        }
    })
    .await;
    first.shutdown().await;
    second.shutdown().await;
    schema.drop().await;
}
