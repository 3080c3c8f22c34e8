//! `[[schedules]]`: prompts sent to a conversation on a timetable, read at start. Checked here
//! with the scheduler's own parsers, so a schedule the config accepts is one that runs.

use serde::Deserialize;

use super::settings::{at, key};
use super::{Config, ConfigIssue};
use crate::schedule::spec::{self, Missed, When};
use crate::schedule::{Schedule, describe};

/// The longest conversation key a schedule may name.
const MAX_CONVERSATION_CHARS: usize = 300;

/// One `[[schedules]]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ScheduleConfig {
    /// `^[a-z0-9-]{1,40}$`, unique; chat cannot take or remove it.
    pub(crate) name: String,
    /// A five-field cron expression (`0 9 * * 1-5`); or `every`.
    pub(crate) cron: Option<String>,
    /// A period (`15m`, `2h`), at least a minute; or `cron`.
    pub(crate) every: Option<String>,
    /// The zone `cron` is read in (default `agent.timezone`).
    pub(crate) timezone: Option<String>,
    /// Where the prompt goes and the answer appears (`slack:T0ACME:C0OPS`, `telegram:-100123`).
    pub(crate) conversation: String,
    pub(crate) prompt: String,
    /// After downtime: `once` (one catch-up) or `skip`.
    pub(crate) missed: Missed,
}

impl ScheduleConfig {
    /// The schedule this entry describes, its cron read in `default_timezone` unless it
    /// names its own.
    pub(crate) fn schedule(&self, default_timezone: &str) -> Result<Schedule, String> {
        let timezone = self.timezone.as_deref().unwrap_or(default_timezone);
        let (when, text) = match (&self.cron, &self.every) {
            (Some(cron), None) => (When::cron(cron, timezone)?, cron.clone()),
            (None, Some(every)) => (When::every(every)?, format!("every {}", every.trim())),
            _ => return Err("set either cron or every".to_owned()),
        };
        Ok(Schedule {
            name: self.name.clone(),
            when_text: describe(&text, &when, timezone),
            when,
            conversation: self.conversation.trim().to_owned().into(),
            prompt: self.prompt.trim().to_owned(),
            missed: self.missed,
            created_at_ms: None,
        })
    }
}

/// The issues of `[[schedules]]`.
pub(super) fn validate(config: &Config) -> Vec<ConfigIssue> {
    let mut issues = Vec::new();
    let mut push = |key: &str, index: usize, problem: String| {
        issues.push(ConfigIssue::new(at(key, index), problem));
    };
    let mut enabled = config.channels.enabled_platforms();
    if config.channels.api.enabled {
        enabled.push("api");
    }
    for (index, schedule) in config.schedules.iter().enumerate() {
        if let Err(e) = spec::check_name(&schedule.name) {
            push(key!("schedules[].name"), index, e);
        } else if config.schedules[..index]
            .iter()
            .any(|earlier| earlier.name == schedule.name)
        {
            push(
                key!("schedules[].name"),
                index,
                "is used by an earlier schedule".to_owned(),
            );
        }
        match (&schedule.cron, &schedule.every) {
            (Some(_), Some(_)) => push(
                key!("schedules[].every"),
                index,
                "set either cron or every, not both".to_owned(),
            ),
            (None, None) => push(
                key!("schedules[].cron"),
                index,
                "set cron (`0 9 * * 1-5`) or every (`15m`)".to_owned(),
            ),
            (Some(cron), None) => {
                if let Err(e) = spec::parse_cron(cron) {
                    push(key!("schedules[].cron"), index, e);
                }
            }
            (None, Some(every)) => {
                if let Err(e) = spec::parse_period(every) {
                    push(key!("schedules[].every"), index, e);
                }
            }
        }
        if let Some(timezone) = &schedule.timezone {
            if let Err(e) = spec::parse_zone(timezone) {
                push(key!("schedules[].timezone"), index, e);
            }
        }
        if let Err(e) = spec::check_prompt(&schedule.prompt) {
            push(key!("schedules[].prompt"), index, e);
        }
        let conversation = schedule.conversation.trim();
        let (channel, rest) = conversation.split_once(':').unwrap_or((conversation, ""));
        if rest.is_empty()
            || conversation.chars().count() > MAX_CONVERSATION_CHARS
            || conversation
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            push(
                key!("schedules[].conversation"),
                index,
                format!(
                    "must be a conversation key `<channel>:<chat>` such as `slack:T0ACME:C0OPS` \
                     or `telegram:-1001234567890`, at most {MAX_CONVERSATION_CHARS} characters"
                ),
            );
        } else if !enabled.contains(&channel) {
            let shown: String = channel.chars().take(32).collect();
            push(
                key!("schedules[].conversation"),
                index,
                format!("is on `{shown}`, which is not an enabled channel"),
            );
        }
    }
    issues
}
