//! Range and cross-field checks; every issue is collected. Every key an issue names comes from
//! the declaration in `settings.rs` through `key!`, so an undeclared key does not build.

use std::collections::HashMap;
use std::net::{Ipv6Addr, SocketAddr};
use std::time::Duration;

use super::settings::{at, element, entry, key, named};
use super::{Config, ConfigIssue, Secret};
use super::{DmPolicy, FeishuMode, SlackMode, StoreBackend, TelegramMode};
use crate::agent::middleware::sandbox_audit::{MAX_COMMAND_CHARS_LIMIT, SandboxAuditConfig};
use crate::agent::subagents::config::{BUILTIN_TYPES, TASK_CALL_MARGIN};
use crate::agent::subagents::task_tool::TASK_TOOL;
use crate::agent::tools::bash::MAX_OUTPUT_BYTES_LIMIT;

/// The smallest sled page cache accepted (1 MiB).
pub(crate) const MIN_CACHE_CAPACITY_BYTES: u64 = 1024 * 1024;

/// The shortest token accepted when the server is reachable from other hosts.
pub(crate) const MIN_TOKEN_CHARS: usize = 16;

/// The largest `agent.max_attachment_bytes`: a file is held in memory while it is fetched.
pub(crate) const MAX_ATTACHMENT_BYTES: u64 = 1024 * 1024 * 1024;

/// The largest image `view_image` may send (DeerFlow's limit).
const MAX_IMAGE_BYTES: u64 = 20 * 1024 * 1024;

/// The longest API user name.
pub(crate) const MAX_USER_CHARS: usize = 64;

/// The chat platforms whose adapters exist in this build; an enabled platform outside this list
/// is refused until its adapter lands.
pub(crate) const AVAILABLE_PLATFORMS: &[&str] = &["telegram", "slack", "discord", "feishu"];

/// Collects the issues of a deserialized configuration.
pub(crate) fn validate(config: &Config) -> Vec<ConfigIssue> {
    let mut v = Issues::default();
    server(config, &mut v);
    model(config, &mut v);
    agent(config, &mut v);
    delivery(config, &mut v);
    channels(config, &mut v);
    mcp(config, &mut v);
    memory(config, &mut v);
    subagents(config, &mut v);
    skills(config, &mut v);
    for (key, problem) in super::commands::issues(&config.commands) {
        v.push(&key, problem);
    }
    v.0.extend(super::schedules::validate(config));
    approvals(config, &mut v);
    telemetry(config, &mut v);
    v.0
}

/// `[telemetry]`: an http(s) collector URL, a link template holding `{trace_id}`.
fn telemetry(config: &Config, v: &mut Issues) {
    let telemetry = &config.telemetry;
    if let Some(endpoint) = telemetry
        .otlp_endpoint
        .as_ref()
        .filter(|e| !e.trim().is_empty())
    {
        if let Err(problem) = crate::telemetry::check_endpoint(endpoint.trim()) {
            v.push(key!("telemetry.otlp_endpoint"), problem);
        }
    }
    if let Some(template) = telemetry
        .trace_url
        .as_ref()
        .filter(|t| !t.trim().is_empty())
    {
        if let Err(problem) = crate::telemetry::check_trace_url(template.trim()) {
            v.push(key!("telemetry.trace_url"), problem);
        }
    }
}

/// `[approvals]`: tool names as the model API spells them (plus `*`), approvers that name
/// someone, a timeout a person can meet.
fn approvals(config: &Config, v: &mut Issues) {
    use crate::agent::middleware::approval::Approvers;
    let approvals = &config.approvals;
    for (index, tool) in approvals.tools.iter().enumerate() {
        let valid = !tool.is_empty()
            && tool.len() <= 128
            && tool
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '*'));
        if !valid {
            v.push(
                &element(key!("approvals.tools"), index),
                "must be a tool name of letters, digits, `_` and `-` (at most 128), `*` matching any run",
            );
        }
    }
    match &approvals.approvers {
        Approvers::Named(name) if name != "admins" => v.push(
            key!("approvals.approvers"),
            "must be \"admins\" or a list of \"<channel>:<user id>\"",
        ),
        Approvers::Named(_) => {}
        Approvers::Users(users) => {
            if users.is_empty() {
                v.push(key!("approvals.approvers"), "must name at least one user");
            }
            for (index, user) in users.iter().enumerate() {
                let well_formed = user
                    .split_once(':')
                    .is_some_and(|(channel, id)| !channel.is_empty() && !id.is_empty());
                if !well_formed {
                    v.push(
                        &element(key!("approvals.approvers"), index),
                        "must be \"<channel>:<user id>\", e.g. \"telegram:42\"",
                    );
                }
            }
        }
    }
    if !(1..=604_800).contains(&approvals.timeout_secs) {
        v.push(
            key!("approvals.timeout_secs"),
            format!(
                "must be between 1 and 604800 (got {})",
                approvals.timeout_secs
            ),
        );
    }
}

/// `[skills]`: the folders must be named (a missing or invalid skill is reported at start,
/// never a config error).
fn skills(config: &Config, v: &mut Issues) {
    for (index, path) in config.skills.paths.iter().enumerate() {
        if path.as_os_str().is_empty() {
            v.push(&element(key!("skills.paths"), index), "must not be empty");
        } else if config.skills.paths[..index].contains(path) {
            v.push(&element(key!("skills.paths"), index), "is listed twice");
        }
    }
}

#[derive(Default)]
struct Issues(Vec<ConfigIssue>);

impl Issues {
    fn push(&mut self, key: &str, problem: impl Into<String>) {
        self.0.push(ConfigIssue::new(key, problem));
    }

    fn at_least<T: PartialOrd + std::fmt::Display>(&mut self, key: &str, value: T, min: T) {
        if value < min {
            self.push(key, format!("must be at least {min} (got {value})"));
        }
    }

    fn url(&mut self, key: &str, url: &str) {
        if let Err(problem) = check_http_url(url) {
            self.push(key, problem);
        }
    }
}

fn server(config: &Config, v: &mut Issues) {
    let server = &config.server;
    if let Some(url) = &server.public_url {
        v.url(key!("server.public_url"), url);
    }
    v.at_least(key!("server.body_limit_bytes"), server.body_limit_bytes, 1);
    v.at_least(key!("server.max_connections"), server.max_connections, 1);
    v.at_least(
        key!("server.header_read_timeout_secs"),
        server.header_read_timeout_secs,
        1,
    );
    v.at_least(
        key!("server.body_read_timeout_secs"),
        server.body_read_timeout_secs,
        1,
    );
    v.at_least(key!("server.max_streams"), server.max_streams, 1);
    if let Some(wait) = server.wait_timeout_secs {
        v.at_least(key!("server.wait_timeout_secs"), wait, 1);
    }
    if let Err(problem) = crate::logging::parse_level(&server.log_level) {
        v.push(key!("server.log_level"), problem);
    }
    for (index, host) in server.allowed_hosts.iter().enumerate() {
        if let Err(problem) = check_allowed_host(host) {
            v.push(&element(key!("server.allowed_hosts"), index), problem);
        }
    }
    if let Some(ops) = server.ops_listen
        && listeners_clash(ops, server.listen)
    {
        v.push(
            key!("server.ops_listen"),
            format!(
                "must differ from {} (another port, or another address that is not a wildcard)",
                key!("server.listen")
            ),
        );
    }
    if config.store.path.as_os_str().is_empty() {
        v.push(key!("store.path"), "must not be empty");
    }
    v.at_least(
        key!("store.dedupe_ttl_secs"),
        config.store.dedupe_ttl_secs,
        1,
    );
    v.at_least(
        key!("store.cache_capacity_bytes"),
        config.store.cache_capacity_bytes,
        MIN_CACHE_CAPACITY_BYTES,
    );
    if config.store.backend == StoreBackend::Postgres {
        match config.store.url.as_ref().map(Secret::expose) {
            None => v.push(
                key!("store.url"),
                format!(
                    "is required with {} = \"postgres\" (postgres://user:password@host:5432/db)",
                    key!("store.backend")
                ),
            ),
            Some(url) if !url.starts_with("postgres://") && !url.starts_with("postgresql://") => {
                // Never quoted: it may hold a password.
                v.push(
                    key!("store.url"),
                    "must be a postgres:// or postgresql:// URL",
                );
            }
            Some(_) => {}
        }
    }
    v.at_least(key!("store.pool_size"), config.store.pool_size, 1);
    v.at_least(key!("store.lease_secs"), config.store.lease_secs, 3);
}

/// Whether two listeners would fight over one port: the same port (0 picks a fresh one each
/// time) on the same address, or with either one binding every address.
fn listeners_clash(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Checks one `server.allowed_hosts` entry: `*`, or a `Host` header value (`host` or
/// `host:port`). Problems never quote the entry.
pub(crate) fn check_allowed_host(entry: &str) -> Result<(), &'static str> {
    if entry == "*" {
        return Ok(());
    }
    if entry.trim().is_empty() {
        return Err("must not be empty");
    }
    if entry.contains("://") {
        return Err("must be a host or host:port, without a scheme");
    }
    if entry.contains(['/', '?', '#']) {
        return Err("must be a host or host:port, without a path");
    }
    if entry.contains('*') {
        return Err("`*` must stand alone (it accepts any host)");
    }
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let Some((address, after)) = rest.split_once(']') else {
            return Err("an IPv6 address needs a closing `]`");
        };
        if address.parse::<Ipv6Addr>().is_err() {
            return Err("must hold an IPv6 address between `[` and `]`");
        }
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return Err("only `:port` may follow `]`"),
            },
        };
        (None, port)
    } else {
        match entry.split_once(':') {
            Some((_, port)) if port.contains(':') => {
                return Err("an IPv6 address must be written in brackets: [::1]:8080");
            }
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(entry), None),
        }
    };
    if let Some(host) = host {
        let valid = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !valid {
            return Err(
                "must be a host name or IP address (letters, digits, `-`, `.`, `_`), optionally with :port",
            );
        }
    }
    // `parse` alone would take `+80`.
    if let Some(port) = port
        && !(port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok())
    {
        return Err("the port must be a number from 0 to 65535");
    }
    Ok(())
}

/// Whether `user` may name an API user: it becomes part of conversation keys
/// (`api:<user>/<conversation>`), so the separators `:` and `/` are out.
pub(crate) fn is_valid_user(user: &str) -> bool {
    let chars = user.chars().count();
    (1..=MAX_USER_CHARS).contains(&chars)
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'))
}

fn model(config: &Config, v: &mut Issues) {
    let model = &config.model;
    v.url(key!("model.base_url"), &model.base_url);
    if model.model.trim().is_empty() {
        v.push(key!("model.model"), "must not be empty");
    }
    v.at_least(
        key!("model.connect_timeout_secs"),
        model.connect_timeout_secs,
        1,
    );
    v.at_least(
        key!("model.first_byte_timeout_secs"),
        model.first_byte_timeout_secs,
        1,
    );
    v.at_least(key!("model.idle_timeout_secs"), model.idle_timeout_secs, 1);
    v.at_least(
        key!("model.request_timeout_secs"),
        model.request_timeout_secs,
        1,
    );
    if let Some(temperature) = model.temperature
        && !(0.0..=2.0).contains(&temperature)
    {
        v.push(
            key!("model.temperature"),
            format!("must be between 0 and 2 (got {temperature})"),
        );
    }
    if let Some(max_tokens) = model.max_tokens {
        v.at_least(key!("model.max_tokens"), max_tokens, 1);
    }
    if model.context_tokens != 0 && model.context_tokens < 1024 {
        v.push(
            key!("model.context_tokens"),
            format!(
                "must be 0 (no bound) or at least 1024 (got {})",
                model.context_tokens
            ),
        );
    }
}

fn agent(config: &Config, v: &mut Issues) {
    let agent = &config.agent;
    if !(1..=200).contains(&agent.max_iterations) {
        v.push(
            key!("agent.max_iterations"),
            format!("must be between 1 and 200 (got {})", agent.max_iterations),
        );
    }
    v.at_least(
        key!("agent.max_concurrent_turns"),
        agent.max_concurrent_turns,
        1,
    );
    v.at_least(key!("agent.backlog"), agent.backlog, 1);
    v.at_least(key!("agent.turn_timeout_secs"), agent.turn_timeout_secs, 1);
    v.at_least(key!("agent.max_turn_attempts"), agent.max_turn_attempts, 1);
    if !(1..=64).contains(&agent.max_parallel_tools) {
        v.push(
            key!("agent.max_parallel_tools"),
            format!(
                "must be between 1 and 64 (got {})",
                agent.max_parallel_tools
            ),
        );
    }
    v.at_least(key!("agent.tool_timeout_secs"), agent.tool_timeout_secs, 1);
    for (tool, secs) in &agent.tool_timeouts {
        v.at_least(&entry(key!("agent.tool_timeouts"), tool), *secs, 1);
    }
    if let (Some(secs), Some(needed)) = (
        agent.tool_timeouts.get(TASK_TOOL),
        config.subagents.longest_call(),
    ) {
        // A lower limit would cut tasks short of their type's timeout without a word.
        if Duration::from_secs(*secs) < needed {
            v.push(
                &entry(key!("agent.tool_timeouts"), TASK_TOOL),
                format!(
                    "must be at least {} seconds: the slowest subagent type's timeout_seconds \
                     and {} s for the task's wait and record (or leave it out)",
                    needed.as_secs(),
                    TASK_CALL_MARGIN.as_secs()
                ),
            );
        }
    }
    if let Err(e) = agent.time_zone() {
        v.push(
            key!("agent.timezone"),
            format!(
                "`{}` is not a known IANA time zone (such as `UTC` or `Europe/Berlin`): {e}",
                agent.timezone
            ),
        );
    }
    if !(1..=MAX_ATTACHMENT_BYTES).contains(&agent.max_attachment_bytes) {
        v.push(
            key!("agent.max_attachment_bytes"),
            format!(
                "must be between 1 and {MAX_ATTACHMENT_BYTES} (1 GiB) (got {})",
                agent.max_attachment_bytes
            ),
        );
    }

    let bash = &agent.tools.bash;
    if !(1..=MAX_OUTPUT_BYTES_LIMIT).contains(&bash.max_output_bytes) {
        v.push(
            key!("agent.tools.bash.max_output_bytes"),
            format!(
                "must be between 1 and {MAX_OUTPUT_BYTES_LIMIT} (got {})",
                bash.max_output_bytes
            ),
        );
    }
    sandbox_audit(&agent.middleware.sandbox_audit, v);

    v.at_least(
        key!("agent.middleware.tool_output_budget.quota_mb"),
        agent.middleware.tool_output_budget.quota_mb,
        1,
    );

    let title = &agent.middleware.title;
    v.at_least(key!("agent.middleware.title.max_words"), title.max_words, 1);
    v.at_least(key!("agent.middleware.title.max_chars"), title.max_chars, 8);

    let summarization = &agent.middleware.summarization;
    v.at_least(
        key!("agent.middleware.summarization.trigger_tokens"),
        summarization.trigger_tokens,
        1000,
    );
    v.at_least(
        key!("agent.middleware.summarization.keep_messages"),
        summarization.keep_messages,
        1,
    );
    v.at_least(
        key!("agent.middleware.summarization.trim_tokens_to_summarize"),
        summarization.trim_tokens_to_summarize,
        100,
    );
    let context_tokens = config.model.context_tokens;
    if summarization.enabled
        && context_tokens != 0
        && summarization.trigger_tokens >= context_tokens
    {
        v.push(
            key!("agent.middleware.summarization.trigger_tokens"),
            format!(
                "must be below {} ({} >= {context_tokens}), or older messages are dropped \
                 before they are summarized",
                key!("model.context_tokens"),
                summarization.trigger_tokens
            ),
        );
    }

    let images = &agent.middleware.view_image;
    if !(1..=20).contains(&images.max_images) {
        v.push(
            key!("agent.middleware.view_image.max_images"),
            format!("must be between 1 and 20 (got {})", images.max_images),
        );
    }
    if !(1..=MAX_IMAGE_BYTES).contains(&images.max_image_bytes) {
        v.push(
            key!("agent.middleware.view_image.max_image_bytes"),
            format!(
                "must be between 1 and {MAX_IMAGE_BYTES} (20 MiB) (got {})",
                images.max_image_bytes
            ),
        );
    }

    let subagents = &agent.middleware.subagent_limit;
    if !(1..=4).contains(&subagents.max_per_response) {
        v.push(
            key!("agent.middleware.subagent_limit.max_per_response"),
            format!(
                "must be between 1 and 4 (got {})",
                subagents.max_per_response
            ),
        );
    }
    if !(1..=50).contains(&subagents.max_per_run) {
        v.push(
            key!("agent.middleware.subagent_limit.max_per_run"),
            format!("must be between 1 and 50 (got {})", subagents.max_per_run),
        );
    }
    if subagents.tool_name.trim().is_empty() {
        v.push(
            key!("agent.middleware.subagent_limit.tool_name"),
            "must not be empty",
        );
    }
    let web_fetch = &agent.tools.web_fetch;
    v.at_least(
        key!("agent.tools.web_fetch.max_bytes"),
        web_fetch.max_bytes,
        1,
    );
    v.at_least(
        key!("agent.tools.web_fetch.timeout_secs"),
        web_fetch.timeout_secs,
        1,
    );
    v.at_least(
        key!("agent.middleware.deferred_tools.max_tools"),
        agent.middleware.deferred_tools.max_tools,
        1,
    );

    let loops = &agent.middleware.loop_detection;
    v.at_least(
        key!("agent.middleware.loop_detection.warn_threshold"),
        loops.warn_threshold,
        1,
    );
    if loops.hard_limit <= loops.warn_threshold {
        v.push(
            key!("agent.middleware.loop_detection.hard_limit"),
            format!(
                "must be greater than warn_threshold ({} <= {})",
                loops.hard_limit, loops.warn_threshold
            ),
        );
    }
    if loops.window < loops.hard_limit {
        v.push(
            key!("agent.middleware.loop_detection.window"),
            format!(
                "must be at least hard_limit ({} < {})",
                loops.window, loops.hard_limit
            ),
        );
    }
    v.at_least(
        key!("agent.middleware.loop_detection.max_threads"),
        loops.max_threads,
        1,
    );
}

fn memory(config: &Config, v: &mut Issues) {
    let memory = &config.memory;
    if memory.debounce_seconds > 3600 {
        v.push(
            key!("memory.debounce_seconds"),
            format!("must be at most 3600 (got {})", memory.debounce_seconds),
        );
    }
    if !(1..=1000).contains(&memory.max_facts) {
        v.push(
            key!("memory.max_facts"),
            format!("must be between 1 and 1000 (got {})", memory.max_facts),
        );
    }
    if !(0.0..=1.0).contains(&memory.fact_confidence_threshold) {
        v.push(
            key!("memory.fact_confidence_threshold"),
            format!(
                "must be between 0 and 1 (got {})",
                memory.fact_confidence_threshold
            ),
        );
    }
    if !(100..=32_000).contains(&memory.max_injection_tokens) {
        v.push(
            key!("memory.max_injection_tokens"),
            format!(
                "must be between 100 and 32000 (got {})",
                memory.max_injection_tokens
            ),
        );
    }
    v.at_least(
        key!("memory.shutdown_flush_secs"),
        memory.shutdown_flush_secs,
        1,
    );
    let mut owner: HashMap<&str, usize> = HashMap::new();
    let mut names = std::collections::HashSet::new();
    for (index, person) in memory.identities.iter().enumerate() {
        let name_ok = !person.name.is_empty()
            && person.name.len() <= MAX_USER_CHARS
            && person
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !name_ok {
            v.push(
                &at(key!("memory.identities[].name"), index),
                format!("must be 1 to {MAX_USER_CHARS} letters, digits, `_`, `-` or `.`"),
            );
        } else if !names.insert(person.name.as_str()) {
            v.push(
                &at(key!("memory.identities[].name"), index),
                "is used by an earlier identity",
            );
        }
        if person.ids.is_empty() {
            v.push(
                &at(key!("memory.identities[].ids"), index),
                "must list at least one `<channel>:<user id>`",
            );
        }
        for id in &person.ids {
            let known = id.split_once(':').is_some_and(|(channel, user)| {
                !user.is_empty() && (channel == "api" || KNOWN_PLATFORMS.contains(&channel))
            });
            if !known {
                v.push(
                    &at(key!("memory.identities[].ids"), index),
                    format!("`{id}` is not `<channel>:<user id>` with a known channel"),
                );
            } else if let Some(earlier) = owner.insert(id.as_str(), index) {
                if earlier != index {
                    v.push(
                        &at(key!("memory.identities[].ids"), index),
                        format!(
                            "`{id}` is already linked by {}",
                            element(key!("memory.identities"), earlier)
                        ),
                    );
                }
            }
        }
    }
}

fn subagents(config: &Config, v: &mut Issues) {
    let subagents = &config.subagents;
    if !(1..=16).contains(&subagents.max_concurrent) {
        v.push(
            key!("subagents.max_concurrent"),
            format!(
                "must be between 1 and 16 (got {})",
                subagents.max_concurrent
            ),
        );
    }
    let seconds = |v: &mut Issues, key: &str, value: u64| {
        if !(1..=86_400).contains(&value) {
            v.push(
                key,
                format!("must be between 1 and 86400 seconds (got {value})"),
            );
        }
    };
    seconds(
        v,
        key!("subagents.timeout_seconds"),
        subagents.timeout_seconds,
    );
    for (name, kind) in &subagents.types {
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'));
        if !name_ok {
            v.push(
                &entry(key!("subagents.types"), name),
                "a type's name must be 1 to 64 lowercase letters, digits, `_` or `-`",
            );
        }
        let builtin = BUILTIN_TYPES.contains(&name.as_str());
        let blank = |text: &Option<String>| text.as_ref().is_some_and(|t| t.trim().is_empty());
        if (!builtin && kind.description.is_none()) || blank(&kind.description) {
            v.push(
                &named(key!("subagents.types.<name>.description"), name),
                "must say what the type is for (the lead agent chooses by it)",
            );
        }
        if blank(&kind.system_prompt) {
            v.push(
                &named(key!("subagents.types.<name>.system_prompt"), name),
                "must not be empty",
            );
        }
        if blank(&kind.model) {
            v.push(
                &named(key!("subagents.types.<name>.model"), name),
                format!(
                    "must not be empty (leave it out to use `{}`)",
                    key!("model.model")
                ),
            );
        }
        if kind.tools.as_ref().is_some_and(Vec::is_empty) {
            v.push(
                &named(key!("subagents.types.<name>.tools"), name),
                "must name at least one tool (leave it out for all)",
            );
        }
        if let Some(turns) = kind.max_turns {
            if !(1..=500).contains(&turns) {
                v.push(
                    &named(key!("subagents.types.<name>.max_turns"), name),
                    format!("must be between 1 and 500 (got {turns})"),
                );
            }
        }
        if let Some(timeout) = kind.timeout_seconds {
            seconds(
                v,
                &named(key!("subagents.types.<name>.timeout_seconds"), name),
                timeout,
            );
        }
    }
}

/// The channels a memory identity may name besides `api`.
const KNOWN_PLATFORMS: &[&str] = &["telegram", "slack", "discord", "feishu"];

fn mcp(config: &Config, v: &mut Issues) {
    let mut seen = std::collections::HashSet::new();
    for (index, server) in config.mcp.servers.iter().enumerate() {
        if !crate::agent::tools::mcp::is_valid_server_name(&server.name) {
            v.push(
                &at(key!("mcp.servers[].name"), index),
                format!(
                    "must be 1 to {} letters, digits, `_` or `-`, without `__`",
                    crate::agent::tools::mcp::MAX_SERVER_NAME
                ),
            );
        } else if !seen.insert(server.name.as_str()) {
            v.push(
                &at(key!("mcp.servers[].name"), index),
                "is used by an earlier server",
            );
        }
        match (&server.command, &server.url) {
            (Some(_), Some(_)) => v.push(
                &at(key!("mcp.servers[].url"), index),
                "set either command (stdio) or url (streamable HTTP), not both",
            ),
            (None, None) => v.push(
                &at(key!("mcp.servers[].command"), index),
                "set command (stdio) or url (streamable HTTP)",
            ),
            (Some(command), None) => {
                if command.trim().is_empty() {
                    v.push(
                        &at(key!("mcp.servers[].command"), index),
                        "must not be empty",
                    );
                }
                if !server.headers.is_empty() || server.bearer_token.is_some() {
                    v.push(
                        &at(key!("mcp.servers[].headers"), index),
                        "headers and bearer_token are for url servers",
                    );
                }
            }
            (None, Some(url)) => {
                v.url(&at(key!("mcp.servers[].url"), index), url);
                if !server.args.is_empty() || !server.env.is_empty() {
                    v.push(
                        &at(key!("mcp.servers[].args"), index),
                        "args and env are for command servers",
                    );
                }
            }
        }
        for (name, value) in &server.headers {
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                v.push(
                    &at(key!("mcp.servers[].headers"), index),
                    "has a name that is not a valid HTTP header name",
                );
            } else if reqwest::header::HeaderValue::from_str(value.expose()).is_err() {
                v.push(
                    &entry(&at(key!("mcp.servers[].headers"), index), name),
                    "is not a valid HTTP header value",
                );
            }
        }
        for name in server.env.keys() {
            if name.is_empty() || name.contains(['=', '\0']) {
                v.push(
                    &at(key!("mcp.servers[].env"), index),
                    "has a variable name that is empty or holds `=`",
                );
            }
        }
        v.at_least(
            &at(key!("mcp.servers[].timeout_secs"), index),
            server.timeout_secs,
            1,
        );
        v.at_least(
            &at(key!("mcp.servers[].connect_timeout_secs"), index),
            server.connect_timeout_secs,
            1,
        );
    }
}

fn sandbox_audit(audit: &SandboxAuditConfig, v: &mut Issues) {
    if !(1..=MAX_COMMAND_CHARS_LIMIT).contains(&audit.max_command_chars) {
        v.push(
            key!("agent.middleware.sandbox_audit.max_command_chars"),
            format!(
                "must be between 1 and {MAX_COMMAND_CHARS_LIMIT} (got {})",
                audit.max_command_chars
            ),
        );
    }
    if audit.enabled && audit.tools.is_empty() {
        v.push(
            key!("agent.middleware.sandbox_audit.tools"),
            "must name at least one tool",
        );
    }
    for (list, rules) in [
        (key!("agent.middleware.sandbox_audit.block"), &audit.block),
        (key!("agent.middleware.sandbox_audit.warn"), &audit.warn),
    ] {
        for (index, rule) in rules.iter().enumerate() {
            if let Err(problem) = rule.check() {
                v.push(&entry(&element(list, index), problem.key), problem.problem);
            }
        }
    }
}

fn delivery(config: &Config, v: &mut Issues) {
    let delivery = &config.delivery;
    v.at_least(key!("delivery.max_attempts"), delivery.max_attempts, 1);
    v.at_least(
        key!("delivery.backoff_base_ms"),
        delivery.backoff_base_ms,
        1,
    );
    v.at_least(
        key!("delivery.backoff_max_secs"),
        delivery.backoff_max_secs,
        1,
    );
}

fn channels(config: &Config, v: &mut Issues) {
    let channels = &config.channels;
    api_tokens(config, v);
    api_access(config, v);
    for (key, ids) in [
        (
            key!("channels.telegram.allowed_users"),
            &channels.telegram.allowed_users,
        ),
        (
            key!("channels.telegram.allowed_chats"),
            &channels.telegram.allowed_chats,
        ),
        (key!("channels.telegram.admins"), &channels.telegram.admins),
        (
            key!("channels.slack.allowed_users"),
            &channels.slack.allowed_users,
        ),
        (
            key!("channels.slack.allowed_chats"),
            &channels.slack.allowed_chats,
        ),
        (key!("channels.slack.admins"), &channels.slack.admins),
        (
            key!("channels.discord.allowed_users"),
            &channels.discord.allowed_users,
        ),
        (
            key!("channels.discord.allowed_chats"),
            &channels.discord.allowed_chats,
        ),
        (key!("channels.discord.admins"), &channels.discord.admins),
        (
            key!("channels.feishu.allowed_users"),
            &channels.feishu.allowed_users,
        ),
        (
            key!("channels.feishu.allowed_chats"),
            &channels.feishu.allowed_chats,
        ),
        (key!("channels.feishu.admins"), &channels.feishu.admins),
    ] {
        id_list(v, key, ids, |id| {
            (!id.chars().any(char::is_control))
                .then_some(())
                .ok_or_else(|| "must not contain control characters".to_owned())
        });
    }

    for (key, policy, users, chats) in [
        (
            key!("channels.telegram.dm_policy"),
            channels.telegram.dm_policy,
            &channels.telegram.allowed_users,
            &channels.telegram.allowed_chats,
        ),
        (
            key!("channels.slack.dm_policy"),
            channels.slack.dm_policy,
            &channels.slack.allowed_users,
            &channels.slack.allowed_chats,
        ),
        (
            key!("channels.discord.dm_policy"),
            channels.discord.dm_policy,
            &channels.discord.allowed_users,
            &channels.discord.allowed_chats,
        ),
        (
            key!("channels.feishu.dm_policy"),
            channels.feishu.dm_policy,
            &channels.feishu.allowed_users,
            &channels.feishu.allowed_chats,
        ),
    ] {
        if policy == Some(DmPolicy::Open) && !(users.is_empty() && chats.is_empty()) {
            // "open" would make the lists mean nothing; say which one the operator meant.
            v.push(
                key,
                "\"open\" lets anyone talk, but allowed_users or allowed_chats names someone; \
                 empty them, or choose \"allowlist\" or \"pairing\"",
            );
        }
    }

    let telegram = &channels.telegram;
    v.url(key!("channels.telegram.api_url"), &telegram.api_url);
    platform(
        v,
        key!("channels.telegram.enabled"),
        telegram.enabled,
        &[
            (
                key!("channels.telegram.bot_token"),
                secret(&telegram.bot_token),
            ),
            (
                key!("channels.telegram.webhook_secret"),
                secret(&telegram.webhook_secret) || telegram.mode == TelegramMode::Polling,
            ),
        ],
    );
    if let Some(token) = &telegram.bot_token {
        let well_formed = token.expose().split_once(':').is_some_and(|(id, rest)| {
            !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) && !rest.is_empty()
        });
        if !well_formed {
            v.push(
                key!("channels.telegram.bot_token"),
                "must look like <bot id>:<secret>, as @BotFather gives it",
            );
        }
    }
    if let Some(secret) = &telegram.webhook_secret {
        // What Telegram accepts as `secret_token`.
        let secret = secret.expose();
        let well_formed = (1..=256).contains(&secret.len())
            && secret
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !well_formed {
            v.push(
                key!("channels.telegram.webhook_secret"),
                "must be 1 to 256 characters of A-Z, a-z, 0-9, _ and -",
            );
        }
    }

    let slack = &channels.slack;
    v.url(key!("channels.slack.api_url"), &slack.api_url);
    platform(
        v,
        key!("channels.slack.enabled"),
        slack.enabled,
        &[
            (key!("channels.slack.bot_token"), secret(&slack.bot_token)),
            (
                key!("channels.slack.signing_secret"),
                secret(&slack.signing_secret) || slack.mode == SlackMode::Socket,
            ),
            (
                key!("channels.slack.app_token"),
                secret(&slack.app_token) || slack.mode == SlackMode::Events,
            ),
        ],
    );
    if let Some(token) = &slack.app_token
        && !token.expose().starts_with("xapp-")
    {
        v.push(
            key!("channels.slack.app_token"),
            "must be an app-level token (xapp-...) with connections:write, from Basic Information",
        );
    }
    if let Some(token) = &slack.bot_token
        && !token.expose().starts_with("xoxb-")
    {
        v.push(
            key!("channels.slack.bot_token"),
            "must be the app's bot token (xoxb-...), from OAuth & Permissions",
        );
    }
    if let Some(team) = &slack.team_id
        && !(team.starts_with('T')
            && team.len() > 1
            && team.bytes().all(|b| b.is_ascii_alphanumeric()))
    {
        v.push(
            key!("channels.slack.team_id"),
            "must be a workspace id such as T0123ABCD",
        );
    }
    id_list(
        v,
        key!("channels.slack.allowed_bots"),
        &slack.allowed_bots,
        |id| {
            // A bot id, or the id of the app an incoming webhook posts as.
            ((id.starts_with('B') || id.starts_with('A'))
                && id.len() > 1
                && id.bytes().all(|b| b.is_ascii_alphanumeric()))
            .then_some(())
            .ok_or_else(|| {
                "must be a bot id such as B0123ABCD or an app id such as A0123ABCD".to_owned()
            })
        },
    );
    let command = &slack.command;
    if !(command.len() >= 2
        && command.len() <= 32
        && command.starts_with('/')
        && command[1..]
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'))
    {
        v.push(
            key!("channels.slack.command"),
            "must be a slash and 1 to 31 lower-case letters, digits, - or _, e.g. /antler",
        );
    }

    let discord = &channels.discord;
    v.url(key!("channels.discord.api_url"), &discord.api_url);
    if let Some(key) = &discord.public_key
        && !(key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        v.push(
            key!("channels.discord.public_key"),
            "must be 64 hexadecimal characters",
        );
    }
    if let Some(id) = &discord.application_id
        && !is_snowflake(id)
    {
        v.push(
            key!("channels.discord.application_id"),
            "must be the application's numeric id (Developer Portal → General Information)",
        );
    }
    for (i, guild) in discord.allowed_guilds.iter().enumerate() {
        if !is_snowflake(guild) {
            v.push(
                &element(key!("channels.discord.allowed_guilds"), i),
                "must be a server (guild) id: digits only",
            );
        }
    }
    platform(
        v,
        key!("channels.discord.enabled"),
        discord.enabled,
        &[
            (
                key!("channels.discord.application_id"),
                discord.application_id.is_some(),
            ),
            (
                key!("channels.discord.public_key"),
                discord.public_key.is_some(),
            ),
            (
                key!("channels.discord.bot_token"),
                secret(&discord.bot_token),
            ),
        ],
    );

    let feishu = &channels.feishu;
    v.url(key!("channels.feishu.api_url"), &feishu.api_url);
    platform(
        v,
        key!("channels.feishu.enabled"),
        feishu.enabled,
        &[
            (key!("channels.feishu.app_id"), feishu.app_id.is_some()),
            (
                key!("channels.feishu.app_secret"),
                secret(&feishu.app_secret),
            ),
            // The long connection carries events in clear and unsigned (the SDKs read them
            // without a token check): only the webhook needs the token.
            (
                key!("channels.feishu.verification_token"),
                secret(&feishu.verification_token) || feishu.mode == FeishuMode::Websocket,
            ),
        ],
    );
    if let Some(app_id) = &feishu.app_id
        && !(app_id.starts_with("cli_") && app_id.len() > 4)
    {
        v.push(
            key!("channels.feishu.app_id"),
            "must be the app's id (cli_...), from the app's Credentials & Basic Info page",
        );
    }
}

/// The API channel's tokens and users, and the metrics token: present when reachable from
/// other hosts, long enough there, all distinct, users well-formed and unique.
fn api_tokens(config: &Config, v: &mut Issues) {
    let api = &config.channels.api;
    let exposed = !config.server.listen.ip().is_loopback();
    if api.enabled && exposed && api.token.is_none() && api.tokens.is_empty() {
        v.push(
            key!("channels.api.token"),
            format!(
                "required when {} is not a loopback address",
                key!("server.listen")
            ),
        );
    }

    let mut users: HashMap<&str, usize> = HashMap::new();
    for (index, entry) in api.tokens.iter().enumerate() {
        let key = at(key!("channels.api.tokens[].user"), index);
        if !is_valid_user(&entry.user) {
            v.push(
                &key,
                format!(
                    "must be 1 to {MAX_USER_CHARS} characters from A-Z, a-z, 0-9, `.`, `_`, `@` and `-`"
                ),
            );
        } else if let Some(first) = users.get(entry.user.as_str()) {
            v.push(
                &key,
                format!(
                    "duplicate user (the same as {})",
                    at(key!("channels.api.tokens[].user"), *first)
                ),
            );
        } else {
            users.insert(&entry.user, index);
        }
    }

    // Every configured token, in the order they are reported.
    let mut tokens: Vec<(String, &str)> = Vec::new();
    if let Some(token) = &api.token {
        tokens.push((key!("channels.api.token").to_owned(), token.expose()));
    }
    for (index, entry) in api.tokens.iter().enumerate() {
        tokens.push((
            at(key!("channels.api.tokens[].token"), index),
            entry.token.expose(),
        ));
    }
    let api_token_count = tokens.len();
    if let Some(token) = &config.server.metrics_token {
        tokens.push((key!("server.metrics_token").to_owned(), token.expose()));
    }

    for (position, (key, token)) in tokens.iter().enumerate() {
        if token.is_empty() {
            // Only `[[channels.api.tokens]]` can hold an empty one: elsewhere empty means absent.
            v.push(key, "must not be empty");
            continue;
        }
        // Unused API tokens (the channel is off) do not guard anything.
        let guards = position >= api_token_count || api.enabled;
        if exposed && guards && token.chars().count() < MIN_TOKEN_CHARS {
            v.push(
                key,
                format!(
                    "must be at least {MIN_TOKEN_CHARS} characters when {} is not a loopback address",
                    key!("server.listen")
                ),
            );
        }
        if let Some((earlier, _)) = tokens[..position].iter().find(|(_, other)| other == token) {
            // A shared token would let one user act as another (or as the admin).
            v.push(key, format!("must differ from {earlier}"));
        }
    }
}

/// The API channel's access lists: API user ids, well-formed and unique; `admins` only where
/// tokens say who is asking.
fn api_access(config: &Config, v: &mut Issues) {
    let api = &config.channels.api;
    let user_id = |id: &str| {
        if is_valid_user(id) {
            Ok(())
        } else {
            Err(format!(
                "must be 1 to {MAX_USER_CHARS} characters from A-Z, a-z, 0-9, `.`, `_`, `@` and `-`"
            ))
        }
    };
    id_list(
        v,
        key!("channels.api.allowed_users"),
        &api.allowed_users,
        user_id,
    );
    id_list(v, key!("channels.api.admins"), &api.admins, user_id);
    if !api.admins.is_empty() && api.token.is_none() && api.tokens.is_empty() {
        // Without tokens anyone on the host names any user, an admin among them.
        v.push(
            key!("channels.api.admins"),
            format!(
                "needs API tokens ({} or [[{}]]): without them anyone can send as any user",
                key!("channels.api.token"),
                key!("channels.api.tokens"),
            ),
        );
    }
}

/// A list of ids at `key`: each non-empty and well-formed (`check`), none twice.
fn id_list(v: &mut Issues, key: &str, ids: &[String], check: impl Fn(&str) -> Result<(), String>) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (index, id) in ids.iter().enumerate() {
        let at = format!("{key}[{index}]");
        if id.trim().is_empty() {
            v.push(&at, "must not be empty");
        } else if let Err(problem) = check(id) {
            v.push(&at, problem);
        } else if let Some(first) = seen.get(id.as_str()) {
            v.push(&at, format!("duplicate (the same as {key}[{first}])"));
        } else {
            seen.insert(id, index);
        }
    }
}

fn secret(value: &Option<Secret>) -> bool {
    value.is_some()
}

/// Required keys of an enabled platform, then whether this build has its adapter.
fn platform(v: &mut Issues, enabled_key: &str, enabled: bool, required: &[(&str, bool)]) {
    if !enabled {
        return;
    }
    for (key, present) in required {
        if !present {
            v.push(key, "required when enabled");
        }
    }
    // `channels.<name>.enabled`
    let name = enabled_key.split('.').nth(1).unwrap_or_default();
    if !AVAILABLE_PLATFORMS.contains(&name) {
        v.push(
            enabled_key,
            format!("the {name} channel is not available in this build yet"),
        );
    }
}

/// A Discord id (a snowflake): 1 to 24 digits.
fn is_snowflake(id: &str) -> bool {
    !id.is_empty() && id.len() <= 24 && id.bytes().all(|b| b.is_ascii_digit())
}

/// Checks that `url` is an absolute http(s) URL with a host.
pub(crate) fn check_http_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|err| format!("not a valid URL ({err})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "must be an http or https URL (got scheme {:?})",
            parsed.scheme()
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("must have a host".to_owned());
    }
    Ok(())
}
