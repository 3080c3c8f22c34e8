//! The approvals API, for operators: the tool calls waiting for a person, and deciding them.
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/v1/approvals` | `{"approvals": [approval, ...]}`: every pending one, oldest first |
//! | `POST /api/v1/approvals/{id}` | body `{"decision": "approve"\|"deny", "reason"?}`: answers `{"approval": approval, "decided": true}`, or `"decided": false` with the earlier decision, which stands; 404 when unknown |
//!
//! An approval: `id`, `state`, `tool`, `arguments` (as shown in the chat, bounded),
//! `conversation`, `requester` (`<channel>:<user id>`), `created_at_ms`, `expires_at_ms`,
//! `decided_by`, `reason`. Admin only; the admin token decides as "an operator (admin API)",
//! whatever `approvals.approvers` names, like `/approve` from a chat admin.

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::api::read_body;
use super::error::ApiError;
use super::extract::{Admin, AdminApi, ApiPath};
use crate::agent::approvals::ApprovalRecord;
use crate::ingress::approvals::{DecideError, Decider};
use crate::store::Decided;

/// The approvals API, admin only.
pub(crate) struct ApprovalApi;

impl AdminApi for ApprovalApi {
    const HINT: &'static str = "the approvals API needs an admin token; approvers can use \
        /approve and /deny in chat";
}

/// The body of `POST /api/v1/approvals/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    decision: Choice,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Choice {
    Approve,
    Deny,
}

fn shown(record: &ApprovalRecord) -> serde_json::Value {
    json!({
        "id": record.id,
        "state": record.state.as_str(),
        "tool": record.tool,
        "arguments": record.arguments,
        "conversation": record.conversation,
        "requester": record.requester_key(),
        "created_at_ms": record.created_at_ms,
        "expires_at_ms": record.expires_at_ms,
        "decided_by": record.decided_by,
        "reason": record.reason,
    })
}

/// `GET /api/v1/approvals`
pub(crate) async fn list(
    State(state): State<AppState>,
    _: Admin<ApprovalApi>,
) -> Result<Response, ApiError> {
    let pending = state.approvals.pending(None).await?;
    let listed: Vec<serde_json::Value> = pending.iter().map(shown).collect();
    Ok(Json(json!({ "approvals": listed })).into_response())
}

/// `POST /api/v1/approvals/{id}`
pub(crate) async fn decide(
    State(state): State<AppState>,
    _: Admin<ApprovalApi>,
    ApiPath(id): ApiPath<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let body = read_body(&state, "api", request).await?;
    let Body { decision, reason } = serde_json::from_slice(&body).map_err(|e| {
        ApiError::BadRequest(format!(
            "the body must be {{\"decision\": \"approve\"|\"deny\", \"reason\"?}}: {e}"
        ))
    })?;
    let approve = matches!(decision, Choice::Approve);
    if approve && reason.is_some() {
        return Err(ApiError::BadRequest("`reason` is for deny only".to_owned()));
    }
    let operator = Decider {
        key: None,
        name: None,
        admin: true,
    };
    let decided = state
        .approvals
        .decide(
            &id.to_ascii_lowercase(),
            &operator,
            approve,
            reason.as_deref(),
        )
        .await
        .map_err(|e| match e {
            DecideError::NotFound(_) => ApiError::NotFound(e.to_string()),
            DecideError::NotApprover | DecideError::SelfApproval => {
                ApiError::Forbidden(e.to_string())
            }
            DecideError::Store(e) => e.into(),
        })?;
    let (record, now) = match decided {
        Decided::Now(record) => (record, true),
        Decided::Before(record) => (record, false),
    };
    Ok(Json(json!({ "approval": shown(&record), "decided": now })).into_response())
}
