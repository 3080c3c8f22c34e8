//! Every configuration key, declared once: its dotted name, its default and a one-line doc.
//!
//! The typed structs (and their `Default` impls) stay the deserializer; this table is what the
//! rest holds itself to. Validation names keys only through [`key!`], which refuses, when the
//! crate is built, a key this table does not declare. The tests hold the structs' defaults, the
//! fields serde accepts, `config/antler.example.toml` and the README's key table to this table.
//!
//! Keys are written as in error messages, with two placeholders:
//! - `[]` stands for an entry of a table array: `mcp.servers[].name` is `name` in any
//!   `[[mcp.servers]]` entry (`mcp.servers[2].name` in an error);
//! - `<name>` stands for any table name: `subagents.types.<name>.max_turns`.
//!
//! A setting whose value is an array or an inline table (`server.allowed_hosts`,
//! `agent.tool_timeouts`) is one setting; an error about one of its elements names the
//! element (`server.allowed_hosts[1]`, `agent.tool_timeouts.bash`).

/// What a key means when it is left out: its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Absent {
    /// The key's value, written as TOML.
    Value(&'static str),
    /// The key is unset; the text says what that means.
    Unset(&'static str),
    /// Every entry of its table array must give the key.
    Required,
    /// A table array or a table of named tables, with no entries by default; the keys of an
    /// entry are declared after it.
    Tables,
}

/// One configuration key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Setting {
    /// The dotted key, e.g. `agent.middleware.summarization.trigger_tokens`.
    pub(crate) key: &'static str,
    /// What it means when left out.
    pub(crate) default: Absent,
    /// What it does, in one line.
    pub(crate) doc: &'static str,
}

const fn value(key: &'static str, toml: &'static str, doc: &'static str) -> Setting {
    Setting {
        key,
        default: Absent::Value(toml),
        doc,
    }
}

const fn unset(key: &'static str, meaning: &'static str, doc: &'static str) -> Setting {
    Setting {
        key,
        default: Absent::Unset(meaning),
        doc,
    }
}

const fn required(key: &'static str, doc: &'static str) -> Setting {
    Setting {
        key,
        default: Absent::Required,
        doc,
    }
}

const fn tables(key: &'static str, doc: &'static str) -> Setting {
    Setting {
        key,
        default: Absent::Tables,
        doc,
    }
}

/// Every key, in the order of `config/antler.example.toml`.
// One setting a line reads as a table; rustfmt would spread each over five.
#[rustfmt::skip]
pub(crate) const SETTINGS: &[Setting] = &[
    // [server]
    value("server.listen", r#""127.0.0.1:8080""#, "The address the HTTP server binds."),
    unset("server.public_url", "none", "The public base URL the platforms reach the webhooks at (for setup commands)."),
    value("server.body_limit_bytes", "1048576", "The largest request body accepted, in bytes."),
    value("server.shutdown_grace_secs", "10", "How long a graceful shutdown waits for in-flight work."),
    value("server.max_connections", "512", "Open client connections at most; further clients wait in the listen backlog."),
    value("server.header_read_timeout_secs", "10", "Seconds a connection may take to send a complete request head (idle keep-alive too)."),
    value("server.body_read_timeout_secs", "30", "Seconds a request body may take to arrive in full (408 after)."),
    value("server.max_streams", "256", "Long-lived responses at once: SSE streams and `\"wait\": true` requests."),
    value("server.allowed_hosts", "[]", "Extra `Host` values the API accepts; `\"*\"` accepts any."),
    unset("server.metrics_token", "no token; an admin API token still works", "Bearer token for `/metrics` and the detail of `/readyz`."),
    unset("server.ops_listen", "no separate listener", "A separate address serving `/healthz`, `/readyz` and `/metrics` without a token."),
    value("server.log_level", r#""info""#, "Which log lines are written, in `RUST_LOG` syntax (`antler=debug,warn`); `RUST_LOG`, when set, wins; SIGHUP applies a change."),
    unset("server.wait_timeout_secs", "`agent.turn_timeout_secs` + 60", "Seconds a `\"wait\": true` request waits for its answer before answering 202 without it (the turn goes on)."),
    // [store]
    value("store.backend", r#""sled""#, "Where antler keeps its state: `\"sled\"` (embedded, one process) or `\"postgres\"`."),
    value("store.path", r#""data""#, "The directory sled lives in; with PostgreSQL, the thread folders and the audit log."),
    value("store.dedupe_ttl_secs", "86400", "How long a delivered platform event id is remembered for dedupe."),
    value("store.cache_capacity_bytes", "8388608", "The memory sled may use for its page cache, in bytes."),
    unset("store.url", "none; required with `backend = \"postgres\"`", "The PostgreSQL database, `postgres://user:password@host:5432/db` (a secret: masked everywhere)."),
    value("store.pool_size", "16", "Connections to PostgreSQL kept open at most."),
    value("store.lease_secs", "15", "Seconds a replica holds its conversations and the singletons without renewing (PostgreSQL); the store's lease on sled."),
    unset("store.replica", "the host name and the process id", "This antler's name in logs and leases (PostgreSQL)."),
    // [model]
    value("model.base_url", r#""https://api.openai.com/v1""#, "The OpenAI-compatible API base URL (`.../v1`)."),
    unset("model.api_key", "no key is sent", "The bearer API key."),
    value("model.model", r#""gpt-4o-mini""#, "The model name sent with every request."),
    value("model.connect_timeout_secs", "10", "Seconds to connect to the endpoint."),
    value("model.first_byte_timeout_secs", "60", "Seconds from sending a request until the answer starts (its first streamed `data`; keep-alive comments do not count)."),
    value("model.idle_timeout_secs", "60", "The longest gap between two `data` events of a streamed answer, in seconds; keep-alive comments do not count."),
    value("model.request_timeout_secs", "120", "Seconds for a whole non-streamed answer."),
    value("model.max_retries", "3", "Retries of a failed model request (429, 5xx, connection errors, broken streams)."),
    value("model.stream", "true", "Whether answers are streamed."),
    value("model.stream_usage", "true", "Whether a streamed request asks for token usage (`stream_options.include_usage`)."),
    unset("model.temperature", "the server's default", "Sampling temperature, 0 to 2."),
    unset("model.max_tokens", "the server's default", "The completion token limit."),
    value("model.context_tokens", "128000", "The most tokens a request may hold (estimated); 0: no bound."),
    unset("model.system_prompt", "antler's built-in lead prompt (`DEFAULT_SYSTEM_PROMPT` in src/config/mod.rs)", "The system prompt at the start of every request; replaces the built-in one."),
    value("model.vision", "false", "Whether the model reads images (a message's images go with it; `view_image` is offered)."),
    // [agent]
    value("agent.max_iterations", "25", "Model calls per turn, 1 to 200."),
    value("agent.max_concurrent_turns", "16", "Turns running at once across all conversations."),
    value("agent.backlog", "10000", "Turns waiting for a slot before new messages are refused."),
    value("agent.turn_timeout_secs", "600", "The time limit of one turn, in seconds."),
    value("agent.max_turn_attempts", "3", "Attempts of one turn (after crashes or transient failures) before giving up."),
    value("agent.max_attachment_bytes", "20971520", "The largest file a message may bring, in bytes, on any channel."),
    value("agent.max_parallel_tools", "4", "Tool calls of one model response that run at once, 1 to 64."),
    value("agent.tool_timeout_secs", "120", "The time limit of one tool call, in seconds."),
    value("agent.tool_timeouts", "{}", "Time limits of particular tools, in seconds, by name (`{ bash = 600 }`)."),
    value("agent.timezone", r#""UTC""#, "The IANA time zone of the current time each run is told."),
    // [agent.middleware.*]
    value("agent.middleware.thread_data.enabled", "true", "Tells the model where the thread's files are; offers `present_files`."),
    value("agent.middleware.uploads.enabled", "true", "Lists the files that came with a message to the model."),
    value("agent.middleware.uploads.max_listed", "10", "At most this many files are named; the rest are counted."),
    value("agent.middleware.input_sanitization.enabled", "true", "Wraps users' text in `<user_message>` and defuses tags imitating antler's own."),
    value("agent.middleware.dangling_tool_call.enabled", "true", "Repairs tool calls left without a result before the next model call."),
    value("agent.middleware.guardrail.enabled", "true", "Decides which tools a user may have run, by role."),
    value("agent.middleware.guardrail.admin_only", r#"["bash", "write_file", "str_replace", "mcp__*"]"#, "Tools only admins may use (a trailing `*` names a prefix)."),
    value("agent.middleware.guardrail.denied", "[]", "Tools nobody may use."),
    value("agent.middleware.guardrail.user_allowed", "[]", "When not empty, the only tools other users may use."),
    value("agent.middleware.sandbox_audit.enabled", "true", "Judges every shell command before it runs and appends it to the audit log."),
    value("agent.middleware.sandbox_audit.tools", r#"["bash"]"#, "Tools whose `command` argument is judged."),
    unset("agent.middleware.sandbox_audit.audit_log", "<store.path>/audit/shell.log", "The audit log."),
    value("agent.middleware.sandbox_audit.max_command_chars", "10000", "Longer commands are blocked; the log keeps at most this many characters of one."),
    value("agent.middleware.sandbox_audit.builtin_rules", "true", "Whether the built-in block and warn rules apply."),
    value("agent.middleware.sandbox_audit.block", "[]", "More rules (`{ name, pattern }`) whose commands are not run."),
    value("agent.middleware.sandbox_audit.warn", "[]", "More rules (`{ name, pattern }`) whose commands run with a warning."),
    value("agent.middleware.tool_output_budget.enabled", "true", "Cuts long tool results to their head and tail, saving the full text."),
    value("agent.middleware.tool_output_budget.max_chars", "12000", "The longest result kept whole, in characters."),
    value("agent.middleware.tool_output_budget.head_percent", "60", "The share of `max_chars` kept from the start, in percent (10 to 90)."),
    value("agent.middleware.tool_output_budget.save_full", "true", "Whether the full text of a cut result is saved."),
    value("agent.middleware.tool_output_budget.quota_mb", "64", "Saved results a thread keeps at most, in MiB."),
    value("agent.middleware.summarization.enabled", "true", "Replaces older messages with one summary when a request grows past `trigger_tokens`."),
    value("agent.middleware.summarization.trigger_tokens", "32000", "Tokens of a request's messages that trigger a summary."),
    value("agent.middleware.summarization.keep_messages", "10", "Newest messages kept verbatim."),
    value("agent.middleware.summarization.trim_tokens_to_summarize", "15564", "Tokens of the older messages quoted to the summary call at most."),
    value("agent.middleware.todo.enabled", "false", "Plan mode for every thread."),
    value("agent.middleware.todo.plan_command", "true", "Whether `/plan` switches plan mode for one conversation's thread."),
    value("agent.middleware.todo.max_reminders", "2", "Completion reminders per run at most."),
    value("agent.middleware.token_usage.enabled", "true", "Records the model's token usage per turn and thread."),
    value("agent.middleware.title.enabled", "true", "Gives a thread a short title after its first answered exchange."),
    value("agent.middleware.title.use_model", "true", "Whether the model writes the title (else the shortened question is the title)."),
    value("agent.middleware.title.max_words", "6", "At most this many words."),
    value("agent.middleware.title.max_chars", "60", "At most this many characters."),
    value("agent.middleware.view_image.enabled", "true", "With `model.vision`: sends a message's images to the model and offers `view_image`."),
    value("agent.middleware.view_image.max_images", "4", "Images per request at most, 1 to 20."),
    value("agent.middleware.view_image.max_image_bytes", "5242880", "The largest image sent, in bytes."),
    value("agent.middleware.subagent_limit.enabled", "true", "Caps subagent calls per response and per run."),
    value("agent.middleware.subagent_limit.max_per_response", "3", "Subagent calls per model response that run, 1 to 4."),
    value("agent.middleware.subagent_limit.max_per_run", "6", "Subagent calls per run that run, 1 to 50."),
    value("agent.middleware.subagent_limit.tool_name", r#""task""#, "The tool that starts a subagent."),
    value("agent.middleware.loop_detection.enabled", "true", "Detects the model repeating the same tool calls."),
    value("agent.middleware.loop_detection.warn_threshold", "3", "Repeats within the window that add a warning."),
    value("agent.middleware.loop_detection.hard_limit", "5", "Repeats that strip the tool calls and force a text answer."),
    value("agent.middleware.loop_detection.window", "20", "Recent tool-call sets remembered per thread."),
    value("agent.middleware.loop_detection.max_threads", "100", "No longer used (each run keeps its own window); accepted so older files still load."),
    value("agent.middleware.loop_detection.tool_freq_warn", "30", "Calls of one tool in a run that add a warning."),
    value("agent.middleware.loop_detection.tool_freq_hard_limit", "50", "Calls of one tool in a run that force a text answer."),
    value("agent.middleware.loop_detection.tool_freq_overrides", "{}", "Both limits per tool (`{ bash = { warn = 100, hard_limit = 150 } }`)."),
    value("agent.middleware.deferred_tools.enabled", "true", "With many tools, offers the core ones plus `tool_search`."),
    value("agent.middleware.deferred_tools.max_tools", "20", "Above this many tools, the non-core ones are deferred."),
    value(
        "agent.middleware.deferred_tools.core_tools",
        r#"["ls", "read_file", "write_file", "str_replace", "bash", "web_fetch", "current_time", "write_todos", "ask_clarification", "present_files", "task", "tool_search"]"#,
        "Tools always offered.",
    ),
    value("agent.middleware.clarification.enabled", "true", "Offers the model `ask_clarification`."),
    // [agent.tools.*]
    value("agent.tools.bash.enabled", "true", "Offers the `bash` tool (admin-only through the guardrail)."),
    value("agent.tools.bash.sandbox", r#""auto""#, "The isolation: `auto`, `bwrap`, `landlock` or `none`."),
    value("agent.tools.bash.network", "false", "Whether commands may use the network (through antler's proxy)."),
    value("agent.tools.bash.max_output_bytes", "65536", "Output shown to the model at most, in bytes."),
    value("agent.tools.bash.limits.processes", "64", "Processes (threads count) one command may run at once."),
    value("agent.tools.bash.limits.memory_mb", "1024", "Memory of each process, in MiB."),
    unset("agent.tools.bash.limits.cpu_secs", "the call's time limit", "CPU seconds of each process."),
    value("agent.tools.bash.limits.file_mb", "256", "The largest file a command may write, in MiB."),
    value("agent.tools.bash.limits.open_files", "256", "Files each process may have open."),
    value("agent.tools.web_fetch.enabled", "true", "Offers `web_fetch`: GET an http(s) URL and read it as text."),
    value("agent.tools.web_fetch.max_bytes", "1048576", "Body bytes read at most; the rest is cut."),
    value("agent.tools.web_fetch.timeout_secs", "20", "The time limit of one fetch, redirects included, in seconds."),
    value("agent.tools.web_fetch.allow_private", "false", "Whether private, loopback and link-local addresses may be fetched."),
    value("agent.tools.web_fetch.allowed_hosts", "[]", "Hosts fetched whatever their addresses are."),
    value("agent.tools.web_fetch.user_agent", concat!("\"antler/", env!("CARGO_PKG_VERSION"), " (web_fetch)\""), "The `User-Agent` sent."),
    // [delivery]
    value("delivery.max_attempts", "8", "Attempts to deliver one outbound message before it is given up."),
    value("delivery.backoff_base_ms", "500", "The first retry delay, in milliseconds; it doubles per attempt."),
    value("delivery.backoff_max_secs", "60", "The largest retry delay, in seconds."),
    // [channels.api]
    value("channels.api.enabled", "true", "Whether the HTTP API channel (`/api/v1/...`) is served."),
    unset("channels.api.token", "no admin token (allowed on a loopback address only)", "The admin bearer token: reaches every conversation."),
    value("channels.api.allowed_users", "[]", "API users who may send messages (empty: anyone)."),
    value("channels.api.admins", "[]", "API users whose turns run as admin (needs tokens)."),
    tables("channels.api.tokens", "More bearer tokens, each bound to one user and a role."),
    required("channels.api.tokens[].token", "The bearer token."),
    required("channels.api.tokens[].user", "The user every request with this token acts as."),
    value("channels.api.tokens[].role", r#""user""#, "`user` (its own conversations) or `admin` (every conversation)."),
    // [channels.telegram]
    value("channels.telegram.enabled", "false", "Whether Telegram is served."),
    value("channels.telegram.mode", r#""webhook""#, "How updates arrive: `webhook` or `polling`."),
    unset("channels.telegram.bot_token", "none (required when enabled)", "The bot token from @BotFather."),
    unset("channels.telegram.webhook_secret", "none (required for a webhook)", "The secret the webhook must carry."),
    value("channels.telegram.api_url", r#""https://api.telegram.org""#, "The Bot API base URL."),
    value("channels.telegram.allowed_users", "[]", "User ids that may talk to the bot."),
    value("channels.telegram.allowed_chats", "[]", "Chat ids in which anyone may talk to the bot."),
    value("channels.telegram.admins", "[]", "User ids of operators: always allowed, their turns run as admin."),
    unset("channels.telegram.dm_policy", "`pairing` when allowed_users and allowed_chats are both empty, else `allowlist`", "Private messages from unknown users: `pairing` (they get a code for `antler pairing approve`), `allowlist` (refused) or `open` (anyone may talk)."),
    // [channels.slack]
    value("channels.slack.enabled", "false", "Whether Slack is served."),
    unset("channels.slack.bot_token", "none (required when enabled)", "The bot token (`xoxb-...`)."),
    value("channels.slack.mode", r#""events""#, "How events arrive: `events` (Slack posts to `/webhooks/slack/*`) or `socket` (antler opens a Socket Mode connection; no public URL)."),
    unset("channels.slack.signing_secret", "none (required when enabled with mode `events`)", "The signing secret that verifies request signatures."),
    unset("channels.slack.app_token", "none (required when enabled with mode `socket`)", "The app-level token (`xapp-...`, scope `connections:write`) that opens Socket Mode connections."),
    value("channels.slack.api_url", r#""https://slack.com/api""#, "The Web API base URL."),
    unset("channels.slack.team_id", "any workspace", "The workspace (team id) whose events are accepted."),
    value("channels.slack.thread_follow_ups", "true", "Answer in a thread the bot already answered in, without a new mention."),
    value("channels.slack.command", r#""/antler""#, "The slash command registered in the app."),
    value("channels.slack.allowed_bots", "[]", "Other bots whose messages are answered like a person's: bot ids (`B…`) or app ids (`A…`), classic bots and incoming webhooks included."),
    value("channels.slack.progress_reactions", "true", "React to the user's message while its turn runs and when it ends."),
    value("channels.slack.slash_response", r#""ephemeral""#, "Who sees a slash command's answer: `ephemeral` (its user) or `in_channel` (everyone there)."),
    value("channels.slack.allowed_users", "[]", "User ids that may talk to the bot."),
    value("channels.slack.allowed_chats", "[]", "Channel ids in which anyone may talk to the bot."),
    value("channels.slack.admins", "[]", "User ids of operators: always allowed, their turns run as admin."),
    unset("channels.slack.dm_policy", "`pairing` when allowed_users and allowed_chats are both empty, else `allowlist`", "Private messages from unknown users: `pairing` (they get a code for `antler pairing approve`), `allowlist` (refused) or `open` (anyone may talk)."),
    // [channels.discord]
    value("channels.discord.enabled", "false", "Whether Discord is served."),
    unset("channels.discord.application_id", "none (required when enabled)", "The application id."),
    unset("channels.discord.public_key", "none (required when enabled)", "The application's Ed25519 public key, 64 hex characters."),
    unset("channels.discord.bot_token", "none (required when enabled)", "The bot token."),
    value("channels.discord.api_url", r#""https://discord.com""#, "The API base URL."),
    value("channels.discord.allowed_guilds", "[]", "Servers (guild ids) whose members may use the bot; empty: any."),
    value("channels.discord.gateway", "false", "Also connect to the Gateway for plain @mentions and DMs."),
    value("channels.discord.allowed_users", "[]", "User ids that may talk to the bot."),
    value("channels.discord.allowed_chats", "[]", "Channel ids in which anyone may talk to the bot."),
    value("channels.discord.admins", "[]", "User ids of operators: always allowed, their turns run as admin."),
    unset("channels.discord.dm_policy", "`pairing` when allowed_users and allowed_chats are both empty, else `allowlist`", "Private messages from unknown users: `pairing` (they get a code for `antler pairing approve`), `allowlist` (refused) or `open` (anyone may talk)."),
    // [channels.feishu]
    value("channels.feishu.enabled", "false", "Whether Feishu (or Lark) is served."),
    unset("channels.feishu.app_id", "none (required when enabled)", "The app id (`cli_...`)."),
    unset("channels.feishu.app_secret", "none (required when enabled)", "The app secret."),
    value("channels.feishu.mode", r#""webhook""#, "How events arrive: `webhook` or `websocket` (the long connection)."),
    unset("channels.feishu.verification_token", "none (required in webhook mode)", "The event subscription's verification token."),
    unset("channels.feishu.encrypt_key", "events arrive in clear", "The event encryption key (webhook mode)."),
    value("channels.feishu.api_url", r#""https://open.feishu.cn""#, "The Open Platform base URL."),
    value("channels.feishu.cards", "true", "Answer with a card that fills in as the answer streams."),
    value("channels.feishu.allowed_users", "[]", "User ids that may talk to the bot."),
    value("channels.feishu.allowed_chats", "[]", "Chat ids in which anyone may talk to the bot."),
    value("channels.feishu.admins", "[]", "User ids of operators: always allowed, their turns run as admin."),
    unset("channels.feishu.dm_policy", "`pairing` when allowed_users and allowed_chats are both empty, else `allowlist`", "Private messages from unknown users: `pairing` (they get a code for `antler pairing approve`), `allowlist` (refused) or `open` (anyone may talk)."),
    // [[mcp.servers]]
    tables("mcp.servers", "MCP servers whose tools the agent may call."),
    required("mcp.servers[].name", "The server's name in tool names (`mcp__<name>__<tool>`)."),
    unset("mcp.servers[].command", "not a stdio server", "stdio: the program to run."),
    value("mcp.servers[].args", "[]", "stdio: its arguments."),
    value("mcp.servers[].env", "{}", "stdio: environment variables set for it."),
    value("mcp.servers[].timeout_secs", "60", "The time limit of one tool call, in seconds."),
    value("mcp.servers[].connect_timeout_secs", "20", "The time limit of starting, connecting and listing the tools."),
    unset("mcp.servers[].url", "not an HTTP server", "Streamable HTTP: the endpoint."),
    unset("mcp.servers[].bearer_token", "none", "Streamable HTTP: sent as `Authorization: Bearer <token>`."),
    value("mcp.servers[].headers", "{}", "Streamable HTTP: headers sent with every request."),
    value("mcp.servers[].enabled", "true", "Whether the server is started."),
    // [[schedules]]
    tables("schedules", "Prompts sent to a conversation on a timetable; each firing is answered there like a message."),
    required("schedules[].name", "The schedule's name: 1 to 40 lowercase letters, digits or `-`; unique."),
    unset("schedules[].cron", "not a cron schedule (give cron or every)", "When it fires: a five-field cron expression (`0 9 * * 1-5`)."),
    unset("schedules[].every", "not an interval schedule (give cron or every)", "When it fires: a period such as `15m` or `2h` (at least a minute), at its multiples since the epoch."),
    unset("schedules[].timezone", "`agent.timezone`", "The IANA time zone `cron` is read in."),
    required("schedules[].conversation", "Where the prompt goes and the answer appears: a conversation key on an enabled channel (`slack:T0ACME:C0OPS`)."),
    required("schedules[].prompt", "What is sent to the assistant at each firing."),
    value("schedules[].missed", r#""once""#, "Firings missed while antler was down: `once` (run one catch-up) or `skip`."),
    // [memory]
    value("memory.enabled", "true", "Whether antler learns and injects long-term memory at all."),
    value("memory.debounce_seconds", "30", "Seconds a queued conversation waits before the updater reads it."),
    value("memory.max_facts", "100", "Facts kept per user at most, 1 to 1000."),
    value("memory.fact_confidence_threshold", "0.7", "New facts below this confidence (0 to 1) are not kept."),
    value("memory.injection_enabled", "true", "Whether the `<memory>` block goes with the author's requests."),
    value("memory.max_injection_tokens", "2000", "The `<memory>` block's size at most, in tokens, 100 to 32000."),
    value("memory.shutdown_flush_secs", "10", "How long shutdown processes queued updates, in seconds."),
    value("memory.group_facts", "\"work\"", "Which of the author's facts group chats hear: `shareable`, `work` or `all`."),
    value("memory.group_personal_context", "false", "Whether group chats hear the author's `personalContext` summary."),
    tables("memory.identities", "Ids on several platforms that are one person, sharing one memory."),
    required("memory.identities[].name", "The person's name; their memory is `person:<name>`."),
    required("memory.identities[].ids", "Their ids, each `<channel>:<user id>`."),
    // [approvals]
    value("approvals.tools", "[]", "Tool names (`*` matches any run of characters) whose calls wait for a person's `/approve`."),
    value("approvals.approvers", "\"admins\"", "Who may decide: `\"admins\"` (the channel's admins) or a list of `<channel>:<user id>`."),
    value("approvals.timeout_secs", "900", "Unanswered this long (1 to 604800 seconds), a call is denied as expired."),
    value("approvals.self_approval", "true", "Whether the person whose message led to the call may approve it."),
    // [skills]
    value("skills.enabled", "true", "Whether skills are listed to the model and readable at `/mnt/skills`."),
    unset("skills.paths", "`skills/public` and `skills/custom` in the config file's folder", "Folders holding skill folders (relative ones from the config file's folder)."),
    // [subagents]
    value("subagents.enabled", "true", "Whether the `task` tool is offered."),
    value("subagents.max_concurrent", "3", "Tasks running at once across antler, 1 to 16."),
    value("subagents.timeout_seconds", "900", "How long a task may run unless its type says otherwise, in seconds."),
    value("subagents.token_budget", "1000000", "Tokens a task may use unless its type says otherwise; 0 for no budget."),
    tables("subagents.types", "Changes to the built-in subagent types, and custom types."),
    unset("subagents.types.<name>.description", "the built-in type's (a custom type needs one)", "What the lead agent is told the type is for."),
    unset("subagents.types.<name>.system_prompt", "the built-in type's, or a general one", "The subagent's system prompt."),
    unset("subagents.types.<name>.tools", "all of the lead's tools", "The tools it gets (a trailing `*` names a prefix)."),
    unset("subagents.types.<name>.disallowed_tools", "none beyond those never delegated", "Tools it never gets."),
    unset("subagents.types.<name>.model", "model.model", "The model it uses."),
    unset("subagents.types.<name>.max_turns", "150 (general-purpose), 60 (bash), 50 (custom)", "Model calls it may make."),
    unset("subagents.types.<name>.timeout_seconds", "subagents.timeout_seconds", "How long it may run, in seconds."),
    unset("subagents.types.<name>.token_budget", "subagents.token_budget", "Tokens one task may use; 0 for no budget."),
    // [[commands]]
    tables("commands", "Operator commands: vetted programs run as `/name` in chat and offered to the model as `cmd_<name>`."),
    required("commands[].name", "What follows the `/`: 1 to 32 lowercase letters, digits, `_` or `-`, not a built-in command."),
    required("commands[].description", "Its line in `/help`, the menus and the tool's description (1 to 100 characters)."),
    required("commands[].run", "The program (an absolute path) and its arguments, never a shell string; `{arg}` is replaced by that argument."),
    value("commands[].args", "[]", "Its arguments in typed order, each `{ name, pattern, optional }`; a value must match its pattern as a whole."),
    value("commands[].roles", r#"["admin"]"#, "Who may run it, in chat and as a tool: `admin`, `user`."),
    value("commands[].timeout_secs", "300", "How long it may run before its process group is killed, in seconds."),
    value("commands[].tool", "true", "Whether the model is offered it as the tool `cmd_<name>`."),
    unset("commands[].cwd", "the thread's workspace", "The folder it runs in."),
    value("commands[].env", "{}", "Its whole environment (nothing else of antler's reaches it); `${VAR}` takes antler's."),
    // [telemetry]
    unset("telemetry.otlp_endpoint", "`OTEL_EXPORTER_OTLP_ENDPOINT`, else no traces are exported", "The OTLP collector's base URL (http or https); spans are posted to `<otlp_endpoint>/v1/traces`."),
    unset("telemetry.trace_url", "no link", "A trace viewer's link to one trace, `{trace_id}` standing for its id, e.g. `https://tempo.example/trace/{trace_id}`."),
];

/// Whether [`SETTINGS`] declares `key` (written as declared, placeholders included).
pub(crate) const fn is_declared(key: &str) -> bool {
    let mut index = 0;
    while index < SETTINGS.len() {
        if str_eq(SETTINGS[index].key, key) {
            return true;
        }
        index += 1;
    }
    false
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut index = 0;
    while index < a.len() {
        if a[index] != b[index] {
            return false;
        }
        index += 1;
    }
    true
}

/// A declared key as a `&'static str`: `key!("server.listen")`. The check is a const
/// evaluation: a key [`SETTINGS`] does not declare fails `cargo build` and `cargo test` (not
/// `cargo check`, which skips it), so a renamed key cannot leave its old name in a message.
macro_rules! key {
    ($key:literal) => {
        const {
            assert!(
                $crate::config::settings::is_declared($key),
                concat!("not a declared configuration key: ", $key),
            );
            $key
        }
    };
}
pub(crate) use key;

/// The key of entry `index` of a table array: `at("mcp.servers[].name", 2)` is
/// `mcp.servers[2].name`.
pub(crate) fn at(key: &str, index: usize) -> String {
    key.replacen("[]", &format!("[{index}]"), 1)
}

/// The key of the table `name`: `named("subagents.types.<name>.model", "bash")` is
/// `subagents.types.bash.model`.
pub(crate) fn named(key: &str, name: &str) -> String {
    key.replacen("<name>", name, 1)
}

/// The key of one element of an array setting: `element("server.allowed_hosts", 1)` is
/// `server.allowed_hosts[1]`.
pub(crate) fn element(key: &str, index: usize) -> String {
    format!("{key}[{index}]")
}

/// The key of one entry of a table-valued setting or of a table of tables:
/// `entry("agent.tool_timeouts", "bash")` is `agent.tool_timeouts.bash`.
pub(crate) fn entry(key: &str, name: &str) -> String {
    format!("{key}.{name}")
}

#[cfg(test)]
mod tests;
