//! The rest of what an operator watches and steers: subagent tasks (cancel), approvals
//! waiting for a person (approve, deny), schedules, skills (switch on and off), each
//! platform's health and the configuration with its secrets masked.

use std::collections::BTreeMap;

use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::page::{self, button, page, problem, respond, segment, store_problem};
use super::session::Session;
use super::{FormFields, Operator};
use crate::agent::subagents::SubagentRecord;
use crate::agent::subagents::executor::CancelOutcome;
use crate::health::ChannelState;
use crate::http::AppState;
use crate::ingress::approvals::{DecideError, Decider};

/// Each platform channel's health as a table.
pub(super) fn channel_table(channels: &BTreeMap<String, ChannelState>) -> Markup {
    let at = |ms: Option<u64>| ms.map_or_else(|| "—".to_owned(), page::ago);
    html! {
        @if channels.is_empty() {
            p.muted { "No platform channel is enabled (the API only)." }
        } @else {
            div.scroll { table #channels {
                thead { tr { th { "Channel" } th { "Connection" } th { "Healthy" } th { "Last message in" } th { "Last answer out" } th { "Last error" } } }
                tbody {
                    @for (name, channel) in channels {
                        tr {
                            td { (name) }
                            td { span.badge.(channel.state) { (channel.state) } }
                            td {
                                @if channel.ok { span.ok { "yes" } }
                                @else { span.error { "no: " (channel.refused.as_deref().unwrap_or("refused")) } }
                            }
                            td { (at(channel.last_received_at_ms)) }
                            td { (at(channel.last_delivered_at_ms)) }
                            td {
                                @if let Some(error) = &channel.last_error {
                                    (page::clip(error, 300)) " " span.muted { "(" (at(channel.last_error_at_ms)) ")" }
                                }
                            }
                        }
                    }
                }
            } }
        }
    }
}

/// A thread's subagent tasks, with a cancel button on those still running.
pub(super) fn task_table(
    session: &Session,
    tasks: &[SubagentRecord],
    trace_url: Option<&str>,
) -> Markup {
    html! {
        @if tasks.is_empty() {
            p.muted { "No subagent tasks." }
        } @else {
            div.scroll { table #tasks {
                thead { tr { th { "Task" } th { "Type" } th { "What" } th { "State" } th { "Trace" } th { "" } } }
                tbody {
                    @for task in tasks {
                        tr {
                            td { code { (task.id) } }
                            td { (task.subagent_type) }
                            td { (page::clip(&task.description, 200)) }
                            td { span.badge.(task.status.as_str().to_ascii_lowercase()) { (task.status.as_str()) } }
                            td { (page::trace(&task.trace_id, trace_url)) }
                            td {
                                @if !task.status.is_terminal() {
                                    (button(session, &format!("/admin/tasks/{}/cancel", segment(&task.id)), "Cancel", "danger"))
                                }
                            }
                        }
                    }
                }
            } }
        }
    }
}

/// `POST /admin/tasks/{id}/cancel`
pub(super) async fn cancel_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Operator(session): Operator,
) -> Response {
    let Some(executor) = state.subagents.clone() else {
        return problem(
            StatusCode::CONFLICT,
            Some(&session),
            "subagents are off: no task is running",
        );
    };
    if id.len() > 64 {
        return problem(StatusCode::BAD_REQUEST, Some(&session), "not a task id");
    }
    // In a task of its own, as the API does: the record written and the task stopped,
    // whether or not the browser waits.
    let task = id.clone();
    let outcome = tokio::spawn(async move { executor.cancel(&task).await }).await;
    match outcome {
        Ok(Ok(CancelOutcome::Cancelled(record))) => {
            metrics::counter!("antler_admin_actions_total", "action" => "cancel_task").increment(1);
            tracing::info!(task = %id, "admin page: task cancelled");
            Redirect::to(&format!(
                "/admin/threads/{}",
                segment(&record.parent_thread_id)
            ))
            .into_response()
        }
        Ok(Ok(CancelOutcome::AlreadyEnded(record))) => problem(
            StatusCode::CONFLICT,
            Some(&session),
            &format!(
                "task `{}` has already ended ({})",
                record.id,
                record.status.as_str()
            ),
        ),
        Ok(Ok(CancelOutcome::Unknown)) => problem(
            StatusCode::NOT_FOUND,
            Some(&session),
            &format!("there is no task `{id}`"),
        ),
        Ok(Err(e)) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(&session),
            &e.to_string(),
        ),
        Err(e) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            Some(&session),
            &e.to_string(),
        ),
    }
}

/// `GET /admin/approvals`: approvals waiting, and the schedules.
pub(super) async fn approvals(
    State(state): State<AppState>,
    Operator(session): Operator,
) -> Response {
    let pending = match state.approvals.pending(None).await {
        Ok(pending) => pending,
        Err(e) => return store_problem(&session, &e),
    };
    let schedules = match state.store.schedules().await {
        Ok(schedules) => schedules,
        Err(e) => return store_problem(&session, &e),
    };
    let marks = state.store.schedule_marks().await.unwrap_or_default();
    let body = html! {
        h2 { "Approvals waiting" }
        @if pending.is_empty() {
            p.muted { "No tool call waits for a person." }
        } @else {
            div.scroll { table #approvals {
                thead { tr { th { "Id" } th { "Tool" } th { "Arguments" } th { "Conversation" } th { "Asked by" } th { "Expires" } th { "" } } }
                tbody {
                    @for approval in &pending {
                        tr {
                            td { code { (approval.id) } }
                            td { (approval.tool) }
                            td { pre.summary { (page::clip(&approval.arguments, 600)) } }
                            td { (approval.conversation) }
                            td { (approval.requester_key()) }
                            td { (page::time(approval.expires_at_ms)) }
                            td {
                                form.inline method="post" action={ "/admin/approvals/" (segment(&approval.id)) } {
                                    (super::page::csrf_field(&session))
                                    button.primary type="submit" name="decision" value="approve" { "Approve" }
                                    " "
                                    button.danger type="submit" name="decision" value="deny" { "Deny" }
                                }
                            }
                        }
                    }
                }
            } }
        }
        h2 { "Schedules" }
        @if schedules.is_empty() {
            p.muted { "No schedules." }
        } @else {
            div.scroll { table #schedules {
                thead { tr { th { "Name" } th { "When" } th { "Conversation" } th { "Prompt" } th { "Made by" } th { "Last fired" } } }
                tbody {
                    @for schedule in &schedules {
                        tr {
                            td { (schedule.name) }
                            td { (schedule.when) " " span.muted { "(" (schedule.timezone) ")" } }
                            td { (schedule.conversation) }
                            td { (page::clip(&schedule.prompt, 200)) }
                            td { (schedule.created_by) }
                            td { (marks.get(&schedule.name).map_or_else(|| "never".to_owned(), |ms| page::time(*ms))) }
                        }
                    }
                }
            } }
        }
    };
    respond(page("Approvals & schedules", Some(&session), body))
}

/// `POST /admin/approvals/{id}`: the form's `decision` is `approve` or `deny`.
pub(super) async fn decide(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Extension(form): Extension<FormFields>,
    Operator(session): Operator,
) -> Response {
    let approve = match form.get("decision") {
        Some("approve") => true,
        Some("deny") => false,
        _ => {
            return problem(
                StatusCode::BAD_REQUEST,
                Some(&session),
                "the decision is approve or deny",
            );
        }
    };
    let operator = Decider {
        key: None,
        name: None,
        admin: true,
    };
    match state
        .approvals
        .decide(&id.to_ascii_lowercase(), &operator, approve, None)
        .await
    {
        Ok(_) => {
            metrics::counter!("antler_admin_actions_total", "action" => "decide_approval")
                .increment(1);
            Redirect::to("/admin/approvals").into_response()
        }
        Err(DecideError::NotFound(_)) => problem(
            StatusCode::NOT_FOUND,
            Some(&session),
            &format!("there is no approval `{id}`"),
        ),
        Err(DecideError::Store(e)) => store_problem(&session, &e),
        Err(e) => problem(StatusCode::FORBIDDEN, Some(&session), &e.to_string()),
    }
}

/// `GET /admin/skills`
pub(super) async fn skills(State(state): State<AppState>, Operator(session): Operator) -> Response {
    let switches = match state.store.skill_switches().await {
        Ok(switches) => switches,
        Err(e) => return store_problem(&session, &e),
    };
    let catalogue = state.skills.current();
    let body = html! {
        @if catalogue.skills.is_empty() {
            p.muted { "No skills were found." }
        } @else {
            div.scroll { table #skills {
                thead { tr { th { "Skill" } th { "What it does" } th { "Enabled" } } }
                tbody {
                    @for skill in catalogue.skills.values() {
                        tr {
                            td { (skill.name) }
                            td { (page::clip(&skill.description, 300)) }
                            td { (if switches.get(&skill.name).copied().unwrap_or(true) { "yes" } else { "no" }) }
                        }
                    }
                }
            } }
        }
        p.muted { "Switch skills with /skills enable and /skills disable in chat, or PUT /api/v1/skills/{name}." }
    };
    respond(page("Skills", Some(&session), body))
}

/// `GET /admin/status`: platforms, model, MCP servers, the shell, the store, the config.
pub(super) async fn status(State(state): State<AppState>, Operator(session): Operator) -> Response {
    let channels = state.ingress.health().snapshot();
    let model = state.model_health.snapshot();
    let stats = state.store.stats().await;
    let pretty =
        |value: serde_json::Value| serde_json::to_string_pretty(&value).unwrap_or_default();
    let body = html! {
        h2 { "Platforms" }
        (channel_table(&channels))
        h2 { "Model" }
        div.card {
            @if !state.model_configured {
                p.error { "No model is configured." }
            } @else if let Some(health) = &model {
                p {
                    @if health.reachable { span.ok { "reachable" } } @else { span.error { "not reachable" } }
                    " " span.muted { "(checked " (page::ago(health.at_ms)) ")" }
                }
                pre.summary { (health.detail) }
            } @else {
                p.muted { "Not checked yet." }
            }
        }
        h2 { "Store" }
        div.card {
            @match &stats {
                Ok(stats) => p {
                    (stats.inbox) " in the inbox, " (stats.outbox_pending) " replies pending, "
                    (crate::units::human_size(stats.disk_bytes)) " on disk"
                },
                Err(e) => p.error { "The store does not answer: " (e) },
            }
        }
        h2 { "MCP servers and the shell" }
        pre.summary { (pretty(serde_json::json!({ "mcp": state.mcp, "shell": state.shell.now() }))) }
        h2 { "Configuration" }
        p.muted { "As loaded at start; secrets are masked." }
        pre.summary #config { (state.admin.config_summary) }
    };
    respond(page("Health & config", Some(&session), body))
}
