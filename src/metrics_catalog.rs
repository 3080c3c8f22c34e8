//! Every metric antler emits, in one list: its type, unit, one-line help text and which of its
//! series exist from the start.
//!
//! The conventions (Prometheus's): a counter's name ends in `_total`; a name carries its unit
//! (`_seconds`, `_bytes`); durations and sizes are histograms with buckets, not summaries. The
//! recorder is built from this list ([`builder`], [`describe`]), so `/metrics` has a `# HELP` and
//! `# TYPE` line for every metric, one not yet written to included ([`render`]), and the series
//! whose labels are known at start are there at zero ([`register_at_zero`]): a rate or an alert
//! on them works from the first scrape. A test reads `src/` and `channels/*/src` for the
//! `metrics::counter!`, `gauge!` and `histogram!` names and checks each is in [`METRICS`].

use metrics::{KeyName, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// What a metric is, as Prometheus types it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    /// Rendered with these bucket upper bounds (and `+Inf`).
    Histogram(&'static [f64]),
}

impl Kind {
    /// Its name on the `# TYPE` line.
    fn type_name(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram(_) => "histogram",
        }
    }
}

/// Which of a metric's series are registered, at zero, at start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Series {
    /// The one series without labels.
    Plain,
    /// One series per value of the label.
    Each(&'static str, &'static [&'static str]),
    /// One series per channel antler serves (`channel`), the API's included.
    PerChannel,
    /// One series per enabled MCP server (`server`).
    PerMcpServer,
    /// One series per enabled MCP server (`server`) and value of the label.
    PerMcpServerAnd(&'static str, &'static [&'static str]),
    /// One series per middleware of the chain (`middleware`).
    PerMiddleware,
    /// Labels known only when it happens (a tool's name, a refusal's reason) or set by their
    /// owner at start (`antler_channel_healthy`): the first write adds the series.
    OnUse,
}

/// One metric antler emits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Metric {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) unit: Option<Unit>,
    /// One line, shown as `# HELP`.
    pub(crate) help: &'static str,
    pub(crate) series: Series,
}

/// Durations of turns and subagent tasks: 50 ms to 30 minutes.
const LONG_SECONDS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];
/// Durations of one model call in the background: 50 ms to 5 minutes.
const SHORT_SECONDS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];
/// Items written or read together: 1 to 1024.
const BATCH_SIZES: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];
/// Tokens of one model call: 100 to 200k.
const TOKENS: &[f64] = &[
    100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10_000.0, 25_000.0, 50_000.0, 100_000.0, 200_000.0,
];

/// What a turn ended as (`ingress::turn`): the run's ending, or why no run happened.
const TURN_OUTCOMES: &[&str] = &[
    "ok",
    "interrupted",
    "stopped",
    "failed",
    "timed_out",
    "panicked",
    "command",
    "unsupported",
    "refused",
    "pairing",
    "store_error",
    "abandoned",
    "approval_gone",
    "approval_late",
];
const RUN_ENDINGS: &[&str] = &["answered", "interrupted", "stopped", "failed", "timed_out"];
const MODEL_STATUSES: &[&str] = &[
    "ok",
    "auth",
    "404",
    "429",
    "4xx",
    "5xx",
    "unreachable",
    "timeout",
    "broken",
    "invalid",
];
const TOKEN_KINDS: &[&str] = &["prompt", "completion"];
const OK_FAILED: &[&str] = &["ok", "failed"];

const fn counter(name: &'static str, help: &'static str, series: Series) -> Metric {
    Metric {
        name,
        kind: Kind::Counter,
        unit: None,
        help,
        series,
    }
}

const fn gauge(name: &'static str, unit: Option<Unit>, help: &'static str) -> Metric {
    Metric {
        name,
        kind: Kind::Gauge,
        unit,
        help,
        series: Series::Plain,
    }
}

const fn histogram(
    name: &'static str,
    unit: Option<Unit>,
    buckets: &'static [f64],
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind: Kind::Histogram(buckets),
        unit,
        help,
        series: Series::Plain,
    }
}

/// Every metric antler emits, by area.
pub(crate) const METRICS: &[Metric] = &[
    // HTTP and webhooks.
    gauge(
        "antler_http_connections",
        None,
        "HTTP connections open now.",
    ),
    counter(
        "antler_http_accept_errors_total",
        "Connections the HTTP listener failed to accept.",
        Series::Plain,
    ),
    counter(
        "antler_webhooks_received_total",
        "Requests accepted on a channel's webhook or the API's messages endpoint.",
        Series::PerChannel,
    ),
    counter(
        "antler_webhooks_rejected_total",
        "Webhook and API requests refused, by channel and reason.",
        Series::OnUse,
    ),
    counter(
        "antler_admin_refused_total",
        "Admin page requests refused, by reason (host, csrf, token, signed_out, form, ...).",
        Series::OnUse,
    ),
    counter(
        "antler_admin_actions_total",
        "Changes made on the admin page, by action.",
        Series::Each(
            "action",
            &[
                "retry_delivery",
                "drop_delivery",
                "edit_fact",
                "forget_fact",
                "forget_user",
                "cancel_task",
                "decide_approval",
            ],
        ),
    ),
    counter(
        "antler_streams_refused_total",
        "SSE streams and waiting requests refused at server.max_streams.",
        Series::Plain,
    ),
    counter(
        "antler_file_downloads_total",
        "Thread files downloaded through the API.",
        Series::Plain,
    ),
    // Platform intake.
    // Set per platform channel by `health` when the channel is registered at start; a series
    // at 0 made up here would say "unhealthy".
    Metric {
        name: "antler_channel_healthy",
        kind: Kind::Gauge,
        unit: None,
        help: "1 while no refusal of the bot by the platform stands, else 0, per platform channel.",
        series: Series::OnUse,
    },
    counter(
        "antler_telegram_unreadable_updates_total",
        "Telegram updates that could not be read at all.",
        Series::Plain,
    ),
    counter(
        "antler_telegram_poll_errors_total",
        "Telegram getUpdates calls that failed.",
        Series::Plain,
    ),
    counter(
        "antler_telegram_poll_deferred_total",
        "Polled Telegram updates left for the next poll until the bot knows its identity.",
        Series::Plain,
    ),
    counter(
        "antler_slack_socket_errors_total",
        "Slack Socket Mode connections that failed.",
        Series::Plain,
    ),
    counter(
        "antler_slack_socket_envelopes_total",
        "Envelopes received over Slack Socket Mode.",
        Series::Plain,
    ),
    counter(
        "antler_feishu_socket_errors_total",
        "Feishu long connections that failed.",
        Series::Plain,
    ),
    counter(
        "antler_feishu_socket_refused_total",
        "Feishu long connections the platform refused for good (no more attempts).",
        Series::Plain,
    ),
    counter(
        "antler_feishu_socket_refused_events_total",
        "Feishu long-connection events that could not be accepted (Feishu sends them again).",
        Series::Plain,
    ),
    counter(
        "antler_feishu_socket_deferred_total",
        "Feishu long-connection events left unacknowledged to be delivered again.",
        Series::Plain,
    ),
    // Ingress.
    gauge(
        "antler_inbox_depth",
        None,
        "Items in the inbox waiting for a turn.",
    ),
    gauge(
        "antler_inbox_oldest_age_seconds",
        Some(Unit::Seconds),
        "How long the oldest inbox item has waited, read at scrape time.",
    ),
    histogram(
        "antler_accept_batch_size",
        Some(Unit::Count),
        BATCH_SIZES,
        "Messages accepted into the inbox in one store write.",
    ),
    counter(
        "antler_accept_panics_total",
        "Accept batches that panicked.",
        Series::Plain,
    ),
    counter(
        "antler_ingress_duplicates_total",
        "Messages recognised as already accepted.",
        Series::Plain,
    ),
    counter(
        "antler_ingress_overloaded_total",
        "Messages refused because the inbox backlog was at its limit.",
        Series::Plain,
    ),
    counter(
        "antler_access_refused_total",
        "Messages from authors the access rules refuse, by channel.",
        Series::PerChannel,
    ),
    counter(
        "antler_access_dropped_total",
        "Messages the access rules drop without an answer, by channel.",
        Series::PerChannel,
    ),
    counter(
        "antler_pairing_codes_total",
        "DM pairing codes issued.",
        Series::PerChannel,
    ),
    counter(
        "antler_button_presses_total",
        "Button presses received.",
        Series::PerChannel,
    ),
    counter(
        "antler_button_answers_failed_total",
        "Button presses whose answer to the platform failed.",
        Series::PerChannel,
    ),
    counter(
        "antler_chat_moves_total",
        "Chats that moved to a new id (a Telegram group becoming a supergroup).",
        Series::PerChannel,
    ),
    counter(
        "antler_adopted_items_total",
        "Inbox and outbox items adopted from conversations no live replica holds.",
        Series::Plain,
    ),
    counter(
        "antler_approvals_total",
        "Tool-call approvals, by state reached.",
        Series::Each(
            "state",
            &["requested", "approved", "denied", "expired", "withdrawn"],
        ),
    ),
    // Turns.
    counter(
        "antler_turns_total",
        "Turns finished, by outcome.",
        Series::Each("outcome", TURN_OUTCOMES),
    ),
    histogram(
        "antler_turn_duration_seconds",
        Some(Unit::Seconds),
        LONG_SECONDS,
        "How long a turn took, from start to its reply being queued.",
    ),
    histogram(
        "antler_finish_batch_size",
        Some(Unit::Count),
        BATCH_SIZES,
        "Finished turns written in one store write.",
    ),
    counter(
        "antler_turn_panics_total",
        "Turns that panicked.",
        Series::Plain,
    ),
    counter(
        "antler_lane_panics_total",
        "Lane items whose handling panicked (the lane goes on).",
        Series::Plain,
    ),
    counter(
        "antler_attachment_failures_total",
        "Message attachments that could not be fetched.",
        Series::Plain,
    ),
    // The agent run.
    counter(
        "antler_runs_total",
        "Agent runs finished, by ending.",
        Series::Each("ending", RUN_ENDINGS),
    ),
    counter(
        "antler_model_requests_total",
        "Model API requests, by status.",
        Series::Each("status", MODEL_STATUSES),
    ),
    counter(
        "antler_model_tokens_total",
        "Tokens the model API reported, by kind.",
        Series::Each("kind", TOKEN_KINDS),
    ),
    counter(
        "antler_tokens_total",
        "Tokens used by agent runs and helper calls, by kind.",
        Series::Each("kind", TOKEN_KINDS),
    ),
    counter(
        "antler_helper_model_calls_total",
        "Model calls made by middleware (titles, summaries, memory), by purpose and outcome.",
        Series::OnUse,
    ),
    counter(
        "antler_model_content_filtered_total",
        "Model answers stopped by the provider's content filter.",
        Series::Plain,
    ),
    counter(
        "antler_empty_answers_total",
        "Empty model answers, retried or reported.",
        Series::Each("action", &["retry", "reported"]),
    ),
    counter(
        "antler_run_continues_capped_total",
        "Runs ended because a hook asked to continue past the cap.",
        Series::Plain,
    ),
    counter(
        "antler_context_trimmed_messages_total",
        "Messages trimmed from the context to fit the model's window.",
        Series::Plain,
    ),
    counter(
        "antler_middleware_errors_total",
        "Middleware hooks that failed, by middleware.",
        Series::PerMiddleware,
    ),
    counter(
        "antler_summarizations_total",
        "Thread summarizations, by outcome.",
        Series::Each("outcome", &["summarized", "failed"]),
    ),
    counter(
        "antler_loop_detection_total",
        "Tool-call loops detected, by action taken.",
        Series::Each(
            "action",
            &["warn", "stop", "warn_frequency", "stop_frequency"],
        ),
    ),
    counter(
        "antler_guardrail_refusals_total",
        "Tool calls the guardrail refused, by tool.",
        Series::OnUse,
    ),
    counter(
        "antler_dangling_tool_call_repairs_total",
        "Tool-call pairings repaired in model requests (placeholders, orphans, moved results).",
        Series::Plain,
    ),
    counter(
        "antler_clarifications_total",
        "Questions the agent asked the user.",
        Series::Plain,
    ),
    counter(
        "antler_todo_reminders_total",
        "Reminders of the open todo list sent to the model.",
        Series::Plain,
    ),
    counter(
        "antler_presented_files_total",
        "Files the agent presented to the user.",
        Series::Plain,
    ),
    counter(
        "antler_tool_output_evicted_total",
        "Saved long tool outputs removed to keep the thread's quota.",
        Series::Plain,
    ),
    counter(
        "antler_tool_output_cut_total",
        "Tool outputs cut to the output budget (the full output saved to a file).",
        Series::Plain,
    ),
    counter(
        "antler_tool_timeouts_total",
        "Tool calls that timed out.",
        Series::Plain,
    ),
    // Shell, commands and MCP.
    counter(
        "antler_shell_commands_total",
        "Shell commands seen by the sandbox audit, by verdict.",
        Series::Each("verdict", &["pass", "warn", "block", "refused"]),
    ),
    counter(
        "antler_shell_audit_failures_total",
        "Shell commands refused because their audit record could not be written.",
        Series::Plain,
    ),
    counter(
        "antler_operator_commands_total",
        "Operator commands run, by command and outcome.",
        Series::OnUse,
    ),
    counter(
        "antler_command_audit_failures_total",
        "Operator commands refused because their audit record could not be written.",
        Series::Plain,
    ),
    counter(
        "antler_mcp_restarts_total",
        "MCP server restarts, by server and outcome.",
        Series::PerMcpServerAnd("outcome", OK_FAILED),
    ),
    counter(
        "antler_mcp_results_too_large_total",
        "MCP tool results refused for their size, by server.",
        Series::PerMcpServer,
    ),
    // Subagents.
    gauge(
        "antler_subagents_active",
        None,
        "Subagent tasks running now.",
    ),
    counter(
        "antler_subagents_total",
        "Subagent tasks finished, by status.",
        Series::Each("status", &["COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"]),
    ),
    histogram(
        "antler_subagent_duration_seconds",
        Some(Unit::Seconds),
        LONG_SECONDS,
        "How long a subagent task ran.",
    ),
    counter(
        "antler_subagent_calls_refused_total",
        "Subagent calls refused by the subagent limits.",
        Series::Plain,
    ),
    // Memory.
    counter(
        "antler_memory_updates_total",
        "Memory updates, by outcome.",
        Series::Each("outcome", &["processed", "superseded", "dropped", "failed"]),
    ),
    counter(
        "antler_memory_facts_dropped_total",
        "Facts the memory updater dropped, by reason.",
        Series::Each(
            "reason",
            &["scope", "durability", "authority", "unlabelled"],
        ),
    ),
    histogram(
        "antler_memory_updater_seconds",
        Some(Unit::Seconds),
        SHORT_SECONDS,
        "How long one memory update's model call took.",
    ),
    histogram(
        "antler_memory_updater_tokens",
        Some(Unit::Count),
        TOKENS,
        "Tokens one memory update's model call used.",
    ),
    // Delivery.
    counter(
        "antler_delivery_attempts_total",
        "Outbox delivery attempts, by channel.",
        Series::PerChannel,
    ),
    counter(
        "antler_delivery_failures_total",
        "Outbox delivery attempts that failed, by channel.",
        Series::PerChannel,
    ),
    counter(
        "antler_delivery_abandoned_total",
        "Outbox deliveries given up after their last attempt, by channel.",
        Series::PerChannel,
    ),
    counter(
        "antler_delivery_files_refused_total",
        "Reply files not sent because they changed after being presented.",
        Series::Plain,
    ),
    counter(
        "antler_delivery_files_skipped_total",
        "Reply files the platform refused for good, skipped.",
        Series::Plain,
    ),
    counter(
        "antler_draft_updates_total",
        "Streaming draft edits sent, by channel.",
        Series::PerChannel,
    ),
    counter(
        "antler_draft_failures_total",
        "Streaming draft edits that failed, by channel.",
        Series::PerChannel,
    ),
    // Schedules.
    counter(
        "antler_schedule_firings_total",
        "Schedule firings, by outcome.",
        Series::Each("outcome", &["fired", "skipped"]),
    ),
    // Store.
    counter(
        "antler_store_errors_total",
        "Store operations that failed, by whether they are retried.",
        Series::Each("retryable", &["true", "false"]),
    ),
    counter(
        "antler_store_flushes_total",
        "Group-commit flushes of the store.",
        Series::Plain,
    ),
    counter(
        "antler_store_flush_errors_total",
        "Group-commit flushes that failed.",
        Series::Plain,
    ),
    histogram(
        "antler_store_flush_batch_size",
        Some(Unit::Count),
        BATCH_SIZES,
        "Writes acknowledged by one group-commit flush.",
    ),
    counter(
        "antler_store_swept_total",
        "Expired store records removed by the sweeper.",
        Series::Plain,
    ),
];

/// A Prometheus recorder builder whose histograms are histograms, with each one's buckets.
pub(crate) fn builder() -> Result<PrometheusBuilder, BuildError> {
    METRICS
        .iter()
        .try_fold(PrometheusBuilder::new(), |builder, metric| {
            match metric.kind {
                Kind::Histogram(buckets) => {
                    builder.set_buckets_for_metric(Matcher::Full(metric.name.to_owned()), buckets)
                }
                Kind::Counter | Kind::Gauge => Ok(builder),
            }
        })
}

/// Gives `recorder` every metric's help text and unit.
pub(crate) fn describe(recorder: &dyn Recorder) {
    for metric in METRICS {
        let key = KeyName::from_const_str(metric.name);
        let help = SharedString::const_str(metric.help);
        match metric.kind {
            Kind::Counter => recorder.describe_counter(key, metric.unit, help),
            Kind::Gauge => recorder.describe_gauge(key, metric.unit, help),
            Kind::Histogram(_) => recorder.describe_histogram(key, metric.unit, help),
        }
    }
}

/// What a running antler has, for the series named after it.
#[derive(Debug, Default)]
pub(crate) struct Known<'a> {
    /// The channels it serves, the API's included.
    pub(crate) channels: Vec<&'a str>,
    /// Its enabled MCP servers.
    pub(crate) mcp_servers: Vec<&'a str>,
    /// Its middleware chain.
    pub(crate) middlewares: Vec<&'static str>,
}

/// Registers, in the global recorder, the series whose labels are known at start, at zero.
/// Registering leaves a series that exists as it is, so calling it again is harmless.
pub(crate) fn register_at_zero(known: &Known<'_>) {
    for metric in METRICS {
        let each = |label: &'static str, value: String| register(metric, &[(label, value)]);
        match metric.series {
            Series::Plain => register(metric, &[]),
            Series::Each(label, values) => {
                values.iter().for_each(|v| each(label, (*v).to_owned()));
            }
            Series::PerChannel => known
                .channels
                .iter()
                .for_each(|c| each("channel", (*c).to_owned())),
            Series::PerMcpServer => known
                .mcp_servers
                .iter()
                .for_each(|s| each("server", (*s).to_owned())),
            Series::PerMcpServerAnd(label, values) => {
                for server in &known.mcp_servers {
                    for value in values {
                        register(
                            metric,
                            &[
                                ("server", (*server).to_owned()),
                                (label, (*value).to_owned()),
                            ],
                        );
                    }
                }
            }
            Series::PerMiddleware => known
                .middlewares
                .iter()
                .for_each(|m| each("middleware", (*m).to_owned())),
            Series::OnUse => {}
        }
    }
}

/// Registers one series of `metric` without changing its value.
fn register(metric: &Metric, labels: &[(&'static str, String)]) {
    let labels: Vec<metrics::Label> = labels
        .iter()
        .map(|(k, v)| metrics::Label::new(*k, v.clone()))
        .collect();
    // Getting a handle registers the series; nothing is written to it.
    match metric.kind {
        Kind::Counter => drop(metrics::counter!(metric.name, labels)),
        Kind::Gauge => drop(metrics::gauge!(metric.name, labels)),
        Kind::Histogram(_) => drop(metrics::histogram!(metric.name, labels)),
    }
}

/// The Prometheus text of `handle`, with `# HELP` and `# TYPE` lines for the metrics that have
/// no series yet, so a scrape lists every metric antler has.
pub(crate) fn render(handle: &PrometheusHandle) -> String {
    let mut text = handle.render();
    for metric in METRICS {
        let type_line = format!("# TYPE {} {}\n", metric.name, metric.kind.type_name());
        if !text.contains(&type_line) {
            text.push_str(&format!(
                "# HELP {} {}\n{type_line}\n",
                metric.name, metric.help
            ));
        }
    }
    text
}

#[cfg(test)]
mod tests;
