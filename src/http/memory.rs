//! The memory API, for operators: read, replace and forget a user's long-term memory.
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/v1/memory?cursor=&limit=` | `{"users": [key, ...], "next_cursor": key or null}`, keys in order |
//! | `GET /api/v1/memory/{user_key}` | the document (DeerFlow's camelCase JSON); 404 when there is none |
//! | `PUT /api/v1/memory/{user_key}` | replaces the document with the body, validated; answers it |
//! | `DELETE /api/v1/memory/{user_key}` | forgets the user: the document and their queued updates |
//! | `DELETE /api/v1/memory/{user_key}/facts/{fact_id}` | forgets one fact; answers it; 404 when unknown |
//!
//! Admin only: a user's token gets 403 (a user sees their own memory with `/memory` in chat),
//! no or a wrong token 401. A token-less API (loopback only) lets every caller in, as it does
//! for every conversation's threads: whoever can reach it is the operator.
//!
//! `user_key` is `<channel>:<user id>` or `person:<name>` (`[[memory.identities]]`),
//! percent-encoded in the path (`telegram%3A42` or `telegram:42`), at most
//! [`edit::MAX_USER_KEY_CHARS`] characters. Writes go through [`Store::update_memory`] and
//! [`Store::clear_memory`], so they never interleave with the updater's.
//!
//! [`Store::update_memory`]: crate::store::Store::update_memory
//! [`Store::clear_memory`]: crate::store::Store::clear_memory

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::api::read_body;
use super::error::ApiError;
use super::extract::{Admin, AdminApi, ApiPath, ApiQuery};
use crate::agent::memory::MemoryDocument;
use crate::memory::edit;

/// Keys listed per page unless `limit` says otherwise, and at most.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1_000;

/// `?cursor=&limit=` of the listing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Page {
    /// The last key of the previous page.
    cursor: Option<String>,
    limit: Option<usize>,
}

/// The memory API, admin only.
pub(crate) struct MemoryApi;

impl AdminApi for MemoryApi {
    const HINT: &'static str =
        "the memory API needs an admin token; users see their memory with /memory";
}

fn user_key(key: String) -> Result<String, ApiError> {
    edit::check_user_key(&key).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(key)
}

/// `GET /api/v1/memory`
pub(crate) async fn list(
    State(state): State<AppState>,
    _: Admin<MemoryApi>,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Response, ApiError> {
    let limit = page.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "`limit` must be between 1 and {MAX_PAGE}"
        )));
    }
    if let Some(cursor) = &page.cursor {
        edit::check_user_key(cursor)
            .map_err(|_| ApiError::BadRequest("`cursor` is not a user key".to_owned()))?;
    }
    let users = state
        .store
        .memory_keys(page.cursor.as_deref(), limit)
        .await?;
    let next_cursor = (users.len() == limit)
        .then(|| users.last().cloned())
        .flatten();
    Ok(Json(json!({ "users": users, "next_cursor": next_cursor })).into_response())
}

/// `GET /api/v1/memory/{user_key}`
pub(crate) async fn get(
    State(state): State<AppState>,
    _: Admin<MemoryApi>,
    ApiPath(key): ApiPath<String>,
) -> Result<Response, ApiError> {
    let key = user_key(key)?;
    match state.store.memory(&key).await? {
        Some(doc) => Ok(Json(doc).into_response()),
        None => Err(ApiError::NotFound(format!("no memory for `{key}`"))),
    }
}

/// `PUT /api/v1/memory/{user_key}`
pub(crate) async fn put(
    State(state): State<AppState>,
    _: Admin<MemoryApi>,
    ApiPath(key): ApiPath<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let key = user_key(key)?;
    let body = read_body(&state, "api", request).await?;
    let doc: MemoryDocument = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("the body is not a memory document: {e}")))?;
    edit::validate(&doc, state.memory_max_facts)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let stored = state
        .store
        .update_memory(&key, &mut |_| Some(doc.clone()))
        .await?;
    tracing::info!(
        facts = doc.facts.len(),
        "memory document replaced through the API"
    );
    Ok(Json(stored).into_response())
}

/// `DELETE /api/v1/memory/{user_key}`
pub(crate) async fn delete(
    State(state): State<AppState>,
    _: Admin<MemoryApi>,
    ApiPath(key): ApiPath<String>,
) -> Result<Response, ApiError> {
    let key = user_key(key)?;
    let cleared = state
        .store
        .clear_memory(&key, &state.memory_identities.names_of(&key))
        .await?;
    tracing::info!(
        document = cleared.document,
        queued_updates = cleared.updates,
        "memory cleared through the API"
    );
    Ok(Json(json!({
        "deleted": cleared.document,
        "dropped_updates": cleared.updates,
    }))
    .into_response())
}

/// `DELETE /api/v1/memory/{user_key}/facts/{fact_id}`
pub(crate) async fn delete_fact(
    State(state): State<AppState>,
    _: Admin<MemoryApi>,
    ApiPath((key, fact_id)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let key = user_key(key)?;
    let mut removed = None;
    state
        .store
        .update_memory(&key, &mut |doc| {
            let mut doc = doc?;
            removed = edit::forget_id(&mut doc, &fact_id);
            Some(doc)
        })
        .await?;
    match removed {
        Some(fact) => Ok(Json(json!({ "removed": fact })).into_response()),
        None => Err(ApiError::NotFound(format!(
            "no fact `{}` in the memory of `{key}`",
            fact_id.chars().take(128).collect::<String>()
        ))),
    }
}
