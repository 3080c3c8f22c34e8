//! The pairing API, for operators (and `antler pairing`, which talks to a running serve
//! through it: the store admits one process at a time).
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/v1/pairing` | `{"pending": [{"channel", "user_id", "name"?, "code", "expires_in_secs"}, ...]}`, oldest first |
//! | `POST /api/v1/pairing/approve` | body `{"code", "admin"?: bool}`: the user may talk at once; answers `{"approved": {"channel", "user_id", "admin"}}` |
//! | `POST /api/v1/pairing/deny` | body `{"code"}`: the code is gone; answers `{"denied": {"channel", "user_id"}}` |
//!
//! A code no pending request has (never issued, expired, denied or used) is a 404, the same
//! for each. Admin only: a user's token gets 403, no or a wrong token 401.

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::api::read_body;
use super::error::ApiError;
use super::extract::{Admin, AdminApi};
use crate::ingress::pairing::PairingError;

/// The pairing API, admin only.
pub(crate) struct PairingApi;

impl AdminApi for PairingApi {
    const HINT: &'static str = "the pairing API needs an admin token";
}

/// The body of approve and deny.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Decision {
    code: String,
    #[serde(default)]
    admin: bool,
}

impl From<PairingError> for ApiError {
    fn from(e: PairingError) -> Self {
        match e {
            PairingError::UnknownCode => Self::NotFound(e.to_string()),
            PairingError::Store(e) => e.into(),
        }
    }
}

async fn decision(state: &AppState, request: Request) -> Result<Decision, ApiError> {
    let body = read_body(state, "api", request).await?;
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("the body is not {{\"code\", \"admin\"?}}: {e}")))
}

/// `GET /api/v1/pairing`
pub(crate) async fn list(
    State(state): State<AppState>,
    _: Admin<PairingApi>,
) -> Result<Response, ApiError> {
    let pending = state.pairing.list().await?;
    Ok(Json(json!({ "pending": pending })).into_response())
}

/// `POST /api/v1/pairing/approve`
pub(crate) async fn approve(
    State(state): State<AppState>,
    _: Admin<PairingApi>,
    request: Request,
) -> Result<Response, ApiError> {
    let decision = decision(&state, request).await?;
    let user = state
        .pairing
        .approve(&decision.code, decision.admin)
        .await?;
    Ok(Json(json!({
        "approved": {"channel": user.channel, "user_id": user.user_id, "admin": user.admin}
    }))
    .into_response())
}

/// `POST /api/v1/pairing/deny`
pub(crate) async fn deny(
    State(state): State<AppState>,
    _: Admin<PairingApi>,
    request: Request,
) -> Result<Response, ApiError> {
    let decision = decision(&state, request).await?;
    if decision.admin {
        return Err(ApiError::BadRequest(
            "`admin` is for approve only".to_owned(),
        ));
    }
    let denied = state.pairing.deny(&decision.code).await?;
    Ok(Json(json!({
        "denied": {"channel": denied.channel, "user_id": denied.user_id}
    }))
    .into_response())
}
