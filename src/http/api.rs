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

/// How long `"wait": true` waits for the answer before answering 202 anyway.
const WAIT_LIMIT: Duration = Duration::from_secs(120);
const MAX_ID_CHARS: usize = 256;
/// Who a message is from when an admin (or a token-less setup) does not say.
const DEFAULT_USER: &str = "operator";

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
    /// already holds it. The API renders nothing, so the one part is the whole reply.
    async fn send(
        &self,
        message: &OutboundMessage,
        _part: Part<'_>,
    ) -> Result<Receipt, ChannelError> {
        self.hub.publish(
            &message.thread_id,
            ThreadEvent::Final {
                in_reply_to: message.reply_to.clone().unwrap_or_default(),
                text: message.text.clone(),
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

/// An answer as the API gives it: the text and links to its files.
type Reply = (String, Vec<FileLink>);

/// The replies already produced for inbox item `seq`, if any: their text and files.
async fn existing_reply(state: &AppState, seq: u64) -> Result<Option<Reply>, ApiError> {
    let replies = state.store.replies(seq).await?;
    if replies.is_empty() {
        return Ok(None);
    }
    let mut links = Vec::new();
    let mut texts = Vec::with_capacity(replies.len());
    for item in replies {
        links.extend(file_links(&item.message.thread_id, &item.message.files));
        texts.push(item.message.text);
    }
    Ok(Some((texts.join("\n\n"), links)))
}

/// The answer to a refused body, counted by its reason.
fn refused(refusal: Refusal) -> ApiError {
    let reason = match refusal {
        Refusal::Malformed(_) => "malformed",
        Refusal::TooLarge { .. } => "file_too_large",
    };
    metrics::counter!("antler_webhooks_rejected_total", "channel" => "api", "reason" => reason)
        .increment(1);
    ApiError::from(refusal)
}

/// `POST /api/v1/messages`
pub(crate) async fn post_message(
    State(state): State<AppState>,
    Extension(principal): Extension<Arc<Principal>>,
    request: Request,
) -> Result<Response, ApiError> {
    metrics::counter!("antler_webhooks_received_total", "channel" => "api").increment(1);
    let admin = acts_as_admin(&state.auth, &principal);
    let body = read_body(&state, "api", request).await?;
    let (message, event) =
        ApiChannel::read(&body, &principal, admin, state.max_attachment_bytes).map_err(refused)?;
    let message_id = event.event_id.clone();
    let conversation = event.conversation.to_string();
    let listen = message.stream || message.wait;
    let permit = listen.then(|| stream_permit(&state)).transpose()?;
    let admission = match state.ingress.accept(event, listen).await {
        Ok(admission) => admission,
        Err(IngressError::Dropped) => {
            // Refused within the hour: acknowledged, and nothing more to say.
            let dropped = json!({
                "conversation": conversation,
                "message_id": message_id,
                "dropped": true,
            });
            return Ok((StatusCode::ACCEPTED, Json(dropped)).into_response());
        }
        Err(e) => return Err(e.into()),
    };
    let accepted = json!({
        "thread_id": admission.thread_id,
        "conversation": conversation,
        "message_id": message_id,
        "duplicate": !admission.new,
    });
    let (Some(events), Some(permit)) = (admission.events, permit) else {
        return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response());
    };
    // A redelivery: its answer may exist already. (Subscribed first, so an answer that lands
    // after this check still arrives as an event.)
    let existing = match (admission.new, admission.seq) {
        (true, _) => None,
        (false, Some(seq)) => existing_reply(&state, seq).await?,
        // Accepted before antler recorded which item a key became: nothing to wait for.
        (false, None) => return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response()),
    };
    if message.stream {
        let first = Event::default()
            .event("accepted")
            .data(accepted.to_string());
        let stream = answer_stream(events, message_id, existing, state.stop.clone(), permit);
        let stream = futures_util::StreamExt::chain(
            futures_util::stream::once(async move { Ok(first) }),
            stream,
        );
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let reply = match existing {
        Some(reply) => Some(reply),
        None => wait_for_answer(events, &message_id, &state.stop).await,
    };
    drop(permit);
    let mut answer = accepted;
    match reply {
        Some((reply, attachments)) => {
            answer["reply"] = Value::String(reply);
            if !attachments.is_empty() {
                answer["attachments"] = json!(attachments);
            }
            Ok((StatusCode::OK, Json(answer)).into_response())
        }
        None => Ok((StatusCode::ACCEPTED, Json(answer)).into_response()),
    }
}

async fn wait_for_answer(
    mut events: Subscription,
    message_id: &str,
    stop: &CancellationToken,
) -> Option<Reply> {
    let wait = async {
        loop {
            match events.recv().await {
                Ok(ThreadEvent::Final {
                    in_reply_to,
                    text,
                    attachments,
                }) if in_reply_to == message_id => {
                    return Some((text, attachments));
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    };
    tokio::select! {
        answer = tokio::time::timeout(WAIT_LIMIT, wait) => answer.ok().flatten(),
        () = stop.cancelled() => None,
    }
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

/// Where an answer stream is.
struct AnswerStream {
    events: Subscription,
    /// The answer when it was already there: sent as the only event.
    existing: Option<Reply>,
    finished: bool,
    _permit: OwnedSemaphorePermit,
}

/// Events of one message's answer, ending with its final reply (or at shutdown).
fn answer_stream(
    events: Subscription,
    message_id: String,
    existing: Option<Reply>,
    stop: CancellationToken,
    permit: OwnedSemaphorePermit,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let state = AnswerStream {
        events,
        existing,
        finished: false,
        _permit: permit,
    };
    futures_util::stream::unfold(state, move |mut state| {
        let message_id = message_id.clone();
        let stop = stop.clone();
        async move {
            if state.finished {
                return None;
            }
            if let Some((text, attachments)) = state.existing.take() {
                let event = ThreadEvent::Final {
                    in_reply_to: message_id,
                    text,
                    attachments,
                };
                state.finished = true;
                return Some((Ok(sse_event(&event)), state));
            }
            loop {
                let next = tokio::select! {
                    next = state.events.recv() => next,
                    () = stop.cancelled() => return None,
                };
                match next {
                    Ok(event) if event.in_reply_to() == message_id => {
                        state.finished = matches!(event, ThreadEvent::Final { .. });
                        return Some((Ok(sse_event(&event)), state));
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    })
}

/// Every event of a thread until the client goes away (or shutdown).
fn thread_stream(
    events: Subscription,
    stop: CancellationToken,
    permit: OwnedSemaphorePermit,
) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold((events, permit), move |(mut events, permit)| {
        let stop = stop.clone();
        async move {
            loop {
                let next = tokio::select! {
                    next = events.recv() => next,
                    () = stop.cancelled() => return None,
                };
                match next {
                    Ok(event) => return Some((Ok(sse_event(&event)), (events, permit))),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    })
}

/// Which message carried which presented files: for each presentation, the first answer
/// (an assistant message without tool calls) after the result of its `present_files` call.
fn attachments_by_message(thread: &ThreadState) -> Vec<(usize, Vec<FileLink>)> {
    let Some(presented) = thread.extensions.get::<PresentedFiles>() else {
        return Vec::new();
    };
    let mut found: Vec<(usize, Vec<FileLink>)> = Vec::new();
    for entry in presented.entries {
        let Some(result) = thread.messages.iter().position(|m| {
            matches!(m, ChatMessage::Tool { tool_call_id, .. } if *tool_call_id == entry.call_id)
        }) else {
            continue;
        };
        let Some(answer) = thread
            .messages
            .iter()
            .enumerate()
            .skip(result + 1)
            .find(|(_, m)| {
                matches!(m, ChatMessage::Assistant { tool_calls, .. } if tool_calls.is_empty())
            })
            .map(|(index, _)| index)
        else {
            continue;
        };
        let links = entry.files.into_iter().map(|file| FileLink {
            url: file_url(&thread.id, &file.name),
            name: file.name,
            media_type: file.media_type,
            size: file.size,
        });
        match found.iter_mut().find(|(index, _)| *index == answer) {
            Some((_, existing)) => {
                for link in links {
                    if !existing.iter().any(|l| l.name == link.name) {
                        existing.push(link);
                    }
                }
            }
            None => found.push((answer, links.collect())),
        }
    }
    found
}

/// The thread as the API shows it: its metadata and messages, those of failed turns marked
/// `"failed": true`, answers that carried files with their `attachments`.
fn thread_view(thread: &ThreadState) -> Value {
    let mut view = serde_json::to_value(thread).unwrap_or_else(|_| json!({}));
    let attachments = attachments_by_message(thread);
    let messages: Vec<Value> = thread
        .messages
        .iter()
        .enumerate()
        .map(|(index, message)| {
            let mut value = serde_json::to_value(message).unwrap_or(Value::Null);
            if let Some(object) = value.as_object_mut() {
                if thread.is_failed(index) {
                    object.insert("failed".to_owned(), Value::Bool(true));
                }
                if let Some((_, links)) = attachments.iter().find(|(at, _)| *at == index) {
                    object.insert("attachments".to_owned(), json!(links));
                }
            }
            value
        })
        .collect();
    if let Some(object) = view.as_object_mut() {
        object.insert("messages".to_owned(), Value::Array(messages));
    }
    view
}

/// The thread `id` if it exists and `principal` may read it (404 otherwise, so a user cannot
/// tell another's thread ids from unknown ones).
async fn readable_thread(
    state: &AppState,
    principal: &Principal,
    id: &str,
) -> Result<ThreadState, ApiError> {
    match state.store.thread(id).await? {
        Some(thread) if principal.may_read(&thread.conversation) => Ok(thread),
        _ => Err(ApiError::NotFound(format!("no thread `{id}`"))),
    }
}

/// `GET /api/v1/threads/{id}`
pub(crate) async fn get_thread(
    State(state): State<AppState>,
    Extension(principal): Extension<Arc<Principal>>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let thread = readable_thread(&state, &principal, &id).await?;
    Ok(Json(thread_view(&thread)).into_response())
}

/// A file name safe inside a quoted `Content-Disposition` `filename`: printable ASCII
/// without quotes or backslashes (the exact name goes in `filename*`).
fn ascii_file_name(name: &str) -> String {
    let base = safe_file_name(name).unwrap_or_else(|| "file".to_owned());
    base.chars()
        .map(|c| {
            if (c.is_ascii_graphic() && c != '"' && c != '\\') || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Why a file cannot be downloaded: all of it is "not found", so a client cannot probe
/// what exists outside the thread's outputs.
fn no_file(name: &str) -> ApiError {
    let shown: String = name.chars().take(200).collect();
    ApiError::NotFound(format!("no file `{shown}` in this thread's outputs"))
}

/// `GET /api/v1/threads/{id}/files/{*name}`: a file of the thread's outputs folder.
pub(crate) async fn get_file(
    State(state): State<AppState>,
    Extension(principal): Extension<Arc<Principal>>,
    ApiPath((id, name)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    readable_thread(&state, &principal, &id).await?;
    let folders = ThreadFolders::new(&state.data_root, &id).map_err(|_| no_file(&name))?;
    let max_bytes = state.max_attachment_bytes;
    let virtual_path = format!("{}/{name}", Area::Outputs.virtual_path());
    // The name is checked as the tool checks it (inside outputs, no `..`), then opened once,
    // beneath the outputs folder with links refused, and what was opened is what is sent.
    let opened =
        tokio::task::spawn_blocking(move || -> Option<(std::fs::File, u64, String, String)> {
            let resolved = folders.resolve(&virtual_path, PathAccess::Read).ok()?;
            if resolved.area != Area::Outputs {
                return None;
            }
            let name = resolved.name();
            let opened = open_presented(&folders, &name, max_bytes).ok()?;
            let media_type = media_type(&name).to_owned();
            Some((opened.file, opened.size, name, media_type))
        })
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let Some((opened, size, name, media_type)) = opened else {
        return Err(no_file(&name));
    };
    // Streamed, never held whole; exactly the size announced, even if the file grows meanwhile.
    let reader = tokio::io::AsyncReadExt::take(tokio::fs::File::from_std(opened), size);
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(reader));
    let file_name = name.rsplit('/').next().unwrap_or(&name);
    let disposition = format!(
        "attachment; filename=\"{}\"; filename*=UTF-8''{}",
        ascii_file_name(file_name),
        encode_path(file_name).replace('/', "%2F")
    );
    metrics::counter!("antler_file_downloads_total").increment(1);
    Ok((
        [
            (axum::http::header::CONTENT_TYPE, media_type),
            (axum::http::header::CONTENT_DISPOSITION, disposition),
            (
                axum::http::header::X_CONTENT_TYPE_OPTIONS,
                "nosniff".to_owned(),
            ),
            (axum::http::header::CONTENT_LENGTH, size.to_string()),
        ],
        body,
    )
        .into_response())
}

/// `GET /api/v1/threads/{id}/events`
pub(crate) async fn thread_events(
    State(state): State<AppState>,
    Extension(principal): Extension<Arc<Principal>>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    readable_thread(&state, &principal, &id).await?;
    let permit = stream_permit(&state)?;
    let stream = thread_stream(state.hub.subscribe(&id), state.stop.clone(), permit);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
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
