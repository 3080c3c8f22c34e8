//! What users and operators see of memory, end to end over real HTTP: an operator seeds a
//! user's memory with `PUT /api/v1/memory/{user_key}` (admin token), the user sees it with
//! `/memory` through the API channel and another user does not, `/memory forget 1` removes the
//! first fact shown, `/memory clear` asks and `/memory clear confirm` forgets; the routes refuse
//! user tokens (403) and missing tokens (401), and validate what they are given.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::support::{Answer, Behaviour, Client, MockModel, TestApp};

const TOKENS: &str = r#"
[channels.api]
token = "admin-token-0123456789"
[[channels.api.tokens]]
token = "ana-token-0123456789"
user = "ana"
[[channels.api.tokens]]
token = "bob-token-0123456789"
user = "bob"

[memory]
max_facts = 10
"#;

fn as_user(app: &TestApp, token: Option<&str>) -> Client {
    Client {
        token: token.map(str::to_owned),
        ..app.client.clone()
    }
}

/// `method path` with an optional JSON body (sent as `application/json`).
async fn call(client: &Client, method: &str, path: &str, body: Option<&str>) -> Answer {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = client
        .http
        .request(method, format!("{}{path}", client.base));
    if let Some(token) = &client.token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_owned());
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

/// The reply to `text` sent by the token's user, waited for.
async fn command(client: &Client, text: &str) -> String {
    let answer = client
        .post(&json!({"conversation": "mem", "text": text, "wait": true}))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    answer.json["reply"].as_str().unwrap().to_owned()
}

fn fact(id: &str, content: &str, confidence: f64) -> Value {
    json!({
        "id": id,
        "content": content,
        "category": "context",
        "confidence": confidence,
        "createdAt": "2026-11-30T10:00:00Z",
        "source": "thread-1",
    })
}

fn document(facts: Vec<Value>) -> Value {
    json!({
        "version": 1,
        "user": {
            "workContext": {"summary": "Runs the payments platform team", "updatedAt": "2026-11-30T10:00:00Z"},
        },
        "facts": facts,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_seeds_memory_and_only_its_user_sees_forgets_and_clears_it() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, TOKENS).await;
    let admin = as_user(&app, Some("admin-token-0123456789"));
    let ana = as_user(&app, Some("ana-token-0123456789"));
    let bob = as_user(&app, Some("bob-token-0123456789"));

    let seeded = document(vec![
        fact("f-tea", "Prefers tea over coffee", 0.75),
        fact("f-deploy", "Deploys only on Tuesdays", 0.95),
    ]);
    let put = call(
        &admin,
        "PUT",
        "/api/v1/memory/api:ana",
        Some(&seeded.to_string()),
    )
    .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.text);
    let got = call(&admin, "GET", "/api/v1/memory/api%3Aana", None).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.text);
    assert_eq!(got.json["facts"].as_array().unwrap().len(), 2);
    assert_eq!(
        got.json["user"]["workContext"]["summary"],
        "Runs the payments platform team"
    );
    let list = call(&admin, "GET", "/api/v1/memory?limit=10", None).await;
    assert_eq!(list.json["users"], json!(["api:ana"]), "{}", list.text);

    // Ana sees her memory, most confident fact first; Bob sees nothing of it.
    let shown = command(&ana, "/memory").await;
    assert!(shown.contains("Runs the payments platform team"), "{shown}");
    let first = shown.find("1. Deploys only on Tuesdays").expect(&shown);
    let second = shown.find("2. Prefers tea over coffee").expect(&shown);
    assert!(first < second, "{shown}");
    let others = command(&bob, "/memory").await;
    assert_eq!(others, "I don't remember anything about you yet.");
    assert!(!others.contains("Tuesdays"));

    // Forgetting fact 1 removes the one shown first.
    let forgot = command(&ana, "/memory forget 1").await;
    assert!(forgot.contains("Forgot fact 1"), "{forgot}");
    assert!(forgot.contains("Deploys only on Tuesdays"), "{forgot}");
    let after = call(&admin, "GET", "/api/v1/memory/api:ana", None).await;
    let facts = after.json["facts"].as_array().unwrap();
    assert_eq!(facts.len(), 1);
    assert_eq!(facts[0]["id"], "f-tea");
    let missing = command(&ana, "/memory forget 5").await;
    assert!(missing.contains("there is no fact 5"), "{missing}");

    // Clearing asks first, and only the confirmation forgets.
    let ask = command(&ana, "/memory clear").await;
    assert!(ask.contains("/memory clear confirm"), "{ask}");
    let still = call(&admin, "GET", "/api/v1/memory/api:ana", None).await;
    assert_eq!(
        still.status,
        StatusCode::OK,
        "not cleared before confirming"
    );
    let done = command(&ana, "/memory clear confirm").await;
    assert!(done.starts_with("Done"), "{done}");
    let gone = call(&admin, "GET", "/api/v1/memory/api:ana", None).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{}", gone.text);
    assert_eq!(
        command(&ana, "/memory").await,
        "I don't remember anything about you yet."
    );

    let help = command(&ana, "/help").await;
    assert!(help.contains("/memory — "), "{help}");
    assert_eq!(mock.count(), 0, "commands make no model call");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_api_is_admin_only_and_validates_what_it_is_given() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, TOKENS).await;
    let admin = as_user(&app, Some("admin-token-0123456789"));
    let ana = as_user(&app, Some("ana-token-0123456789"));
    let nobody = as_user(&app, None);
    let doc = document(vec![
        fact("f1", "Uses vim", 0.9),
        fact("f2", "Lives in Lyon", 0.8),
    ]);
    let body = doc.to_string();

    for (method, path, body) in [
        ("GET", "/api/v1/memory", None),
        ("GET", "/api/v1/memory/api:ana", None),
        ("PUT", "/api/v1/memory/api:ana", Some(body.as_str())),
        ("DELETE", "/api/v1/memory/api:ana", None),
        ("DELETE", "/api/v1/memory/api:ana/facts/f1", None),
    ] {
        let user = call(&ana, method, path, body).await;
        assert_eq!(
            user.status,
            StatusCode::FORBIDDEN,
            "{method} {path}: {}",
            user.text
        );
        let anonymous = call(&nobody, method, path, body).await;
        assert_eq!(
            anonymous.status,
            StatusCode::UNAUTHORIZED,
            "{method} {path}: {}",
            anonymous.text
        );
    }
    let none = call(&admin, "GET", "/api/v1/memory/api:ana", None).await;
    assert_eq!(none.status, StatusCode::NOT_FOUND, "nothing was written");

    // Bad JSON, a document of the wrong shape, too many facts, bad keys: 400, nothing stored.
    let bad_json = call(&admin, "PUT", "/api/v1/memory/api:ana", Some("{not json")).await;
    assert_eq!(
        bad_json.status,
        StatusCode::BAD_REQUEST,
        "{}",
        bad_json.text
    );
    let wrong = call(
        &admin,
        "PUT",
        "/api/v1/memory/api:ana",
        Some(r#"{"version": 1, "facts": "many"}"#),
    )
    .await;
    assert_eq!(wrong.status, StatusCode::BAD_REQUEST, "{}", wrong.text);
    let eleven = document(
        (0..11)
            .map(|i| fact(&format!("f{i}"), &format!("fact {i}"), 0.9))
            .collect(),
    );
    let too_many = call(
        &admin,
        "PUT",
        "/api/v1/memory/api:ana",
        Some(&eleven.to_string()),
    )
    .await;
    assert_eq!(
        too_many.status,
        StatusCode::BAD_REQUEST,
        "{}",
        too_many.text
    );
    assert!(too_many.text.contains("at most 10"), "{}", too_many.text);
    let out_of_range = document(vec![fact("f1", "x", 3.0)]);
    let conf = call(
        &admin,
        "PUT",
        "/api/v1/memory/api:ana",
        Some(&out_of_range.to_string()),
    )
    .await;
    assert_eq!(conf.status, StatusCode::BAD_REQUEST, "{}", conf.text);
    let long_key = format!("/api/v1/memory/api:{}", "x".repeat(400));
    for path in [
        "/api/v1/memory/irc:ana",
        "/api/v1/memory/ana",
        long_key.as_str(),
    ] {
        let bad_key = call(&admin, "PUT", path, Some(&body)).await;
        assert_eq!(
            bad_key.status,
            StatusCode::BAD_REQUEST,
            "{path}: {}",
            bad_key.text
        );
    }
    let page = call(&admin, "GET", "/api/v1/memory?limit=0", None).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST, "{}", page.text);
    let none = call(&admin, "GET", "/api/v1/memory/api:ana", None).await;
    assert_eq!(none.status, StatusCode::NOT_FOUND, "still nothing written");

    // A body that is not declared JSON is refused before it is read.
    let plain = admin
        .http
        .put(format!("{}/api/v1/memory/api:ana", admin.base))
        .bearer_auth("admin-token-0123456789")
        .header("content-type", "text/plain")
        .body(body.clone())
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(plain, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    // Written, one fact forgotten by id, the user forgotten.
    let put = call(&admin, "PUT", "/api/v1/memory/telegram:42", Some(&body)).await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.text);
    let put = call(&admin, "PUT", "/api/v1/memory/person:ada", Some(&body)).await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.text);
    let first = call(&admin, "GET", "/api/v1/memory?limit=1", None).await;
    assert_eq!(first.json["users"], json!(["person:ada"]), "{}", first.text);
    assert_eq!(first.json["next_cursor"], "person:ada");
    let second = call(
        &admin,
        "GET",
        "/api/v1/memory?limit=1&cursor=person:ada",
        None,
    )
    .await;
    assert_eq!(
        second.json["users"],
        json!(["telegram:42"]),
        "{}",
        second.text
    );
    let removed = call(
        &admin,
        "DELETE",
        "/api/v1/memory/telegram:42/facts/f1",
        None,
    )
    .await;
    assert_eq!(removed.status, StatusCode::OK, "{}", removed.text);
    assert_eq!(removed.json["removed"]["content"], "Uses vim");
    let again = call(
        &admin,
        "DELETE",
        "/api/v1/memory/telegram:42/facts/f1",
        None,
    )
    .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND, "{}", again.text);
    let left = call(&admin, "GET", "/api/v1/memory/telegram:42", None).await;
    assert_eq!(left.json["facts"].as_array().unwrap().len(), 1);
    let cleared = call(&admin, "DELETE", "/api/v1/memory/telegram:42", None).await;
    assert_eq!(cleared.status, StatusCode::OK, "{}", cleared.text);
    assert_eq!(cleared.json["deleted"], true);
    let gone = call(&admin, "GET", "/api/v1/memory/telegram:42", None).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    app.shutdown().await;
}
