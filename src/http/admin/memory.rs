//! Users' long-term memory: who has one, each user's summaries and facts; an operator edits
//! a fact's text, forgets a fact, or forgets the user (after confirming). Every write goes
//! through [`crate::store::MemoryStore::update_memory`] or `clear_memory`, as the memory
//! API's do, so it never interleaves with the updater's, and the next turn's request sees it.

use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;
use time::format_description::well_known::Rfc3339;

use super::page::{self, button, csrf_field, page, problem, respond, segment, store_problem};
use super::session::Session;
use super::{FormFields, Operator};
use crate::http::AppState;
use crate::memory::edit;

/// Users per page of the listing.
const PAGE: usize = 100;

/// `?after=` of the listing.
#[derive(Debug, Deserialize)]
pub(super) struct After {
    after: Option<String>,
}

/// The page refusing `key` when it is not a user key.
fn bad_user_key(session: &Session, key: &str) -> Option<Response> {
    edit::check_user_key(key)
        .err()
        .map(|e| problem(StatusCode::BAD_REQUEST, Some(session), &e.to_string()))
}

fn to_user(key: &str) -> Response {
    Redirect::to(&format!("/admin/memory/{}", segment(key))).into_response()
}

/// `GET /admin/memory`
pub(super) async fn users(
    State(state): State<AppState>,
    Query(After { after }): Query<After>,
    Operator(session): Operator,
) -> Response {
    let after = after.filter(|a| edit::check_user_key(a).is_ok());
    let keys = match state.store.memory_keys(after.as_deref(), PAGE).await {
        Ok(keys) => keys,
        Err(e) => return store_problem(&session, &e),
    };
    let next = (keys.len() == PAGE).then(|| keys.last().cloned()).flatten();
    let body = html! {
        @if keys.is_empty() {
            p.muted { "Nobody has a memory yet." }
        } @else {
            ul #memory-users {
                @for key in &keys {
                    li { a href={ "/admin/memory/" (segment(key)) } { (key) } }
                }
            }
        }
        @if let Some(next) = next {
            p { a href={ "/admin/memory?after=" (segment(&next)) } { "Next page" } }
        }
    };
    respond(page("Memory", Some(&session), body))
}

/// `GET /admin/memory/{key}`
pub(super) async fn user(
    State(state): State<AppState>,
    Path(key): Path<String>,
    Operator(session): Operator,
) -> Response {
    if let Some(response) = bad_user_key(&session, &key) {
        return response;
    }
    let doc = match state.store.memory(&key).await {
        Ok(Some(doc)) => doc,
        Ok(None) => {
            return problem(
                StatusCode::NOT_FOUND,
                Some(&session),
                &format!("there is no memory for `{key}`"),
            );
        }
        Err(e) => return store_problem(&session, &e),
    };
    let base = format!("/admin/memory/{}", segment(&key));
    let summaries = [
        ("Work", &doc.user.work_context),
        ("Personal", &doc.user.personal_context),
        ("Top of mind", &doc.user.top_of_mind),
        ("Recent months", &doc.history.recent_months),
        ("Earlier", &doc.history.earlier_context),
        ("Long-term background", &doc.history.long_term_background),
    ];
    let body = html! {
        h2 { "Summaries" }
        div.grid {
            @for (label, summary) in summaries {
                @if !summary.summary.is_empty() {
                    div.card { div.muted { (label) } pre.summary { (summary.summary) } }
                }
            }
        }
        h2 { "Facts" }
        @if doc.facts.is_empty() {
            p.muted { "No facts." }
        } @else {
            div.scroll { table #facts {
                thead { tr { th { "Fact" } th { "Category" } th { "Confidence" } th { "Updated" } th { "" } } }
                tbody {
                    @for fact in &doc.facts {
                        tr data-fact=(fact.id) {
                            td {
                                form method="post" action={ (base) "/facts/" (segment(&fact.id)) } {
                                    (csrf_field(&session))
                                    textarea name="content" aria-label="fact" { (fact.content) }
                                    button.save type="submit" { "Save" }
                                }
                            }
                            td { (fact.category) }
                            td { (format!("{:.2}", fact.confidence)) }
                            td { (if fact.updated_at.is_empty() { &fact.created_at } else { &fact.updated_at }) }
                            td { (button(&session, &format!("{base}/facts/{}/forget", segment(&fact.id)), "Forget", "danger forget")) }
                        }
                    }
                }
            } }
        }
        p { a.danger href={ (base) "/forget" } { "Forget this user…" } }
    };
    respond(page(&format!("Memory of {key}"), Some(&session), body))
}

/// `POST /admin/memory/{key}/facts/{id}`: the fact's text is the form's `content`.
pub(super) async fn edit_fact(
    State(state): State<AppState>,
    Path((key, id)): Path<(String, String)>,
    Extension(form): Extension<FormFields>,
    Operator(session): Operator,
) -> Response {
    if let Some(response) = bad_user_key(&session, &key) {
        return response;
    }
    let content = form.get("content").unwrap_or_default().trim().to_owned();
    let stamp = time::OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_default();
    let max_facts = state.memory_max_facts;
    let mut outcome: Result<bool, String> = Ok(false);
    let written = state
        .store
        .update_memory(&key, &mut |doc| {
            let stored = doc?;
            let mut doc = stored.clone();
            let Some(fact) = doc.facts.iter_mut().find(|f| f.id == id) else {
                outcome = Ok(false);
                return Some(stored);
            };
            fact.content = content.clone();
            fact.updated_at = stamp.clone();
            match edit::validate(&doc, max_facts) {
                Ok(()) => {
                    outcome = Ok(true);
                    Some(doc)
                }
                Err(e) => {
                    // Refused: the stored document stays as it was.
                    outcome = Err(e.to_string());
                    Some(stored)
                }
            }
        })
        .await;
    match (written, outcome) {
        (Err(e), _) => store_problem(&session, &e),
        (Ok(_), Ok(true)) => {
            metrics::counter!("antler_admin_actions_total", "action" => "edit_fact").increment(1);
            tracing::info!("admin page: a memory fact edited");
            to_user(&key)
        }
        (Ok(_), Ok(false)) => problem(
            StatusCode::NOT_FOUND,
            Some(&session),
            "there is no such fact (anymore)",
        ),
        (Ok(_), Err(why)) => problem(StatusCode::BAD_REQUEST, Some(&session), &why),
    }
}

/// `POST /admin/memory/{key}/facts/{id}/forget`
pub(super) async fn forget_fact(
    State(state): State<AppState>,
    Path((key, id)): Path<(String, String)>,
    Operator(session): Operator,
) -> Response {
    if let Some(response) = bad_user_key(&session, &key) {
        return response;
    }
    let mut removed = None;
    let written = state
        .store
        .update_memory(&key, &mut |doc| {
            let mut doc = doc?;
            removed = edit::forget_id(&mut doc, &id);
            Some(doc)
        })
        .await;
    match (written, removed) {
        (Err(e), _) => store_problem(&session, &e),
        (Ok(_), Some(_)) => {
            metrics::counter!("antler_admin_actions_total", "action" => "forget_fact").increment(1);
            tracing::info!("admin page: a memory fact forgotten");
            to_user(&key)
        }
        (Ok(_), None) => problem(
            StatusCode::NOT_FOUND,
            Some(&session),
            "there is no such fact (anymore)",
        ),
    }
}

/// `GET /admin/memory/{key}/forget`: what forgetting the user means, and the button.
pub(super) async fn confirm_forget_user(
    Path(key): Path<String>,
    Operator(session): Operator,
) -> Response {
    if let Some(response) = bad_user_key(&session, &key) {
        return response;
    }
    let body = html! {
        div.card {
            p { "Forget everything antler remembers about " strong { (key) } "? The memory document and the updates still queued for it are deleted; this cannot be undone." }
            form method="post" action={ "/admin/memory/" (segment(&key)) "/forget" } {
                (csrf_field(&session))
                button.danger #confirm type="submit" { "Forget " (page::clip(&key, 60)) }
                " " a href={ "/admin/memory/" (segment(&key)) } { "Cancel" }
            }
        }
    };
    respond(page("Forget a user", Some(&session), body))
}

/// `POST /admin/memory/{key}/forget`
pub(super) async fn forget_user(
    State(state): State<AppState>,
    Path(key): Path<String>,
    Operator(session): Operator,
) -> Response {
    if let Some(response) = bad_user_key(&session, &key) {
        return response;
    }
    match state
        .store
        .clear_memory(&key, &state.memory_identities.names_of(&key))
        .await
    {
        Ok(cleared) => {
            metrics::counter!("antler_admin_actions_total", "action" => "forget_user").increment(1);
            tracing::info!(
                document = cleared.document,
                queued_updates = cleared.updates,
                "admin page: a user's memory forgotten"
            );
            Redirect::to("/admin/memory").into_response()
        }
        Err(e) => store_problem(&session, &e),
    }
}
