//! The Open API calls antler makes, on reqwest, with the tenant access token cached.
//!
//! Every failure becomes a [`ChannelError`] that carries Feishu's error code and message or the
//! HTTP status, never a response body, the app secret or a token.

use std::time::Duration;

use antler_channel::ChannelError;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::socket::{EXCEED_CONN_LIMIT, SocketConfig, SocketEndpoint, WireConfig};

/// Where Feishu's Open API is (China).
pub const DEFAULT_API_URL: &str = "https://open.feishu.cn";

/// Where Lark's Open API is (international).
pub const LARK_API_URL: &str = "https://open.larksuite.com";

/// How long to wait after a rate limit that names no delay.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Feishu's codes for "too many requests", whatever the HTTP status (429, or 400 from the
/// message service): 99991400 "request trigger frequency limit" (the API gateway, "API
/// frequency control" page, HTTP 429 with `x-ogw-ratelimit-reset`); 230020 "This operation
/// triggers the frequency limit" (HTTP 400: messages to one chat, 5 a second shared by the
/// chat's bots, and edits of one message, 5 a second; the "Send message", "Reply" and "Update
/// message card" pages).
const RATE_LIMITED: [i64; 2] = [99_991_400, 230_020];

/// Feishu's codes for a tenant access token that is invalid or expired: the cached token is
/// dropped and the call made once more with a new one.
const INVALID_TOKEN: [i64; 3] = [99_991_663, 99_991_661, 99_991_668];

/// A token is refreshed once less than this remains: Feishu hands out a new token only then
/// (before, it returns the same one), and the old one stays valid meanwhile.
const REFRESH_BEFORE_MS: u64 = 30 * 60 * 1000;

/// The long connection endpoint's code for "system busy" (SDKs: `SystemBusy`).
const SYSTEM_BUSY: i64 = 1;

/// The long connection endpoint's code for an internal error (SDKs: `InternalError`).
const INTERNAL_ERROR: i64 = 1_000_040_343;

/// The most of an error body read to find Feishu's code in it.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// The bot as Feishu knows it (`GET /open-apis/bot/v3/info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeishuIdentity {
    /// The bot's open_id (`ou_…`): what `mentions[].id.open_id` names when it is @mentioned.
    pub open_id: String,
    /// The app's name, as users see the bot.
    pub name: String,
}

/// A cached tenant access token.
struct Token {
    value: String,
    /// When to fetch a new one, in milliseconds since the Unix epoch.
    refresh_at_ms: u64,
}

/// An Open API client for one app (app id and secret), with its tenant token cached.
pub struct FeishuApi {
    http: reqwest::Client,
    /// The base URL, without a trailing slash.
    api_url: String,
    app_id: String,
    app_secret: String,
    /// A tokio mutex, held across the token request: concurrent callers that find no valid
    /// token wait for the one fetch instead of each making their own.
    token: Mutex<Option<Token>>,
    now_ms: fn() -> u64,
}

impl std::fmt::Debug for FeishuApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeishuApi")
            .field("api_url", &self.api_url)
            .field("app_id", &self.app_id)
            .field("app_secret", &"***")
            .finish_non_exhaustive()
    }
}

/// Why one attempt at a call failed.
enum Failure {
    /// The token was refused: fetch a new one and try again (once).
    InvalidToken,
    /// Anything else.
    Error(ChannelError),
}

impl From<ChannelError> for Failure {
    fn from(error: ChannelError) -> Self {
        Self::Error(error)
    }
}

/// The envelope every Open API answer shares.
#[derive(Debug, Deserialize)]
struct Answer {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    msg: String,
}

impl FeishuApi {
    /// A client for the app `app_id` / `app_secret` at `api_url` (`https://open.feishu.cn`,
    /// `https://open.larksuite.com` or a mock; plain http is allowed so tests can use one).
    /// `now_ms` decides when the cached token is due for renewal.
    pub fn new(
        app_id: &str,
        app_secret: &str,
        api_url: &str,
        now_ms: fn() -> u64,
    ) -> Result<Self, ChannelError> {
        let api_url = api_url.trim_end_matches('/');
        let parsed = reqwest::Url::parse(api_url).map_err(|e| {
            ChannelError::Permanent(format!("channels.feishu.api_url is not a URL: {e}"))
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ChannelError::Permanent(
                "channels.feishu.api_url must be an http(s) URL".to_owned(),
            ));
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| ChannelError::Permanent(format!("no HTTP client: {e}")))?;
        Ok(Self {
            http,
            api_url: api_url.to_owned(),
            app_id: app_id.to_owned(),
            app_secret: app_secret.to_owned(),
            token: Mutex::new(None),
            now_ms,
        })
    }

    /// A valid tenant access token, from the cache or fetched
    /// (`POST /open-apis/auth/v3/tenant_access_token/internal`): also how `antler doctor`
    /// checks the app id and secret. Keep it out of logs.
    pub async fn tenant_token(&self) -> Result<String, ChannelError> {
        let mut cached = self.token.lock().await;
        let now = (self.now_ms)();
        if let Some(token) = cached.as_ref().filter(|t| now < t.refresh_at_ms) {
            return Ok(token.value.clone());
        }
        let token = self.fetch_token(now).await?;
        let value = token.value.clone();
        *cached = Some(token);
        Ok(value)
    }

    /// Drops the cached token if it is still `refused`, so the next call fetches another; a
    /// caller that finds a newer token (another caller already renewed it) keeps that one.
    async fn invalidate(&self, refused: &str) {
        let mut cached = self.token.lock().await;
        if cached.as_ref().is_some_and(|t| t.value == refused) {
            *cached = None;
        }
    }

    async fn fetch_token(&self, now: u64) -> Result<Token, ChannelError> {
        #[derive(Deserialize)]
        struct TokenAnswer {
            #[serde(default)]
            code: i64,
            #[serde(default)]
            msg: String,
            tenant_access_token: Option<String>,
            #[serde(default)]
            expire: u64,
        }
        let response = self
            .http
            .post(format!(
                "{}/open-apis/auth/v3/tenant_access_token/internal",
                self.api_url
            ))
            .json(&json!({"app_id": self.app_id, "app_secret": self.app_secret}))
            .send()
            .await
            .map_err(|e| self.transport(e, ""))?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(|e| self.transport(e, ""))?;
        let answer: Option<TokenAnswer> = serde_json::from_slice(&body).ok();
        match answer {
            Some(TokenAnswer {
                code: 0,
                tenant_access_token: Some(value),
                expire,
                ..
            }) if !value.is_empty() => {
                // Renew when 30 minutes remain, or halfway through a shorter lifetime, so a
                // short-lived token is not fetched again on every call.
                let lifetime_ms = expire.saturating_mul(1000);
                let keep_ms = lifetime_ms
                    .saturating_sub(REFRESH_BEFORE_MS)
                    .max(lifetime_ms / 2);
                Ok(Token {
                    value,
                    refresh_at_ms: now.saturating_add(keep_ms),
                })
            }
            Some(TokenAnswer { code, msg, .. }) if RATE_LIMITED.contains(&code) => {
                tracing::debug!(msg = %self.mask(&msg, ""), "token request rate limited");
                Err(ChannelError::RateLimited {
                    retry_after: retry_after(&headers),
                })
            }
            _ if status == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                Err(ChannelError::RateLimited {
                    retry_after: retry_after(&headers),
                })
            }
            _ if status.is_server_error() => Err(ChannelError::Transient(format!(
                "Feishu answered HTTP {status} for a tenant token"
            ))),
            Some(TokenAnswer { code, msg, .. }) if code != 0 => {
                Err(ChannelError::Permanent(format!(
                    "Feishu refused the app credentials (channels.feishu.app_id, app_secret): \
                     {code} {}",
                    self.mask(&msg, "")
                )))
            }
            _ => Err(ChannelError::Transient(format!(
                "Feishu answered HTTP {status} without a tenant token"
            ))),
        }
    }

    /// Where to open the long connection: `POST /callback/ws/endpoint` with
    /// `{"AppID", "AppSecret"}` (the SDKs' casing) and the header `locale: zh`, as the SDKs
    /// call it. Judged as they judge it: HTTP other than 200, code 1 (system busy) and
    /// 1000040343 (internal error) are worth another attempt ([`ChannelError::Transient`]);
    /// any other code (credentials refused, not an internal app, too many connections) is
    /// [`ChannelError::Permanent`]. Also how `antler doctor` checks the long connection.
    pub async fn socket_endpoint(&self) -> Result<SocketEndpoint, ChannelError> {
        #[derive(Deserialize)]
        struct EndpointAnswer {
            #[serde(default)]
            code: i64,
            #[serde(default)]
            msg: String,
            data: Option<EndpointData>,
        }
        #[derive(Deserialize)]
        struct EndpointData {
            #[serde(rename = "URL", default)]
            url: String,
            #[serde(rename = "ClientConfig")]
            client_config: Option<WireConfig>,
        }
        let response = self
            .http
            .post(format!("{}/callback/ws/endpoint", self.api_url))
            .header("locale", "zh")
            .json(&json!({"AppID": self.app_id, "AppSecret": self.app_secret}))
            .send()
            .await
            .map_err(|e| self.transport(e, ""))?;
        let status = response.status();
        if status != reqwest::StatusCode::OK {
            return Err(ChannelError::Transient(format!(
                "Feishu answered HTTP {status} for the long connection's endpoint"
            )));
        }
        let body = read_capped(response, ERROR_BODY_LIMIT)
            .await
            .map_err(|e| self.transport(e, ""))?;
        let answer: EndpointAnswer = serde_json::from_slice(&body).map_err(|_| {
            ChannelError::Transient(
                "Feishu's answer for the long connection's endpoint is not its JSON".to_owned(),
            )
        })?;
        let msg = self.mask(&answer.msg, "");
        match answer.code {
            0 => {}
            SYSTEM_BUSY | INTERNAL_ERROR => {
                return Err(ChannelError::Transient(format!(
                    "Feishu is busy ({} {msg})",
                    answer.code
                )));
            }
            EXCEED_CONN_LIMIT => {
                return Err(ChannelError::Permanent(format!(
                    "Feishu refused the long connection: too many connections ({EXCEED_CONN_LIMIT} \
                     {msg}); an app may hold at most 50"
                )));
            }
            code => {
                return Err(ChannelError::Permanent(format!(
                    "Feishu refused the long connection ({code} {msg}): check \
                     channels.feishu.app_id and app_secret, and that the app is an internal \
                     (custom) app whose events are received through the persistent connection"
                )));
            }
        }
        match answer.data.filter(|data| !data.url.is_empty()) {
            Some(data) => Ok(SocketEndpoint {
                url: data.url,
                config: data
                    .client_config
                    .map_or_else(SocketConfig::default, |wire| {
                        SocketConfig::default().updated(&wire)
                    }),
            }),
            None => Err(ChannelError::Transient(
                "Feishu's answer for the long connection's endpoint names no URL".to_owned(),
            )),
        }
    }

    /// Who the bot is (`GET /open-apis/bot/v3/info`).
    pub async fn bot_info(&self) -> Result<FeishuIdentity, ChannelError> {
        let answer = self
            .call(|token| {
                self.http
                    .get(format!("{}/open-apis/bot/v3/info", self.api_url))
                    .bearer_auth(token)
            })
            .await?;
        // This endpoint answers `{"code":0,"bot":{…}}`, not under `data`.
        let bot = answer.get("bot").unwrap_or(&Value::Null);
        let open_id = bot.get("open_id").and_then(Value::as_str).unwrap_or("");
        if open_id.is_empty() {
            return Err(ChannelError::Permanent(
                "Feishu's bot info names no open_id: is the app's bot feature on?".to_owned(),
            ));
        }
        Ok(FeishuIdentity {
            open_id: open_id.to_owned(),
            name: bot
                .get("app_name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        })
    }

    /// Replies to the message `message_id` (`POST /open-apis/im/v1/messages/{id}/reply`)
    /// with `content` (the JSON string of a `msg_type` message); `uuid` makes a retry of the
    /// same reply a no-op. Returns the new message's id.
    pub async fn reply(
        &self,
        message_id: &str,
        msg_type: &str,
        content: &str,
        uuid: &str,
    ) -> Result<String, ChannelError> {
        let body = reply_body(msg_type, content, uuid);
        let url = format!(
            "{}/open-apis/im/v1/messages/{}/reply",
            self.api_url,
            path_segment(message_id)?
        );
        let answer = self
            .call(|token| self.http.post(&url).bearer_auth(token).json(&body))
            .await?;
        message_id_of(&answer)
    }

    /// Sends a message to the chat `chat_id` (`POST /open-apis/im/v1/messages`); returns its id.
    pub async fn send_to_chat(
        &self,
        chat_id: &str,
        msg_type: &str,
        content: &str,
        uuid: &str,
    ) -> Result<String, ChannelError> {
        let body = send_body(chat_id, msg_type, content, uuid);
        let answer = self
            .call(|token| {
                self.http
                    .post(format!("{}/open-apis/im/v1/messages", self.api_url))
                    .query(&[("receive_id_type", "chat_id")])
                    .bearer_auth(token)
                    .json(&body)
            })
            .await?;
        message_id_of(&answer)
    }

    /// Replaces the card of the bot's message `message_id`
    /// (`PATCH /open-apis/im/v1/messages/{id}`, cards sent with `update_multi` only).
    pub async fn update_card(&self, message_id: &str, content: &str) -> Result<(), ChannelError> {
        let body = json!({"content": content});
        let url = format!(
            "{}/open-apis/im/v1/messages/{}",
            self.api_url,
            path_segment(message_id)?
        );
        self.call(|token| self.http.patch(&url).bearer_auth(token).json(&body))
            .await?;
        Ok(())
    }

    /// Downloads a file or image of a message
    /// (`GET /open-apis/im/v1/messages/{id}/resources/{key}?type=image|file`), at most
    /// `max_bytes` of it: a larger one is [`ChannelError::TooLarge`], known from
    /// `Content-Length` when sent, else found while reading.
    pub async fn fetch_resource(
        &self,
        message_id: &str,
        key: &str,
        kind: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, ChannelError> {
        let url = format!(
            "{}/open-apis/im/v1/messages/{}/resources/{}",
            self.api_url,
            path_segment(message_id)?,
            path_segment(key)?
        );
        let mut refreshed = false;
        loop {
            let token = self.tenant_token().await?;
            let response = self
                .http
                .get(&url)
                .query(&[("type", kind)])
                .bearer_auth(&token)
                .send()
                .await
                .map_err(|e| self.transport(e, &token))?;
            let json = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/json"));
            if response.status().is_success() && !json {
                let declared = response.content_length();
                return antler_channel::read_bounded(
                    response.bytes_stream(),
                    declared,
                    max_bytes,
                    |e| self.transport(e, &token),
                )
                .await;
            }
            // An error (or a JSON answer where a file was expected): Feishu's code says which.
            match self.judge(response, &token).await {
                Err(Failure::InvalidToken) if !refreshed => {
                    refreshed = true;
                    self.invalidate(&token).await;
                }
                Err(Failure::InvalidToken) => return Err(token_refused()),
                Err(Failure::Error(error)) => return Err(error),
                Ok(_) => {
                    return Err(ChannelError::Permanent(
                        "Feishu answered JSON instead of the file".to_owned(),
                    ));
                }
            }
        }
    }

    /// Makes a JSON call with the tenant token; once more with a new token if Feishu says the
    /// token is invalid. Returns the answer's JSON (its `code` was 0).
    async fn call<F>(&self, request: F) -> Result<Value, ChannelError>
    where
        F: Fn(&str) -> reqwest::RequestBuilder,
    {
        let mut refreshed = false;
        loop {
            let token = self.tenant_token().await?;
            let response = request(&token)
                .send()
                .await
                .map_err(|e| self.transport(e, &token))?;
            match self.judge(response, &token).await {
                Ok(answer) => return Ok(answer),
                Err(Failure::InvalidToken) if !refreshed => {
                    refreshed = true;
                    self.invalidate(&token).await;
                }
                Err(Failure::InvalidToken) => return Err(token_refused()),
                Err(Failure::Error(error)) => return Err(error),
            }
        }
    }

    /// What an answer means: its JSON when the call succeeded, else why not.
    async fn judge(&self, response: reqwest::Response, token: &str) -> Result<Value, Failure> {
        let status = response.status();
        let headers = response.headers().clone();
        let body = read_capped(response, ERROR_BODY_LIMIT)
            .await
            .map_err(|e| self.transport(e, token))?;
        let value: Option<Value> = serde_json::from_slice(&body).ok();
        let answer = value
            .as_ref()
            .and_then(|v| Answer::deserialize(v).ok())
            .filter(|_| value.as_ref().is_some_and(|v| v.get("code").is_some()));
        if let Some(answer) = &answer {
            if INVALID_TOKEN.contains(&answer.code) {
                return Err(Failure::InvalidToken);
            }
            if RATE_LIMITED.contains(&answer.code) {
                return Err(ChannelError::RateLimited {
                    retry_after: retry_after(&headers),
                }
                .into());
            }
        }
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(ChannelError::RateLimited {
                retry_after: retry_after(&headers),
            }
            .into());
        }
        match (answer, value) {
            (Some(Answer { code: 0, .. }), Some(value)) if status.is_success() => Ok(value),
            (Some(Answer { code, msg }), _) if code != 0 => {
                let text = format!("Feishu answered {code}: {}", self.mask(&msg, token));
                Err(if status.is_server_error() {
                    ChannelError::Transient(text)
                } else {
                    ChannelError::Permanent(text)
                }
                .into())
            }
            _ if status.is_server_error() => {
                Err(ChannelError::Transient(format!("Feishu answered HTTP {status}")).into())
            }
            _ if status.is_success() => Err(ChannelError::Transient(format!(
                "Feishu answered HTTP {status} with something that is not its JSON"
            ))
            .into()),
            _ => Err(ChannelError::Permanent(format!("Feishu answered HTTP {status}")).into()),
        }
    }

    /// `text` with the app secret and `token` masked.
    fn mask(&self, text: &str, token: &str) -> String {
        antler_channel::mask_secrets(text, &[self.app_secret.as_str(), token])
    }

    fn transport(&self, error: reqwest::Error, token: &str) -> ChannelError {
        // Without the URL: it names message and file ids, and nothing more is needed to retry.
        let error = error.without_url();
        ChannelError::Transient(self.mask(&format!("calling Feishu failed: {error}"), token))
    }
}

/// The body of a reply (`im/v1/messages/{id}/reply`).
pub(crate) fn reply_body(msg_type: &str, content: &str, uuid: &str) -> Value {
    json!({
        "msg_type": msg_type,
        "content": content,
        "reply_in_thread": false,
        "uuid": uuid,
    })
}

/// The body of a message to a chat (`im/v1/messages?receive_id_type=chat_id`).
pub(crate) fn send_body(chat_id: &str, msg_type: &str, content: &str, uuid: &str) -> Value {
    json!({
        "receive_id": chat_id,
        "msg_type": msg_type,
        "content": content,
        "uuid": uuid,
    })
}

fn token_refused() -> ChannelError {
    ChannelError::Permanent(
        "Feishu refused a freshly issued tenant token (channels.feishu.app_id, app_secret)"
            .to_owned(),
    )
}

/// The `data.message_id` of a send or reply.
fn message_id_of(answer: &Value) -> Result<String, ChannelError> {
    answer
        .pointer("/data/message_id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| ChannelError::Permanent("Feishu's answer names no message_id".to_owned()))
}

/// An id as one URL path segment. Feishu's ids are `om_…`, `img_v3_…`, `file_v3_…`; anything
/// else (a `/`, a `..`, even percent-encoded) could change the path, so it is refused.
fn path_segment(id: &str) -> Result<&str, ChannelError> {
    if !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
    {
        Ok(id)
    } else {
        Err(ChannelError::Permanent(format!("not a Feishu id: {id:?}")))
    }
}

/// At most `limit` bytes of a body (the rest is not read).
async fn read_capped(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = limit.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= limit {
            break;
        }
    }
    Ok(body)
}

/// The delay a rate limit asks for: `x-ogw-ratelimit-reset`, in seconds.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Duration {
    antler_channel::header_secs(headers, "x-ogw-ratelimit-reset")
        .map_or(DEFAULT_RETRY_AFTER, |wait| wait.max(Duration::from_secs(1)))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use wiremock::matchers::{body_json, header, method, path, query_param};
    use wiremock::{Mock, MockServer, Request, ResponseTemplate};

    use super::*;

    const SECRET: &str = "app-SECRET-0001";
    const TOKEN: &str = "t-TOKENvalue0001";

    /// A clock the tests move by hand.
    static NOW_MS: AtomicU64 = AtomicU64::new(1_767_225_600_000);

    fn now_ms() -> u64 {
        NOW_MS.load(Ordering::SeqCst)
    }

    fn fixed_ms() -> u64 {
        1_767_225_600_000
    }

    fn api(server: &MockServer) -> FeishuApi {
        FeishuApi::new("cli_app", SECRET, &server.uri(), fixed_ms).unwrap()
    }

    fn ok(data: Value) -> ResponseTemplate {
        ResponseTemplate::new(200).set_body_json(json!({"code": 0, "msg": "success", "data": data}))
    }

    async fn token_endpoint(server: &MockServer, tokens: &'static [&'static str]) {
        let calls = AtomicU64::new(0);
        Mock::given(method("POST"))
            .and(path("/open-apis/auth/v3/tenant_access_token/internal"))
            .and(body_json(
                json!({"app_id": "cli_app", "app_secret": SECRET}),
            ))
            .respond_with(move |_: &Request| {
                let n = calls.fetch_add(1, Ordering::SeqCst) as usize;
                ResponseTemplate::new(200).set_body_json(json!({
                    "code": 0, "msg": "ok",
                    "tenant_access_token": tokens[n.min(tokens.len() - 1)], "expire": 7200
                }))
            })
            .mount(server)
            .await;
    }

    async fn token_requests(server: &MockServer) -> usize {
        server
            .received_requests()
            .await
            .unwrap()
            .iter()
            .filter(|r| r.url.path().ends_with("tenant_access_token/internal"))
            .count()
    }

    #[tokio::test]
    async fn the_token_is_fetched_once_and_shared() {
        let server = MockServer::start().await;
        token_endpoint(&server, &[TOKEN]).await;
        Mock::given(method("PATCH"))
            .and(path("/open-apis/im/v1/messages/om_1"))
            .and(header("authorization", format!("Bearer {TOKEN}").as_str()))
            .respond_with(ok(json!({})))
            .expect(4)
            .mount(&server)
            .await;
        let api = api(&server);
        let (a, b) = tokio::join!(api.update_card("om_1", "{}"), api.update_card("om_1", "{}"));
        a.unwrap();
        b.unwrap();
        api.update_card("om_1", "{}").await.unwrap();
        api.update_card("om_1", "{}").await.unwrap();
        assert_eq!(api.tenant_token().await.unwrap(), TOKEN);
        assert_eq!(token_requests(&server).await, 1);
        server.verify().await;
    }

    #[tokio::test]
    async fn the_token_is_renewed_when_30_minutes_remain() {
        let server = MockServer::start().await;
        token_endpoint(&server, &["t-first", "t-second"]).await;
        let api = FeishuApi::new("cli_app", SECRET, &server.uri(), now_ms).unwrap();
        assert_eq!(api.tenant_token().await.unwrap(), "t-first");
        NOW_MS.fetch_add(89 * 60 * 1000, Ordering::SeqCst);
        assert_eq!(api.tenant_token().await.unwrap(), "t-first");
        NOW_MS.fetch_add(2 * 60 * 1000, Ordering::SeqCst);
        assert_eq!(api.tenant_token().await.unwrap(), "t-second");
        assert_eq!(token_requests(&server).await, 2);
    }

    #[tokio::test]
    async fn an_invalid_token_is_replaced_and_the_call_retried_once() {
        let server = MockServer::start().await;
        token_endpoint(&server, &["t-stale", "t-fresh", "t-third"]).await;
        Mock::given(method("PATCH"))
            .and(path("/open-apis/im/v1/messages/om_1"))
            .and(header("authorization", "Bearer t-stale"))
            .respond_with(ResponseTemplate::new(400).set_body_json(
                json!({"code": 99991663, "msg": "Invalid access token for authorization."}),
            ))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("PATCH"))
            .and(path("/open-apis/im/v1/messages/om_1"))
            .and(header("authorization", "Bearer t-fresh"))
            .respond_with(ok(json!({})))
            .expect(1)
            .mount(&server)
            .await;
        let api = api(&server);
        api.update_card("om_1", "{}").await.unwrap();
        assert_eq!(token_requests(&server).await, 2);
        server.verify().await;

        // A token refused even when new: one retry, then a permanent error.
        let server = MockServer::start().await;
        token_endpoint(&server, &["t-a", "t-b", "t-c"]).await;
        Mock::given(method("PATCH"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"code": 99991668, "msg": "token expired"})),
            )
            .expect(2)
            .mount(&server)
            .await;
        let error = api_for(&server)
            .update_card("om_1", "{}")
            .await
            .unwrap_err();
        assert!(matches!(error, ChannelError::Permanent(_)), "{error:?}");
        server.verify().await;
    }

    fn api_for(server: &MockServer) -> FeishuApi {
        api(server)
    }

    #[tokio::test]
    async fn replies_and_chat_messages_return_the_new_message_id() {
        let server = MockServer::start().await;
        token_endpoint(&server, &[TOKEN]).await;
        Mock::given(method("POST"))
            .and(path("/open-apis/im/v1/messages/om_user/reply"))
            .and(header("authorization", format!("Bearer {TOKEN}").as_str()))
            .and(body_json(json!({
                "msg_type": "text", "content": "{\"text\":\"hi\"}",
                "reply_in_thread": false, "uuid": "u-1"
            })))
            .respond_with(ok(json!({"message_id": "om_bot1"})))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/open-apis/im/v1/messages"))
            .and(query_param("receive_id_type", "chat_id"))
            .and(body_json(json!({
                "receive_id": "oc_1", "msg_type": "text", "content": "{\"text\":\"hi\"}",
                "uuid": "u-2"
            })))
            .respond_with(ok(json!({"message_id": "om_bot2"})))
            .expect(1)
            .mount(&server)
            .await;
        let api = api(&server);
        assert_eq!(
            api.reply("om_user", "text", "{\"text\":\"hi\"}", "u-1")
                .await
                .unwrap(),
            "om_bot1"
        );
        assert_eq!(
            api.send_to_chat("oc_1", "text", "{\"text\":\"hi\"}", "u-2")
                .await
                .unwrap(),
            "om_bot2"
        );
        server.verify().await;
    }

    #[tokio::test]
    async fn feishu_errors_keep_their_kind_and_never_a_secret() {
        let server = MockServer::start().await;
        token_endpoint(&server, &[TOKEN]).await;
        let answer = |id: &str, response: ResponseTemplate| {
            Mock::given(method("PATCH"))
                .and(path(format!("/open-apis/im/v1/messages/{id}")))
                .respond_with(response)
        };
        answer(
            "om_busy",
            ResponseTemplate::new(429)
                .insert_header("x-ogw-ratelimit-reset", "7")
                .set_body_json(json!({"code": 99991400, "msg": "request trigger frequency limit"})),
        )
        .mount(&server)
        .await;
        answer(
            "om_busy200",
            ResponseTemplate::new(200)
                .set_body_json(json!({"code": 99991400, "msg": "request trigger frequency limit"})),
        )
        .mount(&server)
        .await;
        answer(
            "om_chat_busy",
            ResponseTemplate::new(400).set_body_json(
                json!({"code": 230020, "msg": "This operation triggers the frequency limit."}),
            ),
        )
        .mount(&server)
        .await;
        answer(
            "om_gone",
            ResponseTemplate::new(400).set_body_json(json!({
                "code": 230011, "msg": format!("The message was withdrawn. {TOKEN} {SECRET}")
            })),
        )
        .mount(&server)
        .await;
        answer(
            "om_down",
            ResponseTemplate::new(503).set_body_string(format!("upstream {TOKEN} broke")),
        )
        .mount(&server)
        .await;
        answer(
            "om_odd",
            ResponseTemplate::new(200).set_body_string(format!("<html>{TOKEN}</html>")),
        )
        .mount(&server)
        .await;
        let api = api(&server);
        let patch = |id: &'static str| {
            let api = &api;
            async move { api.update_card(id, "{}").await.unwrap_err() }
        };
        assert_eq!(
            patch("om_busy").await,
            ChannelError::RateLimited {
                retry_after: Duration::from_secs(7)
            }
        );
        assert_eq!(
            patch("om_busy200").await,
            ChannelError::RateLimited {
                retry_after: DEFAULT_RETRY_AFTER
            }
        );
        // The per-chat (and per-message) limit comes as HTTP 400: still a rate limit.
        assert_eq!(
            patch("om_chat_busy").await,
            ChannelError::RateLimited {
                retry_after: DEFAULT_RETRY_AFTER
            }
        );
        let gone = patch("om_gone").await;
        assert_eq!(
            gone,
            ChannelError::Permanent(
                "Feishu answered 230011: The message was withdrawn. *** ***".into()
            )
        );
        let down = patch("om_down").await;
        assert!(
            matches!(&down, ChannelError::Transient(t) if t.contains("503")),
            "{down:?}"
        );
        let odd = patch("om_odd").await;
        assert!(matches!(odd, ChannelError::Transient(_)), "{odd:?}");

        // A closed port: the connection fails.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let closed = FeishuApi::new(
            "cli_app",
            SECRET,
            &format!("http://127.0.0.1:{port}"),
            fixed_ms,
        )
        .unwrap();
        let refused = closed.update_card("om_1", "{}").await.unwrap_err();
        assert!(matches!(refused, ChannelError::Transient(_)), "{refused:?}");

        for error in [gone, down, odd, refused] {
            let text = format!("{error} {error:?}");
            assert!(!text.contains(TOKEN) && !text.contains(SECRET), "{text}");
        }
        let debug = format!("{api:?}");
        assert!(!debug.contains(TOKEN) && !debug.contains(SECRET), "{debug}");
    }

    #[tokio::test]
    async fn the_socket_endpoint_is_asked_as_the_sdks_ask_and_judged_as_they_judge() {
        let server = MockServer::start().await;
        // The SDKs' request: `{"AppID", "AppSecret"}` and `locale: zh`.
        Mock::given(method("POST"))
            .and(path("/callback/ws/endpoint"))
            .and(header("locale", "zh"))
            .and(body_json(json!({"AppID": "cli_app", "AppSecret": SECRET})))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "code": 0, "msg": "ok",
                "data": {"URL": "wss://msg-frontier.example/ws/v2?device_id=1&service_id=2",
                         "ClientConfig": {"ReconnectCount": -1, "ReconnectInterval": 120,
                                          "ReconnectNonce": 30, "PingInterval": 90}}
            })))
            .mount(&server)
            .await;
        let endpoint = api(&server).socket_endpoint().await.unwrap();
        assert_eq!(endpoint.config.ping_interval, Duration::from_secs(90));
        assert_eq!(endpoint.config.reconnect_count, -1);
        assert!(endpoint.url.starts_with("wss://"));
        assert!(
            !format!("{endpoint:?}").contains("device_id"),
            "the URL stays out of logs"
        );

        // Codes 1 and 1000040343 are worth another attempt, HTTP errors too; any other code
        // is final, and the secret never shows.
        for (status, body, retry) in [
            (200, json!({"code": 1, "msg": "system busy"}), true),
            (200, json!({"code": 1_000_040_343, "msg": "internal"}), true),
            (503, json!({}), true),
            (
                200,
                json!({"code": 0, "msg": "ok", "data": {"URL": ""}}),
                true,
            ),
            (
                200,
                json!({"code": 1_000_040_350, "msg": "exceed conn limit"}),
                false,
            ),
            (
                200,
                json!({"code": 10003, "msg": format!("invalid app {SECRET}")}),
                false,
            ),
        ] {
            let server = MockServer::start().await;
            Mock::given(method("POST"))
                .and(path("/callback/ws/endpoint"))
                .respond_with(ResponseTemplate::new(status).set_body_json(body.clone()))
                .mount(&server)
                .await;
            let error = api(&server).socket_endpoint().await.unwrap_err();
            assert_eq!(error.is_retryable(), retry, "{body}: {error:?}");
            assert!(!format!("{error}").contains(SECRET), "{error}");
        }
    }

    #[tokio::test]
    async fn refused_credentials_name_the_settings_without_the_secret() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/open-apis/auth/v3/tenant_access_token/internal"))
            .respond_with(ResponseTemplate::new(200).set_body_json(
                json!({"code": 10014, "msg": format!("app secret invalid: {SECRET}")}),
            ))
            .mount(&server)
            .await;
        let error = api(&server).tenant_token().await.unwrap_err();
        let ChannelError::Permanent(text) = &error else {
            panic!("{error:?}")
        };
        assert!(
            text.contains("app_secret") && text.contains("10014"),
            "{text}"
        );
        assert!(!text.contains(SECRET), "{text}");
    }

    #[tokio::test]
    async fn bot_info_names_the_bot() {
        let server = MockServer::start().await;
        token_endpoint(&server, &[TOKEN]).await;
        Mock::given(method("GET"))
            .and(path("/open-apis/bot/v3/info"))
            .and(header("authorization", format!("Bearer {TOKEN}").as_str()))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "code": 0, "msg": "ok",
                "bot": {"activate_status": 2, "app_name": "OpsBot", "open_id": "ou_bot",
                        "avatar_url": "https://x.example/a.png", "ip_white_list": []}
            })))
            .mount(&server)
            .await;
        assert_eq!(
            api(&server).bot_info().await.unwrap(),
            FeishuIdentity {
                open_id: "ou_bot".into(),
                name: "OpsBot".into()
            }
        );
    }

    #[tokio::test]
    async fn resources_are_fetched_within_the_cap() {
        let server = MockServer::start().await;
        token_endpoint(&server, &[TOKEN]).await;
        Mock::given(method("GET"))
            .and(path("/open-apis/im/v1/messages/om_1/resources/file_v3_a"))
            .and(query_param("type", "file"))
            .and(header("authorization", format!("Bearer {TOKEN}").as_str()))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("content-type", "application/octet-stream")
                    .set_body_bytes(b"hello".to_vec()),
            )
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path(
                "/open-apis/im/v1/messages/om_1/resources/file_v3_gone",
            ))
            .respond_with(
                ResponseTemplate::new(400)
                    .set_body_json(json!({"code": 234003, "msg": "File not in msg."})),
            )
            .mount(&server)
            .await;
        let api = api(&server);
        assert_eq!(
            api.fetch_resource("om_1", "file_v3_a", "file", 5)
                .await
                .unwrap(),
            b"hello"
        );
        assert_eq!(
            api.fetch_resource("om_1", "file_v3_a", "file", 4)
                .await
                .unwrap_err(),
            ChannelError::TooLarge { limit: 4 }
        );
        assert_eq!(
            api.fetch_resource("om_1", "file_v3_gone", "file", 100)
                .await
                .unwrap_err(),
            ChannelError::Permanent("Feishu answered 234003: File not in msg.".into())
        );
    }

    #[tokio::test]
    async fn a_resource_without_a_declared_length_is_cut_off_while_reading() {
        // A server that declares no length, so only counting finds the size. It answers the
        // token request first, then the download.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let token = br#"{"code":0,"tenant_access_token":"t-x","expire":7200}"#;
            let answers = [
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                    token.len(),
                    String::from_utf8_lossy(token)
                ),
                "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close\r\n\r\n0123456789abcdef"
                    .to_owned(),
            ];
            for answer in answers {
                if let Ok((mut socket, _)) = listener.accept().await {
                    let mut request = [0u8; 4096];
                    let _ = socket.read(&mut request).await;
                    let _ = socket.write_all(answer.as_bytes()).await;
                }
            }
        });
        let api =
            FeishuApi::new("cli_app", SECRET, &format!("http://{address}"), fixed_ms).unwrap();
        assert_eq!(
            api.fetch_resource("om_1", "img_1", "image", 10)
                .await
                .unwrap_err(),
            ChannelError::TooLarge { limit: 10 }
        );
    }

    #[test]
    fn ids_cannot_change_the_path() {
        assert_eq!(path_segment("om_abc-1_2").unwrap(), "om_abc-1_2");
        for bad in ["..", "a/b", "%2e%2e", "x?y", ""] {
            assert!(path_segment(bad).is_err(), "{bad}");
        }
    }
}
