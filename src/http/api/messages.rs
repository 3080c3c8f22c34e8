//! `POST /api/v1/messages`: accept a message, then answer 202, the answer itself
//! (`"wait": true`) or an SSE stream of it (`"stream": true`), also for a resent `message_id`.

use super::*;

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
        // With replicas the turn may run on another one: its answer is read from the store.
        let stored = admission
            .seq
            .filter(|_| state.store.shared())
            .map(|seq| (state.clone(), seq));
        let stream = answer_stream(
            events,
            message_id,
            existing,
            stored,
            state.stop.clone(),
            permit,
        );
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
        None => {
            // With replicas the conversation may run on another one, whose events never
            // reach this one's subscribers: its answer is read from the store instead.
            let stored = admission.seq.filter(|_| state.store.shared());
            wait_for_answer(events, &message_id, &state, stored).await
        }
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

/// How often a `wait` looks in the store for an answer another replica produced.
const STORED_ANSWER_EVERY: Duration = Duration::from_millis(200);

/// The answer to `message_id`, from this replica's events or, with `stored` (its inbox
/// seq), from the store's replies; `None` after the wait limit or at shutdown.
async fn wait_for_answer(
    mut events: Subscription,
    message_id: &str,
    state: &AppState,
    stored: Option<u64>,
) -> Option<Reply> {
    let (stop, limit) = (&state.stop, state.wait_limit);
    let from_store = async {
        let Some(seq) = stored else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(STORED_ANSWER_EVERY).await;
            if let Ok(Some(reply)) = existing_reply(state, seq).await {
                return Some(reply);
            }
        }
    };
    let from_events = async {
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
    let wait = async {
        tokio::select! {
            answer = from_events => answer,
            answer = from_store => answer,
        }
    };
    tokio::select! {
        answer = tokio::time::timeout(limit, wait) => answer.ok().flatten(),
        () = stop.cancelled() => None,
    }
}

/// Where an answer stream is.
struct AnswerStream {
    events: Subscription,
    /// The answer when it was already there: sent as the only event.
    existing: Option<Reply>,
    /// Where to look for an answer another replica produced: the app and the inbox seq.
    stored: Option<(AppState, u64)>,
    finished: bool,
    _permit: OwnedSemaphorePermit,
}

/// Events of one message's answer, ending with its final reply (or at shutdown).
fn answer_stream(
    events: Subscription,
    message_id: String,
    existing: Option<Reply>,
    stored: Option<(AppState, u64)>,
    stop: CancellationToken,
    permit: OwnedSemaphorePermit,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let state = AnswerStream {
        events,
        existing,
        stored,
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
                let from_store = async {
                    match &state.stored {
                        Some((app, seq)) => {
                            tokio::time::sleep(STORED_ANSWER_EVERY).await;
                            existing_reply(app, *seq).await.ok().flatten()
                        }
                        None => std::future::pending().await,
                    }
                };
                let next = tokio::select! {
                    next = state.events.recv() => next,
                    stored = from_store => match stored {
                        Some((text, attachments)) => {
                            let event = ThreadEvent::Final {
                                in_reply_to: message_id,
                                text,
                                attachments,
                            };
                            state.finished = true;
                            return Some((Ok(sse_event(&event)), state));
                        }
                        None => continue,
                    },
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
