//! The HTTP API channel: antler's own channel, for `antler chat`, scripts and tests.
//!
//! `POST /api/v1/messages` accepts `{conversation, user?, text, message_id?, attachments?}`
//! (`user` defaults to the token's user, or `operator`) and answers 202
//! with the thread id once the message is durable (202 with `"dropped": true` and nothing
//! stored when its user is not in `channels.api.allowed_users` and was already told so within
//! the hour); the same `message_id` again is recognised
//! and answered with the same thread, nothing stored twice. `"stream": true` answers with an
//! SSE stream instead (`accepted`, then the answer's `delta`s and its `final`), `"wait": true`
//! with the answer itself; both also work for a resent `message_id`, whose answer is given as
//! soon as it exists. Replies are delivered through the outbox like any platform's: delivery
//! publishes them to the thread's SSE subscribers.
//!
//! Requests pass [`super::guard::api_guard`] first, which names the [`Principal`]: an admin
//! names any conversation and any `user`; a user's token reaches only that user's
//! conversations (stored under `api:<user>/<conversation>`) and always acts as that user.
//! Only an admin token makes the author an admin (`UserRef::admin`); a token-less API never
//! does, since anyone on the host can reach it.
//!
//! Attachments come inline, `{name, media_type?, data_base64}`, and are checked before anything
//! is stored: at most [`MAX_ATTACHMENTS`], each standard base64 within
//! `agent.max_attachment_bytes` once decoded, each with a name that stays usable once made
//! safe. The event carries them as [`AttachmentSource::Inline`]; the turn writes them to the
//! thread's `uploads` folder.
//!
//! Files the agent presents (`present_files`) come back as `attachments`, `[{name,
//! media_type, size, url}]`: on the `final` SSE event, in the `"wait": true` answer, and on the
//! answer message in `GET /api/v1/threads/{id}`. `GET /api/v1/threads/{id}/files/{name}`
//! downloads one (the same access rule as the thread; only files under the thread's
//! `outputs` folder, checked as `present_files` checks them; `Content-Disposition:
//! attachment` with a safe file name).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use antler_channel::{
    AttachmentRef, AttachmentSource, Channel, ChannelError, FileContent, InboundEvent,
    OutboundFile, OutboundMessage, Parsed, Part, Receipt, UserRef, WebhookRequest,
};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::Stream;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, broadcast};
use tokio_util::sync::CancellationToken;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiPath;
use super::guard::{ApiAuth, Principal};
use crate::agent::input::ThreadFolders;
use crate::agent::message::ChatMessage;
use crate::agent::middleware::thread_data::PresentedFiles;
use crate::agent::thread::ThreadState;
use crate::agent::tools::paths::{Area, PathAccess};
use crate::agent::tools::present_files::{media_type, open_presented};
use crate::events::{EventHub, FileLink, Subscription, ThreadEvent};
use crate::ingress::IngressError;
use crate::ingress::attachments::{
    InlineError, MAX_ATTACHMENTS, clean_media_type, decode_inline, safe_file_name,
};
use crate::units::human_size;

const MAX_ID_CHARS: usize = 256;
/// Who a message is from when an admin (or a token-less setup) does not say.
const DEFAULT_USER: &str = "operator";

mod messages;
mod threads;

pub(crate) use messages::post_message;
#[cfg(test)]
use threads::ascii_file_name;
pub(crate) use threads::{file_response, get_file, get_thread, thread_events};

/// The API channel.
#[derive(Debug)]
pub(crate) struct ApiChannel {
    auth: ApiAuth,
    hub: EventHub,
    /// `agent.max_attachment_bytes`
    max_attachment_bytes: u64,
}

/// The body of `POST /api/v1/messages`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostMessage {
    conversation: String,
    #[serde(default)]
    user: Option<String>,
    /// May be empty (or left out) when files are sent.
    #[serde(default)]
    text: String,
    #[serde(default)]
    message_id: Option<String>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    wait: bool,
    #[serde(default)]
    attachments: Vec<PostAttachment>,
}

/// A file sent with `POST /api/v1/messages`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostAttachment {
    name: String,
    #[serde(default)]
    media_type: Option<String>,
    /// Standard base64 (RFC 4648, padded, no line breaks).
    data_base64: String,
}

/// Why a message body was refused.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// Not what the API takes (400). The message names the field.
    #[error("{0}")]
    Malformed(String),
    /// A file over `agent.max_attachment_bytes` (413).
    #[error("{message}")]
    TooLarge { message: String, limit: u64 },
}

impl From<Refusal> for ChannelError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Malformed(message) => Self::Malformed(message),
            Refusal::TooLarge { limit, .. } => Self::TooLarge { limit },
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Malformed(message) => {
                Self::BadRequest(ChannelError::Malformed(message).to_string())
            }
            Refusal::TooLarge { message, .. } => Self::FileTooLarge(message),
        }
    }
}

/// Whether the request's author is an admin: it came with an admin token. A token-less API
/// (loopback only) treats every caller as an admin principal for reaching conversations, but
/// never makes the author an admin, as [`ApiAuth::is_admin`] does not.
fn acts_as_admin(auth: &ApiAuth, principal: &Principal) -> bool {
    !auth.is_open() && principal.user.is_none()
}

fn check_id(field: &str, value: &str) -> Result<(), Refusal> {
    if value.trim().is_empty() {
        return Err(Refusal::Malformed(format!("`{field}` must not be empty")));
    }
    if value.chars().count() > MAX_ID_CHARS || value.chars().any(char::is_control) {
        return Err(Refusal::Malformed(format!(
            "`{field}` must be at most {MAX_ID_CHARS} printable characters"
        )));
    }
    Ok(())
}

/// The files of a message as the event carries them, each checked: its name, its media type,
/// its data (standard base64, within `max_bytes` decoded). Nothing is kept of the decoded
/// bytes; the turn decodes them again.
fn read_attachments(
    files: Vec<PostAttachment>,
    max_bytes: u64,
) -> Result<Vec<AttachmentRef>, Refusal> {
    if files.len() > MAX_ATTACHMENTS {
        return Err(Refusal::Malformed(format!(
            "`attachments` has {} files; at most {MAX_ATTACHMENTS} are accepted",
            files.len()
        )));
    }
    let mut refs = Vec::with_capacity(files.len());
    for (index, file) in files.into_iter().enumerate() {
        let field = format!("attachments[{index}]");
        if file.name.trim().is_empty() {
            return Err(Refusal::Malformed(format!(
                "`{field}.name` must not be empty"
            )));
        }
        let Some(name) = safe_file_name(&file.name) else {
            return Err(Refusal::Malformed(format!(
                "`{field}.name` must name a file: nothing is left once path separators, \
                 control characters and leading dots are removed"
            )));
        };
        let media_type = match file.media_type.as_deref() {
            None => None,
            Some(given) => Some(clean_media_type(Some(given)).ok_or_else(|| {
                Refusal::Malformed(format!(
                    "`{field}.media_type` must be a media type such as `image/png` \
                     (printable ASCII, at most 127 characters)"
                ))
            })?),
        };
        let size = match decode_inline(&file.data_base64, max_bytes) {
            Ok(bytes) => u64::try_from(bytes.len()).unwrap_or(u64::MAX),
            Err(InlineError::NotBase64) => {
                return Err(Refusal::Malformed(format!(
                    "`{field}.data_base64` is not valid standard base64 \
                     (RFC 4648 alphabet with `=` padding, no line breaks)"
                )));
            }
            Err(InlineError::TooLarge { size, limit }) => {
                return Err(Refusal::TooLarge {
                    message: format!(
                        "`{field}` (`{name}`) is {}; files may be at most {} \
                         (agent.max_attachment_bytes)",
                        human_size(size),
                        human_size(limit)
                    ),
                    limit,
                });
            }
        };
        refs.push(AttachmentRef {
            name,
            media_type,
            size: Some(size),
            source: AttachmentSource::Inline {
                data_base64: file.data_base64,
            },
        });
    }
    Ok(refs)
}

impl ApiChannel {
    pub(crate) fn new(auth: ApiAuth, hub: EventHub, max_attachment_bytes: u64) -> Self {
        Self {
            auth,
            hub,
            max_attachment_bytes,
        }
    }

    /// The message in `body` and the event it becomes; `admin` makes its author an admin.
    fn read(
        body: &[u8],
        principal: &Principal,
        admin: bool,
        max_attachment_bytes: u64,
    ) -> Result<(PostMessage, InboundEvent), Refusal> {
        let mut message: PostMessage = serde_json::from_slice(body)
            .map_err(|e| Refusal::Malformed(format!("invalid JSON body: {e}")))?;
        check_id("conversation", &message.conversation)?;
        let user = match (&principal.user, &message.user) {
            (None, Some(user)) => user.clone(),
            (None, None) => DEFAULT_USER.to_owned(),
            (Some(own), Some(user)) if own != user => {
                return Err(Refusal::Malformed(format!(
                    "`user` must be this token's user ({own}) or left out"
                )));
            }
            (Some(own), _) => own.clone(),
        };
        check_id("user", &user)?;
        if let Some(id) = &message.message_id {
            check_id("message_id", id)?;
        }
        let attachments = read_attachments(
            std::mem::take(&mut message.attachments),
            max_attachment_bytes,
        )?;
        // A file with no words is a message; no words and no file is not.
        if message.text.trim().is_empty() && attachments.is_empty() {
            return Err(Refusal::Malformed(
                "`text` must not be empty (unless `attachments` are sent)".to_owned(),
            ));
        }
        let message_id = message
            .message_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
        let event = InboundEvent {
            channel: "api".to_owned(),
            event_id: message_id.clone(),
            conversation: principal.conversation_key(&message.conversation),
            user: UserRef {
                id: user,
                name: None,
                admin,
                aliases: Vec::new(),
            },
            text: message.text.clone(),
            reply_to: Some(message_id),
            received_at_ms: crate::now_ms(),
            attachments,
            group: false,
            chat: None,
            refused: false,
            follow_up: false,
            unsupported: None,
            interactive: message.wait || message.stream,
            reply_context: None,
            media_group: None,
        };
        Ok((message, event))
    }
}

#[async_trait::async_trait]
impl Channel for ApiChannel {
    fn name(&self) -> &'static str {
        "api"
    }

    fn verify(&self, request: &WebhookRequest<'_>) -> Result<(), ChannelError> {
        self.auth
            .principal(request.headers)
            .map(|_| ())
            .ok_or(ChannelError::Unauthorized)
    }

    fn parse(&self, request: &WebhookRequest<'_>) -> Result<Parsed, ChannelError> {
        let principal = self
            .auth
            .principal(request.headers)
            .ok_or(ChannelError::Unauthorized)?;
        let admin = acts_as_admin(&self.auth, &principal);
        Self::read(request.body, &principal, admin, self.max_attachment_bytes)
            .map(|(_, event)| Parsed::Events(vec![event]))
            .map_err(ChannelError::from)
    }

    /// Publishes the reply, with links to its files, to the thread's subscribers; the thread
    /// already holds it. The API renders nothing, so part 0 is the whole reply: its text and
    /// then its prompts' texts (which say how to decide in words, as buttons cannot be shown
    /// here). The prompts' own parts publish nothing more.
    async fn send(
        &self,
        message: &OutboundMessage,
        part: Part<'_>,
    ) -> Result<Receipt, ChannelError> {
        if part.index > 0 {
            return Ok(Receipt {
                platform_message_id: format!("{}:{}", message.idempotency_key, part.index),
            });
        }
        let mut text = message.text.clone();
        for prompt in &message.prompts {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(&prompt.text);
        }
        self.hub.publish(
            &message.thread_id,
            ThreadEvent::Final {
                in_reply_to: message.reply_to.clone().unwrap_or_default(),
                text,
                attachments: file_links(&message.thread_id, &message.files),
            },
        );
        Ok(Receipt {
            platform_message_id: message.idempotency_key.clone(),
        })
    }

    /// Files: the reply's `final` event links them (see [`Channel::send_file`] below).
    fn capabilities(&self) -> antler_channel::Capabilities {
        antler_channel::Capabilities {
            files: true,
            ..antler_channel::Capabilities::default()
        }
    }

    /// Nothing to upload: the reply's `final` event already linked the file, which stays in
    /// the thread's outputs for the client to download.
    async fn send_file(
        &self,
        message: &OutboundMessage,
        file: &OutboundFile,
        _content: FileContent,
    ) -> Result<Receipt, ChannelError> {
        Ok(Receipt {
            platform_message_id: format!("{}:{}", message.idempotency_key, file.name),
        })
    }
}

/// `name` with every byte but unreserved ASCII and `/` percent-encoded.
fn encode_path(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Where a client downloads file `name` of thread `thread_id`.
fn file_url(thread_id: &str, name: &str) -> String {
    format!(
        "/api/v1/threads/{}/files/{}",
        encode_path(thread_id),
        encode_path(name)
    )
}

/// The links a client sees for a reply's files.
fn file_links(thread_id: &str, files: &[OutboundFile]) -> Vec<FileLink> {
    files
        .iter()
        .map(|file| FileLink {
            name: file.name.clone(),
            media_type: file.media_type.clone(),
            size: file.size,
            url: file_url(thread_id, &file.name),
        })
        .collect()
}

/// The request body, within the size limit and the read deadline (refusals counted for
/// `channel`).
pub(super) async fn read_body(
    state: &AppState,
    channel: &'static str,
    request: Request,
) -> Result<axum::body::Bytes, ApiError> {
    let too_large = || {
        metrics::counter!("antler_webhooks_rejected_total", "channel" => channel, "reason" => "too_large").increment(1);
        ApiError::TooLarge {
            limit: state.body_limit,
        }
    };
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > state.body_limit as u64) {
        return Err(too_large());
    }
    let read = axum::body::to_bytes(request.into_body(), state.body_limit);
    match tokio::time::timeout(state.body_timeout, read).await {
        Err(_) => {
            metrics::counter!("antler_webhooks_rejected_total", "channel" => channel, "reason" => "body_timeout").increment(1);
            Err(ApiError::BodyTimeout {
                secs: state.body_timeout.as_secs(),
            })
        }
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(cause) = source {
                if cause.is::<http_body_util::LengthLimitError>() {
                    return Err(too_large());
                }
                source = cause.source();
            }
            Err(ApiError::BadRequest(
                "the request body could not be read".to_owned(),
            ))
        }
    }
}

/// A place among the long-lived responses, or 503 when they are all taken.
fn stream_permit(state: &AppState) -> Result<OwnedSemaphorePermit, ApiError> {
    Arc::clone(&state.streams).try_acquire_owned().map_err(|_| {
        metrics::counter!("antler_streams_refused_total").increment(1);
        ApiError::TooManyStreams
    })
}

fn sse_event(event: &ThreadEvent) -> Event {
    let data = match event {
        ThreadEvent::Delta { in_reply_to, text } => {
            json!({ "in_reply_to": in_reply_to, "text": text })
        }
        ThreadEvent::Final {
            in_reply_to,
            text,
            attachments,
        } => {
            let mut data = json!({ "in_reply_to": in_reply_to, "text": text });
            if !attachments.is_empty() {
                data["attachments"] = json!(attachments);
            }
            data
        }
        ThreadEvent::Tool {
            in_reply_to,
            call_id,
            name,
            state,
            text,
        } => json!({
            "in_reply_to": in_reply_to,
            "call_id": call_id,
            "tool": name,
            "state": state,
            "text": text,
        }),
    };
    Event::default().event(event.name()).data(data.to_string())
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderMap;
    use base64::Engine as _;

    use super::*;
    use crate::config::{ApiChannelConfig, ApiRole, ApiToken, Secret};

    const ADMIN_TOKEN: &str = "admin-token-0123456789";
    const ANA_TOKEN: &str = "ana-token-0123456789";

    fn channel(tokens: bool, cap: u64) -> ApiChannel {
        let config = if tokens {
            ApiChannelConfig {
                token: Some(Secret::new(ADMIN_TOKEN)),
                tokens: vec![ApiToken {
                    token: Secret::new(ANA_TOKEN),
                    user: "ana".to_owned(),
                    role: ApiRole::User,
                }],
                ..ApiChannelConfig::default()
            }
        } else {
            ApiChannelConfig::default()
        };
        ApiChannel::new(ApiAuth::from_config(&config), EventHub::default(), cap)
    }

    fn parse(
        channel: &ApiChannel,
        token: Option<&str>,
        body: &Value,
    ) -> Result<InboundEvent, ChannelError> {
        let mut headers = HeaderMap::new();
        if let Some(token) = token {
            headers.insert(
                axum::http::header::AUTHORIZATION,
                format!("Bearer {token}").parse().unwrap(),
            );
        }
        let body = body.to_string();
        let request = WebhookRequest {
            route: "",
            headers: &headers,
            body: body.as_bytes(),
        };
        match channel.parse(&request)? {
            Parsed::Events(mut events) if events.len() == 1 => Ok(events.remove(0)),
            other => panic!("one event expected: {other:?}"),
        }
    }

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    fn malformed(result: Result<InboundEvent, ChannelError>) -> String {
        match result {
            Err(ChannelError::Malformed(message)) => message,
            other => panic!("malformed expected: {other:?}"),
        }
    }

    #[test]
    fn file_urls_and_download_names_are_safe() {
        assert_eq!(
            file_url("t-1", "charts/cpu load.png"),
            "/api/v1/threads/t-1/files/charts/cpu%20load.png"
        );
        assert_eq!(encode_path("ü?#%"), "%C3%BC%3F%23%25");
        assert_eq!(ascii_file_name("rep\"ort.csv"), "rep_ort.csv");
        assert_eq!(ascii_file_name("dir\\x.csv"), "x.csv");
        assert_eq!(ascii_file_name("отчёт.txt"), "_____.txt");
        assert_eq!(ascii_file_name("a\r\nb.txt"), "ab.txt");
    }

    #[test]
    fn only_an_admin_token_makes_an_admin() {
        let body = json!({"conversation": "c", "text": "hi"});
        let open = channel(false, 1024);
        assert!(!parse(&open, None, &body).unwrap().user.admin, "open API");
        let with_tokens = channel(true, 1024);
        assert!(
            parse(&with_tokens, Some(ADMIN_TOKEN), &body)
                .unwrap()
                .user
                .admin
        );
        let ana = parse(&with_tokens, Some(ANA_TOKEN), &body).unwrap();
        assert_eq!(ana.user.id, "ana");
        assert!(!ana.user.admin);
    }

    #[test]
    fn attachments_become_inline_references_and_text_may_be_empty() {
        let api = channel(false, 1024);
        let body = json!({
            "conversation": "c",
            "attachments": [
                {"name": "../../etc/notes.txt", "media_type": "text/plain", "data_base64": b64(b"hello")},
                {"name": "empty.bin", "data_base64": ""},
            ],
        });
        let event = parse(&api, None, &body).unwrap();
        assert_eq!(event.text, "");
        assert_eq!(
            event.attachments,
            [
                AttachmentRef {
                    name: "notes.txt".to_owned(),
                    media_type: Some("text/plain".to_owned()),
                    size: Some(5),
                    source: AttachmentSource::Inline {
                        data_base64: b64(b"hello"),
                    },
                },
                AttachmentRef {
                    name: "empty.bin".to_owned(),
                    media_type: None,
                    size: Some(0),
                    source: AttachmentSource::Inline {
                        data_base64: String::new(),
                    },
                },
            ]
        );
        // Without files, words are still required.
        let message = malformed(parse(
            &api,
            None,
            &json!({"conversation": "c", "text": " "}),
        ));
        assert!(message.contains("`text` must not be empty"), "{message}");
        let message = malformed(parse(
            &api,
            None,
            &json!({"conversation": "c", "attachments": []}),
        ));
        assert!(message.contains("`text`"), "{message}");
    }

    #[test]
    fn bad_attachments_are_refused_naming_the_field() {
        let api = channel(false, 8);
        let file = |name: &str, data: &str| json!({"name": name, "data_base64": data});
        let body =
            |files: Vec<Value>| json!({"conversation": "c", "text": "t", "attachments": files});

        let eleven = (0..11).map(|i| file(&format!("f{i}"), "")).collect();
        let message = malformed(parse(&api, None, &body(eleven)));
        assert!(
            message.contains("`attachments` has 11 files; at most 10"),
            "{message}"
        );

        let message = malformed(parse(
            &api,
            None,
            &body(vec![file("a", ""), file("b", "aGk")]),
        ));
        assert!(
            message.contains("`attachments[1].data_base64` is not valid standard base64"),
            "{message}"
        );

        let message = malformed(parse(&api, None, &body(vec![file(" ", "")])));
        assert!(
            message.contains("`attachments[0].name` must not be empty"),
            "{message}"
        );
        let message = malformed(parse(&api, None, &body(vec![file("../..", "")])));
        assert!(
            message.contains("`attachments[0].name` must name a file"),
            "{message}"
        );

        let typed = json!({"name": "a", "media_type": "png", "data_base64": ""});
        let message = malformed(parse(&api, None, &body(vec![typed])));
        assert!(message.contains("`attachments[0].media_type`"), "{message}");

        let unknown = json!({"name": "a", "data_base64": "", "url": "http://x"});
        let message = malformed(parse(&api, None, &body(vec![unknown])));
        assert!(message.contains("url"), "{message}");

        let missing = json!({"name": "a"});
        let message = malformed(parse(&api, None, &body(vec![missing])));
        assert!(message.contains("data_base64"), "{message}");

        // Nine bytes against a cap of eight.
        let big = file("big.bin", &b64(&[0; 9]));
        assert_eq!(
            parse(&api, None, &body(vec![big.clone()])),
            Err(ChannelError::TooLarge { limit: 8 })
        );
        let refusal = ApiChannel::read(
            body(vec![big]).to_string().as_bytes(),
            &Principal { user: None },
            false,
            8,
        )
        .unwrap_err();
        let message = refusal.to_string();
        assert!(matches!(refusal, Refusal::TooLarge { limit: 8, .. }));
        assert!(
            message.contains("`attachments[0]` (`big.bin`) is 9 bytes"),
            "{message}"
        );
        assert!(message.contains("at most 8 bytes"), "{message}");
    }
}
