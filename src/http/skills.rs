//! The skills API, for operators: the skills antler found, and switching them.
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/v1/skills` | `{"skills": [skill, ...], "invalid": [{"file", "reason"}, ...]}`, skills by name |
//! | `PUT /api/v1/skills/{name}` | body `{"enabled": true\|false}`: switches the skill for the deployment from the next request on; answers the skill; 404 when unknown |
//!
//! A skill: `name`, `description`, `enabled`, `allowed_tools` (null: no restriction),
//! `license`. Admin only, as `/skills enable` and `/skills disable` in chat (which list the
//! same skills to everyone).

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::api::read_body;
use super::error::ApiError;
use super::extract::{Admin, AdminApi, ApiPath};
use crate::agent::skills::{self, Skill};

/// The skills API, admin only.
pub(crate) struct SkillApi;

impl AdminApi for SkillApi {
    const HINT: &'static str =
        "the skills API needs an admin token; anyone can list the skills with /skills in chat";
}

/// The body of `PUT /api/v1/skills/{name}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Switch {
    enabled: bool,
}

fn shown(skill: &Skill, enabled: bool) -> serde_json::Value {
    json!({
        "name": skill.name,
        "description": skill.description,
        "enabled": enabled,
        "allowed_tools": skill.allowed_tools,
        "license": skill.license,
    })
}

/// `GET /api/v1/skills`
pub(crate) async fn list(
    State(state): State<AppState>,
    _: Admin<SkillApi>,
) -> Result<Response, ApiError> {
    let switches = state.store.skill_switches().await?;
    let catalogue = state.skills.current();
    let listed: Vec<serde_json::Value> = catalogue
        .skills
        .values()
        .map(|skill| shown(skill, switches.get(&skill.name).copied().unwrap_or(true)))
        .collect();
    let invalid: Vec<serde_json::Value> = catalogue
        .invalid
        .iter()
        .map(|i| json!({"file": i.file.display().to_string(), "reason": i.reason}))
        .collect();
    Ok(Json(json!({ "skills": listed, "invalid": invalid })).into_response())
}

/// `PUT /api/v1/skills/{name}`
pub(crate) async fn put(
    State(state): State<AppState>,
    _: Admin<SkillApi>,
    ApiPath(name): ApiPath<String>,
    request: Request,
) -> Result<Response, ApiError> {
    if !skills::is_name(&name) {
        return Err(ApiError::BadRequest(
            "a skill name is lowercase letters, digits and single hyphens (at most 64)".to_owned(),
        ));
    }
    let Some(skill) = state.skills.current().get(&name).cloned() else {
        return Err(ApiError::NotFound(format!("there is no skill `{name}`")));
    };
    let body = read_body(&state, "api", request).await?;
    let Switch { enabled } = serde_json::from_slice(&body).map_err(|e| {
        ApiError::BadRequest(format!("the body must be {{\"enabled\": true|false}}: {e}"))
    })?;
    state.store.set_skill_switch(&skill.name, enabled).await?;
    tracing::info!(skill = %skill.name, enabled, "skill switched through the API");
    Ok(Json(shown(&skill, enabled)).into_response())
}
