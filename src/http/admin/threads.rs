//! Conversations and their threads: the listing, a thread's messages (tool calls and their
//! results, failed turns marked), usage, title, presented files, subagent tasks, and the
//! draft of a turn running now, live.

use std::convert::Infallible;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use maud::{Markup, html};
use serde::Deserialize;
use tokio::sync::broadcast;

use super::page::{self, page, problem, respond, segment, store_problem};
use super::{Operator, operations};
use crate::agent::message::ChatMessage;
use crate::agent::middleware::thread_data::PresentedFiles;
use crate::agent::thread::ThreadState;
use crate::http::AppState;
use crate::http::api::file_response;

/// Conversations per page of the listing.
const PAGE: usize = 50;
/// The longest id accepted in a path.
const MAX_ID: usize = 256;
/// Characters of a tool's arguments or result shown (the rest is cut).
const MAX_SHOWN: usize = 4_000;

/// `?after=` of the listing.
#[derive(Debug, Deserialize)]
pub(super) struct After {
    after: Option<String>,
}

/// `GET /admin/conversations`
pub(super) async fn conversations(
    State(state): State<AppState>,
    Query(After { after }): Query<After>,
    Operator(session): Operator,
) -> Response {
    let after = after.filter(|a| !a.is_empty() && a.len() <= MAX_ID);
    let records = match state.store.conversations(after.as_deref(), PAGE).await {
        Ok(records) => records,
        Err(e) => return store_problem(&session, &e),
    };
    let next = (records.len() == PAGE)
        .then(|| records.last().map(|r| r.key.clone()))
        .flatten();
    let body = html! {
        @if records.is_empty() {
            p.muted { "No conversations yet." }
        } @else {
            div.scroll { table #conversations {
                thead { tr { th { "Conversation" } th { "Current thread" } th { "Started by" } th { "/new count" } } }
                tbody {
                    @for record in &records {
                        tr {
                            td { (record.key) }
                            td { a href={ "/admin/threads/" (segment(&record.thread_id)) } { (record.thread_id) } }
                            td { (record.user_id) }
                            td { (record.generation) }
                        }
                    }
                }
            } }
        }
        @if let Some(next) = next {
            p { a href={ "/admin/conversations?after=" (segment(&next)) } { "Next page" } }
        }
    };
    respond(page("Conversations", Some(&session), body))
}

/// `GET /admin/threads/{id}`
pub(super) async fn thread(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Operator(session): Operator,
) -> Response {
    let thread = match read_thread(&state, &id).await {
        Ok(thread) => thread,
        Err(response) => return response,
    };
    let tasks = state
        .store
        .thread_subagents(&thread.id, 50)
        .await
        .unwrap_or_default();
    let title = thread
        .title
        .clone()
        .unwrap_or_else(|| "Untitled thread".to_owned());
    let body = html! {
        div.card {
            div { span.muted { "Thread " } code #thread-id { (thread.id) } }
            div { span.muted { "Conversation " } (thread.conversation) }
            @if let Some(id) = &thread.last_trace {
                div { span.muted { "Last turn's trace " } (page::trace(id, state.admin.trace_url.as_deref())) }
            }
            div #usage {
                span.muted { "Usage " }
                (thread.usage.prompt_tokens) " prompt + " (thread.usage.completion_tokens)
                " completion tokens over " (thread.turns) " turns"
            }
        }
        div.card {
            div { strong { "Live " } span #live-status.muted { "idle" } }
            div #live-draft data-live={ "/admin/threads/" (segment(&thread.id)) "/live" } {}
        }
        h2 { "Messages" }
        div.messages { (messages(&thread)) }
        h2 { "Files" }
        (files(&thread))
        h2 { "Subagent tasks" }
        (operations::task_table(&session, &tasks, state.admin.trace_url.as_deref()))
    };
    respond(page(&title, Some(&session), body))
}

/// The thread, or the page saying why not.
async fn read_thread(state: &AppState, id: &str) -> Result<ThreadState, Response> {
    if id.is_empty() || id.len() > MAX_ID {
        return Err(problem(StatusCode::BAD_REQUEST, None, "not a thread id"));
    }
    match state.store.thread(id).await {
        Ok(Some(thread)) => Ok(thread),
        Ok(None) => Err(problem(
            StatusCode::NOT_FOUND,
            None,
            &format!("there is no thread `{id}`"),
        )),
        Err(e) => Err(problem(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            &format!("the store does not answer: {e}"),
        )),
    }
}

/// The thread's messages, oldest first; system messages left out (they are the prompt).
fn messages(thread: &ThreadState) -> Markup {
    html! {
        @for (index, message) in thread.messages.iter().enumerate() {
            @let failed = thread.is_failed(index);
            @match message {
                ChatMessage::System { .. } => {},
                ChatMessage::User { content, .. } => {
                    div.message.user.failed[failed] {
                        div.role { "user" @if failed { " · failed turn" } }
                        pre { (content) }
                    }
                },
                ChatMessage::Assistant { content, tool_calls, .. } => {
                    div.message.assistant.failed[failed] {
                        div.role { "assistant" @if failed { " · failed turn" } }
                        @if !content.is_empty() { pre { (content) } }
                        @for call in tool_calls {
                            div.tool-call data-call=(call.id) {
                                span.muted { "calls " } strong.tool-name { (call.name) }
                                pre { (page::clip(&call.arguments, MAX_SHOWN)) }
                            }
                        }
                    }
                },
                ChatMessage::Tool { tool_call_id, content } => {
                    div.message.tool.failed[failed] data-result-of=(tool_call_id) {
                        div.role { "tool result" }
                        pre.tool-result { (page::clip(content, MAX_SHOWN)) }
                    }
                }
            }
        }
    }
}

/// The files the agent presented in the thread, with download links.
fn files(thread: &ThreadState) -> Markup {
    let presented = thread
        .extensions
        .get::<PresentedFiles>()
        .unwrap_or_default();
    let files: Vec<_> = presented
        .entries
        .iter()
        .flat_map(|entry| entry.files.iter())
        .collect();
    html! {
        @if files.is_empty() {
            p.muted { "No files presented." }
        } @else {
            ul #files {
                @for file in files {
                    li {
                        a href={ "/admin/threads/" (segment(&thread.id)) "/files/" (file.name.split('/').map(segment).collect::<Vec<_>>().join("/")) } { (file.name) }
                        " " span.muted { (file.media_type) ", " (crate::units::human_size(file.size)) }
                    }
                }
            }
        }
    }
}

/// `GET /admin/threads/{id}/files/{*name}`: a presented file, as the API serves it.
pub(super) async fn file(
    State(state): State<AppState>,
    Path((id, name)): Path<(String, String)>,
) -> Response {
    if let Err(response) = read_thread(&state, &id).await {
        return response;
    }
    match file_response(&state, &id, &name).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// `GET /admin/threads/{id}/live`: the thread's events (`delta`, `tool`, `final`) as
/// server-sent events, JSON each, until the client goes away or antler stops.
pub(super) async fn live(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    if let Err(response) = read_thread(&state, &id).await {
        return response;
    }
    let Ok(permit) = std::sync::Arc::clone(&state.streams).try_acquire_owned() else {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            "too many open streams; retry later",
        );
    };
    let events = state.hub.subscribe(&id);
    let stop = state.stop.clone();
    let stream = futures_util::stream::unfold((events, permit), move |(mut events, permit)| {
        let stop = stop.clone();
        async move {
            loop {
                let next = tokio::select! {
                    next = events.recv() => next,
                    () = stop.cancelled() => return None,
                };
                match next {
                    Ok(event) => {
                        let data = serde_json::to_string(&event).unwrap_or_default();
                        let sse: Result<Event, Infallible> =
                            Ok(Event::default().event(event.name()).data(data));
                        return Some((sse, (events, permit)));
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    });
    sse(stream)
}

/// A stream as server-sent events, kept alive.
pub(super) fn sse(
    stream: impl Stream<Item = Result<Event, Infallible>> + Send + 'static,
) -> Response {
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
