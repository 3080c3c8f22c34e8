//! The Discord HTTP API calls antler makes, over reqwest.
//!
//! serenity's `Http` client is not used for sending: with its rate limiter on it sleeps inside
//! the call (delivery could not record or reschedule the wait), and with it off a 429 comes
//! back without its `retry_after`. Here every 429 becomes [`ChannelError::RateLimited`] with
//! the delay Discord asked for (`retry_after` in the body, `Retry-After`,
//! `X-RateLimit-Reset-After`, whichever is longest), so delivery's retry waits exactly that;
//! a response that says a bucket is spent (`X-RateLimit-Remaining: 0`) holds further calls on
//! that route until it resets, without sending them. The bodies are serenity's models where
//! Discord answers with one (`Message`, `CurrentUser`, `Command`).
//!
//! Errors carry the HTTP status and Discord's error code, never a URL (interaction webhook
//! URLs hold the interaction token), a token or a response body.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use antler_channel::{Button, ButtonStyle, ChannelError};
use serde::Deserialize;
use tokio::time::Instant;

/// Where Discord's API is (`api_url`); the versioned API is under `/api/v10`.
pub const DEFAULT_API_URL: &str = "https://discord.com";

/// How long to wait after a 429 that names no delay.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest wait a 429 may ask for before it is taken as this long (a broken header must
/// not park delivery for a day).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// The most routes whose spent bucket is remembered.
const MAX_HELD_ROUTES: usize = 1024;

/// Discord's `User-Agent` rule: `DiscordBot ($url, $version)`.
const USER_AGENT: &str = concat!(
    "DiscordBot (https://example.invalid/antler, ",
    env!("CARGO_PKG_VERSION"),
    ")"
);

/// The bot as Discord knows it (`GET /users/@me`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscordIdentity {
    /// The bot user's id.
    pub id: String,
    /// Its username.
    pub name: String,
}

/// One application command as registered (`name`, `type`, `description`, `options`); the
/// comparison of [`DiscordApi::register_commands`] looks at these fields only.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CommandSpec {
    /// 1 to 32 lower-case characters for a slash command; a context-menu command's label.
    pub name: String,
    /// 1 slash command (`CHAT_INPUT`), 3 message context menu (`MESSAGE`).
    #[serde(rename = "type")]
    pub kind: u8,
    /// Shown under a slash command; empty for context-menu commands.
    pub description: String,
    /// A slash command's options.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<OptionSpec>,
}

/// An option of a slash command.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OptionSpec {
    /// Its name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// 3: a string.
    #[serde(rename = "type")]
    pub kind: u8,
    /// Whether the user must give it.
    pub required: bool,
}

/// What [`DiscordApi::register_commands`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// The registered list already matched; nothing was written.
    Unchanged,
    /// The list was replaced (`PUT`).
    Updated,
}

/// A Discord API client for one application and bot token.
pub struct DiscordApi {
    http: reqwest::Client,
    /// `…/api/v10`, without a trailing slash.
    base: String,
    application_id: String,
    bot_token: String,
    /// Routes whose bucket is spent, until when.
    held: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for DiscordApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscordApi")
            .field("base", &self.base)
            .field("application_id", &self.application_id)
            .field("bot_token", &"***")
            .finish_non_exhaustive()
    }
}

/// How a request authenticates: interaction webhook routes by the token in their path, the
/// rest with the bot token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    Bot,
    Webhook,
}

impl DiscordApi {
    /// A client at `api_url` (`https://discord.com` or a mock; plain http is allowed so tests
    /// can use one).
    pub fn new(api_url: &str, application_id: &str, bot_token: &str) -> Result<Self, ChannelError> {
        let url = reqwest::Url::parse(api_url.trim_end_matches('/')).map_err(|e| {
            ChannelError::Permanent(format!("channels.discord.api_url is not a URL: {e}"))
        })?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .user_agent(USER_AGENT)
            .build()
            .map_err(|e| ChannelError::Permanent(format!("no HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: format!("{}/api/v10", url.as_str().trim_end_matches('/')),
            application_id: application_id.to_owned(),
            bot_token: bot_token.to_owned(),
            held: Mutex::new(HashMap::new()),
        })
    }

    /// The application's id.
    pub fn application_id(&self) -> &str {
        &self.application_id
    }

    /// `PATCH /webhooks/{app}/{token}/messages/@original`: the deferred response's text, with
    /// `buttons` under it when there are any. Returns the message's id; `None` when Discord
    /// does not know the interaction's webhook (Unknown Webhook).
    pub async fn edit_original(
        &self,
        token: &str,
        content: &str,
        buttons: &[Button],
    ) -> Result<Option<String>, ChannelError> {
        self.webhook_message(token, "@original", content, buttons)
            .await
    }

    /// `PATCH /webhooks/{app}/{token}/messages/{id}`: a follow-up's text (and `buttons`, when
    /// there are any: none leaves the message's as they are); `None` when Discord does not
    /// know the interaction's webhook.
    pub async fn webhook_message(
        &self,
        token: &str,
        message_id: &str,
        content: &str,
        buttons: &[Button],
    ) -> Result<Option<String>, ChannelError> {
        let path = format!(
            "/webhooks/{}/{}/messages/{}",
            self.application_id,
            token_segment(token)?,
            segment(message_id)?
        );
        self.message(
            reqwest::Method::PATCH,
            &path,
            &format!("webhook:{token}"),
            Auth::Webhook,
            message_body(content, buttons),
        )
        .await
    }

    /// `POST /webhooks/{app}/{token}?wait=true`: a follow-up message, with `buttons` under
    /// it when there are any. Returns its id; `None` when Discord does not know the
    /// interaction's webhook.
    pub async fn follow_up(
        &self,
        token: &str,
        content: &str,
        buttons: &[Button],
    ) -> Result<Option<String>, ChannelError> {
        let path = format!(
            "/webhooks/{}/{}?wait=true",
            self.application_id,
            token_segment(token)?
        );
        self.message(
            reqwest::Method::POST,
            &path,
            &format!("webhook:{token}"),
            Auth::Webhook,
            message_body(content, buttons),
        )
        .await
    }

    /// `POST /channels/{channel}/messages` with the bot token: a message of the bot's own
    /// (after the interaction token expired), with `buttons` under it when there are any.
    /// Returns its id.
    pub async fn create_message(
        &self,
        channel_id: &str,
        content: &str,
        reply_to: Option<&str>,
        buttons: &[Button],
    ) -> Result<String, ChannelError> {
        let path = format!("/channels/{}/messages", segment(channel_id)?);
        let mut body = message_body(content, buttons);
        if let Some(reply_to) = reply_to {
            // A reply to the user's message; still sent if that message is gone.
            body["message_reference"] = serde_json::json!({
                "message_id": segment(reply_to)?,
                "fail_if_not_exists": false,
            });
        }
        let bytes = self
            .request(
                reqwest::Method::POST,
                &path,
                &format!("channel:{channel_id}"),
                Auth::Bot,
                Some(body),
            )
            .await
            .map_err(|failed| failed.error)?;
        Ok(message_id(&bytes))
    }

    /// `PATCH /channels/{channel}/messages/{id}` with the bot token.
    pub async fn edit_message(
        &self,
        channel_id: &str,
        message_id: &str,
        content: &str,
    ) -> Result<(), ChannelError> {
        let path = format!(
            "/channels/{}/messages/{}",
            segment(channel_id)?,
            segment(message_id)?
        );
        let _: serde_json::Value = self
            .call(
                reqwest::Method::PATCH,
                &path,
                &format!("channel:{channel_id}"),
                Auth::Bot,
                Some(message_body(content, &[])),
            )
            .await?;
        Ok(())
    }

    /// `POST /interactions/{id}/{token}/callback`: answers an interaction received over the
    /// Gateway with `response` (an interaction response: `{"type": 7, …}`, `{"type": 4, …}`),
    /// authenticated by the token in the path. Discord answers 204 No Content.
    pub async fn interaction_callback(
        &self,
        interaction_id: &str,
        token: &str,
        response: &serde_json::Value,
    ) -> Result<(), ChannelError> {
        let path = format!(
            "/interactions/{}/{}/callback",
            segment(interaction_id)?,
            token_segment(token)?
        );
        self.request(
            reqwest::Method::POST,
            &path,
            &format!("interaction:{interaction_id}"),
            Auth::Webhook,
            Some(response.clone()),
        )
        .await
        .map(drop)
        .map_err(|failed| failed.error)
    }

    /// `GET /users/@me`: who the bot token belongs to (`antler doctor`).
    pub async fn me(&self) -> Result<DiscordIdentity, ChannelError> {
        let me: serenity::model::user::CurrentUser = self
            .call(reqwest::Method::GET, "/users/@me", "me", Auth::Bot, None)
            .await?;
        Ok(DiscordIdentity {
            id: me.id.to_string(),
            name: me.name.clone(),
        })
    }

    /// Registers `commands` globally, or for one guild: reads the registered list first and
    /// replaces it (`PUT`, which also removes commands no longer listed) only when it differs.
    pub async fn register_commands(
        &self,
        guild: Option<&str>,
        commands: &[CommandSpec],
    ) -> Result<Registration, ChannelError> {
        let path = match guild {
            Some(guild) => format!(
                "/applications/{}/guilds/{}/commands",
                self.application_id,
                segment(guild)?
            ),
            None => format!("/applications/{}/commands", self.application_id),
        };
        let registered: Vec<serde_json::Value> = self
            .call(reqwest::Method::GET, &path, "commands", Auth::Bot, None)
            .await?;
        if same_commands(&registered, commands) {
            return Ok(Registration::Unchanged);
        }
        let body = serde_json::to_value(commands)
            .map_err(|e| ChannelError::Permanent(format!("cannot write the commands: {e}")))?;
        let _: serde_json::Value = self
            .call(
                reqwest::Method::PUT,
                &path,
                "commands",
                Auth::Bot,
                Some(body),
            )
            .await?;
        Ok(Registration::Updated)
    }

    /// One request whose answer is JSON of type `T`: see [`DiscordApi::request`].
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        route: &str,
        auth: Auth,
        body: Option<serde_json::Value>,
    ) -> Result<T, ChannelError> {
        let bytes = self
            .request(method, path, route, auth, body)
            .await
            .map_err(|failed| failed.error)?;
        let bytes = if bytes.is_empty() {
            &b"null"[..]
        } else {
            &bytes[..]
        };
        serde_json::from_slice(bytes).map_err(|e| {
            ChannelError::Permanent(format!("Discord's answer is not what it documents: {e}"))
        })
    }

    /// One request that creates or edits a message. A 2xx is a delivered message whatever its
    /// body holds: only the message's id is read, and an answer without one (a field antler
    /// expected is missing, the body is not JSON) still counts as sent, with an empty id,
    /// rather than having the part sent again or the rest of the answer dropped. `Ok(None)`:
    /// Discord does not know the interaction's webhook (404, code 10015 Unknown Webhook).
    async fn message(
        &self,
        method: reqwest::Method,
        path: &str,
        route: &str,
        auth: Auth,
        body: serde_json::Value,
    ) -> Result<Option<String>, ChannelError> {
        match self.request(method, path, route, auth, Some(body)).await {
            Ok(bytes) => Ok(Some(message_id(&bytes))),
            Err(Failed {
                code: Some(UNKNOWN_WEBHOOK),
                ..
            }) if auth == Auth::Webhook => Ok(None),
            Err(failed) => Err(failed.error),
        }
    }

    /// One request: held while its route's bucket is spent, its answer's rate-limit headers
    /// remembered, its failure mapped to a [`ChannelError`] (with Discord's JSON error code).
    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        route: &str,
        auth: Auth,
        body: Option<serde_json::Value>,
    ) -> Result<Vec<u8>, Failed> {
        // Interaction webhooks have a bucket per token; the map of held routes is bounded.
        if let Some(wait) = self.held_for(route) {
            return Err(ChannelError::RateLimited { retry_after: wait }.into());
        }
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if auth == Auth::Bot {
            request = request.header(
                reqwest::header::AUTHORIZATION,
                format!("Bot {}", self.bot_token),
            );
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        // reqwest's errors name the URL, which may hold an interaction token.
        let response = request.send().await.map_err(|e| {
            ChannelError::Transient(format!("Discord is unreachable: {}", e.without_url()))
        })?;
        let status = response.status();
        let headers = response.headers().clone();
        self.remember_bucket(route, &headers);
        let bytes = response.bytes().await.map_err(|e| {
            ChannelError::Transient(format!("Discord's answer broke off: {}", e.without_url()))
        })?;
        if status.is_success() {
            return Ok(bytes.to_vec());
        }
        let code = serde_json::from_slice::<ErrorBody>(&bytes)
            .ok()
            .and_then(|error| error.code);
        Err(Failed {
            error: failure(status, &headers, &bytes),
            code,
        })
    }

    /// How long `route` is still held, if it is.
    fn held_for(&self, route: &str) -> Option<Duration> {
        let mut held = self.held.lock().ok()?;
        let now = Instant::now();
        match held.get(route) {
            Some(until) if *until > now => Some(*until - now),
            Some(_) => {
                held.remove(route);
                None
            }
            None => None,
        }
    }

    /// Holds `route` until its bucket resets when the answer says it is spent.
    fn remember_bucket(&self, route: &str, headers: &reqwest::header::HeaderMap) {
        let spent = header(headers, "x-ratelimit-remaining").is_some_and(|left| left.trim() == "0");
        let Some(reset) = spent
            .then(|| seconds(headers, "x-ratelimit-reset-after"))
            .flatten()
        else {
            return;
        };
        let Ok(mut held) = self.held.lock() else {
            return;
        };
        let now = Instant::now();
        if held.len() >= MAX_HELD_ROUTES {
            held.retain(|_, until| *until > now);
            if held.len() >= MAX_HELD_ROUTES {
                return;
            }
        }
        held.insert(route.to_owned(), now + reset);
    }
}

/// Discord's JSON error code for an interaction webhook it does not know (the token expired
/// or the interaction is gone).
const UNKNOWN_WEBHOOK: u64 = 10015;

/// A request that failed: what it means to the caller, and Discord's JSON error code.
#[derive(Debug)]
struct Failed {
    error: ChannelError,
    code: Option<u64>,
}

impl From<ChannelError> for Failed {
    fn from(error: ChannelError) -> Self {
        Self { error, code: None }
    }
}

/// The `id` of the message a 2xx answer describes; empty when it names none (logged: the
/// message was still sent).
fn message_id(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Sent {
        id: Option<serde_json::Value>,
    }
    let id = serde_json::from_slice::<Sent>(body)
        .ok()
        .and_then(|sent| sent.id)
        .and_then(|id| match id {
            serde_json::Value::String(id) => Some(id),
            serde_json::Value::Number(id) => Some(id.to_string()),
            _ => None,
        })
        .filter(|id| segment(id).is_ok());
    id.unwrap_or_else(|| {
        tracing::warn!(
            "Discord accepted a message but its answer names no message id; it counts as sent"
        );
        String::new()
    })
}

/// A message body: the text, with no mention allowed to ping anyone (a model's answer must not
/// notify `@everyone`), and `buttons` as its components when there are any.
fn message_body(content: &str, buttons: &[Button]) -> serde_json::Value {
    let mut body = serde_json::json!({
        "content": content,
        "allowed_mentions": {"parse": []},
    });
    if !buttons.is_empty() {
        body["components"] = components(buttons);
    }
    body
}

/// The most buttons in one action row ("An Action Row can contain up to 5 Buttons").
const BUTTONS_PER_ROW: usize = 5;

/// The most action rows on a message.
const MAX_ROWS: usize = 5;

/// The longest button label, in characters ("label: Text that appears on the button; max 80
/// characters").
const MAX_LABEL_CHARS: usize = 80;

/// The longest `custom_id`, in characters ("a developer-defined identifier for the component;
/// max 100 characters").
const MAX_CUSTOM_ID_CHARS: usize = 100;

/// `buttons` as message components: action rows (type 1) of at most 5 buttons (type 2),
/// each with its action as `custom_id`; Primary is Success (style 3, green), Danger is Danger
/// (style 4, red). A button whose action Discord would refuse is left out (logged), so the
/// message still goes.
pub(crate) fn components(buttons: &[Button]) -> serde_json::Value {
    let buttons: Vec<serde_json::Value> = buttons
        .iter()
        .filter(|button| {
            let fits =
                !button.action.is_empty() && button.action.chars().count() <= MAX_CUSTOM_ID_CHARS;
            if !fits {
                tracing::warn!("a button's action does not fit Discord's custom_id; left out");
            }
            fits
        })
        .map(|button| {
            serde_json::json!({
                "type": 2,
                "style": match button.style {
                    ButtonStyle::Primary => 3,
                    ButtonStyle::Danger => 4,
                },
                "label": button.label.chars().take(MAX_LABEL_CHARS).collect::<String>(),
                "custom_id": button.action,
            })
        })
        .collect();
    buttons
        .chunks(BUTTONS_PER_ROW)
        .take(MAX_ROWS)
        .map(|row| serde_json::json!({"type": 1, "components": row}))
        .collect()
}

/// An id as a path segment: digits only (snowflakes) or `@original`, so nothing from a
/// conversation key can change the route.
/// An interaction token as a path segment: Discord's tokens are URL-safe characters; anything
/// else (a `/`, a `?`) could change the request's target, so it is refused, without echoing it.
fn token_segment(token: &str) -> Result<&str, ChannelError> {
    let safe = !token.is_empty()
        && token.len() <= 1024
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if safe {
        Ok(token)
    } else {
        Err(ChannelError::Permanent(
            "the interaction token is not a URL-safe string".to_owned(),
        ))
    }
}

fn segment(id: &str) -> Result<&str, ChannelError> {
    if id == "@original"
        || (!id.is_empty() && id.len() <= 24 && id.bytes().all(|b| b.is_ascii_digit()))
    {
        Ok(id)
    } else {
        Err(ChannelError::Permanent(format!("not a Discord id: {id:?}")))
    }
}

/// Whether the registered commands are `wanted`, by the fields antler sets.
fn same_commands(registered: &[serde_json::Value], wanted: &[CommandSpec]) -> bool {
    if registered.len() != wanted.len() {
        return false;
    }
    let key = |name: &str, kind: u64| (name.to_owned(), kind);
    let mut by_name: HashMap<(String, u64), &serde_json::Value> = HashMap::new();
    for command in registered {
        let name = command
            .get("name")
            .and_then(|n| n.as_str())
            .unwrap_or_default();
        let kind = command
            .get("type")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(1);
        by_name.insert(key(name, kind), command);
    }
    wanted.iter().all(|spec| {
        let Some(found) = by_name.get(&key(&spec.name, u64::from(spec.kind))) else {
            return false;
        };
        let description = found
            .get("description")
            .and_then(|d| d.as_str())
            .unwrap_or_default();
        let options = found
            .get("options")
            .and_then(|o| o.as_array())
            .map(Vec::as_slice)
            .unwrap_or_default();
        description == spec.description
            && options.len() == spec.options.len()
            && options.iter().zip(&spec.options).all(|(have, want)| {
                have.get("name").and_then(|n| n.as_str()) == Some(want.name.as_str())
                    && have.get("description").and_then(|d| d.as_str())
                        == Some(want.description.as_str())
                    && have.get("type").and_then(serde_json::Value::as_u64)
                        == Some(u64::from(want.kind))
                    && have
                        .get("required")
                        .and_then(serde_json::Value::as_bool)
                        .unwrap_or(false)
                        == want.required
            })
    })
}

/// Discord's error body (`{"message", "code", "retry_after", "global"}`).
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    code: Option<u64>,
    #[serde(default)]
    retry_after: Option<f64>,
    #[serde(default)]
    global: Option<bool>,
}

/// A failed answer as a [`ChannelError`]: 429 the longest delay it names, 5xx transient, any
/// other status permanent (with Discord's error code, not its message, which may quote input).
fn failure(
    status: reqwest::StatusCode,
    headers: &reqwest::header::HeaderMap,
    body: &[u8],
) -> ChannelError {
    let error: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        let global = error.global.unwrap_or(false)
            || header(headers, "x-ratelimit-global").is_some_and(|g| g.trim() == "true")
            || header(headers, "x-ratelimit-scope") == Some("global");
        let retry_after = [
            error.retry_after.and_then(duration_from_secs),
            seconds(headers, "retry-after"),
            // A route's reset also applies; a global limit's is the body's.
            (!global)
                .then(|| seconds(headers, "x-ratelimit-reset-after"))
                .flatten(),
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(DEFAULT_RETRY_AFTER)
        .min(MAX_RETRY_AFTER);
        tracing::debug!(global, ?retry_after, "Discord rate limit");
        return ChannelError::RateLimited { retry_after };
    }
    let code = error
        .code
        .map(|code| format!(" (Discord code {code})"))
        .unwrap_or_default();
    let text = format!("Discord answered {status}{code}");
    if status.is_server_error() || status == reqwest::StatusCode::REQUEST_TIMEOUT {
        ChannelError::Transient(text)
    } else {
        ChannelError::Permanent(text)
    }
}

fn header<'a>(headers: &'a reqwest::header::HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A header of (possibly fractional) seconds.
fn seconds(headers: &reqwest::header::HeaderMap, name: &str) -> Option<Duration> {
    header(headers, name)
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(duration_from_secs)
}

fn duration_from_secs(secs: f64) -> Option<Duration> {
    (secs.is_finite() && secs >= 0.0)
        .then(|| Duration::try_from_secs_f64(secs.min(MAX_RETRY_AFTER.as_secs_f64())).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> reqwest::header::HeaderMap {
        let mut map = reqwest::header::HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_429_waits_the_longest_delay_it_names() {
        let body = br#"{"message":"You are being rate limited.","retry_after":1.5,"global":false}"#;
        let error = failure(
            reqwest::StatusCode::TOO_MANY_REQUESTS,
            &headers(&[("retry-after", "1"), ("x-ratelimit-reset-after", "2.25")]),
            body,
        );
        assert_eq!(
            error,
            ChannelError::RateLimited {
                retry_after: Duration::from_millis(2250)
            }
        );
        // A global limit waits what the body says, not a route's reset.
        let global = br#"{"message":"x","retry_after":0.75,"global":true}"#;
        let error = failure(
            reqwest::StatusCode::TOO_MANY_REQUESTS,
            &headers(&[
                ("x-ratelimit-global", "true"),
                ("x-ratelimit-reset-after", "9"),
            ]),
            global,
        );
        assert_eq!(
            error,
            ChannelError::RateLimited {
                retry_after: Duration::from_millis(750)
            }
        );
        // Nothing named: a second; absurd: capped.
        assert_eq!(
            failure(reqwest::StatusCode::TOO_MANY_REQUESTS, &headers(&[]), b""),
            ChannelError::RateLimited {
                retry_after: DEFAULT_RETRY_AFTER
            }
        );
        assert_eq!(
            failure(
                reqwest::StatusCode::TOO_MANY_REQUESTS,
                &headers(&[]),
                br#"{"retry_after": 1e12}"#
            ),
            ChannelError::RateLimited {
                retry_after: MAX_RETRY_AFTER
            }
        );
    }

    #[test]
    fn other_failures_are_transient_or_permanent_and_quote_nothing() {
        let body = br#"{"message":"Unknown Webhook secret-ish","code":10015}"#;
        let error = failure(reqwest::StatusCode::NOT_FOUND, &headers(&[]), body);
        assert!(
            matches!(&error, ChannelError::Permanent(text) if text.contains("10015") && !text.contains("secret"))
        );
        assert!(matches!(
            failure(reqwest::StatusCode::BAD_GATEWAY, &headers(&[]), b"<html>"),
            ChannelError::Transient(_)
        ));
    }

    #[test]
    fn ids_in_paths_are_digits_or_original() {
        assert_eq!(segment("1100000000000000050"), Ok("1100000000000000050"));
        assert_eq!(segment("@original"), Ok("@original"));
        for bad in ["", "../x", "12/34", "abc"] {
            assert!(segment(bad).is_err(), "{bad}");
        }
        assert_eq!(
            token_segment("aW50ZXJh-Y3Rpb24_.x"),
            Ok("aW50ZXJh-Y3Rpb24_.x")
        );
        for bad in ["", "a/b", "a?wait=false", "a b", "..%2f"] {
            let refused = token_segment(bad).unwrap_err().to_string();
            // The token is a credential: the error never repeats it.
            assert!(bad.is_empty() || !refused.contains(bad), "{refused}");
        }
    }
}
