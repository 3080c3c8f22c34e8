//! The HTTP API channel: antler's own channel, for `antler chat`, scripts and tests.
//!
//! `POST /api/v1/messages` accepts `{conversation, user?, text, message_id?}` (`user` defaults
//! to the token's user, or `operator`) and answers 202
//! with the thread id once the message is durable; the same `message_id` again is recognised
//! and answered with the same thread, nothing stored twice. `"stream": true` answers with an
//! SSE stream instead (`accepted`, then the answer's `delta`s and its `final`), `"wait": true`
//! with the answer itself; both also work for a resent `message_id`, whose answer is given as
//! soon as it exists. Replies are delivered through the outbox like any platform's: delivery
//! publishes them to the thread's SSE subscribers.
//!
//! Requests pass [`super::guard::api_guard`] first, which names the [`Principal`]: an admin
//! names any conversation and any `user`; a user's token reaches only that user's
//! conversations (stored under `api:<user>/<conversation>`) and always acts as that user.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use antler_channel::{
    Channel, ChannelError, InboundEvent, OutboundMessage, Parsed, Receipt, UserRef, WebhookRequest,
};
use axum::extract::{Path, Request, State};
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
use super::guard::{ApiAuth, Principal};
use crate::agent::thread::ThreadState;
use crate::events::{EventHub, Subscription, ThreadEvent};

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
}

/// The body of `POST /api/v1/messages`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostMessage {
    conversation: String,
    #[serde(default)]
    user: Option<String>,
    text: String,
    #[serde(default)]
    message_id: Option<String>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    wait: bool,
}

fn check_id(field: &str, value: &str) -> Result<(), ChannelError> {
    if value.trim().is_empty() {
        return Err(ChannelError::Malformed(format!(
            "`{field}` must not be empty"
        )));
    }
    if value.chars().count() > MAX_ID_CHARS || value.chars().any(char::is_control) {
        return Err(ChannelError::Malformed(format!(
            "`{field}` must be at most {MAX_ID_CHARS} printable characters"
        )));
    }
    Ok(())
}

impl ApiChannel {
    pub(crate) fn new(auth: ApiAuth, hub: EventHub) -> Self {
        Self { auth, hub }
    }

    fn read(
        body: &[u8],
        principal: &Principal,
    ) -> Result<(PostMessage, InboundEvent), ChannelError> {
        let message: PostMessage = serde_json::from_slice(body)
            .map_err(|e| ChannelError::Malformed(format!("invalid JSON body: {e}")))?;
        check_id("conversation", &message.conversation)?;
        let user = match (&principal.user, &message.user) {
            (None, Some(user)) => user.clone(),
            (None, None) => DEFAULT_USER.to_owned(),
            (Some(own), Some(user)) if own != user => {
                return Err(ChannelError::Malformed(format!(
                    "`user` must be this token's user ({own}) or left out"
                )));
            }
            (Some(own), _) => own.clone(),
        };
        check_id("user", &user)?;
        if let Some(id) = &message.message_id {
            check_id("message_id", id)?;
        }
        if message.text.trim().is_empty() {
            return Err(ChannelError::Malformed(
                "`text` must not be empty".to_owned(),
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
                admin: false,
            },
            text: message.text.clone(),
            reply_to: Some(message_id),
            received_at_ms: crate::now_ms(),
            attachments: Vec::new(),
            group: false,
            interactive: message.wait || message.stream,
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
        Self::read(request.body, &principal).map(|(_, event)| Parsed::Events(vec![event]))
    }

    /// Publishes the reply to the thread's subscribers; the thread already holds it.
    async fn send(&self, message: &OutboundMessage) -> Result<Receipt, ChannelError> {
        self.hub.publish(
            &message.thread_id,
            ThreadEvent::Final {
                in_reply_to: message.reply_to.clone().unwrap_or_default(),
                text: message.text.clone(),
            },
        );
        Ok(Receipt {
            platform_message_id: message.idempotency_key.clone(),
        })
    }
}

/// The request body, within the size limit and the read deadline.
async fn read_body(state: &AppState, request: Request) -> Result<axum::body::Bytes, ApiError> {
    let too_large = || {
        metrics::counter!("antler_webhooks_rejected_total", "channel" => "api", "reason" => "too_large").increment(1);
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
            metrics::counter!("antler_webhooks_rejected_total", "channel" => "api", "reason" => "body_timeout").increment(1);
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

/// The text of the replies already produced for inbox item `seq`, if any.
async fn existing_reply(state: &AppState, seq: u64) -> Result<Option<String>, ApiError> {
    let replies = state.store.replies(seq).await?;
    if replies.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        replies
            .into_iter()
            .map(|item| item.message.text)
            .collect::<Vec<_>>()
            .join("\n\n"),
    ))
}

/// `POST /api/v1/messages`
pub(crate) async fn post_message(
    State(state): State<AppState>,
    Extension(principal): Extension<Arc<Principal>>,
    request: Request,
) -> Result<Response, ApiError> {
    metrics::counter!("antler_webhooks_received_total", "channel" => "api").increment(1);
    let body = read_body(&state, request).await?;
    let (message, event) = ApiChannel::read(&body, &principal).map_err(|e| {
        metrics::counter!("antler_webhooks_rejected_total", "channel" => "api", "reason" => "malformed").increment(1);
        ApiError::BadRequest(e.to_string())
    })?;
    let message_id = event.event_id.clone();
    let conversation = event.conversation.to_string();
    let listen = message.stream || message.wait;
    let permit = listen.then(|| stream_permit(&state)).transpose()?;
    let admission = state.ingress.accept(event, listen).await?;
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
        Some(reply) => {
            answer["reply"] = Value::String(reply);
            Ok((StatusCode::OK, Json(answer)).into_response())
        }
        None => Ok((StatusCode::ACCEPTED, Json(answer)).into_response()),
    }
}

async fn wait_for_answer(
    mut events: Subscription,
    message_id: &str,
    stop: &CancellationToken,
) -> Option<String> {
    let wait = async {
        loop {
            match events.recv().await {
                Ok(ThreadEvent::Final { in_reply_to, text }) if in_reply_to == message_id => {
                    return Some(text);
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
        ThreadEvent::Delta { in_reply_to, text } | ThreadEvent::Final { in_reply_to, text } => {
            json!({ "in_reply_to": in_reply_to, "text": text })
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
    existing: Option<String>,
    finished: bool,
    _permit: OwnedSemaphorePermit,
}

/// Events of one message's answer, ending with its final reply (or at shutdown).
fn answer_stream(
    events: Subscription,
    message_id: String,
    existing: Option<String>,
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
            if let Some(text) = state.existing.take() {
                let event = ThreadEvent::Final {
                    in_reply_to: message_id,
                    text,
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

/// The thread as the API shows it: its metadata and messages, those of failed turns marked
/// `"failed": true`.
fn thread_view(thread: &ThreadState) -> Value {
    let mut view = serde_json::to_value(thread).unwrap_or_else(|_| json!({}));
    let messages: Vec<Value> = thread
        .messages
        .iter()
        .enumerate()
        .map(|(index, message)| {
            let mut value = serde_json::to_value(message).unwrap_or(Value::Null);
            if thread.is_failed(index) {
                if let Some(object) = value.as_object_mut() {
                    object.insert("failed".to_owned(), Value::Bool(true));
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
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let thread = readable_thread(&state, &principal, &id).await?;
    Ok(Json(thread_view(&thread)).into_response())
}

/// `GET /api/v1/threads/{id}/events`
pub(crate) async fn thread_events(
    State(state): State<AppState>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    readable_thread(&state, &principal, &id).await?;
    let permit = stream_permit(&state)?;
    let stream = thread_stream(state.hub.subscribe(&id), state.stop.clone(), permit);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}
