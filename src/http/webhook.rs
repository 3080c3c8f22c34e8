//! Platform webhooks: `POST /webhooks/<channel>` (and `/webhooks/<channel>/<route>` for each of
//! the channel's routes), the same for every platform.
//!
//! The raw body is verified by the channel, then parsed into [`Parsed`]. Events are accepted
//! through the ingress (access check, dedupe, inbox, sync) before anything is answered, so an
//! acknowledged message is never lost; a failure to accept answers 5xx and the platform
//! delivers again, which dedupe recognises. A protocol reply (a URL challenge, a PING) is
//! answered at once; events with a reply (a Slack slash command, a Discord deferred
//! interaction) are accepted first and then answered with the reply. A message the channel
//! cannot judge yet (it may be for the bot, whose identity is not known:
//! [`ChannelError::Transient`]) is answered 503, so the platform delivers it again.

use std::sync::Arc;

use antler_channel::{Channel, ChannelError, InboundEvent, Parsed, WebhookRequest};
use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use crate::ingress::{Ingress, IngressError};

/// The handler of one channel's webhook route.
pub(crate) async fn receive(
    State(state): State<AppState>,
    channel: Arc<dyn Channel>,
    route: &'static str,
    request: Request,
) -> Result<Response, ApiError> {
    let name = channel.name();
    metrics::counter!("antler_webhooks_received_total", "channel" => name).increment(1);
    let headers = request.headers().clone();
    channel
        .verify_headers(&headers)
        .map_err(|e| rejected(name, e))?;
    let body = super::api::read_body(&state, name, request).await?;
    respond(&state.ingress, channel.as_ref(), route, &headers, &body).await
}

/// Verifies, parses and answers one request whose body has been read.
pub(crate) async fn respond(
    ingress: &Ingress,
    channel: &dyn Channel,
    route: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let request = WebhookRequest {
        route,
        headers,
        body,
    };
    let parsed = channel
        .verify(&request)
        .and_then(|()| channel.parse(&request))
        .map_err(|e| rejected(channel.name(), e))?;
    match parsed {
        Parsed::Events(events) => {
            accept_all(ingress, events).await?;
            Ok(StatusCode::OK.into_response())
        }
        Parsed::EventsWithReply { mut events, reply } => {
            if let Some(refusal) = refuse_at_once(ingress, channel, &mut events).await {
                return Ok((StatusCode::OK, Json(refusal)).into_response());
            }
            accept_all(ingress, events).await?;
            Ok((StatusCode::OK, Json(reply)).into_response())
        }
        Parsed::Reply(reply) => Ok((StatusCode::OK, Json(reply)).into_response()),
        Parsed::Ignore => Ok(StatusCode::OK.into_response()),
        Parsed::Moved(chat_move) => {
            ingress.move_chat(&chat_move).await?;
            Ok(StatusCode::OK.into_response())
        }
        Parsed::Press(press) => Ok(match ingress.press(channel, &press).await {
            Some(body) => (StatusCode::OK, Json(body)).into_response(),
            None => StatusCode::OK.into_response(),
        }),
    }
}

/// On a channel that refuses at once ([`Channel::refusal_reply`]), the refusal that answers the
/// request instead of its reply when an author may not use the bot: then nothing is stored and
/// nothing runs. `None`: accept the events as usual.
pub(crate) async fn refuse_at_once(
    ingress: &Ingress,
    channel: &dyn Channel,
    events: &mut [InboundEvent],
) -> Option<serde_json::Value> {
    channel.refusal_reply("")?;
    for event in events.iter_mut() {
        if let Some(text) = ingress.refusal(event).await {
            return channel.refusal_reply(&text);
        }
    }
    None
}

/// Accepts every event, in order; a message dropped by the access check counts as handled.
pub(crate) async fn accept_all(
    ingress: &Ingress,
    events: Vec<InboundEvent>,
) -> Result<(), IngressError> {
    for event in events {
        match ingress.accept(event, false).await {
            Ok(_) | Err(IngressError::Dropped) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What a 401 from `channel`'s webhook says failed: the platform's own secret or signature,
/// not the HTTP API's bearer token.
fn unauthorized(channel: &str) -> &'static str {
    match channel {
        "telegram" => {
            "the X-Telegram-Bot-Api-Secret-Token header is missing or does not match \
             channels.telegram.webhook_secret"
        }
        "slack" => {
            "the Slack signature (X-Slack-Signature) is missing or does not verify with \
             channels.slack.signing_secret, or the request is more than 5 minutes old"
        }
        "discord" => {
            "the Discord signature (X-Signature-Ed25519) is missing or does not verify with \
             channels.discord.public_key, or the request is more than 5 minutes old"
        }
        "feishu" => {
            "the Feishu signature (X-Lark-Signature, with channels.feishu.encrypt_key) or \
             verification token (channels.feishu.verification_token) does not verify"
        }
        _ => "the request's signature or secret does not verify",
    }
}

/// The answer to a request the channel would not take, counted by its reason.
fn rejected(channel: &'static str, error: ChannelError) -> ApiError {
    let (reason, answer) = match error {
        ChannelError::Unauthorized => (
            "unauthorized",
            ApiError::WebhookUnauthorized(unauthorized(channel)),
        ),
        ChannelError::Malformed(message) => ("malformed", ApiError::BadRequest(message)),
        // Only a message that may be addressed to the bot, before the bot knows who it is:
        // a 503 makes the platform deliver it again, instead of acknowledging and losing it.
        ChannelError::Transient(message) => {
            tracing::warn!(channel, %message, "a message waits for the bot's identity");
            ("identity_unknown", ApiError::NotReady(message))
        }
        ChannelError::TooLarge { limit } => (
            "file_too_large",
            ApiError::FileTooLarge(format!("a file is larger than {limit} bytes")),
        ),
        other => ("internal", ApiError::Internal(other.to_string())),
    };
    metrics::counter!("antler_webhooks_rejected_total", "channel" => channel, "reason" => reason)
        .increment(1);
    answer
}

#[cfg(test)]
mod tests {
    use antler_channel::{OutboundMessage, Part, Receipt};
    use serde_json::json;

    use super::*;
    use crate::ingress::tests::harness;
    use crate::test_support::event;

    /// A channel whose body names what it parses into: `slash`, `events`, `challenge`,
    /// `ignore`; `early` waits for the bot's identity, `bad` is malformed and `forged` does not
    /// verify.
    #[derive(Debug)]
    struct ScriptChannel;

    #[async_trait::async_trait]
    impl Channel for ScriptChannel {
        fn name(&self) -> &'static str {
            "api"
        }

        fn verify(&self, request: &WebhookRequest<'_>) -> Result<(), ChannelError> {
            if request.body == b"forged" {
                return Err(ChannelError::Unauthorized);
            }
            Ok(())
        }

        fn parse(&self, request: &WebhookRequest<'_>) -> Result<Parsed, ChannelError> {
            Ok(match request.body {
                b"slash" => Parsed::EventsWithReply {
                    events: vec![event("c", "s1", "hello")],
                    reply: json!({"response_type": "ephemeral", "text": "working on it"}),
                },
                b"events" => Parsed::Events(vec![event("c", "e1", "one"), event("c", "e2", "two")]),
                b"challenge" => Parsed::Reply(json!({"challenge": "c1"})),
                b"ignore" => Parsed::Ignore,
                b"early" => return Err(ChannelError::Transient("who is the bot?".to_owned())),
                _ => return Err(ChannelError::Malformed("not a script".to_owned())),
            })
        }

        async fn send(&self, _: &OutboundMessage, _: Part<'_>) -> Result<Receipt, ChannelError> {
            Err(ChannelError::Unsupported)
        }
    }

    async fn call(ingress: &Ingress, body: &str) -> (StatusCode, String) {
        let response = match respond(
            ingress,
            &ScriptChannel,
            "",
            &HeaderMap::new(),
            body.as_bytes(),
        )
        .await
        {
            Ok(response) => response,
            Err(e) => e.into_response(),
        };
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn events_with_a_reply_are_stored_before_the_reply_is_given() {
        let h = harness(3);
        let (status, body) = call(&h.ingress, "slash").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
            json!({"response_type": "ephemeral", "text": "working on it"})
        );
        // The event was accepted before the reply: a redelivery is recognised.
        let again = h
            .ingress
            .accept(event("c", "s1", "hello"), false)
            .await
            .unwrap();
        assert!(!again.new, "the slash command's event was stored");
        h.until_sent(1).await;
        assert_eq!(h.sent(), ["echo: hello"]);
    }

    #[test]
    fn a_webhooks_401_names_the_platforms_secret_not_a_bearer_token() {
        for (channel, names) in [
            ("telegram", "channels.telegram.webhook_secret"),
            ("slack", "channels.slack.signing_secret"),
            ("discord", "channels.discord.public_key"),
            ("feishu", "channels.feishu.encrypt_key"),
        ] {
            let ApiError::WebhookUnauthorized(message) =
                rejected(channel, ChannelError::Unauthorized)
            else {
                panic!("{channel}: a webhook's own 401")
            };
            assert!(message.contains(names), "{channel}: {message}");
            assert!(!message.contains("bearer"), "{channel}: {message}");
        }
        let response = rejected("slack", ChannelError::Unauthorized).into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert!(
            response.headers().get("www-authenticate").is_none(),
            "a webhook is signed, not bearer-authenticated"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_kind_of_parse_gets_its_answer() {
        let h = harness(3);
        let (status, body) = call(&h.ingress, "events").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
        let (status, body) = call(&h.ingress, "challenge").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, r#"{"challenge":"c1"}"#)
        );
        let (status, body) = call(&h.ingress, "ignore").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
        let (status, _) = call(&h.ingress, "forged").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, body) = call(&h.ingress, "early").await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "delivered again later"
        );
        assert!(body.contains("not_ready"), "{body}");
        let (status, body) = call(&h.ingress, "bad").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.contains("not a script"), "{body}");
        h.until_sent(2).await;
        assert_eq!(h.sent(), ["echo: one", "echo: two"]);
    }

    /// A channel that refuses at once (as Discord does): its command is `slash`.
    #[derive(Debug)]
    struct RefusingChannel;

    #[async_trait::async_trait]
    impl Channel for RefusingChannel {
        fn name(&self) -> &'static str {
            "api"
        }

        fn verify(&self, _: &WebhookRequest<'_>) -> Result<(), ChannelError> {
            Ok(())
        }

        fn parse(&self, request: &WebhookRequest<'_>) -> Result<Parsed, ChannelError> {
            let mut event = event("c", "r1", "hello");
            event.user.id = String::from_utf8_lossy(request.body).into_owned();
            Ok(Parsed::EventsWithReply {
                events: vec![event],
                reply: json!({"type": 5}),
            })
        }

        fn refusal_reply(&self, text: &str) -> Option<serde_json::Value> {
            Some(json!({"type": 4, "data": {"content": text, "flags": 64}}))
        }

        async fn send(&self, _: &OutboundMessage, _: Part<'_>) -> Result<Receipt, ChannelError> {
            Err(ChannelError::Unsupported)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_channel_that_refuses_at_once_stores_nothing_for_a_refused_author() {
        use crate::ingress::access::{Access, AccessRules};

        let allowed = ["ada".to_owned()];
        let h = crate::ingress::tests::harness_with(
            3,
            Access::new([("api".to_owned(), AccessRules::new(&allowed, &[], &[]))]),
        );
        let call = |user: &'static str| {
            let ingress = h.ingress.clone();
            async move {
                let response = respond(
                    &ingress,
                    &RefusingChannel,
                    "",
                    &HeaderMap::new(),
                    user.as_bytes(),
                )
                .await
                .unwrap();
                let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
                    .await
                    .unwrap();
                serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
            }
        };
        // Refused every time (nothing remembered), with the refusal naming the user id.
        for _ in 0..2 {
            let reply = call("bob").await;
            assert_eq!(reply["type"], 4);
            assert_eq!(reply["data"]["flags"], 64);
            assert!(reply["data"]["content"].as_str().unwrap().contains("bob"));
        }
        // Nothing was stored: the same event from an allowed author is new and runs.
        assert_eq!(call("ada").await, json!({"type": 5}));
        h.until_sent(1).await;
        assert_eq!(h.sent(), ["echo: hello"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nothing_is_answered_with_the_reply_when_accepting_fails() {
        let h = harness(3);
        h.stop.cancel();
        let (status, body) = call(&h.ingress, "slash").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!body.contains("working on it"), "{body}");
    }
}
