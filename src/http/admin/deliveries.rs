//! The inbox and the outbox: what waits for a turn, what waits for delivery, with states,
//! attempts, the last error and the next retry. An operator retries a delivery now (one
//! given up on is queued again) or drops a stuck one after confirming. The outbox table
//! follows the store live (server-sent events, re-read every second, sent when it changed).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::Operator;
use super::page::{self, button, csrf_field, page, problem, respond, segment, store_problem};
use super::session::Session;
use super::threads::sse;
use crate::http::AppState;
use crate::store::{InboxStatus, OutboxItem, OutboxStatus, StoreError};

/// Outbox items shown, newest first.
const OUTBOX_SHOWN: usize = 100;
/// Inbox items shown, oldest first.
const INBOX_SHOWN: usize = 200;
/// How often the live outbox reads the store.
const LIVE_EVERY: Duration = Duration::from_secs(1);

/// `GET /admin/deliveries`
pub(super) async fn list(State(state): State<AppState>, Operator(session): Operator) -> Response {
    let (inbox, outbox) = match (
        state.store.inbox().await,
        state.store.outbox_recent(OUTBOX_SHOWN).await,
    ) {
        (Ok(inbox), Ok(outbox)) => (inbox, outbox),
        (Err(e), _) | (_, Err(e)) => return store_problem(&session, &e),
    };
    let body = html! {
        h2 { "Outbox" }
        p.muted { "The newest " (OUTBOX_SHOWN) " replies, any state; this table follows the store live." }
        div.scroll { table #outbox {
            thead { tr {
                th { "#" } th { "Conversation" } th { "State" } th { "Attempts" }
                th { "Last error" } th { "Created" } th { "Next retry" } th { "Trace" } th { "" }
            } }
            tbody #outbox-rows data-live="/admin/deliveries/live" {
                (outbox_rows(&state, &session, &outbox))
            }
        } }
        h2 { "Inbox" }
        @if inbox.is_empty() {
            p.muted { "Nothing waits for a turn." }
        } @else {
            div.scroll { table #inbox {
                thead { tr { th { "#" } th { "Conversation" } th { "Thread" } th { "State" } th { "Attempts" } th { "Accepted" } th { "Trace" } } }
                tbody {
                    @for item in inbox.iter().take(INBOX_SHOWN) {
                        tr {
                            td { (item.seq) }
                            td { (item.event.conversation.as_str()) }
                            td { a href={ "/admin/threads/" (segment(&item.thread_id)) } { (page::clip(&item.thread_id, 24)) } }
                            td { span.badge { (match item.status { InboxStatus::Pending => "pending", InboxStatus::Running => "running" }) } }
                            td { (item.attempts) }
                            td title=(page::time(item.accepted_at_ms)) { (page::ago(item.accepted_at_ms)) }
                            td { (page::trace(&item.trace.trace_hex(), state.admin.trace_url.as_deref())) }
                        }
                    }
                }
            } }
        }
    };
    respond(page("Inbox & outbox", Some(&session), body))
}

fn status_name(status: OutboxStatus) -> &'static str {
    match status {
        OutboxStatus::Pending => "pending",
        OutboxStatus::Sent => "sent",
        OutboxStatus::Failed => "failed",
    }
}

/// The outbox table's rows.
fn outbox_rows(state: &AppState, session: &Session, items: &[OutboxItem]) -> Markup {
    let delivery = &state.admin.delivery;
    html! {
        @if items.is_empty() {
            tr { td colspan="9" { span.muted { "Nothing was delivered yet." } } }
        }
        @for item in items {
            @let next = delivery.next_retry_ms(item.seq);
            tr data-seq=(item.seq) {
                td { (item.seq) }
                td { (item.message.conversation.as_str()) }
                td { span.badge.(status_name(item.status)) { (status_name(item.status)) } }
                td { (item.attempts) }
                td { (item.last_error.as_deref().map(|e| page::clip(e, 200)).unwrap_or_default()) }
                td title=(page::time(item.created_at_ms)) { (page::ago(item.created_at_ms)) }
                td { (next.map(page::time).unwrap_or_default()) }
                td { (page::trace(&item.trace.trace_hex(), state.admin.trace_url.as_deref())) }
                td {
                    @if item.status == OutboxStatus::Failed || next.is_some() {
                        (button(session, &format!("/admin/outbox/{}/retry", item.seq), "Retry now", "primary"))
                    }
                    @if item.status == OutboxStatus::Pending {
                        " " a.drop href={ "/admin/outbox/" (item.seq) "/drop" } { "Drop…" }
                    }
                }
            }
        }
    }
}

fn missing(session: &Session, seq: u64) -> Response {
    problem(
        StatusCode::NOT_FOUND,
        Some(session),
        &format!("there is no outbox item {seq}"),
    )
}

/// `GET /admin/deliveries/live`: the outbox rows whenever they change.
pub(super) async fn live(State(state): State<AppState>, Operator(session): Operator) -> Response {
    let Ok(permit) = std::sync::Arc::clone(&state.streams).try_acquire_owned() else {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(&session),
            "too many open streams; retry later",
        );
    };
    let stream = futures_util::stream::unfold(
        (state, session, String::new(), permit),
        |(state, session, last, permit)| async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(LIVE_EVERY) => {}
                    () = state.stop.cancelled() => return None,
                }
                let Ok(items) = state.store.outbox_recent(OUTBOX_SHOWN).await else {
                    continue;
                };
                let rows = outbox_rows(&state, &session, &items).into_string();
                if rows != last {
                    let data = serde_json::json!({ "html": rows }).to_string();
                    let event: Result<Event, Infallible> =
                        Ok(Event::default().event("outbox").data(data));
                    return Some((event, (state, session, rows, permit)));
                }
            }
        },
    );
    sse(stream)
}

/// `POST /admin/outbox/{seq}/retry`
pub(super) async fn retry(
    State(state): State<AppState>,
    Path(seq): Path<u64>,
    Operator(session): Operator,
) -> Response {
    // In a task of its own: a reply requeued is also queued, whether or not the browser
    // waits for the answer.
    let delivery = state.admin.delivery.clone();
    let retried = match tokio::spawn(async move { delivery.retry(seq).await }).await {
        Ok(retried) => retried,
        Err(e) => {
            return problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                Some(&session),
                &e.to_string(),
            );
        }
    };
    match retried {
        Ok(outcome) => {
            metrics::counter!("antler_admin_actions_total", "action" => "retry_delivery")
                .increment(1);
            tracing::info!(seq, ?outcome, "admin page: delivery retried");
            Redirect::to("/admin/deliveries").into_response()
        }
        Err(StoreError::Missing { .. }) => missing(&session, seq),
        Err(e) => store_problem(&session, &e),
    }
}

/// `GET /admin/outbox/{seq}/drop`: what dropping means, and the button that does it.
pub(super) async fn confirm_drop(
    State(state): State<AppState>,
    Path(seq): Path<u64>,
    Operator(session): Operator,
) -> Response {
    let item = match state.store.outbox_item(seq).await {
        Ok(Some(item)) => item,
        Ok(None) => return missing(&session, seq),
        Err(e) => return store_problem(&session, &e),
    };
    let body = html! {
        div.card {
            p { "Drop the reply " strong { (seq) } " to " (item.message.conversation.as_str()) "? It will not be sent; it stays in the outbox as failed (\"dropped by an operator\")." }
            pre.summary { (page::clip(&item.message.text, 600)) }
            form method="post" action={ "/admin/outbox/" (seq) "/drop" } {
                (csrf_field(&session))
                button.danger #confirm type="submit" { "Drop it" }
                " " a href="/admin/deliveries" { "Cancel" }
            }
        }
    };
    respond(page("Drop a delivery", Some(&session), body))
}

/// `POST /admin/outbox/{seq}/drop`
pub(super) async fn drop_item(
    State(state): State<AppState>,
    Path(seq): Path<u64>,
    Operator(session): Operator,
) -> Response {
    match state.admin.delivery.drop_item(seq).await {
        Ok(dropped) => {
            if dropped {
                metrics::counter!("antler_admin_actions_total", "action" => "drop_delivery")
                    .increment(1);
            }
            Redirect::to("/admin/deliveries").into_response()
        }
        Err(StoreError::Missing { .. }) => missing(&session, seq),
        Err(e) => store_problem(&session, &e),
    }
}
