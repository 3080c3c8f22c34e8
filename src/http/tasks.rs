//! The task API, for operators: inspect and cancel subagent tasks.
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/v1/tasks?thread={id}` | `{"tasks": [record, ...]}`: the thread's latest tasks (at most 50), newest first |
//! | `GET /api/v1/tasks/{id}` | the task's record (below); 404 when there is none |
//! | `POST /api/v1/tasks/{id}/cancel` | cancels a task that has not ended and answers its record; 409 when it had ended already |
//!
//! A record: `id`, `parent_thread_id`, `parent_turn`, `parent_call_id`, `subagent_type`,
//! `description`, `prompt`, `status` (`PENDING`, `RUNNING`, `COMPLETED`, `FAILED`,
//! `CANCELLED`, `TIMED_OUT`), `stop_reason`, `result`, `error`, `usage`, `trace_id`,
//! `created_at_ms`, `started_at_ms`, `finished_at_ms` and `duration_ms`.
//!
//! Admin only, as the memory API: a prompt and a result may hold anything of the
//! conversation that delegated them. Users see their conversation's tasks with `/tasks`.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::AppState;
use super::error::ApiError;
use super::extract::{Admin, AdminApi, ApiPath, ApiQuery};
use crate::agent::subagents::SubagentRecord;
use crate::agent::subagents::executor::CancelOutcome;

/// The longest task id accepted.
const MAX_ID_CHARS: usize = 64;

/// The task API, admin only.
pub(crate) struct TaskApi;

impl AdminApi for TaskApi {
    const HINT: &'static str =
        "the task API needs an admin token; users see their conversation's tasks with /tasks";
}

fn task_id(id: String) -> Result<String, ApiError> {
    let well_formed = id.starts_with("task_")
        && id.len() <= MAX_ID_CHARS
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !well_formed {
        return Err(ApiError::BadRequest(
            "a task id looks like `task_` followed by letters and digits".to_owned(),
        ));
    }
    Ok(id)
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("there is no task `{id}`"))
}

/// The record as the API shows it.
fn shown(record: &SubagentRecord) -> serde_json::Value {
    let mut body = serde_json::to_value(record).unwrap_or_default();
    if let Some(object) = body.as_object_mut() {
        object.insert(
            "duration_ms".to_owned(),
            record.duration_ms(crate::now_ms()).into(),
        );
    }
    body
}

/// The most tasks a listing holds.
const MAX_LISTED: usize = 50;

/// `?thread=` of the listing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ByThread {
    thread: String,
}

/// `GET /api/v1/tasks?thread={id}`
pub(crate) async fn list(
    State(state): State<AppState>,
    _: Admin<TaskApi>,
    ApiQuery(ByThread { thread }): ApiQuery<ByThread>,
) -> Result<Response, ApiError> {
    if thread.is_empty() || thread.len() > 256 {
        return Err(ApiError::BadRequest(
            "`thread` must be a thread id (1 to 256 characters)".to_owned(),
        ));
    }
    let records = state.store.thread_subagents(&thread, MAX_LISTED).await?;
    let tasks: Vec<serde_json::Value> = records.iter().map(shown).collect();
    Ok(Json(serde_json::json!({ "tasks": tasks })).into_response())
}

/// `GET /api/v1/tasks/{id}`
pub(crate) async fn get(
    State(state): State<AppState>,
    _: Admin<TaskApi>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let id = task_id(id)?;
    let record = state
        .store
        .subagent(&id)
        .await?
        .ok_or_else(|| not_found(&id))?;
    Ok(Json(shown(&record)).into_response())
}

/// `POST /api/v1/tasks/{id}/cancel`
pub(crate) async fn cancel(
    State(state): State<AppState>,
    _: Admin<TaskApi>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let id = task_id(id)?;
    let Some(executor) = &state.subagents else {
        // Subagents are off: nothing runs, so a stored task has ended (the start marks
        // the ones a restart interrupted).
        let record = state
            .store
            .subagent(&id)
            .await?
            .ok_or_else(|| not_found(&id))?;
        return Err(ended(&record));
    };
    // In a task of its own: the record written and the task stopped, whether or not the
    // client waits for the answer.
    let cancelling = executor.clone();
    let task = id.clone();
    let outcome = tokio::spawn(async move { cancelling.cancel(&task).await })
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    match outcome {
        CancelOutcome::Unknown => Err(not_found(&id)),
        CancelOutcome::AlreadyEnded(record) => Err(ended(&record)),
        CancelOutcome::Cancelled(record) => {
            tracing::info!(task = %id, "task cancelled through the API");
            Ok(Json(shown(&record)).into_response())
        }
    }
}

fn ended(record: &SubagentRecord) -> ApiError {
    ApiError::Conflict(format!(
        "task `{}` has already ended ({})",
        record.id,
        record.status.as_str()
    ))
}
