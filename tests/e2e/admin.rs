//! The admin page end to end: its guard over plain HTTP (sign-in, session cookie, CSRF,
//! cross-site forms, the security headers, escaping), and an operator's round in a real
//! browser (Chromium driven through ChromeDriver by WebDriver): sign in, open a thread and see
//! its tool call, retry a failed delivery (it is delivered once), forget a memory fact (it is
//! gone from the next request), sign out. Screenshots of each step are kept under
//! `target/tmp/admin-screenshots/`. Without Chromium and ChromeDriver installed (`.ci/run`
//! installs them), the browser test says it is skipped and passes.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use antler_testkit::telegram::{MockTelegram, SECRET, fixture, post};
use axum::http::StatusCode;
use fantoccini::{Client as Browser, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::support::{
    Behaviour, DEADLINE, MockModel, TestApp, free_port, read_sse_until, wait_until,
};

const ADMIN_TOKEN: &str = "admin-token-0123456789";

fn tokens(more: &str) -> String {
    format!(
        "[channels.api]\ntoken = \"{ADMIN_TOKEN}\"\n[[channels.api.tokens]]\n\
         token = \"ana-token-0123456789\"\nuser = \"ana\"\n{more}"
    )
}

/// A client that follows no redirects, so the guard's answers are seen as they are.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The value of `name` in a response's `Set-Cookie` headers, with the whole header.
fn set_cookie(response: &reqwest::Response, name: &str) -> Option<(String, String)> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(|header| {
            let value = header
                .split(';')
                .next()
                .and_then(|pair| pair.split_once('='))
                .map(|(_, v)| v.to_owned())
                .unwrap_or_default();
            (value, header.to_owned())
        })
}

/// The hidden `csrf` field of a page.
fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    html[at..].split('"').next().unwrap().to_owned()
}

/// Signs in over plain HTTP: the session cookie and a page's CSRF token.
async fn sign_in(base: &str, token: &str) -> (String, String) {
    let http = http();
    let form = http
        .get(format!("{base}/admin/login"))
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), StatusCode::OK);
    let (login_cookie, _) = set_cookie(&form, "antler_admin_login").expect("login cookie");
    let csrf = csrf_of(&form.text().await.unwrap());
    let signed = http
        .post(format!("{base}/admin/login"))
        .header("cookie", format!("antler_admin_login={login_cookie}"))
        .form(&[("csrf", csrf.as_str()), ("token", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(signed.status(), StatusCode::SEE_OTHER);
    let (session, _) = set_cookie(&signed, "antler_admin").expect("session cookie");
    let page = http
        .get(format!("{base}/admin"))
        .header("cookie", format!("antler_admin={session}"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let csrf = csrf_of(&page.text().await.unwrap());
    (session, csrf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_needs_a_session_and_every_form_its_csrf_token() {
    let model = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&model, &tokens("")).await;
    let base = app.base.clone();
    let http = http();

    // Signed out: pages send the browser to the sign-in form; the form sets its cookie.
    let overview = http.get(format!("{base}/admin")).send().await.unwrap();
    assert_eq!(overview.status(), StatusCode::SEE_OTHER);
    assert_eq!(overview.headers()["location"], "/admin/login");
    let csp = overview.headers()["content-security-policy"]
        .to_str()
        .unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    let form = http
        .get(format!("{base}/admin/login"))
        .send()
        .await
        .unwrap();
    let (login_cookie, header) = set_cookie(&form, "antler_admin_login").unwrap();
    assert!(header.contains("HttpOnly") && header.contains("SameSite=Strict"));
    let login_csrf = csrf_of(&form.text().await.unwrap());
    assert_eq!(login_cookie, login_csrf, "the double-submit token");

    // A wrong token, a user's token, a sign-in without its cookie: refused, no session.
    for (token, cookie) in [
        ("admin-token-0123456788", true),
        ("ana-token-0123456789", true),
        (ADMIN_TOKEN, false),
    ] {
        let mut request = http
            .post(format!("{base}/admin/login"))
            .form(&[("csrf", login_csrf.as_str()), ("token", token)]);
        if cookie {
            request = request.header("cookie", format!("antler_admin_login={login_cookie}"));
        }
        let refused = request.send().await.unwrap();
        assert!(
            matches!(
                refused.status(),
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
            ),
            "{token}: {}",
            refused.status()
        );
        assert!(set_cookie(&refused, "antler_admin").is_none());
    }

    // The admin token signs in; the cookie is HttpOnly and strict (no Secure over http).
    let (session, csrf) = sign_in(&base, ADMIN_TOKEN).await;
    let cookie = format!("antler_admin={session}");

    // A message whose text is markup is shown as text.
    let admin = app.client.with_token(ADMIN_TOKEN);
    let answer = admin
        .ask("ops", "<script>alert('owned')</script> & <b>bold</b>")
        .await;
    let thread = answer.json["thread_id"].as_str().unwrap().to_owned();
    admin.wait_for_messages(&thread, 2).await;
    let page = http
        .get(format!("{base}/admin/threads/{thread}"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    assert_eq!(page.headers()["cache-control"], "no-store");
    let html = page.text().await.unwrap();
    assert!(!html.contains("<script>alert"), "{html}");
    assert!(
        html.contains("&lt;script&gt;alert('owned')&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;")
    );

    // The outbox follows the store live: the rows come as an `outbox` event, escaped.
    let live = http
        .get(format!("{base}/admin/deliveries/live"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), StatusCode::OK);
    let events = read_sse_until(live, |events| {
        events.iter().any(|(name, _)| name == "outbox")
    })
    .await;
    let rows = events[0].1["html"].as_str().unwrap().to_owned();
    assert!(rows.contains("api:ops") && rows.contains("sent"), "{rows}");
    // And a thread's page its turn's events: the next answer streams in.
    let thread_live = http
        .get(format!("{base}/admin/threads/{thread}/live"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(thread_live.status(), StatusCode::OK);
    let asking = admin.ask("ops", "again");
    let (events, _) = tokio::join!(
        read_sse_until(thread_live, |events| events
            .iter()
            .any(|(name, _)| name == "final")),
        asking
    );
    assert!(
        events
            .iter()
            .any(|(name, data)| name == "final" && data["text"] == "echo: again"),
        "{events:?}"
    );

    // State changes need the session's CSRF token, from this site.
    let failed_item = "/admin/outbox/999999/retry";
    for (form, extra) in [
        (vec![], None),
        (vec![("csrf", "0".repeat(64))], None),
        (
            vec![("csrf", csrf.clone())],
            Some(("origin", "https://evil.example")),
        ),
        (
            vec![("csrf", csrf.clone())],
            Some(("sec-fetch-site", "cross-site")),
        ),
    ] {
        let mut request = http
            .post(format!("{base}{failed_item}"))
            .header("cookie", &cookie)
            .form(&form);
        if let Some((name, value)) = extra {
            request = request.header(name, value);
        }
        let refused = request.send().await.unwrap();
        assert_eq!(
            refused.status(),
            StatusCode::FORBIDDEN,
            "{form:?} {extra:?}"
        );
    }
    // With it, the request is done (here: there is no such item).
    let done = http
        .post(format!("{base}{failed_item}"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::NOT_FOUND);
    // Bodies are bounded.
    let huge = "x".repeat(200 * 1024);
    let too_large = http
        .post(format!("{base}{failed_item}"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str()), ("pad", huge.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);

    // Signing out ends the session for good.
    let out = http
        .post(format!("{base}/admin/logout"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    assert!(
        set_cookie(&out, "antler_admin")
            .unwrap()
            .1
            .contains("Max-Age=0")
    );
    let after = http
        .get(format!("{base}/admin"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), StatusCode::SEE_OTHER, "signed out");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_token_the_page_is_open_on_loopback_only() {
    let model = MockModel::start(Behaviour::Echo).await;
    // A loopback listener without tokens: signing in needs no token.
    let app = TestApp::spawn(&model, "").await;
    let (session, _) = sign_in(&app.base, "").await;
    assert_eq!(session.len(), 64);
    app.shutdown().await;
    // Only user tokens: nobody may sign in.
    let app = TestApp::spawn(
        &model,
        "[[channels.api.tokens]]\ntoken = \"ana-token-0123456789\"\nuser = \"ana\"\n",
    )
    .await;
    let refused = http()
        .get(format!("{}/admin/login", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    app.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// The browser
// ---------------------------------------------------------------------------------------------

/// The first of `names` found on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// ChromeDriver, running on a free port until dropped.
struct Driver {
    child: tokio::process::Child,
    url: String,
}

impl Driver {
    async fn start(binary: &PathBuf) -> Self {
        let port = free_port();
        let child = tokio::process::Command::new(binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let url = format!("http://127.0.0.1:{port}");
        let status = format!("{url}/status");
        wait_until("chromedriver answers", || async {
            reqwest::get(&status)
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ())
        })
        .await;
        Self { child, url }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Where the screenshots go.
fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("admin-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(browser: &Browser, name: &str) {
    let png = browser.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

/// Waits until an element matching `css` holds `text` on the page at `path`, loading it again
/// meanwhile.
async fn wait_for_text(browser: &Browser, base: &str, path: &str, css: &str, text: &str) {
    let start = Instant::now();
    loop {
        browser.goto(&format!("{base}{path}")).await.unwrap();
        let found = browser.find_all(Locator::Css(css)).await.unwrap();
        for element in found {
            if element.text().await.unwrap_or_default().contains(text) {
                return;
            }
        }
        assert!(
            start.elapsed() < DEADLINE,
            "`{text}` in `{css}` on {path}: {}",
            browser.source().await.unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The memory document the test seeds: two facts.
fn seeded_memory() -> Value {
    let fact = |id: &str, content: &str| {
        json!({"id": id, "content": content, "category": "preference", "confidence": 0.9,
               "createdAt": "2026-11-30T10:00:00Z", "source": "thread-0"})
    };
    json!({
        "version": 1,
        "facts": [
            fact("f-coffee", "Drinks ristretto before every deploy"),
            fact("f-shell", "Prefers the fish shell"),
        ],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_signs_in_sees_a_tool_call_retries_a_delivery_forgets_a_fact_and_signs_out() {
    let Some(chromedriver) = on_path(&["chromedriver"]) else {
        eprintln!(
            "skipped: chromedriver is not installed (apt-get install chromium chromium-driver)"
        );
        return;
    };
    let Some(chromium) = on_path(&["chromium", "chromium-browser", "google-chrome"]) else {
        eprintln!("skipped: Chromium is not installed (apt-get install chromium chromium-driver)");
        return;
    };
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let telegram = MockTelegram::start().await;
    // The first answer fails twice with server errors: given up after `max_attempts`.
    telegram
        .server_error_next_sends(&[(502, "Bad Gateway"), (502, "Bad Gateway")])
        .await;
    let config = tokens(&format!(
        "{}\n[delivery]\nmax_attempts = 2\n\n[memory]\nenabled = true\ndebounce_seconds = 3600\nshutdown_flush_secs = 1\n\n\
         [telemetry]\ntrace_url = \"https://traces.example/trace/{{trace_id}}\"\n",
        telegram.config("")
    ));
    let app = TestApp::spawn(&model, &config).await;
    let base = app.base.clone();
    let admin = app.client.with_token(ADMIN_TOKEN);
    let seeded = admin
        .http
        .put(format!("{base}/api/v1/memory/telegram:5550001001"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&seeded_memory())
        .send()
        .await
        .unwrap();
    assert_eq!(seeded.status(), StatusCode::OK);

    assert_eq!(
        post(&base, &fixture("tg_private_text"), Some(SECRET)).await,
        StatusCode::OK
    );
    telegram.wait_for_sends(2).await;

    let driver = Driver::start(&chromedriver).await;
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_owned(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1200,1600"],
        }),
    );
    let browser = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a browser session");

    // Sign in.
    browser.goto(&format!("{base}/admin")).await.unwrap();
    assert!(
        browser
            .current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/admin/login")
    );
    screenshot(&browser, "01-sign-in").await;
    browser
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(ADMIN_TOKEN)
        .await
        .unwrap();
    browser
        .find(Locator::Css("#sign-in"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_until("the overview", || async {
        (browser.current_url().await.unwrap().path() == "/admin").then_some(())
    })
    .await;
    browser
        .find(Locator::Css("#channels"))
        .await
        .expect("platform health");
    screenshot(&browser, "02-overview").await;

    // Open the thread: the tool call and its result are there.
    browser
        .goto(&format!("{base}/admin/conversations"))
        .await
        .unwrap();
    browser
        .find(Locator::Css("#conversations tbody a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let tool = browser.find(Locator::Css(".tool-name")).await.unwrap();
    assert_eq!(tool.text().await.unwrap(), "current_time");
    browser
        .find(Locator::Css(".tool-result"))
        .await
        .expect("the tool's result");
    screenshot(&browser, "03-thread").await;

    // The answer was given up on after two attempts; retry it now: delivered once.
    wait_for_text(
        &browser,
        &base,
        "/admin/deliveries",
        "#outbox-rows .badge",
        "failed",
    )
    .await;
    screenshot(&browser, "04-delivery-failed").await;
    browser
        .find(Locator::Css("#outbox-rows button.primary"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for_text(
        &browser,
        &base,
        "/admin/deliveries",
        "#outbox-rows .badge",
        "sent",
    )
    .await;
    screenshot(&browser, "05-delivery-sent").await;
    admin.wait_idle().await;
    let sends = telegram.sent().await;
    assert_eq!(sends.len(), 3, "two refused, then one delivered: {sends:?}");
    assert_eq!(sends[1]["text"], sends[2]["text"], "the same answer");

    // Forget one of the user's facts: the next request has the other only.
    browser
        .goto(&format!("{base}/admin/memory/telegram%3A5550001001"))
        .await
        .unwrap();
    screenshot(&browser, "06-memory").await;
    browser
        .find(Locator::Css("tr[data-fact='f-coffee'] button.forget"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_until("the fact is gone from the page", || async {
        browser
            .source()
            .await
            .is_ok_and(|html| !html.contains("ristretto") && html.contains("fish shell"))
            .then_some(())
    })
    .await;
    screenshot(&browser, "07-memory-forgotten").await;
    let before = model.count();
    let next = fixture("tg_private_text")
        .replace("730100001", "730100009")
        .replace("1201", "1209")
        .replace("status payments-api", "and now?");
    assert_eq!(post(&base, &next, Some(SECRET)).await, StatusCode::OK);
    let requests = model.wait_for_requests(before + 1).await;
    let asked = requests[before].body.to_string();
    assert!(
        asked.contains("fish shell"),
        "the kept fact is injected: {asked}"
    );
    assert!(
        !asked.contains("ristretto"),
        "the forgotten fact is not: {asked}"
    );

    // A form without the CSRF token is refused, even with the session's cookie.
    let cookie = browser
        .get_named_cookie("antler_admin")
        .await
        .expect("the session cookie");
    assert!(cookie.http_only().unwrap_or(false));
    let refused = http()
        .post(format!(
            "{base}/admin/memory/telegram:5550001001/facts/f-shell/forget"
        ))
        .header("cookie", format!("antler_admin={}", cookie.value()))
        .form(&[("csrf", "")])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);

    // Sign out: the pages ask for a sign-in again.
    browser
        .find(Locator::Css("form.signout button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_until("the sign-in form", || async {
        browser
            .current_url()
            .await
            .is_ok_and(|url| url.path() == "/admin/login")
            .then_some(())
    })
    .await;
    browser
        .goto(&format!("{base}/admin/deliveries"))
        .await
        .unwrap();
    assert_eq!(browser.current_url().await.unwrap().path(), "/admin/login");
    screenshot(&browser, "08-signed-out").await;
    let stale = http()
        .get(format!("{base}/admin"))
        .header("cookie", format!("antler_admin={}", cookie.value()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        stale.status(),
        StatusCode::SEE_OTHER,
        "the old cookie is dead"
    );

    browser.close().await.unwrap();
    drop(driver);
    app.shutdown().await;
    eprintln!("screenshots in {}", screenshots().display());
}
