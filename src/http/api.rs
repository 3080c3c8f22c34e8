//! The HTTP API channel: antler's own channel, for `antler chat`, scripts and tests.
//!
//! `POST /api/v1/messages` accepts `{conversation, user, text, message_id?}` and answers 202
//! with the thread id once the message is durable; the same `message_id` again is recognised
//! and answered with the same thread, nothing stored twice. `"stream": true` answers with an
//! SSE stream of that message's answer instead, `"wait": true` with the answer itself.
//! Replies are delivered through the outbox like any platform's: delivery publishes them to
//! the thread's SSE subscribers.

use std::convert::Infallible;
use std::time::Duration;

use antler_channel::{
    Channel, ChannelError, ConversationKey, InboundEvent, OutboundMessage, Parsed, Receipt,
    UserRef, WebhookRequest, verify,
};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::AppState;
use super::error::ApiError;
use crate::config::Secret;
use crate::events::{EventHub, Subscription, ThreadEvent};

/// How long `"wait": true` waits for the answer before answering 202 anyway.
const WAIT_LIMIT: Duration = Duration::from_secs(120);
const MAX_ID_CHARS: usize = 256;

/// The API channel.
#[derive(Debug)]
pub(crate) struct ApiChannel {
    token: Option<Secret>,
    hub: EventHub,
}

/// The body of `POST /api/v1/messages`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostMessage {
    conversation: String,
    user: String,
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
    pub(crate) fn new(token: Option<Secret>, hub: EventHub) -> Self {
        Self { token, hub }
    }

    fn read(body: &[u8]) -> Result<(PostMessage, InboundEvent), ChannelError> {
        let message: PostMessage = serde_json::from_slice(body)
            .map_err(|e| ChannelError::Malformed(format!("invalid JSON body: {e}")))?;
        check_id("conversation", &message.conversation)?;
        check_id("user", &message.user)?;
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
            conversation: ConversationKey::new("api", [&message.conversation]),
            user: UserRef {
                id: message.user.clone(),
                name: None,
            },
            text: message.text.clone(),
            reply_to: Some(message_id),
            received_at_ms: crate::now_ms(),
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
        match &self.token {
            Some(token) if !verify::bearer_matches(request.headers, token.expose()) => {
                Err(ChannelError::Unauthorized)
            }
            _ => Ok(()),
        }
    }

    fn parse(&self, request: &WebhookRequest<'_>) -> Result<Parsed, ChannelError> {
        Self::read(request.body).map(|(_, event)| Parsed::Events(vec![event]))
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

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let request = WebhookRequest { headers, body: &[] };
    state.api.verify(&request).map_err(|_| {
        metrics::counter!("antler_webhooks_rejected_total", "channel" => "api", "reason" => "unauthorized").increment(1);
        ApiError::Unauthorized
    })
}

fn body_bytes(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            metrics::counter!("antler_webhooks_rejected_total", "channel" => "api", "reason" => "too_large").increment(1);
            ApiError::TooLarge {
                limit: state.body_limit,
            }
        } else {
            ApiError::BadRequest(rejection.body_text())
        }
    })
}

/// `POST /api/v1/messages`
pub(crate) async fn post_message(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    metrics::counter!("antler_webhooks_received_total", "channel" => "api").increment(1);
    authorize(&state, &headers)?;
    let body = body_bytes(&state, body)?;
    let (message, event) = ApiChannel::read(&body).map_err(|e| {
        metrics::counter!("antler_webhooks_rejected_total", "channel" => "api", "reason" => "malformed").increment(1);
        ApiError::BadRequest(e.to_string())
    })?;
    let message_id = event.event_id.clone();
    let conversation = event.conversation.to_string();
    let listen = message.stream || message.wait;
    let admission = state.ingress.accept(event, listen).await?;
    let accepted = json!({
        "thread_id": admission.thread_id,
        "conversation": conversation,
        "message_id": message_id,
        "duplicate": !admission.new,
    });
    let Some(events) = admission.events else {
        return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response());
    };
    if message.stream {
        let stream = answer_stream(events, message_id, state.stop.clone());
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    match wait_for_answer(events, &message_id, &state.stop).await {
        Some(reply) => Ok((
            StatusCode::OK,
            Json(json!({
                "thread_id": admission.thread_id,
                "conversation": conversation,
                "message_id": message_id,
                "duplicate": false,
                "reply": reply,
            })),
        )
            .into_response()),
        None => Ok((StatusCode::ACCEPTED, Json(accepted)).into_response()),
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
    };
    Event::default().event(event.name()).data(data.to_string())
}

/// Events of one message's answer, ending with its final reply (or at shutdown).
fn answer_stream(
    events: Subscription,
    message_id: String,
    stop: CancellationToken,
) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold((events, false), move |(mut events, finished)| {
        let message_id = message_id.clone();
        let stop = stop.clone();
        async move {
            if finished {
                return None;
            }
            loop {
                let next = tokio::select! {
                    next = events.recv() => next,
                    () = stop.cancelled() => return None,
                };
                match next {
                    Ok(event) if event.in_reply_to() == message_id => {
                        let last = matches!(event, ThreadEvent::Final { .. });
                        return Some((Ok(sse_event(&event)), (events, last)));
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
) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold(events, move |mut events| {
        let stop = stop.clone();
        async move {
            loop {
                let next = tokio::select! {
                    next = events.recv() => next,
                    () = stop.cancelled() => return None,
                };
                match next {
                    Ok(event) => return Some((Ok(sse_event(&event)), events)),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    })
}

/// `GET /api/v1/threads/{id}`
pub(crate) async fn get_thread(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    match state.store.thread(&id).await? {
        Some(thread) => Ok(Json(thread).into_response()),
        None => Err(ApiError::NotFound(format!("no thread `{id}`"))),
    }
}

/// `GET /api/v1/threads/{id}/events`
pub(crate) async fn thread_events(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    if state.store.thread(&id).await?.is_none() {
        return Err(ApiError::NotFound(format!("no thread `{id}`")));
    }
    let stream = thread_stream(state.hub.subscribe(&id), state.stop.clone());
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}
